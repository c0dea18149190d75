//! Kubernetes pods by name against a real containerd (Debian's package, started here on its
//! own root, state and socket): containers created in namespace `k8s.io` with the kubelet's
//! labels, in the kubelet's cgroupfs layout and in containerd's own (`ctr run`'s default
//! `/k8s.io/<id>`), are named `namespace/pod/container`; a config service matches pods by
//! namespace, name and pod label; a pod-label SLO becomes a service; containerd stopped
//! mid-run is said once and the agent goes on; restarted, it names containers again.

use std::{
    collections::BTreeSet,
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use isolator_tests::{events_doc, *};
use serde_json::Value;

const IMAGE: &str = "docker.io/library/isolator-loadgen:test";
const NAMESPACE: &str = "k8s.io";

/// A 64-hex id, as the kubelet's containers have.
fn container_id() -> String {
    let u = unique("c");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let digest = run_ok(Command::new("sh").args([
        "-c",
        &format!("printf '%s' '{u}-{nanos}' | sha256sum | cut -c1-64"),
    ]))
    .trim()
    .to_string();
    assert_eq!(digest.len(), 64, "sha256sum gave {digest:?}");
    digest
}

/// A pod UID as the API server spells it.
fn pod_uid() -> String {
    let id = container_id();
    format!(
        "{}-{}-{}-{}-{}",
        &id[..8],
        &id[8..12],
        &id[12..16],
        &id[16..20],
        &id[20..32]
    )
}

/// A private containerd: its own config, root, state, socket and runc root under a scratch
/// directory, the CRI plugin off. Everything it made (tasks, containers, the image, its
/// mounts, the cgroup directories runc made) is removed on drop.
struct Containerd {
    child: Option<Child>,
    scratch: Scratch,
    socket: PathBuf,
    /// Cgroup directories that did not exist before the test (removed deepest first).
    cgroup_dirs: Vec<PathBuf>,
    /// The shims' socket directory (containerd 1.6 puts it at /run/containerd/s whatever
    /// its config says), and its parent, when they did not exist before the test.
    shim_dirs: Vec<PathBuf>,
    containers: Vec<String>,
}

impl Containerd {
    fn start() -> Containerd {
        for tool in ["containerd", "ctr", "sha256sum", "tar"] {
            require_tool(tool);
        }
        assert!(
            std::path::Path::new("/bin/busybox").exists(),
            "/bin/busybox is missing: run scripts/bootstrap.sh (installs busybox-static)"
        );
        let scratch = Scratch::new();
        let socket = scratch.path("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"#,
            root = scratch.path("root").display(),
            state = scratch.path("state").display(),
            sock = socket.display(),
            opt = scratch.path("opt").display(),
        );
        std::fs::write(scratch.path("config.toml"), config).unwrap();
        std::fs::create_dir_all(scratch.path("data")).unwrap();
        let shim_dirs = ["/run/containerd/s", "/run/containerd"]
            .map(PathBuf::from)
            .into_iter()
            .filter(|d| !d.exists())
            .collect();
        let mut d = Containerd {
            child: None,
            scratch,
            socket,
            cgroup_dirs: vec![],
            shim_dirs,
            containers: vec![],
        };
        d.launch();
        d.import_image();
        d
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.scratch.path("containerd.log"))
            .unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(self.scratch.path("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn containerd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.try_ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not answer within 60 s; see {}",
                self.scratch.path("containerd.log").display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM; the tasks' shims keep running, as they do when containerd restarts.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    fn ctr_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", NAMESPACE])
            .args(args);
        c
    }

    fn try_ctr(&self, args: &[&str]) -> Output {
        self.ctr_command(args).output().expect("spawn ctr")
    }

    fn ctr(&self, args: &[&str]) -> String {
        run_ok(&mut self.ctr_command(args)).trim().to_string()
    }

    /// The image: busybox-static (the sandbox's pause) and the static load generator, as a
    /// `docker save` archive built here (no registry is reachable), `ctr image import`ed.
    fn import_image(&self) {
        let rootfs = self.scratch.path("image/rootfs");
        let out = self.scratch.path("image/out");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::create_dir_all(rootfs.join("data")).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        std::fs::copy(loadgen_bin(), rootfs.join("isolator-loadgen")).unwrap();
        let layer = out.join("layer.tar");
        run_ok(
            Command::new("tar")
                .arg("-C")
                .arg(&rootfs)
                .arg("-cf")
                .arg(&layer)
                .arg("."),
        );
        let diff_id = run_ok(
            Command::new("sh")
                .arg("-c")
                .arg(format!("sha256sum '{}' | cut -c1-64", layer.display())),
        )
        .trim()
        .to_string();
        std::fs::write(
            out.join("config.json"),
            format!(
                r#"{{"architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["sha256:{diff_id}"]}}}}"#
            ),
        )
        .unwrap();
        std::fs::write(
            out.join("manifest.json"),
            r#"[{"Config":"config.json","RepoTags":["isolator-loadgen:test"],"Layers":["layer.tar"]}]"#,
        )
        .unwrap();
        let archive = self.scratch.path("image.tar");
        run_ok(
            Command::new("tar")
                .arg("-C")
                .arg(&out)
                .arg("-cf")
                .arg(&archive)
                .arg("."),
        );
        self.ctr(&["images", "import", archive.to_str().unwrap()]);
        assert!(self.ctr(&["images", "ls", "-q"]).contains(IMAGE));
    }

    /// Notes the cgroup directories `rel` (and its parents) that do not exist yet in any
    /// hierarchy, for removal at the end.
    fn note_cgroup_dirs(&mut self, rel: &str) {
        let roots: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .filter_map(|e| Some(e.ok()?.path()))
            .chain([PathBuf::from("/sys/fs/cgroup")])
            .filter(|p| p.join("cgroup.procs").exists())
            .collect();
        let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
        for root in roots {
            for n in 1..=parts.len() {
                let dir = root.join(parts[..n].join("/"));
                if !dir.exists() && !self.cgroup_dirs.contains(&dir) {
                    self.cgroup_dirs.push(dir);
                }
            }
        }
    }

    /// Creates and starts a container in namespace `k8s.io` with `labels`, in cgroup
    /// `cgroup` (None: containerd's default, `/k8s.io/<id>`), with `data` bind-mounted at
    /// /data, running `args`. Returns its id.
    fn run(&mut self, labels: &[(&str, &str)], cgroup: Option<&str>, args: &[&str]) -> String {
        let id = container_id();
        let cgroup = cgroup
            .map(|c| format!("{c}/{id}"))
            .unwrap_or_else(|| format!("/{NAMESPACE}/{id}"));
        self.note_cgroup_dirs(&cgroup);
        let mount = format!(
            "type=bind,src={},dst=/data,options=rbind:rw",
            self.scratch.path("data").display()
        );
        let runc_root = self.scratch.path("runc");
        let fifo_dir = self.scratch.path("fifo");
        let mut cmd: Vec<String> = [
            "run",
            "--detach",
            "--null-io",
            "--runc-root",
            runc_root.to_str().unwrap(),
            "--fifo-dir",
            fifo_dir.to_str().unwrap(),
            "--cgroup",
            &cgroup,
            "--mount",
            &mount,
        ]
        .map(str::to_string)
        .to_vec();
        for (k, v) in labels {
            cmd.extend(["--label".to_string(), format!("{k}={v}")]);
        }
        cmd.extend([IMAGE.to_string(), id.clone()]);
        cmd.extend(args.iter().map(|a| a.to_string()));
        self.containers.push(id.clone());
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        self.ctr(&cmd);
        id
    }

    /// A pod's sandbox: the pod's labels, `io.cri-containerd.kind=sandbox`, a process that
    /// only waits (as the pause container does).
    fn sandbox(&mut self, pod: &Pod, labels: &[(&str, &str)], cgroup: Option<&str>) -> String {
        let mut l = pod.kubelet_labels();
        l.push(("io.cri-containerd.kind", "sandbox"));
        l.extend_from_slice(labels);
        self.run(&l, cgroup, &["/bin/busybox", "sleep", "600"])
    }

    /// A container of `pod` named `name`, reading the data file with direct I/O (bounded:
    /// 90 s).
    fn reader(&mut self, pod: &Pod, name: &str, cgroup: Option<&str>) -> String {
        let mut l = pod.kubelet_labels();
        l.extend([
            ("io.cri-containerd.kind", "container"),
            ("io.kubernetes.container.name", name),
        ]);
        let mut reader = vec!["/isolator-loadgen"];
        reader.extend(container_reader_args("90"));
        self.run(&l, cgroup, &reader)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Tasks are deleted through the daemon: it must be up for that.
        if self.child.is_none() {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.scratch.path("containerd.log"));
            if let Ok(log) = log {
                self.child = Command::new("containerd")
                    .arg("--config")
                    .arg(self.scratch.path("config.toml"))
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .ok();
                let deadline = Instant::now() + Duration::from_secs(30);
                while !self.try_ctr(&["version"]).status.success() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        for id in self.containers.clone() {
            let _ = self.try_ctr(&["tasks", "rm", "--force", &id]);
            let _ = self.try_ctr(&["containers", "rm", &id]);
        }
        let _ = self.try_ctr(&["images", "rm", IMAGE]);
        self.stop();
        // Nothing of it stays mounted (the tasks' rootfs are unmounted as they go).
        let root = self.scratch.dir.display().to_string();
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
            let mut under: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .filter(|m| m.starts_with(&root))
                .collect();
            under.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in under {
                let _ = Command::new("umount").args(["-l", m]).status();
            }
        }
        // runc removes the containers' cgroups; the parents it made stay: deepest first.
        let mut dirs = self.cgroup_dirs.clone();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs.iter().chain(&self.shim_dirs) {
            let _ = std::fs::remove_dir(d);
        }
    }
}

struct Pod {
    namespace: &'static str,
    name: &'static str,
    uid: String,
}

impl Pod {
    fn new(namespace: &'static str, name: &'static str) -> Pod {
        Pod {
            namespace,
            name,
            uid: pod_uid(),
        }
    }

    /// The labels the kubelet puts on every container of the pod.
    fn kubelet_labels(&self) -> Vec<(&str, &str)> {
        vec![
            ("io.kubernetes.pod.name", self.name),
            ("io.kubernetes.pod.namespace", self.namespace),
            ("io.kubernetes.pod.uid", &self.uid),
        ]
    }
}

/// The first event that matches `pred`, waiting up to `timeout`; on a timeout, says what
/// was awaited and what the agent said of containerd and labels (not every event).
fn wait(agent: &Agent, what: &str, timeout_s: u64, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    loop {
        let events = agent.events();
        if let Some(e) = events.iter().find(|e| pred(e)) {
            return e.clone();
        }
        if Instant::now() > deadline {
            let said: Vec<String> = events
                .iter()
                .filter(|e| {
                    let t = e["type"].as_str().unwrap_or("");
                    t.starts_with("containerd") || t == "warning" || t == "label_slo"
                })
                .map(Value::to_string)
                .collect();
            let names: BTreeSet<String> = events
                .iter()
                .filter(|e| e["type"] == "cgroup_stats")
                .map(|e| format!("{} {}", e["cgroup"]["path"], e["cgroup"]["name"]))
                .collect();
            panic!(
                "timed out after {timeout_s} s waiting for {what}; {} events; containerd, warnings, labels: {said:#?}; cgroups named: {names:#?}",
                events.len()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn last_cycle(agent: &Agent) -> u64 {
    agent
        .events()
        .iter()
        .filter(|e| e["type"] == "cycle_end")
        .filter_map(|e| e["cycle"].as_u64())
        .max()
        .unwrap_or(0)
}

/// The `cgroup_stats` of container `id`, named `name`, of the pod.
fn named_stats(agent: &Agent, id: &str, name: &str, pod: &Pod, container: &str) -> Value {
    let e = wait(agent, &format!("{name} named"), 60, |e| {
        e["type"] == "cgroup_stats"
            && e["cgroup"]["container_id"] == id
            && e["cgroup"]["name"] == name
    });
    let c = &e["cgroup"];
    assert_eq!(c["kind"], "container", "{c}");
    assert_eq!(c["runtime"], "containerd", "{c}");
    assert_eq!(c["image"], IMAGE, "{c}");
    assert_eq!(c["pod_namespace"], pod.namespace, "{c}");
    assert_eq!(c["pod_name"], pod.name, "{c}");
    assert_eq!(c["pod_container"], container, "{c}");
    assert_eq!(c["pod_uid"], pod.uid.as_str(), "{c}");
    e
}

/// A `service_stats` of `service` whose cgroups include `cgroup_id`.
fn service_with(agent: &Agent, service: &str, cgroup_id: u64) -> Value {
    wait(agent, &format!("service {service}"), 60, |e| {
        e["type"] == "service_stats"
            && e["service"] == service
            && e["cgroups"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c.as_u64() == Some(cgroup_id)))
    })
}

#[test]
fn pods_are_named_matched_and_governed_through_containerd() {
    require_root();
    let mut d = Containerd::start();
    make_file(&d.scratch.path("data/r.dat"), 64 << 20);
    let web = Pod::new("shop", "web");
    let batch = Pod::new("jobs", "batch-1");
    let scratch = Scratch::new();
    let cfg = scratch.path("isolator.toml");
    std::fs::write(
        &cfg,
        "[[service]]\nname = \"batch\"\nnamespace = \"jobs\"\npod = \"batch-*\"\npod_label = \"tier=batch\"\nclass = \"best-effort\"\n",
    )
    .unwrap();
    let mut agent = Agent::start(&[
        "--interval",
        "1s",
        "--config",
        cfg.to_str().unwrap(),
        "--dry-run",
        "--socket",
        "off",
        "--docker-socket",
        "off",
        "--containerd-socket",
        d.socket.to_str().unwrap(),
    ]);
    let connected = wait(&agent, "containerd_connected", 30, |e| {
        e["type"] == "containerd_connected"
    });
    assert_eq!(connected["namespace"], NAMESPACE);
    assert_eq!(connected["socket"], d.socket.to_str().unwrap());

    // Pod shop/web in the kubelet's cgroupfs layout (a pod cgroup, its containers below),
    // declaring a latency SLO in its pod labels (on its sandbox).
    let web_cgroup = format!("/kubepods/besteffort/pod{}", web.uid);
    d.sandbox(
        &web,
        &[("isolator.class", "latency"), ("isolator.p999", "50ms")],
        Some(&web_cgroup),
    );
    let app = d.reader(&web, "app", Some(&web_cgroup));
    // Pod jobs/batch-1 in containerd's own layout (`ctr run`'s default /k8s.io/<id>),
    // matched by the config by namespace, pod name and pod label.
    d.sandbox(&batch, &[("tier", "batch")], None);
    let worker = d.reader(&batch, "worker", None);

    // Named namespace/pod/container, with the pod's fields, in both layouts.
    let app_stats = named_stats(&agent, &app, "shop/web/app", &web, "app");
    assert_eq!(
        app_stats["cgroup"]["path"],
        format!("{web_cgroup}/{app}"),
        "the agent's hierarchy sees the container's blkio cgroup"
    );
    assert_eq!(app_stats["cgroup"]["pod_qos"], "besteffort");
    let worker_stats = named_stats(&agent, &worker, "jobs/batch-1/worker", &batch, "worker");
    assert_eq!(
        worker_stats["cgroup"]["path"],
        format!("/{NAMESPACE}/{worker}")
    );

    // The pod-label SLO: a service of its own, named after the pod, made of its cgroup.
    let applied = wait(&agent, "the pod's label SLO", 60, |e| {
        e["type"] == "label_slo" && e["outcome"] == "applied"
    });
    assert_eq!(applied["container"], "shop/web", "{applied}");
    assert_eq!(applied["pod_uid"], web.uid.as_str(), "{applied}");
    assert_eq!(applied["slo"]["p999_ns"], 50_000_000, "{applied}");
    let app_id = app_stats["cgroup"]["id"].as_u64().unwrap();
    let s = service_with(&agent, "shop/web", app_id);
    assert_eq!(s["slo"]["class"], "latency", "{s}");
    assert_eq!(s["slo"]["p999_ns"], 50_000_000, "{s}");
    // The config's service by namespace, pod and pod label.
    let worker_id = worker_stats["cgroup"]["id"].as_u64().unwrap();
    let s = service_with(&agent, "batch", worker_id);
    assert_eq!(s["slo"]["class"], "best-effort", "{s}");
    assert!(
        !agent
            .events()
            .iter()
            .any(|e| e["type"] == "label_slo" && e["container"] == "jobs/batch-1"),
        "a pod without an SLO label has no label_slo"
    );

    // containerd goes away: a warning, once; the agent keeps cycling and naming.
    d.stop();
    let down = wait(&agent, "containerd_down", 30, |e| {
        e["type"] == "warning" && e["code"] == "containerd_down"
    });
    assert!(
        down["message"]
            .as_str()
            .is_some_and(|m| m.contains("containerd is not reachable")),
        "{down}"
    );
    let n = last_cycle(&agent);
    agent.wait_cycles(3);
    assert!(last_cycle(&agent) >= n + 3, "agent stopped cycling");
    let cycle_after = |e: &Value| e["cycle"].as_u64().is_some_and(|c| c > n);
    assert!(
        agent.events().iter().any(|e| e["type"] == "cgroup_stats"
            && cycle_after(e)
            && e["cgroup"]["name"] == "shop/web/app"),
        "names kept while containerd is down"
    );

    // ... and comes back: reconnected within the backoff; a new container is named.
    d.launch();
    wait(&agent, "containerd_connected again", 60, |e| {
        e["type"] == "containerd_connected"
            && e["containers"].as_u64() >= Some(4)
            && e["ts"].as_str() > down["ts"].as_str()
    });
    let late = d.reader(&web, "late", Some(&web_cgroup));
    named_stats(&agent, &late, "shop/web/late", &web, "late");
    let downs = agent
        .events()
        .iter()
        .filter(|e| e["code"] == "containerd_down")
        .count();
    assert_eq!(downs, 1, "the outage is said once");
    let last_end = agent
        .events()
        .into_iter()
        .rev()
        .find(|e| e["type"] == "cycle_end")
        .unwrap();
    assert_eq!(last_end["containerd_containers"], 5, "{last_end}");
    assert!(last_end["docker_containers"].is_null());

    let (status, stderr) = agent.stop();
    assert!(status.success(), "agent: {stderr}");
    // Every event, the new ones included, as docs/events.md says.
    let doc = events_doc::documented();
    let events = agent.events();
    for e in &events {
        events_doc::validate(&doc, e);
    }
    let types: BTreeSet<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    for t in [
        "containerd_connected",
        "label_slo",
        "service_stats",
        "warning",
    ] {
        assert!(types.contains(t), "no {t} event");
    }
    drop(d);
}
