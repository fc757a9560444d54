//! `tracer`: parse the command line and dispatch.

use std::process::ExitCode;

use clap::Parser as _;
use tracer::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tracer: {e:#}");
            ExitCode::from(2)
        }
    }
}
