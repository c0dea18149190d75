//! The SLO config (`--config`, TOML): which cgroups form which service and what each
//! service is promised. Every error names the file, the line and the fix.

use std::{collections::HashMap, ops::Range, path::Path};

use serde::Deserialize;
use thiserror::Error;
use toml::Spanned;

use crate::{
    docker::{ContainerInfo, ContainerTable},
    naming::{self, PathName, ServiceKind},
};

/// A service's promise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SloClass {
    /// p99.9 device latency at or below the target.
    Latency { p999_ns: u64 },
    /// Throughput (read + write) at or above the target.
    Throughput { rate_bps: u64 },
    /// No promise; first to be throttled.
    BestEffort,
}

impl SloClass {
    pub fn name(&self) -> &'static str {
        match self {
            SloClass::Latency { .. } => "latency",
            SloClass::Throughput { .. } => "throughput",
            SloClass::BestEffort => "best-effort",
        }
    }
}

/// A rate limit: bytes or I/Os per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Glob over Docker container names and container ids (full or the 12-hex short id),
    /// e.g. `pg-*` or `3f4e5d6c7b8a*`.
    Container(glob::Pattern),
    /// Glob over Kubernetes pod UIDs: the pod's cgroup (its containers are below it).
    Pod(glob::Pattern),
    /// Glob over a Docker container's image, e.g. `postgres:*`.
    Image(glob::Pattern),
    /// A Docker container label: `key` present, or `key=glob` with a matching value.
    Label {
        key: String,
        value: Option<glob::Pattern>,
    },
}

impl Matcher {
    /// The matcher a config key spells. Cgroup paths are anchored at the hierarchy root;
    /// a label is `key` or `key=glob`.
    fn parse(key: &str, text: &str) -> Result<Matcher, String> {
        let glob = |t: &str| glob::Pattern::new(t.trim()).map_err(|e| e.to_string());
        Ok(match key {
            "cgroup" if !text.starts_with('/') => Matcher::Cgroup(glob(&format!("/{text}"))?),
            "cgroup" => Matcher::Cgroup(glob(text)?),
            "unit" => Matcher::Unit(glob(text)?),
            "container" => Matcher::Container(glob(text)?),
            "pod" => Matcher::Pod(glob(text)?),
            "image" => Matcher::Image(glob(text)?),
            "label" => {
                let (k, value) = match text.split_once('=') {
                    Some((k, v)) => (k.trim(), Some(glob(v)?)),
                    None => (text.trim(), None),
                };
                if k.is_empty() {
                    return Err("the label key is empty".into());
                }
                Matcher::Label {
                    key: k.to_string(),
                    value,
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
            Matcher::Image(_) => "image",
            Matcher::Label { .. } => "label",
        }
    }

    /// The matcher as the config spells its value.
    fn text(&self) -> String {
        match self {
            Matcher::Cgroup(p)
            | Matcher::Unit(p)
            | Matcher::Container(p)
            | Matcher::Pod(p)
            | Matcher::Image(p) => p.as_str().to_string(),
            Matcher::Label { key, value: None } => key.clone(),
            Matcher::Label {
                key,
                value: Some(v),
            } => format!("{key}={}", v.as_str()),
        }
    }

    /// Whether the matcher names an owner (unit, container, pod, image, label) rather than a
    /// path:
    /// owners come and go, so matching nothing at start is not an error.
    pub fn is_owner(&self) -> bool {
        !matches!(self, Matcher::Cgroup(_))
    }

    /// Whether the cgroup at `path` (named by [`naming::name_path`]; `container` is what
    /// Docker says of it, when it is a Docker container) matches.
    pub fn matches(&self, path: &str, named: &PathName, container: Option<&ContainerInfo>) -> bool {
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        // Each owner matcher takes the owner's own cgroup only: its descendants belong to
        // it anyway (nearest matching ancestor), and limits go on one level.
        match (self, named.kind) {
            (Matcher::Cgroup(p), _) => p.matches_with(path, opts),
            (Matcher::Unit(p), ServiceKind::Unit) => p.matches_with(&named.name, opts),
            (Matcher::Container(p), ServiceKind::Container) => {
                let m = |s: &str| p.matches_with(s, opts);
                m(&named.name)
                    || named.id.as_deref().is_some_and(m)
                    || container.is_some_and(|c| m(&c.name))
            }
            (Matcher::Pod(p), ServiceKind::Pod) => {
                named.id.as_deref().is_some_and(|s| p.matches_with(s, opts))
            }
            (Matcher::Image(p), ServiceKind::Container) => {
                container.is_some_and(|c| p.matches_with(&c.image, opts))
            }
            (Matcher::Label { key, value }, ServiceKind::Container) => container
                .and_then(|c| c.labels.get(key))
                .is_some_and(|v| value.as_ref().is_none_or(|p| p.matches_with(v, opts))),
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    pub services: Vec<ServiceSpec>,
}

#[derive(Debug, Error, PartialEq)]
#[error("{file}:{line}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    service: Vec<Spanned<RawService>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    name: Spanned<String>,
    cgroup: Option<Spanned<String>>,
    unit: Option<Spanned<String>>,
    container: Option<Spanned<String>>,
    pod: Option<Spanned<String>>,
    image: Option<Spanned<String>>,
    label: Option<Spanned<String>>,
    class: Spanned<String>,
    p999: Option<Spanned<String>>,
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

/// Parses "20ms", "500us", "1.5s", "250000ns" into nanoseconds.
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
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("'{s}' must be greater than zero"));
    }
    Ok((v * scale).round() as u64)
}

/// Parses "150MB/s", "1.5GiB/s", "800KB/s", "500iops" (decimal and binary prefixes).
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let (num, unit) = split_quantity(s);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a rate; write e.g. \"150MB/s\" or \"500iops\""))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("'{s}' must be greater than zero"));
    }
    let unit = unit.trim();
    if unit.eq_ignore_ascii_case("iops") {
        return Ok(Rate::IosPerSec(v.round().max(1.0) as u64));
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
    Ok(Rate::BytesPerSec((v * scale).round().max(1.0) as u64))
}

/// One field of a service's SLO, to point at the one at fault: a line of the config, a
/// container label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloField {
    Class,
    P999,
    Rate,
    Floor,
    Ceiling,
    Weight,
}

impl SloField {
    pub const ALL: [SloField; 6] = [
        SloField::Class,
        SloField::P999,
        SloField::Rate,
        SloField::Floor,
        SloField::Ceiling,
        SloField::Weight,
    ];

    pub fn key(self) -> &'static str {
        match self {
            SloField::Class => "class",
            SloField::P999 => "p999",
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
    RateNotBytes,
    FloorAboveCeiling,
    WeightOutOfRange(i64),
}

impl SloRuleError {
    /// The field to point at.
    pub fn field(&self) -> SloField {
        match self {
            SloRuleError::UnknownClass(_) | SloRuleError::MissingTarget { .. } => SloField::Class,
            SloRuleError::NotForClass { field, .. } | SloRuleError::Invalid { field, .. } => *field,
            SloRuleError::RateNotBytes => SloField::Rate,
            SloRuleError::FloorAboveCeiling => SloField::Floor,
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
            SloRuleError::RateNotBytes => format!(
                "{} must be in bytes per second; write e.g. {}",
                spell(SloField::Rate, None),
                spell(SloField::Rate, Some("150MB/s"))
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
/// class's is not, values have units and are above zero, a throughput target is in bytes,
/// the floor is not above the ceiling, the weight is in 1..10000.
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
            let v = target(SloField::P999, "latency", "20ms")?;
            SloClass::Latency {
                p999_ns: parse_duration_ns(v).map_err(invalid(SloField::P999))?,
            }
        }
        "throughput" => {
            absent(SloField::P999, "throughput")?;
            let v = target(SloField::Rate, "throughput", "150MB/s")?;
            match parse_rate(v).map_err(invalid(SloField::Rate))? {
                Rate::BytesPerSec(rate_bps) => SloClass::Throughput { rate_bps },
                Rate::IosPerSec(_) => return Err(SloRuleError::RateNotBytes),
            }
        }
        "best-effort" => {
            absent(SloField::P999, "best-effort")?;
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
    if let (Some(Rate::BytesPerSec(f)), Some(Rate::BytesPerSec(c)))
    | (Some(Rate::IosPerSec(f)), Some(Rate::IosPerSec(c))) = (floor, ceiling)
    {
        if f > c {
            return Err(SloRuleError::FloorAboveCeiling);
        }
    }
    let weight = match t.weight {
        Some(w) if !(1..=10000).contains(&w) => return Err(SloRuleError::WeightOutOfRange(w)),
        w => w.map(|w| w as u32),
    };
    Ok(Slo {
        class,
        floor,
        ceiling,
        weight,
    })
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.display().to_string(),
            line: 0,
            message: format!("cannot read the config ({e}); check the --config path"),
        })?;
        Config::parse(&path.display().to_string(), &text)
    }

    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let err = |span: Range<usize>, message: String| ConfigError {
            file: file.to_string(),
            line: line_of(text, span.start),
            message,
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            ConfigError {
                file: file.to_string(),
                line,
                message: format!(
                    "{}; see docs/config.md for the keys",
                    e.message().trim().replace('\n', " ")
                ),
            }
        })?;
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
                ("image", &s.image),
                ("label", &s.label),
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
                    format!("service '{name}' matches nothing; add cgroup = \"/path\" (or unit, container, pod, image, label)"),
                ));
            };
            let slo = parse_slo(&SloText {
                class: s.class.get_ref(),
                p999: spanned_text(&s.p999),
                rate: spanned_text(&s.rate),
                floor: spanned_text(&s.floor),
                ceiling: spanned_text(&s.ceiling),
                weight: s.weight.as_ref().map(|w| *w.get_ref()),
            })
            .map_err(|e| {
                let span = match e.field() {
                    SloField::Class => Some(s.class.span()),
                    SloField::P999 => s.p999.as_ref().map(Spanned::span),
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
        Ok(Config { services })
    }

    /// Checks the globs against the cgroups that exist now: each must match one, and no
    /// cgroup may be claimed by two services.
    pub fn check_against(&self, file: &str, cgroup_paths: &[String]) -> Result<(), ConfigError> {
        let mut owner: HashMap<&str, usize> = HashMap::new();
        // Docker has not been asked yet: container names, images and labels match later.
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
                    return Err(ConfigError {
                        file: file.into(),
                        line: s.match_line,
                        message: format!(
                            "cgroup {p} is claimed by service '{}' (line {}) and '{}'; narrow one of the globs",
                            other.name, other.match_line, s.name
                        ),
                    });
                }
                owner.insert(p, i);
            }
            // Containers, units and pods come and go: a service of owners may match
            // nothing yet. A cgroup glob names a path the operator controls.
            if !any && !s.matchers.iter().any(Matcher::is_owner) {
                return Err(ConfigError {
                    file: file.into(),
                    line: s.match_line,
                    message: format!(
                        "{} of service '{}' matches no cgroup; create the cgroup first or fix the glob",
                        s.describe_matchers(),
                        s.name
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A cgroup as matchers see it: its path, what the path says of its owner, and what Docker
/// says of the container when it is one. Named once, matched against every service.
pub struct Owner<'a> {
    pub path: &'a str,
    pub named: PathName,
    pub container: Option<&'a ContainerInfo>,
}

impl<'a> Owner<'a> {
    pub fn of(path: &'a str, containers: &'a ContainerTable) -> Owner<'a> {
        let named = naming::name_path(path);
        let container = (named.kind == ServiceKind::Container)
            .then(|| containers.get(named.id.as_deref()?))
            .flatten();
        Owner {
            path,
            named,
            container,
        }
    }
}

impl ServiceSpec {
    /// Whether the cgroup at `cgroup_path` is one of the service's own (all matchers match).
    /// Docker's view of containers comes from `containers`.
    pub fn matches(&self, cgroup_path: &str, containers: &ContainerTable) -> bool {
        self.matches_owner(&Owner::of(cgroup_path, containers))
    }

    /// [`ServiceSpec::matches`] for a cgroup already named.
    pub fn matches_owner(&self, o: &Owner) -> bool {
        self.matchers
            .iter()
            .all(|m| m.matches(o.path, &o.named, o.container))
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
        assert_eq!(
            c.services[0].class,
            SloClass::Latency {
                p999_ns: 20_000_000
            }
        );
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

    #[test]
    fn errors_name_line_and_fix() {
        let cases = [
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np99='2ms'\n", 5, "unknown field `p99`"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np999='2 parsecs'\n", 5, "unknown unit"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np999='-2ms'\n", 5, "greater than zero"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np999='0ms'\n", 5, "greater than zero"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='throughput'\nrate='0MB/s'\n", 5, "greater than zero"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='throughput'\n", 4, "add rate"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='fast'\n", 4, "unknown class"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='best-effort'\nweight=0\n", 5, "outside 1..10000"),
            ("[[service]]\nname='a'\ncgroup='/a['\nclass='best-effort'\n", 3, "invalid"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='best-effort'\nfloor='9MB/s'\nceiling='1MB/s'\n", 5, "floor is above ceiling"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='best-effort'\n[[service]]\nname='a'\ncgroup='/b'\nclass='best-effort'\n", 6, "defined twice"),
            ("[[service]]\nname='a'\ncgroup='/a'\nclass='latency'\np999='5'\n", 5, "no unit"),
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
        use crate::docker::DockerUpdate;
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
        t.apply(&DockerUpdate::Upsert(ContainerInfo {
            id: id.into(),
            name: "pg-main".into(),
            image: "postgres:16".into(),
            labels: [("tier".to_string(), "database".to_string())].into(),
            running: true,
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

    #[test]
    fn units() {
        assert_eq!(parse_duration_ns("500us"), Ok(500_000));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_rate("800KB/s"), Ok(Rate::BytesPerSec(800_000)));
        assert_eq!(parse_rate("2MiB/s"), Ok(Rate::BytesPerSec(2 << 20)));
        assert!(parse_rate("5 furlongs").is_err());
    }
}
