//! docs/reference is generated: `cli.md` from the clap definitions, and
//! `metrics.md` from the metric families the endpoint serves. These tests
//! fail when either file is not what the code says now; with
//! `TRACER_UPDATE_REFERENCE=1` they write them instead.

use std::{fmt::Write as _, path::PathBuf, sync::Arc};

use clap::CommandFactory;
use tracer::{
    cli::Cli,
    export::feeds::{Feeds, KillCounts},
    recorder::metrics::Metrics,
};

fn reference(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/reference")
        .join(name)
}

/// Compares `text` with the file, or writes it when asked to.
fn check(name: &str, text: &str) {
    let path = reference(name);
    if std::env::var_os("TRACER_UPDATE_REFERENCE").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let now = std::fs::read_to_string(&path).unwrap_or_default();
    if now != text {
        let first = now
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(now.lines().count().min(text.lines().count()));
        panic!(
            "docs/reference/{name} is stale (first difference at line {}): run \
             TRACER_UPDATE_REFERENCE=1 cargo test -p tracer --test reference",
            first + 1
        );
    }
}

fn cli_md() -> String {
    // The environment's value of TRACER_LOG is not the reference's.
    let mut cmd = Cli::command()
        .mut_arg("log_level", |a| a.hide_env_values(true))
        .term_width(100);
    cmd.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         Generated from the code by `TRACER_UPDATE_REFERENCE=1 cargo test -p tracer --test \
         reference`; CI fails when it is stale. The pages in [../user](../user) say what each \
         command is for, with real output.\n\n",
    );
    let top = cmd.render_long_help().to_string();
    writeln!(out, "## tracer\n\n```text\n{}\n```\n", top.trim_end()).unwrap();
    for sub in cmd.get_subcommands_mut() {
        if sub.get_name() == "help" {
            continue;
        }
        let name = sub.get_name().to_string();
        let help = sub.render_long_help().to_string();
        writeln!(
            out,
            "## tracer {name}\n\n```text\n{}\n```\n",
            help.trim_end()
        )
        .unwrap();
    }
    let lines: Vec<&str> = out.lines().map(str::trim_end).collect();
    lines.join("\n").trim_end().to_string() + "\n"
}

fn metrics_md() -> String {
    let feeds = Feeds::new(
        Arc::new(Metrics::default()),
        Arc::new(KillCounts::default()),
    );
    let mut out = String::from(
        "# Metrics reference\n\n\
         Every metric family `tracer record --metrics` serves, generated from the code by \
         `TRACER_UPDATE_REFERENCE=1 cargo test -p tracer --test reference`; CI fails when it \
         is stale. The families above the kill commit latency are also what `--otlp` exports. \
         [../operate/prometheus.md](../operate/prometheus.md) says how to use them.\n\n\
         | name | type | what it measures |\n|---|---|---|\n",
    );
    for (name, kind, help) in tracer::export::prometheus::reference(&feeds) {
        writeln!(out, "| `{name}` | {kind} | {} |", help.replace('|', "\\|")).unwrap();
    }
    out
}

#[test]
fn the_cli_reference_is_current() {
    let md = cli_md();
    for sub in ["record", "explain", "attach", "doctor", "top"] {
        assert!(md.contains(&format!("## tracer {sub}\n")), "{sub} missing");
    }
    assert!(
        md.contains("--max-store-size"),
        "record's options are in it"
    );
    check("cli.md", &md);
}

#[test]
fn the_metrics_reference_is_current() {
    let md = metrics_md();
    for name in [
        "tracer_kills_total",
        "tracer_kill_commit_latency_seconds",
        "tracer_build_info",
    ] {
        assert!(md.contains(&format!("| `{name}` |")), "{name} missing");
    }
    check("metrics.md", &md);
}
