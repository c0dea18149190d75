//! SLOs declared as container labels: `isolator.class`, `isolator.p999`, `isolator.rate`,
//! `isolator.floor`, `isolator.ceiling`, `isolator.weight`. Same units and rules as the
//! config file; a malformed label makes the container unconfigured, with an error that
//! names the label.

use std::collections::HashMap;

use thiserror::Error;

use crate::config::{parse_slo, Slo, SloField, SloText};

pub const PREFIX: &str = "isolator.";

/// A malformed label; `message` names it and says the fix.
#[derive(Debug, Error, PartialEq)]
#[error("{message}")]
pub struct LabelError {
    pub label: String,
    pub value: String,
    pub message: String,
}

/// Reads the `isolator.*` labels, by the config's rules. `Ok(None)`: the container declares
/// nothing.
pub fn slo_from_labels(labels: &HashMap<String, String>) -> Result<Option<Slo>, LabelError> {
    let get = |f: SloField| {
        labels
            .get(&format!("{PREFIX}{}", f.key()))
            .map(|v| v.trim())
    };
    let fail = |label: String, message: String| LabelError {
        value: labels.get(&label).cloned().unwrap_or_default(),
        label,
        message,
    };
    let keys = SloField::ALL.map(SloField::key);
    if let Some(unknown) = labels
        .keys()
        .find(|k| k.strip_prefix(PREFIX).is_some_and(|k| !keys.contains(&k)))
    {
        let message = format!(
            "{unknown}: unknown label; use one of {PREFIX}{{{}}}",
            keys.join(",")
        );
        return Err(fail(unknown.clone(), message));
    }
    let label = |f: SloField| format!("{PREFIX}{}", f.key());
    let Some(class) = get(SloField::Class) else {
        return match SloField::ALL.into_iter().find(|&f| get(f).is_some()) {
            Some(f) => Err(fail(
                label(f),
                format!(
                    "{} needs {PREFIX}class (latency, throughput or best-effort)",
                    label(f)
                ),
            )),
            None => Ok(None),
        };
    };
    let weight = get(SloField::Weight)
        .map(|v| {
            v.parse::<i64>().map_err(|_| {
                fail(
                    label(SloField::Weight),
                    format!(
                        "{}={v}: must be an integer in 1..10000",
                        label(SloField::Weight)
                    ),
                )
            })
        })
        .transpose()?;
    let text = SloText {
        class,
        p999: get(SloField::P999),
        rate: get(SloField::Rate),
        floor: get(SloField::Floor),
        ceiling: get(SloField::Ceiling),
        weight,
    };
    parse_slo(&text).map(Some).map_err(|e| {
        let message = e.describe(|f, v| match v {
            Some(v) => format!("{}={v}", label(f)),
            None => label(f),
        });
        fail(label(e.field()), message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Rate, SloClass};

    fn labels(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn declared_slos() {
        let l = labels(&[
            ("isolator.class", "latency"),
            ("isolator.p999", "20ms"),
            ("isolator.floor", "10MB/s"),
            ("com.example.team", "db"),
        ]);
        assert_eq!(
            slo_from_labels(&l),
            Ok(Some(Slo {
                class: SloClass::Latency {
                    p999_ns: 20_000_000
                },
                floor: Some(Rate::BytesPerSec(10_000_000)),
                ceiling: None,
                weight: None,
            }))
        );
        let l = labels(&[
            ("isolator.class", "throughput"),
            ("isolator.rate", "150MB/s"),
        ]);
        assert_eq!(
            slo_from_labels(&l).unwrap().unwrap().class,
            SloClass::Throughput {
                rate_bps: 150_000_000
            }
        );
        let l = labels(&[("isolator.class", "best-effort"), ("isolator.weight", "50")]);
        assert_eq!(slo_from_labels(&l).unwrap().unwrap().weight, Some(50));
        assert_eq!(slo_from_labels(&labels(&[("app", "x")])), Ok(None));
    }

    #[test]
    fn malformed_labels_name_the_label() {
        for (kv, label, needle) in [
            (
                vec![("isolator.class", "fast")],
                "isolator.class",
                "unknown class 'fast'",
            ),
            (
                vec![("isolator.class", "latency")],
                "isolator.class",
                "add isolator.p999",
            ),
            (
                vec![("isolator.class", "latency"), ("isolator.p999", "-5ms")],
                "isolator.p999",
                "",
            ),
            (
                vec![
                    ("isolator.class", "latency"),
                    ("isolator.p999", "5 parsecs"),
                ],
                "isolator.p999",
                "",
            ),
            (
                vec![
                    ("isolator.class", "throughput"),
                    ("isolator.rate", "100iops"),
                ],
                "isolator.rate",
                "bytes per second",
            ),
            (
                vec![("isolator.class", "best-effort"), ("isolator.p999", "5ms")],
                "isolator.p999",
                "does not apply",
            ),
            (
                vec![("isolator.p999", "5ms")],
                "isolator.p999",
                "needs isolator.class",
            ),
            (
                vec![("isolator.p99", "5ms")],
                "isolator.p99",
                "unknown label",
            ),
            (
                vec![("isolator.class", "best-effort"), ("isolator.weight", "0")],
                "isolator.weight",
                "1..10000",
            ),
        ] {
            let e = slo_from_labels(&labels(&kv)).unwrap_err();
            assert_eq!(e.label, label, "{e}");
            assert!(e.to_string().contains(needle), "{e} lacks {needle}");
            assert!(!e.to_string().contains('\n'));
        }
    }
}
