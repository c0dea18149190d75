//! SLOs declared as container labels: `isolator.class`, `isolator.p999`, `isolator.rate`,
//! `isolator.floor`, `isolator.ceiling`, `isolator.weight`. Same units and rules as the
//! config file, within the bounds of its `[labels]` section; a malformed or out-of-bounds
//! label makes the container unconfigured, with an error that names the label.

use std::collections::HashMap;

use thiserror::Error;

use crate::config::{
    bytes_rate_text, duration_text, one_line, parse_slo, LabelPolicy, Rate, Slo, SloClass,
    SloField, SloText,
};

pub const PREFIX: &str = "isolator.";

/// A malformed label; `message` names it and says the fix.
#[derive(Debug, Error, PartialEq)]
#[error("{message}")]
pub struct LabelError {
    pub label: String,
    pub value: String,
    pub message: String,
}

/// Reads the `isolator.*` labels, by the config's rules and within its `[labels]` bounds.
/// `Ok(None)`: the container declares nothing (or the config lets no label count).
pub fn slo_from_labels(
    labels: &HashMap<String, String>,
    policy: &LabelPolicy,
) -> Result<Option<Slo>, LabelError> {
    if !policy.enabled {
        return Ok(None);
    }
    let get = |f: SloField| {
        labels
            .get(&format!("{PREFIX}{}", f.key()))
            .map(|v| v.trim())
    };
    // Label keys and values are anyone's text: escaped, the message stays one line.
    let fail = |label: String, message: String| LabelError {
        value: labels.get(&label).cloned().unwrap_or_default(),
        label,
        message: one_line(&message),
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
        p99: get(SloField::P99),
        p95: get(SloField::P95),
        p90: get(SloField::P90),
        rate: get(SloField::Rate),
        floor: get(SloField::Floor),
        ceiling: get(SloField::Ceiling),
        weight,
    };
    let slo = parse_slo(&text).map_err(|e| {
        let message = e.describe(|f, v| match v {
            Some(v) => format!("{}={v}", label(f)),
            None => label(f),
        });
        fail(label(e.field()), message)
    })?;
    check_bounds(&slo, policy).map_err(|(f, message)| {
        let value = get(f).unwrap_or_default();
        fail(label(f), format!("{}={value} {message}", label(f)))
    })?;
    Ok(Some(slo))
}

/// Whether a valid SLO is within what the config's `[labels]` lets a container declare;
/// Err: the field out of bounds and what is wrong with it, with the fix.
fn check_bounds(slo: &Slo, policy: &LabelPolicy) -> Result<(), (SloField, String)> {
    let key = |f: SloField| format!("{PREFIX}{}", f.key());
    let class = slo.class.name();
    if !policy.classes.contains(&class) {
        let allowed = match policy.classes.join(", ") {
            a if a.is_empty() => "none".to_string(),
            a => a,
        };
        return Err((
            SloField::Class,
            format!("is a class the config's [labels] classes does not allow (it allows {allowed}); declare one of those, or add {class} to the config's [labels] classes"),
        ));
    }
    // The bound holds at any quantile: a target a p99.9 may not go under is no looser
    // for a p95.
    if let SloClass::Latency(t) = slo.class {
        if t.target_ns < policy.min_p999_ns {
            let min = duration_text(policy.min_p999_ns);
            let field = t.quantile.field();
            return Err((
                field,
                format!("is tighter than {min}, the tightest {} the config's [labels] min_p999 allows; declare {}={min} or more, or lower min_p999 in the config", t.quantile.label(), key(field)),
            ));
        }
    }
    if let Some(max) = policy.max_rate_bps {
        let max_text = bytes_rate_text(max);
        let above = |field: SloField| {
            (
                field,
                format!("is above {max_text}, the most the config's [labels] max_rate allows; declare at most {}={max_text}, or raise max_rate in the config", key(field)),
            )
        };
        if let SloClass::Throughput { rate_bps } = slo.class {
            if rate_bps > max {
                return Err(above(SloField::Rate));
            }
        }
        match slo.floor {
            Some(Rate::BytesPerSec(f)) if f > max => return Err(above(SloField::Floor)),
            // Without an I/O size, an IOPS floor has no byte rate to bound.
            Some(Rate::IosPerSec(_)) => {
                return Err((
                    SloField::Floor,
                    format!("cannot be checked against the config's [labels] max_rate ({max_text}), which is in bytes per second; declare {} in bytes per second, e.g. {}=10MB/s", key(SloField::Floor), key(SloField::Floor)),
                ))
            }
            _ => {}
        }
    }
    if let Some(w) = slo.weight {
        if w > policy.max_weight {
            let max = policy.max_weight;
            return Err((
                SloField::Weight,
                format!("is above {max}, the highest weight the config's [labels] max_weight allows; declare at most {}={max}, or raise max_weight in the config", key(SloField::Weight)),
            ));
        }
    }
    Ok(())
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
            slo_from_labels(&l, &LabelPolicy::default()),
            Ok(Some(Slo {
                class: SloClass::latency_p999(20_000_000),
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
            slo_from_labels(&l, &LabelPolicy::default())
                .unwrap()
                .unwrap()
                .class,
            SloClass::Throughput {
                rate_bps: 150_000_000
            }
        );
        let l = labels(&[("isolator.class", "best-effort"), ("isolator.weight", "50")]);
        assert_eq!(
            slo_from_labels(&l, &LabelPolicy::default())
                .unwrap()
                .unwrap()
                .weight,
            Some(50)
        );
        assert_eq!(
            slo_from_labels(&labels(&[("app", "x")]), &LabelPolicy::default()),
            Ok(None)
        );
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
                vec![
                    ("isolator.class", "latency"),
                    ("isolator.p999", "5ms"),
                    ("isolator.p95", "2ms"),
                ],
                "isolator.p95",
                "isolator.p999 and isolator.p95 are both set; a latency SLO is judged at one quantile, keep one",
            ),
            (
                vec![("isolator.p98", "5ms")],
                "isolator.p98",
                "unknown label",
            ),
            (
                vec![("isolator.class", "best-effort"), ("isolator.weight", "0")],
                "isolator.weight",
                "1..10000",
            ),
        ] {
            let e = slo_from_labels(&labels(&kv), &LabelPolicy::default()).unwrap_err();
            assert_eq!(e.label, label, "{e}");
            assert!(e.to_string().contains(needle), "{e} lacks {needle}");
            assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn labels_within_the_configs_bounds() {
        let defaults = LabelPolicy::default();
        // By default a label may not declare a p99.9 under 1ms: 1ns would get every
        // neighbour throttled (it is under any p99.9's 10us anyway).
        for (p999, needle) in [
            ("1ns", "outside 10us..60s"),
            ("500us", "isolator.p999=500us is tighter than 1ms, the tightest p99.9 the config's [labels] min_p999 allows; declare isolator.p999=1ms or more"),
        ] {
            let l = labels(&[("isolator.class", "latency"), ("isolator.p999", p999)]);
            let e = slo_from_labels(&l, &defaults).unwrap_err();
            assert_eq!((e.label.as_str(), e.value.as_str()), ("isolator.p999", p999));
            assert!(e.message.contains(needle), "{e} lacks {needle}");
        }
        // At any quantile: a p95 under the bound is refused the same way.
        let e = slo_from_labels(
            &labels(&[("isolator.class", "latency"), ("isolator.p95", "500us")]),
            &LabelPolicy::default(),
        )
        .unwrap_err();
        assert_eq!(e.label, "isolator.p95");
        assert!(
            e.to_string().contains("isolator.p95=500us is tighter than 1ms, the tightest p95 the config's [labels] min_p999 allows; declare isolator.p95=1ms or more"),
            "{e}"
        );
        let l = labels(&[("isolator.class", "latency"), ("isolator.p999", "1ms")]);
        assert!(slo_from_labels(&l, &defaults).unwrap().is_some());

        let strict = LabelPolicy {
            enabled: true,
            min_p999_ns: 5_000_000,
            max_rate_bps: Some(1_000_000_000),
            max_weight: 1000,
            classes: vec!["latency", "best-effort"],
        };
        for (kv, label, needle) in [
            (
                vec![("isolator.class", "latency"), ("isolator.p999", "4ms")],
                "isolator.p999",
                "isolator.p999=4ms is tighter than 5ms, the tightest p99.9 the config's [labels] min_p999 allows",
            ),
            (
                vec![("isolator.class", "throughput"), ("isolator.rate", "10MB/s")],
                "isolator.class",
                "isolator.class=throughput is a class the config's [labels] classes does not allow (it allows latency, best-effort)",
            ),
            (
                vec![("isolator.class", "best-effort"), ("isolator.floor", "2GB/s")],
                "isolator.floor",
                "is above 1GB/s, the most the config's [labels] max_rate allows",
            ),
            (
                vec![("isolator.class", "best-effort"), ("isolator.floor", "500iops")],
                "isolator.floor",
                "in bytes per second",
            ),
            (
                vec![("isolator.class", "best-effort"), ("isolator.weight", "1001")],
                "isolator.weight",
                "isolator.weight=1001 is above 1000, the highest weight the config's [labels] max_weight allows",
            ),
        ] {
            let e = slo_from_labels(&labels(&kv), &strict).unwrap_err();
            assert_eq!(e.label, label, "{e}");
            assert!(e.message.contains(needle), "{e} lacks {needle}");
        }
        let l = labels(&[
            ("isolator.class", "best-effort"),
            ("isolator.floor", "1GB/s"),
            ("isolator.weight", "1000"),
        ]);
        assert!(slo_from_labels(&l, &strict).unwrap().is_some());
        let over = LabelPolicy {
            classes: vec!["throughput"],
            ..strict.clone()
        };
        let l = labels(&[
            ("isolator.class", "throughput"),
            ("isolator.rate", "1001MB/s"),
        ]);
        assert!(slo_from_labels(&l, &over)
            .unwrap_err()
            .message
            .contains("max_rate"));

        // Disabled: nothing a container says counts, not even a malformed label.
        let off = LabelPolicy {
            enabled: false,
            ..LabelPolicy::default()
        };
        let l = labels(&[
            ("isolator.class", "latency"),
            ("isolator.p999", "1ns"),
            ("isolator.x", "y"),
        ]);
        assert_eq!(slo_from_labels(&l, &off), Ok(None));
    }

    mod props {
        use proptest::prelude::*;

        use super::super::*;
        use crate::config::{LATENCY_TARGET_RANGE_NS, MAX_RATE_BPS};

        /// Label values: quantities in every unit, classes, integers, any text.
        fn label_value() -> impl Strategy<Value = String> {
            prop_oneof![
                (
                    prop_oneof![
                        any::<f64>().prop_map(|v| v.to_string()),
                        any::<i64>().prop_map(|v| v.to_string()),
                        (0u32..100_000).prop_map(|v| v.to_string()),
                        prop::sample::select(vec!["0.4", "1e20", "-1", "", "18446744073709551616"])
                            .prop_map(str::to_string),
                    ],
                    prop::sample::select(vec![
                        "", "ns", "us", "ms", "s", "B/s", "KB/s", "MB/s", "GB/s", "MiB/s", "iops",
                        " ms", "x",
                    ]),
                )
                    .prop_map(|(n, u)| format!("{n}{u}")),
                prop::sample::select(vec![
                    "latency",
                    "throughput",
                    "best-effort",
                    " latency ",
                    "fast"
                ])
                .prop_map(str::to_string),
                any::<String>(),
            ]
        }

        fn label_key() -> impl Strategy<Value = String> {
            prop_oneof![
                8 => prop::sample::select(SloField::ALL.map(SloField::key).to_vec())
                    .prop_map(|k| format!("{PREFIX}{k}")),
                1 => any::<String>().prop_map(|k| format!("{PREFIX}{k}")),
                1 => any::<String>(),
            ]
        }

        fn policy() -> impl Strategy<Value = LabelPolicy> {
            (
                prop::bool::weighted(0.9),
                LATENCY_TARGET_RANGE_NS,
                prop::option::of(1..=MAX_RATE_BPS),
                1..=10_000u32,
                prop::sample::subsequence(crate::config::CLASSES.to_vec(), 0..=3),
            )
                .prop_map(
                    |(enabled, min_p999_ns, max_rate_bps, max_weight, classes)| LabelPolicy {
                        enabled,
                        min_p999_ns,
                        max_rate_bps,
                        max_weight,
                        classes,
                    },
                )
        }

        proptest! {
            #![proptest_config(crate::proptest_budget(2000))]

            /// Any labels, any bounds: an SLO within them, nothing, or an error naming a
            /// label on one line; never a panic.
            #[test]
            fn labels_of_any_map(
                labels in prop::collection::hash_map(label_key(), label_value(), 0..8),
                policy in policy(),
            ) {
                match slo_from_labels(&labels, &policy) {
                    Ok(Some(slo)) => {
                        prop_assert!(policy.enabled);
                        prop_assert!(policy.classes.contains(&slo.class.name()));
                        if let SloClass::Latency(t) = slo.class {
                            prop_assert!(t.target_ns >= policy.min_p999_ns);
                        }
                        if let SloClass::Throughput { rate_bps } = slo.class {
                            prop_assert!(policy.max_rate_bps.is_none_or(|max| rate_bps <= max));
                        }
                        prop_assert!(slo.weight.is_none_or(|w| w <= policy.max_weight));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        prop_assert!(policy.enabled);
                        prop_assert!(!e.message.contains('\n'), "{e}");
                        prop_assert!(labels.contains_key(&e.label), "{e}");
                    }
                }
            }
        }
    }
}
