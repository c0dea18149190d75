//! Kubernetes pods by name: a background task that follows containerd's gRPC API
//! (containerd-client, over its unix socket) in the kubelet's namespace `k8s.io`, and
//! reports its containers, each with the pod the kubelet's labels say it belongs to, into
//! the same [`ContainerTable`](crate::identify::containers::ContainerTable) as Docker's.
//!
//! The task lists containers and tasks on every (re)connect, then re-reads a container on
//! each of its container or task events. A daemon that is absent, stops, or stops
//! answering (a version request every [`HEALTH_INTERVAL`] while events are quiet) is a
//! `Down` update; the task reconnects with backoff and cgroups are named by path
//! meanwhile. Every request has a timeout: nothing here waits on containerd unbounded, and
//! the agent's cycle never waits on this task at all.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    path::{Path, PathBuf},
    time::Duration,
};

use containerd_client::{
    events as ev,
    services::v1::{
        Container, GetContainerRequest, GetRequest, ListContainersRequest, ListTasksRequest,
        SubscribeRequest,
    },
    tonic::{self, metadata::MetadataValue, Code},
    types::v1::Status,
    Client,
};
use prost::Message;
use tokio::sync::mpsc;

use crate::identify::{
    containers::{self, ContainerInfo, ContainerUpdate, PodMember},
    naming::Runtime,
};

/// Where containerd serves its API.
pub const DEFAULT_SOCKET: &str = "/run/containerd/containerd.sock";
/// The namespace the kubelet's containers are in (containerd's CRI plugin).
pub const NAMESPACE: &str = "k8s.io";
/// The kubelet's labels on every container of a pod.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// containerd's CRI plugin says which container is a pod's sandbox (`sandbox`) and which
/// are its containers (`container`).
pub const KIND: &str = "io.cri-containerd.kind";

/// The longest one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A quiet event stream is checked this often: a daemon that stops answering is said.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(30);

/// Starts following the daemon at `socket`; updates arrive on the returned channel. The
/// task ends when the receiver is dropped.
pub fn spawn_watcher(socket: PathBuf) -> mpsc::UnboundedReceiver<ContainerUpdate> {
    containers::spawn_watcher(move |tx| {
        let socket = socket.clone();
        async move { follow(&socket, &tx).await }
    })
}

/// The pod a container belongs to, from the kubelet's labels: a sandbox when containerd's
/// CRI plugin says so, else a container with its name in the pod spec. None when a label
/// is missing (a container that is not the kubelet's).
pub fn pod_member(labels: &HashMap<String, String>) -> Option<PodMember> {
    let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
    let container = match labels.get(KIND).map(String::as_str) {
        Some("sandbox") => None,
        _ => Some(get(CONTAINER_NAME)?),
    };
    Some(PodMember {
        namespace: get(POD_NAMESPACE)?,
        name: get(POD_NAME)?,
        uid: get(POD_UID)?,
        container,
    })
}

/// What the table keeps of a containerd container: named `namespace/pod/container` (a
/// sandbox `namespace/pod`) when it is the kubelet's, by its id otherwise.
pub fn container_info(c: Container, running: bool) -> ContainerInfo {
    let pod = pod_member(&c.labels);
    let name = match &pod {
        Some(PodMember {
            namespace,
            name,
            container: Some(container),
            ..
        }) => format!("{namespace}/{name}/{container}"),
        Some(p) => format!("{}/{}", p.namespace, p.name),
        None => c.id.clone(),
    };
    ContainerInfo {
        name,
        image: c.image,
        labels: c.labels,
        running,
        runtime: Runtime::Containerd,
        pod,
        id: c.id,
    }
}

/// A request in the kubelet's namespace.
fn in_namespace<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert(
        "containerd-namespace",
        MetadataValue::from_static(NAMESPACE),
    );
    r
}

/// One request, within [`REQUEST_TIMEOUT`].
async fn call<T>(
    what: &str,
    f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) if s.code() == Code::NotFound => Err(CallError::NotFound),
        Ok(Err(s)) => Err(CallError::Failed(format!("{what}: {}", s.message()))),
        Err(_) => Err(CallError::Failed(format!(
            "{what}: no answer within {}s",
            REQUEST_TIMEOUT.as_secs()
        ))),
    }
}

enum CallError {
    NotFound,
    Failed(String),
}

impl CallError {
    fn text(self) -> String {
        match self {
            CallError::NotFound => "not found".into(),
            CallError::Failed(s) => s,
        }
    }
}

/// One connection: list, then follow events until the stream fails or the daemon stops
/// answering. Returns whether it got as far as connecting, and why it ended.
async fn follow(socket: &Path, tx: &mpsc::UnboundedSender<ContainerUpdate>) -> (bool, String) {
    if !socket.exists() {
        return (
            false,
            format!(
                "{} does not exist (containerd not installed or not running)",
                socket.display()
            ),
        );
    }
    let channel =
        match tokio::time::timeout(REQUEST_TIMEOUT, containerd_client::connect(socket)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return (false, format!("connecting to {}: {e}", socket.display())),
            Err(_) => {
                return (
                    false,
                    format!(
                        "connecting to {}: no answer within {}s",
                        socket.display(),
                        REQUEST_TIMEOUT.as_secs()
                    ),
                )
            }
        };
    let client = Client::from(channel);
    let version = match call("version", client.version().version(())).await {
        Ok(v) => v.version,
        Err(e) => return (false, format!("{}: {}", socket.display(), e.text())),
    };
    // Subscribe before listing, so no change falls between the two. containerd answers a
    // subscription only with its first event: the request goes out on this first poll,
    // and its answer is awaited below, next to the health checks.
    let filter = SubscribeRequest {
        filters: vec![format!("namespace=={NAMESPACE}")],
    };
    let mut events_client = client.events();
    let mut subscribing = std::pin::pin!(events_client.subscribe(filter));
    let answered = tokio::select! {
        biased;
        r = &mut subscribing => Some(r),
        _ = std::future::ready(()) => None,
    };
    let containers = match list(&client).await {
        Ok(c) => c,
        Err(e) => return (false, e),
    };
    let connected = ContainerUpdate::Connected {
        runtime: Runtime::Containerd,
        version,
        containers,
    };
    if tx.send(connected).is_err() {
        return (true, "agent stopped".into());
    }
    let mut health = tokio::time::interval(HEALTH_INTERVAL);
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    health.tick().await;
    let answered = match answered {
        Some(r) => r,
        None => loop {
            tokio::select! {
                r = &mut subscribing => break r,
                _ = health.tick() => {
                    if let Err(e) = call("version", client.version().version(())).await {
                        return (true, e.text());
                    }
                }
            }
        },
    };
    let mut events = match answered {
        Ok(r) => r.into_inner(),
        Err(s) => return (true, format!("subscribing to events: {}", s.message())),
    };
    loop {
        let envelope = tokio::select! {
            m = events.message() => match m {
                Ok(Some(e)) => e,
                Ok(None) => return (true, "event stream ended (daemon stopped)".into()),
                Err(s) => return (true, format!("event stream: {}", s.message())),
            },
            _ = health.tick() => {
                if let Err(e) = call("version", client.version().version(())).await {
                    return (true, e.text());
                }
                continue;
            }
        };
        health.reset();
        let Some(event) = envelope.event else {
            continue;
        };
        let Some((id, removed)) = container_of(&envelope.topic, &event.value) else {
            continue;
        };
        let update = if removed {
            ContainerUpdate::Removed { id }
        } else {
            match get(&client, &id).await {
                Ok(Some(c)) => ContainerUpdate::Upsert(c),
                // Gone again before we asked: a delete event follows.
                Ok(None) => continue,
                Err(e) => return (true, format!("container {id}: {e}")),
            }
        };
        if tx.send(update).is_err() {
            return (true, "agent stopped".into());
        }
    }
}

/// The container an event is about, and whether it was deleted; None for events that
/// change nothing the table holds (images, snapshots, execs...).
fn container_of(topic: &str, payload: &[u8]) -> Option<(String, bool)> {
    fn id<M: Message + Default>(payload: &[u8], f: impl Fn(M) -> String) -> Option<String> {
        M::decode(payload).ok().map(f).filter(|id| !id.is_empty())
    }
    match topic {
        "/containers/create" => id(payload, |e: ev::ContainerCreate| e.id).map(|i| (i, false)),
        "/containers/update" => id(payload, |e: ev::ContainerUpdate| e.id).map(|i| (i, false)),
        "/containers/delete" => id(payload, |e: ev::ContainerDelete| e.id).map(|i| (i, true)),
        "/tasks/start" => id(payload, |e: ev::TaskStart| e.container_id).map(|i| (i, false)),
        "/tasks/exit" => {
            id(payload, |e: ev::TaskExit| own_task(e.id, e.container_id)).map(|i| (i, false))
        }
        "/tasks/delete" => {
            id(payload, |e: ev::TaskDelete| own_task(e.id, e.container_id)).map(|i| (i, false))
        }
        "/tasks/paused" => id(payload, |e: ev::TaskPaused| e.container_id).map(|i| (i, false)),
        "/tasks/resumed" => id(payload, |e: ev::TaskResumed| e.container_id).map(|i| (i, false)),
        _ => None,
    }
}

/// The container of a task event, if the task is the container's own: an exec's exit is not
/// the task's (its id differs from the container's); empty (no container) then.
fn own_task(id: String, container_id: String) -> String {
    if id.is_empty() || id == container_id {
        container_id
    } else {
        String::new()
    }
}

/// Whether a task's state counts as running (its cgroup is in use).
fn is_running(status: Status) -> bool {
    matches!(status, Status::Running | Status::Paused | Status::Pausing)
}

/// Every container of the namespace, each running or not by its task.
async fn list(client: &Client) -> Result<Vec<ContainerInfo>, String> {
    let tasks = call(
        "listing tasks",
        client
            .tasks()
            .list(in_namespace(ListTasksRequest::default())),
    )
    .await
    .map_err(CallError::text)?;
    let running: HashSet<String> = tasks
        .tasks
        .into_iter()
        .filter(|t| is_running(t.status()))
        .map(|t| t.container_id)
        .collect();
    let listed = call(
        "listing containers",
        client
            .containers()
            .list(in_namespace(ListContainersRequest::default())),
    )
    .await
    .map_err(CallError::text)?;
    Ok(listed
        .containers
        .into_iter()
        .map(|c| {
            let up = running.contains(&c.id);
            container_info(c, up)
        })
        .collect())
}

/// The container with `id` and whether its task runs; None when it is gone.
async fn get(client: &Client, id: &str) -> Result<Option<ContainerInfo>, String> {
    let request = GetContainerRequest { id: id.to_string() };
    let c = match call(
        "reading the container",
        client.containers().get(in_namespace(request)),
    )
    .await
    {
        Ok(r) => match r.container {
            Some(c) => c,
            None => return Ok(None),
        },
        Err(CallError::NotFound) => return Ok(None),
        Err(e) => return Err(e.text()),
    };
    let request = GetRequest {
        container_id: id.to_string(),
        exec_id: String::new(),
    };
    let running = match call(
        "reading its task",
        client.tasks().get(in_namespace(request)),
    )
    .await
    {
        Ok(r) => r.process.is_some_and(|p| is_running(p.status())),
        // No task: created, not started (or stopped and deleted).
        Err(CallError::NotFound) => false,
        Err(e) => return Err(e.text()),
    };
    Ok(Some(container_info(c, running)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

    fn container(id: &str, l: HashMap<String, String>) -> Container {
        Container {
            id: id.into(),
            labels: l,
            image: "docker.io/library/app:1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn kubelet_containers_are_named_by_pod() {
        let pod = [
            (POD_NAME, "web-7d9f"),
            (POD_NAMESPACE, "shop"),
            (POD_UID, UID),
        ];
        let app = container(
            "c1",
            labels(&[&pod[..], &[(CONTAINER_NAME, "app"), (KIND, "container")]].concat()),
        );
        let i = container_info(app, true);
        assert_eq!(i.name, "shop/web-7d9f/app");
        assert_eq!(i.image, "docker.io/library/app:1");
        assert_eq!(i.runtime, Runtime::Containerd);
        let p = i.pod.as_ref().unwrap();
        assert_eq!(
            (p.namespace.as_str(), p.name.as_str(), p.uid.as_str()),
            ("shop", "web-7d9f", UID)
        );
        assert_eq!(p.container.as_deref(), Some("app"));
        assert!(!i.is_sandbox());

        // The sandbox carries the pod's own labels.
        let sandbox = container(
            "s1",
            labels(&[&pod[..], &[(KIND, "sandbox"), ("app", "web")]].concat()),
        );
        let i = container_info(sandbox, true);
        assert_eq!(i.name, "shop/web-7d9f");
        assert!(i.is_sandbox());
        assert_eq!(i.labels.get("app").map(String::as_str), Some("web"));

        // Not the kubelet's (say, `ctr run` by hand): named by id, no pod.
        for l in [
            labels(&[]),
            labels(&[(POD_NAME, "x"), (POD_NAMESPACE, "y"), (CONTAINER_NAME, "z")]),
            labels(&[
                (POD_NAME, "x"),
                (POD_NAMESPACE, "y"),
                (POD_UID, UID),
                (KIND, "container"),
            ]),
            labels(&[
                (POD_NAME, ""),
                (POD_NAMESPACE, "y"),
                (POD_UID, UID),
                (KIND, "sandbox"),
            ]),
        ] {
            let i = container_info(container("mine", l.clone()), false);
            assert_eq!(i.name, "mine", "{l:?}");
            assert_eq!(i.pod, None, "{l:?}");
        }
    }

    #[test]
    fn events_name_their_container() {
        let create = ev::ContainerCreate {
            id: "c1".into(),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(
            container_of("/containers/create", &create),
            Some(("c1".into(), false))
        );
        let delete = ev::ContainerDelete { id: "c1".into() }.encode_to_vec();
        assert_eq!(
            container_of("/containers/delete", &delete),
            Some(("c1".into(), true))
        );
        let start = ev::TaskStart {
            container_id: "c2".into(),
            pid: 7,
        }
        .encode_to_vec();
        assert_eq!(
            container_of("/tasks/start", &start),
            Some(("c2".into(), false))
        );
        let exit = |id: &str| {
            ev::TaskExit {
                container_id: "c2".into(),
                id: id.into(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        assert_eq!(
            container_of("/tasks/exit", &exit("c2")),
            Some(("c2".into(), false))
        );
        assert_eq!(container_of("/tasks/exit", &exit("exec-1")), None);
        // Other topics, and payloads that are not what the topic says: ignored.
        assert_eq!(container_of("/images/create", &create), None);
        assert_eq!(container_of("/containers/create", &[0xff, 0xff]), None);
        assert_eq!(container_of("/containers/create", &[]), None);
    }
}
