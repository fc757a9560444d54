//! The metrics endpoint (`record --metrics 127.0.0.1:9464`): the
//! recorder's shared counters and the kills it stored, in the exposition
//! format, served on a thread of its own by a small blocking HTTP server.
//! A scrape reads atomics and a small map; it never touches the store
//! (the store file's size is one `stat`) or the engine.
//!
//! Kill counters are fed as an [`Exporter`]: each durable kill increments
//! its series, so a scrape sees a kill only once it is in the store.
//! They start from the kills the store still holds, so a restarted
//! recorder does not reset them.
//!
//! Names are under `tracer_`, in base units, counters end in `_total`.
//! Label names reuse cAdvisor's and kube-state-metrics' where they exist
//! (`namespace`, `pod`, `container`): a pod's names when the node's files
//! give them (see [`crate::model::kube`]); otherwise namespace and pod are
//! empty and `container` is the container as tracer names it
//! (`docker 8f3c5d9e0b1a`).

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use super::{Exported, Exporter, families::Values};
pub use crate::record::published::{ContainerCuda, LabeledCounts, Latest, MemcgGauge, Published};
use crate::{
    model::{cgroup::Owner, kube::KubeNames},
    record::{KillRecord, MetricsSnapshot},
};

/// The `namespace`, `pod` and `container` labels: a pod's names when
/// known (`container` empty for a pod's own cgroup), else `container` as
/// tracer names it.
pub(super) fn who(kube: Option<&KubeNames>, container: &str) -> Vec<(&'static str, String)> {
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

/// The endpoint could not be started.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A non-loopback address without the flag that allows it.
    #[error(
        "--metrics {0}: not a loopback address; remote scraping needs authentication: give --metrics-token-file FILE (a bearer token the scraper sends), or listen on 127.0.0.1 behind an authenticating proxy"
    )]
    Remote(SocketAddr),
    /// The token file cannot be used.
    #[error("--metrics-token-file {0}")]
    Token(String),
    /// The address cannot be bound (in use, not local, no permission).
    #[error("--metrics {addr}: cannot listen there: {why}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The server's error.
        why: String,
    },
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
    match k.killer.kind {
        crate::record::KillerKind::KernelOom => "kernel_oom",
        crate::record::KillerKind::Userspace => {
            match k.killer.sender.as_ref().map(|s| s.comm.as_str()) {
                Some("systemd-oomd") => "systemd_oomd",
                Some("kubelet") => "kubelet",
                Some("earlyoom") => "earlyoom",
                _ => "process",
            }
        }
    }
}

impl KillKey {
    /// The series a stored kill counts in.
    pub fn of(k: &KillRecord) -> Self {
        let cgroup = k
            .memcg
            .as_ref()
            .map(|m| m.path.clone())
            .or_else(|| k.victim.memcg.clone())
            .unwrap_or_default();
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

    pub(super) fn snapshot(&self) -> Vec<(KillKey, (u64, f64))> {
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

/// What a scrape reads.
#[derive(Debug)]
struct Source {
    feeds: Feeds,
    store: PathBuf,
    /// The endpoint's own figures.
    serve: Arc<super::http::ServeStats>,
}

/// A counter family: one series per (labels, value); none when empty.
fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Vec<(&'static str, String)>, u64)],
) -> std::fmt::Result {
    if series.is_empty() {
        return Ok(());
    }
    let mut f = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, n) in series {
        ConstCounter::new(*n).encode(f.encode_family(labels)?)?;
    }
    Ok(())
}

/// A gauge family: one series per (labels, value).
fn gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Vec<(&'static str, String)>, f64)],
) -> std::fmt::Result {
    if series.is_empty() {
        return Ok(());
    }
    let mut f = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        ConstGauge::new(*v).encode(f.encode_family(labels)?)?;
    }
    Ok(())
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// The kill commit latency histogram: name and help.
const LATENCY: (&str, &str) = (
    "tracer_kill_commit_latency_seconds",
    "From the kernel's stamp of a kill to its durable commit in the store.",
);

/// The build info gauge: name and help.
const BUILD_INFO: (&str, &str) = ("tracer_build_info", "The recorder's version (always 1).");

/// The endpoint's own counters: name, help and where each is counted.
type ServeCounter = fn(&super::http::ServeStats) -> &std::sync::atomic::AtomicU64;
const ENDPOINT_COUNTERS: [(&str, &str, ServeCounter); 6] = [
    (
        "tracer_metrics_connections",
        "Connections the metrics endpoint accepted.",
        |s| &s.connections,
    ),
    (
        "tracer_metrics_connections_refused",
        "Connections closed at accept: the endpoint had as many open as it serves at once.",
        |s| &s.refused,
    ),
    (
        "tracer_metrics_connections_timed_out",
        "Connections closed at the endpoint's deadline (a client that never finished or never read).",
        |s| &s.timed_out,
    ),
    (
        "tracer_metrics_accept_errors",
        "Failed accepts of the metrics endpoint (no file descriptor left, or others).",
        |s| &s.accept_errors,
    ),
    (
        "tracer_metrics_bind_failures",
        "Failed binds of the metrics address (the port taken, the address not local).",
        |s| &s.bind_failures,
    ),
    (
        "tracer_metrics_unauthorized_requests",
        "Requests refused for a missing or wrong bearer token.",
        |s| &s.unauthorized,
    ),
];

/// Every metric family the endpoint serves, as (name as exposed, type,
/// help), for the reference: the shared families (`Feeds::families`, also
/// what OTLP exports) and the endpoint's own.
pub fn reference(feeds: &Feeds) -> Vec<(String, &'static str, &'static str)> {
    let mut out: Vec<_> = feeds
        .families(std::path::Path::new("/nonexistent"))
        .into_iter()
        .map(|f| match f.values {
            Values::Counter(_) => (format!("{}_total", f.name), "counter", f.help),
            Values::Gauge(_) => (f.name.to_string(), "gauge", f.help),
        })
        .collect();
    out.push((LATENCY.0.to_string(), "histogram", LATENCY.1));
    out.extend(
        ENDPOINT_COUNTERS
            .iter()
            .map(|(name, help, _)| (format!("{name}_total"), "counter", *help)),
    );
    out.push((BUILD_INFO.0.to_string(), "gauge", BUILD_INFO.1));
    out
}

impl Collector for Source {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        for f in self.feeds.families(&self.store) {
            match &f.values {
                // A family of one series without labels: a plain sample.
                Values::Counter(s) if s.len() == 1 && s[0].0.is_empty() => {
                    counter(&mut e, f.name, f.help, s[0].1)?
                }
                Values::Gauge(s) if s.len() == 1 && s[0].0.is_empty() => {
                    gauge(&mut e, f.name, f.help, s[0].1)?
                }
                Values::Counter(s) => counters(&mut e, f.name, f.help, s)?,
                Values::Gauge(s) => gauges(&mut e, f.name, f.help, s)?,
            }
        }
        let m = self.feeds.metrics.counters();
        {
            let mut f = e.encode_descriptor(LATENCY.0, LATENCY.1, None, MetricType::Histogram)?;
            let buckets: Vec<(f64, u64)> = crate::record::KILL_COMMIT_BUCKETS_US
                .iter()
                .map(|b| *b as f64 / 1e6)
                .chain([f64::INFINITY])
                .zip(m.kill_commit_buckets)
                .collect();
            let count = m.kill_commit_buckets.iter().sum();
            f.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                m.kill_commit_sum_us as f64 / 1e6,
                count,
                &buckets,
                None,
            )?;
        }
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        for (name, help, v) in ENDPOINT_COUNTERS {
            counter(&mut e, name, help, load(v(&self.serve)))?;
        }
        {
            let mut f = e.encode_descriptor(BUILD_INFO.0, BUILD_INFO.1, None, MetricType::Gauge)?;
            ConstGauge::new(1i64)
                .encode(f.encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?)?;
        }
        Ok(())
    }
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

/// The running endpoint.
pub struct MetricsServer {
    server: super::http::Server,
    /// Where it listens, or will once the address is free.
    pub addr: SocketAddr,
}

impl MetricsServer {
    /// Serves `/metrics` at `addr` on a thread of its own (see
    /// [`super::http`]). An address other than loopback needs a token:
    /// remote scraping is never unauthenticated. An address that cannot be
    /// bound now is said and retried; it never stops the recorder.
    pub fn start(
        addr: SocketAddr,
        token: Option<&std::path::Path>,
        feeds: Feeds,
        store: PathBuf,
    ) -> Result<Self, MetricsError> {
        if !addr.ip().is_loopback() && token.is_none() {
            return Err(MetricsError::Remote(addr));
        }
        let token = token
            .map(super::http::Token::read)
            .transpose()
            .map_err(MetricsError::Token)?;
        let stats = Arc::new(super::http::ServeStats::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Source {
            feeds,
            store,
            serve: stats.clone(),
        }));
        let registry = Arc::new(registry);
        let render: super::http::Render = Arc::new(move |openmetrics| {
            if openmetrics {
                (OPENMETRICS, render(&registry))
            } else {
                (PROMETHEUS, render_prometheus(&registry))
            }
        });
        let config = super::http::Config {
            addr,
            token,
            render,
        };
        let server = super::http::Server::start(config, stats).map_err(|e| MetricsError::Bind {
            addr,
            why: e.to_string(),
        })?;
        Ok(Self { server, addr })
    }

    /// What the server has seen.
    pub fn stats(&self) -> &super::http::ServeStats {
        &self.server.stats
    }
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The OpenMetrics text of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut body = String::new();
    if prometheus_client::encoding::text::encode(&mut body, registry).is_err() {
        body.clear();
    }
    body
}

/// The Prometheus text format (0.0.4) of `registry`.
pub fn render_prometheus(registry: &Registry) -> String {
    let mut body = String::new();
    if prometheus_client::encoding::prometheus_text::encode(&mut body, registry).is_err() {
        body.clear();
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Killer, KillerKind, MemcgAtKill};

    #[derive(Debug)]
    struct Fixed(MetricsSnapshot);

    impl CounterSource for Fixed {
        fn counters(&self) -> MetricsSnapshot {
            self.0
        }
    }

    fn kill(kind: KillerKind, constraint: Option<&str>, cgroup: &str, ts_s: i64) -> KillRecord {
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
    fn kills_and_self_metrics_are_exposed_with_their_labels() {
        let mut buckets = [0; crate::record::KILL_COMMIT_BUCKETS_US.len() + 1];
        buckets[1] = 2; // two kills of 0.5 to 1 ms
        buckets[5] = 1; // one of 10 to 20 ms
        let metrics = Arc::new(Fixed(MetricsSnapshot {
            events: 42,
            drops_data: 3,
            kill_commit_buckets: buckets,
            kill_commit_sum_us: 13_000,
            ..Default::default()
        }));
        let kills = Arc::new(KillCounts::default());
        kills.count(&kill(
            KillerKind::KernelOom,
            Some("memcg"),
            "/kubepods/pod1/ctr",
            100,
        ));
        kills.count(&kill(
            KillerKind::KernelOom,
            Some("memcg"),
            "/kubepods/pod1/ctr",
            160,
        ));
        kills.count(&kill(KillerKind::Userspace, None, "/system.slice/x", 50));
        let mut registry = Registry::default();
        let feeds = Feeds::new(metrics, kills);
        let published = &feeds.published;
        published.gpu.set(Some(crate::record::GpuView {
            devices: vec![crate::record::DevicePicture {
                device: 0,
                uuid: "GPU-1".into(),
                pci_bus_id: "00000000:01:00.0".into(),
                total: 4 << 30,
                used: 3 << 30,
                free: 1 << 30,
                containers: vec![crate::record::ContainerGpu {
                    name: "docker 8f3c5d9e0b1a".into(),
                    device: 0,
                    nvml_used: 2 << 30,
                    traced_device: 1 << 30,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }));
        published.memcg.set(vec![MemcgGauge {
            cgroup: "/docker/8f3c".into(),
            container: "docker 8f3c5d9e0b1a".into(),
            usage: 1 << 20,
            limit: Some(1 << 30),
            failcnt: Some(7),
            kube: None,
        }]);
        published.xids.inc(vec![
            ("pci_bus_id", "0000:3b:00".into()),
            ("xid", "79".into()),
        ]);
        published.warnings.inc(vec![
            ("namespace", String::new()),
            ("pod", String::new()),
            ("container", "docker 8f3c5d9e0b1a".into()),
            ("cgroup", "/docker/8f3c".into()),
            ("reason", "growth".into()),
        ]);
        published.cuda_failures.inc(vec![
            ("function", "cudaMalloc".into()),
            ("error", "2".into()),
        ]);
        published.cuda_failures.inc(vec![
            ("function", "cudaMalloc".into()),
            ("error", "2".into()),
        ]);
        published.cuda.set(vec![ContainerCuda {
            container: "docker 8f3c5d9e0b1a".into(),
            allocator: Some((27 << 20, 60 << 20)),
            pinned_host: 3 << 20,
            kube: None,
        }]);
        registry.register_collector(Box::new(Source {
            feeds,
            store: "/nonexistent/tracer.db".into(),
            serve: Arc::default(),
        }));
        let text = render(&registry);
        // Every metric the shipped dashboard and alert rules name is one
        // this endpoint serves (with every feed populated, as here).
        let served: std::collections::HashSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        for file in ["grafana/tracer.json", "prometheus/tracer-rules.yml"] {
            let body = std::fs::read_to_string(deploy.join(file)).unwrap();
            let mut named = 0;
            for (i, _) in body.match_indices("tracer_") {
                let name: String = body[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let name = name
                    .strip_suffix("_bucket")
                    .map(|n| format!("{n}_bucket"))
                    .unwrap_or(name);
                if name == "tracer_" || name.starts_with("tracer_rules") {
                    continue;
                }
                named += 1;
                assert!(
                    served.contains(name.as_str()),
                    "{file} names {name}, not served"
                );
            }
            assert!(named > 5, "{file}: {named}");
        }
        for want in [
            "# TYPE tracer_kills counter",
            "tracer_kills_total{namespace=\"\",pod=\"\",container=\"\",cgroup=\"/kubepods/pod1/ctr\",constraint=\"memcg\",killer=\"kernel_oom\"} 2",
            "tracer_kills_total{namespace=\"\",pod=\"\",container=\"\",cgroup=\"/system.slice/x\",constraint=\"\",killer=\"process\"} 1",
            "tracer_last_oom_kill_timestamp_seconds{namespace=\"\",pod=\"\",container=\"\",cgroup=\"/kubepods/pod1/ctr\",constraint=\"memcg\",killer=\"kernel_oom\"} 160.0",
            "tracer_events_total 42",
            "tracer_gpu_allocator_allocated_bytes{namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\"} 28311552.0",
            "tracer_pressure_warnings_total{namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\",cgroup=\"/docker/8f3c\",reason=\"growth\"} 1",
            "tracer_gpu_container_pinned_host_bytes{namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\"} 3145728.0",
            "tracer_gpu_allocator_reserved_bytes{namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\"} 62914560.0",
            "tracer_gpu_xid_errors_total{pci_bus_id=\"0000:3b:00\",xid=\"79\"} 1",
            "tracer_cuda_allocation_failures_total{function=\"cudaMalloc\",error=\"2\"} 2",
            "tracer_oom_kills_total{namespace=\"\",pod=\"\",container=\"\",cgroup=\"/kubepods/pod1/ctr\",constraint=\"memcg\"} 2",
            "tracer_memcg_usage_bytes{namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\",cgroup=\"/docker/8f3c\"} 1048576.0",
            "tracer_memcg_limit_bytes{namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\",cgroup=\"/docker/8f3c\"} 1073741824.0",
            "tracer_memcg_failcnt_total{namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\",cgroup=\"/docker/8f3c\"} 7",
            "tracer_kill_commit_latency_seconds_bucket{le=\"0.0005\"} 0",
            "tracer_kill_commit_latency_seconds_bucket{le=\"0.001\"} 2",
            "tracer_kill_commit_latency_seconds_bucket{le=\"0.02\"} 3",
            "tracer_kill_commit_latency_seconds_bucket{le=\"+Inf\"} 3",
            "tracer_kill_commit_latency_seconds_count 3",
            "tracer_kill_commit_latency_seconds_sum 0.013",
            "tracer_events_dropped_total{ring=\"data\"} 3",
            "tracer_store_size_bytes 0.0",
            "tracer_gpu_memory_used_bytes{gpu=\"0\",UUID=\"GPU-1\",pci_bus_id=\"00000000:01:00.0\"} 3221225472.0",
            "tracer_gpu_container_traced_bytes{gpu=\"0\",UUID=\"GPU-1\",pci_bus_id=\"00000000:01:00.0\",namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\"} 1073741824.0",
            "tracer_build_info{version=\"",
            "# EOF",
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
        let prom = render_prometheus(&registry);
        assert!(
            prom.contains("# TYPE tracer_kills_total counter\n"),
            "{prom}"
        );
        assert!(
            prom.contains("# HELP tracer_events_total Kernel events"),
            "{prom}"
        );
        assert!(
            prom.contains("# TYPE tracer_store_size_bytes gauge\n"),
            "{prom}"
        );
        assert!(!prom.contains("# EOF"), "{prom}");
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

    #[test]
    fn a_remote_address_needs_a_token() {
        let m = Arc::new(Fixed(MetricsSnapshot::default()));
        let k = Arc::new(KillCounts::default());
        let addr: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let e = MetricsServer::start(addr, None, Feeds::new(m.clone(), k.clone()), "/x".into())
            .err()
            .expect("refused");
        assert!(e.to_string().contains("--metrics-token-file"), "{e}");
        let e = MetricsServer::start(
            addr,
            Some(std::path::Path::new("/nonexistent/token")),
            Feeds::new(m, k),
            "/x".into(),
        )
        .err()
        .expect("refused");
        assert!(e.to_string().contains("/nonexistent/token"), "{e}");
    }

    #[test]
    fn hostile_label_values_are_escaped_in_both_formats() {
        let kills = Arc::new(KillCounts::default());
        let hostile = "/evil\\\"} 1\nfake_metric{a=\"";
        kills.count(&kill(KillerKind::KernelOom, Some("memcg"), hostile, 100));
        let feeds = Feeds::new(Arc::new(Fixed(MetricsSnapshot::default())), kills);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Source {
            feeds,
            store: "/nonexistent/tracer.db".into(),
            serve: Arc::default(),
        }));
        for text in [render(&registry), render_prometheus(&registry)] {
            assert!(
                text.contains("cgroup=\"/evil\\\\\\\"} 1\\nfake_metric{a=\\\"\""),
                "{text}"
            );
            assert!(
                !text.lines().any(|l| l.starts_with("fake_metric")),
                "{text}"
            );
        }
    }
}
