use super::*;
use crate::{
    identify::cgroupfs::CgroupMode,
    identify::containers::{ContainerInfo, ContainerUpdate},
    identify::naming::Runtime,
};

fn outcomes(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::LabelSlo(l) => Some((l.outcome.clone(), l.container.clone())),
            _ => None,
        })
        .collect()
}

/// The id of test container `n`: `n` in 64 hex digits.
fn container_id(n: u8) -> String {
    format!("{n:064x}")
}

/// Docker container `n` as the runtime lists it (a pod's container by struct update).
fn docker_container(n: u8, name: &str, labels: &[(&str, &str)], running: bool) -> ContainerInfo {
    ContainerInfo {
        id: container_id(n),
        name: name.into(),
        image: "img".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        running,
        runtime: Runtime::Docker,
        pod: None,
    }
}

#[test]
fn label_services_follow_what_docker_says() {
    // A dry-run controller over a hierarchy that does not exist: nothing is written.
    let hierarchy = IoHierarchy {
        mode: CgroupMode::V1,
        root: "/nonexistent-isolator-test".into(),
        io_enabled: true,
    };
    let config = Config::parse(
        "c.toml",
        "[[service]]\nname='web'\ncontainer='web*'\nclass='best-effort'\n",
    )
    .unwrap();
    let policy = crate::policy::by_name("adaptive", 0.75).unwrap();
    let mut c = Controller::new(config, policy, Enforcer::new(hierarchy.clone(), None));
    let (id, info) = (container_id, docker_container);
    let slo = [("isolator.class", "latency"), ("isolator.p999", "20ms")];
    let mut table = ContainerTable::default();
    table.apply(&ContainerUpdate::Connected {
        runtime: Runtime::Docker,
        version: "1.41".into(),
        containers: vec![
            info(1, "db", &slo, true),
            info(2, "web", &slo, true),
            info(3, "bad", &[("isolator.class", "fast")], true),
        ],
    });
    let paths: Vec<String> = (1..=3).map(|n| format!("/docker/{}", id(n))).collect();
    let ev = c.refresh(&hierarchy, &paths, &table, 1);
    let mut got = outcomes(&ev);
    got.sort();
    assert_eq!(
        got,
        [
            ("applied".to_string(), "db".to_string()),
            ("invalid".into(), "bad".into()),
            ("overridden".into(), "web".into()),
        ]
    );
    // Said once: the same refresh again says nothing.
    assert!(outcomes(&c.refresh(&hierarchy, &paths, &table, 2)).is_empty());

    // Renamed: the service takes the new name and keeps its id, and says so once.
    table.apply(&ContainerUpdate::Upsert(info(1, "db2", &slo, true)));
    let ev = c.refresh(&hierarchy, &paths, &table, 3);
    assert_eq!(outcomes(&ev), [("renamed".to_string(), "db2".to_string())]);
    let said = |ev: &[Event]| match &ev[0] {
        Event::LabelSlo(l) => l.message.clone(),
        _ => String::new(),
    };
    assert_eq!(
        said(&ev),
        "service 'db' is now 'db2': its container was renamed; its limits stay"
    );
    assert!(matches!(&ev[0], Event::LabelSlo(l)
        if l.renamed_from.as_deref() == Some("db") && l.service.as_deref() == Some("db2")));
    assert_eq!(c.membership.label_service_ids(), [1]);
    assert_eq!(c.membership.spec(1).map(|s| s.name.as_str()), Some("db2"));
    assert!(outcomes(&c.refresh(&hierarchy, &paths, &table, 4)).is_empty());
    // Renamed back: the same service.
    table.apply(&ContainerUpdate::Upsert(info(1, "db", &slo, true)));
    let ev = c.refresh(&hierarchy, &paths, &table, 4);
    assert_eq!(outcomes(&ev), [("renamed".to_string(), "db".to_string())]);
    assert_eq!(c.membership.label_service_ids(), [1]);
    // New labels are another SLO: the old service goes, a new one comes.
    let slower = [("isolator.class", "latency"), ("isolator.p999", "30ms")];
    table.apply(&ContainerUpdate::Upsert(info(1, "db", &slower, true)));
    let ev = c.refresh(&hierarchy, &paths, &table, 4);
    assert_eq!(
        outcomes(&ev),
        [
            ("released".to_string(), "db".to_string()),
            ("applied".into(), "db".into())
        ]
    );
    assert_eq!(said(&ev), "service 'db' let go: its labels changed");
    assert_eq!(c.membership.label_service_ids(), [2]);

    // Docker says db stopped while its cgroup is still there: let go now.
    table.apply(&ContainerUpdate::Upsert(info(1, "db", &slo, false)));
    let ev = c.refresh(&hierarchy, &paths, &table, 5);
    assert_eq!(outcomes(&ev), [("released".to_string(), "db".to_string())]);
    assert_eq!(
        said(&ev),
        "service 'db' let go: its container stopped or no longer carries valid labels"
    );
    assert!(c.membership.label_service_ids().is_empty());
    assert!(
        c.membership.services_with_targets().iter().all(|&s| s < 1),
        "only 'web' left"
    );

    // Started again: a new service (ids are never reused).
    table.apply(&ContainerUpdate::Upsert(info(1, "db", &slo, true)));
    let ev = c.refresh(&hierarchy, &paths, &table, 6);
    assert_eq!(outcomes(&ev), [("applied".to_string(), "db".to_string())]);
    // db (renamed twice, kept), db with new labels, and now this one.
    assert_eq!(c.membership.label_service_ids(), [3]);

    // Renamed into the config's glob: the config wins, and the release says why.
    table.apply(&ContainerUpdate::Upsert(info(1, "web2", &slo, true)));
    let ev = c.refresh(&hierarchy, &paths, &table, 7);
    assert_eq!(
        outcomes(&ev),
        [
            ("overridden".to_string(), "web2".to_string()),
            ("released".into(), "web2".into())
        ]
    );
    assert!(ev.iter().any(|e| matches!(e, Event::LabelSlo(l)
        if l.message == "service 'db' let go: the config's service 'web' claims its container now")));
    assert!(c.membership.label_service_ids().is_empty());
}

#[test]
fn pod_label_services_follow_what_containerd_says() {
    use crate::identify::containers::PodMember;
    let hierarchy = IoHierarchy {
        mode: CgroupMode::V1,
        root: "/nonexistent-isolator-test".into(),
        io_enabled: true,
    };
    // The config claims pod 'db' in namespace 'shop' by name.
    let config = Config::parse(
        "c.toml",
        "[[service]]\nname='db'\nnamespace='shop'\npod='db'\nclass='best-effort'\n",
    )
    .unwrap();
    let policy = crate::policy::by_name("adaptive", 0.75).unwrap();
    let mut c = Controller::new(config, policy, Enforcer::new(hierarchy.clone(), None));
    let id = container_id;
    let uid = |pod: &str| format!("{:0>8}-0000-0000-0000-000000000000", pod.len());
    let info = |n: u8, pod: &str, container: Option<&str>, labels: &[(&str, &str)], running| {
        let name = match container {
            Some(k) => format!("shop/{pod}/{k}"),
            None => format!("shop/{pod}"),
        };
        ContainerInfo {
            runtime: Runtime::Containerd,
            pod: Some(PodMember {
                namespace: "shop".into(),
                name: pod.into(),
                uid: uid(pod),
                container: container.map(str::to_string),
            }),
            ..docker_container(n, &name, labels, running)
        }
    };
    let slo = [("isolator.class", "latency"), ("isolator.p999", "20ms")];
    let mut table = ContainerTable::default();
    table.apply(&ContainerUpdate::Connected {
        runtime: Runtime::Containerd,
        version: "1.6".into(),
        containers: vec![
            // Pod 'web' (uid 3): its sandbox declares the SLO, its container does I/O.
            info(1, "web", None, &slo, true),
            info(2, "web", Some("app"), &[], true),
            // Pod 'db' (uid 2) declares one too, but the config claims it.
            info(3, "db", None, &slo, true),
            info(4, "db", Some("pg"), &[], true),
            // Pod 'cache' (uid 5) declares a malformed one.
            info(5, "cache", None, &[("isolator.class", "fast")], true),
        ],
    });
    // containerd's own layout (no pod cgroups): the pods' containers are the pods'.
    let paths: Vec<String> = (1..=5).map(|n| format!("/k8s.io/{}", id(n))).collect();
    let ev = c.refresh(&hierarchy, &paths, &table, 1);
    let mut got = outcomes(&ev);
    got.sort();
    assert_eq!(
        got,
        [
            ("applied".to_string(), "shop/web".to_string()),
            ("invalid".into(), "shop/cache".into()),
            ("overridden".into(), "shop/db".into()),
        ]
    );
    let pod_uids: Vec<Option<String>> = ev
        .iter()
        .filter_map(|e| match e {
            Event::LabelSlo(l) => Some(l.pod_uid.clone()),
            _ => None,
        })
        .collect();
    assert!(pod_uids.iter().all(Option::is_some), "{pod_uids:?}");
    let [web] = c.membership.label_service_ids()[..] else {
        panic!("one label service")
    };
    // The pod's service takes the pod's cgroups: its sandbox's and its container's.
    let targets: Vec<&str> = c
        .membership
        .targets(web)
        .iter()
        .map(|t| t.path.as_str())
        .collect();
    assert_eq!(targets, [paths[0].as_str(), paths[1].as_str()]);
    assert!(outcomes(&c.refresh(&hierarchy, &paths, &table, 2)).is_empty());

    // The sandbox stops: the pod's service is let go.
    table.apply(&ContainerUpdate::Upsert(info(1, "web", None, &slo, false)));
    let ev = c.refresh(&hierarchy, &paths, &table, 3);
    assert_eq!(
        outcomes(&ev),
        [("released".to_string(), "shop/web".to_string())]
    );
    assert!(c.membership.label_service_ids().is_empty());

    // The kubelet's layout: the pod's cgroup is the target, its containers below it.
    table.apply(&ContainerUpdate::Upsert(info(1, "web", None, &slo, true)));
    let pod_dir = format!("/kubepods/burstable/pod{}", uid("web"));
    let paths = vec![
        pod_dir.clone(),
        format!("{pod_dir}/{}", id(1)),
        format!("{pod_dir}/{}", id(2)),
    ];
    let ev = c.refresh(&hierarchy, &paths, &table, 4);
    assert_eq!(
        outcomes(&ev),
        [("applied".to_string(), "shop/web".to_string())]
    );
    let [web] = c.membership.label_service_ids()[..] else {
        panic!("one label service")
    };
    let targets: Vec<&str> = c
        .membership
        .targets(web)
        .iter()
        .map(|t| t.path.as_str())
        .collect();
    assert_eq!(targets, [pod_dir.as_str()]);
}

// --- Planning and enforcement on an in-memory host (no root, no real cgroups). ---

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{Arc, Mutex},
};

use isolator_common::kernel_dev;

use crate::{
    enforcer::{fake_host::FakeHost, Journal},
    policy::{Cause, Decision, Knob},
};

const DEV: u32 = kernel_dev(8, 0);

/// A policy that decides what the test tells it to, and notes whom it forgot.
#[derive(Clone, Default)]
struct Scripted {
    next: Arc<Mutex<Vec<Decision>>>,
    forgotten: Arc<Mutex<Vec<ServiceId>>>,
}

impl Policy for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn decide(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        let mut next = self.next.lock().unwrap();
        let (now, later) = next.drain(..).partition(|x| x.dev == d.dev);
        *next = later;
        now
    }
    fn forget_service(&mut self, id: ServiceId) {
        self.forgotten.lock().unwrap().push(id);
    }
}

/// A private scratch directory for a journal, removed at the end.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> ScratchDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "isolator-control-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A controller on a fake host, with a scripted policy.
struct Rig {
    // Dropped first: an enforcer that still holds limits restores them on drop.
    controller: Controller,
    host: FakeHost,
    policy: Scripted,
    _journal: Option<ScratchDir>,
    cycle: u64,
    /// What the container runtime says (empty unless a test tells it something).
    containers: ContainerTable,
}

enum Run {
    Enforcing,
    DryRun,
}

impl Rig {
    /// `cgroups` exist on the host before the first refresh.
    fn new(mode: CgroupMode, config: &str, cgroups: &[&str], run: Run) -> Rig {
        Rig::with_policy(mode, config, cgroups, run, None)
    }

    fn with_policy(
        mode: CgroupMode,
        config: &str,
        cgroups: &[&str],
        run: Run,
        policy: Option<Box<dyn Policy>>,
    ) -> Rig {
        let host = FakeHost::new(mode);
        for c in cgroups {
            host.add_cgroup(c);
        }
        let (journal, dir) = match run {
            Run::Enforcing => {
                let dir = ScratchDir::new();
                (Some(Journal::open(&dir.0).unwrap()), Some(dir))
            }
            Run::DryRun => (None, None),
        };
        let enforcer = Enforcer::new(host.hierarchy(), journal)
            .with_host_files(Box::new(host.clone()), Box::new(host.clone()));
        let scripted = Scripted::default();
        let policy = policy.unwrap_or_else(|| Box::new(scripted.clone()));
        let config = Config::parse("c.toml", config).unwrap();
        let mut rig = Rig {
            controller: Controller::new(config, policy, enforcer),
            host,
            policy: scripted,
            _journal: dir,
            cycle: 0,
            containers: ContainerTable::default(),
        };
        rig.refresh();
        rig
    }

    fn refresh(&mut self) -> Vec<Event> {
        let paths = self.host.cgroup_paths();
        let hierarchy = self.host.hierarchy();
        self.controller
            .refresh(&hierarchy, &paths, &self.containers, self.cycle)
    }

    /// One cycle on DEV in which the policy decides `decisions`.
    fn decide(&mut self, decisions: Vec<Decision>) -> Vec<Event> {
        self.cycle += 1;
        *self.policy.next.lock().unwrap() = decisions;
        let idle = DeviceCycle {
            cycle: self.cycle,
            dev: DEV,
            interval_s: 1.0,
            utilization: 0.0,
            services: vec![],
            throttle_wait_timed: true,
        };
        self.controller.step(&[idle], &mut |_| None)
    }

    /// The limit the controller has recorded for a service on DEV.
    fn recorded(&self, sid: ServiceId) -> IoMaxLimit {
        self.controller
            .states
            .get(&(sid, DEV))
            .map(|s| s.limit)
            .unwrap_or_default()
    }

    fn journal_len(&self) -> usize {
        self.controller
            .enforcement
            .enforcer()
            .journal_entries()
            .len()
    }
}

fn decision(service: ServiceId, knob: Knob, to: Option<u64>) -> Decision {
    Decision {
        service,
        dev: DEV,
        knob,
        to,
        reason: "test".into(),
        cause: Cause::default(),
    }
}

/// The event as its JSON object.
fn json(e: &Event) -> serde_json::Value {
    serde_json::to_value(e).unwrap()
}

fn of_type(events: &[Event], ty: &str) -> Vec<serde_json::Value> {
    events
        .iter()
        .map(json)
        .filter(|v| v["type"] == ty)
        .collect()
}

fn error_codes(events: &[Event]) -> Vec<String> {
    of_type(events, "error")
        .iter()
        .map(|e| e["code"].as_str().unwrap().to_string())
        .collect()
}

const BATCH: &str = "[[service]]\nname='batch'\ncgroup='/batch/*'\nclass='best-effort'\n";
const BATCH_CGROUPS: [&str; 3] = ["/batch/a", "/batch/b", "/batch/c"];
const MIB: u64 = 1 << 20;

#[test]
fn a_decision_is_split_over_the_services_cgroups_and_written_to_each() {
    let mut rig = Rig::new(CgroupMode::V2, BATCH, &BATCH_CGROUPS, Run::Enforcing);
    // 30 MiB/s over three cgroups: 10 MiB/s each.
    let ev = rig.decide(vec![decision(0, Knob::Wbps, Some(30 * MIB))]);
    let d = &of_type(&ev, "decision")[0];
    assert_eq!(d["cgroups"], serde_json::json!(BATCH_CGROUPS));
    assert_eq!(
        (d["old"].as_str(), d["new"].as_str()),
        (Some("max"), Some("10485760"))
    );
    assert_eq!(
        (d["applied"].as_bool(), d["reason"].as_str()),
        (Some(true), Some("test"))
    );
    for cg in BATCH_CGROUPS {
        assert_eq!(
            rig.host.read_knob(cg, "io.max"),
            "8:0 rbps=max wbps=10485760 riops=max wiops=max\n"
        );
    }
    assert_eq!(rig.recorded(0).wbps, Some(30 * MIB));
    // 2 MiB/s over three would be under the minimum: 1 MiB/s each, and the decision says so.
    let ev = rig.decide(vec![decision(0, Knob::Wbps, Some(2 * MIB))]);
    let d = &of_type(&ev, "decision")[0];
    let reason = d["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("test; split over 3 cgroups at the minimum of 1048576 B/s each"),
        "{reason}"
    );
    assert_eq!(d["new"], "1048576");
    for cg in BATCH_CGROUPS {
        assert_eq!(
            rig.host.read_knob(cg, "io.max"),
            "8:0 rbps=max wbps=1048576 riops=max wiops=max\n"
        );
    }
    // The service's recorded limit is what was decided for it as a whole.
    assert_eq!(rig.recorded(0).wbps, Some(2 * MIB));
    assert!(error_codes(&ev).is_empty());
}

#[test]
fn a_rejected_write_keeps_the_recorded_limit_and_is_an_error() {
    let mut rig = Rig::new(CgroupMode::V2, BATCH, &BATCH_CGROUPS, Run::Enforcing);
    rig.decide(vec![decision(0, Knob::Wbps, Some(30 * MIB))]);
    rig.host.reject_writes("/batch/b", "io.max", libc::EINVAL);
    let ev = rig.decide(vec![decision(0, Knob::Wbps, Some(15 * MIB))]);
    let d = &of_type(&ev, "decision")[0];
    assert_eq!(d["applied"], false);
    let errors = of_type(&ev, "error");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["code"], "write_rejected");
    let message = errors[0]["message"].as_str().unwrap();
    assert!(
        message.contains("service 'batch', cgroup /batch/b, 8:0 wbps")
            && message.contains("EINVAL"),
        "{message}"
    );
    assert_eq!(rig.recorded(0).wbps, Some(30 * MIB), "unchanged");
    // The others took it; the rejected one holds what it held.
    assert!(rig
        .host
        .read_knob("/batch/a", "io.max")
        .contains("wbps=5242880"));
    assert!(rig
        .host
        .read_knob("/batch/b", "io.max")
        .contains("wbps=10485760"));
    // Every cycle it is decided again, it is said again: the write may work next time.
    let ev = rig.decide(vec![decision(0, Knob::Wbps, Some(15 * MIB))]);
    assert_eq!(error_codes(&ev), ["write_rejected"]);
}

#[test]
fn a_knob_someone_else_changed_is_said_once_and_not_rewritten() {
    let mut rig = Rig::new(CgroupMode::V2, BATCH, &BATCH_CGROUPS, Run::Enforcing);
    rig.decide(vec![decision(0, Knob::Wbps, Some(30 * MIB))]);
    let theirs = "8:0 rbps=max wbps=123456 riops=max wiops=max\n";
    rig.host.set_knob("/batch/a", "io.max", theirs);
    let ev = rig.decide(vec![decision(0, Knob::Wbps, Some(60 * MIB))]);
    assert_eq!(error_codes(&ev), ["changed_by_other"]);
    let message = of_type(&ev, "error")[0]["message"].clone();
    assert!(message.as_str().unwrap().contains("/batch/a"), "{message}");
    // Not a failed decision: the others took it, and the service's limit is the new one.
    assert_eq!(of_type(&ev, "decision")[0]["applied"], true);
    assert_eq!(rig.recorded(0).wbps, Some(60 * MIB));
    let written_to_a = |rig: &Rig| {
        let file = rig.host.dir("/batch/a").join("io.max");
        rig.host.writes().iter().filter(|(f, _)| *f == file).count()
    };
    let before = written_to_a(&rig);
    for to in [90 * MIB, 3 * MIB] {
        let ev = rig.decide(vec![decision(0, Knob::Wbps, Some(to))]);
        assert!(error_codes(&ev).is_empty(), "said once: {ev:?}");
        assert_eq!(rig.host.read_knob("/batch/a", "io.max"), theirs);
    }
    assert_eq!(written_to_a(&rig), before, "never written again");
    assert!(rig
        .host
        .read_knob("/batch/b", "io.max")
        .contains("wbps=1048576"));
}

#[test]
fn a_service_matching_no_cgroup_is_said_once() {
    let config = "[[service]]\nname='gone'\ncgroup='/gone'\nclass='best-effort'\n";
    let mut rig = Rig::new(CgroupMode::V2, config, &["/other"], Run::Enforcing);
    let ev = rig.decide(vec![decision(0, Knob::Rbps, Some(10 * MIB))]);
    assert_eq!(ev.len(), 1, "no decision, one error: {ev:?}");
    assert_eq!(error_codes(&ev), ["no_cgroup"]);
    let ev = rig.decide(vec![decision(0, Knob::Rbps, Some(10 * MIB))]);
    assert!(ev.is_empty(), "{ev:?}");
    assert!(rig.host.writes().is_empty());
}

#[test]
fn a_recreated_cgroup_starts_its_service_over_and_closes_its_journal_entries() {
    let config = "[[service]]\nname='db'\ncgroup='/db'\nclass='best-effort'\n";
    let mut rig = Rig::new(CgroupMode::V2, config, &["/db"], Run::Enforcing);
    rig.decide(vec![decision(0, Knob::Wbps, Some(50 * MIB))]);
    assert_eq!(rig.journal_len(), 1);
    assert_eq!(rig.recorded(0).wbps, Some(50 * MIB));
    let writes = rig.host.writes().len();
    let old_ino = rig.host.ino("/db");
    let new_ino = rig.host.recreate_cgroup("/db");
    assert_ne!(old_ino, new_ino);
    let ev = rig.refresh();
    let restores = of_type(&ev, "restore");
    assert_eq!(restores.len(), 1, "{ev:?}");
    assert_eq!(
        (
            restores[0]["reason"].as_str(),
            restores[0]["result"].as_str()
        ),
        (Some("released"), Some("recreated"))
    );
    assert_eq!(rig.journal_len(), 0, "closed");
    assert_eq!(
        rig.host.writes().len(),
        writes,
        "the new cgroup is not written"
    );
    assert_eq!(rig.host.read_knob("/db", "io.max"), "");
    // Starts over: no limit remembered, and the policy forgot it.
    assert!(rig.recorded(0).is_unlimited());
    assert!(!rig.controller.states.keys().any(|&(s, _)| s == 0));
    assert_eq!(*rig.policy.forgotten.lock().unwrap(), [0]);
    assert_eq!(
        rig.controller.membership.targets(0)[0].ino,
        new_ino,
        "limits go on the new cgroup"
    );
    // A refresh with nothing changed starts nothing over.
    assert!(rig.refresh().is_empty());
    assert_eq!(rig.policy.forgotten.lock().unwrap().len(), 1);
}

#[test]
fn a_renamed_container_keeps_its_limit_its_journal_entry_and_its_policy_state() {
    let cgroup = format!("/docker/{}", container_id(7));
    let config = "[[service]]\nname='web'\ncgroup='/web'\nclass='best-effort'\n";
    let mut rig = Rig::new(CgroupMode::V2, config, &["/web", &cgroup], Run::Enforcing);
    let backup = |name: &str| docker_container(7, name, &[("isolator.class", "best-effort")], true);
    rig.containers.apply(&ContainerUpdate::Connected {
        runtime: Runtime::Docker,
        version: "1.41".into(),
        containers: vec![backup("backup")],
    });
    let ev = rig.refresh();
    assert_eq!(
        outcomes(&ev),
        [("applied".to_string(), "backup".to_string())]
    );
    rig.decide(vec![decision(1, Knob::Wbps, Some(50 * MIB))]);
    let capped = "8:0 rbps=max wbps=52428800 riops=max wiops=max\n";
    assert_eq!(rig.host.read_knob(&cgroup, "io.max"), capped);
    let writes = rig.host.writes().len();

    rig.containers
        .apply(&ContainerUpdate::Upsert(backup("nightly-backup")));
    let ev = rig.refresh();
    assert_eq!(
        outcomes(&ev),
        [("renamed".to_string(), "nightly-backup".to_string())]
    );
    // Nothing given back, nothing written, nothing forgotten: the cap holds through it.
    assert!(of_type(&ev, "restore").is_empty(), "{ev:?}");
    assert_eq!(rig.host.writes().len(), writes);
    assert_eq!(rig.host.read_knob(&cgroup, "io.max"), capped);
    assert_eq!(rig.journal_len(), 1);
    assert_eq!(rig.recorded(1).wbps, Some(50 * MIB));
    assert!(rig.policy.forgotten.lock().unwrap().is_empty());
    // The next decision names the service by its new name.
    let ev = rig.decide(vec![decision(1, Knob::Wbps, Some(40 * MIB))]);
    assert_eq!(of_type(&ev, "decision")[0]["service"], "nightly-backup");

    // Stopped: let go, and its cap given back.
    rig.containers
        .apply(&ContainerUpdate::Upsert(ContainerInfo {
            running: false,
            ..backup("nightly-backup")
        }));
    let ev = rig.refresh();
    assert_eq!(
        outcomes(&ev),
        [("released".to_string(), "nightly-backup".to_string())]
    );
    assert_eq!(of_type(&ev, "restore").len(), 1, "{ev:?}");
    assert_eq!(rig.journal_len(), 0);
    assert_eq!(*rig.policy.forgotten.lock().unwrap(), [1]);
}

#[test]
fn a_cgroup_that_joins_a_limited_service_gets_its_share_and_its_weight_at_once() {
    let config = format!("{BATCH}weight=300\n");
    let mut rig = Rig::new(CgroupMode::V2, &config, &BATCH_CGROUPS, Run::Enforcing);
    rig.controller.apply_weights(0);
    rig.decide(vec![decision(0, Knob::Wbps, Some(30 * MIB))]);
    let changed = rig.controller.states[&(0, DEV)].changed_cycle;
    // A fourth cgroup joins: the 30 MiB/s the service holds is spread over four, on the
    // refresh that finds it, not at the policy's next decision.
    rig.host.add_cgroup("/batch/d");
    let ev = rig.refresh();
    assert!(error_codes(&ev).is_empty(), "{ev:?}");
    let quarter = "8:0 rbps=max wbps=7864320 riops=max wiops=max\n";
    for cg in ["/batch/a", "/batch/b", "/batch/c", "/batch/d"] {
        assert_eq!(rig.host.read_knob(cg, "io.max"), quarter, "{cg}");
    }
    assert_eq!(rig.host.read_knob("/batch/d", "io.weight"), "default 300\n");
    let decisions = of_type(&ev, "decision");
    let knobs: Vec<(&str, &str)> = decisions
        .iter()
        .map(|d| {
            (
                d["knob"].as_str().unwrap(),
                d["cgroups"][0].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(knobs, [("weight", "/batch/d"), ("wbps", "/batch/a")]);
    let spread = &decisions[1];
    assert_eq!(spread["cgroups"].as_array().unwrap().len(), 4);
    assert_eq!(
        (spread["old"].as_str(), spread["new"].as_str()),
        (Some("10485760"), Some("7864320"))
    );
    assert!(
        spread["reason"]
            .as_str()
            .unwrap()
            .contains("spread again over the 4"),
        "{spread}"
    );
    // The service's limit as a whole, its policy and its last change are as they were.
    assert_eq!(rig.recorded(0).wbps, Some(30 * MIB));
    assert_eq!(rig.controller.states[&(0, DEV)].changed_cycle, changed);
    assert!(rig.policy.forgotten.lock().unwrap().is_empty());
    // It leaves again: its knobs go back (its journal entries closed), the three left get a
    // third each, and the service does not start over.
    rig.host.remove_cgroup("/batch/d");
    let ev = rig.refresh();
    assert_eq!(
        of_type(&ev, "restore").len(),
        2,
        "weight and io.max: {ev:?}"
    );
    for cg in BATCH_CGROUPS {
        assert!(
            rig.host.read_knob(cg, "io.max").contains("wbps=10485760"),
            "{cg}"
        );
    }
    assert_eq!(rig.recorded(0).wbps, Some(30 * MIB));
    assert!(rig.policy.forgotten.lock().unwrap().is_empty());
    // Lifted by the policy, then nothing is left anywhere once restored.
    rig.decide(vec![decision(0, Knob::Wbps, None)]);
    rig.controller.restore_all("stop");
    assert_eq!(rig.journal_len(), 0);
    for cg in BATCH_CGROUPS {
        assert_eq!(rig.host.read_knob(cg, "io.max"), "", "{cg}");
    }
}

#[test]
fn iocost_goes_on_where_the_config_asks_and_is_put_back_at_stop() {
    let config = format!("{BATCH}weight=300\n[iocost]\ndisks = ['sda']\n");
    let mut rig = Rig::new(CgroupMode::V2, &config, &BATCH_CGROUPS, Run::Enforcing);
    // Another disk's iocost, the operator's: never touched.
    let theirs = "8:16 enable=1 ctrl=user rpct=95.00 rlat=5000\n";
    rig.host.set_knob("/", "io.cost.qos", theirs);
    let ev = rig.controller.apply_iocost(0, &[DEV]);
    assert!(error_codes(&ev).is_empty(), "{ev:?}");
    let d = &of_type(&ev, "decision")[0];
    assert_eq!(
        (&d["knob"], &d["dev"], &d["old"], &d["new"], &d["applied"]),
        (
            &serde_json::json!("iocost"),
            &serde_json::json!("8:0"),
            &serde_json::json!("0"),
            &serde_json::json!("1"),
            &serde_json::json!(true)
        )
    );
    let on = rig.host.read_knob("/", "io.cost.qos");
    assert!(on.contains("8:0 enable=1 "), "{on}");
    assert!(on.starts_with(theirs), "{on}");
    // The weights then act there.
    rig.controller.apply_weights(0);
    assert_eq!(rig.host.read_knob("/batch/a", "io.weight"), "default 300\n");
    rig.controller.restore_all("stop");
    assert_eq!(rig.journal_len(), 0);
    let off = rig.host.read_knob("/", "io.cost.qos");
    assert!(off.contains("8:0 enable=0 "), "{off}");
    assert!(off.starts_with(theirs), "{off}");
}

#[test]
fn iocost_someone_else_enabled_is_theirs_and_stays_on_after_stop() {
    let config = format!("{BATCH}[iocost]\ndisks = ['sda']\n");
    let mut rig = Rig::new(CgroupMode::V2, &config, &BATCH_CGROUPS, Run::Enforcing);
    let theirs = "8:0 enable=1 ctrl=user rpct=95.00 rlat=5000\n";
    rig.host.set_knob("/", "io.cost.qos", theirs);
    let ev = rig.controller.apply_iocost(0, &[DEV]);
    assert!(error_codes(&ev).is_empty(), "{ev:?}");
    // Already on: nothing journaled or written, so nothing to put back.
    assert_eq!(rig.journal_len(), 0);
    rig.controller.restore_all("stop");
    assert_eq!(rig.host.read_knob("/", "io.cost.qos"), theirs);
    // The agent turned it on, then the operator turned it off with settings of their
    // own: theirs, left as they are at stop.
    rig.host.set_knob(
        "/",
        "io.cost.qos",
        "8:0 enable=0 ctrl=auto rpct=0.00 rlat=25000\n",
    );
    rig.controller.apply_iocost(1, &[DEV]);
    assert_eq!(rig.journal_len(), 1);
    rig.host.set_knob(
        "/",
        "io.cost.qos",
        "8:0 enable=0 ctrl=user rpct=99.00 rlat=9000\n",
    );
    let ev = rig.controller.restore_all("stop");
    assert_eq!(rig.journal_len(), 0, "{ev:?}");
    assert_eq!(
        rig.host.read_knob("/", "io.cost.qos"),
        "8:0 enable=0 ctrl=user rpct=99.00 rlat=9000\n",
        "no write after theirs"
    );
}

#[test]
fn a_dry_run_enables_no_iocost() {
    let config = format!("{BATCH}[iocost]\ndisks = ['sda']\n");
    let mut rig = Rig::new(CgroupMode::V2, &config, &BATCH_CGROUPS, Run::DryRun);
    let ev = rig.controller.apply_iocost(0, &[DEV]);
    assert_eq!(of_type(&ev, "decision")[0]["applied"], false);
    assert_eq!(rig.host.read_knob("/", "io.cost.qos"), "");
}

#[test]
fn a_config_service_whose_cgroup_appears_later_gets_its_weight() {
    let config = "[[service]]\nname='db'\ncgroup='/db'\nclass='best-effort'\nweight=200\n";
    let mut rig = Rig::new(CgroupMode::V1, config, &["/other"], Run::Enforcing);
    assert!(
        rig.controller.apply_weights(0).is_empty(),
        "nothing to write on yet"
    );
    rig.host.add_cgroup("/db");
    let ev = rig.refresh();
    assert_eq!(of_type(&ev, "decision").len(), 1, "{ev:?}");
    assert_eq!(rig.host.read_knob("/db", "blkio.bfq.weight"), "200\n");
    // Said once: the next refresh finds nothing new.
    assert!(rig.refresh().is_empty());
}

#[test]
fn restore_all_puts_back_exactly_what_was_written_and_nothing_else() {
    for mode in [CgroupMode::V1, CgroupMode::V2] {
        let config = format!("{BATCH}weight=300\n");
        let mut rig = Rig::new(mode, &config, &BATCH_CGROUPS, Run::Enforcing);
        rig.host.add_cgroup("/other");
        // Values of others', on files and devices the agent also writes.
        let (file, line) = match mode {
            CgroupMode::V2 => ("io.max", "8:16 rbps=5 wbps=max riops=max wiops=max\n"),
            CgroupMode::V1 => ("blkio.throttle.write_bps_device", "8:16 5\n"),
        };
        rig.host.set_knob("/batch/a", file, line);
        let before = rig.host.knob_files();
        let mut ev = rig.controller.apply_weights(0);
        ev.extend(rig.decide(vec![
            decision(0, Knob::Wbps, Some(30 * MIB)),
            decision(0, Knob::Riops, Some(300)),
        ]));
        ev.extend(rig.decide(vec![decision(0, Knob::Wbps, Some(60 * MIB))]));
        assert!(error_codes(&ev).is_empty(), "{ev:?}");
        let written: BTreeSet<PathBuf> = rig.host.writes().into_iter().map(|(f, _)| f).collect();
        // Weight, and wbps and riops (one file on v2, two on v1), on each cgroup.
        let per_cgroup = if mode == CgroupMode::V2 { 2 } else { 3 };
        assert_eq!(written.len(), per_cgroup * 3, "{written:?}");
        assert_ne!(rig.host.knob_files(), before);
        let n = rig.host.writes().len();
        let restores = rig.controller.restore_all("stop");
        // One per knob: weight, wbps, riops on each cgroup.
        assert_eq!(restores.len(), 9, "{restores:?}");
        assert!(of_type(&restores, "restore")
            .iter()
            .all(|r| r["result"] == "restored" && r["reason"] == "stop"));
        assert_eq!(rig.host.knob_files(), before, "{mode:?}");
        let restored: BTreeSet<PathBuf> = rig.host.writes()[n..]
            .iter()
            .map(|(f, _)| f.clone())
            .collect();
        assert_eq!(restored, written, "only the files written");
        assert_eq!(rig.journal_len(), 0);
        assert!(
            rig.controller.restore_all("stop").is_empty(),
            "nothing left"
        );
    }
}

#[test]
fn a_dry_run_writes_nothing_and_reports_the_same_decisions() {
    let script = [
        vec![decision(0, Knob::Wbps, Some(30 * MIB))],
        vec![
            decision(0, Knob::Wbps, Some(2 * MIB)),
            decision(0, Knob::Riops, Some(90)),
        ],
        vec![decision(0, Knob::Wbps, None)],
    ];
    // What a decision says, but for what the cgroup held before (a dry run's cgroups
    // still hold their originals) and whether it was applied.
    let decided = |events: &[Event]| {
        of_type(events, "decision")
            .into_iter()
            .map(|mut d| {
                let o = d.as_object_mut().unwrap();
                o.remove("old");
                o.remove("applied");
                d
            })
            .collect::<Vec<_>>()
    };
    let mut real = Rig::new(CgroupMode::V2, BATCH, &BATCH_CGROUPS, Run::Enforcing);
    let mut dry = Rig::new(CgroupMode::V2, BATCH, &BATCH_CGROUPS, Run::DryRun);
    let files = dry.host.knob_files();
    for decisions in script {
        let r = real.decide(decisions.clone());
        let d = dry.decide(decisions);
        assert_eq!(decided(&d), decided(&r));
        assert!(of_type(&d, "decision")
            .iter()
            .all(|d| d["applied"] == false));
        assert!(of_type(&r, "decision").iter().all(|d| d["applied"] == true));
        assert_eq!(dry.recorded(0), real.recorded(0));
    }
    assert!(!real.host.writes().is_empty());
    assert!(dry.host.writes().is_empty());
    assert_eq!(dry.host.knob_files(), files);
    assert!(dry.controller.restore_all("stop").is_empty());
}

#[test]
fn v1_and_v2_take_their_own_files_and_lines() {
    let config = "[[service]]\nname='db'\ncgroup='/db'\nclass='best-effort'\nweight=2000\n";
    let want: [(CgroupMode, &[(&str, &str)]); 2] = [
        (
            CgroupMode::V2,
            &[
                ("io.weight", "default 2000\n"),
                ("io.max", "8:0 rbps=10485760\n"),
                ("io.max", "8:0 wiops=100\n"),
                ("io.max", "8:0 rbps=max\n"),
            ],
        ),
        (
            CgroupMode::V1,
            &[
                // bfq's weights stop at 1000.
                ("blkio.bfq.weight", "1000\n"),
                ("blkio.throttle.read_bps_device", "8:0 10485760\n"),
                ("blkio.throttle.write_iops_device", "8:0 100\n"),
                ("blkio.throttle.read_bps_device", "8:0 0\n"),
            ],
        ),
    ];
    for (mode, lines) in want {
        let mut rig = Rig::new(mode, config, &["/db"], Run::Enforcing);
        let mut ev = rig.controller.apply_weights(0);
        ev.extend(rig.decide(vec![
            decision(0, Knob::Rbps, Some(10 * MIB)),
            decision(0, Knob::Wiops, Some(100)),
        ]));
        ev.extend(rig.decide(vec![decision(0, Knob::Rbps, None)]));
        let dir = rig.host.dir("/db");
        let got: Vec<(PathBuf, String)> = rig.host.writes();
        let want: Vec<(PathBuf, String)> = lines
            .iter()
            .map(|(f, l)| (dir.join(f), l.to_string()))
            .collect();
        assert_eq!(got, want, "{mode:?}");
        // What the decisions say is in the mode's terms too.
        let news: Vec<String> = of_type(&ev, "decision")
            .iter()
            .map(|d| {
                format!(
                    "{} {}",
                    d["knob"].as_str().unwrap(),
                    d["new"].as_str().unwrap()
                )
            })
            .collect();
        let unlimited = if mode == CgroupMode::V2 { "max" } else { "0" };
        let weight = if mode == CgroupMode::V2 { 2000 } else { 1000 };
        assert_eq!(
            news,
            [
                format!("weight {weight}"),
                "rbps 10485760".into(),
                "wiops 100".into(),
                format!("rbps {unlimited}"),
            ]
        );
    }
}

#[test]
fn a_partition_takes_no_limit() {
    let config = "[[service]]\nname='db'\ncgroup='/db'\nclass='best-effort'\n";
    let mut rig = Rig::new(CgroupMode::V2, config, &["/db"], Run::Enforcing);
    rig.host.add_partition("8:0");
    let ev = rig.decide(vec![decision(0, Knob::Rbps, Some(10 * MIB))]);
    assert_eq!(error_codes(&ev), ["partition"]);
    assert!(rig.host.writes().is_empty());
    assert!(rig.recorded(0).is_unlimited());
}

#[test]
fn step_on_a_recorded_device_cycle_sequence_is_deterministic() {
    use crate::policy::sim::{SimDisk, SimService};
    // A latency reader and a best-effort writer that starts at cycle 5, as the policy
    // tests run them; the cycles the simulated disk gave are the recording.
    let mut disk = SimDisk::new(vec![
        SimService::latency("reader", 5.0, 1.0),
        SimService::writer("writer", crate::config::SloClass::BestEffort, 2400.0, 5),
    ]);
    let recorded: Vec<DeviceCycle> = disk
        .run(&mut crate::policy::Adaptive::default(), 40)
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    let config = "[[service]]\nname='reader'\ncgroup='/reader'\nclass='latency'\np999='5ms'\n\
                  [[service]]\nname='writer'\ncgroup='/writer'\nclass='best-effort'\n";
    let run = || {
        let policy = crate::policy::by_name("adaptive", 0.75).unwrap();
        let mut rig = Rig::with_policy(
            CgroupMode::V2,
            config,
            &["/reader", "/writer"],
            Run::Enforcing,
            Some(policy),
        );
        let events: Vec<String> = recorded
            .iter()
            .flat_map(|c| rig.controller.step(std::slice::from_ref(c), &mut |_| None))
            .map(|e| serde_json::to_string(&e).unwrap())
            .collect();
        (events, rig.host.writes(), rig.host.knob_files())
    };
    let first = run();
    assert!(
        first.0.iter().any(|e| e.contains("\"type\":\"decision\"")),
        "the recording makes the policy decide"
    );
    assert!(!first.1.is_empty());
    let second = run();
    assert_eq!(first.0, second.0);
    assert_eq!(first.1, second.1);
    assert_eq!(first.2, second.2);
}

#[test]
fn one_service_is_measured_over_its_cgroups_and_a_limited_idle_one_still_gets_a_say() {
    use isolator_common::{IoKey, OP_READ, OP_WRITE};

    use crate::collect::collector::{KeyDelta, Snapshot};
    let config = format!("{BATCH}[[service]]\nname='db'\ncgroup='/db'\nclass='best-effort'\n");
    let mut rig = Rig::new(
        CgroupMode::V2,
        &config,
        &["/batch/a", "/batch/b", "/db", "/other"],
        Run::DryRun,
    );
    // db holds a limit from an earlier cycle.
    rig.decide(vec![decision(1, Knob::Rbps, Some(10 * MIB))]);
    let delta = |cgroup: &str, op: u32, bytes: u64| KeyDelta {
        key: IoKey {
            cgroup_id: rig.host.ino(cgroup),
            dev: DEV,
            op,
        },
        ios: bytes / 4096,
        bytes,
        ..Default::default()
    };
    let snap = Snapshot {
        cycle: 7,
        interval_ns: 2_000_000_000,
        deltas: vec![
            delta("/batch/a", OP_READ, 4 * MIB),
            delta("/batch/b", OP_READ, 2 * MIB),
            delta("/batch/b", OP_WRITE, 8 * MIB),
            delta("/other", OP_WRITE, 64 * MIB),
        ],
        ..Default::default()
    };
    let paths: HashMap<u64, String> = rig
        .host
        .cgroup_paths()
        .into_iter()
        .map(|p| (rig.host.ino(&p), p))
        .collect();
    let cycles = rig.controller.device_cycles(
        &snap,
        &|id| paths.get(&id).cloned(),
        &ContainerTable::default(),
        &|_| 0.5,
    );
    assert_eq!(cycles.len(), 1);
    let d = &cycles[0];
    assert_eq!(
        (d.cycle, d.dev, d.interval_s, d.utilization),
        (7, DEV, 2.0, 0.5)
    );
    let by_name: BTreeMap<&str, &crate::policy::ServiceLoad> =
        d.services.iter().map(|s| (s.name.as_str(), s)).collect();
    assert_eq!(by_name.keys().copied().collect::<Vec<_>>(), ["batch", "db"]);
    let batch = by_name["batch"];
    assert_eq!(
        (batch.read_bps, batch.write_bps),
        (3.0 * MIB as f64, 4.0 * MIB as f64)
    );
    assert_eq!(batch.read_iops, 6.0 * MIB as f64 / 4096.0 / 2.0);
    let mut ids = vec![rig.host.ino("/batch/a"), rig.host.ino("/batch/b")];
    ids.sort();
    assert_eq!(batch.cgroup_ids, ids);
    let db = by_name["db"];
    assert_eq!((db.bps(), db.limit.rbps), (0.0, Some(10 * MIB)));
    assert_eq!(db.changed_cycle, Some(1));
}

#[test]
fn a_service_with_a_p95_target_is_judged_and_reported_at_its_p95() {
    use isolator_common::histogram::latency_bucket;

    use crate::{
        config::{LatencyQuantile, LatencyTarget, SloClass},
        policy::sim::{SimDisk, SimService},
    };
    let p95 = SloClass::Latency(LatencyTarget {
        quantile: LatencyQuantile::P95,
        target_ns: 3_000_000,
    });
    let mut reader = SimService::latency("reader", 3.0, 1.0);
    reader.class = p95;
    let mut disk = SimDisk::new(vec![
        reader,
        SimService::writer("writer", SloClass::BestEffort, 2400.0, 0),
    ]);
    disk.step();
    let mut c = disk.step();
    // 8 % of the reader's reads took 9 ms or more: its p95 is at 9 ms, its p99.9 at 30.
    let r = &mut c.services[0];
    r.samples = 1000;
    r.latency_hist = vec![
        (latency_bucket(400_000) as u16, 920),
        (latency_bucket(9_000_000) as u16, 60),
        (latency_bucket(30_000_000) as u16, 20),
    ];
    r.p999_ns = Some(30_000_000);
    let config = "[[service]]\nname='reader'\ncgroup='/reader'\nclass='latency'\np95='3ms'\n\
                  [[service]]\nname='writer'\ncgroup='/writer'\nclass='best-effort'\n";
    let policy = crate::policy::by_name("adaptive", 0.75).unwrap();
    let mut rig = Rig::with_policy(
        CgroupMode::V2,
        config,
        &["/reader", "/writer"],
        Run::Enforcing,
        Some(policy),
    );
    let events = rig.controller.step(std::slice::from_ref(&c), &mut |_| None);
    let stats = of_type(&events, "service_stats");
    let reader = stats.iter().find(|e| e["service"] == "reader").unwrap();
    assert_eq!(
        reader["slo"],
        serde_json::json!({"class": "latency", "p95_ns": 3_000_000})
    );
    assert_eq!(reader["state"], "violating");
    assert_eq!(reader["p999_ns"], 30_000_000, "the p99.9 stays the p99.9");
    let p95_ns = reader["slo_latency_ns"].as_u64().unwrap();
    assert!((8_500_000..9_500_000).contains(&p95_ns), "{reader}");
    let writer = stats.iter().find(|e| e["service"] == "writer").unwrap();
    assert!(writer.get("slo_latency_ns").is_none(), "{writer}");
    let start = &of_type(&events, "violation_start")[0];
    assert_eq!(start["latency_ns"].as_u64(), Some(p95_ns));
    assert_eq!(start["p999_ns"], 30_000_000);
    let cut = of_type(&events, "decision");
    let cut = cut.iter().find(|e| e["service"] == "writer").unwrap();
    let cause = &cut["cause"];
    assert_eq!(cause["quantile"], "p95", "{cut}");
    assert_eq!(cause["latency_ns"].as_u64(), Some(p95_ns));
    assert_eq!(cause["slo_latency_ns"], 3_000_000);
    assert_eq!(cause["p999_ns"], 30_000_000);
    assert!(
        cause.get("slo_p999_ns").is_none(),
        "no p99.9 target: {cause}"
    );
}
