//! The SLO config (`--config`, TOML): which cgroups form which service and what each
//! service is promised. Every error names the file, the line and the fix.

use std::{
    collections::HashMap,
    ops::{Range, RangeInclusive},
    path::Path,
};

use serde::Deserialize;
use thiserror::Error;
use toml::Spanned;

use crate::{
    identify::containers::{ContainerInfo, ContainerTable, PodMember},
    identify::naming::{self, PathName, ServiceKind},
    policy::MIN_CAP_BPS,
};

/// A service's promise. In events: `{"class": "latency", "p999_ns": N}` (or `p99_ns`,
/// `p95_ns`, `p90_ns`: the key names the quantile), `{"class": "throughput", "rate_bps": N}`
/// or `{"class": "best-effort"}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "kebab-case")]
pub enum SloClass {
    /// Device latency at the target's quantile at or below the target.
    Latency(LatencyTarget),
    /// Throughput (read + write) at or above the target.
    Throughput { rate_bps: u64 },
    /// No promise; first to be throttled.
    #[default]
    BestEffort,
}

impl SloClass {
    /// A latency SLO on the p99.9.
    pub const fn latency_p999(target_ns: u64) -> SloClass {
        SloClass::Latency(LatencyTarget {
            quantile: LatencyQuantile::P999,
            target_ns,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            SloClass::Latency(_) => "latency",
            SloClass::Throughput { .. } => "throughput",
            SloClass::BestEffort => "best-effort",
        }
    }

    /// `latency p99.9 <= 20.000ms`, for messages.
    pub fn describe(&self) -> String {
        match self {
            SloClass::Latency(t) => {
                format!(
                    "latency {} <= {:.3}ms",
                    t.quantile.label(),
                    t.target_ns as f64 / 1e6
                )
            }
            SloClass::Throughput { rate_bps } => {
                format!("throughput rate >= {:.1}MB/s", *rate_bps as f64 / 1e6)
            }
            SloClass::BestEffort => "best-effort".into(),
        }
    }
}

/// The quantile of a cycle's I/O latencies a latency SLO is judged at. p99.9 unless the
/// operator names another: a database doing a thousand reads a cycle has a p99.9 that is
/// its second-worst read, which moved by nothing between a writer at 300 MB/s and one at
/// 3.7 GB/s, while the share of its slow reads, which its queries wait on, tripled
/// (BENCHMARKS.md, run CA's events). A lower quantile sees that.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, Deserialize)]
pub enum LatencyQuantile {
    #[serde(rename = "p90")]
    P90,
    #[serde(rename = "p95")]
    P95,
    #[serde(rename = "p99")]
    P99,
    #[serde(rename = "p99.9")]
    #[default]
    P999,
}

impl LatencyQuantile {
    pub const ALL: [LatencyQuantile; 4] = [
        LatencyQuantile::P999,
        LatencyQuantile::P99,
        LatencyQuantile::P95,
        LatencyQuantile::P90,
    ];

    pub fn fraction(self) -> f64 {
        match self {
            LatencyQuantile::P90 => 0.90,
            LatencyQuantile::P95 => 0.95,
            LatencyQuantile::P99 => 0.99,
            LatencyQuantile::P999 => 0.999,
        }
    }

    /// `p99.9`, for messages and screens.
    pub fn label(self) -> &'static str {
        match self {
            LatencyQuantile::P90 => "p90",
            LatencyQuantile::P95 => "p95",
            LatencyQuantile::P99 => "p99",
            LatencyQuantile::P999 => "p99.9",
        }
    }

    /// The config key that sets a target at this quantile.
    pub fn field(self) -> SloField {
        match self {
            LatencyQuantile::P90 => SloField::P90,
            LatencyQuantile::P95 => SloField::P95,
            LatencyQuantile::P99 => SloField::P99,
            LatencyQuantile::P999 => SloField::P999,
        }
    }
}

/// A latency SLO's target: the cycle's latency at `quantile` at or below `target_ns`.
/// Serialized as one key that names both, `{"p95_ns": 3000000}`, so that a p99.9 SLO reads
/// as it always has (`p999_ns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(try_from = "LatencyTargetRepr", into = "LatencyTargetRepr")]
pub struct LatencyTarget {
    pub quantile: LatencyQuantile,
    pub target_ns: u64,
}

#[derive(Default, serde::Serialize, Deserialize)]
struct LatencyTargetRepr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    p999_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    p99_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    p95_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    p90_ns: Option<u64>,
}

impl From<LatencyTarget> for LatencyTargetRepr {
    fn from(t: LatencyTarget) -> Self {
        let mut r = LatencyTargetRepr::default();
        *match t.quantile {
            LatencyQuantile::P999 => &mut r.p999_ns,
            LatencyQuantile::P99 => &mut r.p99_ns,
            LatencyQuantile::P95 => &mut r.p95_ns,
            LatencyQuantile::P90 => &mut r.p90_ns,
        } = Some(t.target_ns);
        r
    }
}

impl TryFrom<LatencyTargetRepr> for LatencyTarget {
    type Error = &'static str;
    fn try_from(r: LatencyTargetRepr) -> Result<Self, Self::Error> {
        let set: Vec<_> = [
            (LatencyQuantile::P999, r.p999_ns),
            (LatencyQuantile::P99, r.p99_ns),
            (LatencyQuantile::P95, r.p95_ns),
            (LatencyQuantile::P90, r.p90_ns),
        ]
        .into_iter()
        .filter_map(|(quantile, ns)| Some((quantile, ns?)))
        .collect();
        match set[..] {
            [(quantile, target_ns)] => Ok(LatencyTarget {
                quantile,
                target_ns,
            }),
            [] => Err("a latency SLO needs one of p999_ns, p99_ns, p95_ns, p90_ns"),
            _ => Err("a latency SLO has one target, not several quantiles"),
        }
    }
}

/// A rate limit: bytes or I/Os per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rate {
    BytesPerSec(u64),
    IosPerSec(u64),
}

/// One `[[service]]` of the config.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceSpec {
    pub name: String,
    /// What cgroups the service is made of: all matchers must match.
    pub matchers: Vec<Matcher>,
    pub class: SloClass,
    /// Never throttled below this.
    pub floor: Option<Rate>,
    /// Always capped at this.
    pub ceiling: Option<Rate>,
    /// io.weight (v2) or blkio.bfq.weight (v1), written once at start.
    pub weight: Option<u32>,
    /// Line of the `[[service]]` header, for messages.
    pub line: usize,
    /// Line of the service's first matcher, for messages about what it matches.
    pub match_line: usize,
}

/// Which cgroups a service is made of.
#[derive(Debug, Clone, PartialEq)]
pub enum Matcher {
    /// Glob over cgroup paths relative to the io hierarchy root, e.g. `/db/*`.
    Cgroup(glob::Pattern),
    /// Glob over systemd unit names, e.g. `postgresql@*.service`.
    Unit(glob::Pattern),
    /// Glob over container names (Docker's; containerd's `namespace/pod/container`) and
    /// container ids (full or the 12-hex short id),
    /// e.g. `pg-*` or `3f4e5d6c7b8a*`.
    Container(glob::Pattern),
    /// Glob over Kubernetes pod UIDs and (from containerd) pod names: the pod's cgroup
    /// (its containers are below it), or where a pod has none, its containers' cgroups.
    Pod(glob::Pattern),
    /// Glob over Kubernetes namespaces (from containerd): the cgroups a pod matcher takes.
    Namespace(glob::Pattern),
    /// Glob over a container's image (as Docker or containerd says), e.g. `postgres:*`.
    Image(glob::Pattern),
    /// A container label (Docker's or containerd's): `key` present, or `key=glob` with a
    /// matching value.
    Label {
        key: String,
        value: Option<glob::Pattern>,
    },
    /// A pod label (its sandbox's, from containerd), as `Label`: the cgroups a pod matcher
    /// takes.
    PodLabel {
        key: String,
        value: Option<glob::Pattern>,
    },
}

impl Matcher {
    /// The matcher a config key spells. Cgroup paths are anchored at the hierarchy root;
    /// a label is `key` or `key=glob`.
    fn parse(key_name: &str, text: &str) -> Result<Matcher, String> {
        let glob = |t: &str| glob::Pattern::new(t.trim()).map_err(|e| e.to_string());
        Ok(match key_name {
            "cgroup" if !text.starts_with('/') => Matcher::Cgroup(glob(&format!("/{text}"))?),
            "cgroup" => Matcher::Cgroup(glob(text)?),
            "unit" => Matcher::Unit(glob(text)?),
            "container" => Matcher::Container(glob(text)?),
            "pod" => Matcher::Pod(glob(text)?),
            "namespace" => Matcher::Namespace(glob(text)?),
            "image" => Matcher::Image(glob(text)?),
            "label" | "pod_label" => {
                let (k, value) = match text.split_once('=') {
                    Some((k, v)) => (k.trim(), Some(glob(v)?)),
                    None => (text.trim(), None),
                };
                if k.is_empty() {
                    return Err("the label key is empty".into());
                }
                let key = k.to_string();
                if key_name == "label" {
                    Matcher::Label { key, value }
                } else {
                    Matcher::PodLabel { key, value }
                }
            }
            _ => unreachable!("config keys are fixed by RawService"),
        })
    }

    pub fn key(&self) -> &'static str {
        match self {
            Matcher::Cgroup(_) => "cgroup",
            Matcher::Unit(_) => "unit",
            Matcher::Container(_) => "container",
            Matcher::Pod(_) => "pod",
            Matcher::Namespace(_) => "namespace",
            Matcher::Image(_) => "image",
            Matcher::Label { .. } => "label",
            Matcher::PodLabel { .. } => "pod_label",
        }
    }

    /// The matcher as the config spells its value.
    fn text(&self) -> String {
        match self {
            Matcher::Cgroup(p)
            | Matcher::Unit(p)
            | Matcher::Container(p)
            | Matcher::Pod(p)
            | Matcher::Namespace(p)
            | Matcher::Image(p) => p.as_str().to_string(),
            Matcher::Label { key, value } | Matcher::PodLabel { key, value } => match value {
                None => key.clone(),
                Some(v) => format!("{key}={}", v.as_str()),
            },
        }
    }

    /// Whether the matcher names an owner (unit, container, pod, namespace, image, label,
    /// pod label) rather than a path: owners come and go, so matching nothing at start is
    /// not an error.
    pub fn is_owner(&self) -> bool {
        !matches!(self, Matcher::Cgroup(_))
    }

    /// Whether the cgroup `o` (named by its path and by what its runtime says) matches.
    pub fn matches(&self, o: &Owner) -> bool {
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        let m = |p: &glob::Pattern, s: &str| p.matches_with(s, opts);
        let label =
            |labels: Option<&HashMap<String, String>>, key: &str, value: &Option<glob::Pattern>| {
                labels
                    .and_then(|l| l.get(key))
                    .is_some_and(|v| value.as_ref().is_none_or(|p| m(p, v)))
            };
        let named = &o.named;
        // Each owner matcher takes the owner's own cgroup only: its descendants belong to
        // it anyway (nearest matching ancestor), and limits go on one level.
        match (self, named.kind) {
            (Matcher::Cgroup(p), _) => m(p, o.path),
            (Matcher::Unit(p), ServiceKind::Unit) => m(p, &named.name),
            (Matcher::Container(p), ServiceKind::Container) => {
                m(p, &named.name)
                    || named.id.as_deref().is_some_and(|s| m(p, s))
                    || o.container.is_some_and(|c| m(p, &c.name))
            }
            (Matcher::Pod(p), _) => o
                .pod
                .as_ref()
                .is_some_and(|pod| m(p, &pod.uid) || pod.member.is_some_and(|k| m(p, &k.name))),
            (Matcher::Namespace(p), _) => o
                .pod
                .as_ref()
                .and_then(|pod| pod.member)
                .is_some_and(|k| m(p, &k.namespace)),
            (Matcher::PodLabel { key, value }, _) => {
                label(o.pod.as_ref().and_then(|pod| pod.labels), key, value)
            }
            (Matcher::Image(p), ServiceKind::Container) => {
                o.container.is_some_and(|c| m(p, &c.image))
            }
            (Matcher::Label { key, value }, ServiceKind::Container) => {
                label(o.container.map(|c| &c.labels), key, value)
            }
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    pub services: Vec<ServiceSpec>,
    /// What container labels may declare (`[labels]`).
    pub labels: LabelPolicy,
    /// Disks to enable iocost on while the agent runs (`[iocost] disks`), so that weights
    /// act there: a host-wide change, made only when asked.
    pub iocost: Vec<IocostDisk>,
}

/// One disk of `[iocost] disks`: a block device name (`vda`, `/dev/nvme0n1`) or
/// `major:minor`, and its line for messages.
#[derive(Debug, Clone, PartialEq)]
pub struct IocostDisk {
    pub disk: String,
    pub line: usize,
}

/// The classes a service can have, as the config and labels spell them.
pub const CLASSES: [&str; 3] = ["latency", "throughput", "best-effort"];
/// A latency target is within this, inclusive: under 10us is below what a device can be
/// judged on, over 60s is a typo.
pub const LATENCY_TARGET_RANGE_NS: RangeInclusive<u64> = 10_000..=60_000_000_000;
/// The highest byte rate accepted, 1 PB/s: beyond any disk, so a larger one is a typo (and
/// it stays far from where u64 would saturate).
pub const MAX_RATE_BPS: u64 = 1_000_000_000_000_000;
/// The same for I/Os per second.
pub const MAX_RATE_IOPS: u64 = 1_000_000_000;
/// io.weight's range (v1's bfq weight is narrower, 1..1000: clamped when written).
pub const WEIGHT_RANGE: RangeInclusive<i64> = 1..=10_000;

/// The `[labels]` section: what a container may declare in its `isolator.*` labels, so
/// that no container can ask for an SLO that throttles its neighbours without bound.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelPolicy {
    /// false: container labels never become services.
    pub enabled: bool,
    /// The tightest p99.9 a label may declare.
    pub min_p999_ns: u64,
    /// The highest rate (target or floor, bytes/s) a label may declare; None: no bound.
    pub max_rate_bps: Option<u64>,
    /// The highest weight a label may declare.
    pub max_weight: u32,
    /// The classes a label may declare, spelled as in [`CLASSES`].
    pub classes: Vec<&'static str>,
}

impl Default for LabelPolicy {
    fn default() -> Self {
        LabelPolicy {
            enabled: true,
            min_p999_ns: 1_000_000,
            max_rate_bps: None,
            max_weight: 10_000,
            classes: CLASSES.to_vec(),
        }
    }
}

#[derive(Debug, Error, PartialEq)]
#[error("{file}:{line}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl ConfigError {
    /// An error on one line: values quoted in `message` may hold newlines (TOML strings,
    /// cgroup names), which are escaped.
    fn new(file: &str, line: usize, message: &str) -> ConfigError {
        ConfigError {
            file: file.to_string(),
            line,
            message: one_line(message),
        }
    }
}

/// `s` with control characters escaped (`\n`), so a message stays one line whatever
/// values it quotes.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    service: Vec<Spanned<RawService>>,
    labels: Option<RawLabels>,
    iocost: Option<RawIocost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIocost {
    disks: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLabels {
    enabled: Option<bool>,
    min_p999: Option<Spanned<String>>,
    max_rate: Option<Spanned<String>>,
    max_weight: Option<Spanned<i64>>,
    classes: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    name: Spanned<String>,
    cgroup: Option<Spanned<String>>,
    unit: Option<Spanned<String>>,
    container: Option<Spanned<String>>,
    pod: Option<Spanned<String>>,
    namespace: Option<Spanned<String>>,
    image: Option<Spanned<String>>,
    label: Option<Spanned<String>>,
    pod_label: Option<Spanned<String>>,
    class: Spanned<String>,
    p999: Option<Spanned<String>>,
    p99: Option<Spanned<String>>,
    p95: Option<Spanned<String>>,
    p90: Option<Spanned<String>>,
    rate: Option<Spanned<String>>,
    floor: Option<Spanned<String>>,
    ceiling: Option<Spanned<String>>,
    weight: Option<Spanned<i64>>,
}

fn spanned_text(f: &Option<Spanned<String>>) -> Option<&str> {
    f.as_ref().map(|v| v.get_ref().as_str())
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Splits "20ms" into its number and its unit ("20", "ms"); the sign stays with the number
/// so that "-5ms" is reported as a bad value, not a bad unit.
fn split_quantity(s: &str) -> (&str, &str) {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(t.len());
    t.split_at(split)
}

/// Parses "20ms", "500us", "1.5s", "250000ns" into nanoseconds: at least 1ns (nothing
/// rounds to 0) and within u64 (nothing saturates).
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let (num, unit) = split_quantity(s);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration; write e.g. \"20ms\" or \"500us\""))?;
    let scale = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "" => return Err(format!("'{s}' has no unit; write e.g. \"{num}ms\"")),
        u => return Err(format!("unknown unit '{u}' in '{s}'; use ns, us, ms or s")),
    };
    if v.is_nan() || v <= 0.0 {
        return Err(format!(
            "'{s}' must be greater than zero; write e.g. \"20ms\""
        ));
    }
    let ns = (v * scale).round();
    if ns < 1.0 {
        return Err(format!(
            "'{s}' is less than 1ns, the finest duration there is; write at least \"1ns\""
        ));
    }
    // u64::MAX as f64 is 2^64: at or above it the cast would saturate.
    if ns >= u64::MAX as f64 {
        return Err(format!(
            "'{s}' is longer than 584 years, more than a duration can hold; write e.g. \"20ms\""
        ));
    }
    Ok(ns as u64)
}

/// Parses "150MB/s", "1.5GiB/s", "800KB/s", "500iops" (decimal and binary prefixes): at
/// least 1 B/s or 1 I/O per second (nothing rounds to 0), at most [`MAX_RATE_BPS`] or
/// [`MAX_RATE_IOPS`] (nothing saturates).
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let (num, unit) = split_quantity(s);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a rate; write e.g. \"150MB/s\" or \"500iops\""))?;
    if v.is_nan() || v <= 0.0 {
        return Err(format!(
            "'{s}' must be greater than zero; write e.g. \"150MB/s\""
        ));
    }
    let unit = unit.trim();
    if unit.eq_ignore_ascii_case("iops") {
        let n = v.round();
        if n < 1.0 {
            return Err(format!(
                "'{s}' is less than 1 I/O per second; write at least \"1iops\""
            ));
        }
        if n > MAX_RATE_IOPS as f64 {
            return Err(format!(
                "'{s}' is more than {MAX_RATE_IOPS}iops, beyond any disk; write a real rate, e.g. \"500iops\""
            ));
        }
        return Ok(Rate::IosPerSec(n as u64));
    }
    let scale = match unit {
        "B/s" => 1.0,
        "KB/s" | "kB/s" => 1e3,
        "MB/s" => 1e6,
        "GB/s" => 1e9,
        "KiB/s" => 1024.0,
        "MiB/s" => 1024.0 * 1024.0,
        "GiB/s" => 1024.0 * 1024.0 * 1024.0,
        "" => return Err(format!("'{s}' has no unit; write e.g. \"{num}MB/s\"")),
        u => {
            return Err(format!(
            "unknown unit '{u}' in '{s}'; use B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s, GiB/s or iops"
        ))
        }
    };
    let bps = (v * scale).round();
    if bps < 1.0 {
        return Err(format!(
            "'{s}' is less than 1 byte per second; write at least \"1B/s\""
        ));
    }
    if bps > MAX_RATE_BPS as f64 {
        return Err(format!(
            "'{s}' is more than 1PB/s (1000000GB/s), beyond any disk; write a real rate, e.g. \"150MB/s\""
        ));
    }
    Ok(Rate::BytesPerSec(bps as u64))
}

/// A duration as the config spells it, in the largest unit that keeps it exact: parses
/// back to `ns`.
pub fn duration_text(ns: u64) -> String {
    match ns {
        0 => "0ns".into(),
        n if n.is_multiple_of(1_000_000_000) => format!("{}s", n / 1_000_000_000),
        n if n.is_multiple_of(1_000_000) => format!("{}ms", n / 1_000_000),
        n if n.is_multiple_of(1_000) => format!("{}us", n / 1_000),
        n => format!("{n}ns"),
    }
}

/// A byte rate as the config spells it, in the largest unit that keeps it exact: parses
/// back to `bps`.
pub fn bytes_rate_text(bps: u64) -> String {
    let units: [(u64, &str); 6] = [
        (1_000_000_000, "GB/s"),
        (1 << 30, "GiB/s"),
        (1_000_000, "MB/s"),
        (1 << 20, "MiB/s"),
        (1_000, "KB/s"),
        (1 << 10, "KiB/s"),
    ];
    match units
        .iter()
        .find(|&&(u, _)| bps > 0 && bps.is_multiple_of(u))
    {
        Some((u, name)) => format!("{}{name}", bps / u),
        None => format!("{bps}B/s"),
    }
}

/// One field of a service's SLO, to point at the one at fault: a line of the config, a
/// container label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloField {
    Class,
    P999,
    P99,
    P95,
    P90,
    Rate,
    Floor,
    Ceiling,
    Weight,
}

impl SloField {
    pub const ALL: [SloField; 9] = [
        SloField::Class,
        SloField::P999,
        SloField::P99,
        SloField::P95,
        SloField::P90,
        SloField::Rate,
        SloField::Floor,
        SloField::Ceiling,
        SloField::Weight,
    ];

    pub fn key(self) -> &'static str {
        match self {
            SloField::Class => "class",
            SloField::P999 => "p999",
            SloField::P99 => "p99",
            SloField::P95 => "p95",
            SloField::P90 => "p90",
            SloField::Rate => "rate",
            SloField::Floor => "floor",
            SloField::Ceiling => "ceiling",
            SloField::Weight => "weight",
        }
    }
}

/// A service's SLO fields as written, wherever they come from (config file, labels).
#[derive(Debug, Default, Clone, Copy)]
pub struct SloText<'a> {
    pub class: &'a str,
    pub p999: Option<&'a str>,
    pub p99: Option<&'a str>,
    pub p95: Option<&'a str>,
    pub p90: Option<&'a str>,
    pub rate: Option<&'a str>,
    pub floor: Option<&'a str>,
    pub ceiling: Option<&'a str>,
    pub weight: Option<i64>,
}

impl SloText<'_> {
    fn get(&self, f: SloField) -> Option<&str> {
        match f {
            SloField::Class => Some(self.class),
            SloField::P999 => self.p999,
            SloField::P99 => self.p99,
            SloField::P95 => self.p95,
            SloField::P90 => self.p90,
            SloField::Rate => self.rate,
            SloField::Floor => self.floor,
            SloField::Ceiling => self.ceiling,
            SloField::Weight => None,
        }
    }
}

/// What a service is promised and its limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    pub class: SloClass,
    pub floor: Option<Rate>,
    pub ceiling: Option<Rate>,
    pub weight: Option<u32>,
}

/// A broken SLO rule. The rules live here once, for every source of SLOs; each source
/// spells the fields its own way in [`SloRuleError::describe`].
#[derive(Debug, Clone, PartialEq)]
pub enum SloRuleError {
    UnknownClass(String),
    MissingTarget {
        class: &'static str,
        field: SloField,
        example: &'static str,
    },
    NotForClass {
        field: SloField,
        class: &'static str,
    },
    Invalid {
        field: SloField,
        message: String,
    },
    /// Targets at two quantiles (`p999` and `p95`): a latency SLO has one.
    TwoLatencyTargets(SloField, SloField),
    RateNotBytes,
    /// `policy::ServiceLoad` caps in bytes only: an IOPS ceiling would be ignored.
    CeilingNotBytes,
    /// Below [`MIN_CAP_BPS`], which no cap goes under: it could never be honoured.
    CeilingBelowMinimum,
    /// An IOPS floor and a bytes ceiling cannot be compared without an I/O size.
    FloorCeilingUnits,
    FloorAboveCeiling,
    WeightOutOfRange(i64),
}

impl SloRuleError {
    /// The field to point at.
    pub fn field(&self) -> SloField {
        match self {
            SloRuleError::UnknownClass(_) | SloRuleError::MissingTarget { .. } => SloField::Class,
            SloRuleError::NotForClass { field, .. } | SloRuleError::Invalid { field, .. } => *field,
            SloRuleError::TwoLatencyTargets(_, second) => *second,
            SloRuleError::RateNotBytes => SloField::Rate,
            SloRuleError::CeilingNotBytes | SloRuleError::CeilingBelowMinimum => SloField::Ceiling,
            SloRuleError::FloorCeilingUnits | SloRuleError::FloorAboveCeiling => SloField::Floor,
            SloRuleError::WeightOutOfRange(_) => SloField::Weight,
        }
    }

    /// One line with the fix. `spell(field, value)` writes a field as the source does:
    /// `p999 = "20ms"` in the config, `isolator.p999=20ms` on a label.
    pub fn describe(&self, spell: impl Fn(SloField, Option<&str>) -> String) -> String {
        match self {
            SloRuleError::UnknownClass(c) => format!(
                "{}: unknown class '{c}'; use latency, throughput or best-effort",
                spell(SloField::Class, None)
            ),
            SloRuleError::MissingTarget {
                class,
                field,
                example,
            } => format!(
                "{} needs a target; add {}",
                spell(SloField::Class, Some(class)),
                spell(*field, Some(example))
            ),
            SloRuleError::NotForClass { field, class } => format!(
                "{} does not apply to class {class}; remove it or change the class",
                spell(*field, None)
            ),
            SloRuleError::Invalid { field, message } => {
                format!("{}: {message}", spell(*field, None))
            }
            SloRuleError::TwoLatencyTargets(first, second) => format!(
                "{} and {} are both set; a latency SLO is judged at one quantile, keep one",
                spell(*first, None),
                spell(*second, None)
            ),
            SloRuleError::RateNotBytes => format!(
                "{} must be in bytes per second; write e.g. {}",
                spell(SloField::Rate, None),
                spell(SloField::Rate, Some("150MB/s"))
            ),
            SloRuleError::CeilingNotBytes => format!(
                "{} must be in bytes per second; write e.g. {}",
                spell(SloField::Ceiling, None),
                spell(SloField::Ceiling, Some("200MB/s"))
            ),
            SloRuleError::CeilingBelowMinimum => format!(
                "{} is below 1MiB/s, the lowest cap the agent ever writes, so it could never be honoured; write at least {}",
                spell(SloField::Ceiling, None),
                spell(SloField::Ceiling, Some("1MiB/s"))
            ),
            SloRuleError::FloorCeilingUnits => format!(
                "{} and {} must be in the same unit to be compared, and a ceiling is in bytes per second; write the floor in bytes per second too, e.g. {}",
                spell(SloField::Floor, None),
                spell(SloField::Ceiling, None),
                spell(SloField::Floor, Some("10MB/s"))
            ),
            SloRuleError::FloorAboveCeiling => format!(
                "{} is above {}; lower the floor or raise the ceiling",
                spell(SloField::Floor, None),
                spell(SloField::Ceiling, None)
            ),
            SloRuleError::WeightOutOfRange(w) => format!(
                "{} {w} is outside 1..10000; pick a weight in that range",
                spell(SloField::Weight, None)
            ),
        }
    }
}

/// Checks a service's SLO against the rules: a class's own target is set and the other
/// class's is not, values have units and are in range (a latency target, at any quantile, in
/// [`LATENCY_TARGET_RANGE_NS`], rates
/// by [`parse_rate`]), a throughput target and a ceiling are in bytes, the ceiling is at
/// least [`MIN_CAP_BPS`], a floor and a ceiling are in one unit with the floor not above
/// the ceiling, the weight is in [`WEIGHT_RANGE`].
pub fn parse_slo(t: &SloText) -> Result<Slo, SloRuleError> {
    let invalid = |field| move |message| SloRuleError::Invalid { field, message };
    let absent = |field, class| match t.get(field) {
        Some(_) => Err(SloRuleError::NotForClass { field, class }),
        None => Ok(()),
    };
    let target = |field, class, example| {
        t.get(field).ok_or(SloRuleError::MissingTarget {
            class,
            field,
            example,
        })
    };
    let class = match t.class {
        "latency" => {
            absent(SloField::Rate, "latency")?;
            let mut set = LatencyQuantile::ALL
                .into_iter()
                .filter_map(|q| Some((q, t.get(q.field())?)));
            let Some((quantile, v)) = set.next() else {
                return Err(SloRuleError::MissingTarget {
                    class: "latency",
                    field: SloField::P999,
                    example: "20ms",
                });
            };
            if let Some((second, _)) = set.next() {
                return Err(SloRuleError::TwoLatencyTargets(
                    quantile.field(),
                    second.field(),
                ));
            }
            let field = quantile.field();
            let target_ns = parse_duration_ns(v).map_err(invalid(field))?;
            if !LATENCY_TARGET_RANGE_NS.contains(&target_ns) {
                return Err(SloRuleError::Invalid {
                    field,
                    message: format!(
                        "'{v}' is outside 10us..60s; pick a {} target in that range, e.g. \"5ms\"",
                        quantile.label()
                    ),
                });
            }
            SloClass::Latency(LatencyTarget {
                quantile,
                target_ns,
            })
        }
        "throughput" => {
            for q in LatencyQuantile::ALL {
                absent(q.field(), "throughput")?;
            }
            let v = target(SloField::Rate, "throughput", "150MB/s")?;
            match parse_rate(v).map_err(invalid(SloField::Rate))? {
                Rate::BytesPerSec(rate_bps) => SloClass::Throughput { rate_bps },
                Rate::IosPerSec(_) => return Err(SloRuleError::RateNotBytes),
            }
        }
        "best-effort" => {
            for q in LatencyQuantile::ALL {
                absent(q.field(), "best-effort")?;
            }
            absent(SloField::Rate, "best-effort")?;
            SloClass::BestEffort
        }
        other => return Err(SloRuleError::UnknownClass(other.to_string())),
    };
    let rate = |field| {
        t.get(field)
            .map(|v| parse_rate(v).map_err(invalid(field)))
            .transpose()
    };
    let floor = rate(SloField::Floor)?;
    let ceiling = rate(SloField::Ceiling)?;
    // A floor under the minimum cap is fine (the minimum applies anyway); a ceiling is not.
    match (floor, ceiling) {
        (_, Some(Rate::IosPerSec(_))) => return Err(SloRuleError::CeilingNotBytes),
        (_, Some(Rate::BytesPerSec(c))) if c < MIN_CAP_BPS => {
            return Err(SloRuleError::CeilingBelowMinimum)
        }
        (Some(Rate::IosPerSec(_)), Some(Rate::BytesPerSec(_))) => {
            return Err(SloRuleError::FloorCeilingUnits)
        }
        (Some(Rate::BytesPerSec(f)), Some(Rate::BytesPerSec(c))) if f > c => {
            return Err(SloRuleError::FloorAboveCeiling)
        }
        _ => {}
    }
    let weight = match t.weight {
        Some(w) if !WEIGHT_RANGE.contains(&w) => return Err(SloRuleError::WeightOutOfRange(w)),
        w => w.map(|w| w as u32),
    };
    Ok(Slo {
        class,
        floor,
        ceiling,
        weight,
    })
}

impl LabelPolicy {
    /// The `[labels]` section, by the services' parsers and errors; `err` places a message
    /// on the line of a span.
    fn parse(
        raw: RawLabels,
        err: &impl Fn(Range<usize>, String) -> ConfigError,
    ) -> Result<LabelPolicy, ConfigError> {
        let mut policy = LabelPolicy::default();
        if let Some(enabled) = raw.enabled {
            policy.enabled = enabled;
        }
        if let Some(v) = &raw.min_p999 {
            let text = v.get_ref();
            let ns = parse_duration_ns(text)
                .map_err(|m| err(v.span(), format!("[labels] min_p999: {m}")))?;
            if !LATENCY_TARGET_RANGE_NS.contains(&ns) {
                return Err(err(
                    v.span(),
                    format!("[labels] min_p999 '{text}' is outside 10us..60s; pick a bound in that range, e.g. \"1ms\""),
                ));
            }
            policy.min_p999_ns = ns;
        }
        if let Some(v) = &raw.max_rate {
            match parse_rate(v.get_ref())
                .map_err(|m| err(v.span(), format!("[labels] max_rate: {m}")))?
            {
                Rate::BytesPerSec(bps) => policy.max_rate_bps = Some(bps),
                Rate::IosPerSec(_) => {
                    return Err(err(
                        v.span(),
                        "[labels] max_rate must be in bytes per second; write e.g. max_rate = \"1GB/s\"".into(),
                    ))
                }
            }
        }
        if let Some(v) = &raw.max_weight {
            let w = *v.get_ref();
            if !WEIGHT_RANGE.contains(&w) {
                return Err(err(
                    v.span(),
                    format!(
                        "[labels] max_weight {w} is outside 1..10000; pick a weight in that range"
                    ),
                ));
            }
            policy.max_weight = w as u32;
        }
        if let Some(classes) = &raw.classes {
            policy.classes = classes
                .iter()
                .map(|c| {
                    CLASSES
                        .into_iter()
                        .find(|&k| k == c.get_ref())
                        .ok_or_else(|| {
                            err(
                                c.span(),
                                format!(
                                    "[labels] classes: unknown class '{}'; use latency, throughput or best-effort",
                                    c.get_ref()
                                ),
                            )
                        })
                })
                .collect::<Result<_, _>>()?;
        }
        Ok(policy)
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                &path.display().to_string(),
                0,
                &format!("cannot read the config ({e}); check the --config path"),
            )
        })?;
        Config::parse(&path.display().to_string(), &text)
    }

    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let err = |span: Range<usize>, message: String| {
            ConfigError::new(file, line_of(text, span.start), &message)
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            let message = format!(
                "{}; see docs/config.md for the keys",
                e.message().trim().replace('\n', " ")
            );
            ConfigError::new(file, line, &message)
        })?;
        let labels = match raw.labels {
            Some(l) => LabelPolicy::parse(l, &err)?,
            None => LabelPolicy::default(),
        };
        let mut services = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        for s in raw.service {
            let line = line_of(text, s.span().start);
            let s = s.into_inner();
            let name = s.name.get_ref().trim().to_string();
            if name.is_empty() {
                return Err(err(
                    s.name.span(),
                    "service name is empty; give it a name".into(),
                ));
            }
            if let Some(prev) = names.insert(name.clone(), line) {
                return Err(err(
                    s.name.span(),
                    format!("service '{name}' is defined twice (also on line {prev}); rename one"),
                ));
            }
            let mut matchers = Vec::new();
            let mut match_line = None;
            let kinds = [
                ("cgroup", &s.cgroup),
                ("unit", &s.unit),
                ("container", &s.container),
                ("pod", &s.pod),
                ("namespace", &s.namespace),
                ("image", &s.image),
                ("label", &s.label),
                ("pod_label", &s.pod_label),
            ];
            for (key, raw) in kinds {
                let Some(raw) = raw else { continue };
                let glob_text = raw.get_ref().trim();
                if glob_text.is_empty() {
                    return Err(err(
                        raw.span(),
                        format!("{key} of service '{name}' is empty; give a glob"),
                    ));
                }
                let m = Matcher::parse(key, glob_text).map_err(|e| {
                    err(
                        raw.span(),
                        format!("{key} glob '{glob_text}' is invalid ({e}); fix the pattern"),
                    )
                })?;
                match_line.get_or_insert(line_of(text, raw.span().start));
                matchers.push(m);
            }
            let Some(match_line) = match_line else {
                return Err(err(
                    s.name.span(),
                    format!("service '{name}' matches nothing; add cgroup = \"/path\" (or unit, container, pod, namespace, image, label, pod_label)"),
                ));
            };
            let slo = parse_slo(&SloText {
                class: s.class.get_ref(),
                p999: spanned_text(&s.p999),
                p99: spanned_text(&s.p99),
                p95: spanned_text(&s.p95),
                p90: spanned_text(&s.p90),
                rate: spanned_text(&s.rate),
                floor: spanned_text(&s.floor),
                ceiling: spanned_text(&s.ceiling),
                weight: s.weight.as_ref().map(|w| *w.get_ref()),
            })
            .map_err(|e| {
                let span = match e.field() {
                    SloField::Class => Some(s.class.span()),
                    SloField::P999 => s.p999.as_ref().map(Spanned::span),
                    SloField::P99 => s.p99.as_ref().map(Spanned::span),
                    SloField::P95 => s.p95.as_ref().map(Spanned::span),
                    SloField::P90 => s.p90.as_ref().map(Spanned::span),
                    SloField::Rate => s.rate.as_ref().map(Spanned::span),
                    SloField::Floor => s.floor.as_ref().map(Spanned::span),
                    SloField::Ceiling => s.ceiling.as_ref().map(Spanned::span),
                    SloField::Weight => s.weight.as_ref().map(Spanned::span),
                };
                let message = e.describe(|f, v| match v {
                    Some(v) => format!("{} = \"{v}\"", f.key()),
                    None => f.key().to_string(),
                });
                err(span.unwrap_or_else(|| s.class.span()), message)
            })?;
            services.push(ServiceSpec {
                name,
                matchers,
                class: slo.class,
                floor: slo.floor,
                ceiling: slo.ceiling,
                weight: slo.weight,
                line,
                match_line,
            });
        }
        let mut iocost: Vec<IocostDisk> = vec![];
        for d in raw.iocost.map(|i| i.disks).unwrap_or_default() {
            let line = line_of(text, d.span().start);
            let name = d.get_ref().trim();
            let disk = name.strip_prefix("/dev/").unwrap_or(name).to_string();
            if disk.is_empty() || disk.contains('/') || disk.chars().any(char::is_whitespace) {
                return Err(err(
                    d.span(),
                    format!("[iocost] disk {name:?} is not a disk; give a block device name (vda, /dev/nvme0n1) or major:minor (254:0)"),
                ));
            }
            if let Some(prev) = iocost.iter().find(|p| p.disk == disk) {
                let also = if prev.line == line {
                    String::new()
                } else {
                    format!(" (also on line {})", prev.line)
                };
                return Err(err(
                    d.span(),
                    format!("[iocost] disk {disk} is listed twice{also}; remove one"),
                ));
            }
            iocost.push(IocostDisk { disk, line });
        }
        Ok(Config {
            services,
            labels,
            iocost,
        })
    }

    /// The disks of `[iocost]` as device numbers, on this host: iocost is cgroup v2's, on
    /// whole disks, in kernels built with it (`io.cost.qos` in the root cgroup, `root_dir`).
    /// `dev_of` resolves a disk's name or `major:minor` to its number.
    pub fn iocost_devices(
        &self,
        file: &str,
        v2: bool,
        root_dir: &Path,
        dev_of: &dyn Fn(&str) -> Result<u32, String>,
    ) -> Result<Vec<u32>, ConfigError> {
        let Some(first) = self.iocost.first() else {
            return Ok(vec![]);
        };
        if !v2 {
            return Err(ConfigError::new(
                file,
                first.line,
                "[iocost] is cgroup v2's and this host's io controller is on cgroup v1; remove [iocost] (v1 weights need BFQ as the disk's scheduler)",
            ));
        }
        if !root_dir.join("io.cost.qos").exists() {
            return Err(ConfigError::new(
                file,
                first.line,
                &format!(
                    "[iocost]: this kernel has no iocost ({} is missing); use a kernel built with CONFIG_BLK_CGROUP_IOCOST or remove [iocost]",
                    root_dir.join("io.cost.qos").display()
                ),
            ));
        }
        self.iocost
            .iter()
            .map(|d| dev_of(&d.disk).map_err(|e| ConfigError::new(file, d.line, &e)))
            .collect()
    }

    /// Checks the globs against the cgroups that exist now: each must match one, and no
    /// cgroup may be claimed by two services.
    pub fn check_against(&self, file: &str, cgroup_paths: &[String]) -> Result<(), ConfigError> {
        let mut owner: HashMap<&str, usize> = HashMap::new();
        // The runtimes have not been asked yet: container and pod names, images and labels
        // match later.
        let no_containers = ContainerTable::default();
        let owners: Vec<Owner> = cgroup_paths
            .iter()
            .map(|p| Owner::of(p, &no_containers))
            .collect();
        for (i, s) in self.services.iter().enumerate() {
            let mut any = false;
            for o in &owners {
                let p = o.path;
                if !s.matches_owner(o) {
                    continue;
                }
                any = true;
                if let Some(&j) = owner.get(p) {
                    let other = &self.services[j];
                    return Err(ConfigError::new(
                        file,
                        s.match_line,
                        &format!(
                            "cgroup {p} is claimed by service '{}' (line {}) and '{}'; narrow one of the globs",
                            other.name, other.match_line, s.name
                        ),
                    ));
                }
                owner.insert(p, i);
            }
            // Containers, units and pods come and go: a service of owners may match
            // nothing yet. A cgroup glob names a path the operator controls.
            if !any && !s.matchers.iter().any(Matcher::is_owner) {
                return Err(ConfigError::new(
                    file,
                    s.match_line,
                    &format!(
                        "{} of service '{}' matches no cgroup; create the cgroup first or fix the glob",
                        s.describe_matchers(),
                        s.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A cgroup as matchers see it: its path, what the path says of its owner, what its
/// runtime says of the container when it is one, and the pod when the cgroup is where a
/// pod's limits go. Named once, matched against every service.
pub struct Owner<'a> {
    pub path: &'a str,
    pub named: PathName,
    pub container: Option<&'a ContainerInfo>,
    pub pod: Option<PodOwner<'a>>,
}

/// The pod whose cgroup an [`Owner`] is: a pod's own cgroup (the kubelet's `pod<uid>`), or
/// where the runtime made none above a pod's containers (containerd's default
/// `/k8s.io/<id>`), each of its containers' cgroups.
pub struct PodOwner<'a> {
    pub uid: String,
    /// Namespace and name, when containerd knows the pod.
    pub member: Option<&'a PodMember>,
    /// The pod's labels (its sandbox's), when containerd knows the sandbox.
    pub labels: Option<&'a HashMap<String, String>>,
}

impl<'a> Owner<'a> {
    pub fn of(path: &'a str, containers: &'a ContainerTable) -> Owner<'a> {
        let named = naming::name_path(path);
        let container = (named.kind == ServiceKind::Container)
            .then(|| containers.get(named.id.as_deref()?))
            .flatten();
        let pod = match (named.kind, container.and_then(|c| c.pod.as_ref())) {
            (ServiceKind::Pod, _) => named.id.clone().map(|uid| {
                let sandbox = containers.sandbox(&uid);
                PodOwner {
                    member: sandbox.and_then(|s| s.pod.as_ref()),
                    labels: sandbox.map(|s| &s.labels),
                    uid,
                }
            }),
            // A pod's container with no pod cgroup above it.
            (ServiceKind::Container, Some(member)) if named.pod.is_none() => Some(PodOwner {
                uid: member.uid.clone(),
                member: Some(member),
                labels: containers.sandbox(&member.uid).map(|s| &s.labels),
            }),
            _ => None,
        };
        Owner {
            path,
            named,
            container,
            pod,
        }
    }
}

impl ServiceSpec {
    /// Whether the cgroup at `cgroup_path` is one of the service's own (all matchers match).
    /// The runtimes' view of containers and pods comes from `containers`.
    pub fn matches(&self, cgroup_path: &str, containers: &ContainerTable) -> bool {
        self.matches_owner(&Owner::of(cgroup_path, containers))
    }

    /// [`ServiceSpec::matches`] for a cgroup already named.
    pub fn matches_owner(&self, o: &Owner) -> bool {
        self.matchers.iter().all(|m| m.matches(o))
    }

    /// `cgroup glob '/db'`, `unit glob 'pg*.service' and cgroup glob '/system.slice/*'`.
    pub fn describe_matchers(&self) -> String {
        self.matchers
            .iter()
            .map(|m| format!("{} glob '{}'", m.key(), m.text()))
            .collect::<Vec<_>>()
            .join(" and ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(t: &str) -> Result<Config, ConfigError> {
        Config::parse("c.toml", t)
    }

    #[test]
    fn parses_all_classes() {
        let c = parse(
            r#"
[[service]]
name = "db"
cgroup = "/db"
class = "latency"
p999 = "20ms"
floor = "500iops"

[[service]]
name = "etl"
cgroup = "batch/*"
class = "throughput"
rate = "150MB/s"
ceiling = "1GiB/s"
weight = 50

[[service]]
name = "backup"
cgroup = "/backup"
class = "best-effort"
floor = "20MB/s"
"#,
        )
        .unwrap();
        assert_eq!(c.services.len(), 3);
        assert_eq!(c.services[0].class, SloClass::latency_p999(20_000_000));
        assert_eq!(c.services[0].floor, Some(Rate::IosPerSec(500)));
        assert_eq!(c.services[0].line, 2);
        assert_eq!(
            c.services[1].class,
            SloClass::Throughput {
                rate_bps: 150_000_000
            }
        );
        assert_eq!(c.services[1].ceiling, Some(Rate::BytesPerSec(1 << 30)));
        assert_eq!(c.services[1].weight, Some(50));
        assert!(c.services[1].matches("/batch/a", &ContainerTable::default()));
        assert!(!c.services[1].matches("/batch/a/b", &ContainerTable::default()));
        assert_eq!(c.services[2].class, SloClass::BestEffort);
    }

    /// A latency SLO at another quantile than p99.9: one key names both, in the config and
    /// in events, and a p99.9 SLO serializes as it did before there was a choice.
    #[test]
    fn a_latency_target_names_its_quantile() {
        let c = parse(
            "[[service]]\nname='pg'\ncgroup='/pg'\nclass='latency'\np95='3ms'\n\
             [[service]]\nname='db'\ncgroup='/db'\nclass='latency'\np999='20ms'\n",
        )
        .unwrap();
        let p95 = SloClass::Latency(LatencyTarget {
            quantile: LatencyQuantile::P95,
            target_ns: 3_000_000,
        });
        assert_eq!(c.services[0].class, p95);
        assert_eq!(c.services[1].class, SloClass::latency_p999(20_000_000));
        assert_eq!(p95.describe(), "latency p95 <= 3.000ms");
        let json = serde_json::to_string(&p95).unwrap();
        assert_eq!(json, r#"{"class":"latency","p95_ns":3000000}"#);
        assert_eq!(serde_json::from_str::<SloClass>(&json).unwrap(), p95);
        let old = r#"{"class":"latency","p999_ns":20000000}"#;
        assert_eq!(
            serde_json::to_string(&c.services[1].class).unwrap(),
            old,
            "a p99.9 SLO reads as it always has"
        );
        assert_eq!(
            serde_json::from_str::<SloClass>(old).unwrap(),
            c.services[1].class
        );
        for bad in [
            r#"{"class":"latency"}"#,
            r#"{"class":"latency","p999_ns":1,"p95_ns":2}"#,
        ] {
            assert!(serde_json::from_str::<SloClass>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_name_line_and_fix() {
        let cases = [
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np98='2ms'\n", 5, "unknown field `p98`"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np999='2 parsecs'\n", 5, "unknown unit"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np999='-2ms'\n", 5, "greater than zero"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np999='0ms'\n", 5, "greater than zero"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='throughput'\nrate='0MB/s'\n", 5, "greater than zero"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='throughput'\n", 4, "add rate"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='fast'\n", 4, "unknown class"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='best-effort'\nweight=0\n", 5, "outside 1..10000"),
            ("[[service]]\nname='a'\ncgroup='/a['\nclass='best-effort'\n", 3, "invalid"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='best-effort'\nfloor='90MB/s'\nceiling='10MB/s'\n", 5, "floor is above ceiling"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='best-effort'\n[[service]]\nname='a'\ncgroup='/b'\nclass='best-effort'\n", 6, "defined twice"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np999='5'\n", 5, "no unit"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np999='5ms'\np95='2ms'\n", 6, "p999 and p95 are both set; a latency SLO is judged at one quantile, keep one"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='throughput'\nrate='1MB/s'\np95='2ms'\n", 6, "p95 does not apply to class throughput"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np90='9us'\n", 5, "'9us' is outside 10us..60s; pick a p90 target in that range"),
            ("[[service]]\nname='a'\nclass='best-effort'\n", 2, "matches nothing; add cgroup"),
            ("[[service]]\nname='a'\nclass='best-effort'\nunit=''\n", 4, "unit of service 'a' is empty"),
            ("[[service]]\nname='a'\nclass='best-effort'\nlabels='x'\n", 4, "unknown field `labels`"),
            ("[[service]]\nname='a'\nclass='best-effort'\nlabel='=x'\n", 4, "label key is empty"),
        ];
        for (text, line, needle) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{e}");
            assert!(e.to_string().contains(needle), "{e} lacks {needle}");
            assert!(e.to_string().starts_with("c.toml:"), "{e}");
            assert!(!e.to_string().contains('\n'), "{e} is not one line");
        }
    }

    #[test]
    fn glob_checks_against_live_cgroups() {
        let c = parse(
            "[[service]]\nname='a'\ncgroup='/x/*'\nclass='best-effort'\n\n[[service]]\nname='b'\ncgroup='/x/b'\nclass='best-effort'\n",
        )
        .unwrap();
        let paths = vec!["/".to_string(), "/x".into(), "/x/b".into()];
        let e = c.check_against("c.toml", &paths).unwrap_err();
        assert_eq!(e.line, 8);
        assert!(e.message.contains("claimed by service 'a'"), "{e}");
        let c = parse("[[service]]\nname='a'\ncgroup='/nope'\nclass='best-effort'\n").unwrap();
        let e = c.check_against("c.toml", &paths).unwrap_err();
        assert!(e.message.contains("matches no cgroup"), "{e}");
    }

    #[test]
    fn unit_container_and_pod_matchers_take_the_owners_own_cgroup() {
        let id = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let c = parse(&format!(
            "[[service]]\nname='pg'\nunit='postgresql@*.service'\nclass='latency'\np999='5ms'\n\n\
             [[service]]\nname='web'\ncontainer='3f4e5d6c7b8a'\nclass='best-effort'\n\n\
             [[service]]\nname='job'\npod='{uid}'\nclass='best-effort'\n\n\
             [[service]]\nname='sys-web'\nunit='nginx.service'\ncgroup='/system.slice/*'\nclass='best-effort'\n"
        ))
        .unwrap();
        let t = ContainerTable::default();
        let [pg, web, job, sys] = &c.services[..] else {
            panic!("4 services")
        };
        assert_eq!(pg.match_line, 3);
        assert!(pg.matches("/system.slice/postgresql@15-main.service", &t));
        assert!(!pg.matches("/system.slice/postgresql@15-main.service/child", &t));
        assert!(!pg.matches("/postgresql@15-main.service.d", &t));
        // Short id or full id, systemd or cgroupfs driver.
        assert!(web.matches(&format!("/system.slice/docker-{id}.scope"), &t));
        assert!(web.matches(&format!("/docker/{id}"), &t));
        assert!(!web.matches("/docker", &t));
        let full = Config::parse(
            "c.toml",
            &format!("[[service]]\nname='w'\ncontainer='{id}'\nclass='best-effort'\n"),
        )
        .unwrap();
        assert!(full.services[0].matches(&format!("/docker/{id}"), &t));
        // The pod's cgroup, not its containers (they belong to it as descendants).
        let pod_dir = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        );
        assert!(job.matches(&pod_dir, &t));
        assert!(!job.matches(&format!("{pod_dir}/cri-containerd-{id}.scope"), &t));
        assert!(job.matches(&format!("/kubepods/besteffort/pod{uid}"), &t));
        // Every matcher must match.
        assert!(sys.matches("/system.slice/nginx.service", &t));
        assert!(!sys.matches("/other.slice/nginx.service", &t));
        assert_eq!(
            sys.describe_matchers(),
            "cgroup glob '/system.slice/*' and unit glob 'nginx.service'"
        );
    }

    #[test]
    fn docker_matchers_use_what_docker_says() {
        use crate::identify::{containers::ContainerUpdate, naming::Runtime};
        let id = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
        let c = parse(
            "[[service]]\nname='db'\ncontainer='pg-*'\nclass='best-effort'\n\n\
             [[service]]\nname='img'\nimage='postgres:*'\nlabel='tier=data*'\nclass='best-effort'\n\n\
             [[service]]\nname='any'\nlabel='tier'\nclass='best-effort'\n",
        )
        .unwrap();
        let [by_name, by_image, by_label] = &c.services[..] else {
            panic!("3 services")
        };
        let path = format!("/docker/{id}");
        let mut t = ContainerTable::default();
        // Unknown to Docker (yet): only path-derived names can match.
        assert!(!by_name.matches(&path, &t));
        assert!(!by_label.matches(&path, &t));
        t.apply(&ContainerUpdate::Upsert(ContainerInfo {
            id: id.into(),
            name: "pg-main".into(),
            image: "postgres:16".into(),
            labels: [("tier".to_string(), "database".to_string())].into(),
            running: true,
            runtime: Runtime::Docker,
            pod: None,
        }));
        assert!(by_name.matches(&path, &t));
        assert!(by_image.matches(&path, &t));
        assert!(by_label.matches(&path, &t));
        assert!(!by_name.matches(&format!("{path}/child"), &t));
        assert_eq!(
            by_image.describe_matchers(),
            "image glob 'postgres:*' and label glob 'tier=data*'"
        );
        // Owners may match nothing at start; cgroup globs may not.
        assert!(c.check_against("c.toml", &["/".to_string()]).is_ok());
    }

    /// A kubelet's pod as containerd reports it: a sandbox with the pod's labels and one
    /// container, `shop/web-1/app`.
    fn pod_table(uid: &str, sandbox_id: &str, app_id: &str) -> ContainerTable {
        use crate::identify::{containers::ContainerUpdate, naming::Runtime};
        let member = |container: Option<&str>| PodMember {
            namespace: "shop".into(),
            name: "web-1".into(),
            uid: uid.into(),
            container: container.map(str::to_string),
        };
        let info = |id: &str, name: &str, pod: PodMember, labels: &[(&str, &str)]| ContainerInfo {
            id: id.into(),
            name: name.into(),
            image: "docker.io/library/app:1".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            running: true,
            runtime: Runtime::Containerd,
            pod: Some(pod),
        };
        let mut t = ContainerTable::default();
        t.apply(&ContainerUpdate::Connected {
            runtime: Runtime::Containerd,
            version: "1.6".into(),
            containers: vec![
                info(
                    sandbox_id,
                    "shop/web-1",
                    member(None),
                    &[("tier", "frontend")],
                ),
                info(
                    app_id,
                    "shop/web-1/app",
                    member(Some("app")),
                    &[("img", "x")],
                ),
            ],
        });
        t
    }

    #[test]
    fn pod_matchers_use_what_containerd_says() {
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let sandbox = "aa".repeat(32);
        let app = "bb".repeat(32);
        let c = parse(
            "[[service]]\nname='web'\nnamespace='shop'\npod='web-*'\nclass='best-effort'\n\n\
             [[service]]\nname='front'\npod_label='tier=front*'\nclass='best-effort'\n\n\
             [[service]]\nname='ns'\nnamespace='sh*'\nclass='best-effort'\n\n\
             [[service]]\nname='app'\ncontainer='shop/*/app'\nimage='docker.io/*/app:*'\nlabel='img'\nclass='best-effort'\n\n\
             [[service]]\nname='other'\nnamespace='kube-system'\nclass='best-effort'\n",
        )
        .unwrap();
        let [web, front, ns, by_container, other] = &c.services[..] else {
            panic!("5 services")
        };
        assert_eq!(front.describe_matchers(), "pod_label glob 'tier=front*'");
        let empty = ContainerTable::default();
        let t = pod_table(uid, &sandbox, &app);
        // The kubelet's cgroupfs layout: the pod's cgroup is the pod's, its containers
        // below it belong to it as descendants.
        let pod_dir = format!("/kubepods/burstable/pod{uid}");
        let in_pod = format!("{pod_dir}/{app}");
        for s in [web, front, ns] {
            assert!(s.matches(&pod_dir, &t), "{}", s.name);
            assert!(!s.matches(&in_pod, &t), "{}", s.name);
            // Unknown to containerd: namespace, name and labels cannot match.
            assert!(!s.matches(&pod_dir, &empty), "{}", s.name);
        }
        assert!(!other.matches(&pod_dir, &t));
        assert!(by_container.matches(&in_pod, &t));
        assert!(!by_container.matches(&pod_dir, &t));
        // The systemd layout.
        let slice = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        );
        assert!(web.matches(&slice, &t));
        assert!(!web.matches(&format!("{slice}/cri-containerd-{app}.scope"), &t));
        assert!(by_container.matches(&format!("{slice}/cri-containerd-{app}.scope"), &t));
        // containerd's own layout (`ctr run`): no pod cgroup, so the pod's containers'
        // cgroups are the pod's, its sandbox's too.
        for id in [&app, &sandbox] {
            let p = format!("/k8s.io/{id}");
            for s in [web, front, ns] {
                assert!(s.matches(&p, &t), "{} {p}", s.name);
            }
            assert!(!other.matches(&p, &t));
        }
        assert!(by_container.matches(&format!("/k8s.io/{app}"), &t));
        assert!(!by_container.matches(&format!("/k8s.io/{sandbox}"), &t));
        // The pod matcher still takes UIDs, with or without containerd.
        let by_uid = parse(&format!(
            "[[service]]\nname='u'\npod='{uid}'\nclass='best-effort'\n"
        ))
        .unwrap();
        assert!(by_uid.services[0].matches(&pod_dir, &empty));
        assert!(by_uid.services[0].matches(&format!("/k8s.io/{app}"), &t));
        // Owners may match nothing at start.
        assert!(c.check_against("c.toml", &["/".to_string()]).is_ok());
        // Pod label keys are checked like container label keys.
        let e = parse("[[service]]\nname='a'\nclass='best-effort'\npod_label='=x'\n").unwrap_err();
        assert!(e.message.contains("label key is empty"), "{e}");
    }

    #[test]
    fn units() {
        assert_eq!(parse_duration_ns("500us"), Ok(500_000));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_rate("800KB/s"), Ok(Rate::BytesPerSec(800_000)));
        assert_eq!(parse_rate("2MiB/s"), Ok(Rate::BytesPerSec(2 << 20)));
        assert!(parse_rate("5 furlongs").is_err());
    }

    #[test]
    fn no_rounding_to_zero_and_no_saturation() {
        assert_eq!(parse_duration_ns("0.5ns"), Ok(1));
        assert!(parse_duration_ns("0.4ns")
            .unwrap_err()
            .contains("less than 1ns"));
        assert!(parse_duration_ns("99999999999s")
            .unwrap_err()
            .contains("584 years"));
        assert!(parse_duration_ns(&format!("{}ns", "9".repeat(400)))
            .unwrap_err()
            .contains("584 years"));
        assert_eq!(parse_rate("1B/s"), Ok(Rate::BytesPerSec(1)));
        assert!(parse_rate("0.1B/s")
            .unwrap_err()
            .contains("less than 1 byte"));
        assert!(parse_rate("0.4iops")
            .unwrap_err()
            .contains("less than 1 I/O"));
        assert_eq!(
            parse_rate("1000000GB/s"),
            Ok(Rate::BytesPerSec(MAX_RATE_BPS))
        );
        assert!(parse_rate("99999999999GB/s").unwrap_err().contains("1PB/s"));
        assert_eq!(
            parse_rate("1000000000iops"),
            Ok(Rate::IosPerSec(MAX_RATE_IOPS))
        );
        assert!(parse_rate("1000000001iops")
            .unwrap_err()
            .contains("beyond any disk"));
        for text in ["20ms", "1s", "10us", "1ns", "1500ms"] {
            assert_eq!(duration_text(parse_duration_ns(text).unwrap()), text);
        }
        for text in ["1GB/s", "1MiB/s", "1500KB/s", "3B/s", "2GiB/s"] {
            assert_eq!(
                parse_rate(text).map(|r| bytes_rate_text(match r {
                    Rate::BytesPerSec(b) => b,
                    Rate::IosPerSec(_) => 0,
                })),
                Ok(text.to_string())
            );
        }
    }

    /// One service with the given SLO lines, for the cases below.
    fn service(slo: &str) -> Result<Config, ConfigError> {
        parse(&format!("[[service]]\nname='a'\ncgroup='/a'\n{slo}"))
    }

    #[test]
    fn slo_ranges() {
        for (slo, line, needle) in [
            ("class='latency'\np999='9us'\n", 5, "outside 10us..60s"),
            ("class='latency'\np999='61s'\n", 5, "outside 10us..60s"),
            ("class='latency'\np999='0.4ns'\n", 5, "less than 1ns"),
            ("class='latency'\np999='99999999999s'\n", 5, "584 years"),
            ("class='throughput'\nrate='99999999999GB/s'\n", 5, "1PB/s"),
            ("class='throughput'\nrate='0.1B/s'\n", 5, "less than 1 byte"),
            (
                "class='best-effort'\nfloor='0.4iops'\n",
                5,
                "less than 1 I/O",
            ),
            (
                "class='best-effort'\nceiling='100iops'\n",
                5,
                "ceiling must be in bytes per second; write e.g. ceiling = \"200MB/s\"",
            ),
            (
                "class='best-effort'\nceiling='500KB/s'\n",
                5,
                "below 1MiB/s",
            ),
            (
                "class='best-effort'\nfloor='500iops'\nceiling='10MB/s'\n",
                5,
                "floor and ceiling must be in the same unit to be compared",
            ),
            (
                "class='best-effort'\nfloor='10MB/s'\nceiling='100iops'\n",
                6,
                "ceiling must be in bytes per second",
            ),
            ("class='best-effort'\nweight=10001\n", 5, "outside 1..10000"),
        ] {
            let e = service(slo).unwrap_err();
            assert_eq!(e.line, line, "{slo}: {e}");
            assert!(e.message.contains(needle), "{slo}: {e} lacks {needle}");
        }
        // The bounds themselves, and a floor under the minimum cap (the minimum applies).
        for slo in [
            "class='latency'\np999='10us'\n",
            "class='latency'\np999='60s'\n",
            "class='best-effort'\nfloor='1B/s'\nceiling='1MiB/s'\n",
            "class='best-effort'\nfloor='1iops'\nweight=10000\n",
        ] {
            service(slo).unwrap_or_else(|e| panic!("{slo}: {e}"));
        }
    }

    #[test]
    fn label_policy_section() {
        let c = parse(
            "[labels]\nenabled = false\nmin_p999 = \"5ms\"\nmax_rate = \"1GB/s\"\nmax_weight = 1000\nclasses = [\"latency\", \"best-effort\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.labels,
            LabelPolicy {
                enabled: false,
                min_p999_ns: 5_000_000,
                max_rate_bps: Some(1_000_000_000),
                max_weight: 1000,
                classes: vec!["latency", "best-effort"],
            }
        );
        assert_eq!(parse("").unwrap().labels, LabelPolicy::default());
        assert_eq!(LabelPolicy::default().min_p999_ns, 1_000_000);
        for (text, line, needle) in [
            ("[labels]\nmin_p99 = '1ms'\n", 2, "unknown field `min_p99`"),
            (
                "[labels]\nmin_p999 = '1us'\n",
                2,
                "[labels] min_p999 '1us' is outside 10us..60s",
            ),
            (
                "[labels]\n\nmin_p999 = '1 parsec'\n",
                3,
                "[labels] min_p999: unknown unit",
            ),
            (
                "[labels]\nmax_rate = '100iops'\n",
                2,
                "max_rate must be in bytes per second",
            ),
            ("[labels]\nmax_rate = '99999999999GB/s'\n", 2, "1PB/s"),
            ("[labels]\nmax_weight = 0\n", 2, "outside 1..10000"),
            (
                "[labels]\nclasses = ['latency', 'fast']\n",
                2,
                "unknown class 'fast'",
            ),
            ("[labels]\nenabled = 'yes'\n", 2, "see docs/config.md"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{e}");
            assert!(e.message.contains(needle), "{e} lacks {needle}");
        }
    }

    #[test]
    fn messages_stay_on_one_line() {
        let e = service("class='latency'\np999=\"5\\nparsecs\"\n").unwrap_err();
        assert!(!e.to_string().contains('\n'), "{e}");
        assert!(e.message.contains("'5\\nparsecs'"), "{e}");
        assert_eq!(one_line("a\tb\nc"), "a\\tb\\nc");
    }

    mod props {
        use std::collections::BTreeMap;

        use proptest::prelude::*;

        use super::super::*;

        /// `s` as a TOML basic string.
        fn toml_str(s: &str) -> String {
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' | '\\' => out.extend(['\\', c]),
                    c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }

        /// A quantity, right or wrong: numbers of every size and sign, every unit and
        /// some that are none.
        fn quantity() -> impl Strategy<Value = String> {
            let number = prop_oneof![
                any::<f64>().prop_map(|v| v.to_string()),
                any::<i64>().prop_map(|v| v.to_string()),
                any::<u64>().prop_map(|v| v.to_string()),
                (0u32..100_000).prop_map(|v| v.to_string()),
                (0.0..2.0f64).prop_map(|v| v.to_string()),
                prop::sample::select(vec![
                    "0",
                    "0.4",
                    "0.5",
                    "1",
                    "-1",
                    "1e20",
                    "1e-300",
                    "99999999999",
                    "18446744073709551616",
                    "1000000",
                    "1000000000",
                    "NaN",
                    "inf",
                    "-0",
                    ".",
                    "1.5.5",
                    "",
                    "+5",
                    "--1",
                    "١",
                ])
                .prop_map(str::to_string),
            ];
            let unit = prop::sample::select(vec![
                "", "ns", "us", "µs", "ms", "s", "B/s", "KB/s", "kB/s", "MB/s", "GB/s", "KiB/s",
                "MiB/s", "GiB/s", "iops", "IOPS", " ms", "h", "PB/s", "é", "\u{202e}", "\n", "ms ",
            ]);
            (number, unit).prop_map(|(n, u)| toml_str(&format!("{n}{u}")))
        }

        /// Any value a key could be given: a quantity, a class, a glob, another TOML type,
        /// any text.
        fn any_value() -> impl Strategy<Value = String> {
            prop_oneof![
                quantity(),
                prop::sample::select(vec![
                    "\"latency\"",
                    "\"throughput\"",
                    "\"best-effort\"",
                    "\"/a\"",
                    "\"/b/*\"",
                    "\"[\"",
                    "\"\"",
                    "\"tier=db\"",
                    "\"=x\"",
                    "true",
                    "false",
                    "3",
                    "-3",
                    "0",
                    "10000",
                    "10001",
                    "99999999999999999999",
                    "[]",
                    "[\"latency\", \"x\"]",
                    "{}",
                    "\"\\n\"",
                    "\"\\u0000\"",
                ])
                .prop_map(str::to_string),
                any::<i64>().prop_map(|v| v.to_string()),
                any::<String>().prop_map(|s| toml_str(&s)),
            ]
        }

        /// A value for `key`, mostly of the type the key takes.
        fn value_for(key: &'static str) -> BoxedStrategy<String> {
            let typed = match key {
                "p999" | "rate" | "floor" | "ceiling" | "min_p999" | "max_rate" => {
                    quantity().boxed()
                }
                "class" => prop::sample::select(vec![
                    "latency",
                    "throughput",
                    "best-effort",
                    "latency",
                    "fast",
                ])
                .prop_map(toml_str)
                .boxed(),
                "weight" | "max_weight" => prop_oneof![any::<i64>(), -2i64..10_003]
                    .prop_map(|w| w.to_string())
                    .boxed(),
                "enabled" => any::<bool>().prop_map(|b| b.to_string()).boxed(),
                "classes" => prop::collection::vec(
                    prop::sample::select(vec!["latency", "throughput", "best-effort", "x"]),
                    0..4,
                )
                .prop_map(|c| {
                    format!(
                        "[{}]",
                        c.into_iter().map(toml_str).collect::<Vec<_>>().join(", ")
                    )
                })
                .boxed(),
                _ => prop_oneof![
                    prop::sample::select(vec![
                        "/s", "s*", "/[", "tier=db", "=x", "", " ", "/a/**/b"
                    ])
                    .prop_map(toml_str),
                    "\\PC{0,12}".prop_map(|s| toml_str(&s)),
                ]
                .boxed(),
            };
            prop_oneof![20 => typed, 1 => any_value()].boxed()
        }

        /// A table: `base` lines, then keys of `keys` set to random values (a later one
        /// replaces an earlier one: TOML forbids a key twice).
        fn table(
            base: Vec<(&'static str, String)>,
            keys: &'static [&'static str],
        ) -> impl Strategy<Value = String> {
            let key = prop_oneof![200 => prop::sample::select(keys), 1 => Just("p99")];
            let pair = key.prop_flat_map(|k| (Just(k), value_for(k)));
            prop::collection::vec(pair, 0..6).prop_map(move |pairs| {
                let mut t: BTreeMap<&str, String> = base.iter().cloned().collect();
                t.extend(pairs);
                t.into_iter().map(|(k, v)| format!("{k} = {v}\n")).collect()
            })
        }

        const SERVICE_KEYS: &[&str] = &[
            "name",
            "cgroup",
            "unit",
            "container",
            "pod",
            "namespace",
            "image",
            "label",
            "pod_label",
            "class",
            "p999",
            "rate",
            "floor",
            "ceiling",
            "weight",
            "p999",
            "floor",
            "ceiling",
            "class",
        ];
        const LABELS_KEYS: &[&str] = &["enabled", "min_p999", "max_rate", "max_weight", "classes"];

        /// Near-valid configs: [[service]] tables (most with a valid name, matcher and
        /// class, so that they reach the SLO rules) and a [labels] table.
        fn near_valid_config() -> impl Strategy<Value = String> {
            let service =
                (0..3usize, prop::bool::weighted(0.97)).prop_flat_map(|(i, valid_start)| {
                    let base = if valid_start {
                        vec![
                            ("name", toml_str(&format!("s{i}"))),
                            ("cgroup", toml_str(&format!("/s{i}"))),
                            ("class", toml_str("best-effort")),
                        ]
                    } else {
                        vec![]
                    };
                    table(base, SERVICE_KEYS).prop_map(|t| format!("[[service]]\n{t}"))
                });
            (
                prop::collection::vec(service, 1..4),
                prop::option::of(table(vec![], LABELS_KEYS)),
            )
                .prop_map(|(services, labels)| {
                    let labels = labels.map(|l| format!("[labels]\n{l}")).unwrap_or_default();
                    format!("{}{labels}", services.join("\n"))
                })
        }

        fn check_config(text: &str) -> Result<(), TestCaseError> {
            match Config::parse("c.toml", text) {
                Ok(c) => {
                    for s in &c.services {
                        if let SloClass::Latency(t) = s.class {
                            prop_assert!(LATENCY_TARGET_RANGE_NS.contains(&t.target_ns));
                        }
                        if let Some(Rate::BytesPerSec(c)) = s.ceiling {
                            prop_assert!(c >= MIN_CAP_BPS);
                        }
                        prop_assert!(!matches!(s.ceiling, Some(Rate::IosPerSec(_))));
                        prop_assert!(s.weight.is_none_or(|w| (1..=10_000).contains(&w)));
                    }
                    prop_assert!(LATENCY_TARGET_RANGE_NS.contains(&c.labels.min_p999_ns));
                }
                Err(e) => {
                    prop_assert!(!e.to_string().contains('\n'), "{e}");
                    prop_assert!(e.to_string().starts_with("c.toml:"), "{e}");
                }
            }
            Ok(())
        }

        fn rate_ok(r: Rate) -> bool {
            match r {
                Rate::BytesPerSec(b) => (1..=MAX_RATE_BPS).contains(&b),
                Rate::IosPerSec(n) => (1..=MAX_RATE_IOPS).contains(&n),
            }
        }

        proptest! {
            #![proptest_config(crate::proptest_budget(2000))]

            #[test]
            fn config_of_any_text(text in any::<String>()) {
                check_config(&text)?;
            }

            #[test]
            fn config_of_near_valid_toml(text in near_valid_config()) {
                check_config(&text)?;
            }

            #[test]
            fn durations_and_rates_of_any_text(s in any::<String>()) {
                if let Ok(ns) = parse_duration_ns(&s) {
                    prop_assert!(ns > 0);
                }
                if let Ok(r) = parse_rate(&s) {
                    prop_assert!(rate_ok(r), "{s}: {r:?}");
                }
            }

            /// Numbers around every bound (0, 1 unit, 2^64, 1 PB/s, 1e9 IOPS) in every unit.
            #[test]
            fn durations_and_rates_near_the_bounds(
                v in prop_oneof![
                    any::<f64>().prop_map(f64::abs),
                    0.0..2.0f64,
                    (0.99..1.01f64).prop_map(|f| f * 1e15),
                    (0.99..1.01f64).prop_map(|f| f * 1e9),
                    (0.99..1.01f64).prop_map(|f| f * 18_446_744_073_709_551_616.0),
                    (0.99..1.01f64).prop_map(|f| f * 1e-9),
                ],
                unit in prop::sample::select(vec![
                    "ns", "us", "ms", "s", "B/s", "KB/s", "MB/s", "GB/s", "KiB/s", "MiB/s", "GiB/s",
                    "iops",
                ]),
                exact in any::<bool>(),
            ) {
                // Both the shortest decimal and a long fixed one (no exponent: "1e20" is
                // not a number to split_quantity).
                let s = if exact { format!("{v:.30}{unit}") } else { format!("{v}{unit}") };
                if let Ok(ns) = parse_duration_ns(&s) {
                    prop_assert!(ns > 0, "{s}");
                }
                if let Ok(r) = parse_rate(&s) {
                    prop_assert!(rate_ok(r), "{s}: {r:?}");
                }
            }

            /// The texts [`duration_text`] and [`bytes_rate_text`] write parse back to
            /// their value (they spell bounds in label errors).
            #[test]
            fn texts_parse_back(ns in LATENCY_TARGET_RANGE_NS, bps in 1..=MAX_RATE_BPS) {
                prop_assert_eq!(parse_duration_ns(&duration_text(ns)), Ok(ns));
                prop_assert_eq!(parse_rate(&bytes_rate_text(bps)), Ok(Rate::BytesPerSec(bps)));
            }
        }
    }
    #[test]
    fn iocost_disks_are_checked_at_parse_and_against_the_host() {
        let svc = "[[service]]\nname='db'\ncgroup='/db'\nclass='best-effort'\n";
        let parse = |extra: &str| Config::parse("c.toml", &format!("{svc}{extra}"));
        let c = parse("[iocost]\ndisks = ['/dev/vda', '8:16']\n").unwrap();
        let disks: Vec<&str> = c.iocost.iter().map(|d| d.disk.as_str()).collect();
        assert_eq!(disks, ["vda", "8:16"]);
        assert_eq!(c.iocost[0].line, 6);
        for (bad, says) in [
            (
                "[iocost]\ndisks = ['vda', 'vda']\n",
                "vda is listed twice; remove one",
            ),
            (
                "[iocost]\ndisks = ['vda',\n'/dev/vda']\n",
                "listed twice (also on line 6)",
            ),
            ("[iocost]\ndisks = ['']\n", "is not a disk"),
            ("[iocost]\ndisks = ['../sda']\n", "is not a disk"),
            ("[iocost]\ndisk = ['vda']\n", "unknown field"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(says) && e.starts_with("c.toml:"), "{bad}: {e}");
        }
        // No [iocost]: nothing to check, on any host.
        let none = parse("").unwrap();
        let unreachable = |_: &str| -> Result<u32, String> { panic!("nothing to resolve") };
        let dir = std::env::temp_dir();
        assert_eq!(
            none.iocost_devices("c.toml", false, &dir, &unreachable)
                .unwrap(),
            Vec::<u32>::new()
        );
        let e = c
            .iocost_devices("c.toml", false, &dir, &unreachable)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cgroup v2's") && e.contains("remove [iocost]"),
            "{e}"
        );
        // A v2 root without io.cost.qos: a kernel without iocost.
        let root = std::env::temp_dir().join(format!("iso-iocost-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let e = c
            .iocost_devices("c.toml", true, &root, &unreachable)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no iocost") && e.contains("CONFIG_BLK_CGROUP_IOCOST"),
            "{e}"
        );
        std::fs::write(root.join("io.cost.qos"), "").unwrap();
        let resolve = |d: &str| match d {
            "vda" => Ok(isolator_common::kernel_dev(254, 0)),
            _ => Err(format!("disk {d} does not exist")),
        };
        let e = c
            .iocost_devices("c.toml", true, &root, &resolve)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("c.toml:6:") && e.contains("8:16 does not exist"),
            "{e}"
        );
        let one = parse("[iocost]\ndisks = ['vda']\n").unwrap();
        assert_eq!(
            one.iocost_devices("c.toml", true, &root, &resolve).unwrap(),
            [isolator_common::kernel_dev(254, 0)]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
