//! Which cgroup belongs to which service: the config's services (ids 0..n) and those running
//! containers and pods declare in their `isolator.*` labels (ids from n on, never reused),
//! what became of each label SLO, and the cgroup directories each service's limits go on.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::report;
use crate::{
    config::{Config, Matcher, Owner, ServiceSpec},
    events::{Event, LabelSloInfo},
    identify::containers::{ContainerInfo, ContainerTable},
    identify::labels,
    identify::naming::ServiceKind,
    policy::ServiceId,
};

/// A cgroup directory a service's limits go on, with its inode: a container that restarts
/// gets a new cgroup at the same path, which carries none of the old limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    pub path: String,
    pub ino: u64,
}

/// A service declared by a container's `isolator.*` labels, or a pod's (on its sandbox).
struct LabelService {
    container_id: String,
    /// The pod's UID, when the labels are a pod's.
    pod_uid: Option<String>,
    spec: ServiceSpec,
}

/// What a [`Membership::rematch`] changed, for the rest of the controller to follow.
#[derive(Default)]
pub(super) struct Rematch {
    /// What became of label SLOs, each said once.
    pub events: Vec<Event>,
    /// Services that lost every cgroup they had (they left it, vanished or were
    /// re-created), or that are gone: they start over.
    pub restarted: Vec<ServiceId>,
    /// Services that kept some of their cgroups and gained or lost others, with the cgroups
    /// that joined: the limits the service holds are spread again over its cgroups now,
    /// and its weight goes on the ones that joined.
    pub regrouped: Vec<(ServiceId, Vec<Target>)>,
    /// Inodes of the cgroups that left a service: their knobs are given back.
    pub released: Vec<u64>,
    /// Label services that just appeared (their weights are due).
    pub new_label_services: Vec<ServiceId>,
}

pub(super) struct Membership {
    /// Services of the config file, ids 0..n.
    config: Config,
    /// Services declared by container labels, ids from n on, never reused.
    labelled: BTreeMap<ServiceId, LabelService>,
    next_label_id: ServiceId,
    /// cgroup id -> service (None: unconfigured), cached per id.
    of_cgroup: HashMap<u64, Option<ServiceId>>,
    /// service -> the cgroup directories its matchers take (where limits are written).
    targets: HashMap<ServiceId, Vec<Target>>,
    /// Label outcomes already said, so a lasting one is said once.
    said: HashSet<String>,
}

impl Membership {
    pub fn new(config: Config) -> Membership {
        Membership {
            next_label_id: config.services.len(),
            config,
            labelled: BTreeMap::new(),
            of_cgroup: HashMap::new(),
            targets: HashMap::new(),
            said: HashSet::new(),
        }
    }

    pub fn spec(&self, sid: ServiceId) -> Option<&ServiceSpec> {
        self.config
            .services
            .get(sid)
            .or_else(|| Some(&self.labelled.get(&sid)?.spec))
    }

    /// Every service, config first (its services win a cgroup over labels).
    fn specs(&self) -> impl Iterator<Item = (ServiceId, &ServiceSpec)> {
        self.config
            .services
            .iter()
            .enumerate()
            .chain(self.labelled.iter().map(|(&id, l)| (id, &l.spec)))
    }

    /// The config's services' ids.
    pub fn config_services(&self) -> std::ops::Range<ServiceId> {
        0..self.config.services.len()
    }

    /// The cgroup directories a service's limits go on.
    pub fn targets(&self, sid: ServiceId) -> &[Target] {
        self.targets.get(&sid).map_or(&[], Vec::as_slice)
    }

    #[cfg(test)]
    pub fn label_service_ids(&self) -> Vec<ServiceId> {
        self.labelled.keys().copied().collect()
    }

    #[cfg(test)]
    pub fn services_with_targets(&self) -> Vec<ServiceId> {
        self.targets.keys().copied().collect()
    }

    /// A cgroup belongs to the service that matches it or its nearest ancestor.
    fn service_of_path(&self, path: &str, containers: &ContainerTable) -> Option<ServiceId> {
        let mut p = path.to_string();
        loop {
            if let Some((sid, _)) = self.specs().find(|(_, s)| s.matches(&p, containers)) {
                return Some(sid);
            }
            match p.rfind('/') {
                Some(0) | None => return None,
                Some(i) => p.truncate(i),
            }
        }
    }

    /// The service a cgroup (`id`, at `path` when known) belongs to, cached until the next
    /// rematch.
    pub fn service_of(
        &mut self,
        id: u64,
        path: Option<&str>,
        containers: &ContainerTable,
    ) -> Option<ServiceId> {
        if let Some(&s) = self.of_cgroup.get(&id) {
            return s;
        }
        let s = path.and_then(|p| self.service_of_path(p, containers));
        self.of_cgroup.insert(id, s);
        s
    }

    /// Follows the cgroups that exist (`all_paths`, a fresh walk; `ino` gives a cgroup's
    /// inode, 0 when gone) and what Docker says of containers: label services come and go,
    /// and each service's targets are re-matched.
    pub fn rematch(
        &mut self,
        all_paths: &[String],
        containers: &ContainerTable,
        ino: &dyn Fn(&str) -> u64,
    ) -> Rematch {
        // Each cgroup is named once, then matched against every service.
        let owners: Vec<Owner> = all_paths.iter().map(|p| Owner::of(p, containers)).collect();
        let events = self.sync_label_services(&owners, containers);
        let new_targets: HashMap<ServiceId, Vec<Target>> = self
            .specs()
            .map(|(sid, s)| {
                let mut t: Vec<Target> = owners
                    .iter()
                    .filter(|o| s.matches_owner(o))
                    .map(|o| Target {
                        path: o.path.to_string(),
                        ino: ino(o.path),
                    })
                    .collect();
                // In path order, whatever order the walk found them in: a decision's
                // cgroups read the same every time.
                t.sort_by(|a, b| a.path.cmp(&b.path));
                (sid, t)
            })
            .collect();
        let mut out = Rematch {
            events,
            ..Default::default()
        };
        for (sid, old) in &self.targets {
            let new = new_targets.get(sid);
            // A cgroup renamed within the service (same inode) is not lost.
            let lost: Vec<&Target> = old
                .iter()
                .filter(|t| new.is_none_or(|n| !n.iter().any(|n| n.ino == t.ino)))
                .collect();
            out.released.extend(lost.iter().map(|t| t.ino));
            let Some(new) = new else {
                // A service that is gone (a label service let go) starts over.
                out.restarted.push(*sid);
                continue;
            };
            if !old.is_empty() && lost.len() == old.len() {
                out.restarted.push(*sid);
                continue;
            }
            // Kept some: the cgroups that joined get the service's limits and weight (a
            // new unit under a matched slice, a pod's new container), or they would run
            // unlimited until the policy next decided something.
            let joined: Vec<Target> = new
                .iter()
                .filter(|n| !old.iter().any(|t| t.ino == n.ino))
                .cloned()
                .collect();
            if !joined.is_empty() || !lost.is_empty() {
                out.regrouped.push((*sid, joined));
            }
        }
        out.regrouped.sort_by_key(|(sid, _)| *sid);
        out.new_label_services = new_targets
            .keys()
            .filter(|sid| !self.targets.contains_key(sid))
            .filter(|&&sid| !self.config_services().contains(&sid))
            .copied()
            .collect();
        out.new_label_services.sort_unstable();
        self.targets = new_targets;
        self.of_cgroup.clear();
        out
    }

    /// Adds a service per labelled running container or pod, unless the config claims its
    /// cgroup (the config wins, and says so); drops those whose container or pod stopped or
    /// lost its labels (their state goes with their targets, in [`Membership::rematch`]).
    /// Every outcome is an event, said once.
    fn sync_label_services(&mut self, owners: &[Owner], containers: &ContainerTable) -> Vec<Event> {
        let mut events = vec![];
        // Containers with a cgroup now, and the cgroups of each pod (see PodOwner).
        let running: HashMap<&str, &Owner> = owners
            .iter()
            .filter(|o| o.named.kind == ServiceKind::Container)
            .filter_map(|o| Some((o.named.id.as_deref()?, o)))
            .collect();
        let mut of_pod: HashMap<&str, Vec<&Owner>> = HashMap::new();
        for o in owners {
            if let Some(p) = &o.pod {
                of_pod.entry(p.uid.as_str()).or_default().push(o);
            }
        }
        let mut wanted: HashMap<&str, (ServiceSpec, Option<String>)> = HashMap::new();
        // Labelled containers a config service claims (by id): the config's service's name.
        let mut claimed_by: HashMap<&str, &str> = HashMap::new();
        for c in containers.iter() {
            // A sandbox's labels are its pod's: they govern the pod.
            let pod_uid = c
                .pod
                .as_ref()
                .filter(|_| c.is_sandbox())
                .map(|p| p.uid.clone());
            let labels = match labels::slo_from_labels(&c.labels, &self.config.labels) {
                Ok(Some(slo)) => slo,
                Ok(None) => continue,
                Err(e) => {
                    let label = format!("{}={}", e.label, e.value);
                    if self.said.insert(format!("label:{}:{label}", c.id)) {
                        let message = format!(
                            "{}: {e}; the {} is treated as unconfigured",
                            subject(c),
                            governed(pod_uid.as_deref())
                        );
                        events.push(report::label_slo(
                            "invalid",
                            (&c.name, &c.id, pod_uid.as_deref()),
                            None,
                            Some(label),
                            message,
                        ));
                    }
                    continue;
                }
            };
            // The runtime says a container stopped before its cgroup is gone: its word first.
            if !c.running {
                continue;
            }
            let (matcher, cgroups) = match &pod_uid {
                Some(uid) => (
                    Matcher::Pod(exact(uid)),
                    of_pod.get(uid.as_str()).cloned().unwrap_or_default(),
                ),
                None => (
                    Matcher::Container(exact(&c.id)),
                    running.get(c.id.as_str()).copied().into_iter().collect(),
                ),
            };
            if cgroups.is_empty() {
                continue;
            }
            let claimed = self
                .config
                .services
                .iter()
                .find(|s| cgroups.iter().any(|o| s.matches_owner(o)));
            if let Some(claimed) = claimed {
                claimed_by.insert(&c.id, &claimed.name);
                if self.said.insert(format!("overridden:{}", c.id)) {
                    let message = format!(
                        "{} declares {} in its labels, but the config's service '{}' (line {}) claims it: the config wins",
                        subject(c),
                        labels.class.describe(),
                        claimed.name,
                        claimed.line
                    );
                    events.push(report::label_slo(
                        "overridden",
                        (&c.name, &c.id, pod_uid.as_deref()),
                        Some(claimed),
                        None,
                        message,
                    ));
                }
                continue;
            }
            let spec = ServiceSpec {
                name: c.name.clone(),
                matchers: vec![matcher],
                class: labels.class,
                floor: labels.floor,
                ceiling: labels.ceiling,
                weight: labels.weight,
                line: 0,
                match_line: 0,
            };
            wanted.insert(&c.id, (spec, pod_uid));
        }
        // Renamed (same container, same labels, a new name): the service keeps its id and
        // so its limits and what the policy learned of it; letting it go would lift a
        // throttled aggressor's cap until the policy found it again.
        for l in self.labelled.values_mut() {
            let Some((w, _)) = wanted.get(l.container_id.as_str()) else {
                continue;
            };
            if w == &l.spec || !renamed_only(&l.spec, w) {
                continue;
            }
            let was = std::mem::replace(&mut l.spec.name, w.name.clone());
            let message = format!(
                "service '{was}' is now '{}': its {} was renamed; its limits stay",
                w.name,
                governed(l.pod_uid.as_deref())
            );
            events.push(Event::LabelSlo(LabelSloInfo {
                renamed_from: Some(was),
                ..report::label_slo_info(
                    "renamed",
                    (&w.name, &l.container_id, l.pod_uid.as_deref()),
                    Some(&l.spec),
                    None,
                    message,
                )
            }));
        }
        // Gone or changed: released (a changed one comes back below with a new id).
        let stale: Vec<ServiceId> = self
            .labelled
            .iter()
            .filter(|(_, l)| wanted.get(l.container_id.as_str()).map(|w| &w.0) != Some(&l.spec))
            .map(|(&id, _)| id)
            .collect();
        for sid in stale {
            let l = self.labelled.remove(&sid).expect("listed above");
            let container = containers
                .get(&l.container_id)
                .map_or(l.spec.name.as_str(), |c| c.name.as_str());
            let what = governed(l.pod_uid.as_deref());
            let why = match (
                wanted.get(l.container_id.as_str()),
                claimed_by.get(l.container_id.as_str()),
            ) {
                (Some(_), _) => "its labels changed".to_string(),
                // Renamed into a config service's glob, say: the config wins.
                (None, Some(config)) => {
                    format!("the config's service '{config}' claims its {what} now")
                }
                (None, None) => format!("its {what} stopped or no longer carries valid labels"),
            };
            let message = format!("service '{}' let go: {why}", l.spec.name);
            events.push(report::label_slo(
                "released",
                (container, &l.container_id, l.pod_uid.as_deref()),
                Some(&l.spec),
                None,
                message,
            ));
        }
        let have: HashSet<&str> = self
            .labelled
            .values()
            .map(|l| l.container_id.as_str())
            .collect();
        let mut new: Vec<(&str, (ServiceSpec, Option<String>))> = wanted
            .into_iter()
            .filter(|(id, _)| !have.contains(id))
            .collect();
        new.sort_by(|a, b| a.0.cmp(b.0));
        for (container_id, (spec, pod_uid)) in new {
            let message = format!(
                "{} '{}' governed by its labels: {}",
                governed(pod_uid.as_deref()),
                spec.name,
                spec.class.describe()
            );
            events.push(report::label_slo(
                "applied",
                (&spec.name, container_id, pod_uid.as_deref()),
                Some(&spec),
                None,
                message,
            ));
            let sid = self.next_label_id;
            self.next_label_id += 1;
            let container_id = container_id.to_string();
            self.labelled.insert(
                sid,
                LabelService {
                    container_id,
                    pod_uid,
                    spec,
                },
            );
        }
        events
    }
}

/// What labels govern: the pod when they are a pod's (`pod_uid`), else the container.
fn governed(pod_uid: Option<&str>) -> &'static str {
    if pod_uid.is_some() {
        "pod"
    } else {
        "container"
    }
}

/// `container 'db'`, or for a pod's labels `pod 'shop/web'`.
fn subject(c: &ContainerInfo) -> String {
    let what = if c.is_sandbox() { "pod" } else { "container" };
    format!("{what} '{}'", c.name)
}

/// A glob that matches `text` alone.
fn exact(text: &str) -> glob::Pattern {
    glob::Pattern::new(&glob::Pattern::escape(text)).expect("an escaped text is a valid glob")
}

/// Whether a label service's spec differs from `now` by its name at most: the container
/// was renamed, its labels are the same.
fn renamed_only(was: &ServiceSpec, now: &ServiceSpec) -> bool {
    ServiceSpec {
        name: now.name.clone(),
        ..was.clone()
    } == *now
}
