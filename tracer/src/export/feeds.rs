//! What the exporters read besides the stored records: the kills counted
//! per series (who killed, under which constraint, in which cgroup), the
//! recorder's counters and what the engine publishes, and the labels that
//! name a container or pod. The Prometheus endpoint and OTLP both read it.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{Exported, Exporter};
use crate::{
    model::{cgroup::Owner, kube::KubeNames},
    record::{KillRecord, MetricsSnapshot, published::Published},
};

/// The `namespace`, `pod` and `container` labels: a pod's names when
/// known (`container` empty for a pod's own cgroup), else `container` as
/// tracer names it.
pub fn who(kube: Option<&KubeNames>, container: &str) -> Vec<(&'static str, String)> {
    match kube {
        Some(k) => vec![
            ("namespace", k.namespace.clone()),
            ("pod", k.pod.clone()),
            ("container", k.container.clone().unwrap_or_default()),
        ],
        None => vec![
            ("namespace", String::new()),
            ("pod", String::new()),
            ("container", container.to_string()),
        ],
    }
}

/// The `namespace`, `pod` and `container` labels of an owner.
pub fn owner_labels(o: Option<&Owner>) -> Vec<(&'static str, String)> {
    who(
        o.and_then(|o| o.kube.as_ref()),
        &o.and_then(Owner::short).unwrap_or_default(),
    )
}

/// Whether a kernel OOM kill still waits for the kernel's report of it.
fn awaits_report(k: &KillRecord) -> bool {
    k.killer.kind == crate::record::KillerKind::KernelOom
        && k.gaps
            .iter()
            .any(|g| matches!(g, crate::record::Gap::AwaitingReport))
}

/// One kill series: who killed, under which constraint, in which cgroup.
/// A pod's container counts by its names and its pod's cgroup (a pod UID
/// and a container name), so a replaced container (a new id, a new
/// cgroup) keeps counting in the same series.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct KillKey {
    /// Kubernetes names of the victim's pod, when known.
    pub kube: Option<KubeNames>,
    /// The container as tracer names it, outside a named pod.
    pub container: String,
    /// `kernel_oom`, the userspace OOM killers by name (`systemd_oomd`,
    /// `kubelet`, `earlyoom`), or `process` (any other SIGKILL sender).
    pub killer: String,
    /// The kernel's OOM constraint (`memcg`, `global`, `cpuset`,
    /// `mempolicy`); empty for userspace kills.
    pub constraint: String,
    /// The victim's memory cgroup path (its pod's, in a named pod).
    pub cgroup: String,
}

/// The `killer` label of a kill: the kernel, a userspace OOM killer known
/// by its name, or another process.
pub fn killer_name(k: &KillRecord) -> &'static str {
    k.killer.name()
}

impl KillKey {
    /// The series a stored kill counts in.
    pub fn of(k: &KillRecord) -> Self {
        let cgroup = k.cgroup().unwrap_or_default().to_string();
        let owner = k.victim.owner.as_ref();
        let kube = owner.and_then(|o| o.kube.clone());
        let cgroup = match &kube {
            Some(_) => crate::model::cgroup::pod_cgroup(&cgroup).unwrap_or(cgroup),
            None => cgroup,
        };
        KillKey {
            container: match &kube {
                Some(_) => String::new(),
                None => owner.and_then(Owner::short).unwrap_or_default(),
            },
            kube,
            killer: killer_name(k).into(),
            constraint: k.killer.constraint.clone().unwrap_or_default(),
            cgroup,
        }
    }

    pub(super) fn labels(&self) -> Vec<(&'static str, String)> {
        let mut l = who(self.kube.as_ref(), &self.container);
        l.extend([
            ("cgroup", self.cgroup.clone()),
            ("constraint", self.constraint.clone()),
            ("killer", self.killer.clone()),
        ]);
        l
    }
}

/// How long a kernel OOM kill waits for the kernel's report (which names
/// its constraint) before it is counted with what its tracepoint gave.
pub const REPORT_WAIT: Duration = Duration::from_secs(3);

/// Per series: kills (aggregated SIGKILL storms count each victim) and
/// the latest one's wall time, seconds. A kernel OOM kill stored before
/// the kernel's report joined it waits for the report (at most
/// [`REPORT_WAIT`]), so its series has the kernel's constraint and cgroup:
/// a counter never moves from one series to another.
#[derive(Debug, Default)]
pub struct KillCounts {
    series: Mutex<BTreeMap<KillKey, (u64, f64)>>,
    pending: Mutex<HashMap<i64, (Instant, KillKey, u64, f64)>>,
}

fn weight(k: &KillRecord) -> (KillKey, u64, f64) {
    let n = k.aggregate.as_ref().map(|a| a.count.max(1)).unwrap_or(1);
    (KillKey::of(k), n, k.ts_ns as f64 / 1e9)
}

impl KillCounts {
    /// Counts one kill as it is (a record read back from the store).
    pub fn count(&self, k: &KillRecord) {
        let (key, n, at) = weight(k);
        self.add(key, n, at);
    }

    fn add(&self, key: KillKey, n: u64, at: f64) {
        let mut s = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let e = s.entry(key).or_default();
        e.0 += n;
        e.1 = e.1.max(at);
    }

    /// A kill just stored: counted now, or once its report joins. Kills
    /// that waited long enough are counted here too, so the waiting ones
    /// stay few whether or not anyone scrapes.
    pub fn stored(&self, id: i64, k: &KillRecord, now: Instant) {
        self.settle(now);
        if awaits_report(k) {
            let (key, n, at) = weight(k);
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.insert(id, (now, key, n, at));
        } else {
            self.count(k);
        }
    }

    /// A stored kill changed: counted with its final series if it waited
    /// and its report has now joined (a change before the report, such as
    /// reaping or the memory at exit, leaves it waiting).
    pub fn updated(&self, id: i64, k: &KillRecord) {
        if awaits_report(k) {
            return;
        }
        let waited = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.remove(&id).is_some()
        };
        if waited {
            self.count(k);
        }
    }

    /// Counts the kills that waited longer than [`REPORT_WAIT`].
    pub fn settle(&self, now: Instant) {
        let due: Vec<(KillKey, u64, f64)> = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let ids: Vec<i64> = p
                .iter()
                .filter(|(_, (t, ..))| now.duration_since(*t) >= REPORT_WAIT)
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| p.remove(id))
                .map(|(_, k, n, at)| (k, n, at))
                .collect()
        };
        for (k, n, at) in due {
            self.add(k, n, at);
        }
    }

    /// Every series now (the kills that waited long enough counted).
    pub fn snapshot(&self) -> Vec<(KillKey, (u64, f64))> {
        self.settle(Instant::now());
        let s = self.series.lock().unwrap_or_else(|e| e.into_inner());
        s.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

/// Counts the stored kills into [`KillCounts`] (an exporter lane: it sees
/// a kill once it is durable).
pub struct KillCounter(pub Arc<KillCounts>);

impl Exporter for KillCounter {
    fn name(&self) -> &str {
        "metrics"
    }

    fn export(&mut self, item: &Exported) -> std::io::Result<()> {
        match item {
            Exported::Kill { id, record } => self.0.stored(*id, record, Instant::now()),
            Exported::KillUpdated { id, record } => self.0.updated(*id, record),
            Exported::GpuOom { .. } | Exported::Pressure { .. } => {}
        }
        Ok(())
    }
}

/// The recorder's shared counters, as a scrape reads them.
pub trait CounterSource: std::fmt::Debug + Send + Sync + 'static {
    /// Every counter now.
    fn counters(&self) -> MetricsSnapshot;
}

/// What the endpoint reads: the recorder's counters, the stored kills, and
/// what the engine publishes as it goes.
#[derive(Clone, Debug)]
pub struct Feeds {
    /// The recorder's shared counters.
    pub metrics: Arc<dyn CounterSource>,
    /// Kills, per series.
    pub kills: Arc<KillCounts>,
    /// What the engine publishes.
    pub published: Arc<Published>,
}

impl Feeds {
    /// Feeds for `metrics` and `kills`, nothing published yet.
    pub fn new(metrics: Arc<dyn CounterSource>, kills: Arc<KillCounts>) -> Self {
        Self {
            metrics,
            kills,
            published: Arc::default(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::{Killer, KillerKind, MemcgAtKill};

    /// A kill of `kind` in `cgroup` at `ts_s` seconds.
    pub(crate) fn kill(
        kind: KillerKind,
        constraint: Option<&str>,
        cgroup: &str,
        ts_s: i64,
    ) -> KillRecord {
        KillRecord {
            ts_ns: ts_s * 1_000_000_000,
            killer: Killer {
                kind,
                constraint: constraint.map(String::from),
                ..Default::default()
            },
            memcg: Some(MemcgAtKill {
                path: cgroup.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pods_container_counts_in_one_series_by_its_names_across_replacements() {
        use crate::model::cgroup::owner_of;
        let uid = "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f";
        let named = |id: char, ts| {
            let path = format!(
                "/kubepods/burstable/pod{uid}/{}",
                std::iter::repeat_n(id, 64).collect::<String>()
            );
            let mut k = kill(KillerKind::KernelOom, Some("memcg"), &path, ts);
            let mut o = owner_of(&path);
            o.kube = Some(KubeNames {
                namespace: "ml".into(),
                pod: "trainer-0".into(),
                container: Some("worker".into()),
            });
            k.victim.owner = Some(o);
            k
        };
        let kills = KillCounts::default();
        kills.count(&named('a', 100));
        kills.count(&named('b', 200)); // the container, replaced
        let snap = kills.snapshot();
        assert_eq!(snap.len(), 1, "{snap:?}");
        let (key, (n, at)) = &snap[0];
        assert_eq!((*n, *at), (2, 200.0));
        let labels = key.labels();
        let get = |name| labels.iter().find(|(k, _)| *k == name).unwrap().1.as_str();
        assert_eq!(
            (get("namespace"), get("pod"), get("container")),
            ("ml", "trainer-0", "worker")
        );
        assert_eq!(get("cgroup"), format!("/kubepods/burstable/pod{uid}"));
        // A container outside a pod: named as tracer names it.
        let docker = format!("/docker/{}", "c".repeat(64));
        let mut k = kill(KillerKind::KernelOom, Some("memcg"), &docker, 5);
        k.victim.owner = Some(owner_of(&docker));
        let key = KillKey::of(&k);
        assert_eq!(key.container, "docker cccccccccccc");
        assert_eq!(key.cgroup, docker);
    }

    #[test]
    fn a_kernel_kill_waits_for_its_report_so_its_series_never_moves() {
        let counts = KillCounts::default();
        let t0 = Instant::now();
        let mut first = kill(KillerKind::KernelOom, Some("global"), "/a", 10);
        first.gaps.push(crate::record::Gap::AwaitingReport);
        counts.stored(1, &first, t0);
        assert!(
            counts.series.lock().unwrap().is_empty(),
            "waits for the report"
        );
        // Reaped before the report came: still waiting.
        let mut reaped = first.clone();
        reaped.reaping = Some(Default::default());
        counts.updated(1, &reaped);
        assert!(
            counts.series.lock().unwrap().is_empty(),
            "a change before the report is not the report"
        );
        let joined = kill(KillerKind::KernelOom, Some("memcg"), "/a", 10);
        counts.updated(1, &joined);
        counts.updated(1, &joined);
        let s = counts.series.lock().unwrap().clone();
        assert_eq!(s.len(), 1);
        let (k, (n, _)) = s.iter().next().unwrap();
        assert_eq!(
            (k.constraint.as_str(), *n),
            ("memcg", 1),
            "counted once, as the report says"
        );
        // No report: counted as it was once the wait is over.
        counts.stored(2, &first, t0);
        counts.settle(t0 + REPORT_WAIT / 2);
        assert_eq!(counts.series.lock().unwrap().len(), 1);
        counts.settle(t0 + REPORT_WAIT);
        let s = counts.series.lock().unwrap().clone();
        assert_eq!(s.len(), 2);
        // Userspace kills have no report to wait for.
        counts.stored(3, &kill(KillerKind::Userspace, None, "/b", 11), t0);
        assert_eq!(counts.series.lock().unwrap().len(), 3);
        // Without a scrape, a later kill settles the ones that waited.
        counts.stored(4, &first, t0);
        counts.stored(
            5,
            &kill(KillerKind::Userspace, None, "/b", 12),
            t0 + REPORT_WAIT,
        );
        assert!(counts.pending.lock().unwrap().is_empty());
    }

    #[test]
    fn userspace_oom_killers_are_named() {
        let by = |comm: &str| {
            let mut k = kill(KillerKind::Userspace, None, "/x", 1);
            k.killer.sender = Some(crate::record::ProcRef {
                comm: comm.into(),
                ..Default::default()
            });
            killer_name(&k)
        };
        assert_eq!(by("systemd-oomd"), "systemd_oomd");
        assert_eq!(by("kubelet"), "kubelet");
        assert_eq!(by("earlyoom"), "earlyoom");
        assert_eq!(by("bash"), "process");
        assert_eq!(
            killer_name(&kill(KillerKind::KernelOom, Some("memcg"), "/x", 1)),
            "kernel_oom"
        );
    }
}
