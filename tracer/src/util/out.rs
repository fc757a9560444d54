//! Output that never takes the program down.
//!
//! `println!` and `eprintln!` panic when their stream is closed or full
//! (`tracer explain | head -c 100`, `tracer record 2>/dev/full`). The
//! recorder must go on recording whoever reads its log, and a command
//! whose reader went away ends quietly.

/// Writes one line to stderr, ignoring a closed or full stderr.
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// Whether `e` (or any error in its chain) is a write to a closed pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Writes `s` to stdout and flushes it.
pub fn stdout(s: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()
}
