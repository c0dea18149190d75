//! Docker containers by name: a background task that follows the Docker Engine API (bollard,
//! over the unix socket) and a table of the containers that exist, which the registry asks
//! when it names a container's cgroup.
//!
//! The task sends [`DockerUpdate`]s: the full set on every (re)connect, then one update per
//! container event. The daemon being absent or going down is an update too; the task
//! reconnects with backoff and the agent keeps naming cgroups by path meanwhile.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use bollard::{
    models::ContainerSummaryStateEnum,
    query_parameters::{EventsOptions, ListContainersOptions},
    Docker,
};
use futures_util::StreamExt;
use tokio::sync::mpsc;

/// What the agent knows of a container from Docker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Full 64-hex id.
    pub id: String,
    /// Name without Docker's leading '/'.
    pub name: String,
    /// Image as the container was created from (`repo:tag` or an image id).
    pub image: String,
    pub labels: HashMap<String, String>,
    /// Running (or paused): Docker's word, which comes before its cgroup is removed.
    pub running: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DockerUpdate {
    /// (Re)connected: every container that exists now, running or not.
    Connected {
        api_version: String,
        containers: Vec<ContainerInfo>,
    },
    /// Created, started, renamed or otherwise changed.
    Upsert(ContainerInfo),
    /// Destroyed.
    Removed { id: String },
    /// The daemon cannot be reached; the next attempt is in `retry_in`.
    Down { error: String, retry_in: Duration },
}

/// Container events that can change what the table holds. Others (exec, attach, top...)
/// are filtered out by the daemon.
const EVENTS: [&str; 6] = ["create", "start", "rename", "die", "update", "destroy"];
const BACKOFF_MIN: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Seconds bollard waits for one API request.
const REQUEST_TIMEOUT_S: u64 = 10;

/// Starts following the daemon at `socket`; updates arrive on the returned channel. The
/// task ends when the receiver is dropped.
pub fn spawn_watcher(socket: PathBuf) -> mpsc::UnboundedReceiver<DockerUpdate> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut backoff = BACKOFF_MIN;
        loop {
            let (connected, err) = follow(&socket, &tx).await;
            if tx.is_closed() {
                return;
            }
            if connected {
                backoff = BACKOFF_MIN;
            }
            let down = DockerUpdate::Down {
                error: err,
                retry_in: backoff,
            };
            if tx.send(down).is_err() {
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    });
    rx
}

/// One connection: list, then follow events until the stream fails. Returns whether it got
/// as far as connecting, and why it ended.
async fn follow(socket: &Path, tx: &mpsc::UnboundedSender<DockerUpdate>) -> (bool, String) {
    if !socket.exists() {
        return (
            false,
            format!(
                "{} does not exist (Docker not installed or not running)",
                socket.display()
            ),
        );
    }
    let docker = match Docker::connect_with_unix(
        &socket.to_string_lossy(),
        REQUEST_TIMEOUT_S,
        bollard::API_DEFAULT_VERSION,
    ) {
        Ok(d) => d,
        Err(e) => return (false, format!("connecting to {}: {e}", socket.display())),
    };
    // Older daemons (Debian's 20.10 speaks API 1.41) refuse a newer client version.
    let docker = match docker.negotiate_version().await {
        Ok(d) => d,
        Err(e) => return (false, format!("{}: {e}", socket.display())),
    };
    let api_version = docker.client_version().to_string();
    // Subscribe before listing, so no change falls between the two.
    let filters = HashMap::from([
        ("type".to_string(), vec!["container".to_string()]),
        (
            "event".to_string(),
            EVENTS.iter().map(|e| e.to_string()).collect(),
        ),
    ]);
    let mut events = docker.events(Some(EventsOptions {
        filters: Some(filters),
        ..Default::default()
    }));
    let containers = match list(&docker, None).await {
        Ok(c) => c,
        Err(e) => return (false, format!("listing containers: {e}")),
    };
    if tx
        .send(DockerUpdate::Connected {
            api_version,
            containers,
        })
        .is_err()
    {
        return (true, "agent stopped".into());
    }
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => return (true, format!("event stream: {e}")),
        };
        let Some(id) = ev.actor.and_then(|a| a.id) else {
            continue;
        };
        let update = if ev.action.as_deref() == Some("destroy") {
            DockerUpdate::Removed { id }
        } else {
            match list(&docker, Some(&id)).await {
                Ok(mut c) if !c.is_empty() => DockerUpdate::Upsert(c.remove(0)),
                // Gone again before we asked: a destroy event follows.
                Ok(_) => continue,
                Err(e) => return (true, format!("inspecting container {id}: {e}")),
            }
        };
        if tx.send(update).is_err() {
            return (true, "agent stopped".into());
        }
    }
    (true, "event stream ended (daemon stopped)".into())
}

/// All containers, or the one with `id`.
async fn list(
    docker: &Docker,
    id: Option<&str>,
) -> Result<Vec<ContainerInfo>, bollard::errors::Error> {
    let filters = id.map(|id| HashMap::from([("id".to_string(), vec![id.to_string()])]));
    let summaries = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters,
            ..Default::default()
        }))
        .await?;
    Ok(summaries
        .into_iter()
        .filter_map(|s| {
            let id = s.id?;
            let name = s
                .names
                .and_then(|n| n.into_iter().next())
                .map(|n| n.trim_start_matches('/').to_string())
                .unwrap_or_else(|| id.chars().take(12).collect());
            Some(ContainerInfo {
                name,
                running: matches!(
                    s.state,
                    Some(ContainerSummaryStateEnum::RUNNING | ContainerSummaryStateEnum::PAUSED)
                ),
                image: s.image.unwrap_or_default(),
                labels: s.labels.unwrap_or_default(),
                id,
            })
        })
        // A prefix filter can match longer ids; keep the exact one.
        .filter(|c| id.is_none_or(|id| c.id == id))
        .collect())
}

/// What changed in the table by one update.
#[derive(Debug, Default, PartialEq)]
pub struct TableChange {
    /// Containers whose name, image or labels are new or different.
    pub changed: Vec<String>,
    /// Containers no longer in the table.
    pub removed: Vec<String>,
}

impl TableChange {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.removed.is_empty()
    }
}

/// The containers that exist, by full id. Bounded by what exists: destroyed containers
/// leave, and a reconnect replaces the whole table.
#[derive(Debug, Default)]
pub struct ContainerTable {
    by_id: HashMap<String, ContainerInfo>,
}

impl ContainerTable {
    pub fn get(&self, id: &str) -> Option<&ContainerInfo> {
        self.by_id.get(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ContainerInfo> {
        self.by_id.values()
    }

    /// Applies one update. `Down` keeps the table: names stay right until the daemon is
    /// back and says otherwise.
    pub fn apply(&mut self, update: &DockerUpdate) -> TableChange {
        let mut change = TableChange::default();
        match update {
            DockerUpdate::Connected { containers, .. } => {
                let new: HashMap<String, ContainerInfo> = containers
                    .iter()
                    .map(|c| (c.id.clone(), c.clone()))
                    .collect();
                change.removed = self
                    .by_id
                    .keys()
                    .filter(|id| !new.contains_key(*id))
                    .cloned()
                    .collect();
                change.changed = new
                    .values()
                    .filter(|c| self.by_id.get(&c.id) != Some(c))
                    .map(|c| c.id.clone())
                    .collect();
                self.by_id = new;
            }
            DockerUpdate::Upsert(c) => {
                if self.by_id.get(&c.id) != Some(c) {
                    change.changed.push(c.id.clone());
                    self.by_id.insert(c.id.clone(), c.clone());
                }
            }
            DockerUpdate::Removed { id } => {
                if self.by_id.remove(id).is_some() {
                    change.removed.push(id.clone());
                }
            }
            DockerUpdate::Down { .. } => {}
        }
        change.changed.sort();
        change.removed.sort();
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, name: &str) -> ContainerInfo {
        ContainerInfo {
            id: id.into(),
            name: name.into(),
            image: "img".into(),
            labels: HashMap::new(),
            running: true,
        }
    }

    #[test]
    fn table_follows_updates_and_reports_changes() {
        let mut t = ContainerTable::default();
        let ch = t.apply(&DockerUpdate::Connected {
            api_version: "1.41".into(),
            containers: vec![c("a", "db"), c("b", "web")],
        });
        assert_eq!(ch.changed, vec!["a", "b"]);
        assert_eq!(t.get("a").unwrap().name, "db");

        // Same info again: no change.
        assert!(t.apply(&DockerUpdate::Upsert(c("a", "db"))).is_empty());
        let ch = t.apply(&DockerUpdate::Upsert(c("a", "db-renamed")));
        assert_eq!(ch.changed, vec!["a"]);
        assert_eq!(t.get("a").unwrap().name, "db-renamed");

        let ch = t.apply(&DockerUpdate::Removed { id: "b".into() });
        assert_eq!(ch.removed, vec!["b"]);
        assert!(t.get("b").is_none());

        // Down keeps what is known.
        let ch = t.apply(&DockerUpdate::Down {
            error: "x".into(),
            retry_in: BACKOFF_MIN,
        });
        assert!(ch.is_empty());
        assert_eq!(t.len(), 1);

        // A reconnect replaces the table: what vanished meanwhile is removed.
        let ch = t.apply(&DockerUpdate::Connected {
            api_version: "1.41".into(),
            containers: vec![c("c", "new")],
        });
        assert_eq!(ch.removed, vec!["a"]);
        assert_eq!(ch.changed, vec!["c"]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn table_stays_bounded_under_churn() {
        let mut t = ContainerTable::default();
        for i in 0..10_000 {
            let id = format!("{i:064x}");
            t.apply(&DockerUpdate::Upsert(c(&id, "short-lived")));
            t.apply(&DockerUpdate::Removed { id });
        }
        assert!(t.is_empty());
    }
}
