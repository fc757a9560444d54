//! A workload for the tests and the demo: grows its anonymous memory in
//! steps, touching every page, until it reaches `--max-mib` (then holds it)
//! or the kernel kills it.
//!
//! `memhog [--step-mib N] [--interval-ms N] [--max-mib N]`

use std::{io::Write as _, thread, time::Duration};

use tracer_e2e::arg;

fn main() {
    let step = arg("--step-mib", 4) as usize;
    let interval = Duration::from_millis(arg("--interval-ms", 100));
    let max = arg("--max-mib", u64::MAX) as usize;
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
