//! A workload for the tests and the demo: grows its anonymous memory in
//! steps, touching every page, until it reaches `--max-mib` (then holds it)
//! or the kernel kills it.
//!
//! `memhog [--step-mib N] [--interval-ms N] [--max-mib N]`: it stops
//! growing at `--max-mib` (1 GiB unless told), so a run outside a memory
//! cgroup can never take the node; unknown flags are refused.

use std::{io::Write as _, thread, time::Duration};

/// The most memhog holds unless `--max-mib` says otherwise.
const DEFAULT_MAX_MIB: u64 = 1024;

fn main() {
    let [step, interval, max] = tracer_e2e::flags(
        "memhog [--step-mib N] [--interval-ms N] [--max-mib N]: grow anonymous memory until the cap or an OOM kill",
        [
            ("--step-mib", 4),
            ("--interval-ms", 100),
            ("--max-mib", DEFAULT_MAX_MIB),
        ],
    );
    let (step, max) = (step as usize, max as usize);
    let interval = Duration::from_millis(interval);
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut total = 0usize;
    loop {
        if total < max {
            let mib = step.min(max - total);
            let mut chunk = vec![0u8; mib << 20];
            // Touch every page so the memory is really charged.
            for i in (0..chunk.len()).step_by(4096) {
                chunk[i] = 1;
            }
            held.push(chunk);
            total += mib;
            if total >= max {
                println!("held {total} MiB");
                let _ = std::io::stdout().flush();
            }
        }
        thread::sleep(interval);
    }
}
