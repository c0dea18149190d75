//! Docker containers by name: a background task that follows the Docker Engine API (bollard,
//! over the unix socket) into the [`ContainerTable`](crate::identify::containers::ContainerTable)
//! the registry asks when it names a container's cgroup.
//!
//! The task sends [`ContainerUpdate`]s: the full set on every (re)connect, then one update
//! per container event. The daemon being absent or going down is an update too; the task
//! reconnects with backoff and the agent keeps naming cgroups by path meanwhile.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use bollard::{
    models::ContainerSummaryStateEnum,
    query_parameters::{EventsOptions, ListContainersOptions},
    Docker,
};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::identify::{
    containers::{self, ContainerInfo, ContainerUpdate},
    naming::Runtime,
};

/// Container events that can change what the table holds. Others (exec, attach, top...)
/// are filtered out by the daemon.
const EVENTS: [&str; 6] = ["create", "start", "rename", "die", "update", "destroy"];
/// Seconds bollard waits for one API request.
const REQUEST_TIMEOUT_S: u64 = 10;

/// Starts following the daemon at `socket`; updates arrive on the returned channel. The
/// task ends when the receiver is dropped.
pub fn spawn_watcher(socket: PathBuf) -> mpsc::UnboundedReceiver<ContainerUpdate> {
    containers::spawn_watcher(move |tx| {
        let socket = socket.clone();
        async move { follow(&socket, &tx).await }
    })
}

/// One connection: list, then follow events until the stream fails. Returns whether it got
/// as far as connecting, and why it ended.
async fn follow(socket: &Path, tx: &mpsc::UnboundedSender<ContainerUpdate>) -> (bool, String) {
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
        .send(ContainerUpdate::Connected {
            runtime: Runtime::Docker,
            version: api_version,
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
        let Some(actor) = ev.actor else {
            continue;
        };
        let Some(id) = actor.id else {
            continue;
        };
        let update = if ev.action.as_deref() == Some("destroy") {
            ContainerUpdate::Removed { id }
        } else {
            match list(&docker, Some(&id)).await {
                Ok(mut c) if !c.is_empty() => {
                    let name = actor.attributes.as_ref().and_then(|a| a.get("name"));
                    ContainerUpdate::Upsert(as_the_event_says(
                        c.remove(0),
                        ev.action.as_deref(),
                        name,
                    ))
                }
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
            let name = own_name(s.names.unwrap_or_default())
                .unwrap_or_else(|| id.chars().take(12).collect());
            Some(ContainerInfo {
                name,
                running: matches!(
                    s.state,
                    Some(ContainerSummaryStateEnum::RUNNING | ContainerSummaryStateEnum::PAUSED)
                ),
                image: s.image.unwrap_or_default(),
                labels: s.labels.unwrap_or_default(),
                runtime: Runtime::Docker,
                pod: None,
                id,
            })
        })
        // A prefix filter can match longer ids; keep the exact one.
        .filter(|c| id.is_none_or(|id| c.id == id))
        .collect())
}

/// The container's own name among the names the daemon lists: `/db`, not a link's alias
/// (`/web/db`, the name by which a linked container knows it).
fn own_name(names: Vec<String>) -> Option<String> {
    names
        .into_iter()
        .map(|n| n.trim_start_matches('/').to_string())
        .find(|n| !n.is_empty() && !n.contains('/'))
}

/// What an event says wins over the listing made right after it: the daemon can log an
/// event before its listing shows the change, and no later event would correct what was
/// taken from that listing. Seen with Debian's dockerd 20.10, listed as soon as the event
/// came: after `rename`, the old name next to the new one (`["/ca", "/cb"]`, 14 of 150
/// renames); after `die`, the container still `running` (40 of 40 kills).
fn as_the_event_says(
    mut c: ContainerInfo,
    action: Option<&str>,
    name: Option<&String>,
) -> ContainerInfo {
    if let Some(name) = name.filter(|n| !n.is_empty()) {
        c.name = name.trim_start_matches('/').to_string();
    }
    match action {
        Some("die") => c.running = false,
        Some("start") => c.running = true,
        _ => {}
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_links_alias_is_not_the_containers_name() {
        assert_eq!(own_name(names(&["/web/db", "/db"])).as_deref(), Some("db"));
        assert_eq!(own_name(names(&["/db"])).as_deref(), Some("db"));
        assert_eq!(own_name(names(&[])), None);
    }

    #[test]
    fn the_events_name_wins_over_a_listing_that_still_has_the_old_one() {
        let listed = ContainerInfo::docker_for_test(
            &"a".repeat(64),
            &own_name(names(&["/ca", "/cb"])).unwrap(),
        );
        assert_eq!(listed.name, "ca");
        let c = as_the_event_says(listed.clone(), Some("rename"), Some(&"cb".to_string()));
        assert_eq!(c.name, "cb");
        assert!(c.running);
        assert_eq!(as_the_event_says(listed, Some("update"), None).name, "ca");
    }

    #[test]
    fn a_container_that_died_is_not_running_whatever_the_listing_says() {
        let listed = ContainerInfo::docker_for_test(&"b".repeat(64), "db");
        let died = as_the_event_says(listed, Some("die"), Some(&"db".to_string()));
        assert!(!died.running);
        assert!(as_the_event_says(died, Some("start"), None).running);
    }
}
