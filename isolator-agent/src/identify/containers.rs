//! The containers the runtimes' APIs report (Docker's [`docker`](super::docker) watcher,
//! containerd's [`containerd`](super::containerd) watcher), by id: what the registry names
//! container and pod cgroups by, and what the config's container and pod matchers and
//! the label SLOs read.
//!
//! Each watcher sends [`ContainerUpdate`]s: the full set of its runtime on every
//! (re)connect, then one update per container event. A runtime's reconnect replaces its own
//! entries only.

use std::{
    collections::{BTreeSet, HashMap},
    future::Future,
    time::Duration,
};

use tokio::sync::mpsc;

use crate::identify::naming::Runtime;

const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait between two attempts to reach a runtime.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Runs a runtime's watcher: `follow` is one connection (list, then follow events until
/// the stream fails; it returns whether it got as far as connecting, and why it ended),
/// tried again with backoff after a `Down` update. The task ends when the receiver is
/// dropped.
pub fn spawn_watcher<F, Fut>(follow: F) -> mpsc::UnboundedReceiver<ContainerUpdate>
where
    F: Fn(mpsc::UnboundedSender<ContainerUpdate>) -> Fut + Send + 'static,
    Fut: Future<Output = (bool, String)> + Send,
{
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut backoff = BACKOFF_MIN;
        loop {
            let (connected, err) = follow(tx.clone()).await;
            if tx.is_closed() {
                return;
            }
            if connected {
                backoff = BACKOFF_MIN;
            }
            let down = ContainerUpdate::Down {
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

/// The pod a container belongs to, from the labels the kubelet puts on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMember {
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Pod UID with dashes, as the API server spells it.
    pub uid: String,
    /// The container's name in the pod spec; None for the pod's sandbox (the container
    /// whose labels are the pod's own).
    pub container: Option<String>,
}

/// What the agent knows of a container from its runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Full id (64 hex for Docker and the kubelet's containers).
    pub id: String,
    /// Docker: its name without the leading '/'. containerd: `namespace/pod/container`
    /// for a pod's container, `namespace/pod` for its sandbox, the id otherwise.
    pub name: String,
    /// Image as the container was created from (`repo:tag` or an image id).
    pub image: String,
    /// The container's labels; a sandbox's are the pod's labels.
    pub labels: HashMap<String, String>,
    /// Running (or paused): the runtime's word, which comes before its cgroup is removed.
    pub running: bool,
    pub runtime: Runtime,
    /// The pod it belongs to (containerd's containers with the kubelet's labels).
    pub pod: Option<PodMember>,
}

impl ContainerInfo {
    /// The pod's sandbox: its labels are the pod's own.
    pub fn is_sandbox(&self) -> bool {
        self.pod.as_ref().is_some_and(|p| p.container.is_none())
    }

    /// A running Docker container without labels, for tests.
    #[cfg(test)]
    pub fn docker_for_test(id: &str, name: &str) -> ContainerInfo {
        ContainerInfo {
            id: id.into(),
            name: name.into(),
            image: "img".into(),
            labels: HashMap::new(),
            running: true,
            runtime: Runtime::Docker,
            pod: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ContainerUpdate {
    /// (Re)connected: every container of `runtime` that exists now, running or not.
    Connected {
        runtime: Runtime,
        /// The daemon's API version (Docker) or its version (containerd).
        version: String,
        containers: Vec<ContainerInfo>,
    },
    /// Created, started, renamed or otherwise changed.
    Upsert(ContainerInfo),
    /// Destroyed.
    Removed { id: String },
    /// The daemon cannot be reached; the next attempt is in `retry_in`.
    Down { error: String, retry_in: Duration },
}

/// What changed in the table by one update.
#[derive(Debug, Default, PartialEq)]
pub struct TableChange {
    /// Containers whose name, image, labels, state or pod are new or different.
    pub changed: Vec<String>,
    /// Containers no longer in the table.
    pub removed: Vec<String>,
    /// UIDs of the pods whose sandbox came, changed or left.
    pub pods: Vec<String>,
}

impl TableChange {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.removed.is_empty()
    }
}

/// The containers that exist, by full id, and each pod's sandboxes by pod UID. Bounded by
/// what exists: destroyed containers leave, and a reconnect replaces its runtime's entries.
#[derive(Debug, Default)]
pub struct ContainerTable {
    by_id: HashMap<String, ContainerInfo>,
    /// Pod UID -> its sandboxes' ids (a pod whose sandbox is re-created has two for a
    /// while).
    sandboxes: HashMap<String, BTreeSet<String>>,
}

impl ContainerTable {
    pub fn get(&self, id: &str) -> Option<&ContainerInfo> {
        self.by_id.get(id)
    }

    /// The sandbox of the pod with `uid`: the running one if there is one.
    pub fn sandbox(&self, uid: &str) -> Option<&ContainerInfo> {
        let ids = self.sandboxes.get(uid)?;
        let mut all = ids.iter().filter_map(|id| self.by_id.get(id));
        let first = all.next()?;
        if first.running {
            return Some(first);
        }
        all.find(|c| c.running).or(Some(first))
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Containers of `runtime`.
    pub fn count(&self, runtime: Runtime) -> usize {
        self.by_id.values().filter(|c| c.runtime == runtime).count()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ContainerInfo> {
        self.by_id.values()
    }

    fn insert(&mut self, c: ContainerInfo, change: &mut TableChange) {
        if self.by_id.get(&c.id) == Some(&c) {
            return;
        }
        self.remove(&c.id, &mut TableChange::default(), change);
        change.changed.push(c.id.clone());
        if c.is_sandbox() {
            let uid = c.pod.as_ref().map(|p| p.uid.clone()).unwrap_or_default();
            self.sandboxes
                .entry(uid.clone())
                .or_default()
                .insert(c.id.clone());
            change.pods.push(uid);
        }
        self.by_id.insert(c.id.clone(), c);
    }

    /// Removes `id`, saying so in `removed_to`; a sandbox's pod goes in `pods_to`.
    fn remove(&mut self, id: &str, removed_to: &mut TableChange, pods_to: &mut TableChange) {
        let Some(old) = self.by_id.remove(id) else {
            return;
        };
        removed_to.removed.push(id.to_string());
        if let Some(p) = old.pod.filter(|p| p.container.is_none()) {
            if let Some(ids) = self.sandboxes.get_mut(&p.uid) {
                ids.remove(id);
                if ids.is_empty() {
                    self.sandboxes.remove(&p.uid);
                }
            }
            pods_to.pods.push(p.uid);
        }
    }

    /// Applies one update. `Down` keeps the table: names stay right until the daemon is
    /// back and says otherwise.
    pub fn apply(&mut self, update: &ContainerUpdate) -> TableChange {
        let mut change = TableChange::default();
        match update {
            ContainerUpdate::Connected {
                runtime,
                containers,
                ..
            } => {
                let new: HashMap<&str, &ContainerInfo> =
                    containers.iter().map(|c| (c.id.as_str(), c)).collect();
                let vanished: Vec<String> = self
                    .by_id
                    .values()
                    .filter(|c| c.runtime == *runtime && !new.contains_key(c.id.as_str()))
                    .map(|c| c.id.clone())
                    .collect();
                for id in vanished {
                    let mut pods = TableChange::default();
                    self.remove(&id, &mut change, &mut pods);
                    change.pods.extend(pods.pods);
                }
                for c in containers {
                    self.insert(c.clone(), &mut change);
                }
            }
            ContainerUpdate::Upsert(c) => self.insert(c.clone(), &mut change),
            ContainerUpdate::Removed { id } => {
                let mut pods = TableChange::default();
                self.remove(id, &mut change, &mut pods);
                change.pods.extend(pods.pods);
            }
            ContainerUpdate::Down { .. } => {}
        }
        change.changed.sort();
        change.removed.sort();
        change.pods.sort();
        change.pods.dedup();
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, name: &str) -> ContainerInfo {
        ContainerInfo::docker_for_test(id, name)
    }

    fn connected(runtime: Runtime, containers: Vec<ContainerInfo>) -> ContainerUpdate {
        ContainerUpdate::Connected {
            runtime,
            version: "1".into(),
            containers,
        }
    }

    #[test]
    fn table_follows_updates_and_reports_changes() {
        let mut t = ContainerTable::default();
        let ch = t.apply(&connected(
            Runtime::Docker,
            vec![c("a", "db"), c("b", "web")],
        ));
        assert_eq!(ch.changed, vec!["a", "b"]);
        assert_eq!(t.get("a").unwrap().name, "db");

        // Same info again: no change.
        assert!(t.apply(&ContainerUpdate::Upsert(c("a", "db"))).is_empty());
        let ch = t.apply(&ContainerUpdate::Upsert(c("a", "db-renamed")));
        assert_eq!(ch.changed, vec!["a"]);
        assert!(ch.removed.is_empty(), "a change is not a removal");
        assert_eq!(t.get("a").unwrap().name, "db-renamed");

        let ch = t.apply(&ContainerUpdate::Removed { id: "b".into() });
        assert_eq!(ch.removed, vec!["b"]);
        assert!(t.get("b").is_none());

        // Down keeps what is known.
        let ch = t.apply(&ContainerUpdate::Down {
            error: "x".into(),
            retry_in: Duration::from_secs(1),
        });
        assert!(ch.is_empty());
        assert_eq!(t.len(), 1);

        // A reconnect replaces the table: what vanished meanwhile is removed.
        let ch = t.apply(&connected(Runtime::Docker, vec![c("c", "new")]));
        assert_eq!(ch.removed, vec!["a"]);
        assert_eq!(ch.changed, vec!["c"]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_runtimes_reconnect_replaces_its_own_containers_only() {
        let mut t = ContainerTable::default();
        t.apply(&connected(Runtime::Docker, vec![c("d1", "db")]));
        let k = ContainerInfo {
            runtime: Runtime::Containerd,
            ..c("k1", "ns/pod/app")
        };
        t.apply(&connected(Runtime::Containerd, vec![k.clone()]));
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t.count(Runtime::Docker), t.count(Runtime::Containerd)),
            (1, 1)
        );
        let ch = t.apply(&connected(Runtime::Containerd, vec![]));
        assert_eq!(ch.removed, vec!["k1"]);
        assert!(t.get("d1").is_some(), "Docker's containers stay");
        t.apply(&connected(Runtime::Containerd, vec![k]));
        let ch = t.apply(&connected(Runtime::Docker, vec![]));
        assert_eq!(ch.removed, vec!["d1"]);
        assert!(t.get("k1").is_some(), "containerd's containers stay");
    }

    #[test]
    fn sandboxes_by_pod_uid() {
        let pod = |container: Option<&str>| PodMember {
            namespace: "shop".into(),
            name: "web".into(),
            uid: "u1".into(),
            container: container.map(str::to_string),
        };
        let sandbox = |id: &str, running: bool| ContainerInfo {
            runtime: Runtime::Containerd,
            pod: Some(pod(None)),
            running,
            ..c(id, "shop/web")
        };
        let app = ContainerInfo {
            runtime: Runtime::Containerd,
            pod: Some(pod(Some("app"))),
            ..c("app1", "shop/web/app")
        };
        let mut t = ContainerTable::default();
        let ch = t.apply(&connected(
            Runtime::Containerd,
            vec![sandbox("s1", false), app.clone()],
        ));
        assert_eq!(ch.pods, vec!["u1"]);
        assert_eq!(t.sandbox("u1").unwrap().id, "s1");
        // The pod's sandbox is re-created: the running one is the pod's.
        let ch = t.apply(&ContainerUpdate::Upsert(sandbox("s2", true)));
        assert_eq!(ch.pods, vec!["u1"]);
        assert_eq!(t.sandbox("u1").unwrap().id, "s2");
        // A container's change is not the pod's.
        let ch = t.apply(&ContainerUpdate::Upsert(ContainerInfo {
            running: false,
            ..app
        }));
        assert!(ch.pods.is_empty());
        t.apply(&ContainerUpdate::Removed { id: "s2".into() });
        assert_eq!(t.sandbox("u1").unwrap().id, "s1");
        let ch = t.apply(&ContainerUpdate::Removed { id: "s1".into() });
        assert_eq!(ch.pods, vec!["u1"]);
        assert!(t.sandbox("u1").is_none());
        assert!(t.sandboxes.is_empty(), "no empty index entries left");
    }

    #[test]
    fn table_stays_bounded_under_churn() {
        let mut t = ContainerTable::default();
        for i in 0..10_000 {
            let id = format!("{i:064x}");
            let s = ContainerInfo {
                pod: Some(PodMember {
                    namespace: "n".into(),
                    name: "p".into(),
                    uid: format!("uid-{i}"),
                    container: None,
                }),
                ..c(&id, "short-lived")
            };
            t.apply(&ContainerUpdate::Upsert(s));
            t.apply(&ContainerUpdate::Removed { id });
        }
        assert!(t.is_empty());
        assert!(t.sandboxes.is_empty());
    }
}
