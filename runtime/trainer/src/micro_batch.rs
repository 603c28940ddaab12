//! Splitting a train step's rows into micro-batches for gradient accumulation.
//!
//! With a token budget (`trainer.use_dynamic_bsz`, budget `trainer.max_token_len_per_gpu`), the budget bounds the
//! tokens one forward/backward runs, so that its memory is bounded: the padded tokens of the layout the
//! micro-batch will run in ([`crate::batch::layout_tokens`]). Rows that share a prompt (a GRPO group) run that
//! prompt once in the shared-prompt layout, so rows are kept together by prompt: groups longest first, each
//! group's rows longest first, packed greedily while the micro-batch's tokens stay within the budget. A group
//! that fits the budget then trains in one micro-batch with its prompt computed once, instead of being spread
//! over several micro-batches that each run every row in full (the quickstart's steps: micro-batches of 9, 9, 9
//! and 5 rows spanning at most two groups each, under its budget of 320 tokens, where packing full rows by length
//! made 8 micro-batches of 4). A row longer than the budget gets a micro-batch of its own rather than an error.
//! veRL instead balances effective (unpadded) token counts over `⌈total / budget⌉` micro-batches because it
//! removes padding; either partition is one of the step's rows into micro-batches within the budget.
//!
//! With a fixed size (`use_dynamic_bsz: false`), consecutive rows form micro-batches of that many rows.
//!
//! Either way each term of a micro-batch's loss is weighted by the micro-batch's share of the mini-batch's
//! denominator under the term's aggregation (trained tokens for `token-mean`, rows for the seq-mean modes;
//! [`crate::loss_weight`]), so the accumulated gradient is the one of the whole mini-batch as one micro-batch,
//! whatever the partition — see [`crate::trainer`].
//!
//! A micro-batch is the unit of that weighting, not of the work: on the CPU, consecutive micro-batches run
//! together in one forward/backward *pass* ([`passes`]) while the pass's layout tokens stay within
//! [`TrainerOptions::pass_tokens`](crate::TrainerOptions::pass_tokens). Each micro-batch still gets its own loss,
//! weighted by its own share, on its own slice of the pass's logprobs; the pass backpropagates the sum of those
//! gradients at once, which is what accumulating them one micro-batch at a time computes (rows never attend to
//! each other). Trinity's budget of 2 × `max_model_len` makes GRPO groups of a few hundred tokens; every one of
//! them would otherwise read, reorder and accumulate the model's full weights and gradients for matmuls a few
//! hundred rows tall.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use crate::batch::{TrainRow, layout_tokens};
use crate::error::{Result, TrainerError};

/// How micro-batches are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroBatching {
    /// At most this many padded tokens per micro-batch.
    TokenBudget(usize),
    /// This many rows per micro-batch.
    Rows(usize),
}

/// Splits `active` (indices into `rows`) into micro-batches; every index appears exactly once.
pub fn split(rows: &[TrainRow], active: &[usize], how: MicroBatching) -> Result<Vec<Vec<usize>>> {
    match how {
        MicroBatching::Rows(0) => Err(TrainerError::setting("micro_batch_rows", "must be at least 1")),
        MicroBatching::TokenBudget(0) => {
            Err(TrainerError::setting("trainer.max_token_len_per_gpu", "must be positive"))
        }
        MicroBatching::Rows(n) => Ok(active.chunks(n).map(<[usize]>::to_vec).collect()),
        MicroBatching::TokenBudget(budget) => Ok(pack_by_prompt(rows, active, budget)),
    }
}

/// The token-budget split (see the module docs): rows grouped by prompt, packed greedily in that order.
fn pack_by_prompt(rows: &[TrainRow], active: &[usize], budget: usize) -> Vec<Vec<usize>> {
    let length = |i: &usize| std::cmp::Reverse(rows[*i].tokens.len());
    let mut index: HashMap<&[i64], usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &i in active {
        let g = *index.entry(rows[i].prompt()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups.iter_mut().for_each(|g| g.sort_by_key(length));
    groups.sort_by_key(|g| g.first().map(length));

    let order: Vec<usize> = groups.into_iter().flatten().collect();
    let singles: Vec<&[usize]> = order.iter().map(std::slice::from_ref).collect();
    pack_greedily(rows, &singles, budget).into_iter().map(|run| order[run].to_vec()).collect()
}

/// Consecutive `units` (each some rows) cut greedily into runs whose rows together take at most `budget` tokens in
/// their layout ([`layout_tokens`]: distinct prompts, rows, longest prompt and response); a unit over the budget
/// is a run of its own. Returns each run as a range of `units`. Rows are the units of a micro-batch, micro-batches
/// those of a pass.
fn pack_greedily(rows: &[TrainRow], units: &[&[usize]], budget: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut prompts: HashSet<&[i64]> = HashSet::new();
    let (mut n, mut max_p, mut max_r) = (0, 0, 0);
    for (u, unit) in units.iter().enumerate() {
        let unit_prompts: HashSet<&[i64]> = unit.iter().map(|&i| rows[i].prompt()).collect();
        let unit_p = unit.iter().map(|&i| rows[i].prompt_length).max().unwrap_or(0);
        let unit_r = unit.iter().map(|&i| rows[i].response_length()).max().unwrap_or(0);
        let distinct = prompts.len() + unit_prompts.difference(&prompts).count();
        if u > start && layout_tokens(distinct, n + unit.len(), max_p.max(unit_p), max_r.max(unit_r)).0 > budget {
            out.push(start..u);
            start = u;
            prompts.clear();
            (n, max_p, max_r) = (0, 0, 0);
        }
        prompts.extend(unit_prompts);
        (n, max_p, max_r) = (n + unit.len(), max_p.max(unit_p), max_r.max(unit_r));
    }
    if start < units.len() {
        out.push(start..units.len());
    }
    out
}

/// `micro_batches` (in order) grouped into passes: runs of consecutive micro-batches whose rows together take at
/// most `budget` tokens in their layout ([`layout_tokens`]); `None` runs each micro-batch alone. A micro-batch over
/// the budget is a pass of its own: a micro-batch is never split, its rows share one loss.
pub fn passes(rows: &[TrainRow], micro_batches: &[Vec<usize>], budget: Option<usize>) -> Vec<Range<usize>> {
    match budget {
        Some(budget) => pack_greedily(rows, &micro_batches.iter().map(Vec::as_slice).collect::<Vec<_>>(), budget),
        None => (0..micro_batches.len()).map(|m| m..m + 1).collect(),
    }
}

/// The most padded tokens a CPU pass may run for a model of `layers` layers of width `hidden` and MLP width
/// `intermediate` so that the activations it keeps for the backward fit in half of `available_bytes`, or `None`
/// when that is not known.
///
/// Trinity-RFT's token budgets (`max_token_len_per_gpu`, 16384 and more in its configs) size micro-batches for an
/// 80 GB accelerator; on a CPU machine the same budget can ask for more memory than the machine has (SmolLM2-135M
/// keeps about 1.2 MB of activations per token for the backward pass in fp32), so either the layers are recomputed
/// ([`crate::recompute`]) or the budget is lowered to what fits. Lowering is not free of effect: as in
/// Trinity-RFT, each micro-batch's token-mean loss is weighted by its rows, so a different split weights tokens
/// slightly differently; running out of memory is worse. Per token and layer the backward keeps about
/// `8·hidden + 3·intermediate` values (norms, q/k/v, attention and projection outputs, the MLP's gate, up and
/// product) at 4 bytes; libtorch's autograd and allocator keep somewhat more, hence [`MARGIN`].
pub fn kept_activations_token_cap(
    layers: i64,
    hidden: i64,
    intermediate: i64,
    available_bytes: Option<u64>,
) -> Option<usize> {
    token_cap(layers * (8 * hidden + 3 * intermediate), available_bytes)
}

/// [`kept_activations_token_cap`] with the layers recomputed in the backward: a pass keeps each layer's input
/// (`hidden` values a token and layer) and, while one layer is recomputed, that layer's activations. Same
/// [`MARGIN`].
pub fn recomputed_activations_token_cap(
    layers: i64,
    hidden: i64,
    intermediate: i64,
    available_bytes: Option<u64>,
) -> Option<usize> {
    token_cap(layers * hidden + 8 * hidden + 3 * intermediate, available_bytes)
}

/// How much more than the counted values (at 4 bytes) a pass holds per token, with room to spare. Measured as the slope
/// of peak resident memory over tokens with `bench_train --dtype f32 --seq 512` (2 cores of an EPYC Zen 4; the slope is
/// taken between passes that both fill the head's logit chunk, whose size is fixed, and that are big enough that the
/// training step, not loading, sets the peak): SmolLM2-135M, 2 → 8 sequences, 1.15 MB a token kept against 1.10 MB
/// counted (1.04×) and 0.14 MB recomputed against 0.106 (1.32×); Qwen2.5-0.5B's shape, 4 → 6 sequences, 2.45 MB kept
/// against 2.09 MB counted (1.17×). What one pass itself holds at its peak (`bench_train --step-memory`, the process's
/// high-water mark reset before each pass, freed pages returned at once) is at or below the count: kept 1.04 MB
/// (SmolLM2, 2 → 8) and 2.00 MB (0.5B, 4 → 6) a token; recomputed, the peak hardly grows with tokens (0.04 and 0.02 MB
/// a token), because it comes in the backward, where the parameters' gradients and the head's logit chunk (2.6 GB at
/// 0.5B, the measured peak) outweigh the layer inputs still held. The margin is for the allocator's reuse of freed
/// blocks, which the resident slopes above include. Sequences longer than the attention's spelled-out path
/// ([`trinity_model`]'s 192 keys) run libtorch's flash kernel, which keeps no per-key values, so the count does not
/// grow with length. bf16 passes keep most of these values in 2 bytes, half the count. The factor was 3.5 until these
/// measurements, which made `enable_gradient_checkpointing: true` recompute, and `false` cut micro-batches, at a third
/// of the tokens that fit.
const MARGIN: f64 = 2.0;

/// Tokens whose `values_per_token` fp32 values (times [`MARGIN`]) fit in half of `available_bytes`.
fn token_cap(values_per_token: i64, available_bytes: Option<u64>) -> Option<usize> {
    let available = available_bytes?;
    let per_token = values_per_token.max(1) as f64 * 4.0 * MARGIN;
    Some(((available as f64 / 2.0) / per_token).max(1.0) as usize)
}

/// The padded tokens `idx` (indices into `rows`) run in their layout ([`layout_tokens`]).
pub(crate) fn rows_layout_tokens(rows: &[TrainRow], idx: &[usize]) -> usize {
    let prompts: HashSet<&[i64]> = idx.iter().map(|&i| rows[i].prompt()).collect();
    let p = idx.iter().map(|&i| rows[i].prompt_length).max().unwrap_or(0);
    let r = idx.iter().map(|&i| rows[i].response_length()).max().unwrap_or(0);
    layout_tokens(prompts.len(), idx.len(), p, r).0
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (Linux); `None` elsewhere or when unreadable.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(lens: &[(usize, usize)]) -> Vec<TrainRow> {
        lens.iter().map(|&(p, r)| TrainRow::sft(&vec![1; p], &vec![2; r])).collect()
    }

    /// Every row once, and each micro-batch's tokens in its layout within the budget.
    fn check_partition(rows: &[TrainRow], micro: &[Vec<usize>], budget: usize) {
        let mut seen: Vec<usize> = micro.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..rows.len()).collect::<Vec<_>>());
        for m in micro.iter().filter(|m| m.len() > 1) {
            assert!(rows_layout_tokens(rows, m) <= budget, "{micro:?}");
        }
    }

    #[test]
    fn budget_bounds_the_tokens_of_each_micro_batch() {
        let rows = rows(&[(2, 2), (4, 4), (2, 6), (3, 1), (1, 1)]);
        let all: Vec<usize> = (0..rows.len()).collect();
        check_partition(&rows, &split(&rows, &all, MicroBatching::TokenBudget(12)).unwrap(), 12);
        // A row above the budget still trains, alone.
        let micro = split(&rows, &all, MicroBatching::TokenBudget(5)).unwrap();
        assert!(micro.iter().any(|m| m == &vec![1]));
    }

    /// Two GRPO groups of 8 rollouts (prompt 60 tokens, responses up to 24), interleaved: each group trains as one
    /// micro-batch in the shared layout (60 + 8·24 = 252 tokens), where full rows would allow 3 rows a micro-batch.
    #[test]
    fn a_group_that_fits_trains_in_one_micro_batch() {
        let mut rows = Vec::new();
        for k in 0..16usize {
            let prompt: Vec<i64> = (0..60).map(|t| t + 1000 * (k % 2) as i64).collect();
            rows.push(TrainRow::sft(&prompt, &vec![2; 20 + k % 5]));
        }
        let all: Vec<usize> = (0..rows.len()).collect();
        let mut micro = split(&rows, &all, MicroBatching::TokenBudget(320)).unwrap();
        check_partition(&rows, &micro, 320);
        micro.iter_mut().for_each(|m| m.sort());
        micro.sort();
        assert_eq!(micro, vec![(0..16).step_by(2).collect::<Vec<_>>(), (1..16).step_by(2).collect()]);
    }

    #[test]
    fn fixed_rows_keep_order() {
        let rows = rows(&[(1, 1); 5]);
        let micro = split(&rows, &[4, 0, 1, 2, 3], MicroBatching::Rows(2)).unwrap();
        assert_eq!(micro, vec![vec![4, 0], vec![1, 2], vec![3]]);
        assert!(split(&rows, &[0], MicroBatching::Rows(0)).is_err());
    }

    /// 4 GRPO groups of 8 rollouts (the quickstart's shape), a micro-batch each, 46 + 8 · 24 = 238 tokens: passes
    /// take as many whole micro-batches as the budget holds, and never cut one.
    #[test]
    fn passes_join_consecutive_micro_batches_within_the_budget() {
        let mut rows = Vec::new();
        for k in 0..32usize {
            let prompt: Vec<i64> = (0..46).map(|t| t + 1000 * (k / 8) as i64).collect();
            rows.push(TrainRow::sft(&prompt, &[2; 24]));
        }
        let all: Vec<usize> = (0..rows.len()).collect();
        let micro = split(&rows, &all, MicroBatching::Rows(8)).unwrap();
        assert_eq!(passes(&rows, &micro, Some(2048)), vec![0..4]);
        assert_eq!(passes(&rows, &micro, Some(4 * 238)), vec![0..4]);
        assert_eq!(passes(&rows, &micro, Some(4 * 238 - 1)), vec![0..3, 3..4]);
        assert_eq!(passes(&rows, &micro, Some(500)), vec![0..2, 2..4]);
        // Below one micro-batch's tokens each is its own pass; without a budget too.
        assert_eq!(passes(&rows, &micro, Some(100)), vec![0..1, 1..2, 2..3, 3..4]);
        assert_eq!(passes(&rows, &micro, None), vec![0..1, 1..2, 2..3, 3..4]);
        assert!(passes(&rows, &[], Some(100)).is_empty());
        // Trinity's 320-token budget packs parts of groups together; the whole step is still one pass.
        let micro = split(&rows, &all, MicroBatching::TokenBudget(320)).unwrap();
        assert!(micro.len() > 1);
        assert_eq!(passes(&rows, &micro, Some(2048)), vec![0..micro.len()]);
    }

    #[test]
    fn the_memory_cap_scales_with_the_model_and_the_memory() {
        // SmolLM2-135M: 30 layers, hidden 576, intermediate 1536 → 30 · 9216 values · 8 bytes ≈ 2.2 MB a token,
        // so 10 GiB (half of 20) holds ~4850 tokens.
        let gib = 1u64 << 30;
        let cap = kept_activations_token_cap(30, 576, 1536, Some(20 * gib)).unwrap();
        assert!((4800..4900).contains(&cap), "{cap}");
        assert_eq!(kept_activations_token_cap(30, 576, 1536, Some(40 * gib)).unwrap() / 2, cap);
        assert_eq!(kept_activations_token_cap(30, 576, 1536, None), None);
        // Recomputed: (30 · 576 + 9216) values · 8 bytes ≈ 0.21 MB a token, ~10× the tokens.
        let recomputed = recomputed_activations_token_cap(30, 576, 1536, Some(20 * gib)).unwrap();
        assert!((50_000..51_500).contains(&recomputed), "{recomputed}");
    }
}
