//! `tracer`: parse the command line and dispatch.

use std::process::ExitCode;

use clap::Parser as _;
use tracer::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        // Colour only for a person at a terminal: a journal, a file or a
        // pipe gets plain text (and NO_COLOR turns it off anywhere).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        // A closed or full stderr must not panic the recorder (the default
        // reports a failed write with eprintln!, which panics then).
        .log_internal_errors(false)
        .init();
    match run(cli) {
        Ok(code) => code,
        // The reader of our output went away (`| head`): nothing to say.
        Err(e) if tracer::util::out::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            tracer::say!("tracer: {e:#}");
            ExitCode::from(2)
        }
    }
}
