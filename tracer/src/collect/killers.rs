//! Kills by userspace OOM killers, from their own log lines:
//! - systemd-oomd: `Killed CGROUP due to memory pressure for M being
//!   51.07% > 50.00% for > 20s with reclaim activity`, `Marked CGROUP for
//!   killing due to ...`, `oomd attempting to kill PID with KILL`;
//! - earlyoom: `low memory! at or below SIGTERM limits: ...`, `sending
//!   SIGTERM to process N uid U "comm": badness B, VmRSS R MiB`, the older
//!   `killing process N "comm" with signal 15: ...`, `escalating to SIGKILL
//!   after 2.4 seconds`;
//! - kubelet: why it stops a pod or a container (its eviction manager, a
//!   failed probe, a deletion through the API, its admission's
//!   preemption, activeDeadlineSeconds) and the kill lines that follow
//!   ([`kubelet`]);
//! - systemd's notices of a unit that lost a process to the kernel's OOM
//!   killer (`UNIT: A process of this unit has been killed by the OOM
//!   killer.`, `UNIT: Failed with result 'oom-kill'.`): not kills of their
//!   own (the kernel's lines are), but which unit they were in.
//!
//! Each kill keeps the reason the killer gave, as it wrote it.

pub mod kubelet;
pub mod nohang;

/// The programs whose lines are read here.
pub const KILLERS: &[&str] = &[
    "systemd-oomd",
    "earlyoom",
    "kubelet",
    "systemd",
    "nohang",
    "nohang-desktop",
    "hyperkube",
];

/// One kill a userspace killer logged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserKill {
    /// `systemd-oomd` or `earlyoom`.
    pub killer: &'static str,
    /// Its pid, when its line names it (`systemd-oomd[840]:`).
    pub killer_pid: Option<u32>,
    /// The processes it named (none: systemd-oomd named only the cgroup).
    pub pid: Option<u32>,
    /// The victim's name, when given.
    pub comm: Option<String>,
    /// The victim's uid, when given.
    pub uid: Option<u32>,
    /// The cgroup killed (systemd-oomd kills a whole cgroup).
    pub cgroup: Option<String>,
    /// The pod (`namespace/name`, or kubelet's `name_namespace(uid)`)
    /// kubelet evicted or whose container it killed.
    pub pod: Option<String>,
    /// The container kubelet killed (its name, or its runtime id).
    pub container: Option<String>,
    /// Why, as the killer wrote it.
    pub reason: String,
    /// The signal, when the line names it.
    pub signal: Option<&'static str>,
    /// The victim's RSS as the killer read it, kB.
    pub rss_kb: Option<u64>,
}

/// What a userspace killer's lines give, once read in order.
#[derive(Debug)]
pub enum Said {
    /// A new kill.
    Kill(Box<UserKill>),
    /// The last kill of `pid` went on to SIGKILL (earlyoom's escalation).
    Escalated {
        /// The victim.
        pid: u32,
        /// The killer's words.
        reason: String,
    },
    /// systemd says this unit lost a process to the kernel's OOM killer.
    Unit(String),
}

/// Reads the lines of the userspace killers of one host, in order.
#[derive(Debug, Default)]
pub struct Killers {
    /// earlyoom's last `low memory!` line: the reason of its next kill.
    low: Option<String>,
    /// earlyoom's last victim.
    last_victim: Option<u32>,
    /// Pids systemd-oomd said it was killing, before its `Killed` line.
    oomd_pids: Vec<u32>,
    /// kubelet's reasons between its lines.
    kubelet: kubelet::Kubelet,
    /// nohang's state between its lines.
    nohang: nohang::Nohang,
    /// Whether Talos's OOM controller said it triggered, before its kill.
    talos_triggered: bool,
}

impl Killers {
    /// One line of `program` (its syslog identifier, or the killer the
    /// text is recognised as); `text` is the message.
    pub fn push(&mut self, program: &str, pid: Option<u32>, text: &str) -> Option<Said> {
        let said = match program {
            "systemd-oomd" => self.oomd(text),
            "earlyoom" => self.earlyoom(text),
            // OpenShift's kubelet logs as hyperkube.
            "kubelet" | "hyperkube" => self.kubelet.push(kubelet::klog_message(text)),
            "systemd" => unit_notice(text),
            "nohang" | "nohang-desktop" => self.nohang.push(text).map(|k| Said::Kill(Box::new(k))),
            "talos" => {
                nohang::talos(text, &mut self.talos_triggered).map(|k| Said::Kill(Box::new(k)))
            }
            _ => None,
        };
        match said {
            Some(Said::Kill(mut k)) => {
                k.killer_pid = pid;
                Some(Said::Kill(k))
            }
            other => other,
        }
    }

    fn oomd(&mut self, text: &str) -> Option<Said> {
        if let Some(rest) = text.strip_prefix("oomd attempting to kill ") {
            if let Some(pid) = rest.split_whitespace().next().and_then(|p| p.parse().ok()) {
                self.oomd_pids.push(pid);
            }
            return None;
        }
        let (cgroup, reason) = if let Some(rest) = text.strip_prefix("Killed ") {
            rest.split_once(" due to ")?
        } else if let Some(rest) = text.strip_prefix("Marked ") {
            let (cg, rest) = rest.split_once(" for killing")?;
            (cg, rest.split_once(" due to ")?.1)
        } else {
            return None;
        };
        let pids = std::mem::take(&mut self.oomd_pids);
        Some(Said::Kill(Box::new(UserKill {
            killer: "systemd-oomd",
            // One named process is the victim; several, or none, leave
            // the cgroup as the victim.
            pid: (pids.len() == 1).then(|| pids[0]),
            cgroup: Some(cgroup.trim().to_string()),
            reason: reason.trim().to_string(),
            signal: (!pids.is_empty()).then_some("SIGKILL"),
            ..Default::default()
        })))
    }

    fn earlyoom(&mut self, text: &str) -> Option<Said> {
        if text.starts_with("low memory!") {
            self.low = Some(text.trim().to_string());
            return None;
        }
        if let Some(rest) = text.strip_prefix("escalating to SIGKILL") {
            return self.last_victim.map(|pid| Said::Escalated {
                pid,
                reason: format!("escalating to SIGKILL{}", rest.trim_end()),
            });
        }
        // `sending SIGTERM to process 57834 uid 1000 "code": badness 866, VmRSS 5 MiB`
        // `killing process 27541 "bash" with signal 15: badness 550, VmRSS 7609 MiB`
        let (signal, rest) = if let Some(rest) = text.strip_prefix("sending ") {
            let (sig, rest) = rest.split_once(" to process ")?;
            let sig = match sig {
                "SIGTERM" => "SIGTERM",
                "SIGKILL" => "SIGKILL",
                _ => return None,
            };
            (Some(sig), rest)
        } else {
            (None, text.strip_prefix("killing process ")?)
        };
        let (pid, rest) = rest.split_once(' ')?;
        let pid: u32 = pid.parse().ok()?;
        let mut uid = None;
        let mut rest = rest;
        if let Some(r) = rest.strip_prefix("uid ") {
            let (u, r) = r.split_once(' ')?;
            uid = u.parse().ok();
            rest = r;
        }
        let (comm, after) = rest.strip_prefix('"')?.split_once('"')?;
        let signal = signal.or_else(|| {
            match after
                .split("with signal ")
                .nth(1)?
                .split(':')
                .next()?
                .trim()
            {
                "15" => Some("SIGTERM"),
                "9" => Some("SIGKILL"),
                _ => None,
            }
        });
        let rss_kb = after
            .split("VmRSS ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|mib| mib.parse::<u64>().ok())
            .map(|mib| mib * 1024);
        self.last_victim = Some(pid);
        Some(Said::Kill(Box::new(UserKill {
            killer: "earlyoom",
            pid: Some(pid),
            comm: Some(comm.to_string()),
            uid,
            reason: self.low.clone().unwrap_or_else(|| {
                "its memory limits were reached (the line that says which is not in the log)".into()
            }),
            signal,
            rss_kb,
            ..Default::default()
        })))
    }
}

/// The value after `key` (`pod="ns/name"` or `Killing container "id"`),
/// without its quotes.
fn quoted<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let rest = text.split(key).nth(1)?.strip_prefix('"')?;
    rest.split('"').next()
}

/// systemd's notice of a unit that lost a process to the OOM killer.
fn unit_notice(text: &str) -> Option<Said> {
    let (unit, what) = text.split_once(": ")?;
    (what.contains("has been killed by the OOM killer")
        || what.contains("Failed with result 'oom-kill'"))
    .then(|| Said::Unit(unit.trim().to_string()))
}

/// The killer whose own output `text` is, when it carries no syslog
/// identifier (earlyoom run in a terminal).
pub fn recognise(text: &str) -> Option<&'static str> {
    let earlyoom = text.starts_with("low memory! at or below ")
        || (text.starts_with("sending SIG")
            && text.contains(" to process ")
            && text.contains("badness"))
        || (text.starts_with("killing process ") && text.contains("badness"))
        || text.starts_with("escalating to SIGKILL after ");
    if earlyoom {
        return Some("earlyoom");
    }
    if nohang::is_talos(text) {
        return Some("talos");
    }
    if kubelet::kubelet_klog(text) {
        return Some("kubelet");
    }
    nohang::is_nohang(text).then_some("nohang")
}

/// `systemd-oomd[840]: text` -> (program, its pid, text), for the killers
/// read here.
pub fn split_program(s: &str) -> Option<(&'static str, Option<u32>, &str)> {
    let (tag, text) = s.split_once(": ")?;
    let (name, pid) = match tag.split_once('[') {
        Some((n, p)) => (n, p.strip_suffix(']').and_then(|p| p.parse().ok())),
        None => (tag, None),
    };
    let program = KILLERS.iter().find(|k| **k == name)?;
    // systemd's lines count only when they are about the OOM killer.
    if *program == "systemd" && !(text.contains("OOM killer") || text.contains("'oom-kill'")) {
        return None;
    }
    Some((program, pid, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kills of `lines` (program, text), escalations folded in.
    pub(super) fn kills(lines: &[(&str, &str)]) -> Vec<UserKill> {
        let mut k = Killers::default();
        let mut out: Vec<UserKill> = Vec::new();
        for (p, t) in lines {
            match k.push(p, Some(7), t) {
                Some(Said::Kill(u)) => out.push(*u),
                Some(Said::Escalated { pid, reason }) => {
                    let last = out.iter_mut().rev().find(|u| u.pid == Some(pid)).unwrap();
                    last.signal = Some("SIGKILL");
                    last.reason = format!("{}; {reason}", last.reason);
                }
                Some(Said::Unit(_)) | None => {}
            }
        }
        out
    }

    /// Lines of tests/fixtures/real-logs (ev-12, ev-13, ev-15, ev-16, ev-14).
    #[test]
    fn the_lines_of_systemd_oomd_and_earlyoom() {
        let oomd = kills(&[
            ("systemd-oomd", "oomd attempting to kill 407 with KILL"),
            (
                "systemd-oomd",
                "Marked /system.slice/systemd-journald.service for killing due to memory pressure for /system.slice being 85.03% > 80.00% for > 2s with reclaim activity",
            ),
            (
                "systemd-oomd",
                "Killed /user.slice/user-1001.slice/user@1001.service/app.slice/vte.scope due to memory pressure for /user.slice/user-1001.slice/user@1001.service being 51.07% > 50.00% for > 20s with reclaim activity",
            ),
        ]);
        assert_eq!(oomd.len(), 2);
        assert_eq!(oomd[0].pid, Some(407));
        assert_eq!(oomd[0].signal, Some("SIGKILL"));
        assert_eq!(
            oomd[0].cgroup.as_deref(),
            Some("/system.slice/systemd-journald.service")
        );
        assert!(
            oomd[0]
                .reason
                .starts_with("memory pressure for /system.slice being 85.03% > 80.00%")
        );
        assert_eq!((oomd[1].pid, oomd[1].signal), (None, None));

        let early = kills(&[
            (
                "earlyoom",
                "low memory! at or below SIGTERM limits: mem  5.00%, swap 40.00%",
            ),
            (
                "earlyoom",
                "sending SIGTERM to process 57834 uid 1000 \"code\": badness 866, VmRSS 5 MiB",
            ),
            (
                "earlyoom",
                "killing process 27541 \"bash\" with signal 15: badness 550, VmRSS 7609 MiB",
            ),
            (
                "earlyoom",
                "sending SIGTERM to process 12006 \"python3\": badness 209, VmRSS 2891 MiB",
            ),
            ("earlyoom", "escalating to SIGKILL after 2.4 seconds"),
        ]);
        assert_eq!(early.len(), 3);
        assert_eq!(
            (
                early[0].pid,
                early[0].uid,
                early[0].comm.as_deref(),
                early[0].signal,
                early[0].rss_kb
            ),
            (
                Some(57834),
                Some(1000),
                Some("code"),
                Some("SIGTERM"),
                Some(5 * 1024)
            )
        );
        assert_eq!(
            early[0].reason,
            "low memory! at or below SIGTERM limits: mem  5.00%, swap 40.00%"
        );
        assert_eq!(
            (early[1].pid, early[1].signal),
            (Some(27541), Some("SIGTERM"))
        );
        assert_eq!(early[2].signal, Some("SIGKILL"));
        assert!(
            early[2]
                .reason
                .ends_with("escalating to SIGKILL after 2.4 seconds")
        );
        assert_eq!(early[0].killer_pid, Some(7));
        assert_eq!(
            split_program("systemd-oomd[840]: Killed x"),
            Some(("systemd-oomd", Some(840), "Killed x"))
        );
        assert_eq!(split_program("sshd[9]: Accepted"), None);
        assert_eq!(
            recognise("sending SIGTERM to process 1 \"x\": badness 1, VmRSS 1 MiB"),
            Some("earlyoom")
        );
    }
}
