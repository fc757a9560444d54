//! A SIGKILL storm, as an unprivileged user can make one: fork a child,
//! SIGKILL it, reap it, repeat, for `--seconds`. Prints how many it killed.
//!
//! `killstorm [--seconds N] [--uid N]` (started as root, it drops to uid N,
//! 65534 by default, before the first fork)

use std::time::{Duration, Instant};

fn main() {
    let [seconds, uid] = tracer_e2e::flags(
        "killstorm [--seconds N] [--uid N]: fork and SIGKILL children as uid N",
        [("--seconds", 10), ("--uid", 65534)],
    );
    tracer_e2e::drop_to_uid(uid);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut killed = 0u64;
    while Instant::now() < end {
        // SAFETY: the child only calls pause(), which is async-signal-safe.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            loop {
                // SAFETY: as above.
                unsafe { libc::pause() };
            }
        }
        assert!(pid > 0, "fork failed");
        // SAFETY: our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        killed += 1;
    }
    println!("killed {killed}");
}
