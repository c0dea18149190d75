//! The I/O character of a cgroup or service on a disk: what paper 002 bins workloads by
//! (read/write mix, sequential or random, request size), measured from the programs'
//! per-key counters instead of an offline block trace.

use isolator_common::SIZE_BUCKETS;
use serde::{Deserialize, Serialize};

/// Fewer data requests than this in a window give no class: too little to tell.
pub const MIN_CLASSIFIED_IOS: u64 = 32;
/// Reads (or writes) of at least this share of the requests make a read (write) workload;
/// anything between is `mixed`.
pub const DOMINANT_SHARE: f64 = 0.8;
/// At least this share of sequential requests makes a workload sequential.
pub const SEQUENTIAL_SHARE: f64 = 0.5;

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

    /// The event form; None without a data request.
    pub fn character(&self) -> Option<Character> {
        let ios = self.ios();
        if ios == 0 {
            return None;
        }
        let bytes = self.read_bytes + self.write_bytes;
        Some(Character {
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
        let ch = c.character().unwrap();
        assert_eq!(ch.ios, 80);
        assert_eq!(ch.read_ios_fraction, 0.75);
        assert_eq!(ch.sequential_fraction, 0.25);
        assert_eq!(ch.size_ios, [80, 0, 0, 0, 0]);
        assert_eq!(ch.class, Some(CharacterClass::Mixed));
        assert_eq!(CharacterCounts::default().character(), None);
        for class in CharacterClass::ALL {
            assert_eq!(CharacterClass::parse(class.as_str()), Some(class));
            let json = serde_json::to_string(&class).unwrap();
            assert_eq!(json, format!("\"{class}\""));
        }
    }
}
