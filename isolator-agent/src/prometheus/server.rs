//! The HTTP side of `--metrics`: serves the last rendered exposition, on a thread of its
//! own with its own small runtime. A scrape takes a reference to the immutable exposition
//! and writes it out: it never touches the agent's state and never waits for a cycle, and
//! the agent never waits for a scrape. Bounded: at most [`MAX_CONNECTIONS`] connections at
//! once (more wait in the kernel's accept queue), each closed after
//! [`CONNECTION_TIMEOUT`] whatever the client does, one request per connection (no idle
//! keep-alive connections holding the slots).

use std::{
    convert::Infallible,
    fmt, io,
    net::SocketAddr,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming,
    header::{ACCEPT, ALLOW, CONTENT_TYPE},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::{oneshot, OwnedSemaphorePermit, Semaphore},
};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// A connection is closed this long after it was accepted, whatever state it is in (a
/// client that sends nothing, or reads nothing).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Nice value of the server thread.
const SERVER_NICE: libc::c_int = 10;

pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where `--metrics` listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAddr {
    Tcp(SocketAddr),
    /// A unix socket, mode 0600.
    Unix(PathBuf),
}

impl fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsAddr::Tcp(a) => write!(f, "{a}"),
            MetricsAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// `--metrics`: `IP:PORT` (`127.0.0.1:9500`, `[::1]:9500`, `0.0.0.0:9500`), or a unix
/// socket as `unix:/absolute/path` or `/absolute/path`.
pub fn parse_address(s: &str) -> Result<MetricsAddr, String> {
    let s = s.trim();
    let path = s
        .strip_prefix("unix:")
        .or_else(|| s.starts_with('/').then_some(s));
    if let Some(p) = path {
        if !p.starts_with('/') || p.len() < 2 {
            return Err(format!(
                "'{s}' is not an absolute socket path; use e.g. unix:/run/isolator/metrics.sock"
            ));
        }
        return Ok(MetricsAddr::Unix(PathBuf::from(p)));
    }
    s.parse::<SocketAddr>().map(MetricsAddr::Tcp).map_err(|_| {
        format!(
            "'{s}' is not an address to listen on; use IP:PORT (e.g. 127.0.0.1:9500, [::1]:9500, 0.0.0.0:9500) or unix:/run/isolator/metrics.sock"
        )
    })
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot serve metrics on {0}: the address is in use (another agent or exporter?); stop it or choose another --metrics address")]
    InUse(MetricsAddr),
    #[error("cannot serve metrics on {0}: not allowed ({1}); choose a port >= 1024 (lower ones need CAP_NET_BIND_SERVICE) or a directory the agent may write")]
    NotAllowed(MetricsAddr, io::Error),
    #[error("cannot serve metrics on {0}: not an address of this host; use 127.0.0.1, [::1], 0.0.0.0 or one of the host's addresses")]
    NotHere(MetricsAddr),
    #[error("cannot serve metrics on {0}: it exists and is not a socket; remove it or choose another --metrics path")]
    NotSocket(MetricsAddr),
    #[error("cannot serve metrics on {0}: {1}; choose another --metrics address")]
    Io(MetricsAddr, io::Error),
}

impl ListenError {
    fn of(addr: &MetricsAddr, e: io::Error) -> ListenError {
        let addr = addr.clone();
        match e.kind() {
            io::ErrorKind::AddrInUse => ListenError::InUse(addr),
            io::ErrorKind::PermissionDenied => ListenError::NotAllowed(addr, e),
            io::ErrorKind::AddrNotAvailable => ListenError::NotHere(addr),
            _ => ListenError::Io(addr, e),
        }
    }
}

enum StdListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// A bound `--metrics` address, not yet served: binding happens at start, where a bad
/// address is an error, before anything else is loaded.
pub struct MetricsListener {
    inner: StdListener,
    /// As bound (a port 0 resolved).
    addr: MetricsAddr,
}

impl MetricsListener {
    pub fn bind(addr: &MetricsAddr) -> Result<MetricsListener, ListenError> {
        let inner = match addr {
            MetricsAddr::Tcp(a) => {
                let l = std::net::TcpListener::bind(a).map_err(|e| ListenError::of(addr, e))?;
                let bound = l.local_addr().map_err(|e| ListenError::of(addr, e))?;
                return Ok(MetricsListener {
                    inner: StdListener::Tcp(l),
                    addr: MetricsAddr::Tcp(bound),
                });
            }
            MetricsAddr::Unix(path) => StdListener::Unix(bind_unix(addr, path)?),
        };
        Ok(MetricsListener {
            inner,
            addr: addr.clone(),
        })
    }

    pub fn address(&self) -> &MetricsAddr {
        &self.addr
    }
}

/// Binds a unix socket mode 0600 (metrics name every cgroup on the host). A socket left by
/// an agent that was killed is replaced; a live one is not.
fn bind_unix(
    addr: &MetricsAddr,
    path: &Path,
) -> Result<std::os::unix::net::UnixListener, ListenError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => return Err(ListenError::NotSocket(addr.clone())),
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(ListenError::InUse(addr.clone())),
            Err(_) => std::fs::remove_file(path).map_err(|e| ListenError::of(addr, e))?,
        },
        Err(_) => {}
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::events::private_file::create_dir(dir)
            .map_err(|e| ListenError::of(addr, io::Error::other(e.to_string())))?;
    }
    // Created 0600 (umask) so no other user can connect before the chmod; at start-up,
    // before any other thread creates files.
    // SAFETY: umask only swaps the process's file mode mask.
    let old = unsafe { libc::umask(0o177) };
    let bound = std::os::unix::net::UnixListener::bind(path);
    unsafe { libc::umask(old) };
    let l = bound.map_err(|e| ListenError::of(addr, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ListenError::of(addr, e))?;
    Ok(l)
}

/// One rendered exposition, in both formats; immutable once published.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    pub text: Bytes,
    pub openmetrics: Bytes,
}

/// The exposition scrapes are served: the agent replaces it once per cycle, a scrape takes
/// a reference to it. The lock is held only to swap or clone an `Arc`.
#[derive(Debug, Default)]
pub struct Published(Mutex<Arc<Exposition>>);

impl Published {
    pub fn get(&self) -> Arc<Exposition> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, e: Exposition) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(e);
    }
}

/// The exposition format a scrape gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    OpenMetrics,
}

/// OpenMetrics when the `Accept` header asks for `application/openmetrics-text` (version
/// 1.0.0 or none) at least as much as for the text format; the text format otherwise
/// (including no header, or one that accepts neither: a scraper gets something it can
/// read rather than a 406).
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Text;
    };
    let (mut openmetrics, mut text) = (0f32, 0f32);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let (mut q, mut version) = (1f32, None);
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            let v = v.trim().trim_matches('"');
            match k.trim().to_ascii_lowercase().as_str() {
                "q" => q = v.parse().unwrap_or(0.0),
                "version" => version = Some(v.to_string()),
                _ => {}
            }
        }
        match media.as_str() {
            "application/openmetrics-text" if version.as_deref().is_none_or(|v| v == "1.0.0") => {
                openmetrics = openmetrics.max(q)
            }
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    if openmetrics > 0.0 && openmetrics >= text {
        Format::OpenMetrics
    } else {
        Format::Text
    }
}

/// The running server; stopping it (drop) closes the listener and every connection.
pub struct MetricsServer {
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    unix_path: Option<PathBuf>,
}

/// How many connections at once, and for how long (tests use short ones).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            connection_timeout: CONNECTION_TIMEOUT,
        }
    }
}

enum AsyncListener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl MetricsServer {
    /// Serves `published` on the listener from a thread of its own.
    pub fn spawn(
        listener: MetricsListener,
        published: Arc<Published>,
        limits: Limits,
    ) -> io::Result<MetricsServer> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let unix_path = match &listener.addr {
            MetricsAddr::Unix(p) => Some(p.clone()),
            MetricsAddr::Tcp(_) => None,
        };
        let async_listener = {
            let _in_runtime = rt.enter();
            match listener.inner {
                StdListener::Tcp(l) => {
                    l.set_nonblocking(true)?;
                    AsyncListener::Tcp(tokio::net::TcpListener::from_std(l)?)
                }
                StdListener::Unix(l) => {
                    l.set_nonblocking(true)?;
                    AsyncListener::Unix(tokio::net::UnixListener::from_std(l)?)
                }
            }
        };
        let (tx, rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("isolator-http".into())
            .spawn(move || {
                // Below the cycle's priority: on a busy host a flood of scrapes yields the
                // CPU to the agent's cycle rather than competing with it.
                // SAFETY: setpriority on this thread's own id; a failure changes nothing.
                unsafe {
                    let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                    libc::setpriority(libc::PRIO_PROCESS, tid, SERVER_NICE);
                }
                rt.block_on(serve(async_listener, published, limits, rx))
            })?;
        Ok(MetricsServer {
            shutdown: Some(tx),
            thread: Some(thread),
            unix_path,
        })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        // The accept loop ends at once; the runtime, dropped with the thread, cancels the
        // connections.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(p) = &self.unix_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

async fn serve(
    listener: AsyncListener,
    published: Arc<Published>,
    limits: Limits,
    mut shutdown: oneshot::Receiver<()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        // A slot first: while every slot is taken, connections wait in the accept queue.
        let permit = tokio::select! {
            _ = &mut shutdown => return,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            a = accept(&listener) => a,
        };
        let published = published.clone();
        let timeout = limits.connection_timeout;
        match accepted {
            Ok(Conn::Tcp(s)) => {
                let _ = s.set_nodelay(true);
                tokio::spawn(connection(s, published, timeout, permit));
            }
            Ok(Conn::Unix(s)) => {
                tokio::spawn(connection(s, published, timeout, permit));
            }
            Err(e) => {
                // Out of file descriptors and the like: back off rather than spin.
                tracing::warn!(error = %e, "metrics: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(l: &AsyncListener) -> io::Result<Conn> {
    match l {
        AsyncListener::Tcp(l) => l.accept().await.map(|(s, _)| Conn::Tcp(s)),
        AsyncListener::Unix(l) => l.accept().await.map(|(s, _)| Conn::Unix(s)),
    }
}

async fn connection<IO>(
    io: IO,
    published: Arc<Published>,
    timeout: Duration,
    _slot: OwnedSemaphorePermit,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = http1::Builder::new().keep_alive(false).serve_connection(
        TokioIo::new(io),
        service_fn(move |req| {
            let published = published.clone();
            async move { Ok::<_, Infallible>(respond(&req, &published)) }
        }),
    );
    let _ = tokio::time::timeout(timeout, conn).await;
}

/// `/metrics` (GET or HEAD): the exposition in the negotiated format; `/`: a pointer to
/// it; anything else 404.
pub fn respond(req: &Request<Incoming>, published: &Published) -> Response<Full<Bytes>> {
    response(
        req.method(),
        req.uri().path(),
        req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()),
        published,
    )
}

fn response(
    method: &Method,
    path: &str,
    accept: Option<&str>,
    published: &Published,
) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            let exposition = published.get();
            let (body, content_type) = match negotiate(accept) {
                Format::OpenMetrics => (exposition.openmetrics.clone(), OPENMETRICS_CONTENT_TYPE),
                Format::Text => (exposition.text.clone(), TEXT_CONTENT_TYPE),
            };
            let mut r = Response::new(Full::new(body));
            r.headers_mut().insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(content_type),
            );
            r
        }
        (&Method::GET | &Method::HEAD, "/") => plain(
            StatusCode::OK,
            "isolator: Prometheus metrics at /metrics (docs/metrics.md)\n",
        ),
        (_, "/metrics") => {
            let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD /metrics\n");
            r.headers_mut()
                .insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
            r
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::TcpStream,
    };

    use super::*;

    const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

    #[test]
    fn addresses_parse_or_say_what_to_use() {
        assert_eq!(
            parse_address("127.0.0.1:9500"),
            Ok(MetricsAddr::Tcp("127.0.0.1:9500".parse().unwrap()))
        );
        assert_eq!(
            parse_address("[::1]:9500"),
            Ok(MetricsAddr::Tcp("[::1]:9500".parse().unwrap()))
        );
        assert_eq!(
            parse_address("unix:/run/isolator/metrics.sock"),
            Ok(MetricsAddr::Unix("/run/isolator/metrics.sock".into()))
        );
        assert_eq!(
            parse_address("/run/m.sock"),
            Ok(MetricsAddr::Unix("/run/m.sock".into()))
        );
        for bad in [
            "localhost:9500",
            "9500",
            ":9500",
            "",
            "127.0.0.1",
            "unix:rel",
            "unix:/",
        ] {
            let e = parse_address(bad).unwrap_err();
            assert!(e.contains("e.g."), "{bad}: {e}");
        }
        assert_eq!(
            MetricsAddr::Unix("/a.sock".into()).to_string(),
            "unix:/a.sock"
        );
    }

    #[test]
    fn accept_headers_choose_the_format() {
        assert_eq!(negotiate(None), Format::Text);
        assert_eq!(negotiate(Some(PROMETHEUS_ACCEPT)), Format::OpenMetrics);
        assert_eq!(
            negotiate(Some("application/openmetrics-text")),
            Format::OpenMetrics
        );
        assert_eq!(negotiate(Some("*/*")), Format::Text);
        assert_eq!(negotiate(Some("text/plain;version=0.0.4")), Format::Text);
        // Asked for less than the text format, or only an older OpenMetrics version.
        assert_eq!(
            negotiate(Some("application/openmetrics-text;q=0.3, text/plain")),
            Format::Text
        );
        assert_eq!(
            negotiate(Some("application/openmetrics-text; version=0.0.1")),
            Format::Text
        );
        assert_eq!(
            negotiate(Some("application/openmetrics-text;q=0")),
            Format::Text
        );
        assert_eq!(negotiate(Some("garbage;;q=x,,")), Format::Text);
    }

    fn published(text: &str, om: &str) -> Arc<Published> {
        let p = Arc::new(Published::default());
        p.set(Exposition {
            text: Bytes::from(text.to_string()),
            openmetrics: Bytes::from(om.to_string()),
        });
        p
    }

    fn serve_on(addr: &str, p: Arc<Published>, limits: Limits) -> (MetricsServer, MetricsAddr) {
        let l = MetricsListener::bind(&parse_address(addr).unwrap()).unwrap();
        let a = l.address().clone();
        (MetricsServer::spawn(l, p, limits).unwrap(), a)
    }

    /// One HTTP/1.1 request; the whole response.
    fn get(addr: &MetricsAddr, request: &str) -> String {
        let mut out = String::new();
        match addr {
            MetricsAddr::Tcp(a) => {
                let mut s = TcpStream::connect(a).unwrap();
                s.write_all(request.as_bytes()).unwrap();
                s.read_to_string(&mut out).unwrap();
            }
            MetricsAddr::Unix(p) => {
                let mut s = std::os::unix::net::UnixStream::connect(p).unwrap();
                s.write_all(request.as_bytes()).unwrap();
                s.read_to_string(&mut out).unwrap();
            }
        }
        out
    }

    fn request(method: &str, path: &str, accept: Option<&str>) -> String {
        let accept = accept
            .map(|a| format!("Accept: {a}\r\n"))
            .unwrap_or_default();
        format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{accept}\r\n")
    }

    #[test]
    fn scrapes_get_the_published_exposition_in_the_asked_format() {
        let p = published("text 1\n", "om 1\n# EOF\n");
        let (_server, addr) = serve_on("127.0.0.1:0", p.clone(), Limits::default());
        let r = get(&addr, &request("GET", "/metrics", None));
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(
            r.contains(&format!("content-type: {TEXT_CONTENT_TYPE}")),
            "{r}"
        );
        assert!(r.ends_with("\r\n\r\ntext 1\n"), "{r}");
        let r = get(&addr, &request("GET", "/metrics", Some(PROMETHEUS_ACCEPT)));
        assert!(
            r.contains(&format!("content-type: {OPENMETRICS_CONTENT_TYPE}")),
            "{r}"
        );
        assert!(r.ends_with("om 1\n# EOF\n"), "{r}");
        // A new exposition is what the next scrape gets.
        p.set(Exposition {
            text: Bytes::from_static(b"text 2\n"),
            openmetrics: Bytes::new(),
        });
        assert!(get(&addr, &request("GET", "/metrics", None)).ends_with("text 2\n"));
        let r = get(&addr, &request("HEAD", "/metrics", None));
        assert!(
            r.starts_with("HTTP/1.1 200") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        assert!(get(&addr, &request("GET", "/", None)).contains("/metrics"));
        assert!(get(&addr, &request("GET", "/other", None)).starts_with("HTTP/1.1 404"));
        let r = get(&addr, &request("POST", "/metrics", None));
        assert!(
            r.starts_with("HTTP/1.1 405") && r.contains("allow: GET, HEAD"),
            "{r}"
        );
        // Not HTTP at all: an error response or a closed connection, and the server goes on.
        let _ = get(&addr, "\x16\x03\x01 garbage\r\n\r\n");
        assert!(get(&addr, &request("GET", "/metrics", None)).ends_with("text 2\n"));
    }

    #[test]
    fn an_address_in_use_is_refused_with_the_fix() {
        let (_server, addr) = serve_on("127.0.0.1:0", published("", ""), Limits::default());
        let e = MetricsListener::bind(&addr).err().unwrap();
        assert!(matches!(e, ListenError::InUse(_)), "{e}");
        assert!(
            e.to_string().contains("choose another --metrics address"),
            "{e}"
        );
        let e = ListenError::of(&addr, io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(e.to_string().contains("CAP_NET_BIND_SERVICE"), "{e}");
    }

    #[test]
    fn a_unix_socket_is_private_replaced_when_stale_and_removed_at_stop() {
        let dir = std::env::temp_dir().join(format!("isolator-metrics-{}", std::process::id()));
        let path = dir.join("m.sock");
        let addr = MetricsAddr::Unix(path.clone());
        let shown = addr.to_string();
        {
            let (_server, a) = serve_on(&shown, published("unix\n", ""), Limits::default());
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            assert!(get(&a, &request("GET", "/metrics", None)).ends_with("unix\n"));
            let e = MetricsListener::bind(&addr).err().unwrap();
            assert!(matches!(e, ListenError::InUse(_)), "{e}");
        }
        assert!(!path.exists(), "socket left behind");
        // A stale socket (nobody listening) is replaced; a file that is not one is not.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        drop(MetricsListener::bind(&addr).unwrap());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "x").unwrap();
        let e = MetricsListener::bind(&addr).err().unwrap();
        assert!(matches!(e, ListenError::NotSocket(_)), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Clients that connect and send nothing hold at most every slot until the timeout:
    /// a scrape behind them is served once they are cut, and the server stops at once.
    #[test]
    fn stalled_clients_are_cut_and_scrapes_go_on() {
        let limits = Limits {
            max_connections: 2,
            connection_timeout: Duration::from_millis(300),
        };
        let (server, addr) = serve_on("127.0.0.1:0", published("ok\n", ""), limits);
        let MetricsAddr::Tcp(a) = &addr else {
            unreachable!()
        };
        let mut stalled: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(a).unwrap()).collect();
        // Served after the stalled ones are cut (the response arrives; no threshold on when).
        assert!(get(&addr, &request("GET", "/metrics", None)).ends_with("ok\n"));
        // Each stalled connection was closed by the server: it reads end-of-file.
        for s in &mut stalled {
            let mut buf = Vec::new();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            assert_eq!(s.read_to_end(&mut buf).ok(), Some(0));
        }
        drop(server);
        assert!(TcpStream::connect(a).is_err(), "still listening after stop");
    }
}
