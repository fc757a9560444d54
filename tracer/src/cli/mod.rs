//! Command line: one module per subcommand, clap derive, doc comments as help.

pub mod attach;
pub mod attach_host;
pub mod doctor;
pub mod events;
pub mod explain;
pub mod growth;
pub mod kills;
pub mod record;
pub mod report;
pub mod top;
pub mod top_tui;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};

use crate::store;

/// tracer: records OOM kills on this node with eBPF and explains them after the fact.
#[derive(Debug, Parser)]
#[command(name = "tracer", version, propagate_version = true)]
pub struct Cli {
    /// Log filter (error, warn, info, debug, trace, or a tracing directive).
    #[arg(long, global = true, env = "TRACER_LOG", default_value = "info")]
    pub log_level: String,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record OOM kills, SIGKILLs and memory-cgroup pressure until SIGINT/SIGTERM (needs root).
    Record(Box<record::RecordArgs>),
    /// Trace the CUDA allocations, or with --host the heap, of a running process, live (needs root).
    Attach(attach::AttachArgs),
    /// Where a process's or a memory cgroup's memory is growing, by stack, live (needs root).
    Growth(growth::GrowthArgs),
    /// Explain the latest OOM kill, or every kill in a window.
    Explain(explain::ExplainArgs),
    /// One line per kill (time, killer, victim, where, memory, verdict), crash loops grouped.
    Kills(kills::KillsArgs),
    /// Write kills as a self-contained HTML page: the explanation, memory over time against the limit, the cgroup's tasks, GPU timelines, where memory grew.
    Report(report::ReportArgs),
    /// Processes and containers with host and GPU memory, live, closest to a limit first.
    Top(top::TopArgs),
    /// Print recorded raw events as JSON lines.
    Events(events::EventsArgs),
    /// Check what this kernel and node support, with fixes.
    Doctor(doctor::DoctorArgs),
}

/// Kills to read for `--since D` and `--all`: the oldest wall ns, and how
/// many (the latest only, without `--all`).
pub(crate) fn window(since: Option<std::time::Duration>, all: bool) -> (i64, usize) {
    let since_ns = since
        .map(|d| crate::util::time::wall_now_ns() - d.as_nanos() as i64)
        .unwrap_or(0);
    (since_ns, if all { usize::MAX } else { 1 })
}

/// The store option every subcommand that reads or writes it takes.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArg {
    /// SQLite store of the recorder.
    #[arg(long = "store", value_name = "PATH", default_value = store::DEFAULT_PATH)]
    pub path: PathBuf,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// For scripts.
    Json,
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Record(a) => record::run(*a),
        Command::Attach(a) if a.host => attach_host::run(a),
        Command::Attach(a) => attach::run(a),
        Command::Growth(a) => growth::run(a),
        Command::Explain(a) => explain::run(a),
        Command::Kills(a) => kills::run(a),
        Command::Report(a) => report::run(a),
        Command::Events(a) => events::run(a),
        Command::Top(a) => top::run(a),
        Command::Doctor(a) => doctor::run(a),
    }
}

pub use crate::util::chain;

/// Refuses a memory cgroup path given with `flag` that is not one as
/// /proc/PID/cgroup shows it: it starts with `/` and, joined under the
/// cgroup file system, never climbs out of it.
pub(crate) fn check_cgroup_path(flag: &str, path: &str) -> anyhow::Result<()> {
    if !path.starts_with('/') {
        anyhow::bail!(
            "{flag} {}: a memory cgroup path as /proc/PID/cgroup shows it, starting with /",
            crate::util::term::escape(path)
        );
    }
    check_no_climbing(flag, path)
}

/// Refuses a cgroup path given with `flag` that, joined under the cgroup
/// file system, would climb out of it.
pub(crate) fn check_no_climbing(flag: &str, path: &str) -> anyhow::Result<()> {
    if path.split('/').any(|c| c == "..") {
        anyhow::bail!(
            "{flag} {}: a cgroup path has no '..' in it",
            crate::util::term::escape(path)
        );
    }
    Ok(())
}

/// Parses `512MiB`, `1G`, `100000` (bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 512MiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} (use KiB, MiB, GiB)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses a duration such as `1s`, `500ms`, `7d`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    crate::util::time::parse_window(s).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").is_err());
    }

    #[test]
    fn cli_parses() {
        let c = Cli::try_parse_from(["tracer", "explain", "--pid", "4205", "--format", "json"])
            .unwrap();
        assert!(
            matches!(c.command, Command::Explain(a) if a.pid == Some(4205) && a.format == Format::Json)
        );
        assert!(Cli::try_parse_from(["tracer", "explain", "--pid", "abc"]).is_err());
        let c = Cli::try_parse_from([
            "tracer",
            "record",
            "--store",
            "/tmp/x.db",
            "--cgroup",
            "/a",
            "--cgroup",
            "/b",
        ])
        .unwrap();
        assert!(matches!(c.command, Command::Record(a) if a.cgroup.len() == 2));
    }
}
