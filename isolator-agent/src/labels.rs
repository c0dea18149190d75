//! SLOs declared as container labels: `isolator.class`, `isolator.p999`, `isolator.rate`,
//! `isolator.floor`, `isolator.ceiling`, `isolator.weight`. Same units and rules as the
//! config file; a malformed label makes the container unconfigured, with an error that
//! names the label.

use std::collections::HashMap;

use thiserror::Error;

use crate::config::{parse_duration_ns, parse_rate, Rate, SloClass};

pub const PREFIX: &str = "isolator.";
const KEYS: [&str; 6] = ["class", "p999", "rate", "floor", "ceiling", "weight"];

/// What a container's labels ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelSlo {
    pub class: SloClass,
    pub floor: Option<Rate>,
    pub ceiling: Option<Rate>,
    pub weight: Option<u32>,
}

#[derive(Debug, Error, PartialEq)]
#[error("label {label}={value}: {message}")]
pub struct LabelError {
    pub label: String,
    pub value: String,
    pub message: String,
}

/// Reads the `isolator.*` labels. `Ok(None)`: the container declares nothing.
pub fn slo_from_labels(labels: &HashMap<String, String>) -> Result<Option<LabelSlo>, LabelError> {
    let get = |k: &str| labels.get(&format!("{PREFIX}{k}")).map(|v| v.trim());
    let fail = |k: &str, message: String| LabelError {
        label: format!("{PREFIX}{k}"),
        value: get(k).unwrap_or("").to_string(),
        message,
    };
    if let Some(unknown) = labels
        .keys()
        .filter_map(|k| k.strip_prefix(PREFIX))
        .find(|k| !KEYS.contains(k))
    {
        return Err(LabelError {
            label: format!("{PREFIX}{unknown}"),
            value: labels[&format!("{PREFIX}{unknown}")].clone(),
            message: format!("unknown label; use one of {PREFIX}{{{}}}", KEYS.join(",")),
        });
    }
    let Some(class) = get("class") else {
        if let Some(k) = KEYS[1..].iter().find(|k| get(k).is_some()) {
            return Err(fail(
                k,
                format!("needs {PREFIX}class (latency, throughput or best-effort)"),
            ));
        }
        return Ok(None);
    };
    let forbid = |k: &str, class: &str| match get(k) {
        Some(_) => Err(fail(
            k,
            format!("does not apply to class {class}; remove it"),
        )),
        None => Ok(()),
    };
    let class = match class {
        "latency" => {
            forbid("rate", "latency")?;
            let v = get("p999").ok_or_else(|| {
                fail(
                    "class",
                    format!("class latency needs a target; add {PREFIX}p999=20ms"),
                )
            })?;
            SloClass::Latency {
                p999_ns: parse_duration_ns(v).map_err(|m| fail("p999", m))?,
            }
        }
        "throughput" => {
            forbid("p999", "throughput")?;
            let v = get("rate").ok_or_else(|| {
                fail(
                    "class",
                    format!("class throughput needs a target; add {PREFIX}rate=150MB/s"),
                )
            })?;
            match parse_rate(v).map_err(|m| fail("rate", m))? {
                Rate::BytesPerSec(rate_bps) => SloClass::Throughput { rate_bps },
                Rate::IosPerSec(_) => {
                    return Err(fail(
                        "rate",
                        "must be in bytes per second, e.g. 150MB/s".into(),
                    ))
                }
            }
        }
        "best-effort" => {
            forbid("p999", "best-effort")?;
            forbid("rate", "best-effort")?;
            SloClass::BestEffort
        }
        other => {
            return Err(fail(
                "class",
                format!("unknown class '{other}'; use latency, throughput or best-effort"),
            ))
        }
    };
    let rate = |k: &str| {
        get(k)
            .map(|v| parse_rate(v).map_err(|m| fail(k, m)))
            .transpose()
    };
    let weight = get("weight")
        .map(|v| match v.parse::<u32>() {
            Ok(w) if (1..=10000).contains(&w) => Ok(w),
            _ => Err(fail("weight", "must be an integer in 1..10000".into())),
        })
        .transpose()?;
    Ok(Some(LabelSlo {
        class,
        floor: rate("floor")?,
        ceiling: rate("ceiling")?,
        weight,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Ok(Some(LabelSlo {
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
