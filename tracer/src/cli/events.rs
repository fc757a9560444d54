//! `tracer events`: recorded raw events as JSON lines.

use std::{
    io::{BufWriter, Write as _},
    process::ExitCode,
    time::Duration,
};

use super::StoreArg;
use crate::{export::event_json, store::Store, util::time::wall_now_ns};

/// Options of `tracer events`.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    #[command(flatten)]
    store: StoreArg,
    /// How far back (e.g. 10m, 6h).
    #[arg(long, default_value = "10m", value_parser = super::parse_duration)]
    pub since: Duration,
    /// Only this kind (cuda_call: failed and notable CUDA calls, GPU
    /// out-of-memory failures among them).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(crate::record::stored_kinds()))]
    pub kind: Option<String>,
    /// Only events about this process id.
    #[arg(long)]
    pub pid: Option<u32>,
    /// At most this many events.
    #[arg(long, default_value_t = 100_000)]
    pub limit: usize,
}

/// Runs `events`.
pub fn run(args: EventsArgs) -> anyhow::Result<ExitCode> {
    let store = Store::open_ro(&args.store.path)?;
    let since = wall_now_ns() - args.since.as_nanos() as i64;
    let rows = store.events(since, args.kind.as_deref(), args.pid, args.limit)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    for r in &rows {
        if writeln!(out, "{}", event_json(r)).is_err() {
            break; // stdout closed (e.g. piped into head)
        }
    }
    let _ = out.flush();
    Ok(ExitCode::SUCCESS)
}
