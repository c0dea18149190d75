//! The cgroups of the maps by name: id -> path -> owner, kept for the cgroups the
//! snapshot holds, found again only when an id is new or its directory moved.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    os::unix::fs::MetadataExt,
};

use isolator_common::UNATTRIBUTED_CGROUP;

use super::{
    cgroupfs::IoHierarchy,
    containers::{ContainerTable, ContainerUpdate},
};
use crate::events::CgroupRef;

/// Names the cgroups that appear in the maps. A cgroup is checked with one stat of its
/// known directory each cycle; the hierarchy is walked only when an id is new or its
/// directory is gone or renamed. Only cgroups present in the maps are remembered.
pub struct Registry {
    pub hierarchy: IoHierarchy,
    /// Each cgroup as events name it, built once when its path is found.
    known: HashMap<u64, CgroupRef>,
    /// Cgroups confirmed removed (kernfs ids are never reused), kept until forgotten.
    gone: HashSet<u64>,
    /// What Docker and containerd say of the containers that exist.
    pub containers: ContainerTable,
}

impl Registry {
    pub fn new(hierarchy: IoHierarchy) -> Registry {
        Registry {
            hierarchy,
            known: HashMap::new(),
            gone: HashSet::new(),
            containers: ContainerTable::default(),
        }
    }

    fn at_known_path(&self, id: u64) -> bool {
        self.known
            .get(&id)
            .and_then(|c| c.path.as_deref())
            .is_some_and(|p| {
                std::fs::metadata(self.hierarchy.dir_of(p)).is_ok_and(|m| m.ino() == id)
            })
    }

    /// Names every id in `active` (the cgroups in this cycle's snapshot). Returns the walk
    /// of the hierarchy (id -> path) if new or moved cgroups made one necessary.
    pub fn update(&mut self, active: &BTreeSet<u64>) -> Option<HashMap<u64, String>> {
        self.known.retain(|id, _| active.contains(id));
        self.gone.retain(|id| active.contains(id));
        let unresolved: Vec<u64> = active
            .iter()
            .copied()
            .filter(|&id| {
                id != UNATTRIBUTED_CGROUP && !self.gone.contains(&id) && !self.at_known_path(id)
            })
            .collect();
        if unresolved.is_empty() {
            return None;
        }
        let live = self.hierarchy.scan();
        for id in unresolved {
            match live.get(&id) {
                Some(p) => {
                    let named = CgroupRef::new(id, Some(p.clone()), &self.containers);
                    self.known.insert(id, named);
                }
                // Its last known path (if any) stays for the events that name it.
                None => {
                    self.gone.insert(id);
                }
            }
        }
        Some(live)
    }

    pub fn is_gone(&self, id: u64) -> bool {
        self.gone.contains(&id)
    }

    pub fn forget(&mut self, id: u64) {
        self.known.remove(&id);
        self.gone.remove(&id);
    }

    pub fn cgroup(&self, id: u64) -> CgroupRef {
        self.known
            .get(&id)
            .cloned()
            .unwrap_or_else(|| CgroupRef::new(id, None, &self.containers))
    }

    pub fn path(&self, id: u64) -> Option<String> {
        self.known.get(&id)?.path.clone()
    }

    /// Applies what a runtime said; cgroups of changed containers, and of pods whose
    /// sandbox changed, are named again. Returns whether anything changed.
    pub fn apply_containers(&mut self, update: &ContainerUpdate) -> bool {
        let change = self.containers.apply(update);
        if change.is_empty() {
            return false;
        }
        for c in self.known.values_mut() {
            let affected = c.container_id.as_ref().is_some_and(|id| {
                change.changed.binary_search(id).is_ok() || change.removed.binary_search(id).is_ok()
            }) || c
                .pod_uid
                .as_ref()
                .is_some_and(|uid| change.pods.binary_search(uid).is_ok());
            if affected {
                *c = CgroupRef::new(c.id, c.path.take(), &self.containers);
            }
        }
        true
    }
}
