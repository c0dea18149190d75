//! What a cgroup is, read from its path alone: a container (Docker, containerd, CRI-O,
//! podman; cgroupfs or systemd driver), a Kubernetes pod (kubelet's cgroupfs or systemd
//! driver, with its QoS class), a systemd unit, or just a cgroup. Docker's and containerd's
//! APIs later add a container's name, image and pod; this is what is known without asking
//! anyone.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceKind {
    Container,
    Pod,
    Unit,
    /// A cgroup no runtime or manager owns (and what a reader assumes when the kind is
    /// missing).
    #[default]
    Cgroup,
}

impl ServiceKind {
    /// As events spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceKind::Container => "container",
            ServiceKind::Pod => "pod",
            ServiceKind::Unit => "unit",
            ServiceKind::Cgroup => "cgroup",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Docker,
    Containerd,
    Crio,
    Podman,
}

/// Kubernetes QoS class, from the kubelet's cgroup layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodRef {
    /// Pod UID with dashes, as the API server spells it.
    pub uid: String,
    pub qos: QosClass,
}

/// A cgroup named from its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathName {
    pub kind: ServiceKind,
    /// Container: the short id (12 hex, as `docker ps`); pod: `pod-<uid>`; unit: the unit
    /// name; cgroup: the path.
    pub name: String,
    /// Container: full id; pod: UID; unit: unit name; cgroup: none.
    pub id: Option<String>,
    pub runtime: Option<Runtime>,
    /// The pod a container or pod cgroup belongs to.
    pub pod: Option<PodRef>,
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `docker-<id>.scope` and friends: the systemd driver's container scopes.
fn container_scope(component: &str) -> Option<(Runtime, &str)> {
    let stem = component.strip_suffix(".scope")?;
    [
        ("docker-", Runtime::Docker),
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::Crio),
        ("libpod-", Runtime::Podman),
    ]
    .into_iter()
    .find_map(|(prefix, rt)| {
        stem.strip_prefix(prefix)
            .filter(|id| is_container_id(id))
            .map(|id| (rt, id))
    })
}

/// A pod's cgroup: `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid with _>.slice`
/// (systemd), with the QoS class from the enclosing component.
fn pod_of(components: &[&str]) -> Option<(PodRef, usize)> {
    components.iter().enumerate().find_map(|(i, c)| {
        let uid = if let Some(stem) = c.strip_suffix(".slice") {
            // kubepods-burstable-pod<uid>.slice / kubepods-pod<uid>.slice
            let (_, uid) = stem.rsplit_once("-pod")?;
            stem.starts_with("kubepods")
                .then(|| uid.replace('_', "-"))?
        } else {
            let uid = c.strip_prefix("pod")?;
            // kubelet's cgroupfs driver nests pods under kubepods.
            components[..i]
                .iter()
                .any(|p| p.starts_with("kubepods"))
                .then(|| uid.to_string())?
        };
        if uid.len() != 36 || !uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return None;
        }
        let qos = components[..=i]
            .iter()
            .find_map(|p| {
                if p.contains("besteffort") {
                    Some(QosClass::BestEffort)
                } else if p.contains("burstable") {
                    Some(QosClass::Burstable)
                } else {
                    None
                }
            })
            .unwrap_or(QosClass::Guaranteed);
        Some((PodRef { uid, qos }, i))
    })
}

const UNIT_SUFFIXES: [&str; 6] = [".service", ".scope", ".slice", ".socket", ".mount", ".swap"];

/// Names the cgroup at `path` (relative to the hierarchy root, `/` separated).
pub fn name_path(path: &str) -> PathName {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let pod = pod_of(&components);
    let leaf = components.last().copied().unwrap_or("");
    let parent = components.iter().rev().nth(1).copied().unwrap_or("");
    let container = container_scope(leaf)
        .map(|(rt, id)| (Some(rt), id))
        .or_else(|| {
            // cgroupfs driver: /docker/<id>, /kubepods/.../pod<uid>/<id>, containerd's
            // /<namespace>/<id>: only Docker's own parent says which runtime it is.
            let runtime = (parent == "docker").then_some(Runtime::Docker);
            is_container_id(leaf).then_some((runtime, leaf))
        });
    if let Some((runtime, id)) = container {
        return PathName {
            kind: ServiceKind::Container,
            name: id[..12].to_string(),
            id: Some(id.to_string()),
            runtime,
            pod: pod.map(|(p, _)| p),
        };
    }
    if let Some((p, i)) = &pod {
        if i + 1 == components.len() {
            return PathName {
                kind: ServiceKind::Pod,
                name: format!("pod-{}", p.uid),
                id: Some(p.uid.clone()),
                runtime: None,
                pod: Some(p.clone()),
            };
        }
    }
    if UNIT_SUFFIXES.iter().any(|s| leaf.ends_with(s)) {
        return PathName {
            kind: ServiceKind::Unit,
            name: leaf.to_string(),
            id: Some(leaf.to_string()),
            runtime: None,
            pod: pod.map(|(p, _)| p),
        };
    }
    PathName {
        kind: ServiceKind::Cgroup,
        name: if path.is_empty() {
            "/".into()
        } else {
            path.into()
        },
        id: None,
        runtime: None,
        pod: pod.map(|(p, _)| p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    const UID_: &str = "0a1b2c3d_4e5f_6789_abcd_ef0123456789";

    fn container(path: &str) -> PathName {
        let n = name_path(path);
        assert_eq!(n.kind, ServiceKind::Container, "{path}: {n:?}");
        assert_eq!(n.id.as_deref(), Some(ID), "{path}");
        assert_eq!(n.name, &ID[..12], "{path}");
        n
    }

    #[test]
    fn docker_cgroupfs_and_systemd_drivers() {
        let n = container(&format!("/docker/{ID}"));
        assert_eq!(n.runtime, Some(Runtime::Docker));
        assert_eq!(n.pod, None);
        let n = container(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(n.runtime, Some(Runtime::Docker));
    }

    #[test]
    fn containerd_crio_and_podman_scopes() {
        let n = container(&format!("/system.slice/cri-containerd-{ID}.scope"));
        assert_eq!(n.runtime, Some(Runtime::Containerd));
        let n = container(&format!("/machine.slice/libpod-{ID}.scope"));
        assert_eq!(n.runtime, Some(Runtime::Podman));
        let n = container(&format!("/system.slice/crio-{ID}.scope"));
        assert_eq!(n.runtime, Some(Runtime::Crio));
        // conmon is CRI-O's monitor, not the container.
        let n = name_path(&format!("/machine.slice/crio-conmon-{ID}.scope"));
        assert_eq!(n.kind, ServiceKind::Unit);
    }

    #[test]
    fn kubelet_cgroupfs_driver_all_qos_classes() {
        for (dir, qos) in [
            ("/kubepods", QosClass::Guaranteed),
            ("/kubepods/burstable", QosClass::Burstable),
            ("/kubepods/besteffort", QosClass::BestEffort),
        ] {
            let pod = name_path(&format!("{dir}/pod{UID}"));
            assert_eq!(pod.kind, ServiceKind::Pod, "{dir}");
            assert_eq!(pod.name, format!("pod-{UID}"));
            assert_eq!(pod.id.as_deref(), Some(UID));
            assert_eq!(pod.pod.as_ref().unwrap().qos, qos, "{dir}");
            let c = container(&format!("{dir}/pod{UID}/{ID}"));
            assert_eq!(c.runtime, None, "the runtime is not in a cgroupfs path");
            assert_eq!(
                c.pod,
                Some(PodRef {
                    uid: UID.into(),
                    qos
                })
            );
        }
        // The QoS-level cgroups themselves are plain cgroups.
        assert_eq!(name_path("/kubepods/burstable").kind, ServiceKind::Cgroup);
    }

    #[test]
    fn kubelet_systemd_driver_all_qos_classes() {
        for (dir, pod_slice, qos) in [
            (
                "/kubepods.slice",
                format!("kubepods-pod{UID_}.slice"),
                QosClass::Guaranteed,
            ),
            (
                "/kubepods.slice/kubepods-burstable.slice",
                format!("kubepods-burstable-pod{UID_}.slice"),
                QosClass::Burstable,
            ),
            (
                "/kubepods.slice/kubepods-besteffort.slice",
                format!("kubepods-besteffort-pod{UID_}.slice"),
                QosClass::BestEffort,
            ),
        ] {
            let pod = name_path(&format!("{dir}/{pod_slice}"));
            assert_eq!(pod.kind, ServiceKind::Pod, "{dir}");
            assert_eq!(pod.id.as_deref(), Some(UID), "underscores become dashes");
            assert_eq!(pod.pod.as_ref().unwrap().qos, qos);
            for scope in [
                format!("cri-containerd-{ID}.scope"),
                format!("crio-{ID}.scope"),
                format!("docker-{ID}.scope"),
            ] {
                let c = container(&format!("{dir}/{pod_slice}/{scope}"));
                assert!(c.runtime.is_some());
                assert_eq!(c.pod.as_ref().unwrap().uid, UID);
                assert_eq!(c.pod.as_ref().unwrap().qos, qos);
            }
        }
        assert_eq!(
            name_path("/kubepods.slice/kubepods-burstable.slice").kind,
            ServiceKind::Unit
        );
    }

    #[test]
    fn systemd_units_and_plain_cgroups() {
        for (path, unit) in [
            ("/system.slice/postgresql@15-main.service", "postgresql@15-main.service"),
            ("/system.slice/docker.service", "docker.service"),
            ("/user.slice/user-1000.slice/session-3.scope", "session-3.scope"),
            ("/system.slice", "system.slice"),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal.slice",
                "app-org.gnome.Terminal.slice",
            ),
        ] {
            let n = name_path(path);
            assert_eq!(n.kind, ServiceKind::Unit, "{path}");
            assert_eq!(n.name, unit);
        }
        for path in [
            "/db",
            "/iso-nn-db",
            "/docker",
            "/kubepods/burstable/podnot-a-uid",
        ] {
            let n = name_path(path);
            assert_eq!(n.kind, ServiceKind::Cgroup, "{path}: {n:?}");
            assert_eq!(n.name, path);
        }
        assert_eq!(name_path("").name, "/");
        // A 64-hex directory that is not under a runtime or kubelet is still a container
        // (containerd's cgroupfs layout uses bare ids under its namespace directory), of a
        // runtime the path does not name.
        let n = container(&format!("/k8s.io/{ID}"));
        assert_eq!(n.runtime, None);
    }

    mod props {
        use proptest::prelude::*;

        use super::super::*;

        /// Path components the parsers look for, right and nearly right, and any text.
        fn component() -> impl Strategy<Value = String> {
            let hex = "[0-9a-f]{64}";
            let uid = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
            // Pod UIDs as odd as a path may hold them: right length, any characters.
            let odd_uid = "[-_0-9a-fA-Zé/.\\PC]{30,40}";
            prop_oneof![
                hex.prop_map(|id| format!("docker-{id}.scope")),
                (
                    prop::sample::select(vec![
                        "docker-",
                        "cri-containerd-",
                        "crio-",
                        "libpod-",
                        "crio-conmon-",
                        ""
                    ]),
                    "[0-9a-fA-F]{60,66}",
                    prop::sample::select(vec![".scope", "", ".slice"])
                )
                    .prop_map(|(p, id, s)| format!("{p}{id}{s}")),
                hex.prop_map(|id| id.to_string()),
                (
                    prop::sample::select(vec![
                        "kubepods-",
                        "kubepods-burstable-",
                        "kubepods-besteffort-",
                        "x-"
                    ]),
                    prop_oneof![uid, odd_uid]
                )
                    .prop_map(|(p, u)| format!("{p}pod{}.slice", u.replace('-', "_"))),
                prop_oneof![uid, odd_uid].prop_map(|u| format!("pod{u}")),
                prop::sample::select(vec![
                    "kubepods",
                    "kubepods.slice",
                    "burstable",
                    "besteffort",
                    "docker",
                    "system.slice",
                    "pg.service",
                    ".scope",
                    "-pod.slice",
                    "pod",
                    "",
                    ".",
                    "..",
                ])
                .prop_map(str::to_string),
                "\\PC{0,20}",
            ]
        }

        fn check(path: &str) -> Result<(), TestCaseError> {
            let n = name_path(path);
            match n.kind {
                ServiceKind::Container => {
                    let id = n.id.as_deref().unwrap_or_default();
                    prop_assert!(is_container_id(id), "{path}: {n:?}");
                    prop_assert_eq!(&n.name, &id[..12]);
                }
                ServiceKind::Pod => {
                    let uid = n.id.as_deref().unwrap_or_default();
                    prop_assert_eq!(uid.len(), 36, "{}: {:?}", path, n);
                    prop_assert_eq!(n.pod.as_ref().map(|p| p.uid.as_str()), Some(uid));
                }
                ServiceKind::Unit => prop_assert!(n.id.is_some()),
                ServiceKind::Cgroup => prop_assert!(n.id.is_none()),
            }
            if let Some(p) = &n.pod {
                prop_assert!(
                    p.uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'),
                    "{path}"
                );
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(crate::proptest_budget(2000))]

            #[test]
            fn name_of_any_path(path in any::<String>()) {
                check(&path)?;
            }

            #[test]
            fn name_of_cgroup_like_paths(
                parts in prop::collection::vec(component(), 0..6),
                lead in any::<bool>(),
            ) {
                let path = format!("{}{}", if lead { "/" } else { "" }, parts.join("/"));
                check(&path)?;
            }

            /// What a runtime writes is named a container of that id, at any depth.
            #[test]
            fn container_scopes_are_containers(
                id in "[0-9a-f]{64}",
                above in prop::collection::vec("[a-z.-]{1,12}", 0..4),
                rt in prop::sample::select(vec![
                    ("docker-", Runtime::Docker),
                    ("cri-containerd-", Runtime::Containerd),
                    ("crio-", Runtime::Crio),
                    ("libpod-", Runtime::Podman),
                ]),
            ) {
                let path = format!("/{}/{}{id}.scope", above.join("/"), rt.0);
                let n = name_path(&path);
                prop_assert_eq!(n.kind, ServiceKind::Container, "{}", path);
                prop_assert_eq!(n.id.as_deref(), Some(id.as_str()));
                prop_assert_eq!(n.runtime, Some(rt.1));
            }
        }
    }
}
