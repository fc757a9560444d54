//! SIGKILLs the kernel generated for a process itself (`SEND_SIG_PRIV`,
//! sender and target the same process) that are not the OOM killer's: a
//! BPF program's `bpf_send_signal` (BPF-LSM or tracing enforcement), or a
//! kernel limit such as RLIMIT_CPU's hard limit. The OOM killer also sends
//! its victim SIGKILL this way when the victim is the task that set it off,
//! and says so with `mark_victim` on another ring, in either order: a
//! self-kill waits [`WAIT_NS`] for it before it is a kill of its own. It
//! waits as its raw event: under an OOM storm most are the OOM killer's,
//! and their records would be built for nothing. Pure.

use std::collections::VecDeque;

use tracer_common::SignalKill;

/// How long a self-kill waits for an OOM kill of its process.
pub const WAIT_NS: i64 = 1_000_000_000;
/// The most self-kills waiting at once (an OOM storm's victims that set
/// off their own kill come this way too); past it the oldest is taken for
/// the OOM killer's, and counted.
pub const MAX_WAITING: usize = 1024;

/// A self-kill no OOM kill claimed: its event, and the pages (file, anon,
/// shmem) its process held at its exit, when that came while it waited.
pub type Due = (SignalKill, Option<[u64; 3]>);

/// Self-kills waiting, and recent OOM victims they may be.
#[derive(Debug, Default)]
pub struct SelfKills {
    waiting: VecDeque<(i64, Due)>,
    oom_victims: VecDeque<(i64, u32)>,
    /// Self-kills dropped unresolved because too many waited.
    pub dropped: u64,
}

impl SelfKills {
    /// A kernel SIGKILL of a process by itself, read at `now_ns`.
    pub fn signal(&mut self, now_ns: i64, ev: SignalKill) {
        self.prune(now_ns);
        if self.oom_victims.iter().any(|(_, p)| *p == ev.target_pid) {
            return;
        }
        if self.waiting.len() >= MAX_WAITING {
            self.waiting.pop_front();
            self.dropped += 1;
        }
        self.waiting.push_back((now_ns, (ev, None)));
    }

    /// The OOM killer's victim `pid`: a self-kill of it was the OOM kill.
    pub fn oom_victim(&mut self, now_ns: i64, pid: u32) {
        self.waiting.retain(|(_, (ev, _))| ev.target_pid != pid);
        self.oom_victims.push_back((now_ns, pid));
        self.prune(now_ns);
    }

    /// Self-kills no OOM kill claimed in time: kills of their own.
    pub fn due(&mut self, now_ns: i64) -> Vec<Due> {
        let mut out = Vec::new();
        while self
            .waiting
            .front()
            .is_some_and(|(at, _)| now_ns - at >= WAIT_NS)
        {
            out.extend(self.waiting.pop_front().map(|(_, r)| r));
        }
        self.prune(now_ns);
        out
    }

    /// `pid` exited holding these pages (file, anon, shmem): its waiting
    /// self-kill keeps them for its record (it is gone from /proc by then).
    pub fn on_exit_memory(&mut self, pid: u32, pages: [u64; 3]) {
        for (_, (ev, held)) in self.waiting.iter_mut() {
            if ev.target_pid == pid {
                *held = Some(pages);
            }
        }
    }

    /// Whether any self-kill waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    fn prune(&mut self, now_ns: i64) {
        while self
            .oom_victims
            .front()
            .is_some_and(|(at, _)| now_ns - at > 2 * WAIT_NS)
        {
            self.oom_victims.pop_front();
        }
        while self.oom_victims.len() > MAX_WAITING {
            self.oom_victims.pop_front();
        }
    }
}

/// What a self-kill's record says of its killer.
pub const REASON: &str = "a SIGKILL the kernel generated for the process itself, neither from kill(2) nor from the OOM killer: a BPF program's bpf_send_signal (BPF-LSM or tracing enforcement), or a kernel limit such as RLIMIT_CPU's hard limit";

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pid: u32) -> SignalKill {
        SignalKill {
            target_pid: pid,
            ..Default::default()
        }
    }

    #[test]
    fn an_oom_kill_in_either_order_claims_its_self_kill() {
        let s = 1_000_000_000;
        let mut k = SelfKills::default();
        // The OOM victim's event after its SIGKILL.
        k.signal(0, rec(10));
        k.oom_victim(s / 10, 10);
        // ... and before it.
        k.oom_victim(s / 5, 11);
        k.signal(s / 4, rec(11));
        // Nobody claims this one.
        k.signal(s / 4, rec(12));
        assert!(k.due(s).is_empty(), "not before a second");
        let due = k.due(s / 4 + WAIT_NS);
        assert_eq!(
            due.iter().map(|(e, _)| e.target_pid).collect::<Vec<_>>(),
            [12]
        );
        assert!(k.is_empty());
        // Bounded.
        for p in 0..(MAX_WAITING as u32 + 5) {
            k.signal(2 * s, rec(100 + p));
        }
        assert_eq!(k.dropped, 5);
    }
}
