//! `adaptive`: find the aggressor, cut it enough in one step, then search for the knee (the
//! highest cap at which every SLO still holds) and stay just under it.
//!
//! - A victim is a latency service over its p99.9 target (or a backlogged throughput
//!   service short of its rate).
//! - The aggressor is the service that occupies the device (largest device-time share)
//!   among those that owe nothing: best-effort services and throughput services above
//!   their target alike, then latency services within theirs.
//! - First cut of an episode: back to the last cap that held if one is known (an aggressor
//!   that comes back after a quiet spell), else one decisive cut: the bytes the victim
//!   competes with scaled by (SLO/L)^2 (at most half, at least 5 %), all taken from the
//!   aggressor, because a second cut costs two more violating cycles; a first cut that does
//!   not hold in its first full cycle, or in its transition with the aggressor at the cap
//!   there, is cut again by at least three quarters. The rate
//!   that broke the SLO is the knee, unless the aggressor arrived in that cycle (its mean
//!   rate there understates it): then the search doubles the cap until a probe breaks, or
//!   raises it less where the line through the p99.9s of this cap and the one it was
//!   raised from (log-log) reaches the target first.
//! - Then a bisection in log space between the highest cap seen to hold (`good`: a window of
//!   [`PROBE_CYCLES`] cycles without a violation or a near miss; one far under every target
//!   in a doubling search, see [`FAST_PASS`]) and the lowest seen to break
//!   an SLO (`bad`): a raise that breaks an SLO before it is confirmed goes back to `good`
//!   on its first violation, and so does one whose window has a near miss; the search
//!   stops when the two are within [`KNEE_PRECISION`]. Toward a knee a broken probe found,
//!   a probe goes where the line through the cap's p99.9 and the broken one's (log-log)
//!   reaches [`PROBE_AIM`] of the target when that is under half-way, and not at all when
//!   it gains under 5 %.
//! - Probing spends the budget of one violating cycle in ten: no raise while a violation
//!   since the episode's start (the aggressor's arrival and its first cut) is in the last
//!   [`NOISE_WINDOW`] cycles, unless the cap is [`FAR_FROM_KNEE`] under the knee. Measured on the test disk, the victim's per-cycle p99.9 near the
//!   knee straddles the target from one cycle to the next (3.4 to 6 ms at a 5 ms target
//!   for the same cap), so the search judges windows, not cycles, and a settled cap keeps
//!   its place through one violating cycle in [`NOISE_WINDOW`].
//! - The budget is one violating cycle in ten: the per-cycle p99.9 is modelled as log-normal
//!   around its cap's level, with its scatter measured under each cap, and a settled cap
//!   whose level plus [`Z_TENTH`] sigmas is over the target is trimmed, unless the window's
//!   upper half alone keeps the budget (quiet cycles only widen sigma); where the fitted
//!   slope of latency against the cap is flat, no trim can help and none is made. A window
//!   trim whose range then runs as close to the target measures the curve flat: a window
//!   as close trims nothing there or a step above, and a give-back climbs it (see
//!   [`WindowTrim`]).
//! - A knee is trusted for [`BAD_MEMORY_CYCLES`] (not counting cycles the aggressor rests),
//!   twice as long each time it is found again: a stable knee is probed ever more rarely, a
//!   moved one soon. A knee found once with the cap under it far below the target is
//!   doubted and probed at once.
//! - A cap the aggressor no longer uses (under a quarter of it for [`QUIET_CYCLES`]) is
//!   lifted, the knee remembered for its return.
//! - A violation [`STALL_FACTOR`] over the level the same or higher caps gave in the last
//!   [`NOISE_WINDOW`] cycles, and [`PROBE_STALL_FRACTION`] over its target, with no service
//!   pushing more than then, is the disk stalling,
//!   not a cap too high: it holds back raises like any violation but cuts nothing (a
//!   `disk_stall` notice), and its cycle stays out of the scatter, the window p99.9 and the
//!   fit. After [`STALL_MAX_RUN`] in a row or [`STALL_MAX_WINDOW`] in ten, violations
//!   are judged as harm again, the stalls with them. A violation [`STALL_FACTOR`] times
//!   what the one capped service's full load did ([`Adaptive::full_load_harm`]) is a stall
//!   from the first cycles on, spends no budget and fails no probe. A probe that meets a
//!   stall otherwise ([`PROBE_STALL_FRACTION`]) falls back, but sets no knee and runs again;
//!   in the [`RAISE_TRIAL_CYCLES`] after a raise's window passed, a violation is the raise's.
//! - Where no single service clears the candidate bar (a twentieth of the device's time or
//!   bytes) but the ones that owe nothing do together, they are cut and given back as one
//!   group (see [`light_group`]).
//! - Only when nobody else loads the device does the victim's own concurrency go down
//!   (PINE eq. 2-3 through Little's law), and only after [`SELF_BLAME_CYCLES`] violating
//!   cycles in a row; a victim with nothing left to cut gets an `slo_infeasible` notice.

mod light_group;

use std::collections::{HashMap, HashSet, VecDeque};

use light_group::LightGroup;

use super::{
    base_cause, cap_bandwidth, cap_concurrency, pine_concurrency_step, share_of, uncap,
    victim_cause, Cause, Decision, DeviceCycle, Finding, LatencyNumbers, Policy, ServiceId,
    ServiceLoad,
};
use crate::config::SloClass;

/// How long a rate that broke an SLO is remembered before it may be probed again. Each time
/// the same knee (within [`SAME_KNEE`]) is found again, it is trusted twice as long, up to
/// [`MAX_BAD_MEMORY_CYCLES`]: a probe costs at most one violating cycle or two and two
/// changes, so even the longest memory re-probes well inside the budget of one violating
/// cycle and one change in ten, and a disk that got faster is found within minutes.
pub const BAD_MEMORY_CYCLES: u64 = 30;
const MAX_BAD_MEMORY_CYCLES: u64 = 4 * BAD_MEMORY_CYCLES;
const SAME_KNEE: f64 = 0.15;
/// Full cycles after a change (its transition not counted: it still carries the old cap's
/// latency) that must pass without a violation or a near miss before the cap counts as
/// holding. A violation in the transition of a raise still fails the raise, and a raise's
/// transition in which the service already took most of the raise (its rate at least 80 %
/// of the way from the old cap to the new) counts as the window's first cycle: the cap is
/// written a few ms into it, and a throttled service's queue runs at the new rate at once
/// (on the test disk every raise's transition ran at 99-100 % of the new cap, and every
/// raise that broke, broke there). Three cycles a step left a
/// doubling search from an arrival's cut still doubling ten cycles later. Far under every
/// target, a doubling search's window is one cycle (see [`FAST_PASS`]).
pub const PROBE_CYCLES: u64 = 2;
/// In a doubling search (no knee known since an arrival's cut), a cap under which every
/// cycle of its window so far ran each latency service under this fraction of its target
/// holds after one cycle: a second cycle that far under says little the first did not, and
/// the search has few cycles before the steady phase. Seen on the test disk (BENCHMARKS run
/// Z): a writer's reads at 0.02-0.06 of their target under 24-100 MB/s, 0.2-0.5 from
/// 137 MB/s up, a cliff at 250-480; two cycles a step put the first broken probe 8-12
/// cycles after the arrival, and the half-way probes after it in the steady phase. Low
/// enough that one quiet cycle of a bimodal reader (see [`NEAR_MISS_FLOOR`]: its bursts run
/// 4-10 times its quiet cycles) still puts its bursts under the near-miss floor: at 0.1 the
/// simulator's bimodal reader passed a cap on a quiet cycle whose bursts ran at 0.5. A cap
/// passed so never enters the latency fit or the stall rule's level (its one cycle is
/// before its first full cycle); only a probe's stall is judged there.
const FAST_PASS: f64 = 0.05;
/// A p99.9 above the near-miss bar is a near miss: a probe window with one is not a pass
/// (nor a fail). The bar is where, with the per-cycle scatter measured under the caps (see
/// [`DEFAULT_NOISE_SIGMA`]), one cycle in ten would break the target: exp(-[`Z_TENTH`]
/// sigma), 90 % of the target at the default sigma, 85-88 % under a writer's plateau on
/// the test disk. It was capped at 90 % once; on a quiet disk (sigma 0.03, a bar at 96 %)
/// that cap stopped the simulator's random-read scan at 89 % of the best static cap, its
/// last probe turned back at 91 %. Not lower than the plateau where it can be helped: on
/// the test disk a writer's p99.9 sits at 70-86 % of a 5 ms target for every cap from 300
/// to 700 MB/s, below a cliff at ~900; a bar inside the plateau would stop the search at
/// its foot. A knee where latency grows smoothly (a random-read scan's) is held back by the
/// window trim instead.
/// The scatter model lowers the near-miss bar, but not under this: a reader whose per-cycle
/// p99.9 is bimodal (on the test disk 0.5-0.9 ms most cycles, 3-6 ms in the writer's bursts)
/// measures a sigma of 0.6 and more, which no log-normal fits, and a bar of exp(-1.28 sigma)
/// at 43 % of a 5 ms target failed every probe to a cap a static one held (run O, repeat 2:
/// 219 and 201 MB/s turned back at 2.2 ms; static 400 MB/s broke 1 cycle in 19).
const NEAR_MISS_FLOOR: f64 = 0.7;
/// A cap this far under a trusted knee is probed half-way to it even with the one-in-ten
/// budget spent: the probe lands at 0.82 of the knee or lower, where it rarely breaks.
const FAR_FROM_KNEE: f64 = 1.5;
/// A probe that broke with a latency service at this many times its target or more broke
/// at a cliff, not a knee: on the test disk a writer's knees put the reader at 0.8-2.9
/// times its target, a random-read scan's at 3.4-9 times (see `relax`).
const CLIFF_FRACTION: f64 = 3.0;
/// Raises above a knee that is no longer trusted creep by this factor: it has probably not
/// moved far. (Every cap this policy sets comes with a knee, the rate that made it cut,
/// except an arrival's: that search doubles.)
const CREEP_FACTOR: f64 = 1.1;
/// The search stops when the lowest breaking cap is within this factor of the highest
/// holding one: 10 % of the bandwidth is what the next probe could win, a violation what
/// it could cost.
pub const KNEE_PRECISION: f64 = 1.1;
/// A full load that broke an SLO by no more than [`MARGINAL`], or after keeping every
/// target for the [`NOISE_WINDOW`] - 1 cycles before (one violation in ten: the budget's
/// own edge), ran at the target's edge, not past a knee: the latency under it need not rise
/// toward the target (no near miss warns a probe), and what grows with the rate is how
/// often a cycle breaks it, which a probe window of two or three cycles does not show. The
/// search toward such a knee goes no closer than this factor under it: one step from the
/// first cut's half. Seen in the v2 guest (BENCHMARKS run CL): the writer's full 3754 MB/s
/// put the reader at 1.02 of its 15 ms target (5.0 GB/s at 1.14 in another repeat); the
/// reader ran at 0.6-0.9 of it from 1000 MB/s up, static 2000 broke 1 cycle in 49 and 3000
/// a quarter, and the half-way probes climbed to 3443 MB/s (0.92 of the full rate) by the
/// fifteenth cycle and broke the budget there. In run CO the full load ran 13-22 cycles
/// within the target before a stall of the host (187-365 ms) cut it, and the probes climbed
/// to 3449-3678 MB/s. Not under a full load that broke its target at once and far over it:
/// on the test disk a writer's knees sat at 17-60 % of its full rate (see `decisive_cut`)
/// and a random-read scan's full load 8 times over its target sat just past a cliff at 80 %
/// of its rate.
const EDGE_KNEE_PRECISION: f64 = 1.5;
/// After an episode's search ([`SEARCH_CYCLES`]): a probe half-way (log space) to a knee
/// closer than this gains under 10 %, which is not worth a change and a likely violation.
const SETTLED_KNEE_PRECISION: f64 = 1.2;
/// A cap unchanged this long is settled: a violation under it is judged against the
/// noise window before anything is cut.
const SETTLED_CYCLES: u64 = 4;
/// A settled cap keeps its place through one violating cycle in this many.
pub const NOISE_WINDOW: u64 = 10;
/// Cycles after an episode's start (an aggressor's arrival or return) in which the knee
/// search may raise a cap as soon as the last one held; after them, a raise near the knee
/// only with no change in the last [`NOISE_WINDOW`] cycles and at most one in the last two
/// windows (see [`DeviceHistory::change_budget_allows`]).
pub const SEARCH_CYCLES: u64 = 10;
/// A violation of at most this multiple of the target is marginal: a fresh cap not yet in
/// force waits a cycle on one.
const MARGINAL: f64 = 1.2;
/// A settled cap that must give way keeps at least this fraction: it was near the knee.
const GENTLE_CUT_MIN: f64 = 0.7;
/// Budget cuts in a row that took a service's rate to this fraction of where they started (two
/// cuts to 70 %, the rate lagging the cap by a few per cent), with the
/// victim still within [`FUTILE_CUT_NEAR`] of its target and its level fallen by less than
/// [`FUTILE_SLOPE`] per unit of log rate, moved nothing a cut can: the disk's own latency
/// sits at the target (BENCHMARKS run DM, the random reader, repeat 3: the reader at
/// 2.9-3.4 ms against 3 with the scan at 117 MB/s and at 20; alone it read 2.9). The cap is
/// held and the victim told `slo_infeasible`, not cut to the least cap. Far over its target
/// a victim on a plateau (a writer's full load) is still cut: the knee is below.
const FUTILE_CUT_SPAN: f64 = 0.55;
const FUTILE_CUT_NEAR: f64 = 1.5;
/// A settled cap whose window p99.9 (every I/O of its last cycles, up to [`NOISE_WINDOW`],
/// at least [`TRIM_MIN_CYCLES`]) is above this fraction of a target is trimmed. Per-cycle
/// p99.9 from ~15k samples scatters (0.8 to 3.6 ms for one cap of a random-read scan on the
/// test disk, target 3 ms): a cap whose cycles mostly pass can still give the client a
/// p99.9 over its target over a minute. A full window leaves out its worst cycle, the one
/// in ten the budget allows (see `window_fraction`): a tail spread over the cycles is the
/// cap's, one cycle's burst is the disk's.
const TRIM_AT: f64 = 0.9;
const TRIM_MIN_CYCLES: usize = 5;
/// A trim takes the window p99.9 to this fraction of the target, within [`TRIM_RANGE`] of
/// the cap: small enough that the search does not probe straight back.
const TRIM_TO: f64 = 0.8;
const TRIM_RANGE: (f64, f64) = (0.75, 0.92);
/// The per-cycle p99.9 is modelled as log-normal around its cap's level: sigma of its log
/// is estimated from the cycles under each cap (at least [`NOISE_MIN_CYCLES`]) and
/// smoothed across caps. One violating cycle in ten is the budget: a cap is over it when
/// the mean log fraction plus [`Z_TENTH`] sigmas is above the target, and a trim aims
/// [`Z_TRIM`] sigmas under it, so the next slow spell does not cost the budget at once.
/// Measured on the test disk: ~0.1 under a sequential writer's plateau, ~0.35 under a
/// random-read scan (0.8 to 3.6 ms for one cap).
const DEFAULT_NOISE_SIGMA: f64 = 0.08;
const NOISE_SIGMA_RANGE: (f64, f64) = (0.03, 1.0);
const NOISE_MIN_CYCLES: usize = 4;
/// A cap binds (fixes the aggressor's rate) when the service uses at least this share of it.
const BINDING: f64 = 0.8;
/// Weight of the newest estimate in the smoothed sigma.
const NOISE_SMOOTHING: f64 = 0.3;
const Z_TENTH: f64 = 1.2816;
const Z_TRIM: f64 = 1.6449;
/// How sure (in standard errors of the window's mean) the budget must be broken before a
/// trim: one sigma, so a cap exactly at the budget is not trimmed on every other window.
const Z_CONFIDENCE: f64 = 1.0;
/// A knee found once, under which a cap [`KNEE_PRECISION`] lower runs its per-cycle p99.9
/// at less than this fraction of the target (geometric mean), is doubted: one slow spell
/// of the disk (seen: a p99.9 rising from 0.2 to 5.7 ms over six cycles at one cap, then
/// 0.4 ms at a cap 7 % lower) is no knee. It expires at once, and a cap that runs this far
/// below every target (over [`PROBE_CYCLES`]) is raised by [`CREEP_FAR_FACTOR`] and more
/// (see [`CLIMB_MAX_FACTOR`]).
const KNEE_DOUBT: f64 = 0.35;
/// How many knees found before the last one a search keeps (each for its own memory): those
/// of settled caps cut for breaking the one-in-ten budget over their window
/// ([`Knee::window`]), not a re-cut's nor one violation's, which a slow spell of the disk
/// sets in a row (a cut every other cycle while every cap breaks; the simulator's stall
/// test). A doubted knee expires at once, and the climb after it ([`CREEP_FAR_FACTOR`], up to
/// [`CLIMB_MAX_FACTOR`] a step) stops half-way to the lowest of them above the cap, and
/// stops under it as under a trusted knee ([`KNEE_PRECISION`], settled
/// [`SETTLED_KNEE_PRECISION`]): seen on the test disk (BENCHMARKS run DD, the writer,
/// repeat 1), budget cuts 404 -> 283 -> 198 MB/s that were right (the reader's bursts came
/// less often under each), then, with the knee at 198 doubted (the reader at 0.3-0.4 of its
/// target under it), a climb 181 -> 707 MB/s in six cycles past the 283 and 404 that had
/// broken the budget 20-30 cycles before, and three cuts back down.
const OLDER_KNEES: usize = 3;
const CREEP_FAR_FACTOR: f64 = 1.25;
/// A raise under this factor toward a rate no probe measured, past the search's first
/// [`SEARCH_CYCLES`], waits for the change budget (see
/// [`DeviceHistory::change_budget_allows`]): the search has come that close to the target
/// or the knee. Seen in CI's random-read scan: a doubling search's line steps shrinking
/// toward the target (179 -> 205 -> 219 MB/s, 14 % and 7 %) ran on into the steady phase,
/// and the creep after them broke at 9x the target; in BENCHMARKS run AC, six half-way
/// probes toward the rate whose full load broke the SLO (293 MB/s), every two cycles to
/// cycle 21; the last broke. Under a creep's 25 %, so that creeps on a flat plateau (a
/// writer's) go on.
const SHORT_STEP: f64 = 1.2;
/// Without a trusted knee, each raise that held with every target still that far under
/// squares the factor of the next (1.25, 1.56, then at most [`CLIMB_MAX_FACTOR`]): the
/// latency has not moved, so a knee, if any, is far. Seen on the test disk (BENCHMARKS run
/// R, PostgreSQL, repeat 1): a stall of the disk set a knee at 51 MB/s where a static 300
/// held; once it was doubted, raises of 10-25 % every three cycles with the reads at 20-24 %
/// of their target left the writer at 15 % of the best static cap. On a plateau under a
/// cliff (a writer's, with a lenient target) the doubling can overshoot the cliff: that
/// probe fails on its first violation and finds the knee, as an arrival's doubling does.
/// The ceiling and the device's knee still bound each step; any cut, trim, fall-back or
/// lift starts the climb again at 1.25.
const CLIMB_MAX_FACTOR: f64 = 2.0;
/// A probe toward a knee found by a broken probe (or a trim) goes half-way (in log space) or
/// to where the line through the cap's level and the knee's measured p99.9 (log p99.9
/// against log rate) crosses this fraction of the target, whichever is lower. With half-way
/// alone, 52 raises failed against 56 probes toward a knee in the simulator's writer runs
/// (cycles 16-34, 36 runs: a plateau under a cliff puts the knee low in the bracket
/// doubling leaves); with the line, 28 against 70, and violating cycles there fell from 2.6
/// to 1.6 per run, changes from 4.6 to 4.4. Under the trim's aim (0.8): a cap found at
/// 0.8 sat where one cycle in ten reached the target, and the re-probe from it once its
/// knee expired cost three violating cycles in 28 (the simulator's on/off writer).
const PROBE_AIM: f64 = 0.75;
/// Where a doubling search's line aims (see [`Search::double_toward`]): the target, not
/// [`PROBE_AIM`]. The line from the latency floor is steep; aimed at 0.75 it held the
/// simulator's late-arriving writer under the plateau below its cliff (384 MB/s against a
/// best static 430); at the target it changes nothing there and still stops short of a
/// wall.
const DOUBLING_AIM: f64 = 1.0;
/// A probe that line puts under this gain is not made: the cap is at the aim already.
const MIN_PROBE_GAIN: f64 = 1.05;
/// Flatter than this slope between the two, the line says nothing (the broken probe met a
/// slow cycle, or noise): half-way.
const MIN_PROBE_SLOPE: f64 = 0.25;
/// How many (cap, p99.9) cycles of one capped service the latency-vs-rate fit keeps, how
/// many it needs, and how wide a spread of caps (sd of the log) before its slope means
/// anything.
const FIT_CYCLES: usize = 40;
const FIT_MIN_CYCLES: usize = 8;
const FIT_MIN_SPREAD: f64 = 0.05;
/// Below this slope of log p99.9 against log cap, a cut buys almost nothing: the p99.9
/// sits on a plateau (a writer's at 300-700 MB/s on the test disk) and its scatter is the
/// disk's own, which no cap fixes. Budget trims (made before any violation) are skipped
/// there; the budget's second violation in ten still cuts, as anywhere.
const FUTILE_SLOPE: f64 = 0.5;
/// A violating cycle whose worst p99.9 fraction is this many times the level of the recent
/// cycles under the same or higher caps, and [`STALL_SIGMAS`] of their scatter over it, and
/// at least [`PROBE_STALL_FRACTION`] (a cap's harm stays under it), with
/// nobody pushing more than [`STALL_LOAD`] times the bytes or IOPS of those cycles, is a stall
/// of the disk. Seen on the test disk (BENCHMARKS run S, PostgreSQL): the reads at 10-17 ms
/// against 14 jumped to 145 ms for one or two cycles every few, with the writer at its cap
/// each time; every second such cycle in ten cut the writer by 30 %, 232 -> 41 MB/s, and
/// the stalls came as long at 41 as at 232 MB/s, as under a static cap.
const STALL_FACTOR: f64 = 3.0;
const STALL_SIGMAS: f64 = 5.0;
const STALL_LOAD: f64 = 1.2;
/// Slack on [`STALL_LOAD`] for a service that ran little or not at all in those cycles: a
/// logger's trickle is no new load.
const STALL_SLACK_BPS: f64 = 1e6;
const STALL_SLACK_IOPS: f64 = 50.0;
/// Cycles of a level before a jump over it can be a stall.
const STALL_MIN_CYCLES: usize = 3;
/// Stall cycles in a row before the next is judged as harm: the disk that stays slow has a
/// new knee, and the cut it needs waits at most this long.
const STALL_MAX_RUN: usize = 2;
/// Stall cycles in the last [`NOISE_WINDOW`] before the next is judged as harm: harm that
/// comes and goes under a binding cap (a burst of another kind of I/O at the same rate)
/// must not pass as stalls for ever. Then the stalls count against the cap too.
const STALL_MAX_WINDOW: usize = 3;
/// The same for stalls beyond what the capped service's full load did: a disk that stalls
/// one cycle in three to six (BENCHMARKS run V, PostgreSQL repeat 1) is told through, harm
/// that comes and goes is not for ever.
const STALL_MAX_WINDOW_BEYOND_FULL_LOAD: usize = 4;
/// What the reason of a settled cap's cut for a broken one-in-[`NOISE_WINDOW`] budget says,
/// however many violations it counted (see `throttle`): what tests look for.
#[cfg(test)]
pub(super) const BUDGET_CUT_REASON: &str = " in 10 cycles under this cap";
/// Share of its cap over which a capped service's cycle is not one of a fixed rate (a
/// transition cycle still running an old, higher cap's rate): from [`BINDING`] to this, the
/// cap is in force and fixes the rate.
const FIXED_RATE_OVER_CAP: f64 = 1.05;
/// Cycles after a raise's probe window passed in which a violation is the raise's harm
/// even when it looks like a stall: two cycles are a short sample of a cap near a cliff.
/// Seen in CI (8014f12, the random-read scenario): a line probe to 219 MB/s passed its two
/// cycles, then the reader ran at 8-9 times its target in four of the next five, all
/// excused as stalls (the scan's full load had done 4.2 times), before the cap was cut;
/// a static cap at 275 MB/s broke 15 cycles of 19 right after. Stalls a cap did not make
/// come as often under the cap before the raise, where they stay excused.
const RAISE_TRIAL_CYCLES: u64 = 3;

/// A raise on probation whose first violation puts the worst latency service at this many
/// times its target (and [`STALL_FACTOR`] times what the victim saw with the aggressor
/// uncapped at the raised rate or more, when that was seen) met a stall of the disk, not
/// its knee: it falls back as any failed probe, but records no knee and is run again once
/// its window is clean. Seen on the test disk, in every failed probe of BENCHMARKS runs L-U
/// (about a hundred): a probe that crossed a knee put the reader at 0.8-2.9 times its
/// target; the probes that met a stall, at 4.3-27 times (BENCHMARKS run U, PostgreSQL: a
/// probe to 255 MB/s at 121 ms against 16 set the knee where a static 300 MB/s held). A
/// second failure of the same probe is the knee, whatever its size.
const PROBE_STALL_FRACTION: f64 = 4.0;

/// Consecutive cycles under a quarter of its cap before a cap is lifted.
pub const QUIET_CYCLES: u32 = 2;
/// Consecutive violating cycles, with nobody else loading the device, before a latency
/// service's own concurrency is cut. Seen on the test disk: a QD1 reader alone hit 250 ms
/// p99.9 for two cycles of a slow spell (nothing a cap on it could help), and a cut after one
/// cycle held it at 10 IOPS.
pub const SELF_BLAME_CYCLES: u32 = 3;

/// The lowest rate (bytes/s) seen to break an SLO, when, and for how many cycles it is
/// trusted.
#[derive(Debug, Clone, Copy)]
struct Knee {
    rate_bps: u64,
    at_cycle: u64,
    memory_cycles: u64,
    /// The p99.9 fraction measured at this rate: the worst of the cycle that broke, when a
    /// probe to it broke the SLO; the window's (or the scatter model's one-in-ten level)
    /// when a trim left it. Where the latency curve is near or above the target (see
    /// [`Search::probe_toward`]); None for a cut's knee, but a stale fall-back's (its cap
    /// measured in force).
    fraction: Option<f64>,
    /// Set by a cut from no cap: the service's full load broke the SLO at this rate. Not a
    /// slow spell of the disk under a cap that had held (see [`SHORT_STEP`]).
    full_load: bool,
    /// A full load's knee at the edge of the target (its violation marginal, or after a
    /// window within every target): the search stops [`EDGE_KNEE_PRECISION`] under it.
    at_edge: bool,
    /// Set by a settled cap cut for breaking the one-in-ten budget (more than one violation
    /// in its window; the cut to [`GENTLE_CUT_MIN`]-0.9 of it). No probe goes back toward it
    /// for two windows ([`NOISE_WINDOW`]), the change budget's horizon, where a probe could
    /// go after one: it broke over a window, not in one cycle, and a probe half-way back
    /// (0.84 of it after a cut to 70 %) lands where about as many cycles break, which a
    /// two-cycle probe window cannot see. Seen in the v2 guest (BENCHMARKS run CQ), the
    /// host's writeback stalling the disk more often the higher the rate: both probes back
    /// after such a cut (2037 -> 2435 and 1898 -> 2269 MB/s, ten cycles after it) broke 5
    /// and 4 cycles later, two changes and two violating cycles each, in a 49-cycle steady
    /// phase whose budget is four changes. Not where the cut runs far under every target
    /// (the slow spell that broke the budget is over), nor under the knee of a re-cut
    /// ("again under the cap its broken budget set") or a trim (measured): the search
    /// climbs back half-way there as before. The wait counts from `at_cycle`, which a lift
    /// moves on by the cycles lifted, as for every knee.
    window: bool,
}

impl Knee {
    /// A knee found at `rate_bps` in `cycle`, after `last`: trusted twice as long when it is
    /// the same one found again.
    fn found(last: Option<Knee>, rate_bps: u64, cycle: u64, fraction: Option<f64>) -> Knee {
        let memory_cycles = match last {
            Some(k) if k.same_rate(rate_bps) => {
                (k.memory_cycles.max(BAD_MEMORY_CYCLES) * 2).min(MAX_BAD_MEMORY_CYCLES)
            }
            _ => BAD_MEMORY_CYCLES,
        };
        Knee {
            rate_bps,
            at_cycle: cycle,
            memory_cycles,
            fraction,
            full_load: false,
            at_edge: false,
            window: false,
        }
    }

    /// Whether a knee at `rate_bps` is this one found again (within [`SAME_KNEE`]).
    fn same_rate(self, rate_bps: u64) -> bool {
        (rate_bps as f64 / self.rate_bps as f64 - 1.0).abs() <= SAME_KNEE
    }

    /// Its rate, while it is trusted.
    fn trusted(self, cycle: u64) -> Option<u64> {
        (cycle < self.at_cycle + self.memory_cycles).then_some(self.rate_bps)
    }
}

/// The knee search of one capped service on one device.
#[derive(Debug, Default, Clone)]
struct Search {
    /// The highest cap seen to hold every SLO for a probe window.
    good: Option<u64>,
    /// The last knee found, kept after it expires to tell a confirmed knee from a new one.
    knee: Option<Knee>,
    /// The knees found before it at other rates, newest last (at most [`OLDER_KNEES`]):
    /// a climb after the last one is doubted stops short of them (see [`Search::older_bad`]).
    older_knees: Vec<Knee>,
    /// While a raise is on probation: the good cap to fall back to.
    before_raise: Option<u64>,
    /// The cycle of the last fall-back from a raise that broke an SLO: its transition
    /// cycle still carries the broken cap's latency.
    fell_back_at: Option<u64>,
    /// Consecutive cycles the service used under a quarter of its cap.
    quiet: u32,
    /// When its cap was lifted for quiet: the knee's clock stops while it rests (nothing
    /// confirms or contradicts a knee then).
    lifted_at: Option<u64>,
    /// (ln capped total, ln worst p99.9 fraction) of its last [`FIT_CYCLES`] full cycles
    /// under a cap: the local model of latency against the device's capped rate. The
    /// total, not this cap: next to other capped services the victim answers to their sum,
    /// and against this cap alone their share reads as a flat slope (run AY, paper 001's
    /// mix, repeat 3: db at 0.65 of its target with 160 MB/s capped in all, 0.85 with 206,
    /// while ingest's own cap moved 100 -> 128 MB/s and read as a plateau that let two
    /// violations in ten pass). With one capped service the two are the same.
    fit: VecDeque<(f64, f64)>,
    /// The cap a trim or a gentle cut set just under a settled one: near the knee, judged
    /// like a settled cap from its first cycle.
    held: Option<u64>,
    /// Cut on arrival, from a cycle it ran only part of: the rate that broke the SLO is not
    /// known, and the search doubles the cap until a probe finds it.
    knee_unknown: bool,
    /// The cap the last raise came from and its window's level then: the line a doubling
    /// search extends (see [`Search::double_toward`]).
    raised_from: Option<RaisedFrom>,
    /// The cycle of the last raise without a trusted knee from a cap that held far under
    /// every target, and how many such raises came in a row (see [`CLIMB_MAX_FACTOR`]). It
    /// counts only while that raise is the cap's last change: any other change (a cut, a
    /// trim, a fall-back, a lift, a return) starts the climb again.
    climb: Option<(u64, u32)>,
    /// What its full load did when it was last cut from uncapped (see
    /// [`PROBE_STALL_FRACTION`] and [`Adaptive::full_load_harm`]).
    uncapped_harm: Option<FullLoadHarm>,
    /// A probe that met a stall of the disk: run it again from the cap it fell back to.
    stalled_probe: Option<StalledProbe>,
    /// The cycle of a raise whose transition already took most of the raise (see
    /// [`PROBE_CYCLES`]).
    raise_in_force: Option<u64>,
    /// The cycle the last raise's probe window passed (see [`RAISE_TRIAL_CYCLES`]).
    raise_passed_at: Option<u64>,
    /// The last cut of a settled cap for a broken budget (see [`BudgetCut`]).
    budget_cut: Option<BudgetCut>,
    /// The last trim for the window's p99.9 (see [`WindowTrim`]).
    window_trim: Option<WindowTrim>,
    /// Cuts that moved nothing, holding this cap (see [`FutileCuts`]).
    futile_cuts: Option<FutileCuts>,
}

/// A trim for the window's p99.9: from which cap to which, and the window's fraction of
/// the target that made it. A window under a cap in `to..from` as close to the target
/// (above half the way down to [`TRIM_TO`], and within the target) measures the curve
/// flat from `to` to `from`: the trim bought nothing. From then on a window as close is no
/// reason to trim a cap from `to` up to [`SHORT_STEP`] over the highest cap measured flat:
/// another trim would cost as much rate for as little, and a raise (the knee's trust
/// running out gives back 10 %) that runs as close finds more of the same plateau, and
/// extends it. A window over the target still trims, a second violation in ten still
/// cuts, and that cut, or lifting the cap, forgets the measurement. Seen on the v2 guest
/// (BENCHMARKS run CZ, repeat 3): the reader's window at 90-93 % of its target under every
/// cap from 1258 down to 883 MB/s, and four trims in a row, 1258 -> 756 MB/s.
#[derive(Debug, Clone, Copy)]
struct WindowTrim {
    from: u64,
    to: u64,
    fraction: f64,
    /// The highest cap under which the curve was measured flat (None: not yet).
    flat_up_to: Option<u64>,
}

impl WindowTrim {
    fn new(from: u64, to: u64, fraction: f64) -> Self {
        WindowTrim {
            from,
            to,
            fraction,
            flat_up_to: None,
        }
    }

    /// Whether a window at `fraction` of the target is as close to it as the trim's.
    fn as_close(&self, fraction: f64) -> bool {
        fraction <= 1.0 && fraction > self.fraction - (self.fraction - TRIM_TO) / 2.0
    }

    /// How far above the flat range the measurement speaks for.
    fn reach(&self) -> Option<u64> {
        self.flat_up_to.map(|top| (top as f64 * SHORT_STEP) as u64)
    }

    /// Learns from a window under `cap`: in the trim's range and as close, the curve is
    /// flat there; above it, within reach and as close, flat up to `cap`.
    fn measure(&mut self, cap: u64, fraction: f64) {
        if !self.as_close(fraction) || cap < self.to {
            return;
        }
        if cap < self.from {
            self.flat_up_to = Some(self.flat_up_to.map_or(self.from, |t| t.max(self.from)));
        } else if self.reach().is_some_and(|r| cap <= r) {
            self.flat_up_to = self.flat_up_to.map(|t| t.max(cap));
        }
    }

    /// Whether trimming `cap` for a window at `fraction` would buy nothing.
    fn futile(&self, cap: u64, fraction: f64) -> bool {
        self.reach().is_some_and(|r| (self.to..=r).contains(&cap)) && self.as_close(fraction)
    }
}

/// A settled cap cut because its victim broke the one-in-[`NOISE_WINDOW`] budget (or a
/// fall-back's cap that broke the target in its first full cycle, see `throttle`): until
/// the violations that broke it leave the window, the budget stays spent, and one more
/// violation under the cut's cap cuts again, deeper.
#[derive(Debug, Clone, Copy)]
struct BudgetCut {
    to: u64,
    cycle: u64,
    factor: f64,
    /// Where this run of budget cuts started: the service's measured rate (B/s) in the cycle
    /// of the first, and the mean log fraction of the violations that broke the budget
    /// there (see [`FUTILE_CUT_SPAN`]). Rates, not caps: a cap not in force (a dry run, a
    /// service under it) cut nothing.
    chain_from: (f64, f64),
}

/// A settled cap whose budget cuts moved nothing (see [`FUTILE_CUT_SPAN`]): held at `cap`
/// while the victim's level stays under `level` + ln [`MARGINAL`]; a cap changed since (even
/// back to the same value, as a lift and a return to the cap that held), or a victim that
/// got worse, ends it.
#[derive(Debug, Clone, Copy)]
struct FutileCuts {
    cap: u64,
    /// The cycle the held cap was set in.
    set_at: Option<u64>,
    level: f64,
}

/// Where a doubling search's last raise came from.
#[derive(Debug, Clone, Copy)]
struct RaisedFrom {
    cap: u64,
    /// Mean log of the worst latency service's p99.9 fraction over the cap's window.
    level: f64,
    /// The raise stopped short of doubling (on the line, or a creep after such a raise):
    /// while the line then reads flat, the search keeps creeping.
    short_of_doubling: bool,
}

/// A doubling search's next step (see [`Search::double_toward`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DoublingStep {
    Double(u64),
    /// To where the line through the last two caps' levels reaches the target.
    Line(u64),
    /// By [`CREEP_FAR_FACTOR`]: the last raise followed the line and this cap's level
    /// contradicts it (flat or lower), which is noise, not a floor.
    Creep(u64),
}

impl DoublingStep {
    fn to(self) -> u64 {
        match self {
            Self::Double(to) | Self::Line(to) | Self::Creep(to) => to,
        }
    }
}

/// What a service's full load did to the victim it was cut for, as it was cut from uncapped.
#[derive(Debug, Clone, Copy)]
struct FullLoadHarm {
    victim: ServiceId,
    /// The victim's p99.9 as a fraction of its target.
    fraction: f64,
    /// The service's rate, bytes/s: infinite when it arrived in that cycle (it ran at its
    /// full rate for part of it, and its mean does not show that rate).
    rate_bps: f64,
    /// Its bytes per I/O.
    io_bytes: f64,
}

/// A raise whose probation met a stall of the disk (see [`PROBE_STALL_FRACTION`]).
#[derive(Debug, Clone, Copy)]
struct StalledProbe {
    /// The cap it fell back to, and the raised cap.
    from: u64,
    to: u64,
    /// Run again: a second failure is the knee.
    retried: bool,
}

impl Search {
    /// The hold of futile cuts, if `s`'s cap is the one they held, unchanged since (see
    /// [`FutileCuts`]).
    fn futile_at(&self, s: &ServiceLoad) -> Option<FutileCuts> {
        self.futile_cuts
            .filter(|f| s.limit.total_bps() == Some(f.cap) && s.changed_cycle == f.set_at)
    }

    /// The knee, while it is trusted.
    fn bad(&self, cycle: u64) -> Option<u64> {
        self.knee.and_then(|k| k.trusted(cycle))
    }

    /// The lowest knee found before the last one that is still trusted and above `cap`,
    /// and above every cap that held since (a cap that held over it says it was a slow
    /// spell).
    fn older_bad(&self, cycle: u64, cap: u64) -> Option<u64> {
        let held = self.good.unwrap_or(0).max(cap);
        self.older_knees
            .iter()
            .filter_map(|k| k.trusted(cycle))
            .filter(|&rate| rate > held)
            .min()
    }

    /// Whether the search doubles: no knee known since an arrival's cut.
    fn doubling(&self, cycle: u64) -> bool {
        self.knee_unknown && self.bad(cycle).is_none()
    }

    /// The slope of log p99.9 against log capped total over the recorded cycles, when the
    /// totals spread enough to tell.
    fn slope(&self) -> Option<f64> {
        let n = self.fit.len();
        if n < FIT_MIN_CYCLES {
            return None;
        }
        let nf = n as f64;
        let mx = self.fit.iter().map(|p| p.0).sum::<f64>() / nf;
        let my = self.fit.iter().map(|p| p.1).sum::<f64>() / nf;
        let sxx = self.fit.iter().map(|p| (p.0 - mx).powi(2)).sum::<f64>();
        let sxy = self
            .fit
            .iter()
            .map(|p| (p.0 - mx) * (p.1 - my))
            .sum::<f64>();
        ((sxx / nf).sqrt() >= FIT_MIN_SPREAD).then(|| sxy / sxx)
    }

    /// A knee found only once (its memory still the base one: a knee found again has
    /// more, a doubted one less) that a cap just under it runs far below: it expires now.
    fn doubt_knee(&mut self, cycle: u64) {
        if let Some(k) = self.knee.as_mut() {
            if k.memory_cycles == BAD_MEMORY_CYCLES {
                k.memory_cycles = cycle.saturating_sub(k.at_cycle).min(k.memory_cycles);
            }
        }
    }

    /// Where the latency curve through this cap's level (`level`: the mean log fraction of
    /// its window, and its cycles) and the knee's measured p99.9 crosses [`PROBE_AIM`] of the
    /// target, in log-log: None without both points or with a curve too flat to tell.
    fn probe_toward(&self, cap: u64, level: Option<(f64, usize)>) -> Option<f64> {
        let knee = self.knee?;
        let (mean, n) = level?;
        let f_bad = knee.fraction?;
        let span = (knee.rate_bps as f64 / cap as f64).ln();
        // One cycle is enough: the line only ever lowers the half-way probe or stops it,
        // so a cycle read low changes nothing and one read high waits for the next.
        if n == 0 || span <= 0.0 {
            return None;
        }
        let slope = (f_bad.ln() - mean) / span;
        (slope >= MIN_PROBE_SLOPE).then(|| cap as f64 * ((PROBE_AIM.ln() - mean) / slope).exp())
    }

    /// Where a search without a knee goes from `cap` (at its window's `level`): double it,
    /// or less where the line through the level of the cap it was raised from and this
    /// one's (log-log) reaches [`DOUBLING_AIM`] of the target first. None: the line puts
    /// the aim under [`MIN_PROBE_GAIN`], so no raise. Seen on the test disk: a writer at
    /// 0.01 of its target under 147 MB/s and 0.25 under 295 doubled to 589 and put the
    /// reader at 8-12 times its target (the line reaches the target at ~400 MB/s; a later
    /// probe to 380 held, 435 broke). After a raise the line limited, a flat or falling line
    /// is noise (seen: 0.48 of the target at 198 MB/s, the line's raise to 237 then read
    /// 0.13 over two cycles, and the doubling to 475 put the reader at 4x its target):
    /// it creeps, and keeps creeping while the line reads flat.
    fn double_toward(&self, cap: u64, level: Option<(f64, usize)>) -> Option<DoublingStep> {
        let doubled = cap.saturating_mul(2);
        let below = self.raised_from.filter(|r| r.cap < cap);
        // Only a full window's level says where this cap is, or one cycle far under.
        let measured =
            level.filter(|&(m, n)| n >= PROBE_CYCLES as usize || (n > 0 && m < FAST_PASS.ln()));
        let line = below.zip(measured).and_then(|(r, (m1, _))| {
            let span = (cap as f64 / r.cap as f64).ln();
            let slope = (m1 - r.level) / span;
            (slope >= MIN_PROBE_SLOPE)
                .then(|| cap as f64 * ((DOUBLING_AIM.ln() - m1) / slope).exp())
        });
        match line {
            Some(to) if to < cap as f64 * MIN_PROBE_GAIN => None,
            Some(to) if (to as u64) < doubled => Some(DoublingStep::Line(to as u64)),
            Some(_) => Some(DoublingStep::Double(doubled)),
            // No further than the line's last step: lines whose steps shrink toward the
            // target said it is near (seen in CI's random-read scan: line steps 179 -> 205
            // -> 219 MB/s, a flat reading at 219, and a creep of 25 % to 274 broke at 9x
            // the target).
            None => match below.filter(|r| r.short_of_doubling && measured.is_some()) {
                Some(r) => {
                    let last_step = cap as f64 / r.cap as f64;
                    let factor = last_step.clamp(MIN_PROBE_GAIN, CREEP_FAR_FACTOR);
                    Some(DoublingStep::Creep((cap as f64 * factor) as u64))
                }
                // Without a line, a cap whose window already runs over [`PROBE_AIM`] has
                // no room for a doubling on any curve but a flat one: the search stops
                // there. Seen in CI (the noisy-neighbor test): a cut to 410 MB/s read 0.78
                // and 0.89 of the target, the doubling to 821 broke at 1.46.
                None if measured.is_some_and(|(m, _)| m > PROBE_AIM.ln()) => None,
                None => Some(DoublingStep::Double(doubled)),
            },
        }
    }

    /// Notes a raise of `s` (now at `cap`) whose transition, this `cycle`, took most of the
    /// raise: its probe window starts there (see [`PROBE_CYCLES`]).
    fn note_transition(&mut self, s: &ServiceLoad, cap: u64, cycle: u64) {
        let (Some(changed), Some(prev)) = (s.changed_cycle, self.before_raise) else {
            return;
        };
        // 80 % of the step, not of the cap: a raise of 25 % or less is under the old cap's
        // rate at 80 % of the new one.
        if changed + 1 == cycle && cap > prev && took_most_of(prev as f64, cap as f64, s.bps()) {
            self.raise_in_force = Some(changed);
        }
    }

    /// The first cycle of `s`'s probe window: the first full cycle under its last change,
    /// or that change's transition for a raise in force there (see [`PROBE_CYCLES`]).
    fn probe_window_start(&self, s: &ServiceLoad) -> u64 {
        match s.changed_cycle {
            Some(c) if self.raise_in_force == Some(c) => c + 1,
            _ => window_start(s),
        }
    }

    /// Puts the raise from `cap` on probation.
    fn start_probe(&mut self, cap: u64) {
        self.good = Some(self.good.map_or(cap, |g| g.max(cap)));
        self.before_raise = Some(cap);
    }

    fn remember_bad(&mut self, rate_bps: u64, cycle: u64, fraction: Option<f64>) {
        self.knee_unknown = false;
        // A knee found at another rate than the last keeps the last in memory if it broke a
        // window's budget (see [`OLDER_KNEES`]); the same one found again replaces it.
        if let Some(last) = self
            .knee
            .filter(|k| k.window && k.trusted(cycle).is_some() && !k.same_rate(rate_bps))
        {
            self.older_knees.push(last);
        }
        self.older_knees.retain(|k| k.trusted(cycle).is_some());
        let excess = self.older_knees.len().saturating_sub(OLDER_KNEES);
        self.older_knees.drain(..excess);
        self.knee = Some(Knee::found(self.knee, rate_bps, cycle, fraction));
        // A good cap at or above a breaking rate is stale: the disk got slower.
        self.good = self.good.filter(|&g| g < rate_bps);
    }
}

/// What the policy remembers of one device's recent cycles.
#[derive(Debug, Default, Clone)]
struct DeviceHistory {
    /// Cycles with a violation, the last [`NOISE_WINDOW`] cycles' worth.
    violations: VecDeque<u64>,
    /// The last cycle with a near miss (or a violation, or a stall).
    last_near: Option<u64>,
    /// [`Self::last_near`] before the cycle last recorded: judged against the near-miss
    /// bar of its own cycle, not one a jump in the newest cycle has since lowered.
    near_before: Option<u64>,
    /// The last cycle with a near miss or a violation that was no stall.
    last_harm: Option<u64>,
    /// Cycles in a row with a victim violating and nobody else to cut (whichever victim:
    /// with many latency services the worst one changes from cycle to cycle), for the
    /// `slo_infeasible` notice.
    alone: u32,
    /// The same for one victim, and for how many cycles in a row: only its own streak
    /// cuts its own concurrency.
    alone_victim: Option<(ServiceId, u32)>,
    /// Victims told `slo_infeasible` in their current violation.
    told_infeasible: Vec<ServiceId>,
    /// The worst latency service's p99.9 as a fraction of its target, per cycle, the last
    /// [`NOISE_WINDOW`] cycles (stalls left out).
    fractions: VecDeque<(u64, f64)>,
    /// Sigma of the log of the per-cycle p99.9 under one cap, smoothed (None: not yet
    /// measured; [`DEFAULT_NOISE_SIGMA`]).
    noise_sigma: Option<f64>,
    /// The bursts of a bimodal latency service (see [`BurstMode`]), as last measured under
    /// one cap; kept through a raise from that cap on probation, until a full window under
    /// one cap shows none (see [`Self::drop_stale_bursts`] for what else ends them).
    bursts: Option<BurstMode>,
    /// The last cycle with nothing capped or a cap that did not bind: the aggressor's rate
    /// was not fixed, so the victim's p99.9 then moved with the load, not with the noise
    /// (an aggressor going quiet under its cap took one from 0.9 to 0.02 of its target).
    unsteady_at: u64,
    /// The last cycle of the current episode's start (an aggressor's first cut, and the
    /// cycle it takes effect): violations up to it are the aggressor arriving, violations
    /// after it spend the one-in-ten budget.
    episode_until: u64,
    /// The cycle the current episode's first cap was decided in (on an uncapped aggressor:
    /// its arrival's cut, or the cap that held last time, set again on its return).
    first_cap_at: Option<u64>,
    /// With two or more services capped: the sum of their caps when a probe of one broke an
    /// SLO. Each one's own knee was found at the others' rates then, and the victim suffers
    /// from their bytes together: in paper 001's mix, with ingest's probe to 141 MB/s (next
    /// to backup at 108) failed, backup's probe 108 -> 216 MB/s went ahead "far from its
    /// knee" (1081 MB/s, its rate on arrival) and broke the SLO too. A probe of any of them
    /// goes at most half-way (in log space) from their total to this one.
    total_knee: Option<Knee>,
    /// Cycles in which a cap on the device changed, the last 2 x [`NOISE_WINDOW`].
    changes: VecDeque<u64>,
    /// The cycles of failed raises, from the raise's first cycle in force to its
    /// fall-back's transition (the raised rate's queue still passing), while any of them is
    /// in the last [`NOISE_WINDOW`]: they are the probe's, and no other service's settled
    /// cap answers for them.
    failed_probes: VecDeque<std::ops::RangeInclusive<u64>>,
}

/// A violation judged a stall of the disk.
#[derive(Debug, Clone, Copy)]
struct Stall {
    /// The level of the cycles before (a fraction of the target).
    level: f64,
    /// Judged [`STALL_FACTOR`] times what the capped service's full load did, this
    /// fraction of the target: it spends no budget and fails no probe.
    beyond_full_load: Option<f64>,
}

/// One cycle of a device as the policy saw it.
#[derive(Debug, Clone)]
struct DeviceLoad {
    cycle: u64,
    /// Each service's (id, bytes/s, IOPS), by id.
    rates: Vec<(ServiceId, f64, f64)>,
    /// Something was capped and every capped service ran at [`BINDING`] of its cap or more.
    binding: bool,
    /// The sum of the bandwidth caps, when every capped service ran at its cap (0.8 to
    /// 1.05 of it) in a full cycle under it: the capped rates were fixed.
    fixed_caps: Option<u64>,
    /// The worst latency fraction, each at its SLO's quantile (0 without a judged latency
    /// service); None for a stall.
    worst: Option<f64>,
}

impl DeviceLoad {
    fn of(d: &DeviceCycle, worst: f64) -> DeviceLoad {
        let mut rates: Vec<_> = d
            .services
            .iter()
            .map(|s| (s.id, s.bps(), s.read_iops + s.write_iops))
            .collect();
        rates.sort_by_key(|r| r.0);
        let capped: Vec<(&ServiceLoad, f64)> = d
            .services
            .iter()
            .filter_map(|s| Some((s, s.bps() / s.limit.total_bps()? as f64)))
            .collect();
        let binding = !capped.is_empty() && capped.iter().all(|&(_, r)| r >= BINDING);
        let fixed = binding
            && capped
                .iter()
                .all(|&(s, r)| r <= FIXED_RATE_OVER_CAP && d.cycle >= window_start(s));
        DeviceLoad {
            cycle: d.cycle,
            rates,
            binding,
            fixed_caps: fixed.then(|| capped_total(d).0),
            worst: Some(worst),
        }
    }

    /// A service's (bytes/s, IOPS) in this cycle.
    fn rate(&self, id: ServiceId) -> Option<(f64, f64)> {
        let i = self.rates.binary_search_by_key(&id, |r| r.0).ok()?;
        Some((self.rates[i].1, self.rates[i].2))
    }

    /// Whether some service pushes more bytes or IOPS here than [`STALL_LOAD`] times the
    /// most it pushed in `level` (with a little slack for one that ran little or not at all).
    fn pushes_more_than(&self, level: &[&DeviceLoad]) -> bool {
        self.rates
            .iter()
            .any(|&rate| Self::one_pushes_more_than(rate, level))
    }

    fn one_pushes_more_than((id, bps, iops): (ServiceId, f64, f64), level: &[&DeviceLoad]) -> bool {
        let (max_bps, max_iops) = level
            .iter()
            .filter_map(|l| l.rate(id))
            .fold((0.0, 0.0), |(b, i), (lb, li)| {
                (f64::max(b, lb), f64::max(i, li))
            });
        bps > STALL_LOAD * max_bps + STALL_SLACK_BPS
            || iops > STALL_LOAD * max_iops + STALL_SLACK_IOPS
    }

    /// [`Self::pushes_more_than`], where the `capped` service (under a cap no higher than
    /// the rate of the full load it was seen at) may push more bytes, but not in smaller
    /// I/Os: under 1/[`STALL_LOAD`] of its bytes per I/O then (`io_bytes`) is another kind
    /// of load.
    fn pushes_more_than_within_cap(
        &self,
        level: &[&DeviceLoad],
        capped: ServiceId,
        io_bytes: f64,
    ) -> bool {
        self.rates.iter().any(|&(id, bps, iops)| {
            if id != capped {
                return Self::one_pushes_more_than((id, bps, iops), level);
            }
            iops > STALL_SLACK_IOPS && bps / iops < io_bytes / STALL_LOAD
        })
    }
}

/// A device's recent cycles (a device without I/O has no cycle): every service's rates,
/// for an arrival and for the level a stall is judged against. Apart from
/// [`DeviceHistory`], which `relax` clones every cycle: these hold every service.
#[derive(Debug, Default)]
struct RecentLoads {
    /// The last [`NOISE_WINDOW`] cycles, and at least the two last recorded.
    cycles: VecDeque<DeviceLoad>,
}

impl RecentLoads {
    fn record(&mut self, load: DeviceLoad) {
        let now = load.cycle;
        self.cycles.push_back(load);
        while self.cycles.len() > 2
            && self
                .cycles
                .front()
                .is_some_and(|l| l.cycle + NOISE_WINDOW <= now)
        {
            self.cycles.pop_front();
        }
    }

    /// Whether uncapped `a` arrived in this (just recorded) cycle: it ran under half as fast
    /// (or not at all) in the device's cycle before, so it ran only part of this one, and
    /// its mean rate here understates what it does. Seen with PostgreSQL (BENCHMARKS run
    /// Q): a writer that sustains 3 GB/s broke the SLO in a cycle it averaged 124 MB/s in;
    /// taken as the knee, that held the search under 124 MB/s where a static 300 held. (A
    /// valid knee in the first full cycle after a partial one is lost the same way: the
    /// search finds it again.)
    fn arriving(&self, d: &DeviceCycle, a: &ServiceLoad) -> bool {
        let before = self.cycles.len().checked_sub(2).map(|i| &self.cycles[i]);
        a.limit.is_unlimited()
            && match before {
                // The policy's first cycle on this device: nothing to compare with.
                None => false,
                Some(l) if l.cycle + 1 == d.cycle => {
                    l.rate(a.id).is_none_or(|(bps, _)| bps < 0.5 * a.bps())
                }
                // The device had no I/O in between.
                Some(_) => true,
            }
    }

    /// Whether `a` ran at about its rate in `d` (at [`BINDING`] of it or more) through the
    /// [`NOISE_WINDOW`] - 1 cycles before `d` with every latency service within its target
    /// and no stall: its violation in `d` is one in ten, the budget's own edge.
    fn held_before(&self, d: &DeviceCycle, a: &ServiceLoad) -> bool {
        let before: Vec<&DeviceLoad> = self.cycles.iter().filter(|l| l.cycle < d.cycle).collect();
        before.len() as u64 >= NOISE_WINDOW - 1
            && before.iter().all(|l| {
                l.worst.is_some_and(|w| w > 0.0 && w <= 1.0)
                    && l.rate(a.id)
                        .is_some_and(|(bps, _)| bps >= BINDING * a.bps())
            })
    }

    /// A service's bytes/s in `cycle`, if it is still recorded.
    fn rate_at(&self, cycle: u64, id: ServiceId) -> Option<f64> {
        self.cycles
            .iter()
            .find(|l| l.cycle == cycle)?
            .rate(id)
            .map(|(bps, _)| bps)
    }

    /// Whether `now`'s capped rates were fixed (every capped service at its cap, in a full
    /// cycle under it) and nobody pushed more than [`STALL_LOAD`] times what it did in the
    /// cycles `from..now` (false when either is not recorded).
    fn same_fixed_load(&self, from: u64, now: u64) -> bool {
        let Some(current) = self.cycles.back().filter(|l| l.cycle == now) else {
            return false;
        };
        let before: Vec<&DeviceLoad> = self
            .cycles
            .iter()
            .filter(|l| l.cycle >= from && l.cycle < now)
            .collect();
        current.fixed_caps.is_some() && !before.is_empty() && !current.pushes_more_than(&before)
    }

    fn is_stall(&self, cycle: u64) -> bool {
        self.cycles
            .iter()
            .any(|l| l.cycle == cycle && l.worst.is_none())
    }

    /// The stall cycles from `from` on.
    fn stalls_since(&self, from: u64) -> impl Iterator<Item = u64> + '_ {
        self.cycles
            .iter()
            .filter(move |l| l.cycle >= from && l.worst.is_none())
            .map(|l| l.cycle)
    }

    /// Whether this cycle (`now`, not yet recorded) is a stall of the disk: a violation
    /// [`STALL_FACTOR`] over the level of the recent cycles whose caps were fixed at the
    /// same or a higher total, with no service pushing more than then, outside an episode's
    /// start (`h`), and no more than [`STALL_MAX_RUN`] such cycles in a row and
    /// [`STALL_MAX_WINDOW`] in ten.
    ///
    /// Or a violation [`STALL_FACTOR`] times what the capped services' full load did
    /// (`full_load`, see [`Adaptive::full_load_harm`]), with nobody pushing more than in
    /// the cycles before: no cap made it, so it is a stall from an episode's first cycles
    /// on, during a probe too, and however many come in ten (not more than
    /// [`STALL_MAX_RUN`] in a row: a disk that stays that slow has a new knee).
    fn stall(
        &self,
        h: &DeviceHistory,
        now: &DeviceLoad,
        full_load: Option<(ServiceId, FullLoadHarm)>,
    ) -> Option<Stall> {
        // Under a cap, harm puts the victim at 0.8-3 times its target; the disk's own stalls
        // at 4 and more (see [`PROBE_STALL_FRACTION`]). A jump from a low level to 2x is a
        // wall the cap reached (a writer's cache filling at a rate it held for a while):
        // excused, it cost two more violating cycles before the cut.
        let worst = now.worst.filter(|&w| w >= PROBE_STALL_FRACTION)?;
        let beyond = full_load.filter(|(_, h)| worst >= STALL_FACTOR * h.fraction);
        let beyond_full_load = beyond.map(|(_, h)| h.fraction);
        // An aggressor's arrival and its first cut are its own, and that cut's first cycle
        // too unless it is beyond what the full load did.
        if now.cycle <= h.episode_until
            || (now.cycle <= h.episode_until + 2 && beyond.is_none())
            || !self.stalls_excused(now.cycle, beyond.is_some())
        {
            return None;
        }
        // The last cycles, those whose caps were fixed at `min_caps` or more if given.
        let recent = |min_caps: Option<u64>| -> Vec<&DeviceLoad> {
            self.cycles
                .iter()
                .filter(|l| {
                    l.cycle + NOISE_WINDOW > now.cycle
                        && min_caps.is_none_or(|m| l.fixed_caps.is_some_and(|c| c >= m))
                        && l.worst.is_some_and(|w| w > 0.0)
                })
                .collect()
        };
        let mean = |level: &[&DeviceLoad]| {
            level
                .iter()
                .map(|l| l.worst.unwrap_or(1.0).ln())
                .sum::<f64>()
                / level.len() as f64
        };
        if let Some((capped, harm)) = beyond {
            // Against the cycles before, whatever their caps: every cap is under the rate
            // that did the full load's harm (an episode's first full cycle has only its
            // transition before it, and a raise's transition runs two caps).
            let before = recent(None);
            return (!before.is_empty()
                && !now.pushes_more_than_within_cap(&before, capped, harm.io_bytes))
            .then(|| Stall {
                level: mean(&before).exp(),
                beyond_full_load,
            });
        }
        let level = recent(Some(now.fixed_caps?));
        if level.len() < STALL_MIN_CYCLES {
            return None;
        }
        let mean = mean(&level);
        let jump = worst.ln() - mean;
        let bar = STALL_SIGMAS * h.sigma();
        (jump >= STALL_FACTOR.ln().max(bar) && !now.pushes_more_than(&level)).then(|| Stall {
            level: mean.exp(),
            beyond_full_load,
        })
    }

    /// Whether the stalls in the window are still excused from the verdict on a cap in
    /// `cycle`: fewer than [`STALL_MAX_RUN`] in a row just before it and
    /// [`STALL_MAX_WINDOW`] in the window ([`STALL_MAX_WINDOW_BEYOND_FULL_LOAD`] for one
    /// `beyond_full_load`). Past that, they are harm like any violation.
    fn stalls_excused(&self, cycle: u64, beyond_full_load: bool) -> bool {
        let run = (1..)
            .take_while(|&k| self.is_stall(cycle.wrapping_sub(k)))
            .count();
        let in_window = self
            .stalls_since((cycle + 1).saturating_sub(NOISE_WINDOW))
            .count();
        let max_window = if beyond_full_load {
            STALL_MAX_WINDOW_BEYOND_FULL_LOAD
        } else {
            STALL_MAX_WINDOW
        };
        run < STALL_MAX_RUN && in_window < max_window
    }
}

impl DeviceHistory {
    /// Notes that `victim` is told `slo_infeasible` in its current violation spell: true the
    /// first time (say it then), false after.
    fn first_told(&mut self, victim: ServiceId) -> bool {
        let first = !self.told_infeasible.contains(&victim);
        if first {
            self.told_infeasible.push(victim);
        }
        first
    }

    /// Records a cycle whose worst p99.9 fraction is `worst` (None: a stall, a near miss
    /// kept out of the level and the scatter). A violation `spends` the budget unless it is
    /// a stall a probe met: the probe is undone, and its run again tells.
    fn record(&mut self, d: &DeviceCycle, worst: Option<f64>, spends: bool) {
        let stall = worst.is_none();
        let worst = worst.unwrap_or(0.0);
        self.near_before = self.last_near;
        if spends && d.services.iter().any(|s| s.violating()) {
            self.violations.push_back(d.cycle);
        }
        keep_last(&mut self.violations, NOISE_WINDOW, d.cycle);
        if stall || worst > self.near_miss() || self.violations.back() == Some(&d.cycle) {
            self.last_near = Some(d.cycle);
        }
        if !stall && (worst > self.near_miss() || d.services.iter().any(|s| s.violating())) {
            self.last_harm = Some(d.cycle);
        }
        if worst > 0.0 {
            self.fractions.push_back((d.cycle, worst));
        }
        while self
            .fractions
            .front()
            .is_some_and(|&(c, _)| c + NOISE_WINDOW <= d.cycle)
        {
            self.fractions.pop_front();
        }
    }

    /// Someone else could be cut: the victims' streaks of being alone end.
    fn not_alone(&mut self) {
        self.alone = 0;
        self.alone_victim = None;
    }

    fn sigma(&self) -> f64 {
        self.noise_sigma.unwrap_or(DEFAULT_NOISE_SIGMA)
    }

    /// Notes the cycles of the services' last decisions (`changed_cycle`, taken or not)
    /// within the last two windows. Any such cycle not yet known, not just last cycle's: a
    /// device has no cycle without I/O, and a service is not in one it did no I/O in.
    fn note_changes(&mut self, d: &DeviceCycle) {
        for c in d.services.iter().filter_map(|s| s.changed_cycle) {
            if c + 2 * NOISE_WINDOW > d.cycle && !self.changes.contains(&c) {
                let at = self.changes.partition_point(|&x| x < c);
                self.changes.insert(at, c);
            }
        }
        keep_last(&mut self.changes, 2 * NOISE_WINDOW, d.cycle);
    }

    /// Whether the current episode's search (its first [`SEARCH_CYCLES`]) is over by `cycle`.
    fn past_search(&self, cycle: u64) -> bool {
        cycle > self.episode_until + SEARCH_CYCLES
    }

    /// Whether an unforced raise fits the budget of one change in [`NOISE_WINDOW`] cycles
    /// with room for its fall-back: no change in the last [`NOISE_WINDOW`] cycles and at most
    /// one in the last two. A raise that breaks costs two changes (it and its fall-back), so
    /// a raise ten cycles after the last change, as before, made a probe that broke every
    /// time two changes in eleven cycles; this waits twenty after such a pair, ten after a
    /// raise that held. A cycle with two or more changes counts once. Called after
    /// [`Self::note_changes`] this cycle, which keeps only the last two windows.
    fn change_budget_allows(&self, now: u64) -> bool {
        let mut recent = self.changes.iter();
        match (recent.next(), recent.next()) {
            (None, _) => true,
            (Some(&c), None) => c + NOISE_WINDOW <= now,
            _ => false,
        }
    }

    /// The near-miss bar (see [`NEAR_MISS_FLOOR`]): a p99.9 over this fraction of its
    /// target is where, with the scatter measured, one cycle in ten would break it.
    fn near_miss(&self) -> f64 {
        let (z, sigma) = self
            .bursts
            .map_or((Z_TENTH, self.sigma()), |b| (b.z, b.sigma));
        (-z * sigma).exp().max(NEAR_MISS_FLOOR)
    }

    /// Forgets the bursts once the device's window under its caps (`window_from`, the
    /// first full cycle after its last change) starts after theirs, unless a raise from
    /// their window is on probation (`probing`): a cut, a trim, a fall-back or another
    /// service's change is another regime, and the bursts' bar is the more lenient one.
    fn drop_stale_bursts(&mut self, window_from: u64, probing: bool) {
        if !probing && self.bursts.is_some_and(|b| window_from > b.since) {
            self.bursts = None;
        }
    }

    /// Whether a raise whose window started at `from` has met the bursts of a bimodal
    /// service by `now`: as many cycles at their level (at least the held cap's lowest
    /// burst: a raise that lifts the quiet cycles over the gap has not shown its bursts) as
    /// a probe window has cycles, or a full window with fewer (the bursts have stopped). Its
    /// quiet cycles say nothing of what the raise does to the bursts, and a verdict on fewer
    /// bursts than a steady reader's cycles is a weaker one (the simulator's bimodal reader,
    /// bursts in a third of its cycles, passed on one burst: 6-9 violating cycles in 275
    /// became 12-16).
    fn bursts_met(&self, from: u64, now: u64) -> bool {
        let Some(b) = self.bursts else {
            return true;
        };
        now + 1 >= from + NOISE_WINDOW
            || self.logs_since(from).filter(|&x| x >= b.lowest).count() as u64 >= PROBE_CYCLES
    }

    /// The log fractions of the cycles from `from` on, a failed probe's left out (see
    /// [`Self::probe_owned`]).
    fn logs_since(&self, from: u64) -> impl Iterator<Item = f64> + '_ {
        self.fractions
            .iter()
            .filter(move |x| x.0 >= from && !self.probe_owned(x.0))
            .map(|x| x.1.ln())
    }

    /// With two or more services capped in `d`, their total broke an SLO: the device's
    /// knee (see `total_knee`).
    fn total_broke(&mut self, d: &DeviceCycle) {
        let (total, n) = capped_total(d);
        if n >= 2 {
            self.total_knee = Some(Knee::found(self.total_knee, total, d.cycle, None));
        }
    }

    /// Whether cycle `c` was a failed probe's (see `failed_probes`). No cap held through
    /// it answers for it.
    fn probe_owned(&self, c: u64) -> bool {
        self.failed_probes.iter().any(|p| p.contains(&c))
    }

    /// The mean log fraction of the cycles from `from` on, and how many there are.
    fn level_since(&self, from: u64) -> Option<(f64, usize)> {
        mean_log(self.logs_since(from))
    }

    /// Updates the scatter estimate from the cycles since the device's last change, or
    /// since its caps last stopped binding (`from`): every cap change or load change moves
    /// the level, so only cycles under one set of binding caps say how much one cap's p99.9
    /// scatters.
    fn measure_noise(&mut self, from: u64) {
        let logs: Vec<f64> = self.logs_since(from).collect();
        if logs.len() < NOISE_MIN_CYCLES {
            return;
        }
        let sd = std_dev(&logs).clamp(NOISE_SIGMA_RANGE.0, NOISE_SIGMA_RANGE.1);
        self.noise_sigma = Some(match self.noise_sigma {
            Some(s) => s + NOISE_SMOOTHING * (sd - s),
            None => sd,
        });
        // Bimodality shows in a few cycles under one cap, its absence only over a window:
        // a raise's first quiet cycles must not erase what its held cap showed.
        match BurstMode::of(&logs, from) {
            Some(b) => self.bursts = Some(b),
            None if logs.len() as u64 >= NOISE_WINDOW => self.bursts = None,
            None => {}
        }
    }

    /// Whether the cycles from `from` on (at least [`TRIM_MIN_CYCLES`]) put the cap over
    /// the one-in-ten budget, and if so by how much (in log fraction, aiming [`Z_TRIM`]
    /// sigmas under the target).
    fn over_budget(&self, from: u64) -> Option<f64> {
        let mut logs: Vec<f64> = self.logs_since(from).collect();
        let mut sigma = self.sigma();
        if let Some(body_sigma) = leave_out_lone_outlier(&mut logs) {
            sigma = sigma.min(body_sigma);
        }
        let (mean, n) = mean_log(logs.iter().copied())?;
        // Over the budget with some confidence: the mean of a few cycles is itself noisy.
        let doubt = Z_CONFIDENCE * sigma / (n as f64).sqrt();
        (n >= TRIM_MIN_CYCLES
            && mean - doubt + Z_TENTH * sigma > 0.0
            && !upper_half_within_budget(logs))
        .then_some(mean + Z_TRIM * sigma)
    }

    /// Whether a violation since the episode's start is still in the last [`NOISE_WINDOW`]
    /// cycles: the budget is spent, and a probe that fails would overspend it.
    fn budget_spent(&self) -> bool {
        self.violations.iter().any(|&c| c > self.episode_until)
    }

    /// Whether cycles `from..=now` had no violation and no near miss.
    fn clean_since(&self, from: u64) -> bool {
        self.last_near.is_none_or(|c| c < from)
    }

    /// Whether the cycles `from..now` (not `now`, the cycle last recorded) had no
    /// violation, no near miss and no stall (each sets `last_near`), and at least a probe
    /// window of them measured.
    fn clean_before(&self, from: u64, now: u64) -> bool {
        let measured = self
            .fractions
            .iter()
            .filter(|&&(c, _)| c >= from && c < now)
            .count();
        self.near_before.is_none_or(|c| c < from) && measured as u64 >= PROBE_CYCLES
    }

    /// Whether a cap whose first full cycle was `from` has held through a probe window:
    /// its last [`PROBE_CYCLES`] cycles up to `now` (all after `from`) clean. The window
    /// slides: a near miss long ago does not keep a cap from ever counting as holding.
    fn clean_window(&self, from: u64, now: u64) -> bool {
        now + 1 >= from + PROBE_CYCLES && self.clean_since(from.max(now + 1 - PROBE_CYCLES))
    }

    /// Whether every cycle `from..=now` (at least one, each measured) ran under
    /// [`FAST_PASS`] of every target: a doubling search's window that may pass at once.
    fn far_under_since(&self, from: u64, now: u64) -> bool {
        let (mut n, mut under) = (0, true);
        for x in self.logs_since(from) {
            n += 1;
            under &= x < FAST_PASS.ln();
        }
        now >= from && under && n as u64 == now + 1 - from && self.clean_since(from)
    }

    /// Whether a cap whose window starts at `from` has held by `now`: a clean probe window,
    /// or, where a window may pass in one cycle (`fast_pass`, see [`FAST_PASS`]), one cycle
    /// far under every target.
    fn window_passed(&self, from: u64, now: u64, fast_pass: bool) -> bool {
        self.clean_window(from, now) || (fast_pass && self.far_under_since(from, now))
    }

    /// Whether the near miss of a raise's probe window (its cycles from `from` on: one
    /// near miss at most, no violation) ran no closer to a target than the cap it was
    /// raised from did in its own window: the cycles under it from the first full one after
    /// the device's change before the raise up to the raise (`raised_at`), at least
    /// [`TRIM_MIN_CYCLES`] of them, none over the target. Such a near miss is that cap's
    /// scatter, not the raise's doing; a second one in the window is (the raise moved the
    /// level), and fails it. Seen on the test disk (BENCHMARKS run AT, paper 001's mix,
    /// repeat 1): db at 0.44-0.98 of its target under backup's 28 MB/s; the doubling to
    /// 55 MB/s ran 0.90 and 0.52, was turned back as a near miss, and backup stayed at half
    /// the best static cap for the rest of the run.
    fn held_cap_ran_as_close(&self, raised_at: u64, from: u64) -> bool {
        if self.violations.iter().any(|&c| c >= from) {
            return false;
        }
        let base_from = self
            .changes
            .iter()
            .filter(|&&c| c < raised_at)
            .max()
            .map_or(0, |&c| c + 2);
        let bar = self.near_miss();
        // (worst fraction, cycles, near misses) of the recorded cycles in `cycles`.
        let of = |cycles: std::ops::RangeInclusive<u64>| {
            let xs = self.fractions.iter().filter(|x| cycles.contains(&x.0));
            xs.fold((0.0f64, 0, 0), |(w, n, near), x| {
                (w.max(x.1), n + 1, near + usize::from(x.1 > bar))
            })
        };
        let (held, n, _) = of(base_from..=raised_at);
        let (probe, _, near) = of(from..=u64::MAX);
        n >= TRIM_MIN_CYCLES && held <= 1.0 && probe <= held && near <= 1
    }

    /// Whether a near miss or a violation that was no stall came in cycles `from..=now`:
    /// for a raise on probation since `from`, a stall delays the verdict, it neither fails
    /// the raise nor hides a near miss before it.
    fn harm_since(&self, from: u64) -> bool {
        self.last_harm.is_some_and(|c| c >= from)
    }
}

/// Drops the cycles of `q` (ascending) before the last `window` cycles up to `now`.
fn keep_last(q: &mut VecDeque<u64>, window: u64, now: u64) {
    while q.front().is_some_and(|&c| c + window <= now) {
        q.pop_front();
    }
}

/// The rate of every service on `d` but `id`. A fold from +0.0: an empty `f64` sum is -0.0,
/// which an event would print as `-0.0`.
/// The `slo_infeasible` notice for `victim` in `d`: what the policy does and why.
fn slo_infeasible(
    d: &DeviceCycle,
    victim: &ServiceLoad,
    action: String,
    reason: String,
) -> Finding {
    Finding::SloInfeasible {
        service: victim.id,
        dev: d.dev,
        cycle: d.cycle,
        latency: LatencyNumbers::of(victim),
        others_bps: others_bps(d, victim.id),
        action,
        reason,
    }
}

fn others_bps(d: &DeviceCycle, id: ServiceId) -> f64 {
    d.services
        .iter()
        .filter(|s| s.id != id)
        .fold(0.0, |sum, s| sum + s.bps())
}

/// Whether a window's upper half alone shows, with confidence, at most one cycle in ten
/// over the target: its 90th percentile estimated as a log-normal's from the median and
/// the spread of the cycles above it ([`upper_half`]), plus one standard error. Cycles
/// under the median do not enter, so quiet cycles never make a window look worse. The
/// budget's model takes one sigma of the whole window, which a bimodal reader's quiet
/// cycles widen. A window of two modes (see [`BurstMode`]) is judged by its bursts: their
/// median plus z of their sigmas, z for their share of the cycles (the upper half of a
/// window with bursts in six cycles of ten put a burst level of 0.89 over the budget in the
/// simulator and trimmed a cap under which none had broken the target). Seen on the test
/// disk (BENCHMARKS run AF, writer repeat 3): under 375 MB/s
/// the reader ran 3.2-4.4 ms in eight cycles of eleven and 0.5-1.0 ms in the other three,
/// target 5 ms, none over; a sigma of 0.86 read more than one in ten over and trimmed to
/// 281 MB/s, where the bursts ran as high (3.3-4.3 ms). Only a veto on a trim: the
/// near-miss bar keeps the whole window's sigma, or the bursts' where it is bimodal (taken
/// from the upper half, the simulator's bimodal reader, bursts in a third of its cycles,
/// passed probes on the cycles between and broke at the next burst: 8 changes in 275
/// cycles became 35).
fn upper_half_within_budget(logs: Vec<f64>) -> bool {
    let n = logs.len();
    if n < TRIM_MIN_CYCLES {
        return false;
    }
    if let Some(b) = BurstMode::of(&logs, 0) {
        return b.level + b.z * b.sigma + Z_CONFIDENCE * b.sigma / (b.count as f64).sqrt() < 0.0;
    }
    let (median, sigma) = upper_half(logs);
    let sigma = sigma.max(DEFAULT_NOISE_SIGMA);
    median + Z_TENTH * sigma + Z_CONFIDENCE * sigma / ((n - n / 2) as f64).sqrt() < 0.0
}

/// The median of `logs` (at least two) and the sigma of a normal fitted to the cycles
/// above it: the root mean square of their distances from the median (a normal's half
/// above its median lies one sigma from it in that sense).
fn upper_half(mut logs: Vec<f64>) -> (f64, f64) {
    logs.sort_by(f64::total_cmp);
    let mid = logs.len() / 2;
    let median = logs[mid];
    let above = &logs[mid + 1..];
    let ms = above.iter().map(|x| (x - median).powi(2)).sum::<f64>() / above.len().max(1) as f64;
    (median, ms.sqrt())
}

/// Takes out of a window's log fractions its one cycle over the target when it stands
/// [`STALL_SIGMAS`] of the other cycles' scatter above their mean, and returns that
/// scatter: such a cycle is no draw from the cap's distribution (a stall of the layer
/// under the device), and the scatter model judges the body; the one-in-ten count still
/// counts it (a second violation in ten cuts, see `throttle`). With it in, one stall made
/// a cap's sigma read 0.15-0.28 where its cycles scattered by 0.05, and the model trimmed
/// the cap by 8-25 % for a window with one violation in it (the simulator's host writeback
/// stalls, `under_a_hosts_writeback_stalls_the_budgets_hold`). None: no such cycle, or
/// fewer than [`NOISE_MIN_CYCLES`] others.
fn leave_out_lone_outlier(logs: &mut Vec<f64>) -> Option<f64> {
    let mut over = logs.iter().enumerate().filter(|(_, &x)| x > 0.0);
    let (i, &x) = over.next()?;
    if over.next().is_some() || logs.len() <= NOISE_MIN_CYCLES {
        return None;
    }
    let body: Vec<f64> = logs
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(_, &y)| y)
        .collect();
    let (mean, _) = mean_log(body.iter().copied())?;
    let sd = std_dev(&body).max(NOISE_SIGMA_RANGE.0);
    (x - mean >= STALL_SIGMAS * sd).then(|| {
        logs.remove(i);
        sd
    })
}

/// The sample standard deviation of `logs` (at least two).
fn std_dev(logs: &[f64]) -> f64 {
    let n = logs.len() as f64;
    let mean = logs.iter().sum::<f64>() / n;
    (logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
}

/// The bursts of a latency service whose per-cycle p99.9 under one cap is bimodal: on the
/// test disk a reader next to a writer capped under its knee runs 0.06-0.24 of its target
/// in the writer's gaps and 0.62-0.96 in its bursts (BENCHMARKS run AH, writer repeat 2,
/// 324 MB/s). One sigma over both modes (0.9 there) puts the near-miss bar at its floor, 70 %,
/// where a probe to 386 MB/s whose two cycles ran at 0.66 and 0.78, as the bursts under the
/// held cap did, went back; static 400 MB/s held that reader. The bursts' own scatter is
/// the one a probe's bursts are judged against, and a probe must meet a burst before it
/// passes (see [`DeviceHistory::bursts_met`]): the simulator's bimodal reader passed probes
/// on its quiet cycles and broke at the next burst.
#[derive(Debug, Clone, Copy)]
struct BurstMode {
    /// Sigma of the log of the bursts' p99.9 (clamped like the whole window's).
    sigma: f64,
    /// How many of the bursts' sigmas under the target their level must stay for one
    /// cycle in ten to break it: the budget counts every cycle, so bursts in half of them
    /// may each break it one time in five (at most [`MAX_BURST_BREAKS`]).
    z: f64,
    /// The log fraction of the lowest burst.
    lowest: f64,
    /// The median log fraction of the bursts (the upper one of an even count), and how
    /// many there were.
    level: f64,
    count: usize,
    /// The first cycle of the window the bursts were measured in: a cap change after it
    /// other than a raise on probation ends them (see [`DeviceHistory::drop_stale_bursts`]).
    since: u64,
}

/// Two modes at least this far apart (the ratio of the lowest burst to the highest quiet
/// cycle) make a service bimodal: 2.6 on the test disk (above), 3.75 and more in the
/// simulator; a log-normal of the widest sigma measured under one cap (0.35, a random-read
/// scan) rarely leaves a gap of two sigmas between two neighbours of ten inside its range
/// (where it does, see [`MAX_BURST_BREAKS`]).
const BIMODAL_GAP: f64 = 2.0;
/// Bursts, however few, may each break the target at most this often: their share is
/// measured over a few cycles, a probe's higher rate may leave fewer gaps, and a
/// heavy-tailed scan can pass for bimodal (a random-read scan's window in BENCHMARKS run
/// AF, random reader repeat 1: 0.24-0.39 of the target in eight cycles, 0.78 and 0.93 in
/// two, a gap of 2.0).
const MAX_BURST_BREAKS: f64 = 0.25;
/// Each mode needs this many cycles: one slow or one quiet cycle is an outlier, not a mode.
const BIMODAL_MIN_CYCLES: usize = 2;
/// And the modes must take turns at least this often (in time order): a level that moved
/// once (a slow spell of the disk ending under an unchanged cap) is two levels, and one
/// that moved and came back (a spell inside the window) one spell, not bursts.
const BIMODAL_MIN_TURNS: usize = 3;

impl BurstMode {
    /// The bursts of `logs` (log fractions of cycles under one cap in time order, at least
    /// [`TRIM_MIN_CYCLES`], the first in cycle `since`), if their widest gap splits them
    /// into two modes that alternate, the upper one at least [`KNEE_DOUBT`] of the target
    /// (bursts far under it need no bar of their own).
    fn of(logs: &[f64], since: u64) -> Option<BurstMode> {
        if logs.len() < TRIM_MIN_CYCLES {
            return None;
        }
        let mut sorted = logs.to_vec();
        sorted.sort_by(f64::total_cmp);
        let (split, gap) = (BIMODAL_MIN_CYCLES..=sorted.len() - BIMODAL_MIN_CYCLES)
            .map(|i| (i, sorted[i] - sorted[i - 1]))
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        let quiet_under = (sorted[split] + sorted[split - 1]) / 2.0;
        let bursts = &sorted[split..];
        let level = bursts[bursts.len() / 2];
        let turns = logs
            .windows(2)
            .filter(|w| (w[0] >= quiet_under) != (w[1] >= quiet_under))
            .count();
        let share = bursts.len() as f64 / sorted.len() as f64;
        let bimodal =
            gap >= BIMODAL_GAP.ln() && turns >= BIMODAL_MIN_TURNS && level >= KNEE_DOUBT.ln();
        bimodal.then(|| BurstMode {
            sigma: std_dev(bursts).clamp(DEFAULT_NOISE_SIGMA, NOISE_SIGMA_RANGE.1),
            z: normal_upper_quantile((0.1 / share).min(MAX_BURST_BREAKS)),
            lowest: bursts[0],
            level,
            count: bursts.len(),
            since,
        })
    }
}

/// The z with P(Z > z) = `p` for a standard normal Z, `p` in (0, 0.5] (Abramowitz and
/// Stegun 26.2.23, within 4.5e-4: no crate of the workspace has a normal quantile, and a
/// bar needs two digits).
fn normal_upper_quantile(p: f64) -> f64 {
    let t = (-2.0 * p.ln()).sqrt();
    t - (2.515517 + 0.802853 * t + 0.010328 * t * t)
        / (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t)
}

/// The mean of `logs` and how many there are (None: none).
fn mean_log(logs: impl Iterator<Item = f64>) -> Option<(f64, usize)> {
    let (sum, n) = logs.fold((0.0, 0), |(sum, n), x| (sum + x, n + 1));
    (n > 0).then(|| (sum / n as f64, n))
}

/// Whether a level (a mean log fraction and its cycles, as [`mean_log`]) runs far under every
/// target ([`KNEE_DOUBT`]) over at least a probe window.
fn far_under(level: Option<(f64, usize)>) -> bool {
    level.is_some_and(|(mean, n)| n as u64 >= PROBE_CYCLES && mean < KNEE_DOUBT.ln())
}

/// The device's only service with a limit, when no other service's limit changed last
/// cycle: this cycle's latency then shows that cap's harm alone. With two aggressors
/// doubling, a one-cycle pass in one's transition let the other raise there, and a
/// violation in the next cycle would have failed the wrong probe (see [`FAST_PASS`]).
fn lone_capped(d: &DeviceCycle) -> Option<ServiceId> {
    let mut capped = d.services.iter().filter(|s| !s.limit.is_unlimited());
    let lone = capped.next().filter(|_| capped.next().is_none())?;
    d.services
        .iter()
        .all(|o| o.id == lone.id || o.can_change(d.cycle))
        .then_some(lone.id)
}

/// The sum of the bandwidth caps on the device, and how many services have one.
fn capped_total(d: &DeviceCycle) -> (u64, usize) {
    d.services
        .iter()
        .filter_map(|s| s.limit.total_bps())
        .fold((0, 0), |(sum, n), c| (sum.saturating_add(c), n + 1))
}

/// The latency service furthest over (or nearest to) its target, and its p99.9 as a
/// fraction of that target.
fn worst_latency_service(d: &DeviceCycle) -> Option<(&ServiceLoad, f64)> {
    d.services
        .iter()
        .filter_map(|s| Some((s, s.judged_latency()? as f64 / s.slo_ns()? as f64)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// What the device's latency services are judged at, for reasons: `p99.9`, or `p95` when
/// every latency SLO there is at the p95, or `SLO-quantile latency` when they differ.
fn judged_at(d: &DeviceCycle) -> &'static str {
    let mut quantiles = d
        .services
        .iter()
        .filter(|s| s.slo_ns().is_some())
        .map(|s| s.slo_quantile());
    match quantiles.next() {
        Some(q) if quantiles.all(|o| o == q) => q.label(),
        Some(_) => "SLO-quantile latency",
        None => "p99.9",
    }
}

/// One cycle of a latency service's I/Os on a device, as the trim's window keeps it.
#[derive(Debug, Clone)]
struct LatencyCycle {
    cycle: u64,
    hist: Vec<(u16, u64)>,
    samples: u64,
    slo_ns: u64,
    /// The quantile the target is at (0.999 for a p99.9 SLO).
    quantile: f64,
    /// The cycle's latency at that quantile over its target, where it had enough samples
    /// to judge.
    fraction: Option<f64>,
    /// I/Os slower than [`TRIM_AT`] of the target: which of two cycles at one p99.9 put
    /// more into the window's tail.
    slow_ios: u64,
}

impl LatencyCycle {
    fn of(cycle: u64, s: &ServiceLoad, slo_ns: u64) -> Self {
        let bar = (slo_ns as f64 * TRIM_AT) as u64;
        LatencyCycle {
            cycle,
            hist: s.latency_hist.clone(),
            samples: s.samples,
            slo_ns,
            quantile: s.slo_quantile().fraction(),
            fraction: s.judged_latency().map(|p| p as f64 / slo_ns as f64),
            slow_ios: s
                .latency_hist
                .iter()
                .filter(|&&(b, _)| isolator_common::histogram::bucket_lower_ns(b as usize) > bar)
                .map(|&(_, n)| n)
                .sum(),
        }
    }
}

/// The last [`NOISE_WINDOW`] cycles of a latency service on a device.
type LatencyWindow = VecDeque<LatencyCycle>;

#[derive(Debug, Default)]
pub struct Adaptive {
    searches: HashMap<(u32, ServiceId), Search>,
    latency: HashMap<(u32, ServiceId), LatencyWindow>,
    devices: HashMap<u32, DeviceHistory>,
    loads: HashMap<u32, RecentLoads>,
    /// Per device, the light aggressors cut as one.
    light: HashMap<u32, LightGroup>,
    findings: Vec<Finding>,
}

/// Whether a service running at `rate` (bytes/s) took [`BINDING`] of a change of its rate
/// from `from` to `to`, either way: the change was in force for most of the cycle.
fn took_most_of(from: f64, to: f64, rate: f64) -> bool {
    (rate - from) / (to - from) >= BINDING
}

/// Whether a service's last change is old enough to count as settled.
fn is_settled(s: &ServiceLoad, cycle: u64) -> bool {
    s.changed_cycle.is_none_or(|c| cycle >= c + SETTLED_CYCLES)
}

/// The first cycle of a probe window: the first full cycle under the service's last change.
fn window_start(s: &ServiceLoad) -> u64 {
    s.changed_cycle.map_or(0, |c| c + 2)
}

/// The first full cycle under the device's limits as they are: the latest of its services'
/// windows (see [`window_start`]).
fn regime_start(d: &DeviceCycle) -> u64 {
    d.services.iter().map(window_start).max().unwrap_or(0)
}

/// The lowest cap `adaptive` sets on `s`: its floor, and for a throughput service its rate
/// target too. That target is a promise like a latency target: a cap under it would make
/// the service a victim of the cut meant to protect another, so a throughput service is an
/// aggressor only down to its rate ("above target", in [`class_rank`]).
fn least_cap_bps(s: &ServiceLoad) -> u64 {
    match s.class {
        SloClass::Throughput { rate_bps } => s.floor_bps().max(rate_bps),
        _ => s.floor_bps(),
    }
}

/// The device's share a candidate for a cut must hold, of its time or of its bytes (one
/// service, or the light group together).
const CANDIDATE_BAR: f64 = 0.05;

fn clears_bar(time_share: f64, bps: f64, total_bps: f64) -> bool {
    time_share >= CANDIDATE_BAR || bps >= CANDIDATE_BAR * total_bps
}

/// The rank of a latency service within its SLO: the last resort among aggressors.
const LATENCY_RANK: u8 = 2;

fn class_rank(s: &ServiceLoad) -> Option<u8> {
    match s.class {
        SloClass::BestEffort => Some(0),
        SloClass::Throughput { rate_bps } if s.bps() > rate_bps as f64 * 1.05 => Some(1),
        SloClass::Throughput { .. } => None,
        SloClass::Latency(_) if !s.violating() => Some(LATENCY_RANK),
        SloClass::Latency(_) => None,
    }
}

impl Adaptive {
    /// The candidate with the largest device share to give up (over its floor, or a
    /// throughput service's over its rate target) among those that owe nothing (ranks 0
    /// and 1 as one tier), else a latency service within its SLO. Best-effort first regardless of
    /// size cut the wrong writer in paper 001's mix: `backup` at 58 MB/s was cut twice
    /// (to 29) while `ingest` ran at 200 MB/s, twice its target, and the reader stayed
    /// over its SLO for four cycles until ingest was trimmed.
    fn aggressor<'a>(d: &'a DeviceCycle, victim: &'a ServiceLoad) -> Option<&'a ServiceLoad> {
        let tier = |r: u8| r.max(1);
        // The share it can give up: a throughput service only its rate over its target, any
        // service only what is over its floor.
        let cuttable = |share: f64, s: &ServiceLoad| {
            let bps = s.bps().max(1.0);
            share * ((bps - least_cap_bps(s) as f64) / bps).clamp(0.0, 1.0)
        };
        Self::candidates(d, victim)
            .min_by(|&(ra, sa, a), &(rb, sb, b)| {
                tier(ra)
                    .cmp(&tier(rb))
                    .then(cuttable(sb, b).total_cmp(&cuttable(sa, a)))
            })
            .map(|(_, _, s)| s)
    }

    /// Who may be cut for `victim`, with their class rank (lowest first) and device share.
    fn candidates<'a>(
        d: &'a DeviceCycle,
        victim: &'a ServiceLoad,
    ) -> impl Iterator<Item = (u8, f64, &'a ServiceLoad)> + 'a {
        let total_bps: f64 = d.services.iter().map(ServiceLoad::bps).sum();
        let total_inflight = d.total_inflight();
        d.services
            .iter()
            .map(move |s| (share_of(s.mean_inflight, total_inflight), s))
            // A twentieth of the device's time (its mean in-flight share) or of its bytes:
            // a writer throttled to 31-62 MB/s keeps so few requests in flight next to a
            // QD4 reader that by time alone it did not count, and a reader within its own
            // SLO was cut in its place (on the real disk, to 5 % of its rate).
            .filter(move |&(share, s)| {
                s.id != victim.id && s.bps() > 0.0 && clears_bar(share, s.bps(), total_bps)
            })
            .filter(|(_, s)| {
                // Already pinned at its floor: nothing left to take.
                s.limit.total_bps().is_none_or(|c| c > least_cap_bps(s))
            })
            .filter_map(|(share, s)| class_rank(s).map(|r| (r, share, s)))
            // A latency service's wait in its own limit is in its p99.9 only where the
            // probe times it; elsewhere a cut could break its SLO where no one sees.
            .filter(|&(r, _, _)| r < LATENCY_RANK || d.throttle_wait_timed)
    }

    /// Records the latency services' histograms (none from a stall).
    fn record_latency(&mut self, d: &DeviceCycle, stall: bool) {
        for s in d.services.iter().filter(|_| !stall) {
            let Some(slo) = s.slo_ns() else { continue };
            let w = self.latency.entry((d.dev, s.id)).or_default();
            w.push_back(LatencyCycle::of(d.cycle, s, slo));
            while w.len() as u64 > NOISE_WINDOW {
                w.pop_front();
            }
        }
        // A latency service without I/O this cycle starts its window over.
        let present: HashSet<ServiceId> = d.services.iter().map(|s| s.id).collect();
        self.latency
            .retain(|&(dev, id), _| dev != d.dev || present.contains(&id));
    }

    /// The worst latency at its SLO's quantile, as a fraction of its target, of every
    /// latency service's I/Os in cycles `from..=now` (the last [`NOISE_WINDOW`] at most, a failed probe's left out),
    /// how many cycles it judged and how many the window holds. With `spare_worst`, a full
    /// window leaves out the device's worst cycle: the one violating cycle in ten the
    /// budget allows (the budget counts the device's cycles, so one cycle for every
    /// service). A burst of slow reads in one cycle (seen: 109 reads over 0.9 of the target
    /// in one cycle, none in the nine before, BENCHMARKS run AF, PostgreSQL repeat 2) fills
    /// a pooled window's tail alone and says little of the cap.
    fn window_fraction(
        &self,
        dev: u32,
        from: u64,
        spare_worst: bool,
    ) -> Option<(f64, usize, usize)> {
        let h = self.devices.get(&dev);
        // A failed probe's cycles are the probe's (see `DeviceHistory::probe_owned`).
        let counted = |c: u64| c >= from && !h.is_some_and(|h| h.probe_owned(c));
        let windows = || {
            self.latency
                .iter()
                .filter(move |(&(dv, _), _)| dv == dev)
                .map(|(_, w)| w)
        };
        let spared = spare_worst
            .then(|| {
                windows()
                    .flatten()
                    .filter(|x| counted(x.cycle))
                    .filter_map(|x| Some((x.fraction?, x.slow_ios, x.cycle)))
                    .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                    .map(|(_, _, cycle)| cycle)
            })
            .flatten();
        let mut worst: Option<(f64, usize, usize)> = None;
        for w in windows() {
            // Whether the window is full counts every cycle: leaving a probe's out does
            // not take the worst cycle's pardon from the rest.
            let full = w.iter().filter(|x| x.cycle >= from).count() as u64 >= NOISE_WINDOW;
            let held: Vec<&LatencyCycle> = w.iter().filter(|x| counted(x.cycle)).collect();
            let Some((slo, quantile)) = held.first().map(|x| (x.slo_ns, x.quantile)) else {
                continue;
            };
            let spare = spared.filter(|_| full);
            let judged: Vec<&&LatencyCycle> =
                held.iter().filter(|x| Some(x.cycle) != spare).collect();
            let total: u64 = judged.iter().map(|x| x.samples).sum();
            let mut sum = crate::measure::metrics::HistSum::default();
            for x in &judged {
                sum.add(&x.hist);
            }
            let sparse = sum.sparse();
            if !crate::policy::enough_to_judge(&sparse, total, slo) {
                continue;
            }
            let Some(p) = crate::measure::metrics::percentile(&sparse, total, quantile) else {
                continue;
            };
            let f = p as f64 / slo as f64;
            if worst.is_none_or(|(w, _, _)| f > w) {
                worst = Some((f, judged.len(), held.len()));
            }
        }
        worst
    }

    /// The device's window as a trim judges it (see `window_fraction`), once it holds
    /// [`TRIM_MIN_CYCLES`]: under the device's caps as they are, not only one service's:
    /// another service's change moves every reader's level. Seen on the test disk
    /// (BENCHMARKS run BA, paper 001's mix, repeat 1): ingest trimmed for the scatter of a
    /// window, and backup trimmed for the same window the next cycle, before ingest's trim
    /// showed.
    fn trim_window(&self, d: &DeviceCycle) -> Option<(f64, usize, usize)> {
        self.window_fraction(d.dev, regime_start(d), true)
            .filter(|&(_, n, _)| n >= TRIM_MIN_CYCLES)
    }

    /// A settled cap whose window p99.9 (`full`, see [`Adaptive::trim_window`]) is too close
    /// to a target, or whose cycles break the one-in-ten budget by the scatter model: trim
    /// it.
    fn trim(
        &mut self,
        d: &DeviceCycle,
        s: &ServiceLoad,
        cause: Cause,
        full: Option<(f64, usize, usize)>,
    ) -> Option<Vec<Decision>> {
        let cap = s.limit.total_bps()?;
        // Cuts here moved nothing: a trim would not either.
        if self
            .searches
            .get(&(d.dev, s.id))
            .and_then(|st| st.futile_at(s))
            .is_some()
        {
            return None;
        }
        let from = regime_start(d);
        let futile = match (self.searches.get_mut(&(d.dev, s.id)), full) {
            (Some(st), Some((f, _, _))) => st.window_trim.as_mut().is_some_and(|t| {
                t.measure(cap, f);
                t.futile(cap, f)
            }),
            _ => false,
        };
        let window = full.filter(|&(f, _, _)| f > TRIM_AT && !futile);
        let h = self.devices.get(&d.dev)?;
        let slope = self.searches.get(&(d.dev, s.id)).and_then(Search::slope);
        // On a plateau a cut buys nothing the budget needs; where the p99.9 rises steeply
        // with the rate, a small one buys a lot.
        let budget = h
            .over_budget(from)
            .filter(|_| slope.is_none_or(|k| k >= FUTILE_SLOPE))
            .map(|excess| excess / slope.unwrap_or(1.0).max(1.0));
        let sigma = h.sigma();
        let factor = match (window, budget) {
            (None, None) => return None,
            (w, b) => w
                .map_or(1.0, |(f, _, _)| TRIM_TO / f)
                .min(b.map_or(1.0, |excess| (-excess).exp())),
        }
        .clamp(TRIM_RANGE.0, TRIM_RANGE.1);
        let to = ((cap as f64 * factor) as u64).max(least_cap_bps(s));
        // At its floor: nothing to trim, and no knee learnt (a knee at the floor would hold
        // every raise back for its memory; seen on replay of BENCHMARKS run V, PostgreSQL
        // repeat 1: a window spoilt by one violation set it, and the writer stayed at its
        // floor when the window had long cleared).
        if to >= cap {
            return None;
        }
        // The knee is measured there, as a broken probe's is: the window's p99.9, or the
        // scatter model's one-cycle-in-ten level. A knee a trim found is less likely a slow
        // spell's than a cut's (a spell mostly breaks the target outright and is cut, see
        // `throttle`), so after the search a raise toward it waits for the change budget and
        // stops 1.2x under it, as under a probe's (see `relax`), and the line through its
        // p99.9 may aim a probe under half-way (see `Search::probe_toward`).
        let measured = window.map(|(f, _, _)| f).or_else(|| {
            h.level_since(from)
                .map(|(mean, _)| (mean + Z_TENTH * sigma).exp())
        });
        let st = self.searches.entry((d.dev, s.id)).or_default();
        st.remember_bad(cap, d.cycle, measured);
        st.before_raise = None;
        st.held = Some(to);
        if let Some((fraction, _, _)) = window {
            st.window_trim = Some(WindowTrim::new(cap, to, fraction));
        }
        let why = match window {
            Some((f, n, held)) if n < held => format!(
                "the {q} of every I/O in the last {held} cycles under this cap, its worst cycle left out, is at {:.0} % of its target: trim to {:.0} %",
                f * 100.0,
                factor * 100.0,
                q = judged_at(d),
            ),
            Some((f, n, _)) => format!(
                "the {q} of every I/O in the last {n} cycles under this cap is at {:.0} % of its target: trim to {:.0} %",
                f * 100.0,
                factor * 100.0,
                q = judged_at(d),
            ),
            None => format!(
                "the per-cycle {q} under this cap scatters (sigma {sigma:.2} of its log) so that more than one cycle in ten would break the target: trim to {:.0} %",
                factor * 100.0,
                q = judged_at(d),
            ),
        };
        Some(cap_bandwidth(s, d.dev, to, why, cause))
    }

    /// Confirms caps whose probe window passed: they hold.
    fn confirm(&mut self, d: &DeviceCycle) {
        let lone = lone_capped(d);
        for s in &d.services {
            let Some(cap) = s.limit.total_bps() else {
                continue;
            };
            if let Some(st) = self.searches.get_mut(&(d.dev, s.id)) {
                st.note_transition(s, cap, d.cycle);
            }
            let from = self.probe_window_start(d.dev, s);
            let fast_pass = self.fast_pass(d, s, lone);
            let h = self.devices.entry(d.dev).or_default();
            let raise = self
                .searches
                .get(&(d.dev, s.id))
                .is_some_and(|st| st.before_raise.is_some());
            if h.window_passed(from, d.cycle, fast_pass) && (!raise || h.bursts_met(from, d.cycle))
            {
                let st = self.searches.entry((d.dev, s.id)).or_default();
                if raise {
                    st.raise_passed_at = Some(d.cycle);
                }
                st.good = Some(cap);
                st.before_raise = None;
                st.stalled_probe = st.stalled_probe.filter(|p| p.to > cap);
            }
        }
    }

    /// Whether `s`'s window may pass in one cycle far under every target (see
    /// [`FAST_PASS`]): its search doubles, and it is the device's lone capped service
    /// (`lone`, see [`lone_capped`]).
    fn fast_pass(&self, d: &DeviceCycle, s: &ServiceLoad, lone: Option<ServiceId>) -> bool {
        lone == Some(s.id)
            && self
                .searches
                .get(&(d.dev, s.id))
                .is_some_and(|st| st.doubling(d.cycle))
    }

    /// Whether `s`'s doubling search may step again in the transition of its last raise:
    /// the raise was in force there and its window passed in that one cycle (see
    /// [`Adaptive::fast_pass`]). Any other change waits for its first full cycle.
    fn fast_step(&self, d: &DeviceCycle, s: &ServiceLoad, lone: Option<ServiceId>) -> bool {
        let (Some(st), Some(h)) = (self.searches.get(&(d.dev, s.id)), self.devices.get(&d.dev))
        else {
            return false;
        };
        self.fast_pass(d, s, lone)
            && s.changed_cycle
                .is_some_and(|c| st.raise_in_force == Some(c))
            && h.far_under_since(st.probe_window_start(s), d.cycle)
    }

    /// See [`Search::probe_window_start`].
    fn probe_window_start(&self, dev: u32, s: &ServiceLoad) -> u64 {
        self.searches
            .get(&(dev, s.id))
            .map_or_else(|| window_start(s), |st| st.probe_window_start(s))
    }

    fn throttle(
        &mut self,
        d: &DeviceCycle,
        victim: &ServiceLoad,
        a: &ServiceLoad,
    ) -> Vec<Decision> {
        let cause = victim_cause(base_cause(d, a), victim);
        let arriving = self.arriving(d, a);
        let st = self.searches.entry((d.dev, a.id)).or_default();
        if let (true, Some(slo), Some(l)) = (
            a.limit.is_unlimited(),
            victim.slo_ns(),
            victim.judged_latency(),
        ) {
            // Arriving, it ran at its full rate for part of the cycle: what it did is its
            // full load's harm, at a rate its mean does not show.
            st.uncapped_harm = Some(FullLoadHarm {
                victim: victim.id,
                fraction: l as f64 / slo as f64,
                rate_bps: if arriving { f64::INFINITY } else { a.bps() },
                io_bytes: a.bps() / a.iops().max(1.0),
            });
        }
        let current = a
            .limit
            .total_bps()
            .map_or(a.bps(), |c| (c as f64).min(a.bps().max(1.0)));
        // A raise on probation broke an SLO: this cap is the knee; go half-way (in log
        // space) back to the last good cap, or to it when the two are close.
        if let (Some(prev), Some(raised)) = (st.before_raise, a.limit.total_bps()) {
            if st.fell_back_at.is_some_and(|c| d.cycle <= c + 1) {
                return vec![];
            }
            // A raise the service did not use (its rate at or under the cap it came from)
            // added nothing: the violation is not the raise's, and the raised cap is no knee.
            // Back without learning one. Seen in run AT (writer, repeat 2): a raise to
            // 128 MB/s as the phase ended, and the reader's last cycle with the writer at
            // 0 MB/s "broke" it.
            if a.bps() <= prev as f64 {
                let why = format!(
                    "{} broke its SLO while {} ran under its last cap that held ({:.0} MB/s): back to that cap; the raise to {:.0} MB/s is no knee",
                    victim.name,
                    a.name,
                    prev as f64 / 1e6,
                    raised as f64 / 1e6
                );
                return self.fall_back(d, a, prev, why, cause);
            }
            // A probe fails on its first violation, marginal or not: waiting for a second
            // one (a p99.9 from a few thousand samples straddles the target near the knee)
            // cost two or three violating cycles per failed probe on the test disk, most of
            // the one-in-ten budget. A probe failed on noise costs only bandwidth until the
            // next one.
            let why = format!(
                "a raise to {:.0} MB/s broke {}'s SLO: back to the last cap that held, {:.0} MB/s",
                raised as f64 / 1e6,
                victim.name,
                prev as f64 / 1e6
            );
            return self.fail_raise(d, a, (prev, raised), why, cause);
        }
        // The episode's first cap (the cut on the aggressor's arrival, or the cap that held
        // last time, set again on its return) has one cycle in force to show that it holds:
        // the SLO is due back within 3 cycles and a change waits a cycle, so neither a
        // settled cap's tolerance nor a fresh cap's grace applies there; it is cut again by
        // at least three quarters (see `decisive_cut`). Seen, each costing a fourth cycle: 526 MB/s cut, 5.4 ms with
        // 556 MB/s still passing, a cycle waited; 377 MB/s set again on a return after the
        // disk slowed, 5.7 ms, a cycle waited. Its transition is that cycle when the cap was in
        // force there ([`Adaptive::arrival_cut_in_force`]): of 14 first caps on the test disk
        // (BENCHMARKS run BU), the 3 that broke their transition broke the next cycle too,
        // and waiting for it put the SLO back at exactly 3 (3068 -> 1533 MB/s at 5.18 ms
        // against 5, the transition at 1564 MB/s and 5.18 ms, the next cycle 5.18 ms again);
        // of the 11 within the target there, 10 held. The re-cut's transition is judged the
        // same way while the SLO can still be back in 3: in CI in a slow hour a 3.2 GB/s
        // writer cut to 1337 MB/s broke, was re-cut to 334 in that cycle, broke in the
        // re-cut's transition at 334 (6.4 ms against 5) and the next cycle (6.9), and the
        // wait put the SLO back at the fourth cycle (the writer and on/off control tests).
        if self.first_cut_failed(d, a)
            && self.devices.get(&d.dev).is_some_and(|h| {
                d.cycle == h.episode_until + 1
                    || (d.cycle == h.episode_until && self.arrival_cut_in_force(d, a))
            })
        {
            return self.decisive_cut(d, victim, a, current, cause);
        }
        // A budget cut's transition that ran in force measures the cut (see
        // [`Adaptive::budget_cut_in_force`]): a violation there is the cut's failure. So
        // does a failed probe's fall-back's (see [`Adaptive::fall_back_in_force`]).
        let fall_back_in_force = self.fall_back_in_force(d, a);
        let cut_in_force = self.budget_cut_in_force(d, a) || fall_back_in_force;
        if !a.can_change(d.cycle) && !cut_in_force {
            return vec![];
        }
        let h = self.devices.entry(d.dev).or_default();
        let (Some(slo), Some(l)) = (victim.slo_ns(), victim.judged_latency()) else {
            return self.decisive_cut(d, victim, a, current, cause);
        };
        // The cap known to hold, or one a trim or gentle cut set just under a settled cap.
        let known_good = |cap: u64| {
            self.searches
                .get(&(d.dev, a.id))
                .is_some_and(|st| st.good == Some(cap) || st.held == Some(cap))
        };
        // A cap that held for a while, or the one known to hold that a failed raise fell
        // back to, sits near the knee: judge it on its own window.
        let settled_cap = a
            .limit
            .total_bps()
            .filter(|&cap| is_settled(a, d.cycle) || known_good(cap));
        if let Some(cap) = settled_cap {
            // Near the knee one cycle in ten may straddle the target: that is noise, not a
            // reason to give up bandwidth. Only violations under this cap count (a failed
            // probe's are the probe's).
            let from = if cut_in_force {
                d.cycle
            } else {
                window_start(a)
            };
            // Stalls of the disk are no verdict on the cap, while they are few.
            let loads = self.loads.get(&d.dev);
            let excused = loads.is_some_and(|l| l.stalls_excused(d.cycle, false));
            // The violations that were no stall, and past their excuse every stall, those
            // that spent no budget (beyond what the full load did, or a probe's) too. Seen
            // in the random-read scenario: a full load measured at 2.1 times the target in
            // a fast moment of the disk, four violations at 7-9 times under a cap passed as
            // such stalls, and the fifth, the first judged as harm, found no other under
            // the cap to cut it.
            let stalls: Vec<u64> = loads.map_or(vec![], |l| l.stalls_since(from).collect());
            // Nor another service's failed probe, already undone, nor its fall-back's
            // transition (the raised rate's queue still passing, as for the prober itself
            // in `throttle`): seen in paper 001's mix, ingest's probe broke db's SLO under
            // backup's settled cap, and one more violation eight cycles later cut backup as
            // if both were its.
            let harm = h
                .violations
                .iter()
                .filter(|&&c| {
                    c >= from
                        && !stalls.contains(&c)
                        && (!h.probe_owned(c) || (fall_back_in_force && c == d.cycle))
                })
                .count();
            let under_cap = if excused { harm } else { harm + stalls.len() };
            // Under a cap a budget cut set, the budget is still spent while the violations
            // that broke it are in the window: the next violation is the cut's failure, not
            // scatter. Seen in CI (the container noisy neighbor, target 6 ms): cuts of 14,
            // 10 and 11 % each waited for two more violations, 8 of 26 cycles violating.
            // Not where the cut held: its cycles that met the targets (at least a probe
            // window's) far under them, a lone violation is the disk's scatter, judged as
            // under any settled cap. Seen on the test disk (BENCHMARKS run BI, writer,
            // repeat 3): cuts to 255 and 178 MB/s ran the reader at 0.17-0.34 of its target,
            // and one cycle at 1.09 under each cut again, down to 125 MB/s, where a static
            // 400 MB/s kept the budget in the same repeat.
            // A marginal violation (within `MARGINAL`) counts the cut's transition cycle
            // among those that met the target: the old rate's queue still passing, it ran
            // the reader no lower than the cut's own rate will, so far under there is the
            // cut holding too. Seen on the test disk (BENCHMARKS run BN, writer, repeat 1):
            // a cut to 106 MB/s ran the reader at 0.36 and 0.27 of its target, and one cycle
            // at 1.17 in the second full cycle cut it again to 74 MB/s, where it ran at
            // 0.2-0.6. A violation past `MARGINAL` is judged on full cycles alone.
            let held_from = if (l as f64) <= slo as f64 * MARGINAL {
                from.saturating_sub(1)
            } else {
                from
            };
            let cut_held = || far_under(mean_log(h.logs_since(held_from).filter(|&x| x < 0.0)));
            let after_cut = self
                .searches
                .get(&(d.dev, a.id))
                .and_then(|st| st.budget_cut)
                .filter(|b| b.to == cap && d.cycle < b.cycle + NOISE_WINDOW && !cut_held());
            // A fall-back's cap held before the probe, but the disk may have slowed since:
            // violated in its first full cycle, the aggressor held at it (in force, its
            // rate fixed) and nothing else on the device changed since, it is
            // stale, and waiting for a second violation costs a cycle the budget does not
            // have. Seen in CI (the container noisy neighbor, target 6 ms): a fall-back to
            // 229 MB/s, which had run the reader at 0.14 of its target, read 7.9 and 7.8 ms
            // and was cut only at the second, the fourth violating cycle in a row. Not
            // after a probe that met a stall: the cycle after one may be its tail.
            let fell_back_at = self
                .searches
                .get(&(d.dev, a.id))
                .and_then(|st| st.fell_back_at)
                .filter(|&c| a.changed_cycle == Some(c));
            let others_fixed = d
                .services
                .iter()
                .filter(|s| s.id != a.id)
                .all(|s| window_start(s) <= d.cycle);
            let stale_fall_back = fell_back_at.is_some_and(|c| {
                d.cycle == from
                    && others_fixed
                    && (fall_back_in_force || window_start(a) <= d.cycle)
                    && (BINDING..=FIXED_RATE_OVER_CAP).contains(&(a.bps() / cap as f64))
                    && !loads.is_some_and(|l| l.is_stall(c))
            });
            // One violation in ten is the budget, where the fitted slope reads flat too: a
            // second there was tolerated as the disk's own scatter once, and BENCHMARKS run
            // BG (writer, repeat 2) ran 9 of 49 steady cycles over at 691 MB/s on a plateau
            // whose foot (static 400: 0.1-0.8 of the target) no cut had tried. Where the
            // scatter is the disk's own at every cap, no static cap keeps the budget either.
            let tolerated = usize::from(after_cut.is_none() && !stale_fall_back);
            // The window's own count broke the budget: not a re-cut, a stale fall-back, nor
            // one violation far over the target (see `Knee::window`).
            let window_verdict = tolerated == 1 && under_cap > tolerated;
            // One violation far over the target is no scatter, unless it stays under
            // [`PROBE_STALL_FRACTION`] after clean cycles under this cap (no near miss, no
            // stall), with the capped rates fixed and nobody pushing more than then: from
            // under the near-miss bar to over three times the target in one cycle at the
            // same load is the disk (a stall too small for the stall rule), not the cap.
            // It spends the budget like any violation; a second in ten cuts. Seen on the
            // test disk (BENCHMARKS runs DH and DJ): the reader at 0.1-0.4 of its target for
            // 8-15 cycles under a writer's settled cap, one cycle at 3.1-3.3 times, then
            // back; the cut to 70 % it got took 10-17 cycles of probes to climb back.
            let lone_jump = || {
                (l as f64) < PROBE_STALL_FRACTION * slo as f64
                    && h.clean_before(from, d.cycle)
                    && loads.is_some_and(|l| l.same_fixed_load(from, d.cycle))
            };
            if under_cap <= tolerated && (l <= 3 * slo || lone_jump()) {
                return self
                    .trim(d, a, cause, self.trim_window(d))
                    .unwrap_or_default();
            }
            // Cuts that moved nothing hold the cap (see [`FUTILE_CUT_SPAN`]).
            let level_now = h.level_since(from).map(|(m, _)| m);
            let held_futile = self
                .searches
                .get(&(d.dev, a.id))
                .and_then(|st| st.futile_at(a))
                .is_some_and(|f| level_now.is_some_and(|l| l < f.level + MARGINAL.ln()));
            let chain_futile = after_cut.and_then(|b| {
                let (start, start_level) = b.chain_from;
                let span = a.bps() / start.max(1.0);
                let now = level_now?;
                (span <= FUTILE_CUT_SPAN
                    && now < FUTILE_CUT_NEAR.ln()
                    && start_level - now < FUTILE_SLOPE * -span.ln())
                .then_some((start, start_level, now))
            });
            if let Some((start, start_level, now)) = chain_futile {
                let st = self.searches.entry((d.dev, a.id)).or_default();
                st.futile_cuts = Some(FutileCuts {
                    cap,
                    set_at: a.changed_cycle,
                    level: now,
                });
                st.window_trim = None;
                if h.first_told(victim.id) {
                    let action = format!(
                        "none: {}'s cap held at {:.0} MB/s",
                        a.name,
                        cap as f64 / 1e6
                    );
                    let reason = format!(
                        "cuts of {} from {:.0} to {:.0} MB/s moved its latency from {:.2} to {:.2} of the target: the disk's own latency is at the target, which no cap fixes",
                        a.name,
                        start / 1e6,
                        a.bps() / 1e6,
                        start_level.exp(),
                        now.exp()
                    );
                    self.findings
                        .push(slo_infeasible(d, victim, action, reason));
                }
            }
            if held_futile || chain_futile.is_some() {
                return vec![];
            }
            // Squared, as a first cut: a cap that broke the budget under a scan's scatter
            // and was cut by SLO/L (186 to 168 MB/s at 3.5 ms against 3) broke it again at
            // once. After a cut that did not hold, the factors compound: the curve is
            // flatter there than the square assumes (the same CI run: 5-7 ms from 450 down
            // to 300 MB/s).
            let factor = (slo as f64 / l as f64).powi(2).clamp(GENTLE_CUT_MIN, 0.9);
            let factor = after_cut.map_or(factor, |b| (factor * b.factor).max(GENTLE_CUT_MIN));
            // With others capped, their total broke the SLO as much as this cap did: it
            // bounds every probe as a failed probe's total does (see `total_knee`). Seen in
            // run AY (paper 001's mix, repeat 1): ingest at 141 MB/s next to backup at 45
            // broke db twice and was cut, and backup's next probe went half-way to the 245
            // MB/s a failed doubling had left, from 149, and broke it.
            let h = self.devices.entry(d.dev).or_default();
            let lower = h
                .total_knee
                .and_then(|k| k.trusted(d.cycle))
                .is_some_and(|k| k <= capped_total(d).0);
            if !lower {
                h.total_broke(d);
            }
            let to = ((cap as f64 * factor) as u64).max(least_cap_bps(a));
            // A stale fall-back's cap was measured in force at this fraction, right after
            // the probe over it broke: a measured knee, as a broken probe's, so the settled
            // search's rules apply under it (the change budget, [`SETTLED_KNEE_PRECISION`]).
            // As a cut's knee (maybe a slow spell) the search climbed straight back at it.
            // Seen on the test disk (BENCHMARKS run DQ, the writer, repeat 1): a probe to 411
            // MB/s broke, the fall-back to 373 broke in force and was cut to 261; ten cycles
            // later 261 -> 312 -> 341 two cycles apart, 341 broke, the fall-back to 312 broke
            // and was cut to 219: four changes and two violating cycles in five cycles.
            let measured = stale_fall_back.then_some(l as f64 / slo as f64);
            let st = self.searches.entry((d.dev, a.id)).or_default();
            st.remember_bad(cap, d.cycle, measured);
            if let Some(k) = st.knee.as_mut() {
                k.window = window_verdict;
            }
            st.held = Some(to);
            let chain_from = after_cut.map_or_else(
                || {
                    let broke = mean_log(h.logs_since(from).filter(|&x| x > 0.0));
                    (a.bps(), broke.map_or(0.0, |(m, _)| m))
                },
                |b| b.chain_from,
            );
            st.budget_cut = Some(BudgetCut {
                to,
                cycle: d.cycle,
                factor,
                chain_from,
            });
            // The window misjudged the budget here: what it measured flat is no guide.
            st.window_trim = None;
            let broke = if window_verdict {
                // Says how many: stalls past their excuse count too.
                let times = match under_cap {
                    2 => "twice".to_string(),
                    n => format!("{n} times"),
                };
                format!("{times} in {NOISE_WINDOW} cycles under this cap")
            } else if after_cut.is_some() {
                "again under the cap its broken budget set".to_string()
            } else if stale_fall_back && fall_back_in_force {
                "back under the cap that held before the raise, in force already in its first cycle: the disk has slowed since".to_string()
            } else if stale_fall_back {
                "in the first full cycle back under the cap that held before the raise: the disk has slowed since".to_string()
            } else {
                // Within the budget's count, but far over the target: no scatter.
                format!(
                    "at {:.1} times its target under this cap",
                    l as f64 / slo as f64
                )
            };
            let why = format!(
                "{} violated its SLO {broke}: cut to {:.0} %",
                victim.name,
                factor * 100.0
            );
            return cap_bandwidth(a, d.dev, to, why, cause);
        }
        // A fresh cap not yet in force (the throttle still passing the old rate's queue,
        // seen: 259 MB/s through a 226 MB/s cap in its first cycle, 5.8 ms against 5) is not
        // yet measured: a marginal violation under it waits a cycle.
        if let Some(cap) = a.limit.total_bps() {
            let not_in_force = a.bps() > cap as f64 * FIXED_RATE_OVER_CAP;
            if not_in_force && (l as f64) <= slo as f64 * MARGINAL {
                return vec![];
            }
        }
        if a.limit.is_unlimited() {
            let arriving = self.arriving(d, a);
            let st = self.searches.entry((d.dev, a.id)).or_default();
            if let Some(lifted) = st.lifted_at.take() {
                let rested = d.cycle.saturating_sub(lifted);
                for k in st.knee.iter_mut().chain(st.older_knees.iter_mut()) {
                    k.at_cycle += rested;
                }
            }
            // Back in a cycle it ran only part of, its rate understates it: the good cap.
            if let Some(g) = st.good.filter(|&g| arriving || (g as f64) < current * 0.9) {
                let h = self.devices.entry(d.dev).or_default();
                h.episode_until = d.cycle + 1;
                h.first_cap_at = Some(d.cycle);
                let why = format!(
                    "aggressor of {} is back: the cap that held last time",
                    victim.name
                );
                return cap_bandwidth(a, d.dev, g.max(least_cap_bps(a)), why, cause);
            }
        }
        self.decisive_cut(d, victim, a, current, cause)
    }

    /// A raise on probation broke an SLO: the raised cap is the knee; back to the last good
    /// cap (the next probe goes half-way to the knee, once the budget allows one).
    fn fail_raise(
        &mut self,
        d: &DeviceCycle,
        a: &ServiceLoad,
        (prev, raised): (u64, u64),
        why: String,
        cause: Cause,
    ) -> Vec<Decision> {
        let worst = worst_latency_service(d).map(|(_, f)| f);
        // A near miss fails a raise at its window's end, the near miss maybe cycles before:
        // every cycle since the raise is the probe's.
        let h = self.devices.entry(d.dev).or_default();
        let raised_at = a.changed_cycle.map_or(d.cycle, |c| (c + 1).min(d.cycle));
        h.failed_probes.push_back(raised_at..=d.cycle + 1);
        h.failed_probes
            .retain(|p| *p.end() + NOISE_WINDOW > d.cycle);
        let st = self.searches.entry((d.dev, a.id)).or_default();
        st.remember_bad(raised, d.cycle, worst);
        st.stalled_probe = None;
        // `raised` is a's cap now: the total is the one that broke.
        self.devices.entry(d.dev).or_default().total_broke(d);
        self.fall_back(d, a, prev, why, cause)
    }

    /// Ends `a`'s probation: back to `prev`, the cap that held.
    fn fall_back(
        &mut self,
        d: &DeviceCycle,
        a: &ServiceLoad,
        prev: u64,
        why: String,
        cause: Cause,
    ) -> Vec<Decision> {
        let st = self.searches.entry((d.dev, a.id)).or_default();
        st.fell_back_at = Some(d.cycle);
        st.before_raise = None;
        cap_bandwidth(a, d.dev, prev.max(least_cap_bps(a)), why, cause)
    }

    /// See [`RecentLoads::arriving`].
    fn arriving(&self, d: &DeviceCycle, a: &ServiceLoad) -> bool {
        self.loads.get(&d.dev).is_some_and(|r| r.arriving(d, a))
    }

    /// Whether `a`'s cap is the episode's first cut and its first full cycle still broke an
    /// SLO.
    fn first_cut_failed(&self, d: &DeviceCycle, a: &ServiceLoad) -> bool {
        let Some(h) = self.devices.get(&d.dev) else {
            return false;
        };
        a.changed_cycle.is_some_and(|c| c + 1 == h.episode_until) && d.cycle <= h.episode_until + 2
    }

    /// Whether `a`'s cap is the episode's first cap or a re-cut of it decided while the SLO
    /// can still be back within 3 cycles of the first (a verdict in this cycle takes effect
    /// in the next), and `a` ran in this cycle as it does in force: it took [`BINDING`] of
    /// the cut from the rate it ran at before, as a raise's transition counts (a throttled
    /// service's queue runs at the new rate a few ms into the cycle; on the test disk first
    /// caps' transitions ran 0.7-14 % of the way back, all but two under 3 %: 1533 of 3068
    /// -> 1564 MB/s, 194 of 1471 -> 230). Later re-cuts wait a cycle: with the bar missed,
    /// a cycle's wait costs less than a cut too deep.
    fn arrival_cut_in_force(&self, d: &DeviceCycle, a: &ServiceLoad) -> bool {
        a.changed_cycle.is_some_and(|changed| {
            self.devices.get(&d.dev).is_some_and(|h| {
                h.first_cap_at
                    .is_some_and(|first| changed >= first && d.cycle <= first + 2)
            })
        }) && self.cut_ran_in_force(d, a)
    }

    /// Whether `a`'s cap is a re-cut of the episode's first cap (set after it).
    fn re_cut(&self, d: &DeviceCycle, a: &ServiceLoad) -> bool {
        let first = self.devices.get(&d.dev).and_then(|h| h.first_cap_at);
        a.changed_cycle
            .zip(first)
            .is_some_and(|(changed, first)| changed > first)
    }

    /// Whether this cycle is the transition of `a`'s fall-back from a failed probe and `a`
    /// ran in it at the cap it fell back to ([`Adaptive::cut_ran_in_force`]), after a probe
    /// that met no stall: the reader's p99.9 there is the fall-back cap's. Of 43 fall-backs
    /// recorded on the test disk (runs DM, DN, DO), 5 broke their transition and 4 of those
    /// broke the next cycle too (1.19 then 1.17 times the target, 1.51 and 1.51, 1.27 and
    /// 1.35, 1.01 and 1.01); waiting for it cost a violation each.
    fn fall_back_in_force(&self, d: &DeviceCycle, a: &ServiceLoad) -> bool {
        self.transition_in_force(d, a, |st, changed, _| {
            st.fell_back_at == Some(changed)
                && !self.loads.get(&d.dev).is_some_and(|l| l.is_stall(changed))
        })
    }

    /// Whether this cycle is the transition of `a`'s last change, a change `set_by` says
    /// its search made (given the change's cycle and the cap), and `a` ran in it as it does
    /// in force ([`Adaptive::cut_ran_in_force`]).
    fn transition_in_force(
        &self,
        d: &DeviceCycle,
        a: &ServiceLoad,
        set_by: impl Fn(&Search, u64, u64) -> bool,
    ) -> bool {
        let (Some(cap), Some(changed)) = (a.limit.total_bps(), a.changed_cycle) else {
            return false;
        };
        d.cycle == changed + 1
            && self
                .searches
                .get(&(d.dev, a.id))
                .is_some_and(|st| set_by(st, changed, cap))
            && self.cut_ran_in_force(d, a)
    }

    /// Whether `a`'s last change cut it from the rate it ran at in the cycle of the change
    /// and `a` took [`BINDING`] of the way down in this cycle (see [`took_most_of`]).
    fn cut_ran_in_force(&self, d: &DeviceCycle, a: &ServiceLoad) -> bool {
        let (Some(cap), Some(changed)) = (a.limit.total_bps(), a.changed_cycle) else {
            return false;
        };
        self.loads
            .get(&d.dev)
            .and_then(|r| r.rate_at(changed, a.id))
            .is_some_and(|from| from > cap as f64 && took_most_of(from, cap as f64, a.bps()))
    }

    /// Whether this cycle is the transition of a cut `a`'s cap got for a broken budget
    /// (see [`BudgetCut`]) and `a` ran in it as it does in force
    /// ([`Adaptive::cut_ran_in_force`], as a first cap is judged): the reader's p99.9
    /// there is the cut's (measured, BENCHMARKS run BU), and with the budget spent a
    /// violation there is the cut's failure, cut again at once rather than after a cycle
    /// waited. Seen in CI (the container noisy neighbor, target 6 ms): a cut from 123 to
    /// 86 MB/s, in force at 86 in its transition, read 6.6 ms there and 6.5 in the next
    /// cycle, which cut it to 60 (2.9 ms): four violating cycles in a row.
    fn budget_cut_in_force(&self, d: &DeviceCycle, a: &ServiceLoad) -> bool {
        self.transition_in_force(d, a, |st, changed, cap| {
            st.budget_cut
                .is_some_and(|b| b.to == cap && b.cycle == changed)
        })
    }

    /// One cut big enough to meet the SLO at the next full cycle.
    fn decisive_cut(
        &mut self,
        d: &DeviceCycle,
        victim: &ServiceLoad,
        a: &ServiceLoad,
        current: f64,
        cause: Cause,
    ) -> Vec<Decision> {
        let factor = match victim.class {
            // Squared: tail latency grows much faster than linearly near the knee,
            // and an under-cut costs two more violating cycles.
            SloClass::Latency(t) => victim
                .judged_latency()
                .map_or(0.5, |l| (t.target_ns as f64 / l as f64).powi(2)),
            SloClass::Throughput { rate_bps } => {
                1.0 - (rate_bps as f64 - victim.bps()).max(0.0) / current.max(1.0)
            }
            SloClass::BestEffort => 0.5,
        }
        // From no cap, at least half goes: the first violating cycle is partial and
        // understates the harm. Any cap that does not hold is close already: (SLO/L)^2 of
        // it, no more; except the episode's first cut that did not hold in its first full
        // cycle: at least three quarters of it goes. It was decided from a partial cycle or
        // a burst (seen: 2127 MB/s on a disk that sustains ~800), and near a cliff (SLO/L)^2
        // is gentle when L is just over the target. Half was not enough, each time costing
        // two more cycles (a change waits out its transition) and the SLO back only at the
        // fifth: 520 -> 335 MB/s at 6.2 ms against 5, 6.6 ms again; 1063 -> 531 MB/s broke
        // twice more; in CI, two scenario runs at 6.4-7 ms halved and still at 5.7-6.8 ms.
        // Knees seen at 17-60 % of a writer's rate alone; the search takes back what was
        // cut too deep. A re-cut that failed in turn was measured in force, no burst: half
        // of it goes (the 4 seen on the test disk broke at 264-334 MB/s, and 139-167 held
        // later in each run; one broke only in its transition, the next cycle held).
        .clamp(
            0.05,
            match (a.limit.total_bps(), self.first_cut_failed(d, a)) {
                (Some(_), true) if self.re_cut(d, a) => 0.5,
                (Some(_), true) => 0.25,
                (None, _) => 0.5,
                _ => 0.9,
            },
        );
        let arriving = self.arriving(d, a);
        let h = self.devices.entry(d.dev).or_default();
        h.episode_until = d.cycle + 1;
        if a.limit.is_unlimited() {
            h.first_cap_at = Some(d.cycle);
        }
        let st = self.searches.entry((d.dev, a.id)).or_default();
        st.before_raise = None;
        if arriving {
            // A knee still trusted from its last visit stands; without one, the search
            // doubles until a probe finds it.
            st.knee_unknown = st.bad(d.cycle).is_none();
            // Its last visit's levels are not this one's.
            st.raised_from = None;
        } else {
            // The knee is the rate that broke the SLO, which may be above a cap not yet in
            // force.
            st.remember_bad(current.max(a.bps()) as u64, d.cycle, None);
            if a.limit.total_bps().is_none() {
                if let Some(k) = st.knee.as_mut() {
                    k.full_load = true;
                    k.at_edge = victim.slo_ns().is_some_and(|t| {
                        victim
                            .judged_latency()
                            .is_some_and(|l| l as f64 <= t as f64 * MARGINAL)
                            || self.loads.get(&d.dev).is_some_and(|r| r.held_before(d, a))
                    });
                }
            }
        }
        // The victim suffers from everyone else's bytes: scale that total by the
        // factor and take the whole cut from the aggressor.
        let others: f64 = d
            .services
            .iter()
            .filter(|s| s.id != victim.id)
            .map(|s| if s.id == a.id { current } else { s.bps() })
            .sum();
        // A latency service is cut only when no service that owes nothing is left, and
        // gently: its closed-loop I/O waits in the throttle, which its own p99.9 here does
        // not see (seen: a QD4 reader taking the whole cut, 108 -> 5 MB/s, 90 ms by fio
        // while the agent measured 6 ms after the throttle).
        let cap = if matches!(a.class, SloClass::Latency(_)) {
            current * factor.max(GENTLE_CUT_MIN)
        } else {
            (others * factor - (others - current)).max(current * 0.05)
        };
        let cap = (cap as u64).max(least_cap_bps(a));
        let why = format!(
            "aggressor of {}: largest device share; cap at {:.0} % of its rate",
            victim.name,
            100.0 * cap as f64 / current.max(1.0)
        );
        cap_bandwidth(a, d.dev, cap, why, cause)
    }

    /// No SLO is violated: lift the caps nobody uses, then raise one cap that held.
    fn relax(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        let mut out = vec![];
        let h = self.devices.entry(d.dev).or_default().clone();
        for s in d.services.iter().filter(|s| !s.limit.is_unlimited()) {
            let st = self.searches.entry((d.dev, s.id)).or_default();
            let Some(cap) = s.limit.total_bps() else {
                // An IOPS cap on a victim's own concurrency: lift it whole once healthy.
                if s.can_change(d.cycle) && h.clean_since(window_start(s)) {
                    out.extend(uncap(
                        s,
                        d.dev,
                        "every SLO met: lift the concurrency cap".into(),
                        base_cause(d, s),
                    ));
                }
                continue;
            };
            st.quiet = if s.bps() < cap as f64 * 0.25 {
                st.quiet + 1
            } else {
                0
            };
            if st.quiet >= QUIET_CYCLES && s.ceiling_bps().is_none() && s.can_change(d.cycle) {
                st.before_raise = None;
                st.knee_unknown = false;
                st.lifted_at = Some(d.cycle);
                // The episode ends: its return's curve is measured afresh.
                st.window_trim = None;
                out.extend(uncap(
                    s,
                    d.dev,
                    format!(
                        "used under a quarter of its cap for {QUIET_CYCLES} cycles: lift it (the knee is remembered)"
                    ),
                    base_cause(d, s),
                ));
            }
        }
        if !out.is_empty() {
            return out;
        }
        // A raise whose probe window is complete with a near miss in it did not hold with the
        // margin the budget needs: back, and it is the knee. Seen on the test disk: a writer
        // raised from 335 to 670 MB/s put the reader at 90-96 % of its target for six cycles,
        // neither confirmed nor failed, and the trims that followed cost four violations.
        for s in &d.services {
            let (Some(cap), Some(prev)) = (
                s.limit.total_bps(),
                self.searches
                    .get(&(d.dev, s.id))
                    .and_then(|st| st.before_raise),
            ) else {
                continue;
            };
            let from = self.probe_window_start(d.dev, s);
            if d.cycle + 1 >= from + PROBE_CYCLES
                && h.harm_since(from)
                && !s
                    .changed_cycle
                    .is_some_and(|raised_at| h.held_cap_ran_as_close(raised_at, from))
                && s.can_change(d.cycle)
            {
                let why = format!(
                    "a raise to {:.0} MB/s ran the {q} within {:.0} % of its target: back to the last cap that held, {:.0} MB/s",
                    cap as f64 / 1e6,
                    (1.0 - h.near_miss()) * 100.0,
                    prev as f64 / 1e6,
                    q = judged_at(d),
                );
                return self.fail_raise(d, s, (prev, cap), why, base_cause(d, s));
            }
        }
        // Judged once for the device: the trim and every candidate's raise read it.
        let trim_window = self.trim_window(d);
        // A settled cap whose window p99.9 runs close to a target gives a little back.
        let settled: Vec<&ServiceLoad> = d
            .services
            .iter()
            .filter(|s| s.limit.total_bps().is_some() && s.can_change(d.cycle))
            .filter(|s| is_settled(s, d.cycle) && !self.in_light_group(d.dev, s.id))
            .collect();
        let total_inflight = d.total_inflight();
        let share = |s: &ServiceLoad| share_of(s.mean_inflight, total_inflight);
        if let Some(s) = settled
            .into_iter()
            .max_by(|a, b| share(a).total_cmp(&share(b)))
        {
            if let Some(trim) = self.trim(d, s, base_cause(d, s), trim_window) {
                return trim;
            }
        }
        // One probe at a time on a device: a violation during two could not tell which
        // raise broke the SLO (seen in paper 001's mix: ingest raised 100 -> 200 MB/s, backup
        // 55 -> 110 a cycle later; the violation failed backup's, and ingest's ran on for
        // three more violating cycles).
        if self.probing(d).is_some() {
            return out;
        }
        let group = self.light_raise(d);
        if !group.is_empty() || self.light_probing(d.dev) {
            return group;
        }

        // One raise per cycle, the cap untouched longest first (lowest id as tie); when
        // that one has no room (at its knee, its budget spent), the next. Seen on the test
        // disk (BENCHMARKS run AU, paper 001's mix, repeat 2): backup at its floor, 15 %
        // under a knee its arrival's re-cut found, was the oldest cap for 23 cycles, and
        // ingest, half its knee's distance under it, was never tried.
        let lone = lone_capped(d);
        let mut candidates: Vec<&ServiceLoad> = d
            .services
            .iter()
            .filter(|s| {
                !self.in_light_group(d.dev, s.id)
                    && self.raise_tells(d, s)
                    && (s.can_change(d.cycle) || self.fast_step(d, s, lone))
            })
            .collect();
        candidates.sort_by_key(|s| (s.changed_cycle.unwrap_or(0), s.id));
        for s in candidates {
            let raise = self.raise(d, &h, s, lone, trim_window);
            if !raise.is_empty() {
                return raise;
            }
        }
        out
    }

    /// The raise of `s`'s cap this cycle, if its window held and it has room: the knee
    /// search's next step (see `relax`; `trim_window` is [`Adaptive::trim_window`]). Empty
    /// when it has none.
    fn raise(
        &mut self,
        d: &DeviceCycle,
        h: &DeviceHistory,
        s: &ServiceLoad,
        lone: Option<ServiceId>,
        trim_window: Option<(f64, usize, usize)>,
    ) -> Vec<Decision> {
        let mut out = vec![];
        let cap = s.limit.total_bps().unwrap_or(0);
        let from = self.probe_window_start(d.dev, s);
        let fast_pass = self.fast_pass(d, s, lone);
        let st = self.searches.entry((d.dev, s.id)).or_default();
        let bad = st.bad(d.cycle);
        let cause = base_cause(d, s);
        // Not binding and no SLO worry remembered: remove it (a cap doubled past the
        // aggressor's demand since an arrival ends here too).
        if bad.is_none() && s.bps() < cap as f64 * 0.5 && s.ceiling_bps().is_none() {
            st.knee_unknown = false;
            st.window_trim = None;
            return uncap(
                s,
                d.dev,
                "every SLO met and the cap no longer binds: remove it".into(),
                cause,
            );
        }
        // A cap that just held (or the good one fallen back to) may be raised once its
        // window is clean.
        let confirmed = st.good == Some(cap);
        let window_passed = h.window_passed(from, d.cycle, fast_pass);
        let recent_clean = h.clean_since(d.cycle.saturating_sub(1));
        if !(confirmed && (window_passed || recent_clean)) {
            return out;
        }
        if self
            .window_fraction(d.dev, from, false)
            .is_some_and(|(f, _, _)| f > h.near_miss())
        {
            return out;
        }
        // A window a trim would act on raises nothing, unless it is this cap's own plateau
        // (its window trim measured the curve flat here, see [`WindowTrim`]): otherwise a
        // trim held back for one service would let another's raise through at that window.
        if let Some((f, _, _)) = trim_window.filter(|&(f, _, _)| f > TRIM_AT) {
            let plateau = self
                .searches
                .get(&(d.dev, s.id))
                .and_then(|st| st.window_trim)
                .is_some_and(|t| t.futile(cap, f));
            if !plateau {
                return out;
            }
        }
        // The search stopped just under a knee found once, and the cap runs far below the
        // target: the knee may have been a slow spell; probe it again soon.
        let far_below = h
            .level_since(from)
            .is_some_and(|(mean, n)| n >= TRIM_MIN_CYCLES && mean < KNEE_DOUBT.ln());
        let st = self.searches.entry((d.dev, s.id)).or_default();
        if far_below && bad.is_some_and(|b| b as f64 <= cap as f64 * KNEE_PRECISION) {
            st.doubt_knee(d.cycle);
        }
        let bad = st.bad(d.cycle);
        // Without a knee since an arrival cut, the search has found nothing yet: it doubles
        // until a probe breaks, past its first cycles if it must (the cap was cut from a
        // rate the arrival understated), while the budget allows a probe. Not once the caps
        // it shares the device with have a total knee that expired: the rate that broke is
        // known, and a raise past a knee no longer trusted creeps ([`CREEP_FACTOR`]). Seen
        // in paper 001's mix (BENCHMARKS run CT, repeats 4 and 5): backup, its own knee
        // never found, doubled along its line the cycle their total knee expired, to 334
        // and 412 MB/s next to ingest at about 210 (totals 1.09x and 1.13x the knee), and
        // broke db's SLO or came within 12 % of it: two changes each. Only a knee found since
        // the last arrival (`first_cap_at`): a service that arrived after it was cut from its
        // own rate, at other rates of the others, and its search doubles as any arrival's.
        let (total, capped) = capped_total(d);
        let shared_knee = h.total_knee.filter(|_| capped >= 2);
        let total_expired = shared_knee.is_some_and(|k| {
            k.trusted(d.cycle).is_none() && h.first_cap_at.is_some_and(|f| k.at_cycle > f)
        });
        let knee_unknown = st.doubling(d.cycle) && !total_expired;
        // With the budget spent, only a probe far under a trusted knee (likely to hold) is
        // worth it: seen on the test disk, a probe from 110 to 221 MB/s failed once and the
        // wait out of its violation at 110 held the writer at half the knee for ten cycles.
        let total_bad = shared_knee.and_then(|k| k.trusted(d.cycle));
        let past_search = h.past_search(d.cycle);
        // After the search, 1.2x under it as under a service's own measured knee (see
        // `settled` below): every total knee is a broken probe's or a broken budget's. Seen
        // in paper 001's mix (BENCHMARKS run CN, repeat 1): with their total knee found
        // again at 586 MB/s, ingest crept 228 -> 251 MB/s next to backup at 278 (a total
        // of 529, 1.11x under it), broke cache's SLO three cycles later and went back: two
        // of the repeat's six changes in its 49 steady cycles, for 4 % more.
        let total_precision = if past_search {
            SETTLED_KNEE_PRECISION
        } else {
            KNEE_PRECISION
        };
        if total_bad.is_some_and(|b| b as f64 <= total as f64 * total_precision) {
            return out;
        }
        // A probe that met a stall of the disk runs again as soon as its cap's window is
        // clean: the stall said nothing about the raised cap, and the budget is not spent.
        let st = self.searches.entry((d.dev, s.id)).or_default();
        if let Some(sp) = st.stalled_probe.filter(|sp| !sp.retried && sp.from == cap) {
            let to = s.ceiling_bps().map_or(sp.to, |c| sp.to.min(c));
            if to > cap {
                st.stalled_probe = Some(StalledProbe {
                    retried: true,
                    ..sp
                });
                st.start_probe(cap);
                st.climb = None;
                let why = format!(
                    "every SLO held under this cap: probe {:.0} MB/s again (its last probe met a stall of the disk)",
                    to as f64 / 1e6
                );
                return cap_bandwidth(s, d.dev, to, why, cause);
            }
        }
        // Not right after a probe broke at a cliff (the victim at [`CLIFF_FRACTION`] times
        // its target or more): half-way to a cliff is no safe bet on a disk that drifts.
        // Seen in the random-read scenario: a scan's probe broke at 512 MB/s, the half-way
        // probe to 410 three cycles later at 8.5 times the target; one broke at 241 MB/s
        // (3.45 times), the line probe to 196 three cycles later at 7.4 times.
        let cliff_just_broke = st.knee.is_some_and(|k| {
            k.fraction.is_some_and(|f| f >= CLIFF_FRACTION) && d.cycle < k.at_cycle + NOISE_WINDOW
        });
        let far_from_knee = !cliff_just_broke
            && bad.is_some_and(|b| b as f64 >= cap as f64 * FAR_FROM_KNEE)
            && total_bad.is_none_or(|b| b as f64 >= total as f64 * FAR_FROM_KNEE);
        if h.budget_spent() && !far_from_knee {
            return out;
        }
        // Near the knee, a raise buys a few per cent of bandwidth and costs a change, two if
        // it fails, and a violation when it fails on one. The search has the first
        // [`SEARCH_CYCLES`] of an episode for those. After them, a raise waits until the
        // device's caps have been left alone for [`NOISE_WINDOW`] cycles, and changed at
        // most once in the last two windows (room for its fall-back; see
        // [`DeviceHistory::change_budget_allows`]), and stops [`SETTLED_KNEE_PRECISION`]
        // under a knee it trusts, not [`KNEE_PRECISION`]. Seen on the test disk (run N): a
        // probe 164 -> 173 MB/s next to a random-read scan's knee at 184, after the search,
        // cost a violation and two changes for 6 % more. A cap far under its knee, or far
        // under every target, is still raised at once: that is where the bandwidth is (and
        // where a disk that got faster shows).
        let far_under_targets = far_under(h.level_since(from));
        // Far under every target but within reach of a measured knee, the wait applies
        // there too: under a broken probe's, the latency says nothing of where the wall is
        // (a writer's reads on the test disk at 2-5 % of their target up to 274 MB/s, broken
        // at 388); under a trim's, the window ran near the target there (a random-read
        // scan's reader at 0.24-0.30 under a trim's knee, then raises two cycles apart and
        // a near miss back). Not under a knee a cut found (a slow spell of the disk may have
        // set it), but a stale fall-back's (measured in force). Settled, the search also
        // stops 1.2x under a measured knee, where it is not doubted: it is probed again when
        // its memory runs out.
        let under_measured_knee = st
            .knee
            .is_some_and(|k| k.fraction.is_some() && k.trusted(d.cycle).is_some());
        let settled = past_search && (!far_under_targets || under_measured_knee) && !knee_unknown;
        if settled && !far_from_knee && !h.change_budget_allows(d.cycle) {
            return out;
        }
        let precision = if settled {
            SETTLED_KNEE_PRECISION
        } else {
            KNEE_PRECISION
        };
        let climbing = bad.is_none() && !knee_unknown && far_under_targets;
        let streak = st
            .climb
            .filter(|&(c, _)| s.changed_cycle == Some(c))
            .map_or(0, |(_, n)| n);
        let mut on_line = false;
        let mut edge_bound = false;
        let mut doubling = None;
        // Under a knee a broken budget set, no probe for two windows (see `Knee::window`),
        // unless the cut runs far under every target: the slow spell that broke the budget
        // is over, and that is where the bandwidth is.
        let window_knee = !far_under_targets
            && st
                .knee
                .is_some_and(|k| k.window && d.cycle < k.at_cycle + 2 * NOISE_WINDOW);
        let mut next = match bad {
            Some(bad) if bad as f64 <= cap as f64 * precision || window_knee => return out,
            Some(bad) => {
                let half_way = ((cap as f64 * bad as f64).sqrt() as u64).min(cap * 2);
                // At an edge knee, no higher than its edge: a cap there stops the search
                // (the raise would be none, see `next <= cap` below).
                let edge = (bad as f64 / EDGE_KNEE_PRECISION) as u64;
                edge_bound = st.knee.is_some_and(|k| k.at_edge) && edge < half_way;
                let half_way = if edge_bound { edge } else { half_way };
                match st.probe_toward(cap, h.level_since(from)) {
                    Some(to) if to < cap as f64 * MIN_PROBE_GAIN => return out,
                    Some(to) if (to as u64) < half_way => {
                        on_line = true;
                        to as u64
                    }
                    _ => half_way,
                }
            }
            None if knee_unknown => match st.double_toward(cap, h.level_since(from)) {
                Some(step) => {
                    doubling = Some(step);
                    step.to()
                }
                None => return out,
            },
            None if climbing => {
                let factor = CREEP_FAR_FACTOR.powi(1 << streak.min(2));
                (cap as f64 * factor.min(CLIMB_MAX_FACTOR)) as u64
            }
            None => (cap as f64 * CREEP_FACTOR) as u64,
        };
        // A raise without a trusted knee stops short of an older one still trusted (see
        // [`OLDER_KNEES`]).
        let older = if bad.is_none() && !knee_unknown {
            st.older_bad(d.cycle, cap)
        } else {
            None
        };
        let mut by_older = None;
        if let Some(older) = older {
            if older as f64 <= cap as f64 * precision {
                return out;
            }
            let half_way = (cap as f64 * older as f64).sqrt() as u64;
            if half_way < next {
                next = half_way;
                by_older = Some(older);
            }
        }
        if let Some(ceiling) = s.ceiling_bps() {
            next = next.min(ceiling);
        }
        // Where the device's knee is the tighter bound: the cap that takes the total
        // half-way to it.
        let by_total = total_bad
            .map(|b| {
                let room = ((total as f64 * b as f64).sqrt() as u64).saturating_sub(total);
                (b, cap.saturating_add(room))
            })
            .filter(|&(_, to)| to < next);
        if let Some((_, to)) = by_total {
            next = to;
        }
        if next <= cap {
            return out; // at the ceiling, or no room under the device's knee
        }
        // Past the search, a raise short of [`SHORT_STEP`] toward a rate no probe measured
        // (a doubling search's line near the target or its creep, half-way to the rate whose
        // full load broke the SLO) buys a few per cent for a change, two if it breaks:
        // within the change budget only. Under a knee a broken probe, a stale fall-back or a
        // trim found, the settled rules above apply; under one a cut of a held cap set (maybe
        // a slow spell of the disk), the search climbs back.
        let full_load_knee = bad.is_some() && st.knee.is_some_and(|k| k.full_load);
        let unmeasured = doubling.is_some() || full_load_knee;
        if unmeasured
            && past_search
            && (next as f64) < cap as f64 * SHORT_STEP
            && !h.change_budget_allows(d.cycle)
        {
            return out;
        }
        st.start_probe(cap);
        st.raised_from = h.level_since(from).map(|(level, _)| RaisedFrom {
            cap,
            level,
            short_of_doubling: matches!(
                doubling,
                Some(DoublingStep::Line(_) | DoublingStep::Creep(_))
            ),
        });
        st.climb = climbing.then_some((d.cycle, streak + 1));
        let worst = worst_latency_service(d).map_or(0.0, |(_, f)| f);
        out.extend(cap_bandwidth(
            s,
            d.dev,
            next,
            match (by_total, bad) {
                (Some((total_bad, _)), _) => format!(
                    "every SLO held under this cap: probe with half the room under the device's knee (the capped services broke an SLO together at {:.0} MB/s, now {:.0})",
                    total_bad as f64 / 1e6,
                    total as f64 / 1e6
                ),
                (None, Some(bad)) if on_line => format!(
                    "every SLO held under this cap: probe toward the knee at {:.0} MB/s, where the line from this cap's {q} to the one measured there reaches {:.0} % of the target",
                    bad as f64 / 1e6,
                    PROBE_AIM * 100.0,
                    q = judged_at(d),
                ),
                (None, Some(bad)) if edge_bound && !on_line => format!(
                    "every SLO held under this cap: probe to {:.0} % of {:.0} MB/s, no closer (the full load ran at the edge of the SLO there, not past a knee)",
                    100.0 / EDGE_KNEE_PRECISION,
                    bad as f64 / 1e6
                ),
                (None, Some(bad)) => format!(
                    "every SLO held under this cap: probe half-way to the knee at {:.0} MB/s",
                    bad as f64 / 1e6
                ),
                (None, None) if knee_unknown => match doubling {
                    Some(DoublingStep::Line(_)) => format!(
                        "every SLO held under this cap: raise it to where the line through this cap's {q} and the one it was raised from reaches {:.0} % of the target (the rate that broke the SLO on arrival is not known)",
                        DOUBLING_AIM * 100.0,
                        q = judged_at(d),
                    ),
                    Some(DoublingStep::Creep(_)) => format!(
                        "every SLO held under this cap: raise it by {:.0} %, not double it (the last raise stopped where the line reached the target, and this cap's {q} is no higher than the last one's: noise, not the curve)",
                        (CREEP_FAR_FACTOR - 1.0) * 100.0,
                        q = judged_at(d),
                    ),
                    _ => "every SLO held under this cap: double it (the rate that broke the SLO on arrival is not known)".into(),
                },
                (None, None) if by_older.is_some() => format!(
                    "every SLO met (worst {q} at {:.0} % of its target): raise half-way to {:.0} MB/s, a rate that broke an SLO before the knee found since, which is doubted",
                    worst * 100.0,
                    by_older.unwrap_or_default() as f64 / 1e6,
                    q = judged_at(d),
                ),
                (None, None) => format!(
                    "every SLO met (worst {q} at {:.0} % of its target): give back bandwidth, +{:.0} %",
                    worst * 100.0,
                    (next as f64 / cap as f64 - 1.0) * 100.0,
                    q = judged_at(d),
                ),
            },
            cause,
        ));
        out
    }

    /// Whether `s` has a bandwidth cap and raising it could tell anything: the service fills
    /// it (at [`BINDING`]), or no knee and no ceiling bound it (then `relax` removes a cap
    /// it uses under half of, or searches on). Under a knee, a raise of a cap the service
    /// does not fill adds no load, and the next violation (its return, the disk's) fails it
    /// as a probe and moves the knee to where nothing was measured (seen on the test disk,
    /// run AS: a writer going quiet at the end of its phase, 111 then 0 MB/s under 192,
    /// raised to 229 and that "broke" on the reader's own last cycle).
    fn raise_tells(&self, d: &DeviceCycle, s: &ServiceLoad) -> bool {
        let Some(cap) = s.limit.total_bps() else {
            return false;
        };
        let unbound = s.ceiling_bps().is_none()
            && self
                .searches
                .get(&(d.dev, s.id))
                .is_none_or(|st| st.bad(d.cycle).is_none());
        s.bps() >= cap as f64 * BINDING || unbound
    }

    /// Whether this cycle's violation (the worst fraction `worst`) is a stall of the disk
    /// that the raise on probation met (see [`PROBE_STALL_FRACTION`]): the prober, the cap
    /// it came from and the raised one.
    fn probe_stall<'a>(
        &self,
        d: &'a DeviceCycle,
        worst: f64,
    ) -> Option<(&'a ServiceLoad, u64, u64)> {
        let p = self.probing(d)?;
        let st = self.searches.get(&(d.dev, p.id))?;
        let (from, to) = (st.before_raise?, p.limit.total_bps()?);
        // Above every rate its full load was seen at, what the raise does is not known, and
        // a cliff there is as likely as a stall: the knee (seen in the random-read scenario:
        // a probe from 328 to 512 MB/s over a scan whose full load ran at 286 broke at 8.8
        // times the target, was taken for a stall, and its run again broke too).
        let harm = match st.uncapped_harm {
            Some(h) if h.rate_bps >= to as f64 => h.fraction,
            Some(_) => return None,
            None => 0.0,
        };
        let retried = st.stalled_probe.is_some_and(|sp| sp.retried);
        let excused = self
            .loads
            .get(&d.dev)
            .is_none_or(|l| l.stalls_excused(d.cycle, false));
        (worst >= PROBE_STALL_FRACTION.max(STALL_FACTOR * harm) && !retried && excused)
            .then_some((p, from, to))
    }

    /// A `disk_stall` finding for `v`, over the `level` (a fraction of its target) of the
    /// recent cycles.
    fn tell_stall(&mut self, d: &DeviceCycle, v: &ServiceLoad, level: f64, action: String) {
        self.findings.push(Finding::DiskStall {
            service: v.id,
            dev: d.dev,
            cycle: d.cycle,
            latency: LatencyNumbers::of(v),
            level_ns: v.slo_ns().map(|t| (t as f64 * level) as u64),
            others_bps: others_bps(d, v.id),
            action,
        });
    }

    /// What the one capped service on `d` did to `victim` at its full load, when it was
    /// seen uncapped at its cap's rate or faster, and cut for that victim: a violation of
    /// that victim [`STALL_FACTOR`] times over is no cap's doing. Not with two or more
    /// capped (their harms add up, seen apart: see `total_knee`).
    fn full_load_harm(
        &self,
        d: &DeviceCycle,
        victim: ServiceId,
    ) -> Option<(ServiceId, FullLoadHarm)> {
        let mut capped = d.services.iter().filter(|s| !s.limit.is_unlimited());
        let s = capped.next()?;
        if capped.next().is_some() {
            return None;
        }
        let cap = s.limit.total_bps()?;
        let harm = self.searches.get(&(d.dev, s.id))?.uncapped_harm?;
        (harm.victim == victim && harm.rate_bps >= cap as f64).then_some((s.id, harm))
    }

    /// Whether a capped service on `d` runs a raise whose probe window passed in the last
    /// [`RAISE_TRIAL_CYCLES`] cycles, its cap unchanged since.
    fn raise_on_trial(&self, d: &DeviceCycle) -> bool {
        d.services.iter().any(|s| {
            s.limit.total_bps().is_some()
                && self
                    .searches
                    .get(&(d.dev, s.id))
                    .and_then(|st| st.raise_passed_at)
                    .is_some_and(|at| {
                        d.cycle <= at + RAISE_TRIAL_CYCLES
                            && s.changed_cycle.is_none_or(|c| c <= at)
                    })
        })
    }

    /// The service on `d` whose raise is on probation, if any (at most one: see `relax`).
    fn probing<'a>(&self, d: &'a DeviceCycle) -> Option<&'a ServiceLoad> {
        d.services.iter().find(|s| {
            s.limit.total_bps().is_some()
                && self
                    .searches
                    .get(&(d.dev, s.id))
                    .is_some_and(|st| st.before_raise.is_some())
        })
    }

    /// The victim violates and nobody else can be cut.
    fn alone(&mut self, d: &DeviceCycle, victim: &ServiceLoad) -> Vec<Decision> {
        let h = self.devices.entry(d.dev).or_default();
        h.alone += 1;
        let streak = match h.alone_victim {
            Some((id, n)) if id == victim.id => n + 1,
            _ => 1,
        };
        h.alone_victim = Some((victim.id, streak));
        if h.alone < SELF_BLAME_CYCLES {
            return vec![];
        }
        let others_bps = others_bps(d, victim.id);
        let own_queue = victim.mean_inflight > 1.5;
        // Its requests would wait in that cap, unseen where the probe does not time it.
        let cut_own = own_queue && d.throttle_wait_timed && streak >= SELF_BLAME_CYCLES;
        if h.first_told(victim.id) {
            let reason = if others_bps < 1e6 {
                "nobody else loads the device: the target is below what the service gets alone"
            } else {
                "no other service can be cut: each runs at or under the least cap the policy sets (its floor, its rate target, or 1 MiB/s), is under its own target, or is a latency service the policy may not cut, and those with room carry under a twentieth of the device together"
            };
            let action = if cut_own {
                "cut the service's own concurrency".into()
            } else if own_queue && d.throttle_wait_timed {
                format!("cut the service's own concurrency once it is the worst for {SELF_BLAME_CYCLES} cycles in a row")
            } else if own_queue {
                "none: the wait in a cap of its own concurrency would not be in its latency (kernel_features.throttle_wait_timed is false)".into()
            } else {
                "none: nothing left to cut".into()
            };
            self.findings
                .push(slo_infeasible(d, victim, action, reason.into()));
        }
        let mut out = vec![];
        if let (Some(slo), Some(l)) = (victim.slo_ns(), victim.judged_latency()) {
            if cut_own && victim.can_change(d.cycle) {
                let p = victim.mean_inflight;
                let next = pine_concurrency_step(p, l as f64, slo as f64);
                let cause = victim_cause(base_cause(d, victim), victim);
                out.extend(cap_concurrency(
                    victim,
                    d.dev,
                    next,
                    format!("no other service loads the device: its own concurrency {p:.1} -> {next:.1}"),
                    cause,
                ));
            }
        }
        out
    }
}

impl Policy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn forget_service(&mut self, id: ServiceId) {
        self.searches.retain(|&(_, s), _| s != id);
        self.latency.retain(|&(_, s), _| s != id);
        for h in self.devices.values_mut() {
            h.alone_victim = h.alone_victim.filter(|&(s, _)| s != id);
            h.told_infeasible.retain(|&s| s != id);
            // Whose bursts they were is not kept: any service gone ends them.
            h.bursts = None;
        }
        for g in self.light.values_mut() {
            g.forget(id);
        }
    }

    fn findings(&mut self) -> Vec<Finding> {
        std::mem::take(&mut self.findings)
    }

    fn decide(&mut self, d: &DeviceCycle) -> Vec<Decision> {
        let last_change = regime_start(d);
        let stalled = worst_latency_service(d);
        let worst = stalled.map_or(0.0, |(_, f)| f);
        let mut load = DeviceLoad::of(d, worst);
        let binding = load.binding;
        // Judged before any service is. During a probe only beyond what the full load did
        // (otherwise a raise that broke is the raise's fault; see `probe_stall`).
        let full_load = stalled
            .filter(|&(_, f)| f > 1.0)
            .and_then(|(v, _)| self.full_load_harm(d, v.id));
        let stall = self
            .loads
            .get(&d.dev)
            .zip(self.devices.get(&d.dev))
            .and_then(|(loads, h)| loads.stall(h, &load, full_load))
            .filter(|s| {
                s.beyond_full_load.is_some()
                    || (self.probing(d).is_none()
                        && !self.light_probing(d.dev)
                        && !self.raise_on_trial(d))
            });
        let probe_stall = stall
            .is_none()
            .then(|| self.probe_stall(d, worst))
            .flatten();
        if stall.is_some() || probe_stall.is_some() {
            load.worst = None;
        }
        let probing = self.probing(d).is_some() || self.light_probing(d.dev);
        let h = self.devices.entry(d.dev).or_default();
        let spends = probe_stall.is_none() && stall.is_none_or(|s| s.beyond_full_load.is_none());
        h.note_changes(d);
        h.drop_stale_bursts(last_change, probing);
        h.record(d, load.worst, spends);
        self.loads.entry(d.dev).or_default().record(load);
        if !binding {
            h.unsteady_at = d.cycle;
            // Bursts are the aggressor's under a cap it fills: gone with it (seen in run
            // AF's on/off mix: a model from the last phase held a probe back in the next,
            // where the reader ran at 0.02-0.13 of its target).
            h.bursts = None;
        }
        h.measure_noise(last_change.max(h.unsteady_at + 1));
        if worst > 0.0 && stall.is_none() && probe_stall.is_none() {
            // A cycle another service's change or probe moved (a raise on probation, any
            // limit set or lifted in the last two cycles) is that one's point, not this
            // cap's: read as this cap's, it bends the slope that says whether the cap sits
            // on a plateau (seen in paper 001's mix, runs AV-AX: ingest's probes put db at
            // 0.98-1.25 under backup's unchanged cap).
            // One pass, not every pair: a device may carry thousands of services.
            let unsettled: Vec<ServiceId> = d
                .services
                .iter()
                .filter(|s| {
                    d.cycle < window_start(s)
                        || self
                            .searches
                            .get(&(d.dev, s.id))
                            .is_some_and(|st| st.before_raise.is_some())
                })
                .map(|s| s.id)
                .take(2)
                .collect();
            let (total, _) = capped_total(d);
            let points: Vec<ServiceId> = d
                .services
                .iter()
                .filter(|s| {
                    s.limit.total_bps().is_some()
                        && d.cycle >= window_start(s)
                        && unsettled.iter().all(|&o| o == s.id)
                })
                .map(|s| s.id)
                .collect();
            for id in points {
                let fit = &mut self.searches.entry((d.dev, id)).or_default().fit;
                fit.push_back(((total as f64).ln(), worst.ln()));
                while fit.len() > FIT_CYCLES {
                    fit.pop_front();
                }
            }
        }
        self.record_latency(d, stall.is_some() || probe_stall.is_some());
        self.confirm(d);
        // The latency service furthest over its target names the stall.
        if let (Some(stall), Some((v, _))) = (stall, stalled) {
            let action = match stall.beyond_full_load {
                Some(fraction) => format!(
                    "no cut: over {STALL_FACTOR:.0}x what the capped service's full load did ({fraction:.1}x its target), which no cap makes; it spends no budget and fails no probe; after {STALL_MAX_RUN} in a row or {STALL_MAX_WINDOW_BEYOND_FULL_LOAD} in {NOISE_WINDOW} cycles, violations are judged as harm again"
                ),
                None => format!(
                    "no cut: a violation that holds back raises while it is in the last {NOISE_WINDOW} cycles, but no verdict on the caps; after {STALL_MAX_RUN} in a row or {STALL_MAX_WINDOW} in {NOISE_WINDOW} cycles, violations are judged as harm again"
                ),
            };
            self.tell_stall(d, v, stall.level, action);
            return vec![];
        }
        if let (Some((p, from, to)), Some((v, _))) = (probe_stall, stalled) {
            self.searches
                .entry((d.dev, p.id))
                .or_default()
                .stalled_probe = Some(StalledProbe {
                from,
                to,
                retried: false,
            });
            // Told against the recent cycles' level (the stall's own is not recorded).
            let level = self
                .devices
                .get(&d.dev)
                .and_then(|h| h.level_since(0))
                .map_or(0.0, |(mean, _)| mean.exp());
            self.tell_stall(d, v, level, format!(
                "{} back from its probe at {:.0} MB/s to {:.0} MB/s, but no knee there: the same probe runs again once {PROBE_CYCLES} cycles are clean, and only a second failure is the knee",
                p.name,
                to as f64 / 1e6,
                from as f64 / 1e6
            ));
            let why = format!(
                "a raise to {:.0} MB/s met a stall of the disk ({} at {:.1}x its target): back to the last cap that held, {:.0} MB/s, and the raise is tried again",
                to as f64 / 1e6,
                v.name,
                worst,
                from as f64 / 1e6
            );
            let cause = victim_cause(base_cause(d, p), v);
            return self.fall_back(d, p, from, why, cause);
        }
        let victim = d
            .services
            .iter()
            .filter(|s| s.violating())
            .max_by(|a, b| a.vio().unwrap_or(0.0).total_cmp(&b.vio().unwrap_or(0.0)));
        let Some(victim) = victim else {
            let h = self.devices.entry(d.dev).or_default();
            h.not_alone();
            h.told_infeasible.clear();
            return self.relax(d);
        };
        // The light group's raise on probation is the first suspect (one probe at a time on
        // a device: no single service's runs with it).
        if let Some(out) = self.light_fail_raise(d, victim) {
            self.devices.entry(d.dev).or_default().not_alone();
            return out;
        }
        // A raise on probation is the first suspect, whatever its class: the violation came
        // with it (seen: a best-effort writer cut for a throughput service's probe, which
        // broke the SLO three more cycles).
        let suspect = self.probing(d).filter(|s| s.id != victim.id);
        let aggressor = Self::aggressor(d, victim);
        // The group is cut as one (see `light_group`): when the aggressor is a latency
        // service within its SLO (the last resort, after the group) or a member of the
        // group (its cap is the group's). Not for many aggressors arriving together, each
        // over the bar: tried, on the policy-cost bench's ten services (eight writers) the
        // group gave them 282 MB/s with 5.5 % of the reader's cycles over, one search each
        // 396 MB/s and 4.0 %.
        let group_first = suspect.is_none()
            && aggressor.is_some_and(|a| {
                class_rank(a) == Some(LATENCY_RANK) || self.in_light_group(d.dev, a.id)
            });
        if group_first {
            if let Some(out) = self.light_cut(d, victim) {
                self.devices.entry(d.dev).or_default().not_alone();
                return out;
            }
        }
        if let Some(a) = suspect.or(aggressor) {
            self.devices.entry(d.dev).or_default().not_alone();
            let mut out = self.throttle(d, victim, a);
            // Aggressors that arrive together are cut together: one at a time, the second
            // waits out the first's transition and the SLO is back at the fourth cycle
            // (seen: two writers starting at once in paper 001's mix). Only uncapped ones
            // that owe nothing (best-effort, throughput above target).
            if a.limit.is_unlimited() && !out.is_empty() {
                let more: Vec<&ServiceLoad> = Self::candidates(d, victim)
                    .filter(|&(r, _, b)| {
                        r <= 1
                            && b.id != a.id
                            && b.limit.is_unlimited()
                            && !self.in_light_group(d.dev, b.id)
                    })
                    .map(|(_, _, b)| b)
                    .collect();
                for b in more {
                    out.extend(self.throttle(d, victim, b));
                }
            }
            return out;
        }
        if let Some(out) = self.light_cut(d, victim) {
            self.devices.entry(d.dev).or_default().not_alone();
            return out;
        }
        self.alone(d, victim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::sim::{SimDisk, SimService};

    /// The windows of BENCHMARKS run AF that the scatter model trimmed (fractions of the
    /// target): the bimodal reader's bursts are within the budget by the upper half; the
    /// on/off reader (one cycle over, three within 10 %) and the random-read scan's (one
    /// over, spread) are not, and their trims stand.
    #[test]
    fn the_upper_half_vetoes_only_a_trim_that_quiet_cycles_caused() {
        let logs = |f: &[f64]| f.iter().map(|x| x.ln()).collect::<Vec<_>>();
        let bimodal = [
            0.88, 0.68, 0.77, 0.71, 0.14, 0.10, 0.64, 0.19, 0.82, 0.82, 0.68,
        ];
        assert!(upper_half_within_budget(logs(&bimodal)));
        let on_off = [
            0.77, 0.81, 0.83, 0.81, 0.68, 0.79, 0.9, 0.96, 0.93, 0.66, 1.27, 0.96, 0.79,
        ];
        assert!(!upper_half_within_budget(logs(&on_off)));
        let scan = [
            0.55, 0.71, 0.41, 0.56, 0.66, 0.23, 0.97, 0.68, 0.88, 0.31, 0.26, 0.66, 0.78, 0.57,
            0.84, 0.43, 0.75, 0.91, 1.13, 0.61,
        ];
        assert!(!upper_half_within_budget(logs(&scan)));
        // The same bursts with no quiet cycle: the veto does not depend on them.
        let bursts: Vec<f64> = bimodal.iter().copied().filter(|&f| f > 0.5).collect();
        assert!(upper_half_within_budget(logs(&bursts)));
        // Too few cycles to say anything.
        assert!(!upper_half_within_budget(logs(&[0.1, 0.1, 0.1, 0.1])));
    }

    /// BENCHMARKS run AH, writer repeat 2: under 324 MB/s the reader ran 0.06-0.24 of its
    /// target in the writer's gaps and 0.62-0.96 in its bursts, taking turns; a probe to
    /// 386 MB/s ran 0.66 and 0.78 and went back on the one-sigma bar (the 70 % floor). Its
    /// bursts judged as bursts (half the cycles, so each may break the target one time in
    /// five) put the bar above both probe cycles; the probe passes only once it has met as
    /// many bursts as a probe window has cycles, and the bursts are forgotten at a change
    /// that is no raise from their window. A level that moved once or moved and came back
    /// (a slow spell), bursts far under the target and a random-read scan's wide scatter
    /// are no bursts.
    #[test]
    fn a_bimodal_readers_probe_is_judged_by_its_bursts() {
        let logs = |f: &[f64]| f.iter().map(|x| x.ln()).collect::<Vec<_>>();
        let held = [
            0.62, 0.07, 0.17, 0.62, 0.10, 0.79, 0.96, 0.14, 0.24, 0.66, 0.10, 0.71, 0.62, 0.06,
            0.75, 0.79, 0.09, 0.11,
        ];
        let b = BurstMode::of(&logs(&held), 2).expect("bimodal");
        assert_eq!(b.count, 9);
        let mut h = DeviceHistory {
            noise_sigma: Some(std_dev(&logs(&held))),
            ..Default::default()
        };
        assert_eq!(h.near_miss(), NEAR_MISS_FLOOR, "one sigma over both modes");
        h.bursts = Some(b);
        println!(
            "burst sigma {:.3}, z {:.2}, bar {:.3}",
            b.sigma,
            b.z,
            h.near_miss()
        );
        assert!(h.near_miss() > 0.78, "bar {:.3}", h.near_miss());
        // The probe's window from cycle 20: two quiet cycles, and one lifted over the gap
        // but under the lowest burst, have not met the bursts; two at their level have,
        // and a full window with fewer has.
        for (c, f) in [(20, 0.1), (21, 0.12), (22, 0.45)] {
            h.fractions.push_back((c, f));
        }
        assert!(!h.bursts_met(20, 22));
        h.fractions.push_back((23, 0.66));
        assert!(!h.bursts_met(20, 23));
        h.fractions.push_back((24, 0.78));
        assert!(h.bursts_met(20, 24));
        h.fractions.retain(|&(c, _)| c < 24);
        assert!(h.bursts_met(20, 20 + NOISE_WINDOW - 1));
        // The raise (cycle 18, window from 20) on probation keeps them; once it is no
        // longer on probation, or after a cut, they are gone.
        h.drop_stale_bursts(2, false);
        assert!(h.bursts.is_some(), "their own window");
        h.drop_stale_bursts(20, true);
        assert!(h.bursts.is_some());
        h.drop_stale_bursts(20, false);
        assert!(h.bursts.is_none());
        // A slow spell that ended under one cap (two levels, one turn), and one inside
        // the window (two turns).
        let step = [3.1, 2.8, 0.05, 0.04, 0.06, 0.05, 0.05];
        assert!(BurstMode::of(&logs(&step), 0).is_none());
        let spell = [0.05, 0.04, 0.06, 3.1, 2.8, 0.05, 0.04, 0.06];
        assert!(BurstMode::of(&logs(&spell), 0).is_none());
        // Bursts at a tenth of the target.
        let low: Vec<f64> = held.iter().map(|f| f / 8.0).collect();
        assert!(BurstMode::of(&logs(&low), 0).is_none());
        let scan = [
            0.55, 0.71, 0.41, 0.56, 0.66, 0.23, 0.97, 0.68, 0.88, 0.31, 0.26, 0.66, 0.78, 0.57,
            0.84, 0.43, 0.75, 0.91, 1.13, 0.61,
        ];
        assert!(BurstMode::of(&logs(&scan), 0).is_none());
        // One slow cycle among quiet ones is an outlier, not a mode.
        let outlier = [0.1, 0.12, 0.9, 0.11, 0.1, 0.13];
        assert!(BurstMode::of(&logs(&outlier), 0).is_none());
    }

    /// One cycle over the target far above a tight body is left out of the scatter model;
    /// one over the target within a wide scatter (a random-read scan's, sigma ~0.35 on the
    /// test disk) stays, as do two.
    #[test]
    fn only_a_lone_violation_far_above_the_others_leaves_the_scatter_model() {
        let stall = [-0.2, -0.25, -0.18, -0.22, -0.21, -0.19, 0.9];
        let mut logs = stall.to_vec();
        let sd = leave_out_lone_outlier(&mut logs).expect("a stall over a tight body");
        assert_eq!(logs, stall[..6].to_vec());
        assert!((0.02..0.04).contains(&sd), "{sd}");

        let scan = [-0.9, -0.2, -0.6, -0.35, -0.7, -0.45, 0.1];
        let mut logs = scan.to_vec();
        assert_eq!(leave_out_lone_outlier(&mut logs), None);
        assert_eq!(logs, scan.to_vec());

        let two = [-0.2, -0.25, -0.18, -0.22, 0.7, -0.19, 0.9];
        let mut logs = two.to_vec();
        assert_eq!(leave_out_lone_outlier(&mut logs), None);
        assert_eq!(logs, two.to_vec());

        // Too few others to measure their scatter.
        let mut logs = vec![-0.2, -0.25, -0.18, 0.9];
        assert_eq!(leave_out_lone_outlier(&mut logs), None);
    }

    /// The z of a normal's upper tail, as the bars use it.
    #[test]
    fn the_normal_quantile_matches_the_tables() {
        for (p, z) in [(0.1, Z_TENTH), (0.05, Z_TRIM), (0.2, 0.8416), (0.5, 0.0)] {
            assert!(
                (normal_upper_quantile(p) - z).abs() < 1e-3,
                "{p}: {}",
                normal_upper_quantile(p)
            );
        }
    }

    /// The doubling search after an arrival (no knee known) extends the line through the
    /// p99.9 of the cap it was raised from and this one's: CI's container run, a writer at 0.01 of the
    /// target under 147 MB/s and 0.25 under 295, doubled to 589 and put the reader at 8-12
    /// times its target; the line stops at the target, ~400 MB/s. On the latency floor
    /// (no slope) it doubles; at the aim already, it does not raise.
    #[test]
    fn a_doubling_search_stops_where_the_line_reaches_the_target() {
        let mb = 1_000_000u64;
        let search = |below: f64, now: f64, short_of_doubling: bool| {
            Search {
                knee_unknown: true,
                raised_from: Some(RaisedFrom {
                    cap: 147 * mb,
                    level: below.ln(),
                    short_of_doubling,
                }),
                ..Default::default()
            }
            .double_toward(295 * mb, Some((now.ln(), 3)))
        };
        let Some(DoublingStep::Line(steep)) = search(0.01, 0.25, false) else {
            panic!("no raise on the line");
        };
        assert!((380 * mb..420 * mb).contains(&steep), "{} MB/s", steep / mb);
        assert_eq!(
            search(0.01, 0.012, false),
            Some(DoublingStep::Double(590 * mb)),
            "on the floor: double"
        );
        assert_eq!(search(0.3, 0.98, false), None, "at the target already");
        // Raised on the line to here, and the line falls: noise, a creep.
        assert_eq!(
            search(0.48, 0.13, true),
            Some(DoublingStep::Creep((295.0 * 1e6 * CREEP_FAR_FACTOR) as u64))
        );
        assert_eq!(
            search(0.48, 0.13, false),
            Some(DoublingStep::Double(590 * mb))
        );
        // A creep goes no further than the line's last step: 280 -> 295 MB/s (5 %), flat.
        let near = Search {
            knee_unknown: true,
            raised_from: Some(RaisedFrom {
                cap: 280 * mb,
                level: 0.27f64.ln(),
                short_of_doubling: true,
            }),
            ..Default::default()
        }
        .double_toward(295 * mb, Some((0.27f64.ln(), 3)));
        let Some(DoublingStep::Creep(to)) = near else {
            panic!("no creep: {near:?}");
        };
        assert!(
            (310 * mb..312 * mb).contains(&to),
            "a creep to {} MB/s after a 5 % step",
            to / mb
        );
        // Without a cap it was raised from, under this one, there is no line.
        let first = Search::default().double_toward(295 * mb, Some((0.25f64.ln(), 3)));
        assert_eq!(first, Some(DoublingStep::Double(590 * mb)));
    }

    fn pair() -> SimDisk {
        SimDisk::new(vec![
            SimService::latency("reader", 5.0, 1.0),
            SimService::writer("writer", SloClass::BestEffort, 2400.0, 5),
        ])
    }

    /// Paper 001's aggressors next to a QD1 reader (5 ms): `backup` (best-effort) and
    /// `ingest` (throughput, 100 MB/s), both writing 1200 MB/s from cycle `start`.
    fn db_and_two_writers(start: u64) -> SimDisk {
        let rate_bps = 100_000_000;
        SimDisk::new(vec![
            SimService::latency("db", 5.0, 1.0),
            SimService::writer("backup", SloClass::BestEffort, 1200.0, start),
            SimService::writer("ingest", SloClass::Throughput { rate_bps }, 1200.0, start),
        ])
    }

    /// Paper 001's mix (see [`db_and_two_writers`]) on a noisy disk of `seed`, and a
    /// fresh policy.
    fn noisy_mix(seed: u64) -> (SimDisk, Adaptive) {
        let mut disk = db_and_two_writers(5);
        disk.noise_seed = Some(seed);
        (disk, Adaptive::default())
    }

    /// The hold of futile cuts is the cap they held as it was set then: the same value set
    /// again later (a lift, then a return to the cap that held) is a new cap, judged anew.
    #[test]
    fn a_futile_cut_hold_ends_when_its_cap_is_set_again_even_to_the_same_value() {
        let mut writer = pair().step().services.remove(1);
        writer.limit.wbps = Some(100_000_000);
        writer.changed_cycle = Some(30);
        let st = Search {
            futile_cuts: Some(FutileCuts {
                cap: 100_000_000,
                set_at: Some(30),
                level: 0.0,
            }),
            ..Search::default()
        };
        assert!(st.futile_at(&writer).is_some(), "the held cap is not held");
        writer.changed_cycle = Some(55);
        assert!(
            st.futile_at(&writer).is_none(),
            "a cap set again still held"
        );
        writer.changed_cycle = Some(30);
        writer.limit.wbps = Some(90_000_000);
        assert!(st.futile_at(&writer).is_none(), "another cap held");
    }

    fn writer_cap(d: &SimDisk) -> Option<u64> {
        d.services[1].limit.total_bps()
    }

    /// Whether `ds` cut a cap under `cap` for a reason that says `why`.
    fn cuts_under(ds: &[Decision], cap: u64, why: &str) -> bool {
        ds.iter()
            .any(|d| d.to.is_some_and(|to| to < cap) && d.reason.contains(why))
    }

    /// The pair after 120 cycles, the writer's cap settled: (disk, policy, cap).
    fn settled_pair() -> (SimDisk, Adaptive, u64) {
        let mut disk = pair();
        let mut p = Adaptive::default();
        disk.run(&mut p, 120);
        let cap = writer_cap(&disk).expect("capped");
        (disk, p, cap)
    }

    /// The pair with a writer's curve under a cliff (the reader flat far under its target up
    /// to the knee, then many times over it) after 120 cycles, the writer (400 MB/s) capped:
    /// (disk, policy, cap).
    fn settled_under_a_cliff() -> (SimDisk, Adaptive, u64) {
        let mut disk = pair();
        disk.smooth_curve = Some((300.0, 30.0));
        disk.services[1].demand_bps = 400e6;
        let mut p = Adaptive::default();
        disk.run(&mut p, 120);
        let cap = writer_cap(&disk).expect("capped");
        (disk, p, cap)
    }

    /// Gives the writer a knee found just now three times over `cap`, and runs until the
    /// raise half-way to it (at most 6 cycles): the raised cap.
    fn raise_toward_far_knee(disk: &mut SimDisk, p: &mut Adaptive, cap: u64) -> u64 {
        let st = p.searches.get_mut(&(1, 1)).expect("searched");
        st.knee = Some(Knee::found(None, cap * 3, disk.cycle, None));
        (0..6)
            .find_map(|_| {
                let (_, ds) = disk.run(p, 1).remove(0);
                ds.iter().find_map(|d| d.to.filter(|&to| to > cap))
            })
            .expect("no raise toward the far knee: the test saw nothing")
    }

    /// The disk slows so that the settled cap runs the reader just over its target; runs
    /// until the cut for the broken budget (at most [`NOISE_WINDOW`] cycles): its cap.
    fn budget_cut_after_a_slowdown(disk: &mut SimDisk, p: &mut Adaptive) -> u64 {
        disk.knee_scale = scale_for(disk, 1.03, 1.1);
        (0..NOISE_WINDOW)
            .find_map(|_| {
                let (_, ds) = disk.run(p, 1).remove(0);
                ds.iter()
                    .find(|d| d.reason.contains(BUDGET_CUT_REASON))
                    .and_then(|d| d.to)
            })
            .expect("no cut for the broken budget: the test saw nothing")
    }

    /// A settled pair, a budget cut after a slowdown, then the slow spell over: the cut's cap
    /// runs the reader at a fifth of its target for `cycles` cycles (its transition first),
    /// with no decision. The disk, the policy and the cut's cap.
    fn budget_cut_then_far_under(cycles: u64) -> (SimDisk, Adaptive, u64) {
        let (mut disk, mut p, cap) = settled_pair();
        let cut = budget_cut_after_a_slowdown(&mut disk, &mut p);
        assert!(cut < cap);
        disk.knee_scale = disk
            .knee_scale_for_next((1000..20000).step_by(50), 0.15..0.3)
            .expect("a faster disk that puts the reader at a fifth of its target");
        let held = disk.run(&mut p, cycles);
        assert!(held.iter().all(|(_, d)| d.is_empty()), "{held:?}");
        (disk, p, cut)
    }

    /// The knee scale at which the writer at its current cap puts the reader at `lo..hi` of
    /// its target.
    fn scale_for(disk: &SimDisk, lo: f64, hi: f64) -> f64 {
        disk.knee_scale_for(100..2000, 5, lo..hi)
            .expect("a knee scale that puts the reader there")
    }

    /// As [`scale_for`], for the next cycle as the disk will run it (a transition's rates
    /// included), from a knee scale of 0.005 up.
    fn next_scale_for(disk: &SimDisk, lo: f64, hi: f64) -> f64 {
        disk.knee_scale_for_next(5..3000, lo..hi)
            .expect("a knee scale that puts the reader there next cycle")
    }

    /// Under a cliff (the reader flat far under its target up to the knee, then many times
    /// over it: a random-read scan's curve on the test disk), a settled cap whose fit reads
    /// flat is cut at two violations in ten, as anywhere, not three (seen in the random-read
    /// scenario: 0.55-0.7 ms against 3 at 245 MB/s, then 6.1, 6.5 and 10.9 ms before the
    /// cut). The plateau's case, the reader near its target at every cap, is
    /// `on_a_plateau_two_violations_in_ten_cut_a_settled_cap`.
    #[test]
    fn under_a_cliff_two_violations_in_ten_cut_a_cap_whose_fit_reads_flat() {
        let (mut disk, mut p, _) = settled_under_a_cliff();
        // The disk a little faster: the reader at 0.15 of its target under the settled cap.
        disk.knee_scale = 1.05;
        let quiet = disk.run(&mut p, NOISE_WINDOW);
        let cap = writer_cap(&disk).expect("capped");
        assert!(quiet.iter().all(|(c, d)| {
            d.is_empty() && c.services[0].p999_ns.is_some_and(|p| p < 1_000_000)
        }));
        // The fit of a search that came up from far under the cliff: caps from 20 MB/s to
        // this one, the reader flat at a tenth of its target under all of them.
        let st = p.searches.get_mut(&(1, 1)).expect("searched");
        st.fit = (0..FIT_CYCLES)
            .map(|i| {
                let x = 20e6 * (cap as f64 / 20e6).powf(i as f64 / (FIT_CYCLES - 1) as f64);
                (x.ln(), 0.1f64.ln())
            })
            .collect();
        assert!(st.slope().is_some_and(|k| k < FUTILE_SLOPE));
        // A slowdown that puts the settled cap at 1.5-2.5 times the target.
        let scale = disk
            .knee_scale_for((500..1000).rev(), 5, 1.5..2.5)
            .expect("a slowdown that puts the reader at twice its target");
        let mut h = vec![];
        for slow in [true, false, false, true] {
            disk.knee_scale = if slow { scale } else { 1.05 };
            h.extend(disk.run(&mut p, 1));
        }
        assert!(h[0].0.services[0].violating() && h[3].0.services[0].violating());
        assert!(h[..3].iter().all(|(_, d)| d.is_empty()), "{h:?}");
        assert!(
            h[3].1.iter().any(|d| d.to.is_some_and(|to| to < cap)),
            "the second violation in ten under {cap} cut nothing: {:?}",
            h[3].1
        );
    }

    /// A budget cut that held (the reader far under its target in its window) is not cut
    /// again at one violation: that one is scatter, as under any settled cap; a second in
    /// the window still cuts.
    #[test]
    fn a_budget_cut_that_held_is_not_cut_again_at_one_violation() {
        let (mut disk, mut p, cut) = budget_cut_then_far_under(1 + PROBE_CYCLES);
        let quiet = disk.knee_scale;
        // One cycle of scatter over the target.
        disk.knee_scale = scale_for(&disk, 1.03, 1.1);
        let spike = disk.run(&mut p, 1).remove(0);
        assert!(spike.0.services[0].violating());
        assert!(
            spike.1.iter().all(|d| d.to.is_none_or(|to| to >= cut)),
            "one violation under a cut that held cut it again: {:?}",
            spike.1
        );
        // A second one in the window cuts.
        disk.knee_scale = quiet;
        let mut h = disk.run(&mut p, 1);
        disk.knee_scale = scale_for(&disk, 1.03, 1.1);
        h.extend(disk.run(&mut p, 1));
        assert!(h[1].0.services[0].violating());
        assert!(
            h.iter()
                .flat_map(|(_, d)| d)
                .any(|d| d.to.is_some_and(|to| to < cut)),
            "a second violation under the cut cut nothing: {h:?}"
        );
    }

    /// A marginal violation in the second full cycle under a budget cut whose transition and
    /// first full cycle ran the reader far under its target is the disk's scatter: the cap
    /// stays. One far over the target there is still the cut's failure. Seen on the test
    /// disk (BENCHMARKS run BN, writer, repeat 1): a cut to 106 MB/s, the reader at 0.36 and
    /// 0.27 of its target, cut again to 74 MB/s at one cycle at 1.17.
    #[test]
    fn a_marginal_violation_right_after_a_budget_cut_that_runs_far_under_cuts_nothing() {
        for (over, cuts) in [(1.03..1.1, false), (1.5..1.7, true)] {
            // The transition and the first full cycle far under.
            let (mut disk, mut p, cut) = budget_cut_then_far_under(PROBE_CYCLES);
            disk.knee_scale = scale_for(&disk, over.start, over.end);
            let (c, ds) = disk.run(&mut p, 1).remove(0);
            assert!(c.services[0].violating(), "{c:?}");
            let cut_again = ds.iter().any(|d| d.to.is_some_and(|to| to < cut));
            assert_eq!(
                cut_again, cuts,
                "a violation at {over:?} of the target right after a cut to {cut} that ran \
                 far under: {ds:?}"
            );
        }
    }

    /// On a plateau the target sits on (the fit flat at 0.85 of the target from half this
    /// cap to twice it), the budget is still one violating cycle in ten: the second cuts
    /// the settled cap, as anywhere. Seen on the test disk (BENCHMARKS run BG, writer,
    /// repeat 2): the reader at 0.8-0.9 of its target with the writer anywhere from 548 to
    /// 1569 MB/s; its two violations in ten were tolerated as the disk's own scatter, and 9
    /// of 49 steady cycles violated at 691 MB/s, where a static 400 MB/s kept the budget.
    #[test]
    fn on_a_plateau_two_violations_in_ten_cut_a_settled_cap() {
        let (mut disk, mut p, cap) = settled_pair();
        let calm = disk.knee_scale;
        let st = p.searches.get_mut(&(1, 1)).expect("searched");
        st.fit = (0..FIT_CYCLES)
            .map(|i| {
                let x = cap as f64 / 2.0 * 4f64.powf(i as f64 / (FIT_CYCLES - 1) as f64);
                (x.ln(), 0.85f64.ln())
            })
            .collect();
        assert!(st.slope().is_some_and(|k| k < FUTILE_SLOPE));
        // Two cycles of the plateau's scatter just over the target, three cycles apart.
        let over = scale_for(&disk, 1.03, 1.1);
        let mut h = vec![];
        for slow in [true, false, false, true] {
            disk.knee_scale = if slow { over } else { calm };
            h.extend(disk.run(&mut p, 1));
        }
        assert!(h[0].0.services[0].violating() && h[3].0.services[0].violating());
        assert!(h[..3].iter().all(|(_, d)| d.is_empty()), "{h:?}");
        assert!(
            cuts_under(&h[3].1, cap, BUDGET_CUT_REASON),
            "the second violation in ten under {cap} on a plateau cut nothing: {:?}",
            h[3].1
        );
    }

    /// Runs the settled pair until its cap has been left alone for a full window (at most
    /// 60 cycles): the cap.
    fn quiet_settled_pair(disk: &mut SimDisk, p: &mut Adaptive) -> u64 {
        let mut quiet = 0;
        for _ in 0..60 {
            let (_, ds) = disk.run(p, 1).remove(0);
            quiet = if ds.is_empty() { quiet + 1 } else { 0 };
            if quiet > NOISE_WINDOW {
                return writer_cap(disk).expect("capped");
            }
        }
        panic!("the settled cap kept changing: the test saw nothing");
    }

    /// Runs one cycle in which a stall of 14 ms puts the reader at 3-4 times its target (see
    /// the cliff test above): its cycle and decisions.
    fn jump_to_3_to_4_times(
        disk: &mut SimDisk,
        p: &mut Adaptive,
    ) -> Vec<(DeviceCycle, Vec<Decision>)> {
        let h = disk.run_stalled(p, 14e6);
        let f = h[0].0.services[0].p999_ns.unwrap() as f64 / 5e6;
        assert!((3.0..4.0).contains(&f), "the jump at {f:.2} of the target");
        h
    }

    /// One cycle at 3-4 times the target (a stall of the disk short of
    /// [`PROBE_STALL_FRACTION`]) under a settled cap whose cycles before it were clean, the
    /// writer at the same rate: the one violation in ten the budget allows, no cut. A second
    /// in the window cuts. Seen on the test disk (BENCHMARKS runs DH, DJ): the reader at
    /// 0.1-0.4 of its target, one cycle at 3.1-3.3 times, cut to 70 % at once.
    #[test]
    fn a_lone_jump_far_over_the_target_under_a_clean_settled_cap_waits_for_a_second() {
        let (mut disk, mut p, _) = settled_pair();
        let cap = quiet_settled_pair(&mut disk, &mut p);
        let h = jump_to_3_to_4_times(&mut disk, &mut p);
        assert!(h[0].1.is_empty(), "{:?}", h[0].1);
        let h = disk.run(&mut p, 2);
        assert!(h.iter().all(|(_, ds)| ds.is_empty()), "{h:?}");
        assert_eq!(writer_cap(&disk), Some(cap));
        let h = disk.run_stalled(&mut p, 14e6);
        assert!(
            cuts_under(&h[0].1, cap, BUDGET_CUT_REASON),
            "a second violation in ten under {cap} cut nothing: {:?}",
            h[0].1
        );
    }

    /// The same jump after a near miss under the cap is no lone jump of the disk: the cap
    /// ran at the target's edge, and the violation far over it cuts at once.
    #[test]
    fn a_jump_far_over_the_target_after_a_near_miss_cuts_a_settled_cap_at_once() {
        let (mut disk, mut p, _) = settled_pair();
        let cap = quiet_settled_pair(&mut disk, &mut p);
        let calm = disk.knee_scale;
        disk.knee_scale = scale_for(&disk, 0.93, 0.97);
        let near = disk.run(&mut p, 1);
        assert!(!near[0].0.services[0].violating());
        assert!(near[0].1.is_empty(), "{:?}", near[0].1);
        assert_eq!(
            p.devices[&1].last_near,
            Some(near[0].0.cycle),
            "the cycle at 0.93-0.97 of the target was no near miss by the policy's bar"
        );
        disk.knee_scale = calm;
        let h = jump_to_3_to_4_times(&mut disk, &mut p);
        assert!(
            cuts_under(&h[0].1, cap, "times its target"),
            "a violation far over the target after a near miss under {cap} cut nothing: {:?}",
            h[0].1
        );
    }

    /// The same jump in the cycle a light writer next to the capped one (5 MB/s, under the
    /// candidate bar) grows to 60 MB/s is no lone jump of the disk: the load grew with it,
    /// and the violation far over the target cuts the settled cap at once.
    #[test]
    fn a_jump_far_over_the_target_as_the_load_grows_cuts_a_settled_cap_at_once() {
        let mut disk = pair();
        disk.services
            .push(SimService::writer("logger", SloClass::BestEffort, 5.0, 0));
        let mut p = Adaptive::default();
        disk.run(&mut p, 120);
        let cap = quiet_settled_pair(&mut disk, &mut p);
        assert!(disk.services[2].limit.is_unlimited());
        disk.services[2].demand_bps = 60e6;
        let h = jump_to_3_to_4_times(&mut disk, &mut p);
        assert!(
            h[0].1.iter().any(|d| d.service == 1
                && d.to.is_some_and(|to| to < cap)
                && d.reason.contains("times its target")),
            "a violation far over the target as the load grew cut nothing under {cap}: {:?}",
            h[0].1
        );
    }

    /// A window trim after which the window stays as close to the target is not repeated:
    /// on a flat curve (the reader's p99.9 at 0.89-0.96 of its target with the writer
    /// anywhere from 590 to 1170 MB/s) one trim shows it, and the writer keeps the rest.
    /// Seen on the v2 guest (BENCHMARKS run CZ, repeat 3): four window trims in a row,
    /// 1258 -> 756 MB/s, the reader's window at 90-93 % of its target under every one.
    /// Once the writer rests and its cap is lifted, the measurement is forgotten.
    #[test]
    fn on_a_flat_curve_a_window_trim_that_bought_nothing_is_not_repeated() {
        let mut disk = pair();
        // Others' traffic adds 4.3 ms at 950 MB/s and 4.7 ms at 1900 (2^0.129 = 1.09).
        disk.smooth_curve = Some((15.0, 0.129));
        let mut p = Adaptive::default();
        let h = disk.run(&mut p, 150);
        let trims: Vec<(u64, u64)> = h
            .iter()
            .flat_map(|(c, ds)| ds.iter().map(move |d| (c, d)))
            .filter(|(_, d)| d.reason.contains("of every I/O in the last"))
            .map(|(c, d)| (c.cycle, d.to.expect("a trim sets a cap")))
            .collect();
        assert!(!trims.is_empty(), "no window trim: the test saw nothing");
        // The reader near its target but never over it after the arrival's cut.
        assert!(h[7..].iter().all(|(c, _)| {
            let r = &c.services[0];
            r.p999_ns.is_some_and(|p| (4e6..5e6).contains(&(p as f64)))
        }));
        // One trim shows the curve flat; the knee's trust running out gives back 10 % at
        // a time, which runs as close to the target, and is kept.
        assert_eq!(trims.len(), 1, "window trims (cycle, to): {trims:?}");
        // And the writer never runs under the first trim's cap.
        let least = h[trims[0].0 as usize + 2..]
            .iter()
            .filter_map(|(c, _)| c.services[1].limit.total_bps())
            .min();
        assert!(
            least >= Some(trims[0].1),
            "the writer at {least:?} under the first trim's {trims:?}"
        );
        // It climbed the plateau past where the trim began.
        let top = writer_cap(&disk).expect("capped");
        let st = p.searches[&(1, 1)].window_trim.expect("the trim's record");
        assert!(top > st.from, "the writer at {top} after {st:?}");
        assert!(st.flat_up_to.is_some_and(|t| t > st.from), "{st:?}");
        // The writer rests: its cap is lifted, and the flat range with it.
        disk.services[1].demand_bps = 0.0;
        let rest = disk.run(&mut p, 2 * QUIET_CYCLES as u64 + 2);
        assert!(writer_cap(&disk).is_none(), "not lifted: {rest:?}");
        assert!(p.searches[&(1, 1)].window_trim.is_none());
    }

    #[test]
    fn a_window_trim_bought_nothing_where_its_range_ran_as_close_to_the_target() {
        let mb = 1_000_000;
        // Run CZ's repeat 3: 1677 -> 1258 MB/s at 117 % took the window to 90 %.
        let mut t = WindowTrim::new(1677 * mb, 1258 * mb, 1.17);
        t.measure(1258 * mb, 0.90);
        assert!(t.flat_up_to.is_none() && !t.futile(1258 * mb, 0.90));
        // 1258 -> 1118 MB/s at 90 % left it at 90 %.
        let trim = WindowTrim::new(1258 * mb, 1118 * mb, 0.90);
        // Nothing measured in its range yet: nothing known.
        assert!(!trim.futile(1118 * mb, 0.90));
        // Half the way to the aim (0.85) is an effect; over the target, or under a cap
        // the trim did not reach or above where it began, it measures nothing.
        for (cap, f) in [(1118, 0.85), (1118, 1.02), (973, 0.90), (1258, 0.90)] {
            let mut t = trim;
            t.measure(cap * mb, f);
            assert!(t.flat_up_to.is_none(), "{cap} MB/s at {f}");
        }
        let mut t = trim;
        t.measure(1118 * mb, 0.90);
        assert_eq!(t.flat_up_to, Some(1258 * mb));
        // Measured flat from 1118 to 1258: a window as close is no reason to trim there
        // or a step above (a give-back's cap); one over the target, under the range, or
        // past the step, still is.
        for (cap, f, futile) in [
            (1118, 0.90, true),
            (1200, 0.86, true),
            (1380, 0.95, true),
            (1118, 0.85, false),
            (1380, 1.02, false),
            (973, 0.90, false),
            (1600, 0.90, false),
        ] {
            assert_eq!(t.futile(cap * mb, f), futile, "{cap} MB/s at {f}");
        }
        // A give-back's window as close extends the range, a step at a time.
        t.measure(1380 * mb, 0.93);
        assert_eq!(t.flat_up_to, Some(1380 * mb));
        assert!(t.futile(1600 * mb, 0.90));
        t.measure(1800 * mb, 0.93);
        assert_eq!(t.flat_up_to, Some(1380 * mb));
    }

    /// After a cut for a broken budget the budget stays spent while the violations that
    /// broke it are in the window: one more violation under the cut's cap cuts again and
    /// deeper (the factors compound), not two more. Seen in CI (the container noisy
    /// neighbor, a curve flatter than the square assumes): cuts of 14, 10 and 11 % each
    /// waited for two more violations, 8 of 26 cycles violating. In the cut's transition,
    /// when the cut ran in force there (the simulator's cuts do, as the test disk's did),
    /// not a cycle later: seen in CI, a cut in force at 86 MB/s read 6.6 ms against 6 in
    /// its transition and 6.5 in the next, four violating cycles in a row.
    #[test]
    fn a_budget_cut_that_does_not_hold_is_cut_again_at_the_next_violation() {
        let (mut disk, mut p, cap) = settled_pair();
        let first = budget_cut_after_a_slowdown(&mut disk, &mut p);
        assert!(first < cap);
        // Slower still: the cut's cap runs it just over its target too.
        disk.knee_scale = scale_for(&disk, 1.03, 1.1);
        let next = disk.run(&mut p, 1).remove(0);
        let writer = &next.0.services[1];
        assert!(
            writer.changed_cycle == Some(next.0.cycle - 1)
                && writer.bps() <= first as f64 * FIXED_RATE_OVER_CAP,
            "not the cut's transition in force: {next:?}"
        );
        assert!(next.0.services[0].violating());
        let again: Vec<&Decision> = next.1.iter().collect();
        assert!(
            again.len() == 1 && again[0].reason.contains("again"),
            "the cut's cap broke its SLO in its transition, in force, and stood: {again:?}"
        );
        let (first_factor, second) = (first as f64 / cap as f64, again[0].to.unwrap());
        // A cut's factor is at most 0.9: compounded, at most 0.9 of the first.
        assert!(
            (second as f64) <= first as f64 * (first_factor * 0.9).max(GENTLE_CUT_MIN) * 1.01,
            "{cap} -> {first} -> {second}: the factors do not compound"
        );
    }

    /// A budget cut whose transition still passed much of the old rate's queue (the writer
    /// half-way back to its old rate) is not measured there: a violation in it waits for
    /// the first full cycle, which cuts again if it violates too.
    #[test]
    fn a_budget_cut_not_in_force_in_its_transition_is_judged_at_its_first_full_cycle() {
        let (mut disk, mut p, cap) = settled_pair();
        disk.cut_drain = 0.5;
        let first = budget_cut_after_a_slowdown(&mut disk, &mut p);
        assert!(first < cap);
        disk.knee_scale = scale_for(&disk, 1.03, 1.1);
        let next = disk.run(&mut p, 2);
        let transition = &next[0].0;
        assert!(
            transition.services[1].bps() > first as f64 * FIXED_RATE_OVER_CAP,
            "the transition ran in force: {transition:?}"
        );
        assert!(transition.services[0].violating());
        assert!(
            next[0].1.is_empty(),
            "a decision in a transition not in force: {next:?}"
        );
        assert!(next[1].0.services[0].violating());
        assert!(
            next[1].1.len() == 1 && next[1].1[0].reason.contains("again"),
            "the cut's cap broke its SLO in its first full cycle and stood: {:?}",
            next[1].1
        );
    }

    /// The first cycle of `h` with a cap set over `cap`.
    fn raised_over(h: &[(DeviceCycle, Vec<Decision>)], cap: u64) -> Option<u64> {
        h.iter()
            .find(|(_, ds)| ds.iter().any(|d| d.to.is_some_and(|to| to > cap)))
            .map(|(c, _)| c.cycle)
    }

    /// A cap cut for breaking the one-in-ten budget stays at the cut for two windows, though
    /// every cycle under it holds: the rate that broke did so over a window, and a probe
    /// half-way back lands where about as many cycles break (the v2 guest, BENCHMARKS run CQ:
    /// both such probes broke, two changes each). Then the search probes back as before.
    #[test]
    fn a_cap_cut_for_a_broken_budget_is_not_probed_back_for_two_windows() {
        let (mut disk, mut p, cap) = settled_pair();
        let calm = disk.knee_scale;
        let cut = budget_cut_after_a_slowdown(&mut disk, &mut p);
        let cut_at = disk.cycle;
        assert!(cut < cap);
        // The disk as before the slowdown: the cut runs the reader within its target, not
        // far under it (there the slow spell is over: see the next test).
        disk.knee_scale = calm;
        let held = disk.run(&mut p, 2 * NOISE_WINDOW - 1);
        let raised_at = |h: &[(DeviceCycle, Vec<Decision>)]| raised_over(h, cut);
        assert!(
            held.iter().all(|(c, _)| !c.services[0].violating()),
            "the cut to {cut} did not hold: violations in cycles {:?}",
            held.iter()
                .filter(|(c, _)| c.services[0].violating())
                .map(|(c, _)| c.cycle)
                .collect::<Vec<_>>()
        );
        assert!(
            raised_at(&held).is_none(),
            "raised {:?} cycles after the cut to {cut} for a broken budget at {cap}",
            raised_at(&held).map(|c| c - cut_at)
        );
        let after = disk.run(&mut p, NOISE_WINDOW);
        assert!(
            raised_at(&after).is_some(),
            "no probe back toward {cap} from {cut} in the window after two (cycles {}-{})",
            after[0].0.cycle,
            disk.cycle
        );
    }

    /// A cap cut for a broken budget that then runs the reader far under its target (the
    /// slow spell that broke the budget is over) is probed back within a window, as before
    /// the two-window wait: that is where the bandwidth is.
    #[test]
    fn a_cap_cut_for_a_broken_budget_that_runs_far_under_is_probed_back_within_a_window() {
        let (mut disk, mut p, cut) = budget_cut_then_far_under(PROBE_CYCLES);
        let h = disk.run(&mut p, NOISE_WINDOW);
        assert!(
            raised_over(&h, cut).is_some(),
            "no probe back from {cut}, far under the target, within a window (cycles {}-{})",
            h[0].0.cycle,
            disk.cycle
        );
    }

    /// A knee just over the settled cap, found after one that broke the budget further up
    /// (budget cuts 404 -> 283 -> 198 MB/s in BENCHMARKS run DD, the writer): with the disk faster, the
    /// reader far under its target, the last knee is doubted and the cap climbs, but no
    /// further than half-way to the older knee while it is trusted, where the climb's
    /// 1.25x, 1.56x and 2x steps went 181 -> 707 MB/s past both. Once the older knee's
    /// memory runs out, the climb goes on.
    #[test]
    fn a_climb_after_a_doubted_knee_stops_short_of_an_older_one_still_trusted() {
        let (mut disk, mut p, cap) = settled_under_a_cliff();
        disk.services[1].demand_bps = 3000e6;
        let older = cap * 2;
        let st = p.searches.get_mut(&(1, 1)).expect("searched");
        // Only these two knees: the search's own are its first minutes'.
        (st.knee, st.older_knees) = (None, vec![]);
        st.remember_bad(older, disk.cycle, None);
        st.knee.as_mut().expect("found").window = true;
        st.remember_bad(cap * 21 / 20, disk.cycle, None);
        assert_eq!(st.older_bad(disk.cycle, cap), Some(older));
        // The cliff moves out past both knees: the reader far under its target there.
        disk.knee_scale = 4.0;
        let h = disk.run(&mut p, BAD_MEMORY_CYCLES - 2);
        let caps: Vec<u64> = h
            .iter()
            .flat_map(|(_, ds)| ds.iter().filter_map(|d| d.to))
            .collect();
        let top = caps.iter().copied().max().unwrap_or(cap);
        assert!(
            top as f64 > cap as f64 * 1.21,
            "no climb past the doubted knee at {} from {cap}: {caps:?}",
            cap * 21 / 20
        );
        // Half-way steps toward it, the last from a cap more than KNEE_PRECISION under it.
        assert!(
            top as f64 <= older as f64 / KNEE_PRECISION.sqrt(),
            "the climb went past half-way to the older knee at {older} from {cap}: {caps:?}"
        );
        let later = disk.run(&mut p, 2 * NOISE_WINDOW);
        assert!(
            raised_over(&later, top).is_some(),
            "no raise over {top} once the older knee at {older} expired: {later:?}"
        );
    }

    /// A raise that breaks the SLO, even marginally, goes straight back to the cap that held
    /// (waiting for a second violation cost two or three violating cycles per failed probe
    /// on the test disk), and no probe follows while that violation is in the last ten
    /// cycles: probing spends the one-in-ten budget. After the search, nor while the raise
    /// and its fall-back are in the last twenty: they spent two changes.
    #[test]
    fn a_failed_probe_goes_back_on_its_first_violation_and_the_next_waits_out_the_budget() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        // Up to the first raise near the knee (under FAR_FROM_KNEE of the cap) after the
        // search found a cap that held.
        let (good, raised) = up_to_a_probe(&mut disk, &mut p, |good, raised| {
            (raised as f64) < good as f64 * FAR_FROM_KNEE
        });
        let raised_at = disk.cycle - 1;
        // The disk slows so that the raised cap is just over the target: marginal.
        disk.knee_scale = scale_for(&disk, 1.03, 1.15);
        let h = disk.run(&mut p, 3);
        let fell: Vec<&Decision> = h.iter().flat_map(|(_, d)| d).collect();
        assert_eq!(fell.len(), 1, "{fell:?}");
        assert_eq!(
            fell[0].to,
            Some(good),
            "raised to {raised}: {}",
            fell[0].reason
        );
        let failed_at = h.iter().position(|(_, d)| !d.is_empty()).unwrap();
        assert!(
            h[..=failed_at]
                .iter()
                .filter(|(c, _)| c.services[0].violating())
                .count()
                == 1,
            "the probe cost more than one violating cycle"
        );
        // Back to the disk that held at `good`: no raise until the violation leaves the
        // window, then one. The raise came from the line through the cap's p99.9 and the
        // probe that broke before, so it is within KNEE_PRECISION of `good` and the search
        // is done; a knee a third over the cap that no probe measured (one a cut found)
        // leaves room for the next probe.
        let knee = p
            .searches
            .get_mut(&(1, 1))
            .and_then(|st| st.knee.as_mut())
            .expect("the failed probe is the knee");
        knee.rate_bps = good * 4 / 3;
        knee.fraction = None;
        disk.knee_scale = 1.0;
        // The violation at cycle `failed_at` of `h` stays in the window for its next
        // NOISE_WINDOW - 1 cycles; `h` ran 3.
        let wait = disk.run(&mut p, failed_at as u64 + NOISE_WINDOW - 3);
        assert!(
            wait.iter().all(|(_, d)| d.is_empty()),
            "probed again with the budget spent: {:?}",
            wait.iter().flat_map(|(_, d)| d).collect::<Vec<_>>()
        );
        let next = disk.run(&mut p, 2 * NOISE_WINDOW);
        let probe = next
            .iter()
            .find(|(_, d)| d.iter().any(|d| d.to > Some(good)))
            .map(|(c, _)| c.cycle)
            .expect("no probe once the budgets allowed it");
        // After the search by then, and near the knee: the raise and its fall-back spent two
        // changes in the last twenty cycles.
        assert!(probe > p.devices[&1].episode_until + SEARCH_CYCLES);
        assert!(
            probe >= raised_at + 2 * NOISE_WINDOW,
            "probed at {probe}, the raise that broke at {raised_at}"
        );
    }

    /// A probe whose first cycle meets a stall of the disk (the reader at many times its
    /// target) where what the writer's full load does is not known falls back, keeps no
    /// knee there, and runs again once its window is clean; a second failure of the same
    /// probe is the knee.
    #[test]
    fn a_probe_that_meets_a_stall_of_the_disk_runs_again_and_only_a_second_failure_is_its_knee() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let (good, raised) = up_to_a_probe(&mut disk, &mut p, |_, _| true);
        // What the writer's full load does is not known (the reader had no judged p99.9
        // when the writer was cut).
        p.searches.get_mut(&(1, 1)).expect("searched").uncapped_harm = None;
        p.findings();
        // 120 ms against 5: 24 times the target, whatever the writer does.
        let h = disk.run_stalled(&mut p, 120e6);
        assert!(h[0].0.services[0].violating());
        assert_eq!(h[0].1.len(), 1, "{:?}", h[0].1);
        assert_eq!(h[0].1[0].to, Some(good), "{}", h[0].1[0].reason);
        assert!(h[0].1[0].reason.contains("stall"), "{}", h[0].1[0].reason);
        assert!(
            p.findings()
                .iter()
                .any(|f| matches!(f, Finding::DiskStall { .. })),
            "the stall is told"
        );
        assert_ne!(
            p.searches[&(1, 1)].knee.map(|k| k.rate_bps),
            Some(raised),
            "a probe that met a stall set its knee"
        );
        // The same probe again, without waiting out a budget the stall did not spend.
        let again = disk.run(&mut p, PROBE_CYCLES + 1);
        let raises: Vec<&Decision> = again.iter().flat_map(|(_, d)| d).collect();
        assert_eq!(raises.len(), 1, "{raises:?}");
        assert_eq!(raises[0].to, Some(raised), "{}", raises[0].reason);
        // It meets a stall too: now it is the knee.
        let h = disk.run_stalled(&mut p, 120e6);
        assert_eq!(h[0].1.len(), 1, "{:?}", h[0].1);
        assert_eq!(h[0].1[0].to, Some(good), "{}", h[0].1[0].reason);
        assert!(!h[0].1[0].reason.contains("stall"), "{}", h[0].1[0].reason);
        assert_eq!(p.searches[&(1, 1)].bad(disk.cycle), Some(raised));
    }

    /// A probe above every rate the aggressor's full load was seen at that breaks the SLO
    /// by a stall's size found its knee there: it falls back once, is not run again, and
    /// the half-way probe that a cap this far under the knee would get waits out the
    /// violation's window (a cliff just broke: half-way to it is no safe bet).
    #[test]
    fn a_probe_past_the_full_loads_rate_that_breaks_at_a_cliff_is_the_knee_and_the_next_waits() {
        // 40 ms against 5: 8 times the target (a random-read scan's cliff on the test
        // disk); 14 ms more: 3-4 times, over any writer's knee (under 2.9 times).
        for (stall_ns, least, most) in [(40e6, 4.0, f64::MAX), (14e6, 3.0, 4.0)] {
            let mut disk = pair();
            let mut p = Adaptive::default();
            // A raise of 1.5x or more: the cap it falls back to is far under the knee.
            let (good, raised) = up_to_a_probe(&mut disk, &mut p, |good, raised| {
                raised as f64 >= good as f64 * FAR_FROM_KNEE
            });
            // Its full load was seen at 60 % of the raised rate.
            let st = p.searches.get_mut(&(1, 1)).expect("searched");
            let harm = st.uncapped_harm.expect("the arrival's harm");
            st.uncapped_harm = Some(FullLoadHarm {
                rate_bps: raised as f64 * 0.6,
                ..harm
            });
            p.findings();
            let h = disk.run_stalled(&mut p, stall_ns);
            let f = h[0].0.services[0].p999_ns.unwrap() as f64 / 5e6;
            assert!(
                (least..most).contains(&f),
                "the break at {f:.2} of the target"
            );
            assert_eq!(h[0].1.len(), 1, "{:?}", h[0].1);
            assert_eq!(h[0].1[0].to, Some(good), "{}", h[0].1[0].reason);
            assert!(!h[0].1[0].reason.contains("stall"), "{}", h[0].1[0].reason);
            assert!(
                !p.findings()
                    .iter()
                    .any(|f| matches!(f, Finding::DiskStall { .. })),
                "the knee told as a stall"
            );
            assert_eq!(p.searches[&(1, 1)].bad(disk.cycle), Some(raised));
            let failed_at = disk.cycle - 1;
            let wait = disk.run(&mut p, NOISE_WINDOW - 1);
            let raises: Vec<&Decision> = wait.iter().flat_map(|(_, d)| d).collect();
            assert!(
                raises.is_empty(),
                "{f:.2}x: raised within {NOISE_WINDOW} cycles of the cliff at {failed_at}: {raises:?}"
            );
        }
    }

    /// Where the writer's full load was seen at the raised rate (cut in the cycle it arrived
    /// in, it ran at its full rate), a violation over three times what that load did is no
    /// raise's doing: the probe meets
    /// such stalls, even two, and stays on probation; it holds once clean cycles follow, and
    /// no knee is set. Without the rule the first stall fails it.
    #[test]
    fn a_probe_that_meets_stalls_beyond_what_the_full_load_did_stays_on_probation() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let (_, raised) = up_to_a_probe(&mut disk, &mut p, |_, _| true);
        let harm = p.searches[&(1, 1)]
            .uncapped_harm
            .expect("the arrival's harm");
        assert!(harm.rate_bps >= raised as f64, "{harm:?}");
        p.findings();
        for _ in 0..2 {
            // 120 ms against 5: 24 times the target, over three times the full load's.
            let h = disk.run_stalled(&mut p, 120e6);
            assert!(h[0].0.services[0].violating());
            assert!(h[0].1.is_empty(), "{:?}", h[0].1);
            assert!(
                p.findings()
                    .iter()
                    .any(|f| matches!(f, Finding::DiskStall { .. })),
                "the stall is told"
            );
            let h = disk.run(&mut p, 1);
            assert!(h[0].1.is_empty(), "{:?}", h[0].1);
        }
        // Confirmed within a probe window of clean cycles (then the search goes on).
        for _ in 0..=PROBE_CYCLES {
            if p.searches[&(1, 1)].good == Some(raised) {
                break;
            }
            disk.run(&mut p, 1);
        }
        let st = &p.searches[&(1, 1)];
        assert!(writer_cap(&disk) >= Some(raised));
        assert_eq!(st.good, Some(raised), "the raise held");
        assert_ne!(
            st.knee.map(|k| k.rate_bps),
            Some(raised),
            "a stall set the knee"
        );
    }

    /// A near miss in a probe's first window cycle fails it even when a stall of the disk
    /// comes before its verdict: the stall delays the verdict, it does not hide the near
    /// miss (without that, the probe is confirmed two clean cycles later).
    #[test]
    fn a_near_miss_before_a_stall_still_fails_the_probe() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let (good, _) = up_to_a_probe(&mut disk, &mut p, |_, _| true);
        // The near miss in the raise's transition, the first cycle of its window.
        let scale = disk.knee_scale;
        disk.knee_scale = scale_for(&disk, 0.93, 0.97);
        let near = disk.run(&mut p, 1);
        assert!(!near[0].0.services[0].violating());
        assert!(near[0].1.is_empty(), "{:?}", near[0].1);
        disk.knee_scale = scale;
        let stall = disk.run_stalled(&mut p, 120e6);
        assert!(
            stall[0].1.is_empty(),
            "the stall is no verdict: {:?}",
            stall[0].1
        );
        let after = disk.run(&mut p, 3);
        let back: Vec<&Decision> = after.iter().flat_map(|(_, d)| d).collect();
        assert!(
            back.first().is_some_and(|d| d.to == Some(good)),
            "the probe with a near miss was not failed: {back:?}"
        );
    }

    /// A probe that breaks the SLO by many times its target where the aggressor's full load
    /// was seen to do as much (its uncapped rate broke it by more) found its knee: no stall.
    #[test]
    fn a_probe_that_fails_as_badly_as_the_full_load_did_is_no_stall() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let (good, raised) = up_to_a_probe(&mut disk, &mut p, |_, _| true);
        let harm = p.searches[&(1, 1)]
            .uncapped_harm
            .expect("the arrival's harm");
        assert!(
            harm.fraction > 2.0 && harm.rate_bps >= raised as f64,
            "{harm:?}"
        );
        // The knee moves under the raised cap: the reader at 4.5-5.5 times its target.
        disk.knee_scale = scale_for(&disk, 4.5, 5.5);
        let h = disk.run(&mut p, 1);
        assert_eq!(h[0].1.len(), 1, "{:?}", h[0].1);
        assert_eq!(h[0].1[0].to, Some(good), "{}", h[0].1[0].reason);
        assert!(!h[0].1[0].reason.contains("stall"), "{}", h[0].1[0].reason);
        assert_eq!(p.searches[&(1, 1)].bad(disk.cycle), Some(raised));
    }

    /// The writer's cap and its trusted knee when `to`, decided in cycle `c`, is a raise past
    /// the episode's search (ending at `episode_end`) under a knee within
    /// [`FAR_FROM_KNEE`] of the cap: one the change budget must hold back.
    fn raise_near_knee(
        p: &Adaptive,
        c: &DeviceCycle,
        to: u64,
        episode_end: u64,
    ) -> Option<(u64, u64)> {
        let cap = c.services[1].limit.total_bps().unwrap_or(u64::MAX);
        let knee = p.searches[&(1, 1)]
            .knee
            .and_then(|k| k.trusted(c.cycle))
            .unwrap_or(u64::MAX);
        (to > cap && c.cycle > episode_end && (knee as f64) < cap as f64 * FAR_FROM_KNEE)
            .then_some((cap, knee))
    }

    /// After the search, a cap far under every target but within 1.5x of a knee a broken
    /// probe found waits out the noise window before its next raise, like one near its
    /// target: under a cliff the latency says nothing of where the wall is (a writer's reads
    /// on the test disk at 2-5 % of their target up to 274 MB/s, broken at 388; raises of
    /// 10-20 % every three cycles there were most of the changes after the search). Without
    /// the rule this run raised 8 cycles after the last change.
    #[test]
    fn far_under_the_target_below_a_probed_knee_the_next_raise_waits_out_the_window() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        while !disk
            .run(&mut p, 1)
            .iter()
            .flat_map(|(_, d)| d)
            .any(|d| d.reason.starts_with("a raise to"))
        {
            assert!(disk.cycle < 60, "no probe broke");
        }
        // The reads far under their target from here on, at any cap under the knee.
        disk.knee_scale = 20.0;
        let h = disk.run(&mut p, 40);
        let episode_end = p.devices[&1].episode_until + SEARCH_CYCLES;
        let mut last_change = disk.cycle - 40;
        let mut waited = 0;
        for (c, d) in &h {
            let Some(to) = d.first().and_then(|d| d.to) else {
                continue;
            };
            // Trusted then (its memory runs out within the run: then it climbs).
            if let Some((cap, knee)) = raise_near_knee(&p, c, to, episode_end) {
                assert!(
                    c.cycle >= last_change + NOISE_WINDOW,
                    "raise {cap} -> {to} at cycle {}, {} cycles after the last change (knee {knee})",
                    c.cycle,
                    c.cycle - last_change
                );
                waited += 1;
            }
            last_change = c.cycle;
        }
        assert!(waited > 0, "no raise near the knee to judge");
    }

    /// A trim's knee is measured (the window's p99.9 close to the target under that cap), no
    /// slow spell's: after the search, a cap far under every target but within 1.5x of it
    /// waits for the change budget before each raise toward it, as under a probe's knee.
    /// Seen in BENCHMARKS run AI, random reader repeat 2: a trim 177 -> 133 MB/s at cycle 20,
    /// the reader at 0.24-0.30 of its target under 133, then raises at cycles 31 and 33 and
    /// a near miss back at 35: four changes in 19 steady cycles. With the trim's knee
    /// unmeasured this run raised three cycles after the trim.
    #[test]
    fn far_under_the_target_below_a_trims_knee_the_next_raise_waits_for_the_change_budget() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let mut changes: Vec<u64> = vec![];
        let note = |h: &[(DeviceCycle, Vec<Decision>)], changes: &mut Vec<u64>| {
            for (c, d) in h {
                if d.iter().any(|d| d.to.is_some()) {
                    changes.push(c.cycle);
                }
            }
        };
        let h = disk.run(&mut p, 100);
        note(&h, &mut changes);
        // The disk slows a little: the window at 92-98 % of the target, a trim.
        disk.knee_scale = disk
            .knee_scale_for(800..1000, 0, 0.92..0.98)
            .expect("a slowdown that puts the p99.9 at 92-98 % of the target");
        loop {
            let h = disk.run(&mut p, 1);
            note(&h, &mut changes);
            if h[0].1.iter().any(|d| d.reason.contains("trim")) {
                break;
            }
            assert!(disk.cycle < 130, "not trimmed");
        }
        let knee = p.searches[&(1, 1)].knee.expect("the trim's knee");
        assert!(
            knee.fraction.is_some_and(|f| f > 0.85),
            "the trim's knee unmeasured: {knee:?}"
        );
        // The reads far under their target from here on, at any cap under the knee.
        disk.knee_scale = 20.0;
        let mut judged = 0;
        for _ in 0..40 {
            let h = disk.run(&mut p, 1);
            let (c, d) = &h[0];
            let Some(to) = d.first().and_then(|d| d.to) else {
                continue;
            };
            // The state the raise was decided in (a raise sets no knee and starts no
            // episode).
            let episode_end = p.devices[&1].episode_until + SEARCH_CYCLES;
            if let Some((cap, trusted)) = raise_near_knee(&p, c, to, episode_end) {
                let last = changes.last().copied().unwrap_or(0);
                let in_two_windows = changes
                    .iter()
                    .filter(|&&x| x + 2 * NOISE_WINDOW > c.cycle)
                    .count();
                assert!(
                    last + NOISE_WINDOW <= c.cycle && in_two_windows <= 1,
                    "raise {cap} -> {to} at cycle {}: changes before it {changes:?} (knee {trusted})",
                    c.cycle
                );
                judged += 1;
            }
            changes.push(c.cycle);
        }
        assert!(judged > 0, "no raise under the trim's knee to judge");
    }

    /// A raise whose transition already ran the writer at the raised cap counts that cycle
    /// as its probe window's first: it holds after the transition and one full cycle. One
    /// that ran under the cap there (its own demand lower) waits for two full cycles.
    #[test]
    fn a_raise_in_force_in_its_transition_holds_a_cycle_sooner() {
        for demand_share in [None, Some(0.7)] {
            let mut disk = pair();
            let mut p = Adaptive::default();
            let (good, raised) = up_to_a_probe(&mut disk, &mut p, |_, _| true);
            if let Some(share) = demand_share {
                disk.services[1].demand_bps = raised as f64 * share;
            }
            let h = disk.run(&mut p, PROBE_CYCLES);
            assert!(
                h.iter().all(|(c, _)| !c.services[0].violating()),
                "the raise {good} -> {raised} broke"
            );
            let held = p.searches[&(1, 1)].good == Some(raised);
            assert_eq!(
                held,
                demand_share.is_none(),
                "demand {demand_share:?}: held after the transition and one full cycle: {held}"
            );
            disk.run(&mut p, 1);
            assert!(p.searches[&(1, 1)].good >= Some(raised));
        }
    }

    /// A doubling search whose reads run far under their target (under [`FAST_PASS`]: here
    /// 0.02-0.04 of it) steps every cycle: each cap holds after its first cycle in force.
    /// Reads at 0.07-0.11 of the target step every [`PROBE_CYCLES`] cycles, as before. Either
    /// way the search doubles 95 -> 190 -> 380 -> 760 MB/s, past the cliff at 600 MB/s (where
    /// the writer leaves the reader no quiet cycles), and falls back to 380.
    #[test]
    fn a_doubling_search_far_under_the_target_steps_every_cycle() {
        for (quiet, gap) in [(0.05, 1), (0.15, PROBE_CYCLES)] {
            let mut disk = pair();
            disk.noise_seed = Some(1);
            disk.noise_bursts = Some((0.0, quiet));
            let mut p = Adaptive::default();
            let h = disk.run(&mut p, 30);
            let (doublings, caps): (Vec<u64>, Vec<u64>) = h
                .iter()
                .flat_map(|(c, d)| d.iter().map(move |d| (c.cycle, d)))
                .filter(|(_, d)| d.reason.contains("double it"))
                .map(|(c, d)| (c, d.to.unwrap_or(0)))
                .unzip();
            assert!(
                doublings.len() >= 2,
                "quiet {quiet}: doublings {doublings:?}"
            );
            for w in doublings.windows(2) {
                assert_eq!(
                    w[1] - w[0],
                    gap,
                    "quiet {quiet}: doublings at {doublings:?}"
                );
            }
            let broke = h
                .iter()
                .find_map(|(_, d)| d.iter().find(|d| d.reason.starts_with("a raise to")))
                .unwrap_or_else(|| panic!("quiet {quiet}: no probe broke"));
            assert!(
                caps.last().is_some_and(|&c| c > 600_000_000),
                "quiet {quiet}: doubled to {caps:?}"
            );
            assert_eq!(
                broke.to,
                caps.iter().rev().nth(1).copied(),
                "quiet {quiet}: doubled to {caps:?}, fell back to {:?}",
                broke.to
            );
        }
    }

    /// With two aggressors capped, no window passes in one cycle, however far under its
    /// target the reader runs: a raise in the other's transition would be judged on the
    /// other's harm. Every raise comes with no cap changed in the cycle before.
    #[test]
    fn two_capped_aggressors_far_under_the_target_step_no_faster_than_their_windows() {
        let mut disk = db_and_two_writers(5);
        disk.noise_seed = Some(1);
        disk.noise_bursts = Some((0.0, 0.05));
        let mut p = Adaptive::default();
        let h = disk.run(&mut p, 40);
        let mut raises = 0;
        for (c, d) in &h {
            if !d.iter().any(|d| d.reason.starts_with("every SLO held")) {
                continue;
            }
            raises += 1;
            assert!(
                c.services.iter().all(|s| s.can_change(c.cycle)),
                "a raise at {} in the transition of a change at {:?}",
                c.cycle,
                c.services
                    .iter()
                    .map(|s| s.changed_cycle)
                    .collect::<Vec<_>>()
            );
        }
        assert!(raises >= 2, "{raises} raises");
    }

    /// Runs up to the first raise from a cap that held for which `which(good, raised)`.
    fn up_to_a_probe(
        disk: &mut SimDisk,
        p: &mut Adaptive,
        which: impl Fn(u64, u64) -> bool,
    ) -> (u64, u64) {
        loop {
            let before = writer_cap(disk);
            let h = disk.run(p, 1);
            let after = writer_cap(disk);
            if let (Some(b), Some(a)) = (before, after) {
                if a > b && h[0].1[0].reason.contains("held") && which(b, a) {
                    return (b, a);
                }
            }
            assert!(disk.cycle < 200, "no such probe in 200 cycles");
        }
    }

    /// A raise whose probe window runs the reader close to its target (a near miss, no
    /// violation) is neither left on probation nor settled: it goes back to the cap that
    /// held, and it is the knee.
    #[test]
    fn a_probe_that_runs_close_to_the_target_goes_back_without_a_violation() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let (good, raised) = up_to_a_probe(&mut disk, &mut p, |_, _| true);
        disk.knee_scale = scale_for(&disk, 0.92, 0.98);
        let h = disk.run(&mut p, PROBE_CYCLES + 2);
        assert!(h.iter().all(|(c, _)| !c.services[0].violating()));
        let back: Vec<&Decision> = h.iter().flat_map(|(_, d)| d).collect();
        // A probe toward the knee may follow once the fall-back's window passed.
        assert!(
            back.iter()
                .skip(1)
                .all(|d| d.to.is_some_and(|to| to < raised)),
            "{back:?}"
        );
        assert_eq!(
            back[0].to,
            Some(good),
            "raised to {raised}: {}",
            back[0].reason
        );
        assert!(back[0].reason.contains("within"), "{}", back[0].reason);
        assert_eq!(
            p.searches[&(1, 1)].bad(disk.cycle),
            Some(raised),
            "the raise that ran close is the knee"
        );
    }

    /// A probe that failed far above the cap that held leaves a knee far above it: the
    /// next probe toward it (half-way, or lower where the line through the two says so) is
    /// likely to hold and does not wait out the budget.
    #[test]
    fn a_probe_far_under_the_knee_goes_ahead_with_the_budget_spent() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let (good, raised) = up_to_a_probe(&mut disk, &mut p, |good, raised| {
            raised as f64 >= good as f64 * FAR_FROM_KNEE * 1.05
        });
        disk.knee_scale = scale_for(&disk, 1.03, 1.15);
        let h = disk.run(&mut p, 1);
        assert!(
            h.iter().flat_map(|(_, d)| d).any(|d| d.to == Some(good)),
            "the probe to {raised} did not fall back to {good}"
        );
        disk.knee_scale = 1.0;
        let next = disk.run(&mut p, 7);
        let mid = (good as f64 * raised as f64).sqrt();
        let probes: Vec<&Decision> = next.iter().flat_map(|(_, d)| d).collect();
        assert!(
            probes.first().is_some_and(|d| d.to.is_some_and(|to| {
                to as f64 >= good as f64 * MIN_PROBE_GAIN && to as f64 <= mid * 1.01
            })),
            "no probe toward the knee at {raised} (at most half-way, {mid:.0}) within 7 cycles of the fall-back: {probes:?}"
        );
    }

    /// The episode's first cut that does not hold is cut again by at least three quarters:
    /// near a cliff (SLO/L)^2 is gentle when L is just over the target, and half left the
    /// reader over it for two more cycles. It is cut in its transition, with the aggressor
    /// already at the cap there: on the test disk that cycle's verdict was the cap's
    /// (BENCHMARKS run BU), and waiting for the next full cycle put the SLO back only at the
    /// 3-cycle bar. The re-cut's own transition is no first cut's: nothing more is cut.
    #[test]
    fn a_first_cut_that_does_not_hold_is_cut_again_by_three_quarters_in_its_transition() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let first =
            run_until(&mut disk, &mut p, 20, |_| true).expect("the writer's arrival was cut");
        // A slower disk: the first cut leaves the reader just over its target.
        disk.knee_scale = scale_for(&disk, 1.05, 1.2);
        let h = disk.run(&mut p, 3);
        let (c, _) = &h[0];
        assert_eq!(
            c.services[1].changed_cycle,
            Some(c.cycle - 1),
            "not the transition"
        );
        assert!(c.services[0].violating());
        let cuts: Vec<&Decision> = h.iter().flat_map(|(_, d)| d).collect();
        assert_eq!(cuts.len(), 1, "{cuts:?}");
        assert_eq!(h[0].1.len(), 1, "not cut in the transition: {cuts:?}");
        let second = cuts[0].to.unwrap();
        assert!(
            second as f64 <= first as f64 * 0.25 + 1.0,
            "re-cut {first} -> {second}: {}",
            cuts[0].reason
        );
    }

    /// A re-cut of the episode's first cap that still breaks the SLO in its transition,
    /// with the aggressor already at it there, is cut again in that cycle: the SLO is due
    /// back within 3 cycles of the arrival and a cycle's wait misses that (seen in CI in a
    /// slow hour: 3.2 GB/s -> 1337 -> 334 MB/s, 6.4 ms in the re-cut's transition, 6.9 ms in
    /// the cycle waited). By half, not three quarters: the re-cut was measured in force, no
    /// burst. A re-cut decided after the 3 cycles waits for its first full cycle.
    #[test]
    fn a_re_cut_broken_in_its_transition_within_the_3_cycles_is_cut_again_there() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let first =
            run_until(&mut disk, &mut p, 20, |_| true).expect("the writer's arrival was cut");
        let arrival = p.devices[&1].first_cap_at.expect("the first cap's cycle");
        // Slower: the first cut leaves the reader well over its target.
        disk.knee_scale = next_scale_for(&disk, 1.5, 2.5);
        let (_, ds) = disk.run(&mut p, 1).remove(0);
        let second = ds
            .first()
            .and_then(|d| d.to)
            .unwrap_or_else(|| panic!("the first cut {first} was not re-cut: {ds:?}"));
        // Slower again: the re-cut leaves the reader just over its target.
        disk.knee_scale = next_scale_for(&disk, 1.1, 1.3);
        let (c, ds) = disk.run(&mut p, 1).remove(0);
        assert!(c.cycle <= arrival + 2, "past the 3 cycles: {}", c.cycle);
        assert!(c.services[0].violating());
        assert!(
            took_most_of(first as f64, second as f64, c.services[1].write_bps),
            "the re-cut was not in force in its transition"
        );
        let third = ds.first().and_then(|d| d.to);
        assert!(
            third.is_some_and(|t| (0.45..=0.5).contains(&(t as f64 / second as f64))),
            "the re-cut {first} -> {second} broke the SLO in its transition: {ds:?}"
        );
        // Past the 3 cycles a re-cut's transition is not judged: nothing is cut in it.
        disk.knee_scale = next_scale_for(&disk, 1.1, 1.3);
        let (c, ds) = disk.run(&mut p, 1).remove(0);
        assert_eq!(c.cycle, arrival + 3);
        assert!(c.services[0].violating());
        assert!(ds.is_empty(), "{ds:?}");
    }

    /// An arrival's cut whose window runs the reader at 0.8-0.88 of its target has no room
    /// for a doubling (seen in CI: a cut to 410 MB/s read 0.78 and 0.89, the doubling to
    /// 821 broke at 1.46): the search stops there, and doubles again once the disk is
    /// faster and the window reads far under.
    #[test]
    fn a_cut_that_runs_close_to_the_target_is_not_doubled() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        while writer_cap(&disk).is_none() {
            disk.run(&mut p, 1);
            assert!(disk.cycle < 20, "never capped");
        }
        let cut = writer_cap(&disk).unwrap();
        disk.knee_scale = disk
            .knee_scale_for(50..3000, 1, 0.8..0.88)
            .expect("a knee that puts the cut at 0.8-0.88");
        let h = disk.run(&mut p, 3 * NOISE_WINDOW);
        let decisions: Vec<&Decision> = h.iter().flat_map(|(_, d)| d).collect();
        assert!(decisions.is_empty(), "cut to {cut}, then {decisions:?}");
        // A faster disk: the window reads far under, and the search doubles.
        disk.knee_scale *= 2.0;
        let h = disk.run(&mut p, NOISE_WINDOW);
        let raised: Vec<&Decision> = h.iter().flat_map(|(_, d)| d).collect();
        assert!(
            raised.first().is_some_and(|d| d.to == Some(2 * cut)),
            "{raised:?}"
        );
    }

    /// The pair up to its first raise from a cap that held, the raise broken at 1.3-1.6 of
    /// the target, and the policy's fall-back to that cap decided: (disk, policy, cap).
    fn back_from_a_broken_probe() -> (SimDisk, Adaptive, u64) {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let (good, raised) = up_to_a_probe(&mut disk, &mut p, |_, _| true);
        disk.knee_scale = disk
            .knee_scale_for((100..3000).rev(), 0, 1.3..1.6)
            .expect("a knee that breaks the raise");
        let raised_at = disk.cycle;
        while writer_cap(&disk) != Some(good) {
            disk.run(&mut p, 1);
            assert!(
                disk.cycle < raised_at + 10,
                "raised {good} -> {raised}, never back"
            );
        }
        (disk, p, good)
    }

    /// A fall-back's first cycle under a knee it measured says whether the next probe has
    /// room: at 0.8-0.88 of the target under a cap whose raise read 1.3-1.6 (CI's
    /// noisy-neighbor test: 0.86 under 410 MB/s, 1.46 at 821), the line to the knee reaches
    /// [`PROBE_AIM`] under the cap, and no half-way probe is made on that cycle or after.
    #[test]
    fn a_fall_back_that_runs_close_to_the_target_is_not_probed_half_way() {
        let (mut disk, mut p, good) = back_from_a_broken_probe();
        // Then each cycle, the transition too (the writer's rate fell within it on the
        // test disk), reads 0.8-0.88 of the target.
        for _ in 0..NOISE_WINDOW {
            disk.knee_scale = disk
                .knee_scale_for_next(50..3000, 0.8..0.88)
                .expect("a knee that puts the reader at 0.8-0.88");
            let h = disk.run(&mut p, 1);
            assert!(h[0].1.is_empty(), "back at {good}, then {:?}", h[0].1);
        }
    }

    /// A fall-back to the cap that held before a raise, whose first full cycle breaks the
    /// target with the writer at that cap (the disk slowed while it probed), is cut in that
    /// cycle, not at a second violation (seen in CI: 7.9 and 7.8 ms against 6 under a
    /// fall-back that had read 0.14 of the target, cut at the fourth violating cycle in a
    /// row). Its transition, with the raised rate's queue still passing, is the probe's.
    #[test]
    fn a_fall_back_that_breaks_the_target_in_its_first_full_cycle_is_cut() {
        let (mut disk, mut p, good) = back_from_a_broken_probe();
        // The transition, the raised rate still passing, then the first full cycle back
        // at `good`, both just over the target.
        let mut cut = None;
        for at in 0..2 {
            disk.knee_scale = disk
                .knee_scale_for_next(50..3000, 1.2..1.4)
                .expect("a knee that puts the reader at 1.2-1.4");
            let mut c = disk.step();
            if at == 0 {
                let changed = c.services[1].changed_cycle.expect("the fall-back");
                assert_eq!(changed + 1, c.cycle, "not the transition");
                c.services[1].write_bps = p.loads[&1].rate_at(changed, 1).expect("its rate");
            }
            assert!(c.services[0].violating());
            let ds = p.decide(&c);
            disk.apply(&ds);
            if let Some(d) = ds.first() {
                cut = Some((at, d.to, d.reason.clone()));
            }
        }
        let (at, to, why) = cut.expect("the stale fall-back was not cut in its first full cycle");
        assert_eq!(at, 1, "{why}");
        assert!(why.contains("first full cycle back"), "{why}");
        assert!(to.is_some_and(|to| to < good), "{good} -> {to:?}: {why}");
    }

    /// [`back_from_a_broken_probe`], then the fall-back's transition with the disk slowed
    /// (the reader at 1.2-1.4 of its target): (disk, policy, the fall-back's cap, that cycle).
    fn a_fall_back_breaking_in_its_transition(
    ) -> (SimDisk, Adaptive, u64, (DeviceCycle, Vec<Decision>)) {
        let (mut disk, mut p, good) = back_from_a_broken_probe();
        disk.knee_scale = disk
            .knee_scale_for_next(50..3000, 1.2..1.4)
            .expect("a knee that puts the reader at 1.2-1.4");
        let cycle = disk.run(&mut p, 1).remove(0);
        (disk, p, good, cycle)
    }

    /// A fall-back that breaks the target already in its transition, with the writer at the
    /// cap there, is cut in that cycle (see [`Adaptive::fall_back_in_force`]).
    #[test]
    fn a_fall_back_that_breaks_the_target_in_force_in_its_transition_is_cut_there() {
        let (_, _, good, (c, ds)) = a_fall_back_breaking_in_its_transition();
        assert_eq!(
            c.services[1].changed_cycle,
            Some(c.cycle - 1),
            "not the transition"
        );
        assert!(c.services[0].violating());
        let d = ds
            .first()
            .unwrap_or_else(|| panic!("the fall-back to {good} was not cut in its transition"));
        assert!(d.reason.contains("in force already"), "{}", d.reason);
        assert!(d.to.is_some_and(|to| to < good), "{good} -> {d:?}");
    }

    /// A stale fall-back's knee is measured (its cap broke in force, right after the probe
    /// over it): the disk back to fast, the search climbs back from the cut once the change
    /// budget allows (the fall-back out of its 20 cycles), half-way, to within
    /// [`SETTLED_KNEE_PRECISION`] of the knee, where a settled search stops: no other raise
    /// while the knee is trusted, the budget allowing one again in its last cycle. As a
    /// cut's knee it climbed two cycles apart toward it (BENCHMARKS run DQ, the writer,
    /// repeat 1: 261 -> 312 -> 341 MB/s, the second broke, its fall-back broke: four changes
    /// in five cycles).
    #[test]
    fn after_a_stale_fall_back_the_climb_back_keeps_the_change_budget() {
        let (mut disk, mut p, good, (_, ds)) = a_fall_back_breaking_in_its_transition();
        let cut_to = ds
            .first()
            .filter(|d| d.reason.contains("in force already"))
            .and_then(|d| d.to)
            .unwrap_or_else(|| panic!("the stale fall-back to {good} was not cut: {ds:?}"));
        let cut_at = disk.cycle - 1;
        // The slow spell is over: the reader far under its target at the cut.
        disk.knee_scale = disk
            .knee_scale_for_next(50..6000, 0.15..0.25)
            .expect("a knee that puts the reader at 0.15-0.25");
        let h = disk.run(&mut p, BAD_MEMORY_CYCLES - 1);
        let raises: Vec<(u64, u64)> = h
            .iter()
            .flat_map(|(c, ds)| ds.iter().map(move |d| (c.cycle, d)))
            .filter_map(|(c, d)| d.to.map(|to| (c, to)))
            .collect();
        assert!(
            !raises.is_empty(),
            "no climb back from {cut_to} (knee {good})"
        );
        let (first_at, first_to) = raises[0];
        assert!(
            first_at + 1 >= cut_at + 2 * NOISE_WINDOW,
            "raised at {first_at}, {} cycles after the cut: {raises:?}",
            first_at - cut_at
        );
        assert!(first_to > cut_to, "{raises:?}");
        assert_eq!(
            raises.len(),
            1,
            "cut {good} -> {cut_to} at {cut_at}, then {raises:?}"
        );
        assert!(
            first_to as f64 * SETTLED_KNEE_PRECISION >= good as f64 * 0.99,
            "{raises:?}: stopped short of {good}/1.2"
        );
    }

    /// An aggressor that goes quiet under its cap takes the victim's p99.9 from near its
    /// target to near nothing: a change of load, not scatter. The scatter estimate (and with
    /// it the near-miss bar the next episode's caps are judged by) must not take it in.
    #[test]
    fn an_aggressor_going_quiet_under_its_cap_is_not_counted_as_scatter() {
        let mut disk = SimDisk::new(vec![
            SimService::latency("reader", 5.0, 1.0),
            SimService::writer("writer", SloClass::BestEffort, 2400.0, 5),
        ]);
        disk.services[1].on_off = Some((30, 20));
        let mut p = Adaptive::default();
        disk.run(&mut p, 34);
        let before = p.devices[&1].sigma();
        // The writer rests from cycle 35; its cap is lifted 2 cycles later.
        disk.run(&mut p, 6);
        let after = p.devices[&1].sigma();
        println!("sigma under the cap {before:.3}, after the writer went quiet {after:.3}");
        assert!(
            after <= before * 1.5 + 0.02,
            "the writer going quiet raised the scatter estimate from {before:.3} to {after:.3}"
        );
    }
    /// Runs the cycle after a cap was set (no change may follow a change at once), then
    /// the cap's first cycle in force with the disk slowed so that the reader is just over
    /// its target and the writer passing `writer_bps`; the cap the policy set then.
    fn cut_in_first_cycle_in_force(
        disk: &mut SimDisk,
        p: &mut Adaptive,
        writer_bps: f64,
    ) -> (Option<u64>, Vec<Decision>) {
        let ds = p.decide(&disk.step());
        assert!(ds.is_empty(), "{ds:?}");
        disk.apply(&ds);
        disk.knee_scale = scale_for(disk, 1.10, 1.18);
        let mut c = disk.step();
        c.services[1].write_bps = writer_bps;
        assert!(c.services[0].violating());
        let ds = p.decide(&c);
        (ds.first().and_then(|d| d.to), ds)
    }

    /// `cap`'s first cycle in force with the old rate's queue still passing it (8 % over
    /// it) and the reader just over its target: the cap must be cut at once by at least
    /// half.
    fn assert_cut_at_once_in_first_cycle_in_force(disk: &mut SimDisk, p: &mut Adaptive, cap: u64) {
        let (to, ds) = cut_in_first_cycle_in_force(disk, p, cap as f64 * 1.08);
        assert!(
            to.is_some_and(|t| (t as f64) <= cap as f64 * 0.5),
            "the cap {cap} broke the SLO in its first cycle in force: {ds:?}"
        );
    }

    /// Runs `disk` under `p` until a decision `pick` accepts; the cap it set.
    fn run_until(
        disk: &mut SimDisk,
        p: &mut Adaptive,
        cycles: u64,
        pick: impl Fn(&Decision) -> bool,
    ) -> Option<u64> {
        for _ in 0..cycles {
            let ds = p.decide(&disk.step());
            disk.apply(&ds);
            if let Some(d) = ds.iter().find(|d| pick(d)) {
                return d.to;
            }
        }
        None
    }

    /// A first cut the aggressor stays well under in its first cycle in force (it was taken
    /// from a burst over what the disk sustains) is cut to at most a quarter of the rate
    /// the disk gave it there, not half: half of the disk's own rate is over the knee as
    /// often as not.
    #[test]
    fn a_first_cut_that_did_not_bind_goes_to_a_quarter_of_the_rate_under_it() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let cap = run_until(&mut disk, &mut p, 20, |_| true).expect("the writer's arrival was cut");
        let under = cap as f64 * 0.7;
        let (to, _) = cut_in_first_cycle_in_force(&mut disk, &mut p, under);
        assert!(
            to.is_some_and(|t| (t as f64) <= under * 0.25 + 1.0),
            "the writer passed {under:.0} B/s under a first cut of {cap}: cut to {to:?}"
        );
    }

    /// A writer that moves a fair share of the device's bytes is the aggressor even with
    /// few requests in flight next to a deep reader, and a reader within its SLO is not
    /// cut in its place.
    #[test]
    fn a_writer_with_few_requests_in_flight_is_cut_before_a_reader() {
        let mut disk = SimDisk::new(vec![
            SimService::latency("db", 5.0, 1.0),
            SimService::latency("cache", 10.0, 4.0),
            SimService::writer("backup", SloClass::BestEffort, 2400.0, 5),
        ]);
        let mut p = Adaptive::default();
        for _ in 0..5 {
            assert!(p.decide(&disk.step()).is_empty());
        }
        let mut c = disk.step();
        // db just over its 5 ms, cache well within its 10 ms.
        c.services[0].p999_ns = Some(5_300_000);
        c.services[1].p999_ns = Some(5_300_000);
        // A 60 MB/s writer with 0.05 requests in flight, a QD4 reader at 108 MB/s.
        c.services[2].write_bps = 60e6;
        c.services[2].mean_inflight = 0.05;
        c.services[1].read_bps = 108e6;
        c.services[1].mean_inflight = 4.0;
        assert!(c.services[0].violating());
        assert!(c.share(c.services[2].id) < 0.05);
        let ds = p.decide(&c);
        assert!(!ds.is_empty(), "nobody was cut");
        assert!(
            ds.iter().all(|d| d.service == c.services[2].id),
            "not the writer was cut: {ds:?}"
        );
    }

    /// A latency service within its SLO is the last resort for another's, and only where
    /// the probe times the wait in its cap: elsewhere its p99.9 would leave that wait out
    /// (a QD4 reader cut 78 -> 48 MB/s measured 4-8.5 ms while fio saw 47-60 ms).
    #[test]
    fn a_latency_service_is_cut_only_where_the_wait_in_its_cap_is_timed() {
        let decide = |timed: bool| {
            let mut disk = SimDisk::new(vec![
                SimService::latency("db", 5.0, 1.0),
                SimService::latency("cache", 10.0, 4.0),
            ]);
            let mut p = Adaptive::default();
            for _ in 0..5 {
                let mut c = disk.step();
                c.throttle_wait_timed = timed;
                assert!(p.decide(&c).is_empty());
            }
            let mut c = disk.step();
            c.throttle_wait_timed = timed;
            c.services[0].p999_ns = Some(7_000_000);
            c.services[1].p999_ns = Some(6_000_000);
            c.services[1].read_bps = 108e6;
            c.services[1].mean_inflight = 4.0;
            assert!(c.services[0].violating() && !c.services[1].violating());
            (c.services[1].id, p.decide(&c))
        };
        let (cache, ds) = decide(true);
        assert!(
            ds.iter().any(|d| d.service == cache && d.to.is_some()),
            "timed: cache was not cut for db: {ds:?}"
        );
        let (cache, ds) = decide(false);
        assert!(
            ds.iter().all(|d| d.service != cache),
            "untimed: cache was cut, its wait in the cap unseen: {ds:?}"
        );
    }

    /// Two writers that start together are both cut in the cycle they break the reader's
    /// SLO, not one after the other's transition.
    #[test]
    fn aggressors_arriving_together_are_cut_together() {
        let mut disk = SimDisk::new(vec![
            SimService::latency("reader", 5.0, 1.0),
            SimService::writer("backup", SloClass::BestEffort, 1200.0, 5),
            SimService::writer("ingest", SloClass::BestEffort, 1200.0, 5),
        ]);
        let mut p = Adaptive::default();
        let first = (0..20)
            .map(|_| {
                let c = disk.step();
                let ds = p.decide(&c);
                disk.apply(&ds);
                ds
            })
            .find(|ds| !ds.is_empty())
            .expect("the writers were cut");
        let cut: HashSet<ServiceId> = first.iter().map(|d| d.service).collect();
        assert_eq!(cut.len(), 2, "{first:?}");
    }

    /// After the search's first cycles, no raise goes to within a few per cent of a knee it
    /// trusts (unless the victim runs far under its target), and any raise comes only after
    /// ten cycles without any change on the device and with at most one in the last twenty
    /// (room for its fall-back): at most one change in ten that no violation forced, on a
    /// disk whose knee stays put and on one whose knee moves.
    #[test]
    fn after_the_search_a_raise_waits_ten_quiet_cycles_and_is_worth_it() {
        for (moving, seed) in [
            (false, None),
            (true, None),
            (false, Some(5)),
            (true, Some(2)),
        ] {
            // A random-read scan: its knee is refined near the target (a writer's plateau
            // ends the search far from it).
            let mut disk = SimDisk::new(vec![
                SimService::latency("reader", 5.0, 1.0),
                SimService::random_reader("scan", 320.0, 5),
            ]);
            disk.noise_seed = seed;
            let mut p = Adaptive::default();
            let mut changes: Vec<(u64, String)> = vec![];
            for cycle in 0..200 {
                if moving {
                    disk.knee_scale = if (80..140).contains(&cycle) { 0.7 } else { 1.0 };
                }
                let c = disk.step();
                let ds = p.decide(&c);
                let episode = p.devices[&c.dev].episode_until;
                for d in &ds {
                    // Near the knee: a probe half-way to it (a knee under 1.5x the cap).
                    let raise = d.reason.contains("probe") || d.reason.contains("give back");
                    let knee_over_cap = c.services[1]
                        .limit
                        .total_bps()
                        .zip(p.searches[&(c.dev, 1)].bad(cycle))
                        .map(|(cap, bad)| bad as f64 / cap as f64);
                    let near = knee_over_cap.is_some_and(|k| k < FAR_FROM_KNEE);
                    if raise && near && cycle > episode + SEARCH_CYCLES {
                        let far_under_targets =
                            far_under(p.devices[&c.dev].level_since(window_start(&c.services[1])));
                        assert!(
                            far_under_targets
                                || knee_over_cap.is_some_and(|k| k > SETTLED_KNEE_PRECISION),
                            "moving {moving}, noise {seed:?}: raise at {cycle} to within a few per cent of a trusted knee ({knee_over_cap:?}x the cap): {changes:?}"
                        );
                        let last = changes.last().map_or(0, |c| c.0);
                        assert!(
                            cycle >= last + NOISE_WINDOW,
                            "moving {moving}, noise {seed:?}: raise at {cycle}, {} cycles after the last change: {changes:?}",
                            cycle - last
                        );
                        let mut in_twenty: Vec<u64> = changes
                            .iter()
                            .map(|c| c.0)
                            .filter(|&c| c + 2 * NOISE_WINDOW > cycle)
                            .collect();
                        in_twenty.dedup();
                        assert!(
                            in_twenty.len() <= 1,
                            "moving {moving}, noise {seed:?}: raise at {cycle} after changes at {in_twenty:?}: {changes:?}"
                        );
                    }
                }
                changes.extend(ds.iter().map(|d| (cycle, d.reason.clone())));
                disk.apply(&ds);
            }
            let raises = changes
                .iter()
                .filter(|c| c.1.contains("probe") || c.1.contains("give back"))
                .count();
            assert!(
                raises >= 2,
                "moving {moving}: the search never raised: {changes:?}"
            );
        }
    }

    /// Past the search's cycles, a raise of less than [`SHORT_STEP`] toward a rate no probe
    /// measured waits for the change budget: a doubling search's (its line says the target
    /// is that close), and a search toward the rate whose full load broke the SLO (the
    /// aggressor ran a cycle uncapped before the reader suffered: the cut was no arrival's).
    /// On a disk whose latency rises smoothly (no plateau: the steps shrink as they near the
    /// target), a writer arriving in a full cycle, a third of one or a tenth, 40 noise seeds
    /// each: such raises come up on both paths, and none is made within ten cycles of a
    /// change or after two in twenty.
    #[test]
    fn past_the_search_a_short_step_toward_an_unmeasured_rate_waits_for_the_change_budget() {
        // (doubling, toward a full load's knee)
        let mut short_steps_past_search = (0, 0);
        for (share, late_harm) in [(1.0, false), (0.3, false), (0.1, false), (1.0, true)] {
            for seed in 1..=40 {
                let mut disk = SimDisk::new(vec![
                    SimService::latency("reader", 4.0, 1.0),
                    SimService::writer("writer", SloClass::BestEffort, 2400.0, 5),
                ]);
                disk.noise_seed = Some(seed);
                disk.smooth_curve = Some((300.0, 4.0));
                disk.services[1].arrival_share = share;
                if late_harm {
                    // A scan's full load just over a cliff (on the test disk, 293 MB/s
                    // broke a 3 ms target at 8x): the cut goes deep.
                    disk.services[1].demand_bps = 360e6;
                    disk.smooth_curve = Some((300.0, 12.0));
                }
                let mut p = Adaptive::default();
                let mut changes: Vec<u64> = vec![];
                for cycle in 0..60 {
                    // Late harm: the disk is fast in the writer's first cycle.
                    disk.knee_scale = if late_harm && cycle == 5 { 8.0 } else { 1.0 };
                    let c = disk.step();
                    let st = p.searches.get(&(c.dev, 1));
                    let doubling = st.is_some_and(|st| st.doubling(cycle));
                    let full_load = st
                        .and_then(|st| st.knee)
                        .is_some_and(|k| k.full_load && k.trusted(cycle).is_some());
                    let cap = c.services[1].limit.total_bps();
                    let ds = p.decide(&c);
                    let episode = p.devices[&c.dev].episode_until;
                    let to: u64 = ds
                        .iter()
                        .filter(|d| d.service == c.services[1].id)
                        .filter(|d| {
                            matches!(
                                d.knob,
                                crate::policy::Knob::Rbps | crate::policy::Knob::Wbps
                            )
                        })
                        .filter_map(|d| d.to)
                        .sum();
                    if let (Some(from), Some(d)) = (cap, ds.first()) {
                        let short = (to as f64) < from as f64 * SHORT_STEP;
                        if (doubling || full_load)
                            && to > from
                            && short
                            && cycle > episode + SEARCH_CYCLES
                        {
                            if doubling {
                                short_steps_past_search.0 += 1;
                            } else {
                                short_steps_past_search.1 += 1;
                            }
                            println!(
                                "share {share}, late harm {late_harm}, seed {seed}: {} -> {} MB/s at {cycle}",
                                from / 1_000_000,
                                to / 1_000_000
                            );
                            let recent: Vec<u64> = changes
                                .iter()
                                .copied()
                                .filter(|&x| x + 2 * NOISE_WINDOW > cycle)
                                .collect();
                            assert!(
                                recent.iter().all(|&x| x + NOISE_WINDOW <= cycle)
                                    && recent.len() <= 1,
                                "share {share}, late harm {late_harm}, seed {seed}: a raise {} -> {} MB/s at {cycle} after changes at {recent:?}: {}",
                                from / 1_000_000,
                                to / 1_000_000,
                                d.reason
                            );
                        }
                    }
                    if !ds.is_empty() && changes.last() != Some(&cycle) {
                        changes.push(cycle);
                    }
                    disk.apply(&ds);
                }
            }
        }
        println!("short steps past the search (doubling, toward a full load's knee): {short_steps_past_search:?}");
        assert!(
            short_steps_past_search.0 >= 1 && short_steps_past_search.1 >= 1,
            "no search came that near an unmeasured rate past its cycles on one of the paths \
             ({short_steps_past_search:?}): the test proves nothing"
        );
    }

    /// Two capped aggressors (paper 001's mix) probe one at a time, and a violation during a
    /// probe fails that probe, whichever class the prober is: a best-effort writer is not
    /// cut for a throughput service's raise.
    #[test]
    fn two_aggressors_probe_one_at_a_time_and_a_violation_fails_the_probe_in_progress() {
        let mut disk = db_and_two_writers(5);
        let mut p = Adaptive::default();
        let (mut probes, mut failed_in_probe) = (0, 0);
        for cycle in 0..200 {
            // The disk slows and recovers: knees move, probes fail.
            disk.knee_scale = if (60..120).contains(&cycle) { 0.6 } else { 1.0 };
            let c = disk.step();
            let on_probation: Vec<ServiceId> = p
                .searches
                .iter()
                .filter(|(&(_, id), st)| {
                    st.before_raise.is_some() && c.services[id].limit.total_bps().is_some()
                })
                .map(|(&(_, id), _)| id)
                .collect();
            assert!(
                on_probation.len() <= 1,
                "cycle {cycle}: two probes at once: {on_probation:?}"
            );
            let ds = p.decide(&c);
            if let (Some(&prober), true) = (on_probation.first(), c.services[0].violating()) {
                failed_in_probe += 1;
                assert!(
                    ds.iter().all(|d| d.service == prober),
                    "cycle {cycle}: a violation during {prober}'s probe cut another: {ds:?}"
                );
            }
            // Every raise is a probe until its window passes (one per service, whatever
            // its knobs).
            probes += ds
                .iter()
                .filter(|d| {
                    let now = c.services[d.service].limit.get(d.knob);
                    d.to.zip(now).is_some_and(|(to, now)| to > now)
                })
                .map(|d| d.service)
                .collect::<HashSet<_>>()
                .len();
            disk.apply(&ds);
        }
        assert!(
            probes >= 4 && failed_in_probe >= 1,
            "{probes} probes, {failed_in_probe} failed: the test saw nothing"
        );
    }

    /// Two capped aggressors share one knee: once a probe of one breaks an SLO with their caps
    /// at a total T, no probe of either takes their total back to T while that knee is
    /// trusted (at least [`BAD_MEMORY_CYCLES`]), on a disk that slows and recovers.
    #[test]
    fn after_a_probe_breaks_next_to_another_aggressor_no_probe_takes_their_total_back() {
        let mut disk = db_and_two_writers(5);
        let mut p = Adaptive::default();
        // (cycle, total of the caps) of the last probe that broke with two caps set.
        let mut broke: Option<(u64, u64)> = None;
        let mut bounded = 0;
        for cycle in 0..300 {
            disk.knee_scale = if (60..120).contains(&cycle) { 0.6 } else { 1.0 };
            let c = disk.step();
            let (total, capped) = capped_total(&c);
            let ds = p.decide(&c);
            for d in &ds {
                if d.reason.starts_with("a raise to") && capped >= 2 {
                    broke = Some((cycle, total));
                }
                let Some((at, t)) = broke.filter(|&(at, _)| cycle < at + BAD_MEMORY_CYCLES) else {
                    continue;
                };
                if d.reason.contains("probe") {
                    let own = c.services[d.service].limit.total_bps().unwrap_or(0);
                    let after = total - own + d.to.unwrap_or(0);
                    assert!(
                        after < t,
                        "cycle {cycle}: {}'s probe takes the caps to {after} B/s in all; they broke \
                         an SLO at {t} at cycle {at}: {d:?}",
                        c.services[d.service].name
                    );
                    bounded += 1;
                }
            }
            disk.apply(&ds);
        }
        assert!(
            bounded >= 1,
            "no probe came after one broke next to another aggressor: the test saw nothing"
        );
    }

    /// Whether `d` raises its service's cap in `c` (a higher cap, or none); a first cap on
    /// an uncapped service is a cut.
    fn raises(c: &DeviceCycle, d: &Decision) -> bool {
        c.services[d.service]
            .limit
            .total_bps()
            .is_some_and(|own| d.to.is_none_or(|to| to > own))
    }

    /// Runs paper 001's mix on the noisy disk of seeds 1-12 for 150 cycles each; hands `f`
    /// the seed, the device's history before each cycle's decisions, the cycle and them.
    fn for_each_noisy_mix_cycle(mut f: impl FnMut(u64, &DeviceHistory, &DeviceCycle, &[Decision])) {
        for seed in 1..=12 {
            let (mut disk, mut p) = noisy_mix(seed);
            for _ in 0..150 {
                let c = disk.step();
                let h = p.devices.get(&c.dev).cloned().unwrap_or_default();
                let ds = p.decide(&c);
                f(seed, &h, &c, &ds);
                disk.apply(&ds);
            }
        }
    }

    /// A service that arrives after the total knee on its disk expired was cut from its own
    /// rate, which that knee says nothing of: its search doubles as any arrival's.
    #[test]
    fn an_aggressor_arriving_after_the_total_knee_expired_still_doubles() {
        let mut disk = SimDisk::new(vec![
            SimService::latency("db", 5.0, 1.0),
            SimService::writer("early", SloClass::BestEffort, 1200.0, 5),
            SimService::writer("late", SloClass::BestEffort, 1200.0, 70),
        ]);
        let mut p = Adaptive::default();
        disk.run(&mut p, 65);
        // A total knee found after the first arrival (next to a writer gone since, say) and
        // expired: set again after each cycle, as if no probe found another since.
        let mut old = Knee::found(None, 2_000_000_000, 40, None);
        old.memory_cycles = 0;
        let mut late = vec![];
        for _ in 0..30 {
            p.devices.get_mut(&1).expect("device").total_knee = Some(old);
            let (c, ds) = disk.run(&mut p, 1).remove(0);
            late.extend(
                ds.iter()
                    .filter(|d| d.service == 2 && raises(&c, d))
                    .map(|d| d.reason.clone()),
            );
        }
        assert!(
            p.devices[&1].first_cap_at.is_some_and(|f| f >= 70),
            "the late writer was not cut on arrival: the test saw nothing"
        );
        assert!(
            !late.is_empty() && late.iter().all(|r| r.contains("double it")),
            "the late writer's raises: {late:?}"
        );
    }

    /// Once the total knee two capped aggressors share has expired, neither one's search
    /// doubles any more, though its own knee was never found: a raise past a knee no longer
    /// trusted creeps, and waits for the change budget.
    #[test]
    fn once_their_total_knee_expires_two_capped_aggressors_do_not_double() {
        let mut raised = 0;
        for_each_noisy_mix_cycle(|seed, h, c, ds| {
            let expired = capped_total(c).1 >= 2
                && h.total_knee.is_some_and(|k| k.trusted(c.cycle).is_none());
            for d in ds.iter().filter(|d| expired && raises(c, d)) {
                assert!(
                    !d.reason.contains("double it")
                        && !d.reason.contains("on arrival is not known"),
                    "seed {seed}, cycle {}: {} doubles past an expired total knee: {d:?}",
                    c.cycle,
                    c.services[d.service].name
                );
                raised += 1;
            }
        });
        assert!(
            raised >= 3,
            "{raised} raises after a total knee expired: the test saw nothing"
        );
    }

    /// After the search, no cap of two capped aggressors is raised while their total is
    /// within [`SETTLED_KNEE_PRECISION`] of the total knee they share, as under a service's
    /// own measured knee (during the search, [`KNEE_PRECISION`]).
    #[test]
    fn after_the_search_two_capped_aggressors_stop_1_2x_under_their_total_knee() {
        let mut stopped = 0;
        for_each_noisy_mix_cycle(|seed, h, c, ds| {
            let (total, capped) = capped_total(c);
            let knee = h.total_knee.and_then(|k| k.trusted(c.cycle));
            let near = capped >= 2
                && knee.is_some_and(|k| {
                    k as f64 > total as f64 * KNEE_PRECISION
                        && k as f64 <= total as f64 * SETTLED_KNEE_PRECISION
                });
            if !(near && h.past_search(c.cycle)) {
                return;
            }
            let raise = ds.iter().find(|d| raises(c, d));
            assert!(
                raise.is_none(),
                "seed {seed}, cycle {}: a raise with the caps at {total} B/s, within 1.2x of \
                 their total knee {knee:?}: {raise:?}",
                c.cycle
            );
            stopped += usize::from(ds.is_empty());
        });
        assert!(
            stopped >= 5,
            "{stopped} settled cycles with the caps within 1.2x of their total knee: the \
             test saw nothing"
        );
    }

    /// Of two capped writers that owe nothing, the one with the larger share is cut when the
    /// reader breaks its SLO, not the best-effort one for its class: a throughput service
    /// far over its rate target owes its excess as much.
    #[test]
    fn the_largest_writer_that_owes_nothing_is_cut_first() {
        let mut disk = db_and_two_writers(0);
        disk.services[1].limit.wbps = Some(60_000_000);
        disk.services[2].limit.wbps = Some(300_000_000);
        let mut p = Adaptive::default();
        // A slow disk: the reader breaks its SLO under both caps.
        disk.knee_scale = 0.3;
        let first = (0..10)
            .map(|_| disk.run(&mut p, 1).remove(0))
            .find(|(_, ds)| !ds.is_empty())
            .expect("nothing was cut when the disk slowed");
        assert!(first.0.services[0].violating(), "{first:?}");
        assert!(
            first
                .1
                .iter()
                .all(|d| d.service == 2 && d.to.is_some_and(|t| t < 300_000_000)),
            "the larger writer, ingest at 3x its target, was not the one cut: {:?}",
            first.1
        );
    }

    /// A throughput service above its rate target is an aggressor down to that target and
    /// no further, even when the reader it hurts is still over its SLO there: every cap set
    /// on it stays at or over its rate.
    #[test]
    fn a_throughput_aggressor_is_never_capped_under_its_rate() {
        // Where a best-effort writer settles next to the reader on this disk.
        let mut disk = pair();
        let mut p = Adaptive::default();
        disk.run(&mut p, 40);
        let knee = disk.services[1]
            .limit
            .total_bps()
            .expect("the best-effort writer was capped");
        // The same writer with a rate target twice that: no cap under it can be kept.
        let rate_bps = 2 * knee;
        let mut disk = SimDisk::new(vec![
            SimService::latency("reader", 5.0, 1.0),
            SimService::writer("ingest", SloClass::Throughput { rate_bps }, 2400.0, 5),
        ]);
        let mut p = Adaptive::default();
        let h = disk.run(&mut p, 40);
        let caps: Vec<u64> = h
            .iter()
            .flat_map(|(_, ds)| ds)
            .filter_map(|d| d.to)
            .collect();
        assert!(
            !caps.is_empty(),
            "the writer over its rate was never capped"
        );
        assert!(
            caps.iter().all(|&c| c as f64 >= rate_bps as f64 * 0.999),
            "a cap under the writer's {rate_bps} B/s rate target: {caps:?}"
        );
    }

    /// The cap that held last time, re-applied when an on/off aggressor returns, is cut at
    /// once if its first cycle in force breaks the SLO, even marginally and with the old
    /// rate's queue still passing: a cycle waited there puts the SLO back only at the
    /// fourth cycle after the return.
    #[test]
    fn a_returned_cap_that_breaks_in_its_first_cycle_is_cut_at_once() {
        let mut disk = pair();
        disk.services[1].on_off = Some((30, 20));
        let mut p = Adaptive::default();
        // Up to the writer's return and the cap that held in its first period.
        let cap = run_until(&mut disk, &mut p, 120, |d| d.reason.contains("is back"))
            .expect("the writer's return re-applied the cap that held");
        assert_cut_at_once_in_first_cycle_in_force(&mut disk, &mut p, cap);
    }

    /// The episode's first cut, when its first cycle in force still breaks the SLO, even
    /// marginally and with the old rate's queue still passing, is cut again at once by at
    /// least half: waiting a cycle there puts the SLO back only at the fourth cycle after
    /// the aggressor's arrival.
    #[test]
    fn a_first_cut_that_breaks_in_its_first_cycle_in_force_is_cut_at_once() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        let cap = run_until(&mut disk, &mut p, 20, |_| true).expect("the writer's arrival was cut");
        assert_cut_at_once_in_first_cycle_in_force(&mut disk, &mut p, cap);
    }

    /// A violation that failed one service's probe is that probe's, already undone: it does
    /// not count against another service's settled cap, which one more violation in ten
    /// would otherwise cut (seen in paper 001's mix on the test disk, run AS: ingest's probe
    /// broke db's SLO with backup's cap settled, and a violation eight cycles later cut
    /// backup as its second in ten).
    #[test]
    fn a_violation_that_failed_another_services_probe_is_not_held_against_a_settled_cap() {
        let mut disk = db_and_two_writers(5);
        let mut p = Adaptive::default();
        disk.run(&mut p, 60);
        // Up to a probe of one writer with the other's cap settled and binding.
        let (prober, other) = loop {
            assert!(disk.cycle < 400, "no probe next to a settled cap");
            let (c, ds) = disk.run(&mut p, 1).remove(0);
            let raise = ds.iter().find(|d| {
                let now = c.services[d.service].limit.get(d.knob);
                d.to.zip(now).is_some_and(|(to, now)| to > now)
            });
            if let Some(d) = raise {
                let other = 3 - d.service;
                let o = &c.services[other];
                if o.limit.total_bps().is_some() && is_settled(o, c.cycle) {
                    break (d.service, other);
                }
            }
        };
        let other_cap = disk.services[other].limit.total_bps();
        // The disk slows so that the raised cap breaks db's SLO, a little: the probe falls
        // back.
        disk.knee_scale = scale_for(&disk, 1.05, 1.3);
        let failed = (0..3)
            .find_map(|_| {
                let (c, ds) = disk.run(&mut p, 1).remove(0);
                ds.iter()
                    .any(|d| d.service == prober && d.reason.starts_with("a raise to"))
                    .then_some(c.cycle)
            })
            .expect("the probe that broke the SLO fell back");
        // Back to the disk that held, for a few cycles, then one more violation.
        disk.knee_scale = 1.0;
        let calm = disk.run(&mut p, 4);
        // The fall-back's transition (the raised rate's queue) may still break it.
        assert!(calm[1..].iter().all(|(c, _)| !c.services[0].violating()));
        assert_eq!(
            disk.services[other].limit.total_bps(),
            other_cap,
            "{other}'s cap changed since the probe"
        );
        disk.knee_scale = scale_for(&disk, 1.05, 1.3);
        let (c, ds) = disk.run(&mut p, 1).remove(0);
        assert!(c.services[0].violating(), "the slowdown broke nothing");
        assert!(c.cycle < failed + NOISE_WINDOW);
        assert!(
            ds.iter().all(|d| !d.reason.contains(BUDGET_CUT_REASON)),
            "a violation of {prober}'s failed probe at cycle {failed} was held against \
             {other}'s settled cap: {ds:?}"
        );
    }

    /// Under a knee, a cap the aggressor does not fill is not raised: the raise adds no
    /// load, and the next violation would fail it and move the knee to where nothing was
    /// measured (run AS: a writer going quiet at the end of its phase raised, and "broken"
    /// on the reader's last cycle). Once it fills the cap again the search goes on.
    #[test]
    fn under_a_knee_a_cap_the_aggressor_does_not_fill_is_not_raised() {
        let mut disk = pair();
        let mut p = Adaptive::default();
        disk.run(&mut p, 120);
        let cap = writer_cap(&disk).expect("capped");
        // A knee far over the cap, found just now: a raise half-way to it is due at once.
        let st = p.searches.get_mut(&(1, 1)).expect("searched");
        st.knee = Some(Knee::found(None, cap * 3, disk.cycle, None));
        disk.knee_scale = 3.0;
        // The writer at 60 % of its cap.
        disk.services[1].demand_bps = cap as f64 * 0.6;
        let idle = disk.run(&mut p, 6);
        assert!(
            idle.iter().all(|(_, d)| d.is_empty()),
            "a cap the writer used 60 % of was changed: {:?}",
            idle.iter().flat_map(|(_, d)| d).collect::<Vec<_>>()
        );
        disk.services[1].demand_bps = 2400e6;
        let busy = disk.run(&mut p, 6);
        assert!(
            busy.iter()
                .flat_map(|(_, d)| d)
                .any(|d| d.to.is_some_and(|to| to > cap)),
            "no raise once the writer filled its cap again: the test saw nothing"
        );
    }

    /// A raise's probe window is judged against the cap it came from: one near miss no
    /// closer to the target than that cap's own worst cycle is its scatter and does not fail
    /// the raise (run AT, paper 001's mix: db at 0.44-0.98 under backup's cap, the doubling
    /// turned back on one cycle at 0.90); a near miss closer than that still does.
    #[test]
    fn a_probe_is_not_failed_by_a_near_miss_its_held_cap_ran_too() {
        // (fell back, the raised cap, the cap the search holds now).
        let probe = |near_under_held: bool| {
            let (mut disk, mut p, cap) = settled_pair();
            // The held cap: the reader on the plateau at 0.55-0.65 of its target, one cycle at
            // 0.95-0.99.
            disk.knee_scale = scale_for(&disk, 0.55, 0.65);
            let calm = disk.run(&mut p, 4);
            disk.knee_scale = scale_for(&disk, 0.95, 0.99);
            let near = disk.run(&mut p, 1);
            disk.knee_scale = scale_for(&disk, 0.55, 0.65);
            let held = near[0].0.services[0].p999_ns.unwrap() as f64 / 5e6;
            assert!(
                calm.iter().chain(&near).all(|(_, d)| d.is_empty()),
                "the held cap changed"
            );
            // A knee far over the cap: a raise half-way to it is due once the window is clean.
            let raised = raise_toward_far_knee(&mut disk, &mut p, cap);
            // Its first cycle: one near miss, just under or just over the held cap's worst.
            let bar = p.devices[&1].near_miss();
            assert!(
                held > bar + 0.04,
                "held cap's worst {held:.3} near the bar {bar:.3}"
            );
            disk.knee_scale = if near_under_held {
                scale_for(&disk, bar + 0.01, held - 0.01)
            } else {
                scale_for(&disk, held + 0.005, 0.999)
            };
            let first = disk.run(&mut p, 1);
            disk.knee_scale = scale_for(&disk, 0.55, 0.65);
            let rest = disk.run(&mut p, 2);
            let fell_back = first
                .iter()
                .chain(&rest)
                .flat_map(|(_, d)| d)
                .any(|d| d.to == Some(cap));
            (fell_back, raised, p.searches[&(1, 1)].good)
        };
        let (fell_back, raised, good) = probe(true);
        assert!(
            !fell_back,
            "a near miss the held cap ran too failed the raise"
        );
        assert_eq!(good, Some(raised), "the raise did not hold");
        let (fell_back, _, _) = probe(false);
        assert!(
            fell_back,
            "a near miss closer than the held cap's worst did not fail the raise"
        );
    }

    /// A violation while the raised service runs under the cap it was raised from is not
    /// the raise's: back to that cap, and the raised one is no knee (run AT, writer repeat
    /// 2: a raise as the phase ended, "broken" by the reader's last cycle with the writer at
    /// 0 MB/s). A violation while it uses the raise still makes the raise the knee.
    #[test]
    fn a_raise_the_service_did_not_use_is_not_failed_as_a_knee() {
        // (the fall-back's reason, the knee the search remembers, the raised cap).
        let probe = |used: bool| {
            let (mut disk, mut p, cap) = settled_pair();
            disk.knee_scale = 3.0;
            let raised = raise_toward_far_knee(&mut disk, &mut p, cap);
            if !used {
                // The writer slows to 90 % of the cap that held as the raise lands.
                disk.services[1].demand_bps = cap as f64 * 0.9;
            }
            disk.knee_scale = scale_for(&disk, 1.1, 1.5);
            let (c, ds) = disk.run(&mut p, 1).remove(0);
            assert!(c.services[0].violating(), "the slowdown broke nothing");
            let back = ds
                .iter()
                .find(|d| d.to == Some(cap))
                .map(|d| d.reason.clone())
                .expect("no fall-back to the cap that held");
            let knee = p.searches[&(1, 1)].knee.map(|k| k.rate_bps);
            (back, knee, raised)
        };
        let (why, knee, raised) = probe(false);
        assert!(why.contains("no knee"), "{why}");
        assert_ne!(knee, Some(raised), "an unused raise became the knee");
        let (why, knee, raised) = probe(true);
        assert!(why.starts_with("a raise to"), "{why}");
        assert_eq!(
            knee,
            Some(raised),
            "a raise that broke the SLO is not the knee"
        );
    }

    /// A cap with no room under its knee does not keep the other capped services from being
    /// raised: the next in line is tried (run AU, paper 001's mix: backup at its floor just
    /// under a knee, the oldest cap for 23 cycles, and ingest never tried).
    #[test]
    fn a_cap_at_its_knee_does_not_block_the_raise_of_another() {
        let mut disk = db_and_two_writers(5);
        let mut p = Adaptive::default();
        disk.run(&mut p, 60);
        disk.knee_scale = 2.0;
        disk.run(&mut p, 25);
        let caps: Vec<u64> = (1..3)
            .map(|i| {
                disk.services[i]
                    .limit
                    .total_bps()
                    .expect("both writers capped")
            })
            .collect();
        // The oldest cap is at its knee; the other has one far over it.
        let by_age = |i: usize| (disk.services[i].changed.unwrap_or(0), i);
        let (stuck, room) = if by_age(1) <= by_age(2) {
            (1, 2)
        } else {
            (2, 1)
        };
        let now = disk.cycle;
        let knee =
            |cap: u64, x: f64| Some(Knee::found(None, (cap as f64 * x) as u64, now, Some(1.1)));
        p.searches.get_mut(&(1, stuck)).expect("searched").knee = knee(caps[stuck - 1], 1.05);
        p.searches.get_mut(&(1, room)).expect("searched").knee = knee(caps[room - 1], 3.0);
        p.devices.get_mut(&1).expect("device").total_knee = None;
        let after = disk.run(&mut p, 12);
        let raised = |i: usize| {
            after
                .iter()
                .flat_map(|(_, d)| d)
                .any(|d| d.service == i && d.to.is_some_and(|to| to > caps[i - 1]))
        };
        assert!(!raised(stuck), "the cap at its knee was raised");
        assert!(
            raised(room),
            "the cap with room under its knee was never raised"
        );
    }

    /// A failed probe's cycles are the probe's: the settled cap next to it is not trimmed
    /// for them (run AV, paper 001's mix: backup's doubling to 60 MB/s broke db's SLO, and
    /// the scatter model, fed its violation and its fall-back's transition, trimmed ingest
    /// to 87 % two cycles later; in repeat 2 ingest's failed doubling trimmed backup so).
    #[test]
    fn a_settled_cap_is_not_trimmed_for_another_s_failed_probe() {
        let (mut disk, mut p) = noisy_mix(7);
        let h = disk.run(&mut p, 30);
        let failed = h
            .iter()
            .find_map(|(c, ds)| {
                ds.iter()
                    .any(|d| d.reason.contains("broke db's SLO"))
                    .then_some(c.cycle)
            })
            .expect("no raise failed: the test saw nothing");
        let trims: Vec<&str> = h
            .iter()
            .filter(|(c, _)| c.cycle > failed && c.cycle <= failed + PROBE_CYCLES + 2)
            .flat_map(|(c, ds)| ds.iter().map(move |d| (c, d)))
            .filter(|(c, d)| {
                let was = c.services[d.service].limit.total_bps();
                d.to.is_some_and(|to| was.is_some_and(|w| to < w))
            })
            .map(|(_, d)| d.reason.as_str())
            .collect();
        assert!(trims.is_empty(), "{trims:?}");
    }

    /// The fit of a settled cap's latency against its rate takes no point from a cycle
    /// another cap's probe or fall-back moved: the level there is the other's doing, and
    /// read as this cap's it bends the fit's slope (paper 001's mix, runs AV-AX: ingest's
    /// probes put db at 0.98-1.25 under backup's unchanged cap).
    #[test]
    fn another_cap_s_probe_gives_no_point_to_a_settled_cap_s_fit() {
        let (mut disk, mut p) = noisy_mix(7);
        let fit_len =
            |p: &Adaptive, id: usize| p.searches.get(&(1, id)).map_or(0, |st| st.fit.len());
        let (mut skipped, mut taken) = (0, 0);
        for _ in 0..40 {
            // Ingest's raise on probation, or its cap changed last cycle or this one.
            let moved = p
                .searches
                .get(&(1, 2))
                .is_some_and(|st| st.before_raise.is_some())
                || disk.services[2].changed.is_some_and(|c| disk.cycle < c + 2);
            // Backup capped, its window started.
            let settled = disk.services[1].limit.total_bps().is_some()
                && disk.services[1]
                    .changed
                    .is_some_and(|c| disk.cycle >= c + 2);
            let before = fit_len(&p, 1);
            disk.run(&mut p, 1);
            let grew = fit_len(&p, 1) > before;
            if settled && moved {
                assert!(
                    !grew,
                    "backup's fit took cycle {} of ingest's probe",
                    disk.cycle - 1
                );
                skipped += 1;
            } else if settled && grew {
                taken += 1;
            }
        }
        assert!(
            skipped >= 2 && taken >= 5,
            "skipped {skipped}, taken {taken}: the test saw nothing"
        );
    }

    /// A settled cap cut for two violations in ten next to another capped service leaves
    /// their total as the device's knee, which bounds the next probe of either (run AY,
    /// paper 001's mix, repeat 1: after ingest's cut, backup's probe went half-way to a
    /// total a failed doubling had left far above it, and broke db's SLO).
    #[test]
    fn a_cut_of_a_settled_cap_next_to_another_leaves_their_total_as_the_knee() {
        let cut = (1..40)
            .find_map(|seed| {
                let (mut disk, mut p) = noisy_mix(seed);
                (0..80).find_map(|_| {
                    let (c, ds) = disk.run(&mut p, 1).remove(0);
                    let (total, n) = capped_total(&c);
                    let cut = ds.iter().any(|d| d.reason.contains(BUDGET_CUT_REASON));
                    (cut && n == 2).then(|| (total, c.cycle, p.devices[&1].total_knee))
                })
            })
            .expect("no settled cap cut next to another in 40 seeds: the test saw nothing");
        let (total, cycle, knee) = cut;
        let knee = knee
            .and_then(|k| k.trusted(cycle))
            .expect("no trusted total knee");
        assert!(
            knee <= total,
            "knee {knee} over the total {total} that broke"
        );
    }

    /// Next to another capped service, a cap's latency fit is against the device's capped
    /// total: the victim answers to their sum.
    #[test]
    fn the_latency_fit_is_against_the_capped_total() {
        let (mut disk, mut p) = noisy_mix(7);
        let mut seen = 0;
        for _ in 0..60 {
            let before = p.searches.get(&(1, 1)).map_or(0, |st| st.fit.len());
            let h = disk.run(&mut p, 1);
            let (total, n) = capped_total(&h[0].0);
            let st = p.searches.get(&(1, 1));
            if let Some(&(x, _)) = st
                .filter(|st| st.fit.len() > before)
                .and_then(|st| st.fit.back())
            {
                assert!(
                    (x - (total as f64).ln()).abs() < 1e-9,
                    "fit point {x} for a total of {total}"
                );
                seen += usize::from(n == 2);
            }
        }
        assert!(
            seen >= 5,
            "{seen} points with both capped: the test saw nothing"
        );
    }

    /// A trim is judged on the cycles since the device's last change, any service's: after
    /// one cap's change no other is trimmed before [`TRIM_MIN_CYCLES`] full cycles under it.
    #[test]
    fn a_trim_waits_for_a_window_under_the_other_caps_last_change() {
        let mut trims = 0;
        for seed in 1..25 {
            let (mut disk, mut p) = noisy_mix(seed);
            let mut changed: Vec<(u64, ServiceId)> = vec![];
            for (c, ds) in disk.run(&mut p, 120) {
                // Every decision is a change, an uncap too.
                for d in &ds {
                    if d.to.is_some() && d.reason.contains(": trim to") {
                        trims += 1;
                        let other = changed.iter().rev().find(|&&(_, s)| s != d.service);
                        assert!(
                            other.is_none_or(|&(at, _)| at + 1 + TRIM_MIN_CYCLES as u64 <= c.cycle),
                            "seed {seed}: service {} trimmed at cycle {} after service {:?}'s change ({changed:?})",
                            d.service,
                            c.cycle,
                            other
                        );
                    }
                    changed.push((c.cycle, d.service));
                }
            }
        }
        assert!(trims > 0, "no trim: the test saw nothing");
    }
}
