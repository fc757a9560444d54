//! Two more userspace OOM killers, from their own lines (see
//! [`super`], which hands their lines here):
//!
//! - nohang (and nohang-desktop): a message over several lines, each after
//!   the first indented. Its reason is the memory status block before the
//!   action (`Memory status that requires corrective actions:` then
//!   `MemAvailable [0 MiB, 0.0 %] <= soft_threshold_min_mem [982 MiB,
//!   10.0 %]`, or a PSI line), its victim the `PID: N, Name: X, badness: B`
//!   line (and `cgroup_v2:` of a victim status block), its action `Send
//!   SIGTERM to the victim` (`Sending` since 2020) or `Run the command:
//!   kill -TERM N` (`Executing the command:` since 2020). nohang 0.1 printed
//!   an action twice: the second is the same kill.
//! - Talos's machined OOM controller (Talos 1.12): `[talos] OOM controller
//!   triggered`, then `[talos] Sending SIGKILL to cgroup {..., "cgroup":
//!   "/sys/fs/cgroup/kubepods/burstable/pod<uid>"}`; it logs no figures.

use super::UserKill;

/// The name a Talos OOM controller's kill is recorded under: the process
/// that sends its SIGKILLs.
pub const TALOS: &str = "machined";

/// nohang's state between its lines.
#[derive(Debug, Default)]
pub struct Nohang {
    /// The last victim it chose: pid and name.
    victim: Option<(u32, String)>,
    /// That victim's cgroup, from its status block.
    cgroup: Option<String>,
    /// The memory status that called for the action, line by line.
    why: Vec<String>,
    /// Whether the lines of a memory status block are being read.
    in_status: bool,
    /// The last action, to tell an action printed twice.
    last: Option<String>,
}

impl Nohang {
    /// One of nohang's lines.
    pub fn push(&mut self, text: &str) -> Option<UserKill> {
        let t = text.trim();
        if t.starts_with("Memory status that requires corrective action")
            || t.starts_with("Memory status before implementing a corrective action")
        {
            self.why.clear();
            self.in_status = true;
            return None;
        }
        let figure = ["MemAvailable", "SwapFree", "Zram", "zram", "PSI"]
            .iter()
            .any(|p| t.starts_with(p));
        if self.in_status && figure {
            self.why.push(comparison(t).to_string());
            return None;
        }
        self.in_status = false;
        if t.starts_with("PSI avg (") && t.contains("_psi_threshold") {
            self.why = vec![comparison(t).to_string()];
            return None;
        }
        if let Some((pid, name)) = victim_line(t) {
            self.victim = Some((pid, name.to_string()));
            self.cgroup = None;
            self.last = None;
            return None;
        }
        // `CGroup_v2:` until 2020, `cgroup_v2:` since; empty off cgroup v2.
        if let Some(cg) = t
            .strip_prefix("CGroup_v2:")
            .or_else(|| t.strip_prefix("cgroup_v2:"))
        {
            self.cgroup = Some(cg.trim())
                .filter(|c| !c.is_empty())
                .map(str::to_string);
            return None;
        }
        let (signal, pid) = action(t)?;
        if self.last.as_deref() == Some(t) {
            return None;
        }
        self.last = Some(t.to_string());
        let pid = pid.or(self.victim.as_ref().map(|v| v.0));
        let chosen = self.victim.as_ref().filter(|v| Some(v.0) == pid);
        Some(UserKill {
            killer: "nohang",
            pid,
            comm: chosen.map(|v| v.1.clone()),
            cgroup: self
                .cgroup
                .clone()
                .filter(|_| pid.is_none() || chosen.is_some()),
            reason: if self.why.is_empty() {
                "nohang's memory status before the action is not in the log".into()
            } else {
                self.why.join("; ")
            },
            signal,
            ..Default::default()
        })
    }
}

/// A figure against its threshold, up to the threshold's own figure
/// (`MemAvailable [0 MiB, 0.0 %] <= soft_threshold_min_mem [982 MiB,
/// 10.0 %]`, `PSI avg (92.25) > sigterm_psi_threshold (90.0)`): a line of
/// nohang's own output pasted after it, taken for its wrapped tail, is
/// left out.
fn comparison(t: &str) -> &str {
    for (op, close) in [(" <= ", ']'), (" > ", ')')] {
        if let Some(at) = t.find(op)
            && let Some(end) = t[at..].find(close)
        {
            return &t[..at + end + 1];
        }
    }
    t
}

/// `PID: 12297, Name: tail, badness: 727` (`name:` since 2020).
fn victim_line(t: &str) -> Option<(u32, &str)> {
    let (pid, rest) = t.strip_prefix("PID:")?.split_once(',')?;
    let rest = rest.trim_start();
    let name = rest
        .strip_prefix("Name:")
        .or_else(|| rest.strip_prefix("name:"))?;
    let (name, _) = name.split_once(", badness")?;
    Some((pid.trim().parse().ok()?, name.trim()))
}

/// An action: `Send SIGTERM to the victim` (the victim chosen before), or
/// a command `kill -TERM 12297` (its pid). None for anything else (a
/// notification helper's command).
fn action(t: &str) -> Option<(Option<&'static str>, Option<u32>)> {
    if let Some(rest) = t
        .strip_prefix("Send ")
        .or_else(|| t.strip_prefix("Sending "))
    {
        let (sig, rest) = rest.split_once(' ')?;
        return rest
            .starts_with("to the victim")
            .then(|| (signal(sig), None));
    }
    let cmd = t
        .strip_prefix("Run the command: ")
        .or_else(|| t.strip_prefix("Executing the command: "))?;
    let mut w = cmd.split_whitespace();
    if w.next()? != "kill" {
        return None;
    }
    let sig = w.next()?.strip_prefix('-')?;
    let pid = w.next()?.parse().ok()?;
    Some((signal(sig), Some(pid)))
}

fn signal(s: &str) -> Option<&'static str> {
    match s.trim_start_matches("SIG") {
        "TERM" | "15" => Some("SIGTERM"),
        "KILL" | "9" => Some("SIGKILL"),
        "INT" | "2" => Some("SIGINT"),
        "SEGV" | "11" => Some("SIGSEGV"),
        _ => None,
    }
}

/// Whether an untagged line is nohang's (its own terminal output).
pub fn is_nohang(t: &str) -> bool {
    t.starts_with("Implement a corrective action")
        || t.starts_with("Implementing a corrective action")
        || t.starts_with("Memory status that requires corrective action")
        || t.starts_with("Memory status before implementing a corrective action")
        || (t.starts_with("MemAvailable [") && t.contains("_threshold_"))
        || (t.starts_with("SwapFree [") && t.contains("_threshold_"))
        || victim_line(t).is_some()
        || action(t).is_some()
}

/// One of the Talos OOM controller's lines (`[talos] ...`); `triggered`
/// keeps whether it said it triggered.
pub fn talos(text: &str, triggered: &mut bool) -> Option<UserKill> {
    let t = text.trim();
    let t = t.strip_prefix("[talos]").unwrap_or(t).trim_start();
    if t.starts_with("OOM controller triggered") {
        *triggered = true;
        return None;
    }
    let rest = t.strip_prefix("Sending SIGKILL to cgroup")?.trim_start();
    // A path wrapped at a terminal's edge comes back with the margin's
    // space inside it: a cgroup's path has none.
    let cgroup: String = match rest.split_once("\"cgroup\":") {
        Some((_, v)) => v
            .trim_start()
            .strip_prefix('"')?
            .split('"')
            .next()?
            .split_whitespace()
            .collect(),
        None => rest.split_whitespace().next()?.to_string(),
    };
    let why = if std::mem::take(triggered) {
        "its OOM controller triggered (it logs no memory figures; `talosctl get oomactions` keeps them)"
    } else {
        "its OOM controller (its trigger is not in the log)"
    };
    Some(UserKill {
        killer: TALOS,
        cgroup: Some(cgroup),
        reason: format!("Talos: {why}"),
        signal: Some("SIGKILL"),
        ..Default::default()
    })
}

/// Whether an untagged line is the Talos OOM controller's.
pub fn is_talos(t: &str) -> bool {
    t.strip_prefix("[talos] ").is_some_and(|r| {
        r.starts_with("OOM controller triggered") || r.starts_with("Sending SIGKILL to cgroup")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(lines: &[&str]) -> Vec<UserKill> {
        let mut n = Nohang::default();
        lines.iter().filter_map(|l| n.push(l)).collect()
    }

    /// nohang's terminal output (tests/fixtures/real-logs/ev-23), its
    /// next line glued to a figure's as a saved log's reader gives it.
    #[test]
    fn nohang_s_command_action_names_its_victim_and_the_memory_status() {
        let k = read(&[
            "Memory status that requires corrective actions:",
            "  MemAvailable [0 MiB, 0.0 %] <= soft_threshold_min_mem [982 MiB, 10.0 %]",
            "  SwapFree [2163 MiB, 14.7 %] <= soft_threshold_min_swap [2210 MiB, 15.0 %] Regexp '^tail$' matches with name 'tail'",
            "Found 92 processes with existing /proc/[pid]/exe realpath",
            "Process with highest badness (found in 6 ms):",
            "  PID: 12297, Name: tail, badness: 727",
            "Regexp '^tail$' matches with name 'tail'",
            "Execute the command(1) in Thread-1: kill -TERM 12297",
            "Implement a corrective action:",
            "  Run the command: kill -TERM 12297",
            "  Exit status: None; total response time: 7 ms",
            "Total stat (what happened in the last 26 sec):",
            "  Run the command 'kill -TERM $PID': 1",
        ]);
        assert_eq!(k.len(), 1);
        assert_eq!(
            (k[0].pid, k[0].comm.as_deref()),
            (Some(12297), Some("tail"))
        );
        assert_eq!(k[0].signal, Some("SIGTERM"));
        assert_eq!(
            k[0].reason,
            "MemAvailable [0 MiB, 0.0 %] <= soft_threshold_min_mem [982 MiB, 10.0 %]; SwapFree [2163 MiB, 14.7 %] <= soft_threshold_min_swap [2210 MiB, 15.0 %]"
        );
    }

    /// nohang 0.1 printing its action twice (ev-24), and a run that chose
    /// a victim and did nothing (ev-26).
    #[test]
    fn an_action_printed_twice_is_one_kill_and_a_count_is_none() {
        let k = read(&[
            "Execute the command: kill -SEGV 7026",
            "Implement a corrective action:",
            "  Run the command: kill -SEGV 7026",
            "Total stat (what happened in the last 9 min 22 sec):",
            "  Run the command 'kill -SEGV 6895': 2",
            "Execute the command: /usr/sbin/nohang_notify_helper --uid 0 --time 1562163404.0337765 &",
            "Implement a corrective action:",
            "  Run the command: kill -SEGV 7026",
        ]);
        assert_eq!(k.len(), 1);
        assert_eq!((k[0].pid, k[0].signal), (Some(7026), Some("SIGSEGV")));
        let none = read(&[
            "PSI avg (92.25) > sigterm_psi_threshold (90.0)",
            "  PID: 477, Name: Xorg, badness: 12",
            "victim badness 12 < min_badness 20; nothing to do; response time: 5 ms",
            "  Send SIGTERM to tail: 1",
        ]);
        assert!(none.is_empty(), "{none:?}");
    }

    /// A victim status block (ev-25): the cgroup, the signal.
    #[test]
    fn a_victim_status_block_gives_the_cgroup() {
        let k = read(&[
            "  CGroup_v2: /user.slice/user-1000.slice/session-17.scope",
            "Implement a corrective action:",
            "  Send SIGTERM to the victim; total response time: 2255 ms",
        ]);
        assert_eq!(
            k[0].cgroup.as_deref(),
            Some("/user.slice/user-1000.slice/session-17.scope")
        );
        assert_eq!((k[0].pid, k[0].signal), (None, Some("SIGTERM")));
    }

    /// The real nohang 0.2.0 (Debian's), as it ran in the v2 guest's journal
    /// test: its hard threshold, its choice, its victim status block and
    /// its SIGKILL.
    #[test]
    fn nohang_0_2_s_sigkill_with_its_victim_status() {
        let k = read(&[
            ">>=== STARTING implement_corrective_action() ====>>",
            "Memory status that requires corrective actions:",
            "  MemAvailable [786 MiB, 40.0 %] <= hard_threshold_min_mem [983 MiB, 50.0 %]",
            "  SwapFree [0 MiB, 0.0 %] <= hard_threshold_min_swap [0 MiB, - %]",
            "Found 5 tasks with non-zero oom_score (except init and self) in 152ms",
            "TOP-5 tasks by badness:",
            "  Name                PID badness",
            "  --------------- ------- -------",
            "  sleep               201    1333",
            "  journal-ba3be2f     186     667",
            "TOP printed in 38ms; process with highest badness:",
            "  PID: 201, name: sleep, badness: 1333",
            "Recheck memory levels...",
            "Memory status that requires corrective actions:",
            "  MemAvailable [786 MiB, 40.0 %] <= hard_threshold_min_mem [983 MiB, 50.0 %]",
            "  SwapFree [0 MiB, 0.0 %] <= hard_threshold_min_swap [0 MiB, - %]",
            "Victim status (found in 52ms):",
            "  PID:       201, name: sleep, state: S (sleeping), EUID: 0, SID: 109 (sh), lifetime: 13.1s",
            "  badness:   1333, oom_score:  1333, oom_score_adj:  1000",
            "  Vm, MiB:   Size: 2, RSS: 1 (Anon: 0, File: 1, Shmem: 0), Swap: 0",
            "  cgroup_v1: ",
            "  cgroup_v2: /tracer-e2e-nohang-186-0",
            "  ancestry:  PID 186 (journal-ba3be2f) <= PID 110 (guest.sh) <= PID 109 (sh)",
            "Memory pressure (system-wide):",
            "  some avg10=0.00 avg60=0.00 avg300=0.00",
            "Implementing a corrective action:",
            "  Sending SIGKILL to the victim",
        ]);
        assert_eq!(k.len(), 1);
        assert_eq!(
            (k[0].pid, k[0].comm.as_deref(), k[0].signal),
            (Some(201), Some("sleep"), Some("SIGKILL"))
        );
        assert_eq!(k[0].cgroup.as_deref(), Some("/tracer-e2e-nohang-186-0"));
        assert_eq!(
            k[0].reason,
            "MemAvailable [786 MiB, 40.0 %] <= hard_threshold_min_mem [983 MiB, 50.0 %]; SwapFree [0 MiB, 0.0 %] <= hard_threshold_min_swap [0 MiB, - %]"
        );
    }

    /// `talosctl dmesg`'s lines (ev-28) and an abridged paste (ev-29).
    #[test]
    fn talos_s_oom_controller_kills_a_cgroup() {
        let mut triggered = false;
        assert!(talos("[talos] OOM controller triggered {\"component\": \"controller-runtime\", \"controller\": \"runtime.OOMController\"}", &mut triggered).is_none());
        let k = talos("[talos] Sending SIGKILL to cgroup {\"component\": \"controller-runtime\", \"controller\": \"runtime.OOMController\", \"cgroup\": \"/sys/fs/cgroup/kubepods/burstable/pod77f06c5c-4593-43e9-b970-987f6ecb825b\"}", &mut triggered).unwrap();
        assert_eq!(
            k.cgroup.as_deref(),
            Some("/sys/fs/cgroup/kubepods/burstable/pod77f06c5c-4593-43e9-b970-987f6ecb825b")
        );
        assert!(k.reason.contains("triggered"), "{}", k.reason);
        let k = talos(
            "[talos] Sending SIGKILL to cgroup .../kubepods/burstable/pod<uid>   # = cilium-agent",
            &mut triggered,
        )
        .unwrap();
        assert_eq!(k.cgroup.as_deref(), Some(".../kubepods/burstable/pod<uid>"));
        assert!(k.reason.contains("not in the log"), "{}", k.reason);
        assert!(is_talos("[talos] OOM controller triggered"));
        assert!(!is_talos(
            "[talos] service[kubelet](Running): Health check successful"
        ));
    }
}
