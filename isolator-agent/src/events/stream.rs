//! The event stream served on a unix socket (`--socket`) for `isolator top` and other local
//! readers. The socket is mode 0600: events name every cgroup on the host, so root only. A
//! reader that connects first gets a replay (agent_start, the last complete cycle, recent
//! actions), so its view is full at once, then every event as it is emitted.

use std::{
    collections::VecDeque,
    io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use tokio::{io::AsyncWriteExt, net::UnixListener, sync::broadcast, task::JoinHandle};

pub const DEFAULT_SOCKET: &str = "/run/isolator/isolator.sock";

/// Actions (decisions, violations, restores, warnings...) a new reader is replayed.
const REPLAY_ACTIONS: usize = 200;
/// Lines a slow reader may fall behind before it skips ahead.
const READER_BACKLOG: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("another agent already serves {0}; stop it, or give this one another --socket (or --socket off)")]
    InUse(String),
    #[error("{0} exists and is not a socket; remove it or choose another --socket")]
    NotSocket(String),
    #[error(
        "cannot serve the event stream on {0}: {1}; choose another --socket (or --socket off)"
    )]
    Io(String, io::Error),
}

/// What an event is to a new reader's replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayRole {
    /// agent_start: replayed first; a new one starts the action history anew.
    Start,
    /// cgroup_stats, service_stats: part of the cycle being written.
    CycleRecord,
    /// cycle_end: closes the cycle, which becomes the one replayed.
    CycleEnd,
    /// Anything else (decisions, violations, restores, warnings...): the recent ones.
    Action,
}

#[derive(Default)]
struct Replay {
    start: Option<Arc<str>>,
    /// Lines of the cycle being emitted, and of the last complete one.
    cycle: Vec<Arc<str>>,
    last_cycle: Vec<Arc<str>>,
    actions: VecDeque<Arc<str>>,
}

impl Replay {
    fn record(&mut self, role: ReplayRole, line: &Arc<str>) {
        match role {
            ReplayRole::Start => {
                self.start = Some(line.clone());
                self.actions.clear();
            }
            ReplayRole::CycleRecord => self.cycle.push(line.clone()),
            ReplayRole::CycleEnd => {
                self.cycle.push(line.clone());
                self.last_cycle = std::mem::take(&mut self.cycle);
            }
            ReplayRole::Action => {
                if self.actions.len() == REPLAY_ACTIONS {
                    self.actions.pop_front();
                }
                self.actions.push_back(line.clone());
            }
        }
    }

    fn lines(&self) -> Vec<Arc<str>> {
        self.start
            .iter()
            .chain(&self.last_cycle)
            .chain(&self.actions)
            .cloned()
            .collect()
    }
}

/// What the accepting task and the publisher share.
struct Shared {
    replay: Replay,
    /// None once the server shuts down: readers then drain and end.
    tx: Option<broadcast::Sender<Arc<str>>>,
    readers: Vec<JoinHandle<()>>,
}

pub struct StreamServer {
    path: PathBuf,
    shared: Arc<Mutex<Shared>>,
    accept: JoinHandle<()>,
}

/// How long a stopping agent waits for its readers to take the last events.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

impl StreamServer {
    /// Binds `path` (mode 0600) and starts accepting readers. Must run inside a tokio
    /// runtime. A socket left by an agent that was killed is replaced; a live one is not.
    pub fn bind(path: &Path) -> Result<StreamServer, StreamError> {
        let shown = path.display().to_string();
        match std::fs::symlink_metadata(path) {
            Ok(m) if !m.file_type().is_socket() => return Err(StreamError::NotSocket(shown)),
            Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err(StreamError::InUse(shown)),
                Err(_) => {
                    std::fs::remove_file(path).map_err(|e| StreamError::Io(shown.clone(), e))?
                }
            },
            Err(_) => {}
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Private like the journal it usually shares (/run/isolator).
            crate::events::private_file::create_dir(dir)
                .map_err(|e| StreamError::Io(shown.clone(), io::Error::other(e.to_string())))?;
        }
        // Created 0600 (umask) so no other user can connect before the chmod.
        // SAFETY: umask only swaps the process's file mode mask.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        unsafe { libc::umask(old) };
        let listener = bound.map_err(|e| StreamError::Io(shown.clone(), e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| StreamError::Io(shown.clone(), e))?;
        let shared = Arc::new(Mutex::new(Shared {
            replay: Replay::default(),
            tx: Some(broadcast::channel(READER_BACKLOG).0),
            readers: vec![],
        }));
        let accept = tokio::spawn(accept_readers(listener, shared.clone()));
        Ok(StreamServer {
            path: path.to_path_buf(),
            shared,
            accept,
        })
    }

    /// One serialized event (without its newline) to every reader.
    pub fn publish(&self, role: ReplayRole, line: Arc<str>) {
        // Recorded and sent under one lock, so a reader joining now gets it exactly once.
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        shared.replay.record(role, &line);
        if let Some(tx) = &shared.tx {
            let _ = tx.send(line);
        }
    }

    /// Stops accepting, lets every reader take what was published (the restores and
    /// agent_stop of a stopping agent), bounded by a timeout, and removes the socket.
    pub async fn shutdown(self) {
        self.accept.abort();
        let readers = {
            let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            shared.tx = None;
            std::mem::take(&mut shared.readers)
        };
        let drained = async {
            for r in readers {
                let _ = r.await;
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, drained).await;
    }
}

impl Drop for StreamServer {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// After a failed accept (EMFILE, ENFILE, ENOMEM: out of descriptors or memory), wait
/// before the next one: the error stays until something is freed, and retrying at once
/// would spin.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(200);

async fn accept_readers(listener: UnixListener, shared: Arc<Mutex<Shared>>) {
    accept_with_backoff(|| listener.accept(), |stream| add_reader(stream, &shared)).await
}

/// Accepts until `add` says stop; failures are logged once per run of them.
async fn accept_with_backoff<S, F, Fut>(mut accept: F, mut add: impl FnMut(S) -> bool)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<(S, tokio::net::unix::SocketAddr)>>,
{
    let mut failing = false;
    loop {
        match accept().await {
            Ok((stream, _)) => {
                failing = false;
                if !add(stream) {
                    return;
                }
            }
            Err(e) => {
                if !failing {
                    failing = true;
                    tracing::warn!(error = %e, "event socket: cannot accept readers; retrying every {}ms", ACCEPT_BACKOFF.as_millis());
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Starts serving one reader; false once the server is shutting down.
fn add_reader(stream: tokio::net::UnixStream, shared: &Mutex<Shared>) -> bool {
    {
        let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
        let Some(rx) = s.tx.as_ref().map(|t| t.subscribe()) else {
            return false;
        };
        let lines = s.replay.lines();
        s.readers.retain(|r| !r.is_finished());
        s.readers
            .push(tokio::spawn(serve_reader(stream, lines, rx)));
    }
    true
}

async fn serve_reader(
    mut stream: tokio::net::UnixStream,
    replay: Vec<Arc<str>>,
    mut rx: broadcast::Receiver<Arc<str>>,
) {
    for line in replay {
        if write_line(&mut stream, &line).await.is_err() {
            return;
        }
    }
    loop {
        match rx.recv().await {
            Ok(line) => {
                if write_line(&mut stream, &line).await.is_err() {
                    return;
                }
            }
            // A reader that fell behind skips ahead; the agent never waits for it.
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

async fn write_line(stream: &mut tokio::net::UnixStream, line: &str) -> io::Result<()> {
    stream.write_all(line.as_bytes()).await?;
    stream.write_all(b"\n").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_is_start_last_cycle_and_recent_actions() {
        let mut r = Replay::default();
        let l = |s: &str| -> Arc<str> { Arc::from(s) };
        r.record(ReplayRole::Start, &l("start"));
        r.record(ReplayRole::CycleRecord, &l("c1"));
        r.record(ReplayRole::CycleEnd, &l("end1"));
        r.record(ReplayRole::Action, &l("d1"));
        r.record(ReplayRole::CycleRecord, &l("c2"));
        // Cycle 2 is not complete yet: the replay has cycle 1.
        let got: Vec<String> = r.lines().iter().map(|s| s.to_string()).collect();
        assert_eq!(got, ["start", "c1", "end1", "d1"]);
        for i in 0..REPLAY_ACTIONS + 5 {
            r.record(ReplayRole::Action, &l(&format!("w{i}")));
        }
        assert_eq!(r.lines().len(), 3 + REPLAY_ACTIONS);
    }

    #[tokio::test]
    async fn readers_get_the_replay_then_live_events_and_the_socket_is_private() {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let dir = std::env::temp_dir().join(format!("isolator-stream-{}", std::process::id()));
        let path = dir.join("s.sock");
        let server = StreamServer::bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(
            StreamServer::bind(&path),
            Err(StreamError::InUse(_))
        ));
        server.publish(ReplayRole::Start, Arc::from("{\"type\":\"agent_start\"}"));
        let stream = tokio::net::UnixStream::connect(&path).await.unwrap();
        let mut lines = BufReader::new(stream).lines();
        assert_eq!(
            lines.next_line().await.unwrap().unwrap(),
            "{\"type\":\"agent_start\"}"
        );
        // The reader subscribed before its replay was written: nothing falls between.
        server.publish(ReplayRole::Action, Arc::from("live"));
        assert_eq!(lines.next_line().await.unwrap().unwrap(), "live");
        // A stopping agent's last events reach the reader before the stream ends.
        server.publish(ReplayRole::Action, Arc::from("stop"));
        server.shutdown().await;
        assert_eq!(lines.next_line().await.unwrap().unwrap(), "stop");
        assert_eq!(lines.next_line().await.unwrap(), None);
        assert!(!path.exists(), "the socket is removed when the agent stops");
        let _ = std::fs::remove_dir(&dir);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_accept_backs_off_instead_of_spinning() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let tries = Arc::new(AtomicU32::new(0));
        let t = tries.clone();
        let accept = move || {
            let t = t.clone();
            async move {
                t.fetch_add(1, Ordering::Relaxed);
                Err::<((), tokio::net::unix::SocketAddr), _>(io::Error::from_raw_os_error(
                    libc::EMFILE,
                ))
            }
        };
        let run = accept_with_backoff(accept, |_| true);
        // Ten seconds of (virtual) time out of descriptors.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), run).await;
        let n = tries.load(Ordering::Relaxed);
        assert!((40..=60).contains(&n), "{n} accepts in 10 s");
    }
}
