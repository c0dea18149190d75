//! Real agent output checked against docs/events.md: every field documented with the
//! right type, every `always` field present.

use std::collections::{BTreeMap, BTreeSet};

use isolator_tests::*;
use serde_json::Value;

#[derive(Debug)]
struct Field {
    types: BTreeSet<String>,
    always: bool,
}

/// event type -> path -> field, from the tables in docs/events.md. Envelope fields go
/// under "*".
fn documented() -> BTreeMap<String, BTreeMap<String, Field>> {
    let md = std::fs::read_to_string(workspace_root().join("docs/events.md")).unwrap();
    let mut out: BTreeMap<String, BTreeMap<String, Field>> = BTreeMap::new();
    let mut section = String::new();
    for line in md.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = if h.starts_with("Envelope") {
                "*".into()
            } else {
                h.trim_matches('`').to_string()
            };
            continue;
        }
        // `\|` inside a cell separates alternative types.
        let line = line.replace("\\|", "\u{1}");
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 || !cells[1].starts_with('`') {
            continue;
        }
        let path = cells[1].trim_matches('`');
        let types: BTreeSet<String> = cells[2]
            .split('\u{1}')
            .map(|t| t.trim().to_string())
            .collect();
        let always = cells[3] == "always";
        // Expand `{a,b,c}` alternatives.
        let paths: Vec<String> = match (path.find('{'), path.find('}')) {
            (Some(a), Some(b)) => path[a + 1..b]
                .split(',')
                .map(|alt| format!("{}{}{}", &path[..a], alt, &path[b + 1..]))
                .collect(),
            _ => vec![path.to_string()],
        };
        for p in paths {
            out.entry(section.clone()).or_default().insert(
                p,
                Field {
                    types: types.clone(),
                    always,
                },
            );
        }
    }
    out
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Leaf paths of an event (arrays as `[]`), and object paths too.
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => {
            if !prefix.is_empty() {
                out.push((prefix.to_string(), v.clone()));
            }
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&p, x, out);
            }
        }
        Value::Array(a) => {
            for x in a {
                flatten(&format!("{prefix}[]"), x, out);
            }
        }
        _ => out.push((prefix.to_string(), v.clone())),
    }
}

fn validate(doc: &BTreeMap<String, BTreeMap<String, Field>>, e: &Value) {
    let ty = e["type"].as_str().expect("type");
    let fields = doc
        .get(ty)
        .unwrap_or_else(|| panic!("event type {ty} is not documented"));
    let env = &doc["*"];
    let mut leaves = vec![];
    flatten("", e, &mut leaves);
    let present: BTreeSet<String> = leaves.iter().map(|(p, _)| p.clone()).collect();
    for (path, v) in &leaves {
        let f = env.get(path).or_else(|| fields.get(path));
        let Some(f) = f else {
            // Intermediate objects (cgroup, totals, latency, ...) need no row of their own.
            if v.is_object() {
                continue;
            }
            panic!("{ty}: field {path} is not documented in docs/events.md");
        };
        let t = json_type(v);
        let ok = f.types.contains(t) || (t == "integer" && f.types.contains("number"));
        assert!(ok, "{ty}: {path} is {t} ({v}), documented as {:?}", f.types);
    }
    for (path, f) in env.iter().chain(fields.iter()) {
        if !f.always {
            continue;
        }
        // A required field under an optional or array parent is required when the parent
        // is there.
        let parent_present = match path.rsplit_once('.') {
            Some((parent, _)) => {
                let optional_parent = fields.get(parent).is_some_and(|p| !p.always);
                let in_array = parent.contains("[]");
                if optional_parent || in_array {
                    present
                        .iter()
                        .any(|p| p == parent || p.starts_with(&format!("{parent}.")))
                } else {
                    true
                }
            }
            None => true,
        };
        if parent_present {
            assert!(
                present.contains(path),
                "{ty}: required field {path} missing in {e}"
            );
        }
    }
}

#[test]
fn docs_tables_parse() {
    let doc = documented();
    for t in [
        "*",
        "agent_start",
        "cgroup_stats",
        "cgroup_gone",
        "cycle_end",
        "agent_stop",
    ] {
        assert!(doc.contains_key(t), "docs/events.md lacks {t}");
    }
    assert!(doc["cgroup_stats"].contains_key("devices[].write.latency.p999_ns"));
}

#[test]
fn real_output_matches_docs() {
    require_root();
    let doc = documented();
    let scratch = Scratch::new();
    let cg = TestCgroup::new("iso-schema");
    let mut agent = Agent::start(&["--interval", "1s"]);
    run_ok(std::process::Command::new(loadgen_bin()).args([
        "--cgroup",
        cg.dir.to_str().unwrap(),
        "--path",
        scratch.path("w").to_str().unwrap(),
        "--op",
        "write",
        "--bytes",
        "16777216",
        "--bs",
        "65536",
        "--direct",
    ]));
    agent.wait_cycles(2);
    // A cgroup that goes away must be reported and dropped.
    let gone_id = cg.id();
    drop(cg);
    agent.wait_for(
        |e| e["type"] == "cgroup_gone" && e["cgroup"]["id"].as_u64() == Some(gone_id),
        std::time::Duration::from_secs(15),
    );
    let (status, stderr) = agent.stop();
    assert!(status.success(), "agent exit {status:?}: {stderr}");
    let events = agent.events();
    let types: BTreeSet<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    for t in [
        "agent_start",
        "cgroup_stats",
        "cycle_end",
        "cgroup_gone",
        "agent_stop",
    ] {
        assert!(types.contains(t), "no {t} event in {types:?}");
    }
    for e in &events {
        assert_eq!(e["schema"], 1);
        validate(&doc, e);
    }
    assert_events_round_trip(&agent.events);
}
