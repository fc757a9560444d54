//! Live joins of a userspace OOM killer's journal entry with the SIGKILLs
//! it sent: the signal says who killed and whom, the entry says why
//! (systemd-oomd's pressure against its limit, earlyoom's memory left).
//!
//! systemd-oomd kills every process of a cgroup and logs the cgroup once:
//! each SIGKILL from it to a process in that cgroup (or below) within
//! [`WINDOW_NS`] of the entry takes its reason. earlyoom names the pid it
//! signals: its SIGKILL to that pid takes the reason of its line. kubelet
//! signals nothing itself: it asks the runtime, whose SIGKILL comes a grace
//! period after kubelet's `Killing container` entry (or before its
//! `evicted successfully`); a SIGKILL of a process of the pod (and of the
//! container, where the entry names one) up to [`KUBELET_AFTER_NS`] after
//! the entry takes its reason.

use std::collections::VecDeque;

use crate::{
    collect::killers::UserKill,
    model::cgroup::Owner,
    record::{Gap, KillRecord, KillerKind},
};

/// How far apart a SIGKILL and its killer's entry may be. The killer
/// logs just after it signals; the journal and journalctl add their own
/// delay, and a recorder that lags its rings reads the signal late.
pub const WINDOW_NS: i64 = 30_000_000_000;

/// How long after kubelet's entry the runtime's SIGKILL may come: the
/// grace period (30 s unless the pod says otherwise), and the window.
pub const KUBELET_AFTER_NS: i64 = 120_000_000_000;

/// Entries kept for SIGKILLs read after them.
const KEPT: usize = 256;

/// How long before and after its entry a SIGKILL of `uk`'s killer may be.
fn window(uk: &UserKill) -> (i64, i64) {
    match uk.killer {
        "kubelet" => (WINDOW_NS, KUBELET_AFTER_NS),
        _ => (WINDOW_NS, WINDOW_NS),
    }
}

/// Whether `rec`, a SIGKILL's record, is one that the killer of `uk`
/// (logged at `logged_ns`) sent.
pub fn sent_by(uk: &UserKill, logged_ns: i64, rec: &KillRecord) -> bool {
    let (before, after) = window(uk);
    if rec.killer.kind != KillerKind::Userspace
        || rec.killer.reason.is_some()
        || rec.ts_ns < logged_ns - before
        || rec.ts_ns > logged_ns + after
    {
        return false;
    }
    let Some(sender) = &rec.killer.sender else {
        return false;
    };
    if uk.killer == "kubelet" {
        return rec.victim.owner.as_ref().is_some_and(|o| of_pod(uk, o));
    }
    if sender.comm != uk.killer || uk.killer_pid.is_some_and(|p| p != sender.pid) {
        return false;
    }
    if let Some(pid) = uk.pid {
        return rec.victim.pid == pid;
    }
    match (&uk.cgroup, &rec.victim.memcg) {
        (Some(cg), Some(m)) => within(m, cg),
        // The victim's cgroup not known: the sender and the time decide.
        _ => true,
    }
}

/// Whether kubelet's entry names this owner's pod (`ns/name`, or its
/// older `name_ns(uid)`) and container (its name, or `docker://ID`), as
/// far as it names them.
fn of_pod(uk: &UserKill, o: &Owner) -> bool {
    if uk.pod.is_none() && uk.container.is_none() {
        return false;
    }
    let pod = uk.pod.as_deref().is_none_or(|p| {
        let by_uid = p
            .split_once('(')
            .and_then(|(_, u)| u.strip_suffix(')'))
            .zip(o.pod_uid.as_deref())
            .is_some_and(|(a, b)| a.replace('_', "-") == b);
        by_uid
            || o.kube
                .as_ref()
                .is_some_and(|k| p == format!("{}/{}", k.namespace, k.pod))
    });
    let container = uk
        .container
        .as_deref()
        .is_none_or(|c| match c.split_once("://") {
            Some((_, id)) => {
                !id.is_empty()
                    && o.container_id
                        .as_deref()
                        .is_some_and(|full| full.starts_with(id))
            }
            None => o
                .kube
                .as_ref()
                .and_then(|k| k.container.as_deref())
                .is_some_and(|name| name == c),
        });
    pod && container
}

/// Whether cgroup `path` is `top` or below it.
fn within(path: &str, top: &str) -> bool {
    let top = top.trim_end_matches('/');
    path.strip_prefix(top)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || top.is_empty())
}

/// Gives `rec` what its killer's entry says.
pub fn fill(uk: &UserKill, rec: &mut KillRecord) {
    rec.killer.reason = Some(uk.reason.clone());
    rec.source.log = true;
    if rec
        .killer
        .sender
        .as_ref()
        .is_none_or(|s| s.comm != uk.killer)
    {
        rec.killer.asked_by = Some(uk.killer.to_string());
    }
    let what = match (&uk.pod, &uk.container) {
        (Some(p), Some(c)) => format!("{} stopped container {c} of pod {p}", uk.killer),
        (Some(p), None) => format!("{} evicted pod {p}", uk.killer),
        (None, Some(c)) => format!("{} stopped container {c}", uk.killer),
        (None, None) => return,
    };
    rec.gaps.push(Gap::Note(what));
}

/// The userspace killers' entries of the last [`WINDOW_NS`].
#[derive(Debug, Default)]
pub struct Logged {
    recent: VecDeque<(i64, UserKill)>,
}

impl Logged {
    /// Keeps an entry, forgetting those older than any SIGKILL they could
    /// still name.
    pub fn push(&mut self, ts_ns: i64, uk: UserKill) {
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| ts_ns - t > KUBELET_AFTER_NS)
            || self.recent.len() >= KEPT
        {
            self.recent.pop_front();
        }
        self.recent.push_back((ts_ns, uk));
    }

    /// Gives a new SIGKILL's record the reason of the entry of its killer,
    /// if one came first. Returns whether one did.
    pub fn fill(&self, rec: &mut KillRecord) -> bool {
        let Some((_, uk)) = self
            .recent
            .iter()
            .rev()
            .find(|(t, uk)| sent_by(uk, *t, rec))
        else {
            return false;
        };
        fill(uk, rec);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Killer, ProcRef, Victim};

    const S: i64 = 1_000_000_000;
    const SCOPE: &str = "/user.slice/user-1001.slice/user@1001.service/app.slice/app-org.gnome.Terminal.slice/vte-spawn-dbb4a75e-031f-480d-924b-5de5af7579d2.scope";

    fn sigkill(sender: (u32, &str), victim: u32, memcg: &str, ts_ns: i64) -> KillRecord {
        KillRecord {
            ts_ns,
            killer: Killer {
                kind: KillerKind::Userspace,
                sender: Some(ProcRef {
                    pid: sender.0,
                    comm: sender.1.into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            victim: Victim {
                pid: victim,
                memcg: Some(memcg.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn oomd() -> UserKill {
        UserKill {
            killer: "systemd-oomd",
            killer_pid: Some(840),
            cgroup: Some(SCOPE.into()),
            reason: "memory pressure for /user.slice/user-1001.slice/user@1001.service being 51.07% > 50.00% for > 20s with reclaim activity".into(),
            ..Default::default()
        }
    }

    #[test]
    fn oomd_s_entry_names_every_sigkill_it_sent_into_its_cgroup() {
        let t = 1_000 * S;
        let uk = oomd();
        let below = format!("{SCOPE}/child");
        assert!(sent_by(
            &uk,
            t,
            &sigkill((840, "systemd-oomd"), 7, SCOPE, t - S)
        ));
        assert!(sent_by(
            &uk,
            t,
            &sigkill((840, "systemd-oomd"), 8, &below, t)
        ));
        // Another cgroup, a name that only starts like it, another sender,
        // another systemd-oomd, or a minute away: not its kills.
        let sibling = format!("{SCOPE}x");
        for rec in [
            sigkill((840, "systemd-oomd"), 9, "/user.slice/other.scope", t),
            sigkill((840, "systemd-oomd"), 9, &sibling, t),
            sigkill((841, "kill"), 9, SCOPE, t),
            sigkill((999, "systemd-oomd"), 9, SCOPE, t),
            sigkill((840, "systemd-oomd"), 9, SCOPE, t - 60 * S),
        ] {
            assert!(!sent_by(&uk, t, &rec), "{rec:?}");
        }
        let mut rec = sigkill((840, "systemd-oomd"), 7, SCOPE, t);
        fill(&uk, &mut rec);
        assert!(rec.source.log && rec.killer.reason.is_some());
        assert!(!sent_by(&uk, t, &rec), "a record is filled once");
    }

    #[test]
    fn earlyoom_s_entry_names_the_pid_it_signalled() {
        let t = 1_000 * S;
        let uk = UserKill {
            killer: "earlyoom",
            pid: Some(4242),
            reason: "low memory! at or below SIGTERM limits: mem 10.00%, swap  5.00%".into(),
            ..Default::default()
        };
        assert!(sent_by(
            &uk,
            t,
            &sigkill((77, "earlyoom"), 4242, "/", t + S)
        ));
        assert!(!sent_by(
            &uk,
            t,
            &sigkill((77, "earlyoom"), 4243, "/", t + S)
        ));
    }

    #[test]
    fn kubelet_s_entry_names_the_runtime_s_sigkill_of_its_pod_s_container() {
        use crate::model::cgroup::KubeNames;
        let t = 1_000 * S;
        let owner = |ns: &str, pod: &str, c: &str| Owner {
            runtime: Some("containerd".into()),
            container_id: Some("a1".repeat(32)),
            pod_uid: Some("8d1c4c7e-5e1f-4c6d-8e9f-0a1b2c3d4e5f".into()),
            kube: Some(KubeNames {
                namespace: ns.into(),
                pod: pod.into(),
                container: Some(c.into()),
            }),
            ..Default::default()
        };
        let killed = |o: Owner, ts: i64| {
            let mut r = sigkill((3100, "containerd-shim"), 77, "/kubepods/x", ts);
            r.victim.owner = Some(o);
            r
        };
        let probe = UserKill {
            killer: "kubelet",
            pod: Some("ml/trainer-0".into()),
            container: Some("worker".into()),
            reason: "Liveness probe failed: HTTP probe failed with statuscode: 500".into(),
            ..Default::default()
        };
        // The grace period later: its SIGKILL.
        assert!(sent_by(
            &probe,
            t,
            &killed(owner("ml", "trainer-0", "worker"), t + 30 * S)
        ));
        for rec in [
            killed(owner("ml", "trainer-0", "sidecar"), t + 30 * S),
            killed(owner("ml", "trainer-1", "worker"), t + 30 * S),
            killed(owner("ml", "trainer-0", "worker"), t + KUBELET_AFTER_NS + S),
            killed(owner("ml", "trainer-0", "worker"), t - 40 * S),
        ] {
            assert!(!sent_by(&probe, t, &rec), "{rec:?}");
        }
        // The older forms: a pod by its uid, a container by its runtime id.
        let evicted = UserKill {
            killer: "kubelet",
            pod: Some("trainer-0_ml(8d1c4c7e_5e1f_4c6d_8e9f_0a1b2c3d4e5f)".into()),
            reason: "evicted: attempting to reclaim memory".into(),
            ..Default::default()
        };
        assert!(sent_by(&evicted, t, &killed(owner("x", "y", "z"), t - S)));
        let by_id = UserKill {
            killer: "kubelet",
            container: Some(format!("containerd://{}", "a1".repeat(6))),
            ..Default::default()
        };
        assert!(sent_by(&by_id, t, &killed(owner("x", "y", "z"), t + S)));
        let other = UserKill {
            container: Some("docker://b2b2b2".into()),
            ..by_id
        };
        assert!(!sent_by(&other, t, &killed(owner("x", "y", "z"), t + S)));
    }

    #[test]
    fn a_sigkill_read_after_its_entry_takes_it_and_old_entries_go() {
        let t = 1_000 * S;
        let mut l = Logged::default();
        l.push(t, oomd());
        let mut rec = sigkill((840, "systemd-oomd"), 7, SCOPE, t - S / 2);
        assert!(l.fill(&mut rec));
        assert!(rec.killer.reason.as_deref().unwrap().contains("51.07%"));
        for i in 0..(KEPT as i64 + 10) {
            l.push(t + KUBELET_AFTER_NS + S + i, UserKill::default());
        }
        assert!(l.recent.len() <= KEPT);
        assert!(l.recent.iter().all(|(ts, _)| *ts > t));
    }
}
