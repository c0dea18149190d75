//! `isolator run --metrics` under a real Prometheus (Debian's `prometheus` package, started
//! here on loopback): during a controlled noisy-neighbor run it scrapes the agent every
//! second, and its HTTP API gives back the victim's p99.9 within one `le` bucket of the
//! agent's own and the aggressor's limit as the agent's decisions set it; `promtool check
//! metrics` finds nothing to say about a scrape. Bad `--metrics` input: one line at start.

use std::{
    net::TcpListener,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use isolator::prometheus::histogram::LE_NS;
use isolator_tests::*;
use serde_json::Value;

/// A Prometheus server of our own: loopback, a free port, its config and data in a scratch
/// directory, scraping `target` every second. Killed and removed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    scratch: Scratch,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let scratch = Scratch::new();
        let config = scratch.path("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: isolator\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(scratch.path("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                scratch.path("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let p = Prometheus {
            child,
            port,
            scratch,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !p.get("/-/ready").is_some_and(|b| b.contains("Ready")) {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.scratch.path("prometheus.log")).unwrap_or_default()
    }

    fn get(&self, path: &str) -> Option<String> {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{}{path}", self.port)])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// An instant query at `time` (seconds, ms precision): the API's `data.result`.
    fn query(&self, query: &str, time: f64) -> Vec<Value> {
        let out = Command::new("curl")
            .args(["-sS", "-G"])
            .arg(format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .arg("--data-urlencode")
            .arg(format!("query={query}"))
            .arg("--data-urlencode")
            .arg(format!("time={time:.3}"))
            .output()
            .expect("curl");
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{query}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        assert_eq!(v["status"], "success", "{query}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The raw samples of one series over the last `span`: (timestamp s, value).
    fn samples(&self, selector: &str, span: &str, now: f64) -> Vec<(f64, f64)> {
        let r = self.query(&format!("{selector}[{span}]"), now);
        assert!(r.len() <= 1, "{selector} selects {} series: {r:?}", r.len());
        r.first()
            .map(|s| {
                s["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| (p[0].as_f64().unwrap(), value(&p[1])))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The single value `query` gives at `time`, if any.
    fn scalar(&self, query: &str, time: f64) -> Option<f64> {
        let r = self.query(query, time);
        assert!(r.len() <= 1, "{query} gives {} series: {r:?}", r.len());
        r.first().map(|s| value(&s["value"][1]))
    }
}

fn value(v: &Value) -> f64 {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN)
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.wait();
    }
}

/// The exported bucket a latency in seconds falls in (the last: +Inf).
fn le_index(seconds: f64) -> usize {
    LE_NS
        .iter()
        .position(|&ns| seconds <= ns as f64 / 1e9 * (1.0 + 1e-12))
        .unwrap_or(LE_NS.len())
}

fn scrape(addr: &str, accept: Option<&str>) -> String {
    let mut cmd = Command::new("curl");
    cmd.args(["-sSf", &format!("http://{addr}/metrics")]);
    if let Some(a) = accept {
        cmd.args(["-H", &format!("Accept: {a}")]);
    }
    run_ok(&mut cmd)
}

#[test]
fn prometheus_scrapes_the_victims_latency_and_the_aggressors_limit() {
    require_root();
    for tool in ["fio", "prometheus", "promtool", "curl"] {
        require_tool(tool);
    }
    let scratch = Scratch::new();
    let db = TestCgroup::new("iso-prom-db");
    let backup = TestCgroup::new("iso-prom-backup");
    let (rfile, wfile) = noisy::files(&scratch);
    let config = scratch.path("isolator.toml");
    std::fs::write(&config, noisy::config(&db, &backup, 6)).unwrap();
    let journal = scratch.path("journal");
    let agent = Agent::start_controlling(&config, &journal, &["--metrics", "127.0.0.1:0"]);
    let start = agent.wait_for(|e| e["type"] == "agent_start", Duration::from_secs(5));
    let addr = start["metrics"]
        .as_str()
        .expect("agent_start.metrics")
        .to_string();
    let prometheus = Prometheus::start(&addr);
    // The agent is a healthy target before the load starts.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let targets = prometheus.get("/api/v1/targets").unwrap_or_default();
        if targets.contains(r#""health":"up""#) {
            break;
        }
        assert!(Instant::now() < deadline, "target never up: {targets}");
        std::thread::sleep(Duration::from_millis(500));
    }

    let run = noisy::run_pair(&scratch, (&db, &backup), (&rfile, &wfile), 5, 20);
    assert!(run.writer_ok && run.reader_ok, "fio failed");
    agent.wait_cycles(2);

    // A scrape in each format: the text format is clean for promtool; Prometheus itself
    // scraped OpenMetrics all along (its Accept header asks for it) with no error.
    let text = scrape(&addr, None);
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out: Output = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}"
    );
    let om = scrape(&addr, Some("application/openmetrics-text;version=1.0.0"));
    assert!(om.ends_with("# EOF\n"), "not OpenMetrics: {om:.200}");
    let targets: Value = serde_json::from_str(&prometheus.get("/api/v1/targets").unwrap()).unwrap();
    let target = &targets["data"]["activeTargets"][0];
    assert_eq!(target["health"], "up", "{target}");
    assert_eq!(target["lastError"], "", "{target}");

    let events = agent.events();
    let last_cycle = events
        .iter()
        .filter(|e| e["type"] == "cycle_end")
        .filter_map(|e| e["cycle"].as_u64())
        .max()
        .unwrap();
    // Prometheus has scraped the end of the run.
    let deadline = Instant::now() + Duration::from_secs(20);
    let now = loop {
        let now = unix_now();
        if prometheus
            .scalar("isolator_agent_cycles_total", now)
            .is_some_and(|c| c as u64 >= last_cycle)
        {
            break now;
        }
        assert!(Instant::now() < deadline, "no scrape of cycle {last_cycle}");
        std::thread::sleep(Duration::from_millis(300));
    };

    // Every scrape, by the cycle its exposition is from.
    let scrapes = prometheus.samples("isolator_agent_cycles_total", "10m", now);
    assert!(scrapes.len() >= 20, "only {} scrapes", scrapes.len());
    let db_stats: std::collections::BTreeMap<u64, &Value> = noisy::service_stats(&events, "db")
        .into_iter()
        .map(|e| (e["cycle"].as_u64().unwrap(), e))
        .collect();

    // The victim: between two scrapes of consecutive cycles, the difference of the
    // cumulative buckets is that cycle's histogram, whose p99.9 the agent reported in its
    // service_stats and as isolator_service_p999_seconds. Compared in every such cycle with
    // enough samples for a p99.9.
    let p999_gauge =
        prometheus.samples(r#"isolator_service_p999_seconds{service="db"}"#, "10m", now);
    let bucket = r#"isolator_service_total_latency_seconds_bucket{service="db"}"#;
    let mut compared = 0;
    let mut worst = 0;
    for w in scrapes.windows(2) {
        let ((t0, c0), (t1, c1)) = (w[0], w[1]);
        if c1 as u64 != c0 as u64 + 1 {
            continue;
        }
        let cycle = c1 as u64;
        let Some(stats) = db_stats.get(&cycle) else {
            continue;
        };
        if stats["samples"].as_u64().unwrap() < 1000 {
            continue;
        }
        let agent_s = stats["p999_ns"].as_u64().unwrap() as f64 / 1e9;
        let gauge = p999_gauge
            .iter()
            .find(|(t, _)| (t - t1).abs() < 1e-4)
            .map(|&(_, v)| v);
        assert_eq!(
            gauge,
            Some(agent_s),
            "cycle {cycle}: the gauge is not service_stats' p999"
        );
        let offset_ms = ((t1 - t0) * 1000.0).round() as u64;
        let before = format!("{bucket} offset {offset_ms}ms");
        if prometheus.query(&before, t1).is_empty() {
            // The series appeared in this cycle: there is no scrape before to subtract.
            continue;
        }
        let q = format!("histogram_quantile(0.999, sum by (le) ({bucket} - {before}))");
        let prom_s = prometheus
            .scalar(&q, t1)
            .unwrap_or_else(|| panic!("{q} at {t1}: nothing"));
        let apart = le_index(prom_s).abs_diff(le_index(agent_s));
        println!(
            "cycle {cycle}: agent p99.9 {:.3} ms ({} samples), Prometheus {:.3} ms, {apart} bucket(s) apart",
            agent_s * 1e3,
            stats["samples"],
            prom_s * 1e3
        );
        assert!(
            apart <= 1,
            "cycle {cycle}: Prometheus' p99.9 {prom_s} s is {apart} buckets from the agent's {agent_s} s"
        );
        worst = worst.max(apart);
        compared += 1;
    }
    assert!(compared >= 10, "only {compared} cycles compared");
    println!("{compared} cycles compared, at most {worst} bucket apart");

    // The aggressor: at every scrape, the wbps limit Prometheus holds is the one the last
    // applied decision on it said, by the scrape's cycle (absent: none, or lifted).
    let limits = prometheus.samples(
        r#"isolator_service_limit_bytes_per_second{service="backup",knob="wbps"}"#,
        "10m",
        now,
    );
    let decisions: Vec<(u64, Option<f64>)> = events
        .iter()
        .filter(|e| e["type"] == "decision" && e["service"] == "backup" && e["knob"] == "wbps")
        .filter(|e| e["applied"] == true)
        .map(|e| {
            (
                e["cycle"].as_u64().unwrap(),
                e["decided"].as_u64().map(|v| v as f64),
            )
        })
        .collect();
    assert!(
        decisions.iter().any(|(_, v)| v.is_some()),
        "the writer was never limited"
    );
    let mut limited = 0;
    for &(t, c) in &scrapes {
        let want = decisions
            .iter()
            .rev()
            .find(|(dc, _)| *dc <= c as u64)
            .and_then(|(_, v)| *v);
        let got = limits
            .iter()
            .find(|(lt, _)| (lt - t).abs() < 1e-4)
            .map(|&(_, v)| v);
        assert_eq!(got, want, "cycle {c}: limit in Prometheus vs the decisions");
        limited += got.is_some() as usize;
    }
    assert!(limited > 0, "no scrape saw the aggressor's limit");
    println!("{limited} scrapes saw the aggressor's limit as its decisions set it");
    // The SLO target as configured.
    assert_eq!(
        prometheus.scalar(r#"isolator_service_slo_p999_seconds{service="db"}"#, now),
        Some(0.006)
    );
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn isolator(args: &[&str]) -> Output {
    Command::new(isolator_bin()).args(args).output().unwrap()
}

fn one_line(out: &Output, code: i32, must_contain: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for m in must_contain {
        assert!(stderr.contains(m), "{stderr:?} lacks {m:?}");
    }
}

#[test]
fn a_bad_metrics_address_is_one_line_at_start() {
    require_root();
    for bad in ["localhost:9500", "9500", "unix:relative.sock"] {
        one_line(
            &isolator(&["run", "--metrics", bad]),
            2,
            &["--metrics", "e.g."],
        );
    }
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let scratch = Scratch::new();
    let json = scratch.path("events.ndjson");
    let out = isolator(&[
        "run",
        "--metrics",
        &addr,
        "--json",
        json.to_str().unwrap(),
        "--socket",
        "off",
    ]);
    one_line(&out, 1, &[&addr, "in use", "--metrics"]);
    let out = isolator(&["run", "--metrics", "192.0.2.1:9500", "--socket", "off"]);
    one_line(&out, 1, &["192.0.2.1:9500", "not an address of this host"]);
    // Nothing was started: no agent_start.
    let started = std::fs::read_to_string(&json).unwrap_or_default();
    assert!(!started.contains("agent_start"), "{started}");
}
