//! An OOM storm, as an unprivileged user can make one in a memory-limited
//! cgroup: keep `--procs` children alive, each touching memory 1 MiB at a
//! time up to `--mib` MiB and then waiting; the kernel OOM-kills them as
//! the cgroup's limit is reached, and each one killed is replaced at once,
//! for `--seconds`. The number of children is capped (`--procs`), so the
//! storm never grows past it; the memory is capped by the cgroup.
//! Prints how many children were SIGKILLed.
//!
//! `oomstorm [--seconds N] [--procs N] [--mib N] [--uid N]` (started as
//! root, it drops to uid N, 65534 by default, before the first fork)

use std::time::{Duration, Instant};

fn child(mib: u64) -> ! {
    let mut held: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
        held.push(vec![1u8; 1 << 20]);
    }
    loop {
        // SAFETY: async-signal-safe, no state.
        unsafe { libc::pause() };
    }
}

fn main() {
    let [seconds, procs, mib, uid] = tracer_e2e::flags(
        "oomstorm [--seconds N] [--procs N] [--mib N] [--uid N]: children that grow until OOM-killed, replaced at once",
        [
            ("--seconds", 10),
            ("--procs", 32),
            ("--mib", 16),
            ("--uid", 65534),
        ],
    );
    tracer_e2e::drop_to_uid(uid);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut live = std::collections::HashSet::new();
    let mut killed = 0u64;
    while Instant::now() < end {
        while live.len() < procs as usize {
            // SAFETY: the child only allocates and pauses (the parent is
            // single-threaded, so allocating after fork is safe).
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                child(mib);
            }
            assert!(pid > 0, "fork failed");
            live.insert(pid);
        }
        let mut status = 0;
        // SAFETY: reaps our own children.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid > 0
            && live.remove(&pid)
            && libc::WIFSIGNALED(status)
            && libc::WTERMSIG(status) == libc::SIGKILL
        {
            killed += 1;
        }
    }
    // Our own children, by pid: ended and reaped; one the kernel killed
    // before it got our SIGTERM is counted too.
    for pid in live {
        let mut status = 0;
        // SAFETY: a child of ours not reaped yet, so its pid is still ours.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
            libc::waitpid(pid, &mut status, 0);
        }
        if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL {
            killed += 1;
        }
    }
    println!("killed {killed}");
}
