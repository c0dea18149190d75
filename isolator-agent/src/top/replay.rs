//! `isolator top --replay FILE`: a recorded event stream (`isolator run --json FILE`) shown
//! cycle by cycle. Pure: the file's text in, the [`Model`] at any cycle out; playback is
//! driven by [`Replay::tick`] with the time that passed, so tests need no terminal or clock.
//!
//! Stepping back cannot un-ingest events, so the model at cycle `p` is rebuilt from the
//! nearest saved model before it. Memory is bounded in models, not cycles: at most
//! [`MAX_CHECKPOINTS`] checkpoints spread over the whole file plus [`SEGMENT_MODELS`] in the
//! stretch being browsed, 97 models with the current one. A model is bounded by its own
//! caps (1,000 actions, 300 history points per row): roughly 250 KB plus 13 KB per row, so
//! about 25 MB plus 1.3 MB per row at most, besides the file's text, which is kept (read
//! once). On a day at 1 s (86,400 cycles) checkpoints fall every 2,048 cycles and the
//! stretch being browsed keeps one every 64: a step back re-ingests at most 64 cycles,
//! after the first step back into a stretch (at most 2,048). Measured on such a day of
//! two services (a 53 MB file), debug build: 77 MB resident, a step back under 0.1 s.

use std::time::{Duration, SystemTime};

use super::model::{parse_event, Model, StreamError};
use crate::events::Event;

/// Checkpoints kept over the whole file at most (their spacing doubles to stay under).
pub const MAX_CHECKPOINTS: usize = 64;
/// Models kept in the stretch between two checkpoints being browsed.
pub const SEGMENT_MODELS: usize = 32;
/// Checkpoint spacing in a short file: re-ingesting this many cycles is instant.
const MIN_STRIDE: usize = 16;
/// Fastest playback, times the recorded pace.
pub const MAX_SPEED: u32 = 64;
/// A longer gap between two recorded cycles (an agent restart, a suspended host) plays as
/// this: the longest cycle the agent runs.
const LONGEST_GAP: Duration = Duration::from_secs(10);
/// The pace when the recording has no usable timestamps.
const DEFAULT_GAP: Duration = Duration::from_secs(1);
/// Steps one tick may take at most, so a long stall does not replay hours at once.
const MAX_STEPS_PER_TICK: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReplayError {
    #[error("line {line}: {err}")]
    Schema { line: usize, err: StreamError },
    #[error("no isolator events in its {lines} line{}; replay a file 'isolator run --json FILE' wrote", if *lines == 1 { "" } else { "s" })]
    NoEvents { lines: usize },
    #[error("isolator events but no complete cycle (no cycle_end): the agent stopped within its first cycle; record for longer")]
    NoCycle,
}

/// One recorded cycle: the lines since the previous `cycle_end`, through its own.
#[derive(Clone, Debug)]
pub struct Cycle {
    /// Byte range of its lines in the text.
    start: usize,
    end: usize,
    /// The `cycle_end`'s `ts`, as recorded.
    pub ts: Option<String>,
    time: Option<SystemTime>,
    /// The agent's own cycle number (it starts again at 1 when the agent restarts).
    pub agent_cycle: Option<u64>,
    /// Which agent run (1-based) it belongs to: each `agent_start` begins one.
    pub run: usize,
}

/// The file, indexed by cycle, with checkpoints of the model.
pub struct Recording {
    text: String,
    cycles: Vec<Cycle>,
    /// Lines after the last `cycle_end` (agent_stop, restores): shown at the last cycle.
    tail: (usize, usize),
    /// Lines that are not isolator events, skipped.
    pub broken: usize,
    /// Agent runs in the file.
    pub runs: usize,
    /// `checkpoints[j]` is the model after cycle `j * stride`.
    checkpoints: Vec<Model>,
    stride: usize,
}

/// The non-blank lines of a stretch of the file.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim().is_empty())
}

impl Recording {
    /// Reads the whole stream once: indexes cycles and saves checkpoints. Lines that are
    /// not events are counted; another schema is an error (its model would be wrong).
    pub fn parse(text: String) -> Result<Recording, ReplayError> {
        let mut model = Model::default();
        let mut cycles: Vec<Cycle> = vec![];
        let mut checkpoints = vec![];
        let mut stride = MIN_STRIDE;
        let (mut broken, mut events, mut runs, mut total_lines) = (0, 0, 0, 0);
        let mut start = 0;
        let mut offset = 0;
        for chunk in text.split_inclusive('\n') {
            offset += chunk.len();
            let line = chunk.trim_end_matches(['\n', '\r']);
            if line.trim().is_empty() {
                continue;
            }
            total_lines += 1;
            let e = match parse_event(line) {
                Ok(e) => e,
                Err(err @ StreamError::Schema(_)) => {
                    let line = text[..offset].lines().count();
                    return Err(ReplayError::Schema { line, err });
                }
                Err(StreamError::NotAnEvent(_)) => {
                    broken += 1;
                    continue;
                }
            };
            events += 1;
            model.ingest(&e);
            match &e.event {
                Event::AgentStart(_) => runs += 1,
                Event::CycleEnd(end) => {
                    let ts = (!e.ts.is_empty()).then(|| e.ts.clone());
                    let time = ts
                        .as_deref()
                        .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
                    cycles.push(Cycle {
                        start,
                        end: offset,
                        ts,
                        time,
                        agent_cycle: (end.cycle > 0).then_some(end.cycle),
                        run: runs.max(1),
                    });
                    start = offset;
                    let i = cycles.len() - 1;
                    if i.is_multiple_of(stride) {
                        checkpoints.push(model.clone());
                        if checkpoints.len() > MAX_CHECKPOINTS {
                            // Keep the even ones: the spacing doubles, the count halves.
                            let mut k = 0;
                            checkpoints.retain(|_| {
                                k += 1;
                                k % 2 == 1
                            });
                            stride *= 2;
                        }
                    }
                }
                _ => {}
            }
        }
        if events == 0 {
            return Err(ReplayError::NoEvents { lines: total_lines });
        }
        if cycles.is_empty() {
            return Err(ReplayError::NoCycle);
        }
        Ok(Recording {
            tail: (start, text.len()),
            text,
            cycles,
            broken,
            runs: runs.max(1),
            checkpoints,
            stride,
        })
    }

    pub fn len(&self) -> usize {
        self.cycles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cycles.is_empty()
    }

    pub fn cycle(&self, i: usize) -> &Cycle {
        &self.cycles[i]
    }

    fn last(&self) -> usize {
        self.cycles.len() - 1
    }

    /// Feeds cycle `i`'s lines to `m`.
    fn ingest(&self, m: &mut Model, i: usize) {
        let c = &self.cycles[i];
        self.ingest_range(m, c.start, c.end);
    }

    /// Feeds the lines after the last cycle to `m`: they belong to the last cycle's screen.
    fn ingest_tail(&self, m: &mut Model) {
        self.ingest_range(m, self.tail.0, self.tail.1);
    }

    fn ingest_range(&self, m: &mut Model, start: usize, end: usize) {
        // Broken lines were counted when indexing; here they are skipped again.
        for l in lines(&self.text[start..end]) {
            let _ = m.ingest_line(l);
        }
    }

    /// How long cycle `i` took to record, to play it at that pace.
    fn gap_before(&self, i: usize) -> Duration {
        let t = |j: usize| self.cycles.get(j).and_then(|c| c.time);
        match (i.checked_sub(1).and_then(t), t(i)) {
            (Some(a), Some(b)) => b.duration_since(a).unwrap_or(DEFAULT_GAP),
            _ => DEFAULT_GAP,
        }
        .min(LONGEST_GAP)
    }
}

/// Where the replay is and whether it plays.
pub struct Replay {
    rec: Recording,
    pos: usize,
    model: Model,
    /// Models saved in the stretch last rebuilt from a checkpoint, by cycle index.
    segment: Vec<(usize, Model)>,
    pub playing: bool,
    /// Times the recorded pace.
    pub speed: u32,
    /// Time played since the current cycle was shown.
    waited: Duration,
    /// Said in the status line until the next key: the end, or a refused jump.
    pub note: Option<String>,
}

impl Replay {
    /// Starts paused at the first cycle: a recording is read more than watched, and
    /// nothing should move before the reader has jumped to where they look.
    pub fn new(rec: Recording) -> Replay {
        let mut model = rec.checkpoints[0].clone();
        if rec.len() == 1 {
            rec.ingest_tail(&mut model);
        }
        Replay {
            rec,
            pos: 0,
            model,
            segment: vec![],
            playing: false,
            speed: 1,
            waited: Duration::ZERO,
            note: None,
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn recording(&self) -> &Recording {
        &self.rec
    }

    /// The cycle shown, 0-based.
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn current(&self) -> &Cycle {
        self.rec.cycle(self.pos)
    }

    pub fn at_end(&self) -> bool {
        self.pos == self.rec.last()
    }

    /// Play or pause; playing from the end starts again from the first cycle.
    pub fn toggle(&mut self) {
        self.note = None;
        self.waited = Duration::ZERO;
        if self.playing {
            self.playing = false;
        } else {
            if self.at_end() {
                self.seek(0);
            }
            self.playing = true;
        }
    }

    pub fn faster(&mut self) {
        self.speed = (self.speed * 2).min(MAX_SPEED);
    }

    pub fn slower(&mut self) {
        self.speed = (self.speed / 2).max(1);
    }

    /// Moves by `by` cycles, stopping at either end.
    pub fn step(&mut self, by: isize) {
        self.note = None;
        let to = self.pos.saturating_add_signed(by).min(self.rec.last());
        self.seek(to);
    }

    pub fn first(&mut self) {
        self.note = None;
        self.seek(0);
    }

    pub fn last(&mut self) {
        self.note = None;
        self.seek(self.rec.last());
    }

    /// Shows cycle `to` (0-based), from the closest model at or before it.
    pub fn seek(&mut self, to: usize) {
        let to = to.min(self.rec.last());
        self.waited = Duration::ZERO;
        if to == self.pos {
            return;
        }
        let cp = to / self.rec.stride;
        let cp_at = cp * self.rec.stride;
        let saved = self
            .segment
            .iter()
            .rev()
            .find(|(i, _)| *i <= to && *i >= cp_at);
        // The current model serves only going forward (then it is not the last cycle's,
        // which holds the tail).
        let from_current =
            self.pos < to && saved.is_none_or(|(i, _)| *i <= self.pos) && self.pos >= cp_at;
        let (mut at, mut model, fresh) = if from_current {
            (self.pos, std::mem::take(&mut self.model), false)
        } else if let Some((i, m)) = saved {
            (*i, m.clone(), false)
        } else {
            (cp_at, self.rec.checkpoints[cp].clone(), true)
        };
        if fresh {
            // A new stretch: save models along it so the next steps back are short.
            self.segment.clear();
        }
        let every = self.rec.stride.div_ceil(SEGMENT_MODELS).max(1);
        while at < to {
            at += 1;
            self.rec.ingest(&mut model, at);
            if fresh && (at - cp_at).is_multiple_of(every) && at < to {
                self.segment.push((at, model.clone()));
            }
        }
        if to == self.rec.last() {
            self.rec.ingest_tail(&mut model);
        }
        self.model = model;
        self.pos = to;
    }

    /// How long until playback shows the next cycle; None while paused.
    pub fn until_next(&self) -> Option<Duration> {
        if !self.playing || self.at_end() {
            return None;
        }
        Some(self.pace(self.pos + 1).saturating_sub(self.waited))
    }

    fn pace(&self, i: usize) -> Duration {
        self.rec.gap_before(i) / self.speed
    }

    /// `elapsed` has passed: while playing, shows the cycles due. True when it moved.
    pub fn tick(&mut self, elapsed: Duration) -> bool {
        if !self.playing {
            return false;
        }
        self.waited += elapsed;
        let mut moved = false;
        for _ in 0..MAX_STEPS_PER_TICK {
            if self.at_end() {
                break;
            }
            let due = self.pace(self.pos + 1);
            if self.waited < due {
                break;
            }
            let left = self.waited - due;
            self.seek(self.pos + 1);
            self.waited = left;
            moved = true;
        }
        if self.at_end() {
            self.playing = false;
            self.note = Some("end of the recording".into());
        } else if self.until_next() == Some(Duration::ZERO) {
            // Behind by more than a tick's steps (a stalled terminal): go on from here.
            self.waited = Duration::ZERO;
        }
        moved
    }

    /// The `:` prompt: `120` (the 120th cycle of the file), `+10` / `-10` (cycles),
    /// `+5m` / `-30s` (recorded time), `10:54:30` (that time on the shown cycle's day, as
    /// recorded, UTC) or a full timestamp. Refused jumps say why in the note.
    pub fn goto(&mut self, input: &str) {
        self.note = None;
        match self.target(input.trim()) {
            Ok(to) => self.seek(to),
            Err(why) => self.note = Some(why),
        }
    }

    fn target(&self, s: &str) -> Result<usize, String> {
        let n = self.rec.len();
        let hint =
            format!("'{s}' is not a cycle or a time: try 1-{n}, +10, -10, +5m, -30s, 10:54:30");
        if s.is_empty() {
            return Err(hint);
        }
        // Not parse alone: it takes "+7" for 7.
        if let Some(k) = s
            .starts_with(|c: char| c.is_ascii_digit())
            .then(|| s.parse::<usize>().ok())
            .flatten()
        {
            return if (1..=n).contains(&k) {
                Ok(k - 1)
            } else {
                Err(format!("no cycle {k}: the recording has cycles 1-{n}"))
            };
        }
        if let Some(rest) = s.strip_prefix(['+', '-']) {
            let back = s.starts_with('-');
            if let Ok(k) = rest.parse::<usize>() {
                let to = if back {
                    self.pos.saturating_sub(k)
                } else {
                    self.pos.saturating_add(k)
                };
                return Ok(to.min(n - 1));
            }
            let d = humantime::parse_duration(rest).map_err(|_| hint.clone())?;
            let now = self.timed()?;
            let t = if back {
                now.checked_sub(d).ok_or(hint)?
            } else {
                now.checked_add(d).ok_or(hint)?
            };
            return self.at_or_after(t);
        }
        let t = if s.contains(['T', ' ']) || s.matches('-').count() >= 2 {
            humantime::parse_rfc3339_weak(s).map_err(|_| hint.clone())?
        } else {
            // A time of day: on the shown cycle's date.
            let hms: Vec<u32> = s.split(':').map(|p| p.parse().unwrap_or(99)).collect();
            let ok = matches!(hms.len(), 2 | 3) && hms[0] < 24 && hms[1..].iter().all(|&v| v < 60);
            let date = self.current().ts.as_deref().and_then(|t| t.get(..10));
            match (ok, date) {
                (false, _) => return Err(hint),
                (true, None) => return Err("the recording has no timestamps to go to".into()),
                (true, Some(date)) => humantime::parse_rfc3339_weak(&format!(
                    "{date}T{:02}:{:02}:{:02}Z",
                    hms[0],
                    hms[1],
                    hms.get(2).copied().unwrap_or(0)
                ))
                .map_err(|_| hint)?,
            }
        };
        self.at_or_after(t)
    }

    fn timed(&self) -> Result<SystemTime, String> {
        self.current()
            .time
            .ok_or_else(|| "the shown cycle has no timestamp to count from".into())
    }

    /// The first cycle recorded at or after `t`.
    fn at_or_after(&self, t: SystemTime) -> Result<usize, String> {
        self.rec
            .cycles
            .iter()
            .position(|c| c.time.is_some_and(|ct| ct >= t))
            .ok_or_else(|| {
                format!(
                    "nothing recorded at or after {}: the recording ends at {}",
                    humantime::format_rfc3339_seconds(t),
                    self.rec.cycles[self.rec.last()]
                        .ts
                        .as_deref()
                        .unwrap_or("an unknown time")
                )
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::top::model::tests::{recorded_until, RECORDED};

    pub fn recorded() -> Replay {
        Replay::new(Recording::parse(RECORDED.to_string()).unwrap())
    }

    /// What identifies a model's state, for comparing two routes to one cycle.
    fn fingerprint(m: &Model) -> String {
        let rows: Vec<String> = m
            .rows()
            .map(|r| {
                format!(
                    "{:?} {} {:?} {:?} {} {:?} {}",
                    r.key,
                    r.samples,
                    r.p999_ns,
                    r.state,
                    r.write_mbps,
                    r.limit,
                    r.history.0.len()
                )
            })
            .collect();
        format!(
            "#{} {:?} {:?} {} {:?}",
            m.cycle,
            m.disks,
            m.link,
            m.actions.len(),
            rows
        )
    }

    #[test]
    fn the_recorded_stream_is_indexed_by_cycle() {
        let r = recorded();
        assert_eq!(r.recording().len(), 19);
        assert_eq!(r.recording().broken, 0);
        assert_eq!(r.recording().runs, 1);
        assert_eq!(r.position(), 0);
        assert!(!r.playing);
        assert_eq!(r.model().cycle, 1);
        assert_eq!(r.current().ts.as_deref(), Some("2026-11-23T10:54:21.894Z"));
        assert_eq!(r.recording().cycle(18).agent_cycle, Some(19));
    }

    #[test]
    fn every_cycle_reached_any_way_is_the_model_of_a_straight_read() {
        let mut r = recorded();
        for c in 1..=19u64 {
            r.seek(c as usize - 1);
            let straight = recorded_until(c);
            if c < 19 {
                assert_eq!(fingerprint(r.model()), fingerprint(&straight), "cycle {c}");
            }
        }
        // The last cycle also has the lines after it: the agent stopped.
        assert!(matches!(
            r.model().link,
            crate::top::model::Link::Stopped(_)
        ));
        let end = fingerprint(r.model());
        // Backwards, one step at a time, then forwards again.
        for c in (1..19u64).rev() {
            r.step(-1);
            assert_eq!(r.position(), c as usize - 1);
            assert_eq!(fingerprint(r.model()), fingerprint(&recorded_until(c)));
        }
        r.step(-1);
        assert_eq!(r.position(), 0);
        r.last();
        assert_eq!(fingerprint(r.model()), end);
        r.first();
        assert_eq!(r.model().cycle, 1);
        r.step(100);
        assert!(r.at_end());
    }

    /// A stream of `n` cycles of one service, for files longer than the test recording.
    fn long_stream(n: u64) -> String {
        let mut s = String::new();
        s.push_str(r#"{"schema":1,"ts":"2026-01-01T00:00:00.000Z","type":"agent_start","host":"h","interval_s":1.0}"#);
        s.push('\n');
        for c in 1..=n {
            let ts = humantime::format_rfc3339_millis(
                SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600 + c),
            );
            s.push_str(&format!(
                r#"{{"schema":1,"ts":"{ts}","type":"service_stats","cycle":{c},"service":"s","slo":{{"class":"best-effort"}},"dev":"8:0","disk":"sda","state":"ok","samples":{c},"write_mbps":{c}.0}}"#
            ));
            s.push('\n');
            if c % 100 == 0 {
                s.push_str(&format!(
                    r#"{{"schema":1,"ts":"{ts}","type":"decision","cycle":{c},"service":"s","knob":"wbps","old":"0","new":"{c}","applied":true,"reason":"r"}}"#
                ));
                s.push('\n');
            }
            s.push_str(&format!(
                r#"{{"schema":1,"ts":"{ts}","type":"cycle_end","cycle":{c}}}"#
            ));
            s.push('\n');
        }
        s
    }

    #[test]
    fn a_long_recording_keeps_few_checkpoints_and_steps_back_right() {
        let n = 5_000u64;
        let text = long_stream(n);
        let rec = Recording::parse(text.clone()).unwrap();
        assert_eq!(rec.len(), n as usize);
        assert!(rec.checkpoints.len() <= MAX_CHECKPOINTS);
        assert!(rec.checkpoints.len() > MAX_CHECKPOINTS / 2);
        let stride = rec.stride;
        let mut r = Replay::new(rec);
        r.last();
        // The straight read of the first `upto` cycles.
        let straight = |upto: usize| {
            let mut m = Model::default();
            let mut ends = 0;
            for l in text.lines() {
                m.ingest_line(l).unwrap();
                if l.contains("cycle_end") {
                    ends += 1;
                    if ends == upto {
                        break;
                    }
                }
            }
            m
        };
        for _ in 0..(stride + 3) {
            r.step(-1);
        }
        let at = r.position();
        assert_eq!(fingerprint(r.model()), fingerprint(&straight(at + 1)));
        assert!(r.segment.len() <= SEGMENT_MODELS + 1);
        r.goto("+7");
        assert_eq!(r.position(), at + 7);
        assert_eq!(fingerprint(r.model()), fingerprint(&straight(at + 8)));
        r.goto("1234");
        assert_eq!(r.position(), 1233);
        assert_eq!(fingerprint(r.model()), fingerprint(&straight(1234)));
        // Time: cycle c was recorded at c seconds past midnight.
        r.goto("+1m");
        assert_eq!(r.position(), 1293);
        r.goto("01:00");
        assert_eq!(r.recording().cycle(r.position()).agent_cycle, Some(3600));
        r.goto("2026-01-01T00:00:10Z");
        assert_eq!(r.position(), 9);
    }

    #[test]
    fn playback_keeps_the_recorded_pace_and_stops_at_the_end() {
        let mut r = recorded();
        assert!(!r.tick(Duration::from_secs(5)), "starts paused");
        r.toggle();
        assert!(r.playing);
        // Cycle 2 was recorded 1.000 s after cycle 1.
        assert_eq!(r.until_next(), Some(Duration::from_millis(1000)));
        assert!(!r.tick(Duration::from_millis(900)));
        assert!(r.tick(Duration::from_millis(100)));
        assert_eq!(r.position(), 1);
        r.faster();
        r.faster();
        assert_eq!(r.speed, 4);
        assert!(r.tick(Duration::from_millis(500)));
        assert_eq!(r.position(), 3);
        r.toggle();
        assert!(!r.tick(Duration::from_secs(60)));
        assert_eq!(r.position(), 3);
        r.slower();
        r.slower();
        r.slower();
        assert_eq!(r.speed, 1);
        r.toggle();
        r.tick(Duration::from_secs(3600));
        assert!(r.at_end() && !r.playing);
        assert_eq!(r.note.as_deref(), Some("end of the recording"));
        // Playing at the end starts over.
        r.toggle();
        assert_eq!(r.position(), 0);
        assert!(r.playing);
    }

    #[test]
    fn refused_jumps_say_why() {
        let mut r = recorded();
        r.step(4);
        for (input, says) in [
            ("20", "no cycle 20: the recording has cycles 1-19"),
            ("0", "no cycle 0"),
            ("abc", "'abc' is not a cycle or a time: try 1-19, +10"),
            ("", "is not a cycle"),
            ("25:00", "is not a cycle"),
            ("+5 parsecs", "is not a cycle"),
            ("11:00", "nothing recorded at or after 2026-11-23T11:00:00Z"),
        ] {
            r.goto(input);
            let note = r.note.clone().unwrap_or_default();
            assert!(note.contains(says), "{input:?}: {note}");
            assert_eq!(r.position(), 4, "{input:?} moved");
        }
        r.goto("10:54:30");
        assert_eq!(r.model().cycle, 10);
        assert!(r.note.is_none());
        r.goto("-3s");
        assert_eq!(r.model().cycle, 7);
        r.goto("-100");
        assert_eq!(r.position(), 0);
    }

    #[test]
    fn bad_files_are_errors_and_broken_lines_are_counted() {
        assert_eq!(
            Recording::parse("hello\nworld\n".into()).err(),
            Some(ReplayError::NoEvents { lines: 2 })
        );
        assert_eq!(
            Recording::parse(String::new()).err(),
            Some(ReplayError::NoEvents { lines: 0 })
        );
        let first = RECORDED.lines().take(3).collect::<Vec<_>>().join("\n");
        assert_eq!(Recording::parse(first).err(), Some(ReplayError::NoCycle));
        let newer = format!(
            "{}\n{{\"schema\":2,\"type\":\"cycle_end\"}}\n",
            RECORDED.lines().next().unwrap()
        );
        let e = Recording::parse(newer).err().unwrap();
        assert!(
            e.to_string()
                .starts_with("line 2: the agent speaks event schema 2"),
            "{e}"
        );
        // Broken lines inside: counted, skipped, the rest plays.
        let mut text = String::new();
        for (i, l) in RECORDED.lines().enumerate() {
            text.push_str(l);
            text.push('\n');
            if i % 30 == 5 {
                text.push_str("{\"schema\":1,\"type\":\"cgroup_st\n\n");
            }
        }
        let rec = Recording::parse(text).unwrap();
        assert_eq!(rec.broken, 3);
        assert_eq!(rec.len(), 19);
        let mut r = Replay::new(rec);
        r.seek(7);
        assert_eq!(fingerprint(r.model()), fingerprint(&recorded_until(8)));
    }
}
