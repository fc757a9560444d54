//! `tracer report`: kills as one self-contained HTML page.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;

use super::StoreArg;
use crate::{
    report::{GpuTimeline, KillPage, html},
    store::Store,
};

/// Options of `tracer report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    filter: super::kills::KillFilter,
    /// Write the page here (created 0600: it holds command lines).
    #[arg(long, value_name = "FILE")]
    pub html: PathBuf,
    /// Every kill in the window, not only the latest.
    #[arg(long)]
    pub all: bool,
    /// Only kills this recent (e.g. 10m, 6h, 1d).
    #[arg(long, value_parser = super::parse_duration)]
    pub since: Option<Duration>,
    /// Only kills of this process id.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Also hide the values of options and variables whose name contains
    /// WORD in command lines; password, token, secret, key and the like
    /// always are. Repeatable.
    #[arg(long, value_name = "WORD")]
    pub redact: Vec<String>,
    /// Show command lines whole, secrets and all.
    #[arg(long)]
    pub no_redact: bool,
}

/// The NVML timelines of the devices in a kill's GPU picture, from the
/// lead-up (or the minute before) to 5 s after.
fn gpu_timelines(store: &Store, k: &crate::record::KillRecord) -> anyhow::Result<Vec<GpuTimeline>> {
    let from = k
        .leadup
        .first()
        .map(|s| s.ts_ns)
        .unwrap_or(k.ts_ns - 60_000_000_000);
    let to = k.ts_ns + 5_000_000_000;
    let mut out = Vec::new();
    for d in &k.gpu_picture {
        let rows = store.gpu_device_rows(d.device, from, to)?;
        if rows.is_empty() {
            continue;
        }
        out.push(GpuTimeline {
            device: d.device,
            total: rows.iter().map(|r| r.1).max().unwrap_or(d.total),
            used: rows.iter().map(|r| (r.0, r.2)).collect(),
            victim: store.gpu_process_rows(d.device, k.victim.pid, from, to)?,
        });
    }
    Ok(out)
}

/// Runs `report`.
pub fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let (since_ns, limit) = super::window(args.since, args.all);
    let store = Store::open_ro(&args.store.path)?;
    // Redacted before it is explained: the verdict quotes command lines.
    let redactor = (!args.no_redact).then(|| crate::export::redact::Redactor::new(&args.redact));
    args.filter.check()?;
    let filter = super::explain::effective(&args.filter, args.pid, args.all);
    let (found, _) =
        super::explain::stored(&store, since_ns, args.pid, &filter, limit, |mut k| {
            if let Some(r) = &redactor {
                redact_kill(r, &mut k);
            }
            k
        })?;
    if found.is_empty() {
        crate::say!(
            "tracer: no kills{} in {}: no report written",
            args.pid.map(|p| format!(" of pid {p}")).unwrap_or_default(),
            args.store.path.display()
        );
        return Ok(ExitCode::from(1));
    }
    let mut pages = Vec::with_capacity(found.len());
    for e in found {
        let gpu = gpu_timelines(&store, &e.kill)?;
        pages.push(KillPage {
            explanation: e,
            gpu,
        });
    }
    let page = html(&pages, &crate::util::sys::hostname());
    // Written as root: never through a link, nor over another user's file.
    let file = crate::util::fsafe::open_private(&args.html)?;
    file.set_len(0)
        .with_context(|| format!("emptying {}", args.html.display()))?;
    std::io::Write::write_all(&mut &file, page.as_bytes())
        .with_context(|| format!("writing {}", args.html.display()))?;
    crate::say!(
        "tracer: report of {} kill(s) written to {}",
        pages.len(),
        args.html.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// A kill's command lines (victim, sender) as a page shared beyond root
/// shows them.
fn redact_kill(r: &crate::export::redact::Redactor, k: &mut crate::record::KillRecord) {
    let item = crate::export::Exported::Kill {
        id: 0,
        record: Box::new(k.clone()),
    };
    if let Some(crate::export::Exported::Kill { record, .. }) = item.redacted(r) {
        *k = *record;
    }
}
