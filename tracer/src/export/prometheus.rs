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

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use super::{families::Values, feeds::Feeds};
pub use crate::record::published::{ContainerCuda, LabeledCounts, Latest, MemcgGauge, Published};

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
    use crate::{
        export::feeds::{tests::kill, *},
        record::{KillerKind, MetricsSnapshot},
    };

    #[derive(Debug)]
    struct Fixed(MetricsSnapshot);

    impl CounterSource for Fixed {
        fn counters(&self) -> MetricsSnapshot {
            self.0
        }
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
            growth_armed: Some(true),
            leak_bytes_per_second: Some(2048.0),
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
            "tracer_memcg_growth_armed{namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\",cgroup=\"/docker/8f3c\"} 1.0",
            "tracer_memory_leak_bytes_per_second{namespace=\"\",pod=\"\",container=\"docker 8f3c5d9e0b1a\",cgroup=\"/docker/8f3c\"} 2048.0",
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
