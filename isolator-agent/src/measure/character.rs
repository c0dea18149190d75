//! The I/O character of a cgroup or service on a disk: what paper 002 bins workloads by
//! (read/write mix, sequential or random, request size), measured from the programs'
//! per-key counters instead of an offline block trace.

use std::collections::{HashMap, VecDeque};

use isolator_common::{OP_READ, OP_WRITE, SIZE_BUCKETS};
use serde::{Deserialize, Serialize};

use crate::collect::collector::KeyDelta;

/// Fewer data requests than this in a window give no class: too little to tell.
pub const MIN_CLASSIFIED_IOS: u64 = 32;
/// Reads (or writes) of at least this share of the requests make a read (write) workload;
/// anything between is `mixed`.
pub const DOMINANT_SHARE: f64 = 0.8;
/// At least this share of sequential requests makes a workload sequential.
pub const SEQUENTIAL_SHARE: f64 = 0.5;

/// Cycles a character's window spans: long enough to judge a workload (paper 002 samples
/// five minutes; 30 cycles are 30 s at the default interval), short enough to follow one
/// that changes.
pub const CHARACTER_WINDOW_CYCLES: usize = 30;

/// Paper 002's workload character bins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CharacterClass {
    SeqRead,
    RandRead,
    SeqWrite,
    RandWrite,
    /// Neither reads nor writes make up [`DOMINANT_SHARE`] of the requests.
    Mixed,
}

impl CharacterClass {
    pub const ALL: [CharacterClass; 5] = [
        CharacterClass::SeqRead,
        CharacterClass::RandRead,
        CharacterClass::SeqWrite,
        CharacterClass::RandWrite,
        CharacterClass::Mixed,
    ];

    /// The name events, metrics and `isolator advise` use.
    pub fn as_str(self) -> &'static str {
        match self {
            CharacterClass::SeqRead => "seq-read",
            CharacterClass::RandRead => "rand-read",
            CharacterClass::SeqWrite => "seq-write",
            CharacterClass::RandWrite => "rand-write",
            CharacterClass::Mixed => "mixed",
        }
    }

    pub fn parse(text: &str) -> Option<CharacterClass> {
        CharacterClass::ALL.into_iter().find(|c| c.as_str() == text)
    }
}

impl std::fmt::Display for CharacterClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Data requests (reads and writes; flushes and discards are left out) behind a character:
/// plain counts, so cycles and cgroups add up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CharacterCounts {
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Requests that started within `SEQUENTIAL_GAP_BYTES` of where their key's previous
    /// request ended.
    pub sequential_ios: u64,
    /// Requests per size bucket (`isolator_common::size_bucket`).
    pub size_ios: [u64; SIZE_BUCKETS],
}

impl CharacterCounts {
    /// One key's cycle: its data requests (flushes and discards are not counted).
    pub fn of_delta(d: &KeyDelta) -> CharacterCounts {
        let mut c = CharacterCounts {
            sequential_ios: d.sequential_ios,
            size_ios: d.size_ios,
            ..Default::default()
        };
        match d.key.op {
            OP_READ => {
                c.read_ios = d.ios;
                c.read_bytes = d.bytes;
            }
            OP_WRITE => {
                c.write_ios = d.ios;
                c.write_bytes = d.bytes;
            }
            _ => return CharacterCounts::default(),
        }
        c
    }

    pub fn is_empty(&self) -> bool {
        *self == CharacterCounts::default()
    }

    pub fn add(&mut self, o: &CharacterCounts) {
        self.read_ios += o.read_ios;
        self.write_ios += o.write_ios;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.sequential_ios += o.sequential_ios;
        for (a, b) in self.size_ios.iter_mut().zip(o.size_ios) {
            *a += b;
        }
    }

    pub fn ios(&self) -> u64 {
        self.read_ios + self.write_ios
    }

    /// The class, once there are [`MIN_CLASSIFIED_IOS`] requests.
    pub fn class(&self) -> Option<CharacterClass> {
        let ios = self.ios();
        if ios < MIN_CLASSIFIED_IOS {
            return None;
        }
        let read_share = self.read_ios as f64 / ios as f64;
        let sequential = self.sequential_ios as f64 / ios as f64 >= SEQUENTIAL_SHARE;
        Some(if read_share >= DOMINANT_SHARE {
            if sequential {
                CharacterClass::SeqRead
            } else {
                CharacterClass::RandRead
            }
        } else if read_share <= 1.0 - DOMINANT_SHARE {
            if sequential {
                CharacterClass::SeqWrite
            } else {
                CharacterClass::RandWrite
            }
        } else {
            CharacterClass::Mixed
        })
    }

    /// The event form of `cycles` cycles' counts; None without a data request.
    pub fn character(&self, cycles: usize) -> Option<Character> {
        let ios = self.ios();
        if ios == 0 {
            return None;
        }
        let bytes = self.read_bytes + self.write_bytes;
        Some(Character {
            cycles,
            ios,
            read_ios_fraction: self.read_ios as f64 / ios as f64,
            read_bytes_fraction: if bytes == 0 {
                0.0
            } else {
                self.read_bytes as f64 / bytes as f64
            },
            sequential_fraction: self.sequential_ios as f64 / ios as f64,
            size_ios: self.size_ios,
            class: self.class(),
        })
    }
}

/// A character as events carry it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Character {
    /// Cycles it covers.
    pub cycles: usize,
    /// Data requests behind it.
    pub ios: u64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub read_ios_fraction: f64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub read_bytes_fraction: f64,
    #[serde(deserialize_with = "crate::events::f64_or_null")]
    pub sequential_fraction: f64,
    /// Requests per size bucket: <= 4 KiB, <= 16 KiB, <= 64 KiB, <= 256 KiB, larger.
    pub size_ios: [u64; SIZE_BUCKETS],
    /// None below [`MIN_CLASSIFIED_IOS`] requests.
    pub class: Option<CharacterClass>,
}

/// The last [`CHARACTER_WINDOW_CYCLES`] cycles of one (cgroup or service, disk). Only
/// cycles with data requests are kept: on a host of thousands of mostly idle containers an
/// idle pair holds no counts.
#[derive(Debug, Default)]
pub struct CharacterWindow {
    /// (cycle, its counts), oldest first, within the window.
    cycles: VecDeque<(u64, CharacterCounts)>,
    /// The first cycle pushed: the window covers the cycles since, up to its length.
    first_cycle: Option<u64>,
    class: Option<CharacterClass>,
}

impl CharacterWindow {
    /// Adds `cycle`'s counts; the window's character, and `(from, to)` when its class
    /// changed from one class to another (not from or to "too little data").
    pub fn push(
        &mut self,
        cycle: u64,
        c: CharacterCounts,
    ) -> (Option<Character>, Option<(CharacterClass, CharacterClass)>) {
        let window = CHARACTER_WINDOW_CYCLES as u64;
        while self
            .cycles
            .front()
            .is_some_and(|(old, _)| old + window <= cycle)
        {
            self.cycles.pop_front();
        }
        if !c.is_empty() {
            self.cycles.push_back((cycle, c));
        }
        let first = *self.first_cycle.get_or_insert(cycle);
        let mut sum = CharacterCounts::default();
        for (_, c) in &self.cycles {
            sum.add(c);
        }
        let covered = (cycle.saturating_sub(first) + 1).min(window) as usize;
        let character = sum.character(covered);
        let class = sum.class();
        let change = match (self.class, class) {
            (Some(from), Some(to)) if from != to => Some((from, to)),
            _ => None,
        };
        if class.is_some() {
            self.class = class;
        }
        (character, change)
    }
}

/// The windows of every (id, disk): cgroups by id, services by name.
#[derive(Debug)]
pub struct CharacterWindows<Id> {
    windows: HashMap<(Id, u32), CharacterWindow>,
}

impl<Id> Default for CharacterWindows<Id> {
    fn default() -> Self {
        CharacterWindows {
            windows: HashMap::new(),
        }
    }
}

impl<Id: std::hash::Hash + Eq + Clone> CharacterWindows<Id> {
    pub fn push(
        &mut self,
        id: &Id,
        dev: u32,
        cycle: u64,
        c: CharacterCounts,
    ) -> (Option<Character>, Option<(CharacterClass, CharacterClass)>) {
        self.windows
            .entry((id.clone(), dev))
            .or_default()
            .push(cycle, c)
    }

    pub fn forget(&mut self, id: &Id) {
        self.windows.retain(|(i, _), _| i != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(read_ios: u64, write_ios: u64, sequential_ios: u64) -> CharacterCounts {
        CharacterCounts {
            read_ios,
            write_ios,
            read_bytes: read_ios * 4096,
            write_bytes: write_ios * 4096,
            sequential_ios,
            size_ios: [read_ios + write_ios, 0, 0, 0, 0],
        }
    }

    #[test]
    fn classes_follow_the_mix_and_the_sequential_share() {
        use CharacterClass::*;
        let cases = [
            (counts(100, 0, 100), Some(SeqRead)),
            (counts(100, 0, 3), Some(RandRead)),
            (counts(0, 100, 90), Some(SeqWrite)),
            (counts(5, 95, 10), Some(RandWrite)),
            (counts(70, 30, 0), Some(Mixed)),
            (counts(80, 20, 50), Some(SeqRead)),
            (counts(10, 10, 20), None),
        ];
        for (c, class) in cases {
            assert_eq!(c.class(), class, "{c:?}");
        }
    }

    #[test]
    fn counts_add_and_the_event_form_says_the_fractions() {
        let mut c = counts(30, 10, 10);
        c.add(&counts(30, 10, 10));
        let ch = c.character(2).unwrap();
        assert_eq!((ch.cycles, ch.ios), (2, 80));
        assert_eq!(ch.read_ios_fraction, 0.75);
        assert_eq!(ch.sequential_fraction, 0.25);
        assert_eq!(ch.size_ios, [80, 0, 0, 0, 0]);
        assert_eq!(ch.class, Some(CharacterClass::Mixed));
        assert_eq!(CharacterCounts::default().character(1), None);
        for class in CharacterClass::ALL {
            assert_eq!(CharacterClass::parse(class.as_str()), Some(class));
            let json = serde_json::to_string(&class).unwrap();
            assert_eq!(json, format!("\"{class}\""));
        }
    }

    #[test]
    fn a_window_follows_a_workload_that_changes_and_says_so_once() {
        let mut w = CharacterWindow::default();
        let mut changes = vec![];
        // Random reads, then sequential writes: the window's class turns when the writes
        // outnumber the reads enough.
        for cycle in 0..80 {
            let c = if cycle < 40 {
                counts(50, 0, 0)
            } else {
                counts(0, 50, 50)
            };
            let (ch, change) = w.push(cycle, c);
            assert!(ch.unwrap().cycles <= CHARACTER_WINDOW_CYCLES);
            changes.extend(change.map(|x| (cycle, x)));
        }
        use CharacterClass::*;
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert_eq!(changes[0].1, (RandRead, Mixed));
        assert_eq!(changes[1].1, (Mixed, SeqWrite));
        let (ch, _) = w.push(80, counts(0, 50, 50));
        assert_eq!(ch.unwrap().class, Some(SeqWrite));
        // Idle cycles keep nothing; after a whole window of them nothing is left to tell.
        let (ch, _) = w.push(
            81 + CHARACTER_WINDOW_CYCLES as u64,
            CharacterCounts::default(),
        );
        assert_eq!(ch, None);
        assert!(w.cycles.is_empty());
    }
}
