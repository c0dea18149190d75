//! The model as an exposition, rendered once per cycle: OpenMetrics text by the
//! `prometheus-client` crate (the reference implementation's Rust port), and the Prometheus
//! text format 0.0.4 derived from it.
//!
//! `prometheus-client` encodes OpenMetrics only. The two formats differ, for the metric
//! types exported here (counter, gauge, histogram; no exemplars, units or `_created`), in
//! two things: a counter's family is named with `_total` in the classic format, and
//! OpenMetrics ends with `# EOF`. [`classic_text`] rewrites those lines and copies every
//! other byte, so both formats come from one encoding and cannot disagree on a series. A
//! second crate for the classic format (the `prometheus` crate) would bring a second
//! metric model to fill for a two-rule rewrite.

use std::{fmt, sync::Arc};

use bytes::Bytes;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, MetricEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};

use crate::{
    measure::character::{Character, CharacterClass},
    policy::Knob,
    prometheus::{
        histogram::Histogram,
        model::{Io, Labels, Level, Model, State, OPS},
        server::Exposition,
    },
};

/// Renders the model in both formats. `buf` is scratch space kept between cycles.
pub fn render(model: &Arc<Model>, buf: &mut String) -> (Exposition, u64) {
    buf.clear();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(View(model.clone())));
    // Writing to a String cannot fail; an encoder error would be a bug in a family below.
    if let Err(e) = prometheus_client::encoding::text::encode(buf, &registry) {
        tracing::error!(error = %e, "the metrics exposition could not be encoded");
    }
    drop(registry);
    let (text, series) = classic_text(buf);
    (
        Exposition {
            openmetrics: Bytes::copy_from_slice(buf.as_bytes()),
            text: Bytes::from(text),
        },
        series,
    )
}

/// The OpenMetrics text as Prometheus text format 0.0.4 (see the module's comment), and the
/// number of samples.
pub fn classic_text(openmetrics: &str) -> (String, u64) {
    let mut out = String::with_capacity(openmetrics.len() + 1024);
    let mut samples = 0;
    let mut lines = openmetrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            let counter = lines
                .peek()
                .is_some_and(|t| *t == format!("# TYPE {name} counter"));
            if counter {
                let help = &rest[name.len()..];
                out.push_str(&format!(
                    "# HELP {name}_total{help}\n# TYPE {name}_total counter\n"
                ));
                lines.next();
                continue;
            }
        } else if !line.starts_with('#') {
            samples += 1;
        }
        out.push_str(line);
        out.push('\n');
    }
    (out, samples)
}

/// The model as the registry's collector, for one render: the registry is dropped right
/// after, so the agent gets the model back to itself (`Arc::get_mut`) for the next cycle.
#[derive(Debug)]
struct View(Arc<Model>);

impl Collector for View {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let m = &*self.0;
        agent_families(m, &mut enc)?;
        cgroup_families(m, &mut enc)?;
        service_families(m, &mut enc)
    }
}

/// One family: its descriptor, then every series `each` writes.
fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    ty: MetricType,
    each: impl FnOnce(&mut MetricEncoder) -> fmt::Result,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, ty)?;
    each(&mut m)
}

fn gauge(m: &mut MetricEncoder, labels: &impl EncodeLabelSet, v: f64) -> fmt::Result {
    m.encode_family(labels)?.encode_gauge(&v)
}

fn counter(m: &mut MetricEncoder, labels: &impl EncodeLabelSet, v: u64) -> fmt::Result {
    m.encode_family(labels)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn histogram(m: &mut MetricEncoder, labels: &impl EncodeLabelSet, h: &Histogram) -> fmt::Result {
    m.encode_family(labels)?.encode_histogram::<NoLabelSet>(
        h.sum_seconds(),
        h.count(),
        &h.buckets(),
        None,
    )
}

/// Series without labels are written without braces.
fn plain_gauge(m: &mut MetricEncoder, v: f64) -> fmt::Result {
    m.encode_gauge(&v)
}

fn plain_counter(m: &mut MetricEncoder, v: u64) -> fmt::Result {
    m.encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn plain_histogram(m: &mut MetricEncoder, h: &Histogram) -> fmt::Result {
    m.encode_histogram::<NoLabelSet>(h.sum_seconds(), h.count(), &h.buckets(), None)
}

fn agent_families(m: &Model, enc: &mut DescriptorEncoder) -> fmt::Result {
    use MetricType::{Counter, Gauge, Histogram as Hist};
    let a = &m.agent;
    family(
        enc,
        "isolator_build_info",
        "The agent's version; always 1.",
        Gauge,
        |f| gauge(f, &[("version", m.version)], 1.0),
    )?;
    family(
        enc,
        "isolator_agent_cycles",
        "Cycles run since the agent started.",
        Counter,
        |f| plain_counter(f, a.cycles),
    )?;
    family(
        enc,
        "isolator_agent_interval_seconds",
        "Configured cycle length.",
        Gauge,
        |f| plain_gauge(f, a.interval_s),
    )?;
    family(
        enc,
        "isolator_agent_cycle_duration_seconds",
        "Work per cycle, from reading the kernel maps to the end of the cycle's events.",
        Hist,
        |f| plain_histogram(f, &a.cycle_duration),
    )?;
    family(
        enc,
        "isolator_agent_collect_duration_seconds",
        "Reading and diffing the kernel maps, per cycle.",
        Hist,
        |f| plain_histogram(f, &a.collect_duration),
    )?;
    family(
        enc,
        "isolator_agent_cgroups",
        "Cgroups with I/O in the last cycle.",
        Gauge,
        |f| plain_gauge(f, a.cgroups as f64),
    )?;
    family(
        enc,
        "isolator_agent_tracked_keys",
        "(cgroup, disk, op) keys in the kernel maps.",
        Gauge,
        |f| plain_gauge(f, a.tracked_keys as f64),
    )?;
    family(
        enc,
        "isolator_agent_map_capacity_keys",
        "Keys the kernel maps hold at most (--max-keys, --max-histogram-keys).",
        Gauge,
        |f| {
            gauge(f, &[("map", "counters")], a.capacity_keys as f64)?;
            gauge(
                f,
                &[("map", "histograms")],
                a.capacity_histogram_keys as f64,
            )
        },
    )?;
    let lost: [(&str, &str, u64); 6] = [
        (
            "isolator_agent_map_full_requests",
            "Requests not counted because the counters map was full.",
            a.map_full,
        ),
        (
            "isolator_agent_unsampled_requests",
            "Completions counted without latency samples (histogram map full).",
            a.unsampled,
        ),
        (
            "isolator_agent_missed_events",
            "Program runs the kernel skipped (recursion misses): requests not seen.",
            a.missed_events,
        ),
        (
            "isolator_agent_untraced_completions",
            "Requests found completed without the programs seeing their completion.",
            a.untraced,
        ),
        (
            "isolator_agent_evicted_keys",
            "Keys that left the kernel maps after --idle-key-timeout.",
            a.evicted_keys,
        ),
        (
            "isolator_agent_events_dropped",
            "Events the output (stdout or --json) did not keep up with.",
            a.events_dropped,
        ),
    ];
    for (name, help, v) in lost {
        family(enc, name, help, Counter, |f| plain_counter(f, v))?;
    }
    family(
        enc,
        "isolator_agent_notices",
        "Warning and error events, by level and code (docs/events.md).",
        Counter,
        |f| {
            for ((level, code), n) in &a.notices {
                counter(f, &[("level", *level), ("code", code.as_str())], *n)?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_discovery_up",
        "Whether a container runtime answers the agent (1) or not (0), by source.",
        Gauge,
        |f| {
            for (source, d) in &a.discovery {
                gauge(f, &[("source", *source)], d.up as u8 as f64)?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_discovery_containers",
        "Containers the source reported, by source.",
        Gauge,
        |f| {
            for (source, d) in &a.discovery {
                if let Some(n) = d.containers {
                    gauge(f, &[("source", *source)], n as f64)?;
                }
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_disk_utilization_ratio",
        "Fraction of the last cycle the disk had requests in flight.",
        Gauge,
        |f| {
            for (device, u) in &a.disks {
                gauge(f, &[("device", device.as_str())], *u)?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_disk_unseen_completions",
        "Requests the disk completed, by its own statistics, that the programs never saw.",
        Counter,
        |f| {
            for (device, n) in &a.disks_unseen {
                counter(f, &[("device", device.as_str())], *n)?;
            }
            Ok(())
        },
    )?;
    let x = &m.exposition;
    family(
        enc,
        "isolator_metrics_series",
        "Samples in the previous exposition.",
        Gauge,
        |f| plain_gauge(f, x.last_series as f64),
    )?;
    family(
        enc,
        "isolator_metrics_series_limit",
        "Series the (cgroup, disk) and (service, disk) pairs may reserve (--metrics-max-series).",
        Gauge,
        |f| plain_gauge(f, x.max_series as f64),
    )?;
    family(
        enc,
        "isolator_metrics_left_out",
        "Pairs refused a place by the series limit, once per stay, by level.",
        Counter,
        |f| {
            for l in Level::ALL {
                counter(f, &[("level", l.as_str())], x.left_out_total[l as usize])?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_metrics_left_out_active",
        "Pairs left out by the series limit that did I/O in the last cycle, by level.",
        Gauge,
        |f| {
            for l in Level::ALL {
                gauge(
                    f,
                    &[("level", l.as_str())],
                    x.left_out_now[l as usize] as f64,
                )?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_metrics_export_duration_seconds",
        "Time the previous exposition took: adding its cycle and rendering both formats.",
        Gauge,
        |f| plain_gauge(f, x.last_export_s),
    )
}

/// The families every (cgroup, disk) and (service, disk) has, with `prefix`
/// (`isolator_cgroup` or `isolator_service`).
fn io_families<'a>(
    enc: &mut DescriptorEncoder,
    prefix: &str,
    total_help: &str,
    series: impl Iterator<Item = (&'a Labels, &'a Io)> + Clone,
) -> fmt::Result {
    use MetricType::{Counter, Gauge, Histogram as Hist};
    let name = |n: &str| format!("{prefix}_{n}");
    family(
        enc,
        &name("device_latency_seconds"),
        "Device latency: issue to completion.",
        Hist,
        |f| {
            for (l, io) in series.clone() {
                histogram(f, &l.as_slice(), &io.device_latency)?;
            }
            Ok(())
        },
    )?;
    family(enc, &name("total_latency_seconds"), total_help, Hist, |f| {
        for (l, io) in series.clone() {
            histogram(f, &l.as_slice(), &io.total_latency)?;
        }
        Ok(())
    })?;
    family(
        enc,
        &name("requests"),
        "Requests completed, by op.",
        Counter,
        |f| {
            for (l, io) in series.clone() {
                for op in (0..3).filter(|&op| io.ops_seen[op]) {
                    counter(f, &(l.as_slice(), [("op", OPS[op])]), io.requests[op])?;
                }
            }
            Ok(())
        },
    )?;
    family(
        enc,
        &name("bytes"),
        "Bytes completed, by op.",
        Counter,
        |f| {
            for (l, io) in series.clone() {
                for op in (0..3).filter(|&op| io.ops_seen[op]) {
                    counter(f, &(l.as_slice(), [("op", OPS[op])]), io.bytes[op])?;
                }
            }
            Ok(())
        },
    )?;
    family(
        enc,
        &name("queue_seconds"),
        "Queue time (request start to issue), summed over the requests it was measured for.",
        Counter,
        |f| {
            for (l, io) in series.clone() {
                // A counter of seconds: f64, as the sum of a histogram.
                f.encode_family(&l.as_slice())?
                    .encode_counter::<NoLabelSet, _, f64>(&(io.queue_ns as f64 / 1e9), None)?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        &name("queued_requests"),
        "Requests whose queue time was measured.",
        Counter,
        |f| {
            for (l, io) in series.clone() {
                counter(f, &l.as_slice(), io.queued_requests)?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        &name("inflight_requests"),
        "Requests in flight at the end of the last cycle (with --count-inflight).",
        Gauge,
        |f| {
            for (l, io) in series.clone() {
                if let Some(n) = io.inflight {
                    gauge(f, &l.as_slice(), n as f64)?;
                }
            }
            Ok(())
        },
    )?;
    family(
        enc,
        &name("mean_inflight_requests"),
        "Time-average requests in flight over the last cycle (device time / cycle length).",
        Gauge,
        |f| {
            for (l, io) in series {
                gauge(f, &l.as_slice(), io.mean_inflight)?;
            }
            Ok(())
        },
    )
}

fn cgroup_families(m: &Model, enc: &mut DescriptorEncoder) -> fmt::Result {
    io_families(
        enc,
        "isolator_cgroup",
        "Total latency: request start to completion (queueing and device), what the submitter waits.",
        m.cgroups.values().map(|c| (&c.labels, &c.io)),
    )
}

fn service_families(m: &Model, enc: &mut DescriptorEncoder) -> fmt::Result {
    use MetricType::{Counter, Gauge};
    io_families(
        enc,
        "isolator_service",
        "The latency the SLO is judged on: request start to completion (device latency on queues without start times).",
        m.services.values().map(|s| (&s.labels, &s.io)),
    )?;
    let services = || m.services.values();
    family(
        enc,
        "isolator_service_p999_seconds",
        "p99.9 of the latency the SLO is judged on, over the window of isolator_service_p999_window_seconds.",
        Gauge,
        |f| {
            for s in services() {
                if let Some(ns) = s.p999_ns {
                    gauge(f, &s.labels.as_slice(), ns as f64 / 1e9)?;
                }
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_service_p999_samples",
        "Requests behind isolator_service_p999_seconds.",
        Gauge,
        |f| {
            for s in services().filter(|s| s.p999_ns.is_some()) {
                gauge(f, &s.labels.as_slice(), s.samples as f64)?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_service_p999_window_seconds",
        "Window of isolator_service_p999_seconds: the last cycle.",
        Gauge,
        |f| {
            for s in services().filter(|s| s.p999_ns.is_some()) {
                gauge(f, &s.labels.as_slice(), s.window_s)?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_service_state",
        "1 for the service's state on the disk in the last cycle (ok, violating or throttled), 0 for the others.",
        Gauge,
        |f| {
            for s in services() {
                let Some(now) = s.state else { continue };
                for st in State::ALL {
                    let v = (st == now) as u8 as f64;
                    gauge(f, &(s.labels.as_slice(), [("state", st.as_str())]), v)?;
                }
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_service_character",
        "1 for the service's I/O character class on the disk over its window (seq-read, rand-read, seq-write, rand-write, mixed), 0 for the others; absent with too few requests.",
        Gauge,
        |f| {
            for s in services() {
                let Some(now) = s.character.as_ref().and_then(|c| c.class) else {
                    continue;
                };
                for class in CharacterClass::ALL {
                    let v = (class == now) as u8 as f64;
                    gauge(f, &(s.labels.as_slice(), [("class", class.as_str())]), v)?;
                }
            }
            Ok(())
        },
    )?;
    for (name, help, pick) in [
        (
            "isolator_service_read_ratio",
            "Share of reads among the service's data requests on the disk over its character window.",
            (|c: &Character| c.read_ios_fraction) as fn(&Character) -> f64,
        ),
        (
            "isolator_service_sequential_ratio",
            "Share of sequential requests (starting near where the previous one ended) among the service's data requests on the disk over its character window.",
            |c: &Character| c.sequential_fraction,
        ),
    ] {
        family(enc, name, help, Gauge, |f| {
            for s in services() {
                if let Some(c) = &s.character {
                    gauge(f, &s.labels.as_slice(), pick(c))?;
                }
            }
            Ok(())
        })?;
    }
    for (name, help, knobs) in [
        (
            "isolator_service_limit_bytes_per_second",
            "Bandwidth limit in force, by knob (rbps, wbps); absent: no limit.",
            [Knob::Rbps, Knob::Wbps],
        ),
        (
            "isolator_service_limit_iops",
            "IOPS limit in force, by knob (riops, wiops); absent: no limit.",
            [Knob::Riops, Knob::Wiops],
        ),
    ] {
        family(enc, name, help, Gauge, |f| {
            for s in services() {
                for k in knobs {
                    if let Some(v) = s.limit.get(k) {
                        gauge(f, &(s.labels.as_slice(), [("knob", k.name())]), v as f64)?;
                    }
                }
            }
            Ok(())
        })?;
    }
    family(
        enc,
        "isolator_service_violations",
        "Times the service started violating its SLO on the disk.",
        Counter,
        |f| {
            for s in services() {
                counter(f, &s.labels.as_slice(), s.violations)?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_service_disk_stalls",
        "Cycles over its SLO on the disk that the policy judged stalls of the disk: no cut, or a probe undone without a knee (disk_stall).",
        Counter,
        |f| {
            for s in services() {
                counter(f, &s.labels.as_slice(), s.stalls)?;
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_service_decisions",
        "Limit and weight decisions on the service, by knob, reason (protect, cap, relax, remove, weight) and whether they were applied.",
        Counter,
        |f| {
            for (service, info) in &m.service_info {
                for ((device, knob, reason, applied), n) in &info.decisions {
                    let applied = if *applied { "true" } else { "false" };
                    let mut l = vec![("service", service.as_str())];
                    if !device.is_empty() {
                        l.push(("device", device.as_str()));
                    }
                    l.extend([("knob", *knob), ("reason", *reason), ("applied", applied)]);
                    counter(f, &l.as_slice(), *n)?;
                }
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_service_slo_p999_seconds",
        "p99.9 latency target of a latency service.",
        Gauge,
        |f| {
            for (service, info) in &m.service_info {
                if let crate::config::SloClass::Latency(t) = info.slo {
                    if t.quantile == crate::config::LatencyQuantile::P999 {
                        gauge(
                            f,
                            &[("service", service.as_str())],
                            t.target_ns as f64 / 1e9,
                        )?;
                    }
                }
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_service_slo_latency_seconds",
        "Latency target of a latency service at the quantile its SLO names (label slo_quantile: 0.999, 0.99, 0.95 or 0.9).",
        Gauge,
        |f| {
            for (service, info) in &m.service_info {
                if let crate::config::SloClass::Latency(t) = info.slo {
                    // Not `quantile`: that label is a summary's (promtool refuses it here).
                    let quantile = t.quantile.fraction().to_string();
                    gauge(
                        f,
                        &[
                            ("service", service.as_str()),
                            ("slo_quantile", quantile.as_str()),
                        ],
                        t.target_ns as f64 / 1e9,
                    )?;
                }
            }
            Ok(())
        },
    )?;
    family(
        enc,
        "isolator_service_slo_rate_bytes_per_second",
        "Throughput target of a throughput service.",
        Gauge,
        |f| {
            for (service, info) in &m.service_info {
                if let crate::config::SloClass::Throughput { rate_bps } = info.slo {
                    gauge(f, &[("service", service.as_str())], rate_bps as f64)?;
                }
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use isolator_common::{OP_READ, OP_WRITE};

    use super::*;
    use crate::{
        config::SloClass,
        events::{Event, ServiceStats},
        policy::IoMaxLimit,
        prometheus::model::{
            tests::{delta, named},
            CycleInput, Model,
        },
    };

    /// A model with one cgroup of a service, a limit and a notice, after two cycles.
    fn sample_model() -> Arc<Model> {
        let mut m = Model::new("0.1.0", 50_000, true, false);
        let names = [named(7, "/db"), named(9, "/weird\\x2d\"name\"")];
        let events = [
            Event::ServiceStats(ServiceStats {
                service: "db".into(),
                slo: SloClass::latency_p999(5_000_000),
                dev: "254:0".into(),
                disk: Some("vda".into()),
                state: "throttled".into(),
                p999_ns: Some(700_000),
                samples: 1000,
                cgroups: vec![7],
                limit: IoMaxLimit {
                    wbps: Some(50 << 20),
                    ..Default::default()
                },
                ..Default::default()
            }),
            Event::warning("docker_down", "x"),
        ];
        for cycle in 1..=2 {
            m.apply(&CycleInput {
                snap: &crate::collect::collector::Snapshot {
                    cycle,
                    interval_ns: 1_000_000_000,
                    deltas: vec![
                        delta(7, OP_READ, 100, 200_000, 30_000),
                        delta(7, OP_WRITE, 10, 3_000_000, 0),
                        delta(9, OP_READ, 1, 20_000_000_000, 0),
                    ],
                    ..Default::default()
                },
                cgroups: &names,
                events: &events,
                collect_ns: 2_000_000,
            });
        }
        Arc::new(m)
    }

    fn samples(text: &str) -> Vec<&str> {
        let mut v: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn both_formats_hold_the_same_samples() {
        let (x, n) = render(&sample_model(), &mut String::new());
        let om = std::str::from_utf8(&x.openmetrics).unwrap();
        let text = std::str::from_utf8(&x.text).unwrap();
        assert!(om.ends_with("# EOF\n"));
        assert!(!text.contains("# EOF"));
        assert_eq!(samples(om), samples(text));
        assert_eq!(samples(text).len() as u64, n);
        // Counters: OpenMetrics names the family without _total, the text format with.
        assert!(om.contains("# TYPE isolator_cgroup_requests counter\n"));
        assert!(text.contains("# TYPE isolator_cgroup_requests_total counter\n"));
        assert!(text.contains("# HELP isolator_cgroup_requests_total Requests completed, by op.\n"));
        assert!(!text.contains("# TYPE isolator_cgroup_requests counter"));
    }

    /// A target at the p95 is a series of the quantile family only: the p99.9 family says
    /// p99.9 targets, nothing else.
    #[test]
    fn a_p95_target_is_said_at_its_quantile() {
        let mut m = Model::new("0.1.0", 50_000, true, false);
        let events = [Event::ServiceStats(ServiceStats {
            service: "pg".into(),
            slo: SloClass::Latency(crate::config::LatencyTarget {
                quantile: crate::config::LatencyQuantile::P95,
                target_ns: 3_000_000,
            }),
            dev: "254:0".into(),
            state: "ok".into(),
            ..Default::default()
        })];
        m.apply(&CycleInput {
            snap: &crate::collect::collector::Snapshot {
                cycle: 1,
                interval_ns: 1_000_000_000,
                ..Default::default()
            },
            cgroups: &[],
            events: &events,
            collect_ns: 1_000_000,
        });
        let (x, _) = render(&Arc::new(m), &mut String::new());
        let text = std::str::from_utf8(&x.text).unwrap();
        assert!(
            text.lines().any(|l| l
                == r#"isolator_service_slo_latency_seconds{service="pg",slo_quantile="0.95"} 0.003"#),
            "{text}"
        );
        assert!(
            !text.contains(r#"isolator_service_slo_p999_seconds{service="pg"}"#),
            "{text}"
        );
    }

    #[test]
    fn series_say_what_the_model_holds() {
        let (x, _) = render(&sample_model(), &mut String::new());
        let text = std::str::from_utf8(&x.text).unwrap();
        let has = |line: &str| {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        };
        let db = r#"cgroup="/db",kind="cgroup",service="db",device="vda""#;
        has(&format!(
            r#"isolator_cgroup_requests_total{{{db},op="read"}} 200"#
        ));
        has(&format!(
            r#"isolator_cgroup_requests_total{{{db},op="write"}} 20"#
        ));
        // Cumulative buckets: 200 reads <= 250 us, 20 writes <= 5 ms.
        has(&format!(
            r#"isolator_cgroup_device_latency_seconds_bucket{{le="0.0001",{db}}} 0"#
        ));
        has(&format!(
            r#"isolator_cgroup_device_latency_seconds_bucket{{le="0.00025",{db}}} 200"#
        ));
        has(&format!(
            r#"isolator_cgroup_device_latency_seconds_bucket{{le="0.005",{db}}} 220"#
        ));
        has(&format!(
            r#"isolator_cgroup_device_latency_seconds_bucket{{le="+Inf",{db}}} 220"#
        ));
        has(&format!(
            r#"isolator_cgroup_device_latency_seconds_count{{{db}}} 220"#
        ));
        has(&format!(
            r#"isolator_cgroup_device_latency_seconds_sum{{{db}}} 0.1"#
        ));
        // A label value with a backslash and quotes is escaped.
        assert!(text.contains(r#"cgroup="/weird\\x2d\"name\"""#), "{text}");
        // 20 s is beyond the last bound.
        let weird = r#"cgroup="/weird\\x2d\"name\"",kind="cgroup",device="vda""#;
        has(&format!(
            r#"isolator_cgroup_device_latency_seconds_bucket{{le="10.0",{weird}}} 0"#
        ));
        let svc = r#"service="db",device="vda""#;
        has(&format!(r#"isolator_service_p999_seconds{{{svc}}} 0.0007"#));
        has(&format!(
            r#"isolator_service_p999_window_seconds{{{svc}}} 1.0"#
        ));
        has(&format!(
            r#"isolator_service_state{{{svc},state="throttled"}} 1.0"#
        ));
        has(&format!(
            r#"isolator_service_state{{{svc},state="ok"}} 0.0"#
        ));
        has(&format!(
            r#"isolator_service_limit_bytes_per_second{{{svc},knob="wbps"}} 52428800.0"#
        ));
        has(r#"isolator_service_slo_p999_seconds{service="db"} 0.005"#);
        has(r#"isolator_service_slo_latency_seconds{service="db",slo_quantile="0.999"} 0.005"#);
        has(r#"isolator_agent_notices_total{level="warning",code="docker_down"} 2"#);
        has(r#"isolator_discovery_up{source="docker"} 0.0"#);
        has(r#"isolator_build_info{version="0.1.0"} 1.0"#);
        has("isolator_agent_cycles_total 0");
        has("isolator_agent_collect_duration_seconds_count 2");
    }

    /// docs/metrics.md lists every family the exposition has, with its type, and no other.
    #[test]
    fn every_family_is_documented_with_its_type() {
        let docs = include_str!("../../../docs/metrics.md");
        let documented: std::collections::BTreeSet<(String, String)> = docs
            .lines()
            .filter_map(|l| {
                let mut cells = l.strip_prefix("| `isolator_")?.split(" | ");
                let name = format!("isolator_{}", cells.next()?.strip_suffix('`')?);
                Some((name, cells.next()?.to_string()))
            })
            .collect();
        let (x, _) = render(&sample_model(), &mut String::new());
        let exposed: std::collections::BTreeSet<(String, String)> = std::str::from_utf8(&x.text)
            .unwrap()
            .lines()
            .filter_map(|l| {
                let (name, ty) = l.strip_prefix("# TYPE ")?.split_once(' ')?;
                Some((name.to_string(), ty.to_string()))
            })
            .collect();
        assert_eq!(
            exposed.difference(&documented).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "exposed but not in docs/metrics.md (or with another type)"
        );
        assert_eq!(
            documented.difference(&exposed).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "in docs/metrics.md but not exposed"
        );
    }

    #[test]
    fn help_texts_need_no_escaping_in_either_format() {
        let (x, _) = render(&sample_model(), &mut String::new());
        for l in std::str::from_utf8(&x.openmetrics).unwrap().lines() {
            if let Some(help) = l.strip_prefix("# HELP ") {
                assert!(!help.contains(['\\', '"']), "{l}");
            }
        }
    }
}
