//! The metrics endpoint's HTTP server, bounded against its clients.
//!
//! Any local user (and, with a remote address, any pod of the cluster)
//! can connect, so nothing a client does may grow the recorder, take its
//! threads or keep it from stopping:
//! - one thread: a one-thread tokio runtime serves every connection, so a
//!   thousand idle sockets are a thousand small tasks, never threads;
//! - at most [`MAX_CONNECTIONS`] at once; a connection over the cap is
//!   closed at accept and counted;
//! - a request's head must fit in [`MAX_HEAD_BYTES`] and arrive within
//!   [`HEAD_TIMEOUT`], or [`HEAD_TIMEOUT_BUSY`] when many connections are
//!   open (hyper answers 431, or closes); a connection lives
//!   at most [`CONNECTION_DEADLINE`], so a client that never reads its
//!   answers holds a slot that long, and never a lock: a page is rendered
//!   into a buffer before it is written;
//! - an accept error (no file descriptor left) is counted, and accepting
//!   resumes after [`ACCEPT_BACKOFF`];
//! - an address that cannot be bound (an unprivileged user took the port
//!   first) is said, counted and retried every [`BIND_RETRY`]: recording
//!   never depends on it;
//! - with a token file, every page but `/healthz` needs
//!   `Authorization: Bearer TOKEN` (compared in constant time);
//! - stopping closes every connection at once, whatever clients do.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, header, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, oneshot};

/// Connections served at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 64;
/// The largest request head (request line and headers) read: hyper's
/// smallest read buffer.
pub const MAX_HEAD_BYTES: usize = 8192;
/// A request's head must arrive within this long.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// ... or within this long for a connection accepted while
/// [`BUSY_CONNECTIONS`] or more are open: a scraper sends its request as
/// soon as it connects, so under a flood of idle connections the queue of
/// connections waiting to be accepted drains in seconds, not minutes.
pub const HEAD_TIMEOUT_BUSY: Duration = Duration::from_millis(500);
/// Open connections from which [`HEAD_TIMEOUT_BUSY`] applies.
pub const BUSY_CONNECTIONS: usize = 8;
/// No connection lives longer (keep-alive included).
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// How often an address that could not be bound is tried again.
pub const BIND_RETRY: Duration = Duration::from_secs(5);
/// The pause after a failed accept (no file descriptor left), so that the
/// connection still waiting does not spin the thread.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The largest token file read.
const MAX_TOKEN_BYTES: u64 = 4096;

/// What the server has seen, for the endpoint's own metrics.
#[derive(Debug, Default)]
pub struct ServeStats {
    /// Connections accepted and served.
    pub connections: AtomicU64,
    /// Connections closed at accept: [`MAX_CONNECTIONS`] were open.
    pub refused: AtomicU64,
    /// Failed accepts (no file descriptor left, or others).
    pub accept_errors: AtomicU64,
    /// Failed binds of the address.
    pub bind_failures: AtomicU64,
    /// Connections closed at [`CONNECTION_DEADLINE`].
    pub timed_out: AtomicU64,
    /// Requests refused for a missing or wrong bearer token.
    pub unauthorized: AtomicU64,
    /// Whether the address is bound now.
    pub listening: AtomicBool,
}

impl ServeStats {
    fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// A bearer token, read from a file.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// The token in `path`: its first line, without surrounding spaces.
    pub fn read(path: &Path) -> Result<Self, String> {
        use std::io::Read as _;
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_TOKEN_BYTES + 1).read_to_string(&mut text))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if text.len() as u64 > MAX_TOKEN_BYTES {
            return Err(format!(
                "{}: longer than {MAX_TOKEN_BYTES} bytes",
                path.display()
            ));
        }
        let token = text.lines().next().unwrap_or("").trim();
        if token.is_empty() {
            return Err(format!("{}: empty", path.display()));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{}: a bearer token is printable ASCII without spaces",
                path.display()
            ));
        }
        Ok(Self(token.as_bytes().into()))
    }

    /// Whether an `Authorization` header value carries this token.
    fn admits(&self, header: Option<&[u8]>) -> bool {
        let Some(given) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        // Constant time in the token's content (its length is no secret).
        given.len() == self.0.len()
            && given
                .iter()
                .zip(self.0.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// A page the server answers with: content type and body.
pub type Page = (&'static str, String);

/// Renders `/metrics`; `true` when the client asked for OpenMetrics.
pub type Render = Arc<dyn Fn(bool) -> Page + Send + Sync>;

/// How the endpoint is set up.
pub struct Config {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The token every page but `/healthz` needs, if any.
    pub token: Option<Token>,
    /// What `/metrics` shows.
    pub render: Render,
}

/// The running server.
pub struct Server {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Where it listens, or will once it can.
    pub addr: SocketAddr,
    /// What it has seen.
    pub stats: Arc<ServeStats>,
}

impl Server {
    /// Binds `config.addr` now if it can (otherwise it says so and keeps
    /// trying every [`BIND_RETRY`]) and serves on a thread of its own.
    pub fn start(config: Config, stats: Arc<ServeStats>) -> std::io::Result<Self> {
        let addr = config.addr;
        let first = match bind(addr) {
            Ok(l) => Some(l),
            Err(e) => {
                ServeStats::add(&stats.bind_failures);
                tracing::warn!(
                    "--metrics {addr}: cannot listen there ({e}); recording goes on, and the endpoint tries again every {} s",
                    BIND_RETRY.as_secs()
                );
                None
            }
        };
        let (tx, rx) = oneshot::channel();
        let s = stats.clone();
        let thread = std::thread::Builder::new()
            .name("tracer-metrics".into())
            .spawn(move || run(first, config, s, rx))?;
        Ok(Self {
            stop: Some(tx),
            thread: Some(thread),
            addr,
            stats,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

fn run(
    first: Option<std::net::TcpListener>,
    config: Config,
    stats: Arc<ServeStats>,
    mut stop: oneshot::Receiver<()>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!("--metrics {}: no runtime: {e}", config.addr);
            return;
        }
    };
    rt.block_on(async {
        let mut pending = first;
        let listener = loop {
            if let Some(l) = pending.take() {
                match tokio::net::TcpListener::from_std(l) {
                    Ok(l) => break l,
                    Err(e) => tracing::warn!("--metrics {}: {e}", config.addr),
                }
            }
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(BIND_RETRY) => {}
            }
            match bind(config.addr) {
                Ok(l) => {
                    tracing::info!("metrics: now listening at {}", config.addr);
                    pending = Some(l);
                }
                Err(_) => ServeStats::add(&stats.bind_failures),
            }
        };
        stats.listening.store(true, Ordering::Relaxed);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let config = Arc::new(config);
        loop {
            let accepted = tokio::select! {
                _ = &mut stop => break,
                a = listener.accept() => a,
            };
            let sock = match accepted {
                Ok((sock, _peer)) => sock,
                Err(_) => {
                    ServeStats::add(&stats.accept_errors);
                    tokio::select! {
                        _ = &mut stop => break,
                        _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    }
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                ServeStats::add(&stats.refused);
                drop(sock);
                continue;
            };
            ServeStats::add(&stats.connections);
            let open = MAX_CONNECTIONS - slots.available_permits();
            let head_timeout = if open > BUSY_CONNECTIONS {
                HEAD_TIMEOUT_BUSY
            } else {
                HEAD_TIMEOUT
            };
            let (config, stats) = (config.clone(), stats.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let svc = service_fn(|req| {
                    let resp = answer(&req, &config, &stats);
                    async move { Ok::<_, Infallible>(resp) }
                });
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(head_timeout)
                    .max_buf_size(MAX_HEAD_BYTES)
                    .serve_connection(TokioIo::new(sock), svc);
                if tokio::time::timeout(CONNECTION_DEADLINE, conn)
                    .await
                    .is_err()
                {
                    ServeStats::add(&stats.timed_out);
                }
            });
        }
        stats.listening.store(false, Ordering::Relaxed);
    });
    // Dropping the runtime drops every connection's task: their sockets
    // close whether or not their clients read.
    rt.shutdown_background();
}

fn page(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

const TEXT: &str = "text/plain; charset=utf-8";

fn answer<B>(req: &Request<B>, config: &Config, stats: &ServeStats) -> Response<Full<Bytes>> {
    if req.method() != hyper::Method::GET {
        return page(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n".into());
    }
    let path = req.uri().path();
    if path == "/healthz" {
        return page(StatusCode::OK, TEXT, "ok\n".into());
    }
    if let Some(token) = &config.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if !token.admits(given) {
            ServeStats::add(&stats.unauthorized);
            let mut r = page(
                StatusCode::UNAUTHORIZED,
                TEXT,
                "a bearer token is needed\n".into(),
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            return r;
        }
    }
    match path {
        "/metrics" => {
            // OpenMetrics when the scraper asks for it (Prometheus does),
            // the Prometheus text format otherwise.
            let openmetrics = req.headers().get_all(header::ACCEPT).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.contains("application/openmetrics-text"))
            });
            let (ct, body) = (config.render)(openmetrics);
            page(StatusCode::OK, ct, body)
        }
        "/" => page(StatusCode::OK, TEXT, "tracer: metrics at /metrics\n".into()),
        _ => page(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_its_files_first_line_and_must_match_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "s3cr3t-token\n").unwrap();
        let t = Token::read(&p).unwrap();
        assert!(t.admits(Some(b"Bearer s3cr3t-token")));
        assert!(!t.admits(Some(b"Bearer s3cr3t-tokem")));
        assert!(!t.admits(Some(b"Bearer s3cr3t-token ")));
        assert!(!t.admits(Some(b"Basic s3cr3t-token")));
        assert!(!t.admits(None));
        std::fs::write(&p, "\n").unwrap();
        assert!(Token::read(&p).unwrap_err().contains("empty"));
        std::fs::write(&p, "two words").unwrap();
        assert!(Token::read(&p).unwrap_err().contains("without spaces"));
        std::fs::write(&p, "x".repeat(5000)).unwrap();
        assert!(Token::read(&p).unwrap_err().contains("longer than"));
        assert!(Token::read(&dir.path().join("none")).is_err());
    }
}
