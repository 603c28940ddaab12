//! Task selectors: which row of a taskset the `d`-th draw takes.
//!
//! A selector is a pure function of `(kind, taskset length, seed, draw number)`: the only state a run has to
//! keep is how many draws it made (see [`crate::scheduler::SchedulerState`]), so a resumed run continues
//! exactly where it stopped. The generator is SplitMix64 ([`trinity_rng`]) — small, fixed forever, and
//! independent of any crate's version — so orders are reproducible across builds. They are not NumPy's orders: a Trinity-RFT run and a
//! trinity run with the same seed shuffle differently.
//!
//! * `sequential`: row `d mod len`, epoch after epoch.
//! * `shuffle`: epoch `e = d / len` visits every row once, in a permutation seeded by `(seed, e)`.
//! * `random`: each draw is uniform over all rows, independently (with replacement), seeded by `(seed, d)`.
//! * `offline_easy2hard` (Trinity's `OfflineEasy2HardSelector`): a curriculum — the rows sorted once by their
//!   `feature_keys` values, highest (easiest) first (ties: the later row first, as Python's reversed sort
//!   puts them), then taken in that order, epoch after epoch.
//! * `difficulty_based` (BOTS, arXiv:2510.26374; Trinity-RFT's `DifficultyBasedSelector`): the one selector with
//!   state. Each row has a Beta(α, β) belief of its pass rate, seeded from two offline pass-rate columns
//!   (`feature_keys`) and updated from the pass rates observed while training ([`PassRates`], written by the
//!   `pass_rate_calculator` operator, handed over by `TaskScheduler::feedback`). A batch takes the rows whose
//!   predicted pass rate is closest to `target_reward`; see [`DifficultyEstimator`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::difficulty_estimator::DifficultyEstimator;
use crate::error::{BufferError, Result};

/// Observed pass rates of rows of one taskset (Trinity's `selector_metric` entry for one taskset id): the mean
/// reward of each row's runs in one explore step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassRates {
    /// Position of the taskset among the explorer's training tasksets (`Task::taskset_id`).
    pub taskset_id: usize,
    /// Row indices (`Task::index`).
    pub indices: Vec<usize>,
    /// Mean reward of each row's runs, in the order of `indices`.
    pub values: Vec<f64>,
}

/// Selector kinds supported by [`Selector`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorKind {
    Sequential,
    Shuffle,
    Random,
    OfflineEasy2Hard,
    DifficultyBased,
}

impl SelectorKind {
    /// Parses a config's `selector_type`.
    pub fn parse(taskset: &str, name: &str) -> Result<SelectorKind> {
        match name {
            "sequential" => Ok(SelectorKind::Sequential),
            "shuffle" => Ok(SelectorKind::Shuffle),
            "random" => Ok(SelectorKind::Random),
            "offline_easy2hard" => Ok(SelectorKind::OfflineEasy2Hard),
            "difficulty_based" => Ok(SelectorKind::DifficultyBased),
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
    /// The pass-rate beliefs (`difficulty_based` only).
    difficulty: Option<DifficultyEstimator>,
    /// The rows, easiest first (`offline_easy2hard` only).
    curriculum: Option<Vec<usize>>,
}

impl Selector {
    /// A selector over `len` rows; `len` must be at least 1 (tasksets are never empty, see `Taskset::load`).
    /// A `difficulty_based` selector needs its features: build it with [`Selector::difficulty_based`].
    pub fn new(kind: SelectorKind, len: usize, seed: u64) -> Selector {
        Selector { kind, len: len.max(1), seed, cached: None, difficulty: None, curriculum: None }
    }

    /// An `offline_easy2hard` selector over `features` (one row of `feature_keys` values per taskset row; higher
    /// means easier).
    pub fn offline_easy2hard(features: &[Vec<f64>], seed: u64) -> Selector {
        let mut order: Vec<usize> = (0..features.len()).collect();
        // Python sorts `[f1, .., fk, index]` ascending and reverses: descending by features, then by index.
        order.sort_by(|&a, &b| {
            let by_features = features[b].iter().zip(&features[a]).map(|(x, y)| x.total_cmp(y)).find(|o| o.is_ne());
            by_features.unwrap_or(std::cmp::Ordering::Equal).then(b.cmp(&a))
        });
        Selector {
            kind: SelectorKind::OfflineEasy2Hard,
            len: features.len().max(1),
            seed,
            cached: None,
            difficulty: None,
            curriculum: Some(order),
        }
    }

    /// A `difficulty_based` selector over `features` (one `[weak, strong]` offline pass-rate pair per row) with
    /// the config's `kwargs` (`m` 16, `lamb` 0.2, `rho` 0.2, `adaptive_rho` false, `target_reward` 1.0, `tau`
    /// 1.0, `do_sample` false: Trinity's defaults).
    pub fn difficulty_based(
        taskset: &str,
        features: Vec<[f64; 2]>,
        seed: u64,
        kwargs: &Map<String, Value>,
    ) -> Result<Selector> {
        let estimator = DifficultyEstimator::new(taskset, features, kwargs)?;
        let len = estimator.rows();
        Ok(Selector {
            kind: SelectorKind::DifficultyBased,
            len: len.max(1),
            seed,
            cached: None,
            difficulty: Some(estimator),
            curriculum: None,
        })
    }

    pub fn kind(&self) -> SelectorKind {
        self.kind
    }

    /// Row indices of the `count` draws starting at draw number `first_draw` (one taskset's share of a batch).
    /// The stateless kinds map each draw on its own ([`Selector::index`]); `difficulty_based` chooses the rows
    /// together, without repeats within the call (unless `count` exceeds the rows).
    pub fn indices(&mut self, first_draw: u64, count: usize) -> Vec<usize> {
        match &self.difficulty {
            Some(estimator) => estimator.select(count, self.seed, first_draw),
            None => (first_draw..first_draw + count as u64).map(|draw| self.index(draw)).collect(),
        }
    }

    /// Learns from observed pass rates of this taskset's rows; only `difficulty_based` selectors use them.
    /// Indices beyond the taskset and non-finite values are errors naming the taskset.
    pub fn feedback(&mut self, taskset: &str, rates: &PassRates) -> Result<()> {
        match &mut self.difficulty {
            Some(estimator) => estimator.update(taskset, &rates.indices, &rates.values),
            None => Ok(()),
        }
    }

    /// The pass-rate beliefs of a `difficulty_based` selector.
    pub fn estimator(&self) -> Option<&DifficultyEstimator> {
        self.difficulty.as_ref()
    }

    /// Puts back beliefs saved from [`Selector::estimator`] (a resumed run). Trinity-RFT keeps only the draw
    /// count across a restart; keeping the beliefs makes a resumed run select as the uninterrupted one would.
    /// Beliefs for another number of rows, or for a selector that is not `difficulty_based`, are refused.
    pub fn restore_estimator(&mut self, taskset: &str, saved: DifficultyEstimator) -> Result<()> {
        match &mut self.difficulty {
            Some(current) if current.rows() == saved.rows() => {
                *current = saved;
                Ok(())
            }
            Some(current) => Err(BufferError::SelectorArgs {
                taskset: taskset.to_owned(),
                problem: format!(
                    "saved difficulty beliefs cover {} rows, the taskset has {}",
                    saved.rows(),
                    current.rows()
                ),
            }),
            None => Err(BufferError::SelectorArgs {
                taskset: taskset.to_owned(),
                problem: "saved difficulty beliefs, but the selector is not difficulty_based".to_owned(),
            }),
        }
    }

    /// Row index of draw number `draw` (0-based, counted over the whole run). A `difficulty_based` selector
    /// answers for a batch of one ([`Selector::indices`] is the call to use for it).
    pub fn index(&mut self, draw: u64) -> usize {
        let len = self.len as u64;
        if let Some(estimator) = &self.difficulty {
            return estimator.select(1, self.seed, draw).first().copied().unwrap_or(0);
        }
        if let Some(order) = &self.curriculum {
            return order.get((draw % len) as usize).copied().unwrap_or(0);
        }
        match self.kind {
            SelectorKind::Sequential | SelectorKind::DifficultyBased | SelectorKind::OfflineEasy2Hard => {
                (draw % len) as usize
            }
            SelectorKind::Random => uniform(trinity_rng::mix(self.seed ^ trinity_rng::mix(draw)), self.len),
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

/// Combines a seed and a counter into a new seed.
pub(crate) fn mix(seed: u64, counter: u64) -> u64 {
    trinity_rng::mix(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ trinity_rng::mix(counter))
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
        state = state.wrapping_add(trinity_rng::GAMMA);
        let j = uniform(trinity_rng::mix(state), i + 1);
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
        let text = SelectorKind::parse("ts", "hardest_first").unwrap_err().to_string();
        assert!(text.contains("hardest_first") && text.contains("`ts`"), "{text}");
        assert_eq!(SelectorKind::parse("ts", "difficulty_based").unwrap(), SelectorKind::DifficultyBased);
    }

    #[test]
    fn offline_easy2hard_walks_the_rows_easiest_first() {
        let features = vec![vec![0.2, 1.0], vec![0.9, 0.0], vec![0.2, 3.0], vec![0.9, 0.0]];
        let mut s = Selector::offline_easy2hard(&features, 0);
        // 0.9 ties broken by the later row first (3, then 1); then 0.2 by the second column (2 before 0).
        assert_eq!(draws(&mut s, 0..6), [3, 1, 2, 0, 3, 1]);
        assert_eq!(SelectorKind::parse("ts", "offline_easy2hard").unwrap(), SelectorKind::OfflineEasy2Hard);
    }

    fn kwargs(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn beta_update_matches_the_bots_formula_by_hand() {
        // Two rows: offline pass rates [0.2, 0.6] and [0.0, 1.0]; m 4, λ 0.5, ρ 0.5.
        let features = vec![[0.2, 0.6], [0.0, 1.0]];
        let args = kwargs(serde_json::json!({"m": 4, "lamb": 0.5, "rho": 0.5}));
        let mut s = Selector::difficulty_based("ts", features, 1, &args).unwrap();
        s.feedback("ts", &PassRates { taskset_id: 0, indices: vec![0], values: vec![0.4] }).unwrap();
        let e = s.estimator().unwrap();
        // c = (0.4 − 0.2) / (0.6 − 0.2 + 1e-6); row 1's prior p̃ = clip(0 + c·1) = c.
        let c = 0.2 / (0.4 + 1e-6);
        assert!(close(e.capability().unwrap(), c));
        // Row 0 observed: α = 0.5·1 + 0.5 + 0.5·(4·0.4) + 0.5·0.4·4 = 2.6; β = 0.5 + 0.5 + 0.5·2.4 + 0.5·0.6·4 = 3.4.
        assert!(close(e.alphas()[0], 2.6) && close(e.betas()[0], 3.4), "{:?} {:?}", e.alphas(), e.betas());
        // Row 1 not observed: α = 1 + 0.5·c·4, β = 1 + 0.5·(1 − c)·4.
        assert!(close(e.alphas()[1], 1.0 + 2.0 * c) && close(e.betas()[1], 1.0 + 2.0 * (1.0 - c)));
        // The second feedback averages the capability with discount 0.9.
        s.feedback("ts", &PassRates { taskset_id: 0, indices: vec![1], values: vec![1.0] }).unwrap();
        let second = (1.0 - 0.0) / (1.0 + 1e-6);
        assert!(close(s.estimator().unwrap().capability().unwrap(), 0.9 * c + 0.1 * second));
    }

    #[test]
    fn adaptive_rho_halves_on_a_bad_prior() {
        let args = kwargs(serde_json::json!({"adaptive_rho": true, "rho": 0.4}));
        let mut s = Selector::difficulty_based("ts", vec![[0.0, 0.0], [0.0, 0.0]], 1, &args).unwrap();
        // Features say 0 for both rows, so p̃ = 0 whatever the capability; observing 1.0 and 0.0 gives a mean
        // |p̃ − y| of 0.5 ≥ 0.25.
        s.feedback("ts", &PassRates { taskset_id: 0, indices: vec![0, 1], values: vec![1.0, 0.0] }).unwrap();
        assert!(close(s.estimator().unwrap().rho(), 0.2));
    }

    #[test]
    fn greedy_selection_takes_rows_nearest_the_target() {
        let features = vec![[0.0, 0.0]; 4];
        let args = kwargs(serde_json::json!({"tau": 0, "target_reward": 0.5, "rho": 0.0, "lamb": 0.0}));
        let mut s = Selector::difficulty_based("ts", features, 3, &args).unwrap();
        // With ρ = λ = 0 and m 16 the update is α += 16·y, β += 16·(1 − y): rows 0..4 end at pass rates 17/18,
        // 9/18, 3/18 and 11/18, at distances 0.44, 0, 0.33 and 0.11 from the target.
        let rates = PassRates { taskset_id: 0, indices: vec![0, 1, 2, 3], values: vec![1.0, 0.5, 0.125, 0.625] };
        s.feedback("ts", &rates).unwrap();
        assert_eq!(s.indices(0, 2), [1, 3]);
        // More rows than the taskset has: the ranking repeats.
        assert_eq!(s.indices(0, 6), [1, 3, 2, 0, 1, 3]);
        // Bad feedback is refused, naming the taskset.
        let bad = PassRates { taskset_id: 0, indices: vec![9], values: vec![0.5] };
        assert!(s.feedback("ts", &bad).unwrap_err().to_string().contains("row 9"));
    }

    #[test]
    fn sampled_selection_is_seeded_distinct_and_prefers_the_target() {
        let features: Vec<[f64; 2]> = (0..20).map(|i| [i as f64 / 20.0, i as f64 / 20.0]).collect();
        let args = kwargs(serde_json::json!({"tau": 0.05, "target_reward": 1.0, "do_sample": true}));
        let mut s = Selector::difficulty_based("ts", features, 7, &args).unwrap();
        let rates =
            PassRates { taskset_id: 0, indices: (0..20).collect(), values: (0..20).map(|i| i as f64 / 20.0).collect() };
        s.feedback("ts", &rates).unwrap();
        let a = s.indices(0, 5);
        assert_eq!(a, s.indices(0, 5), "same seed and position, same rows");
        assert_ne!(a, s.indices(5, 5), "another position, another draw");
        let mut sorted = a.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 5, "no repeats within a batch: {a:?}");
        // Rows with high pass rates are closest to target 1.0: the mean pick is in the upper half.
        let picks: Vec<usize> = (0..20).flat_map(|d| s.indices(d * 5, 5)).collect();
        let mean = picks.iter().sum::<usize>() as f64 / picks.len() as f64;
        assert!(mean > 12.0, "{mean}");
    }

    #[test]
    fn difficulty_kwargs_are_checked() {
        let err = Selector::difficulty_based("ts", vec![[0.0, 1.0]], 1, &kwargs(serde_json::json!({"temp": 1})));
        assert!(err.unwrap_err().to_string().contains("kwargs.temp"));
        let err = Selector::difficulty_based("ts", vec![[0.0, 1.0]], 1, &kwargs(serde_json::json!({"tau": -1})));
        assert!(err.unwrap_err().to_string().contains("tau"));
    }
}
