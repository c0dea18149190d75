//! Paper 002's batching problem (Section 6.2): split items (containers, services) into
//! batches that run at the same time, so that both the conflict penalty inside the batches
//! (`T_p`, eq. 1) and the number of batches (`N_z`, eq. 2) are small, weighed equally after
//! Min-Max normalisation (`f`, eq. 3), with at most `max_batch` items in a batch (`phi`,
//! eq. 6).
//!
//! The paper used Matlab's interior-point and SQP solvers. Here: an exact branch-and-bound
//! up to [`EXACT_MAX_ITEMS`] items and a greedy placement plus local search beyond. Written
//! by hand because this is a small set-partitioning objective no well-kept crate solves
//! directly (a MIP crate would need a solver library for a few dozen lines of search).

use thiserror::Error;

/// Up to this many items [`solve`] searches exactly. Bell(12) is about 4.2 million
/// partitions, but with the heuristic's plan as the first incumbent and the bound the search
/// took at most 3.3 ms in release on random 12-item instances; the worst kind, every pair of
/// equal penalty (many ties), took 78 ms at 14 items and 1.5 s at 16, hence 12.
pub const EXACT_MAX_ITEMS: usize = 12;

/// The heuristic's objective stayed within this of the optimum (on `f`'s 0..=2 scale) on
/// random instances with penalties 0..=2 and a random cap: measured over 2000 instances
/// each of 4, 6, 8, 10 and 12 items, the worst gaps were 0, 0.067, 0.080, 0.044 and 0.050,
/// the mean gaps at most 0.002, and 0 % to 14 % of the instances (more with more items)
/// missed the optimum.
pub const HEURISTIC_GAP: f64 = 0.1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `S` of Fig. 13: n x n, symmetric, zero diagonal.
    pub penalty: Vec<Vec<u32>>,
    /// `phi` of eq. 6: the most items one batch may hold.
    pub max_batch: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Item indices per batch; each item is in exactly one batch, no batch is empty. Sorted:
    /// items ascending in a batch, batches by their first item.
    pub batches: Vec<Vec<usize>>,
    /// `T_p` of eq. 1: the penalty of every pair sharing a batch, each pair once.
    pub total_penalty: u64,
    /// `f` of eq. 3, in 0.0..=2.0, higher is better.
    pub objective: f64,
    /// Whether `objective` is the optimum (exact search) or a heuristic's.
    pub exact: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchingError {
    #[error("penalty matrix row {row} has {len} entries but there are {n} rows; give an n x n matrix, one row and column per item")]
    NotSquare { row: usize, len: usize, n: usize },
    #[error("penalty matrix is asymmetric: S[{i}][{j}] = {ij} but S[{j}][{i}] = {ji}; give a pair the same penalty both ways")]
    Asymmetric {
        i: usize,
        j: usize,
        ij: u32,
        ji: u32,
    },
    #[error("penalty matrix diagonal S[{i}][{i}] = {value}; an item does not conflict with itself, set it to 0")]
    NonzeroDiagonal { i: usize, value: u32 },
    #[error("max_batch is 0, so no batch can hold an item; set it to at least 1 (the item count for no cap)")]
    ZeroMaxBatch,
}

impl Problem {
    fn validate(&self) -> Result<(), BatchingError> {
        if self.max_batch == 0 {
            return Err(BatchingError::ZeroMaxBatch);
        }
        let n = self.penalty.len();
        for (i, row) in self.penalty.iter().enumerate() {
            if row.len() != n {
                return Err(BatchingError::NotSquare {
                    row: i,
                    len: row.len(),
                    n,
                });
            }
        }
        for i in 0..n {
            if self.penalty[i][i] != 0 {
                return Err(BatchingError::NonzeroDiagonal {
                    i,
                    value: self.penalty[i][i],
                });
            }
            for j in i + 1..n {
                let (ij, ji) = (self.penalty[i][j], self.penalty[j][i]);
                if ij != ji {
                    return Err(BatchingError::Asymmetric { i, j, ij, ji });
                }
            }
        }
        Ok(())
    }
}

/// `T_p` of eq. 1 for `batches`: each pair sharing a batch counted once.
fn total_penalty(s: &[Vec<u32>], batches: &[Vec<usize>]) -> u64 {
    batches
        .iter()
        .map(|b| {
            let mut sum = 0u64;
            for (x, &i) in b.iter().enumerate() {
                for &j in &b[x + 1..] {
                    sum += u64::from(s[i][j]);
                }
            }
            sum
        })
        .sum()
}

/// `f` of eq. 3 for `batches` (a partition of the problem's items, as [`solve`] returns;
/// empty batches are unused, `z_k = 0`):
/// `(Max_p - T_p) / (Max_p - Min_p) + (Max_z - N_z) / (Max_z - Min_z)` with `Max_p` the
/// penalty of all items in one batch, `Min_p = 0`, `Max_z = n`, `Min_z = 1`.
///
/// A term whose range is empty counts as its best, 1.0: the penalty term when `Max_p == 0`
/// (no plan can have a penalty) and the batch term when `n <= 1` (every plan has `n`
/// batches). So `f` is in 0.0..=2.0 and never divides by zero.
///
/// # Panics
/// If a batch holds an index outside the matrix.
pub fn objective(p: &Problem, batches: &[Vec<usize>]) -> f64 {
    let n = p.penalty.len();
    let all: Vec<usize> = (0..n).collect();
    let max_p = total_penalty(&p.penalty, std::slice::from_ref(&all));
    let t_p = total_penalty(&p.penalty, batches);
    let n_z = batches.iter().filter(|b| !b.is_empty()).count();
    let penalty_term = if max_p == 0 {
        1.0
    } else {
        (max_p as f64 - t_p as f64) / max_p as f64
    };
    let batch_term = if n <= 1 {
        1.0
    } else {
        (n as f64 - n_z as f64) / (n as f64 - 1.0)
    };
    penalty_term + batch_term
}

/// The search compares plans by an integer cost that orders them exactly as `f` does, so
/// no float rounding decides between two plans:
/// `f = 2 - (T_p (n - 1) + (N_z - 1) Max_p) / (Max_p (n - 1))`, so maximising `f` is
/// minimising `T_p (n - 1) + N_z Max_p`; with `Max_p == 0` only `N_z` is left.
#[derive(Clone, Copy)]
struct Scale {
    n: usize,
    max_p: u64,
}

impl Scale {
    fn new(s: &[Vec<u32>]) -> Scale {
        let n = s.len();
        let all: Vec<usize> = (0..n).collect();
        Scale {
            n,
            max_p: total_penalty(s, std::slice::from_ref(&all)),
        }
    }

    fn cost(self, t_p: u64, n_z: usize) -> u128 {
        if self.max_p == 0 {
            n_z as u128
        } else {
            u128::from(t_p) * (self.n as u128 - 1) + n_z as u128 * u128::from(self.max_p)
        }
    }
}

/// The best plan for `p`: optimal for up to [`EXACT_MAX_ITEMS`] items (`exact: true`), the
/// heuristic's beyond (`exact: false`, within [`HEURISTIC_GAP`] on the tested instances).
pub fn solve(p: &Problem) -> Result<Plan, BatchingError> {
    p.validate()?;
    let start = heuristic(p);
    if p.penalty.len() > EXACT_MAX_ITEMS {
        return Ok(start);
    }
    let batches = exact(p, start.batches);
    Ok(plan(p, batches, true))
}

fn plan(p: &Problem, mut batches: Vec<Vec<usize>>, exact: bool) -> Plan {
    batches.retain(|b| !b.is_empty());
    for b in &mut batches {
        b.sort_unstable();
    }
    batches.sort_unstable();
    Plan {
        total_penalty: total_penalty(&p.penalty, &batches),
        objective: objective(p, &batches),
        batches,
        exact,
    }
}

/// Items ordered by their total penalty, most conflicted first: they decide the most, so
/// the greedy places them while batches are open and the exact search prunes early.
fn conflict_order(s: &[Vec<u32>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..s.len()).collect();
    order.sort_by_key(|&i| {
        (
            std::cmp::Reverse(s[i].iter().map(|&v| u64::from(v)).sum::<u64>()),
            i,
        )
    });
    order
}

/// Branch-and-bound over set partitions: items in [`conflict_order`], each into an existing
/// batch with room or a new one (batches are unlabelled, so each partition is visited once).
/// A branch is cut when even its bound, the penalty so far plus the least the remaining
/// items must add and the fewest batches they can end in, cannot beat the incumbent.
fn exact(p: &Problem, incumbent: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
    let scale = Scale::new(&p.penalty);
    let best_t_p = total_penalty(&p.penalty, &incumbent);
    let best_cost = scale.cost(best_t_p, incumbent.len());
    let mut search = Search {
        s: &p.penalty,
        cap: p.max_batch,
        scale,
        order: conflict_order(&p.penalty),
        batches: Vec::new(),
        t_p: 0,
        best_cost,
        best_t_p,
        best: incumbent,
    };
    search.visit(0);
    search.best
}

struct Search<'a> {
    s: &'a [Vec<u32>],
    cap: usize,
    scale: Scale,
    order: Vec<usize>,
    batches: Vec<Vec<usize>>,
    t_p: u64,
    best_cost: u128,
    /// The incumbent's penalty: of two plans eq. 3 scores the same (two jobs: one batch or
    /// two), the one with less penalty wins, as the paper's aim is to avoid interference.
    best_t_p: u64,
    best: Vec<Vec<usize>>,
}

impl Search<'_> {
    fn bound(&self, depth: usize) -> u128 {
        let remaining = &self.order[depth..];
        let room: usize = self.batches.iter().map(|b| self.cap - b.len()).sum();
        let forced_new = remaining.len().saturating_sub(room).div_ceil(self.cap);
        let bound = self.scale.cost(self.t_p, self.batches.len() + forced_new);
        if forced_new > 0 || remaining.is_empty() {
            return bound;
        }
        // No new batch is forced: either every remaining item joins an existing batch,
        // adding at least its cheapest join, or some opens a new batch, adding its cost.
        let joins: u64 = remaining
            .iter()
            .map(|&i| {
                self.batches
                    .iter()
                    .filter(|b| b.len() < self.cap)
                    .map(|b| conn(self.s, i, b))
                    .min()
                    .unwrap_or(0)
            })
            .sum();
        let k = self.batches.len();
        let all_join = self.scale.cost(self.t_p + joins, k);
        let one_new = self.scale.cost(self.t_p, k + 1);
        all_join.min(one_new)
    }

    fn visit(&mut self, depth: usize) {
        if depth == self.order.len() {
            let cost = self.scale.cost(self.t_p, self.batches.len());
            if (cost, self.t_p) < (self.best_cost, self.best_t_p) {
                self.best_cost = cost;
                self.best_t_p = self.t_p;
                self.best = self.batches.clone();
            }
            return;
        }
        // The penalty only grows down a branch: at an equal bound it can still win the tie
        // only while its penalty is below the incumbent's.
        let bound = self.bound(depth);
        if bound > self.best_cost || (bound == self.best_cost && self.t_p >= self.best_t_p) {
            return;
        }
        let item = self.order[depth];
        for b in 0..self.batches.len() {
            if self.batches[b].len() >= self.cap {
                continue;
            }
            let add = conn(self.s, item, &self.batches[b]);
            self.batches[b].push(item);
            self.t_p += add;
            self.visit(depth + 1);
            self.t_p -= add;
            self.batches[b].pop();
        }
        self.batches.push(vec![item]);
        self.visit(depth + 1);
        self.batches.pop();
    }
}

/// Greedy starts improved by local search, for any size (`exact: false`).
///
/// Starts: (1) items in [`conflict_order`], each into the batch (an existing one with room,
/// or a new one) that raises the cost least, joining on a tie; (2) for each batch count `K`
/// from the fewest the cap allows upwards, items into the one of `K` batches that they
/// conflict with least. One start alone settles on a batch count too early (the penalty and
/// the batch count trade against each other, and no single move crosses between counts
/// when it takes several items to open a good new batch); `K` stops once `K` batches alone
/// cost more than the best plan found. Each start then gets [`local_search`].
fn heuristic(p: &Problem) -> Plan {
    let s = &p.penalty;
    let n = s.len();
    let cap = p.max_batch;
    let scale = Scale::new(s);
    let order = conflict_order(s);

    let mut greedy: Vec<Vec<usize>> = Vec::new();
    let mut t_p = 0u64;
    for &i in &order {
        let k = greedy.len();
        let mut best = (scale.cost(t_p, k + 1), None);
        for (b, batch) in greedy.iter().enumerate() {
            if batch.len() < cap {
                let add = conn(s, i, batch);
                let cost = scale.cost(t_p + add, k);
                if cost <= best.0 {
                    best = (cost, Some((b, add)));
                }
            }
        }
        match best.1 {
            Some((b, add)) => {
                greedy[b].push(i);
                t_p += add;
            }
            None => greedy.push(vec![i]),
        }
    }
    let mut best = local_search(s, cap, scale, greedy);

    let mut k = n.div_ceil(cap);
    while k <= n && scale.cost(0, k) < best.1 {
        let mut batches: Vec<Vec<usize>> = vec![Vec::new(); k];
        for &i in &order {
            let b = (0..k)
                .filter(|&b| batches[b].len() < cap)
                .min_by_key(|&b| (conn(s, i, &batches[b]), batches[b].len()))
                .expect("k * cap >= n leaves room");
            batches[b].push(i);
        }
        batches.retain(|b| !b.is_empty());
        let found = local_search(s, cap, scale, batches);
        if found.1 < best.1 {
            best = found;
        }
        k += 1;
    }
    debug_assert_eq!(best.0.iter().map(Vec::len).sum::<usize>(), n);
    plan(p, best.0, false)
}

/// The penalty between `item` and the other members of `batch`.
fn conn(s: &[Vec<u32>], item: usize, batch: &[usize]) -> u64 {
    batch
        .iter()
        .filter(|&&j| j != item)
        .map(|&j| u64::from(s[item][j]))
        .sum()
}

/// Applies any move that lowers the cost until none does: move one item to another batch
/// with room or to a new one, swap two items of different batches, move two items into a
/// new batch of their own (one item alone rarely pays for a new batch), or merge two batches
/// that fit in one (single moves cannot empty a batch when each step on the way costs
/// more). Every applied move lowers an integer cost, so it ends; a pass is O(n^3).
/// Returns the batches and their cost.
fn local_search(
    s: &[Vec<u32>],
    cap: usize,
    scale: Scale,
    mut batches: Vec<Vec<usize>>,
) -> (Vec<Vec<usize>>, u128) {
    let mut t_p = total_penalty(s, &batches);
    // T_p after a signed change; the moves never take it below zero.
    let shift = |t_p: u64, delta: i64| -> u64 { (t_p as i64 + delta) as u64 };
    loop {
        let k = batches.len();
        let current = scale.cost(t_p, k);
        let mut improved = false;
        'moves: for a in 0..k {
            for x in 0..batches[a].len() {
                let i = batches[a][x];
                let leave = conn(s, i, &batches[a]) as i64;
                let alone = batches[a].len() == 1;
                // To a new batch: only a change when it leaves others behind.
                if !alone && scale.cost(shift(t_p, -leave), k + 1) < current {
                    batches[a].swap_remove(x);
                    batches.push(vec![i]);
                    t_p = shift(t_p, -leave);
                    improved = true;
                    break 'moves;
                }
                let k_after = if alone { k - 1 } else { k };
                for b in 0..k {
                    if b == a || batches[b].len() >= cap {
                        continue;
                    }
                    let delta = conn(s, i, &batches[b]) as i64 - leave;
                    if scale.cost(shift(t_p, delta), k_after) < current {
                        batches[a].swap_remove(x);
                        batches[b].push(i);
                        t_p = shift(t_p, delta);
                        improved = true;
                        break 'moves;
                    }
                }
            }
        }
        if !improved {
            'swaps: for a in 0..k {
                for b in a + 1..k {
                    for x in 0..batches[a].len() {
                        for y in 0..batches[b].len() {
                            let (i, j) = (batches[a][x], batches[b][y]);
                            let sij = i64::from(s[i][j]);
                            let delta = (conn(s, i, &batches[b]) as i64 - sij)
                                + (conn(s, j, &batches[a]) as i64 - sij)
                                - conn(s, i, &batches[a]) as i64
                                - conn(s, j, &batches[b]) as i64;
                            if delta < 0 {
                                batches[a][x] = j;
                                batches[b][y] = i;
                                t_p = shift(t_p, delta);
                                improved = true;
                                break 'swaps;
                            }
                        }
                    }
                }
            }
        }
        if !improved && cap >= 2 {
            'pairs: for a in 0..k {
                for b in a..k {
                    for x in 0..batches[a].len() {
                        let ys = if a == b { x + 1 } else { 0 };
                        for y in ys..batches[b].len() {
                            let (i, j) = (batches[a][x], batches[b][y]);
                            // Both leave and then share the new batch (+ S_ij); when they
                            // shared a batch before, the two leaves subtracted S_ij twice.
                            let together = if a == b { 2 } else { 1 };
                            let delta = together * i64::from(s[i][j])
                                - conn(s, i, &batches[a]) as i64
                                - conn(s, j, &batches[b]) as i64;
                            let emptied = if a == b {
                                usize::from(batches[a].len() == 2)
                            } else {
                                usize::from(batches[a].len() == 1)
                                    + usize::from(batches[b].len() == 1)
                            };
                            if scale.cost(shift(t_p, delta), k + 1 - emptied) < current {
                                // Remove the later index first so the earlier stays valid.
                                if a == b {
                                    batches[a].swap_remove(y);
                                    batches[a].swap_remove(x);
                                } else {
                                    batches[a].swap_remove(x);
                                    batches[b].swap_remove(y);
                                }
                                batches.push(vec![i, j]);
                                t_p = shift(t_p, delta);
                                improved = true;
                                break 'pairs;
                            }
                        }
                    }
                }
            }
        }
        if !improved {
            'merges: for a in 0..k {
                for b in a + 1..k {
                    if batches[a].len() + batches[b].len() > cap {
                        continue;
                    }
                    let cross: u64 = batches[b].iter().map(|&j| conn(s, j, &batches[a])).sum();
                    if scale.cost(t_p + cross, k - 1) < current {
                        let moved = std::mem::take(&mut batches[b]);
                        batches[a].extend(moved);
                        t_p += cross;
                        improved = true;
                        break 'merges;
                    }
                }
            }
        }
        batches.retain(|b| !b.is_empty());
        debug_assert_eq!(t_p, total_penalty(s, &batches));
        if !improved {
            return (batches, current);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn of_equally_scored_plans_the_one_with_less_penalty_wins() {
        // Two jobs that conflict: one batch (penalty 2) and two batches (penalty 0) both
        // score f = 1 under eq. 3; the plan must keep them apart.
        let p = super::Problem {
            penalty: vec![vec![0, 2], vec![2, 0]],
            max_batch: 2,
        };
        let plan = super::solve(&p).unwrap();
        assert_eq!(plan.batches, vec![vec![0], vec![1]]);
        assert_eq!(plan.total_penalty, 0);
    }

    use super::*;
    use crate::advise::guidelines::{penalty, GUIDELINE_FORBIDDEN};
    use crate::measure::character::CharacterClass;

    /// xorshift64: reproducible random instances without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// Uniform enough in lo..=hi for test instances.
        fn range(&mut self, lo: u64, hi: u64) -> u64 {
            lo + self.next() % (hi - lo + 1)
        }
    }

    fn random_problem(rng: &mut Rng, n: usize) -> Problem {
        // Random above the diagonal, mirrored below it.
        let upper: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| if j > i { rng.range(0, 2) as u32 } else { 0 })
                    .collect()
            })
            .collect();
        let penalty = (0..n)
            .map(|i| (0..n).map(|j| upper[i.min(j)][i.max(j)]).collect())
            .collect();
        let max_batch = rng.range(1, n.max(1) as u64) as usize;
        Problem { penalty, max_batch }
    }

    /// The best `f` over every set partition respecting the cap.
    fn brute_force(p: &Problem) -> f64 {
        fn walk(p: &Problem, i: usize, batches: &mut Vec<Vec<usize>>, best: &mut f64) {
            if i == p.penalty.len() {
                *best = best.max(objective(p, batches));
                return;
            }
            for b in 0..batches.len() {
                if batches[b].len() < p.max_batch {
                    batches[b].push(i);
                    walk(p, i + 1, batches, best);
                    batches[b].pop();
                }
            }
            batches.push(vec![i]);
            walk(p, i + 1, batches, best);
            batches.pop();
        }
        let mut best = f64::NEG_INFINITY;
        walk(p, 0, &mut Vec::new(), &mut best);
        best
    }

    /// Each item exactly once, no empty batch, within the cap, and the reported numbers
    /// are the plan's own.
    fn assert_valid(p: &Problem, plan: &Plan) {
        let n = p.penalty.len();
        let mut seen = vec![0; n];
        for b in &plan.batches {
            assert!(!b.is_empty() && b.len() <= p.max_batch, "{plan:?}");
            for &i in b {
                seen[i] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "{plan:?}");
        assert_eq!(plan.total_penalty, total_penalty(&p.penalty, &plan.batches));
        assert_eq!(plan.objective, objective(p, &plan.batches));
    }

    #[test]
    fn solve_matches_brute_force() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for n in 1..=10 {
            // Bell(10) partitions per brute force: fewer instances for the large n.
            let instances = if n <= 8 { 25 } else { 3 };
            for _ in 0..instances {
                let p = random_problem(&mut rng, n);
                let plan = solve(&p).unwrap();
                assert_valid(&p, &plan);
                assert!(plan.exact);
                let best = brute_force(&p);
                assert!(
                    (plan.objective - best).abs() < 1e-12,
                    "{p:?}: {plan:?} vs {best}"
                );
            }
        }
    }

    #[test]
    fn heuristic_is_feasible_and_near_the_optimum() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for round in 0..200 {
            let n = 1 + round % 9;
            let p = random_problem(&mut rng, n);
            let plan = heuristic(&p);
            assert_valid(&p, &plan);
            assert!(!plan.exact);
            let optimum = solve(&p).unwrap();
            let gap = optimum.objective - plan.objective;
            assert!(gap > -1e-12, "heuristic beat the exact search: {p:?}");
            assert!(
                gap <= HEURISTIC_GAP,
                "gap {gap} on {p:?}: {plan:?} vs {optimum:?}"
            );
        }
    }

    #[test]
    fn degenerate_objective() {
        let empty = Problem {
            penalty: vec![],
            max_batch: 1,
        };
        let plan = solve(&empty).unwrap();
        assert!(plan.batches.is_empty());
        assert_eq!((plan.total_penalty, plan.objective), (0, 2.0));
        let one = Problem {
            penalty: vec![vec![0]],
            max_batch: 3,
        };
        assert_eq!(solve(&one).unwrap().batches, vec![vec![0]]);
        // No penalty anywhere: one batch is best, as far as the cap allows.
        let free = Problem {
            penalty: vec![vec![0; 5]; 5],
            max_batch: 2,
        };
        let plan = solve(&free).unwrap();
        assert_eq!(plan.batches.len(), 3);
        assert_eq!(plan.objective, 1.0 + 2.0 / 4.0);
    }

    /// Table 4 of paper 002: five containers each of five applications.
    fn table4() -> Vec<CharacterClass> {
        use CharacterClass::*;
        // MySQL runs TPC-C (Table 2), a transaction mix of reads and writes whose writes are
        // mostly random (Fig. 8b): mixed. Cassandra_W is 100 % updates (Table 2) on an LSM
        // tree, over 80 % of its writes sequential (Fig. 8a): sequential writes. The FIO
        // jobs are what their names say.
        let apps = [Mixed, SeqWrite, RandRead, RandWrite, SeqWrite];
        apps.iter()
            .flat_map(|&c| std::iter::repeat_n(c, 5))
            .collect()
    }

    #[test]
    fn papers_table4_keeps_forbidden_pairs_apart() {
        let classes = table4();
        let n = classes.len();
        let s: Vec<Vec<u32>> = classes
            .iter()
            .map(|&a| classes.iter().map(|&b| penalty(a, b)).collect())
            .collect();
        // The paper's phi = n * m, and a tighter cap.
        for max_batch in [n, 8] {
            let p = Problem {
                penalty: s.clone(),
                max_batch,
            };
            let plan = solve(&p).unwrap();
            assert_valid(&p, &plan);
            assert!(!plan.exact);
            for b in &plan.batches {
                for &i in b {
                    for &j in b {
                        assert!(
                            s[i][j] < GUIDELINE_FORBIDDEN,
                            "{} and {} share a batch: {plan:?}",
                            classes[i],
                            classes[j]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        let bad = |penalty: Vec<Vec<u32>>, max_batch| solve(&Problem { penalty, max_batch });
        assert_eq!(
            bad(vec![vec![0, 1], vec![1]], 2),
            Err(BatchingError::NotSquare {
                row: 1,
                len: 1,
                n: 2
            })
        );
        assert_eq!(
            bad(vec![vec![0, 1], vec![2, 0]], 2),
            Err(BatchingError::Asymmetric {
                i: 0,
                j: 1,
                ij: 1,
                ji: 2
            })
        );
        assert_eq!(
            bad(vec![vec![0, 1], vec![1, 3]], 2),
            Err(BatchingError::NonzeroDiagonal { i: 1, value: 3 })
        );
        assert_eq!(bad(vec![vec![0]], 0), Err(BatchingError::ZeroMaxBatch));
        assert_eq!(bad(vec![], 0), Err(BatchingError::ZeroMaxBatch));
    }
}
