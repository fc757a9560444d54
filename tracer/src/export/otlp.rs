//! OTLP/HTTP export (`record --otlp http://127.0.0.1:4318`) with the
//! OpenTelemetry SDK: the metrics of the Prometheus endpoint (the same
//! families, observed at each push), and each stored kill and GPU OOM as a
//! log record with its verdict.
//!
//! Everything runs on threads of its own: the exporter lane hands records
//! to the SDK's batch processor (its own thread), and the periodic metric
//! reader pushes on its own thread; the recorder only `try_send`s to the
//! lane. A dead or slow collector costs counted losses (records and pushes
//! the collector did not take, said at stop), never a late kill.
//!
//! Resource: `service.name` tracer, `service.version`, `host.name` (and
//! whatever `OTEL_RESOURCE_ATTRIBUTES` adds). The kill's own process,
//! container and pod are attributes of its log record, under the semantic
//! conventions' names (`k8s.namespace.name`, `k8s.pod.name`,
//! `k8s.pod.uid`, `k8s.container.name`, `container.id`,
//! `process.pid`, ...): one agent reports about many pods, and a
//! collector's `groupbyattrs` processor makes them resources where wanted.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use opentelemetry::{
    KeyValue,
    logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity},
    metrics::MeterProvider as _,
};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    logs::{
        BatchConfigBuilder, BatchLogProcessor, LogBatch, LogExporter, SdkLogger, SdkLoggerProvider,
    },
    metrics::{
        PeriodicReader, SdkMeterProvider, Temporality, data::ResourceMetrics,
        exporter::PushMetricExporter,
    },
};

use super::{
    Exported, Exporter,
    families::{Family, Values},
    feeds::{Feeds, killer_name},
};
use crate::record::{GpuOomRecord, KillRecord};

/// How long one push may take, retries included (the SDK waits 5 s for
/// its threads at shutdown: a dead collector must not make it wait more).
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// `--otlp` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// Not an `http://` URL.
    #[error(
        "--otlp {0}: not an http:// URL of an OTLP/HTTP receiver (e.g. http://127.0.0.1:4318); https is not built in: send to a collector on the node"
    )]
    Url(String),
    /// The SDK refused the configuration.
    #[error("--otlp {url}: {why}")]
    Build {
        /// The URL.
        url: String,
        /// Why.
        why: String,
    },
}

/// What a kill's log record says: its verdict's cause and summary.
pub type DescribeKill = fn(&KillRecord) -> (String, String);
/// What a GPU OOM's log record says: its verdict.
pub type DescribeGpuOom = fn(&GpuOomRecord) -> String;

/// What the exporter needs.
pub struct OtlpConfig {
    /// The receiver's base URL (`/v1/logs` and `/v1/metrics` are added).
    pub endpoint: String,
    /// Metrics push period.
    pub interval: Duration,
    /// This node's name.
    pub host: String,
    /// The recorder's metrics.
    pub feeds: Feeds,
    /// The store's file (for its size).
    pub store: PathBuf,
    /// Verdicts (they belong to `explain`, a later layer).
    pub describe_kill: DescribeKill,
    /// Verdicts of GPU OOMs.
    pub describe_gpu_oom: DescribeGpuOom,
    /// Besides root, the uid whose loopback receiver may see command lines.
    pub trusted_uid: Option<u32>,
}

/// What the collector did not take.
#[derive(Debug, Default)]
pub struct OtlpLost {
    /// Log records in batches that failed.
    pub records: AtomicU64,
    /// Log records handed to the SDK whose batch has not been answered
    /// yet (taken or refused): lost if the exporter is left behind at stop.
    pub in_flight: AtomicU64,
    /// Metric pushes that failed.
    pub pushes: AtomicU64,
    warned: AtomicBool,
}

impl OtlpLost {
    fn failed(&self, endpoint: &str, what: &str, why: &dyn std::fmt::Display) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "otlp: {endpoint} did not take {what} ({why}); recording goes on, and what is lost is counted"
            );
        }
    }
}

/// Checks an `--otlp` URL: `http://host[:port][/path]`.
pub fn check_url(url: &str) -> Result<String, OtlpError> {
    authority(url).ok_or_else(|| OtlpError::Url(url.into()))?;
    Ok(url.trim_end_matches('/').to_string())
}

/// The `host:port` of an `http://` URL (port 80 when none is given), or
/// None when it is not one.
fn authority(url: &str) -> Option<String> {
    let host = url.strip_prefix("http://")?.split('/').next()?;
    let port = host
        .rsplit_once(':')
        .map(|(_, p)| p)
        .filter(|p| !p.ends_with(']'));
    let bad = host.is_empty()
        || host.chars().any(|c| c.is_whitespace() || c.is_control())
        || port.is_some_and(|p| p.parse::<u16>().is_err());
    match (bad, port) {
        (true, _) => None,
        (false, Some(_)) => Some(host.to_string()),
        (false, None) => Some(format!("{host}:80")),
    }
}

/// Whether something accepts a connection at `url`'s host and port within
/// `timeout` (a receiver that does not is said at start, not fatal).
pub fn answers(url: &str, timeout: Duration) -> bool {
    authority(url)
        .and_then(|a| std::net::ToSocketAddrs::to_socket_addrs(&a).ok()?.next())
        .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, timeout).is_ok())
}

#[derive(Debug)]
struct CountedLogs {
    inner: opentelemetry_otlp::LogExporter,
    lost: Arc<OtlpLost>,
    endpoint: String,
}

impl LogExporter for CountedLogs {
    async fn export(&self, batch: LogBatch<'_>) -> OTelSdkResult {
        let n = batch.iter().count() as u64;
        let r = self.inner.export(batch).await;
        let _ = self
            .lost
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
        if let Err(e) = &r {
            self.lost.records.fetch_add(n, Ordering::Relaxed);
            self.lost.failed(&self.endpoint, "log records", e);
        }
        r
    }

    fn shutdown_with_timeout(&self, t: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(t)
    }

    fn set_resource(&mut self, r: &Resource) {
        self.inner.set_resource(r);
    }
}

struct CountedMetrics {
    inner: opentelemetry_otlp::MetricExporter,
    lost: Arc<OtlpLost>,
    endpoint: String,
}

impl PushMetricExporter for CountedMetrics {
    async fn export(&self, m: &ResourceMetrics) -> OTelSdkResult {
        let r = self.inner.export(m).await;
        if let Err(e) = &r {
            self.lost.pushes.fetch_add(1, Ordering::Relaxed);
            self.lost.failed(&self.endpoint, "metrics", e);
        }
        r
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, t: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(t)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// The families, read at most once per push for all instruments.
struct Observed {
    feeds: Feeds,
    store: PathBuf,
    last: Mutex<Option<(Instant, Arc<Vec<Family>>)>>,
}

impl Observed {
    fn now(&self) -> Arc<Vec<Family>> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, f)) = &*last
            && at.elapsed() < Duration::from_millis(500)
        {
            return f.clone();
        }
        let f = Arc::new(self.feeds.families(&self.store));
        *last = Some((Instant::now(), f.clone()));
        f
    }
}

/// Labels as attributes (empty values left out: OTLP has no empty label).
fn attributes(labels: &[(&'static str, String)]) -> Vec<KeyValue> {
    labels
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| KeyValue::new(*k, v.clone()))
        .collect()
}

/// The exporter: an [`Exporter`] lane for the log records, owning the
/// metric pusher for as long as it runs.
pub struct OtlpExporter {
    logs: SdkLoggerProvider,
    logger: SdkLogger,
    meters: SdkMeterProvider,
    lost: Arc<OtlpLost>,
    endpoint: String,
    describe_kill: DescribeKill,
    describe_gpu_oom: DescribeGpuOom,
    /// The verdict last sent per kill id: a kill completed later (the
    /// kernel's report joined) is sent again only if it says more.
    sent: HashMap<i64, String>,
    /// Whether the receiver may see command lines.
    recipient: Recipient,
}

/// Who receives what the exporter sends. A receiver on this host's
/// loopback may be any local user who took the port first: command lines
/// go to it only while the socket listening there belongs to root or to
/// the uid named by `--otlp-trusted-uid`. A receiver elsewhere is the one
/// whoever started the recorder named.
#[derive(Debug)]
struct Recipient {
    /// The port, when the receiver is on loopback.
    loopback_port: Option<u16>,
    trusted_uid: Option<u32>,
    /// The last check and its answer (checked again after a second).
    checked: Option<(Instant, bool)>,
    /// Whether the refusal was said.
    said: bool,
}

impl Recipient {
    fn of(endpoint: &str, trusted_uid: Option<u32>) -> Self {
        let loopback_port = authority(endpoint).and_then(|a| {
            let (host, port) = a.rsplit_once(':')?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let local = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified());
            local.then(|| port.parse().ok()).flatten()
        });
        Self {
            loopback_port,
            trusted_uid,
            checked: None,
            said: false,
        }
    }

    fn may_see_cmdlines(&mut self) -> bool {
        let Some(port) = self.loopback_port else {
            return true;
        };
        if let Some((at, ok)) = self.checked
            && at.elapsed() < Duration::from_secs(1)
        {
            return ok;
        }
        let owner = listener_uid(port);
        let ok = owner.is_some_and(|u| u == 0 || Some(u) == self.trusted_uid);
        if !ok && !self.said {
            self.said = true;
            let who = owner.map_or_else(|| "no one".to_string(), |u| format!("uid {u}"));
            tracing::warn!(
                "otlp: the socket listening on port {port} belongs to {who}, not root{}: kills go to it without command lines",
                self.trusted_uid
                    .map(|u| format!(" or uid {u} (--otlp-trusted-uid)"))
                    .unwrap_or_default()
            );
        }
        self.checked = Some((Instant::now(), ok));
        ok
    }
}

/// The owner of the TCP socket listening on `port` on this host (any
/// address, IPv4 or IPv6), from /proc/net/tcp{,6}.
fn listener_uid(port: u16) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|f| {
        let text = std::fs::read_to_string(f).ok()?;
        listener_uid_in(&text, port)
    })
}

/// [`listener_uid`] in the text of one /proc/net/tcp file.
fn listener_uid_in(text: &str, port: u16) -> Option<u32> {
    const LISTEN: &str = "0A";
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local_port = f.get(1)?.rsplit_once(':')?.1;
        (u16::from_str_radix(local_port, 16).ok()? == port && *f.get(3)? == LISTEN)
            .then(|| f.get(7)?.parse().ok())
            .flatten()
    })
}

impl OtlpExporter {
    /// Starts the SDK's threads for `cfg.endpoint`. Nothing is sent yet;
    /// a receiver that is not there costs counted losses, not an error.
    pub fn start(cfg: OtlpConfig) -> Result<(Self, Arc<OtlpLost>), OtlpError> {
        let base = check_url(&cfg.endpoint)?;
        let build = |e: opentelemetry_otlp::ExporterBuildError| OtlpError::Build {
            url: base.clone(),
            why: e.to_string(),
        };
        let lost = Arc::new(OtlpLost::default());
        let resource = Resource::builder()
            .with_service_name("tracer")
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("host.name", cfg.host.clone()),
            ])
            .build();
        let logs = opentelemetry_otlp::LogExporter::builder()
            .with_http()
            .with_endpoint(format!("{base}/v1/logs"))
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(PUSH_TIMEOUT)
            .build()
            .map_err(build)?;
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_endpoint(format!("{base}/v1/metrics"))
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(PUSH_TIMEOUT)
            .build()
            .map_err(build)?;
        let processor = BatchLogProcessor::builder(CountedLogs {
            inner: logs,
            lost: lost.clone(),
            endpoint: base.clone(),
        })
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(Duration::from_millis(500))
                .build(),
        )
        .build();
        let log_provider = SdkLoggerProvider::builder()
            .with_resource(resource.clone())
            .with_log_processor(processor)
            .build();
        let reader = PeriodicReader::builder(CountedMetrics {
            inner: metrics,
            lost: lost.clone(),
            endpoint: base.clone(),
        })
        .with_interval(cfg.interval)
        .build();
        let meters = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(reader)
            .build();
        let observed = Arc::new(Observed {
            feeds: cfg.feeds,
            store: cfg.store,
            last: Mutex::new(None),
        });
        let meter = meters.meter("tracer");
        for f in observed.now().iter() {
            let (name, o) = (f.name, observed.clone());
            match f.values {
                Values::Counter(_) => {
                    meter
                        .u64_observable_counter(name)
                        .with_description(f.help)
                        .with_callback(move |obs| {
                            for f in o.now().iter().filter(|f| f.name == name) {
                                if let Values::Counter(s) = &f.values {
                                    for (labels, v) in s {
                                        obs.observe(*v, &attributes(labels));
                                    }
                                }
                            }
                        })
                        .build();
                }
                Values::Gauge(_) => {
                    meter
                        .f64_observable_gauge(name)
                        .with_description(f.help)
                        .with_callback(move |obs| {
                            for f in o.now().iter().filter(|f| f.name == name) {
                                if let Values::Gauge(s) = &f.values {
                                    for (labels, v) in s {
                                        obs.observe(*v, &attributes(labels));
                                    }
                                }
                            }
                        })
                        .build();
                }
            }
        }
        let logger = log_provider.logger("tracer");
        Ok((
            Self {
                logs: log_provider,
                logger,
                meters,
                lost: lost.clone(),
                endpoint: base,
                describe_kill: cfg.describe_kill,
                describe_gpu_oom: cfg.describe_gpu_oom,
                sent: HashMap::new(),
                recipient: Recipient::of(&cfg.endpoint, cfg.trusted_uid),
            },
            lost,
        ))
    }

    fn kill(&mut self, id: i64, k: &KillRecord, updated: bool) {
        let (cause, summary) = (self.describe_kill)(k);
        if updated && self.sent.get(&id) == Some(&summary) {
            return;
        }
        if self.sent.len() >= 4096 {
            self.sent.clear();
        }
        self.sent.insert(id, summary.clone());
        let v = &k.victim;
        let mut r = self.logger.create_log_record();
        r.set_event_name("tracer.kill");
        r.set_timestamp(UNIX_EPOCH + Duration::from_nanos(k.ts_ns.max(0) as u64));
        r.set_observed_timestamp(SystemTime::now());
        r.set_severity_number(Severity::Error);
        r.set_severity_text("ERROR");
        r.set_body(AnyValue::from(format!(
            "{} (pid {}) killed, killer {}: {summary}",
            v.comm,
            v.pid,
            killer_name(k)
        )));
        r.add_attribute("tracer.kill.id", id);
        r.add_attribute("tracer.kill.updated", updated);
        r.add_attribute("tracer.killer", killer_name(k));
        r.add_attribute("tracer.verdict.cause", cause);
        r.add_attribute("tracer.verdict", summary);
        if let Some(c) = &k.killer.constraint {
            r.add_attribute("tracer.oom.constraint", c.clone());
        }
        if let Some(g) = &k.oom_group {
            r.add_attribute("tracer.oom.group", g.clone());
        }
        r.add_attribute("process.pid", i64::from(v.pid));
        r.add_attribute("process.executable.name", v.comm.clone());
        if let Some(c) = &v.cmdline {
            r.add_attribute("process.command_line", c.clone());
        }
        if let Some(m) = &v.memcg {
            r.add_attribute("tracer.memcg", m.clone());
        }
        if let Some(o) = &v.owner {
            for (key, val) in owner_attributes(o) {
                r.add_attribute(key, val);
            }
        }
        self.lost.in_flight.fetch_add(1, Ordering::Relaxed);
        self.logger.emit(r);
    }

    fn gpu_oom(&mut self, id: i64, g: &GpuOomRecord) {
        let verdict = (self.describe_gpu_oom)(g);
        let p = &g.process;
        let mut r = self.logger.create_log_record();
        r.set_event_name("tracer.gpu_oom");
        r.set_timestamp(UNIX_EPOCH + Duration::from_nanos(g.ts_ns.max(0) as u64));
        r.set_observed_timestamp(SystemTime::now());
        r.set_severity_number(Severity::Error);
        r.set_severity_text("ERROR");
        r.set_body(AnyValue::from(format!(
            "{} (pid {}): {} of {} bytes failed ({}): {verdict}",
            p.comm, p.pid, g.function, g.size, g.ret
        )));
        r.add_attribute("tracer.gpu_oom.id", id);
        r.add_attribute("tracer.verdict", verdict);
        r.add_attribute("tracer.cuda.function", g.function.clone());
        r.add_attribute("tracer.cuda.error", i64::from(g.ret));
        r.add_attribute("tracer.cuda.size", g.size as i64);
        r.add_attribute("gpu", i64::from(g.device));
        r.add_attribute("process.pid", i64::from(p.pid));
        r.add_attribute("process.executable.name", p.comm.clone());
        if let Some(o) = &p.owner {
            for (key, val) in owner_attributes(o) {
                r.add_attribute(key, val);
            }
        }
        self.lost.in_flight.fetch_add(1, Ordering::Relaxed);
        self.logger.emit(r);
    }
}

impl OtlpExporter {
    fn pressure(&mut self, p: &crate::record::PressureEvent) {
        use crate::record::WarningState;
        let mut r = self.logger.create_log_record();
        r.set_event_name("tracer.pressure");
        r.set_timestamp(UNIX_EPOCH + Duration::from_nanos(p.ts_ns.max(0) as u64));
        r.set_observed_timestamp(SystemTime::now());
        let (sev, state) = match p.state {
            WarningState::Warning => (Severity::Warn, "warning"),
            WarningState::Recovered => (Severity::Info, "recovered"),
        };
        r.set_severity_number(sev);
        r.set_severity_text(sev.name());
        let body = match (p.state, p.projected_s) {
            (WarningState::Warning, Some(s)) => {
                format!(
                    "{}: reaches its memory limit in {s:.0} s at its growth rate",
                    p.memcg
                )
            }
            (WarningState::Warning, None) => format!("{}: stalls on memory", p.memcg),
            (WarningState::Recovered, _) => format!("{}: no longer near its memory limit", p.memcg),
        };
        r.set_body(AnyValue::from(body));
        r.add_attribute("tracer.pressure.state", state);
        r.add_attribute("tracer.memcg", p.memcg.clone());
        r.add_attribute("tracer.memcg.usage", p.usage_bytes as i64);
        if let Some(l) = p.limit_bytes {
            r.add_attribute("tracer.memcg.limit", l as i64);
        }
        if let Some(v) = p.projected_s {
            r.add_attribute("tracer.pressure.projected_s", v);
        }
        if let Some(v) = p.rate_bytes_per_s {
            r.add_attribute("tracer.pressure.rate_bytes_per_s", v);
        }
        if let Some(v) = p.psi_some_avg10 {
            r.add_attribute("tracer.pressure.psi_some_avg10", v);
        }
        if let Some(o) = &p.owner {
            for (key, val) in owner_attributes(o) {
                r.add_attribute(key, val);
            }
        }
        self.lost.in_flight.fetch_add(1, Ordering::Relaxed);
        self.logger.emit(r);
    }
}

/// A container's and pod's semantic-convention attributes.
fn owner_attributes(o: &crate::model::cgroup::Owner) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(id) = &o.container_id {
        out.push(("container.id", id.clone()));
    }
    if let Some(rt) = &o.runtime {
        out.push(("container.runtime", rt.clone()));
    }
    if let Some(uid) = &o.pod_uid {
        out.push(("k8s.pod.uid", uid.clone()));
    }
    if let Some(k) = &o.kube {
        out.push(("k8s.namespace.name", k.namespace.clone()));
        out.push(("k8s.pod.name", k.pod.clone()));
        if let Some(c) = &k.container {
            out.push(("k8s.container.name", c.clone()));
        }
    }
    out
}

impl Exporter for OtlpExporter {
    fn name(&self) -> &str {
        "otlp"
    }

    fn export(&mut self, item: &Exported) -> std::io::Result<()> {
        let stripped;
        let item = if self.recipient.may_see_cmdlines() {
            item
        } else {
            stripped = item.without_cmdlines();
            stripped.as_ref().unwrap_or(item)
        };
        match item {
            Exported::Kill { id, record } => self.kill(*id, record, false),
            Exported::KillUpdated { id, record } => self.kill(*id, record, true),
            Exported::GpuOom { id, record } => self.gpu_oom(*id, record),
            Exported::Pressure { record } => self.pressure(record),
        }
        Ok(())
    }

    fn lost_if_left(&self) -> Option<super::LostIfLeft> {
        let lost = self.lost.clone();
        Some(Arc::new(move || {
            lost.records.load(Ordering::Relaxed) + lost.in_flight.load(Ordering::Relaxed)
        }))
    }

    fn finish(&mut self) -> u64 {
        // Hand on what is queued, then push the metrics a last time.
        let _ = self.logs.shutdown();
        let _ = self.meters.shutdown();
        let records = self.lost.records.load(Ordering::Relaxed);
        let pushes = self.lost.pushes.load(Ordering::Relaxed);
        if records + pushes > 0 {
            tracing::warn!(
                "otlp: {} did not take {records} log record(s) and {pushes} metrics push(es)",
                self.endpoint
            );
        }
        records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_of_a_listening_socket_is_read_from_proc_net_tcp() {
        // /proc/net/tcp of a host: root's sshd on 22, uid 65534 listening
        // on 4318, and a connection from port 4318 (not listening).
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 20133 1 0000000000000000 100 0 0 10 0
   1: 0100007F:10DE 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 51234 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:10DE 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 51000 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listener_uid_in(text, 22), Some(0));
        assert_eq!(listener_uid_in(text, 4318), Some(65534));
        assert_eq!(listener_uid_in(text, 4317), None);
        assert!(Recipient::of("http://127.0.0.1:4318", None).loopback_port == Some(4318));
        assert!(Recipient::of("http://localhost:4318/", None).loopback_port == Some(4318));
        assert!(Recipient::of("http://[::1]:4318", None).loopback_port == Some(4318));
        assert!(
            Recipient::of("http://collector.monitoring:4318", None)
                .loopback_port
                .is_none()
        );
        let mut remote = Recipient::of("http://10.1.2.3:4318", None);
        assert!(remote.may_see_cmdlines());
    }

    #[test]
    fn otlp_urls_are_checked() {
        assert_eq!(
            check_url("http://127.0.0.1:4318/").unwrap(),
            "http://127.0.0.1:4318"
        );
        assert!(check_url("http://collector.monitoring:4318").is_ok());
        assert!(check_url("http://[::1]:4318").is_ok());
        for bad in [
            "127.0.0.1:4318",
            "https://collector:4318",
            "http://",
            "http://host:port",
            "http://a b:4318",
            "grpc://x:4317",
        ] {
            assert!(matches!(check_url(bad), Err(OtlpError::Url(_))), "{bad}");
        }
    }
}
