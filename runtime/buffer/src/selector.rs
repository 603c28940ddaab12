//! Task selectors: which row of a taskset the `d`-th draw takes.
//!
//! A selector is a pure function of `(kind, taskset length, seed, draw number)`: the only state a run has to
//! keep is how many draws it made (see [`crate::scheduler::SchedulerState`]), so a resumed run continues
//! exactly where it stopped. The generator is SplitMix64 — small, fixed forever, and independent of any crate's
//! version — so orders are reproducible across builds. They are not NumPy's orders: a Trinity-RFT run and a
//! trinity run with the same seed shuffle differently.
//!
//! * `sequential`: row `d mod len`, epoch after epoch.
//! * `shuffle`: epoch `e = d / len` visits every row once, in a permutation seeded by `(seed, e)`.
//! * `random`: each draw is uniform over all rows, independently (with replacement), seeded by `(seed, d)`.

use crate::error::{BufferError, Result};

/// Selector kinds supported by [`Selector`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorKind {
    Sequential,
    Shuffle,
    Random,
}

impl SelectorKind {
    /// Parses a config's `selector_type`; `difficulty_based` is refused by name until it is implemented.
    pub fn parse(taskset: &str, name: &str) -> Result<SelectorKind> {
        match name {
            "sequential" => Ok(SelectorKind::Sequential),
            "shuffle" => Ok(SelectorKind::Shuffle),
            "random" => Ok(SelectorKind::Random),
            other => Err(BufferError::UnsupportedSelector { taskset: taskset.to_owned(), selector: other.to_owned() }),
        }
    }
}

/// Maps draw numbers to row indices of one taskset.
#[derive(Debug, Clone)]
pub struct Selector {
    kind: SelectorKind,
    len: usize,
    seed: u64,
    /// The permutation of the last epoch asked for (`shuffle` only): draws come in order, so one is enough.
    cached: Option<(u64, Vec<usize>)>,
}

impl Selector {
    /// A selector over `len` rows; `len` must be at least 1 (tasksets are never empty, see `Taskset::load`).
    pub fn new(kind: SelectorKind, len: usize, seed: u64) -> Selector {
        Selector { kind, len: len.max(1), seed, cached: None }
    }

    pub fn kind(&self) -> SelectorKind {
        self.kind
    }

    /// Row index of draw number `draw` (0-based, counted over the whole run).
    pub fn index(&mut self, draw: u64) -> usize {
        let len = self.len as u64;
        match self.kind {
            SelectorKind::Sequential => (draw % len) as usize,
            SelectorKind::Random => uniform(splitmix64(self.seed ^ splitmix64(draw)), self.len),
            SelectorKind::Shuffle => {
                let epoch = draw / len;
                let position = (draw % len) as usize;
                if self.cached.as_ref().is_none_or(|(e, _)| *e != epoch) {
                    self.cached = Some((epoch, permutation(self.len, mix(self.seed, epoch))));
                }
                self.cached.as_ref().map_or(position, |(_, perm)| perm[position])
            }
        }
    }
}

/// SplitMix64's output function: a bijective 64-bit mixer.
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Combines a seed and a counter into a new seed.
pub(crate) fn mix(seed: u64, counter: u64) -> u64 {
    splitmix64(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ splitmix64(counter))
}

/// Maps 64 random bits onto `0..n` (multiply-shift; bias below 2^-40 for tasksets this size).
pub(crate) fn uniform(bits: u64, n: usize) -> usize {
    ((bits as u128 * n as u128) >> 64) as usize
}

/// A Fisher–Yates permutation of `0..n` from `seed`.
pub(crate) fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..n).collect();
    let mut state = seed;
    for i in (1..n).rev() {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let j = uniform(splitmix64(state), i + 1);
        perm.swap(i, j);
    }
    perm
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(selector: &mut Selector, range: std::ops::Range<u64>) -> Vec<usize> {
        range.map(|d| selector.index(d)).collect()
    }

    #[test]
    fn sequential_wraps() {
        let mut s = Selector::new(SelectorKind::Sequential, 3, 0);
        assert_eq!(draws(&mut s, 0..7), [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn shuffle_visits_every_row_once_per_epoch_with_a_new_order() {
        let mut s = Selector::new(SelectorKind::Shuffle, 10, 42);
        let first = draws(&mut s, 0..10);
        let second = draws(&mut s, 10..20);
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        let mut sorted2 = second.clone();
        sorted2.sort();
        assert_eq!(sorted2, sorted);
        assert_ne!(first, second);
        assert_ne!(first, (0..10).collect::<Vec<_>>());
        // Pure function of the draw number: a fresh selector (a resumed run) agrees.
        let mut again = Selector::new(SelectorKind::Shuffle, 10, 42);
        assert_eq!(draws(&mut again, 13..17), second[3..7]);
        let mut other_seed = Selector::new(SelectorKind::Shuffle, 10, 43);
        assert_ne!(draws(&mut other_seed, 0..10), first);
    }

    #[test]
    fn random_is_seeded_in_range_and_repeats_rows() {
        let mut s = Selector::new(SelectorKind::Random, 5, 7);
        let a = draws(&mut s, 0..50);
        assert!(a.iter().all(|&i| i < 5));
        let mut counts = [0; 5];
        a.iter().for_each(|&i| counts[i] += 1);
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        assert_eq!(draws(&mut Selector::new(SelectorKind::Random, 5, 7), 20..30), a[20..30]);
    }

    #[test]
    fn unknown_selectors_are_named() {
        let text = SelectorKind::parse("ts", "difficulty_based").unwrap_err().to_string();
        assert!(text.contains("difficulty_based") && text.contains("`ts`"), "{text}");
    }
}
