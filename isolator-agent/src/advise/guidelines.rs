//! Paper 002's design guidelines (Section 5) as a conflict penalty between two workload
//! classes on one SSD: the `S_ij` weights of its Fig. 13 (0, 1 or 2, as its example uses),
//! which [`crate::advise::batching`] minimises inside a batch.
//!
//! The guidelines, numbered here in the paper's order for the heterogeneous case:
//! - G1: do not mix sequential writes (or reads) with random writes (or reads); the random
//!   side's throughput "may degrade drastically" (Cassandra_W with 4 KiB random writes:
//!   the random writer fell from 250k to 134k IOPS, Fig. 9).
//! - G2: workloads of similar character (e.g. both mostly sequential writes) share fairly
//!   (Cassandra_W with 128 KiB sequential writes: each lost only 10-15 %, Fig. 10).
//! - G3: read-intensive next to write-intensive uses the disk better and degrades both
//!   fairly (about 10 %, Fig. 11); the paper's own example sets this penalty to 0.

use crate::measure::character::CharacterClass;

/// A pair with this penalty should never share a batch when that is avoidable: the paper's
/// "relatively high" weight, for the drastic, unfair losses of G1.
pub const GUIDELINE_FORBIDDEN: u32 = 2;

/// The conflict penalty of running a workload of class `a` next to one of class `b` on the
/// same disk; symmetric, 0..=[`GUIDELINE_FORBIDDEN`].
///
/// Same-class pairs are 0: G2 says similar characters throttle each other fairly (the
/// homogeneous guidelines only limit how many run at once, which is the batch cap, not a
/// pair penalty). `Mixed` (reads and writes, neither 80 % of requests) is placed from the
/// paper's one mixed workload, MySQL TPC-C, whose writes are mostly random (Fig. 8b): it is
/// treated as random I/O in both directions, so G2 and G3 make it 0 next to the random
/// classes and itself, and G1 puts it against the sequential ones.
pub fn penalty(a: CharacterClass, b: CharacterClass) -> u32 {
    use CharacterClass::*;
    match (a, b) {
        // G1, the paper's own example of a high weight (2): the random writer loses most.
        (SeqWrite, RandWrite) | (RandWrite, SeqWrite) => GUIDELINE_FORBIDDEN,
        // G1's "(or reads)": the random reader loses most.
        (SeqRead, RandRead) | (RandRead, SeqRead) => GUIDELINE_FORBIDDEN,
        // G1, measured: MySQL TPC-C next to Cassandra_W lost ~50 % of its throughput while
        // Cassandra lost ~16 % (Section 4.2, Fig. 7), the case that led to the guideline.
        (Mixed, SeqWrite) | (SeqWrite, Mixed) => GUIDELINE_FORBIDDEN,
        // Half of G1: a mixed workload's random reads lose next to sequential reads, while
        // its writes sit fine next to a reader (G3); never measured in the paper, so 1.
        (Mixed, SeqRead) | (SeqRead, Mixed) => 1,
        // Everything else: same class (G2), reads next to writes (G3), and mixed next to
        // random reads, random writes or mixed (G2 for the shared direction, G3 for the other).
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CharacterClass::*;

    #[test]
    fn symmetric_and_within_the_paper_range() {
        for a in CharacterClass::ALL {
            for b in CharacterClass::ALL {
                assert_eq!(penalty(a, b), penalty(b, a), "{a} vs {b}");
                assert!(penalty(a, b) <= GUIDELINE_FORBIDDEN, "{a} vs {b}");
            }
            assert_eq!(penalty(a, a), 0, "{a} with itself (G2)");
        }
    }

    #[test]
    fn the_papers_two_examples() {
        // "the penalty weight to run a read intensive workload with another write intensive
        // workload may be set to 0"
        for read in [SeqRead, RandRead] {
            for write in [SeqWrite, RandWrite] {
                assert_eq!(penalty(read, write), 0, "{read} vs {write}");
            }
        }
        // "the penalty to run a sequential write workload ... and a random write workload ...
        // can be relatively high (e.g., with the weight value of 2)"
        assert_eq!(penalty(SeqWrite, RandWrite), 2);
    }
}
