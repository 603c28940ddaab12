//! Choosing the next token of every sequence in a batch, and its logprob as the trainer will compute it.
//!
//! **Logprob definition.** For a sequence sampled with temperature `T` (`T = 1` when greedy), the logprob of the
//! chosen token `y` is `log_softmax(logits / T)[y]`, computed in f32 from the model's logits (which are in the
//! model's dtype, exactly as the training forward pass produces them). It ignores top-k / top-p / min-p
//! filtering and the end-of-sequence masking of `min_tokens`: those shape *which* token is drawn, while the
//! trainer scores the unfiltered distribution `log_softmax(logits / T)` — the quantity returned here, so the
//! importance ratio of the first training step on fresh rollouts is 1 up to floating-point error.
//!
//! **Selection.** Greedy rows take the argmax (after masking banned ids). Sampled rows filter the tempered
//! distribution (top-k, then min-p, then top-p, all relative to the tempered probabilities), renormalize, and
//! invert the cumulative distribution at the row's own uniform number (from [`crate::rng`]). Everything is
//! row-wise, so a row's choice depends only on its own logits and uniform number.
//!
//! One device→host transfer per step: ids and logprobs travel together as one `[2, B]` f32 tensor (token ids
//! are below 2^24, exact in f32). Rows that ask for top logprobs add one more (a `topk` over those rows of the
//! same log-probabilities), and only on steps where such a row runs.

use tch::{Device, Kind, Tensor};

use crate::error::Result;
use crate::request::TopLogprob;

mod rows;

/// How to choose one row's token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowSpec<'a> {
    /// Sampling temperature; 0 is greedy.
    pub(crate) temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub(crate) top_k: usize,
    /// Nucleus mass; 1 keeps all.
    pub(crate) top_p: f32,
    /// Relative probability floor; 0 keeps all.
    pub(crate) min_p: f32,
    /// This row's uniform number in (0, 1) for inverse-CDF sampling.
    pub(crate) uniform: f64,
    /// Token ids that must not be chosen this step (end-of-sequence ids before `min_tokens`).
    pub(crate) banned: &'a [i64],
    /// How many of the most likely tokens to report with their logprobs; 0 reports none.
    pub(crate) top_logprobs: usize,
    /// A constrained row's mask, `vocab` wide (`true`: may be chosen), with at least one id allowed; `None`
    /// allows every id. Like `banned` it restricts selection only (see [`crate::constraint`]).
    pub(crate) allowed: Option<&'a [bool]>,
}

impl RowSpec<'_> {
    fn logprob_temperature(&self) -> f32 {
        if self.temperature == 0.0 { 1.0 } else { self.temperature }
    }
}

/// Chosen token ids and their logprobs, one per row.
#[derive(Debug, Default)]
pub(crate) struct Sampled {
    pub(crate) ids: Vec<u32>,
    pub(crate) logprobs: Vec<f32>,
    /// Per row, its `top_logprobs` most likely tokens (most likely first); empty when no row asked for any.
    pub(crate) top: Vec<Vec<TopLogprob>>,
}

/// Samples one token per row of `logits` `[B, vocab]` (any float dtype, any device) following `rows`.
pub(crate) fn sample(logits: &Tensor, rows: &[RowSpec<'_>]) -> Result<Sampled> {
    if logits.device() == Device::Cpu && logits.kind() == Kind::Float && logits.dim() == 2 && logits.is_contiguous() {
        let vocab = logits.size()[1] as usize;
        let n = logits.numel();
        let data = if n == 0 {
            &[][..]
        } else {
            // SAFETY: a contiguous fp32 CPU tensor of `n` elements (checked above), alive and unwritten while
            // borrowed.
            unsafe { std::slice::from_raw_parts(logits.data_ptr() as *const f32, n) }
        };
        if let Some(out) = rows::sample(data, vocab, rows) {
            return Ok(out);
        }
    }
    sample_tensors(logits, rows)
}

/// [`sample`] in libtorch ops: every row spec, dtype and device.
fn sample_tensors(logits: &Tensor, rows: &[RowSpec<'_>]) -> Result<Sampled> {
    let b = rows.len();
    let device = logits.device();
    let vocab = logits.size().last().copied().unwrap_or(0);
    let logits = logits.f_to_kind(Kind::Float)?;
    let scaled = if rows.iter().all(|r| r.logprob_temperature() == 1.0) {
        logits
    } else {
        let t: Vec<f32> = rows.iter().map(RowSpec::logprob_temperature).collect();
        logits / Tensor::from_slice(&t).f_view([b as i64, 1])?.f_to_device(device)?
    };
    let logp = scaled.f_log_softmax(-1, Kind::Float)?;

    // Selection scores: the tempered log-probabilities with banned and disallowed ids at -inf.
    let selection = if rows.iter().any(|r| !r.banned.is_empty()) {
        let mut row_idx = Vec::new();
        let mut col_idx = Vec::new();
        for (r, spec) in rows.iter().enumerate() {
            for &id in spec.banned {
                row_idx.push(r as i64);
                col_idx.push(id);
            }
        }
        let rows_t = Tensor::from_slice(&row_idx).f_to_device(device)?;
        let cols_t = Tensor::from_slice(&col_idx).f_to_device(device)?;
        let ninf = Tensor::from(f32::NEG_INFINITY).f_to_device(device)?;
        logp.f_index_put(&[Some(rows_t), Some(cols_t)], &ninf, false)?
    } else {
        logp.shallow_clone()
    };
    let selection = match disallowed(rows, vocab)? {
        Some(mask) => selection.f_masked_fill(&mask.f_to_device(device)?, f64::NEG_INFINITY)?,
        None => selection,
    };
    let mut ids = selection.f_argmax(-1, false)?;

    let sampled: Vec<usize> = (0..b).filter(|&r| rows[r].temperature > 0.0).collect();
    if !sampled.is_empty() {
        let specs: Vec<RowSpec<'_>> = sampled.iter().map(|&r| rows[r]).collect();
        let idx: Vec<i64> = sampled.iter().map(|&r| r as i64).collect();
        let idx = Tensor::from_slice(&idx).f_to_device(device)?;
        let chosen = inverse_cdf(&selection.f_index_select(0, &idx)?, &specs, vocab)?;
        ids = ids.f_index_copy(0, &idx, &chosen)?;
    }

    let lp = logp.f_gather(-1, &ids.f_unsqueeze(-1)?, false)?.f_squeeze_dim(-1)?;
    let both = Tensor::f_stack(&[ids.f_to_kind(Kind::Float)?, lp], 0)?;
    let host: Vec<f32> = Vec::try_from(both.f_to_device(Device::Cpu)?.f_flatten(0, -1)?)?;
    let (ids, logprobs) = host.split_at(b);
    let top = top_logprobs(&logp, rows, vocab)?;
    Ok(Sampled { ids: ids.iter().map(|&x| x as u32).collect(), logprobs: logprobs.to_vec(), top })
}

/// `[B, vocab]` booleans, `true` where a constrained row may not choose the id; `None` when no row is
/// constrained.
fn disallowed(rows: &[RowSpec<'_>], vocab: i64) -> Result<Option<Tensor>> {
    if rows.iter().all(|r| r.allowed.is_none()) {
        return Ok(None);
    }
    let vocab = vocab as usize;
    let mut mask = vec![false; rows.len() * vocab];
    for (row, spec) in mask.chunks_exact_mut(vocab).zip(rows) {
        if let Some(allowed) = spec.allowed {
            for (m, &a) in row.iter_mut().zip(allowed.iter().chain(std::iter::repeat(&false))) {
                *m = !a;
            }
        }
    }
    Ok(Some(Tensor::from_slice(&mask).f_view([rows.len() as i64, vocab as i64])?))
}

/// The most likely tokens of every row that asks for them, from `logp` (`[B, vocab]`, the distribution the
/// sampled logprobs come from); empty when no row asks.
fn top_logprobs(logp: &Tensor, rows: &[RowSpec<'_>], vocab: i64) -> Result<Vec<Vec<TopLogprob>>> {
    let asking: Vec<i64> = (0..rows.len()).filter(|&r| rows[r].top_logprobs > 0).map(|r| r as i64).collect();
    let Some(k) = rows.iter().map(|r| r.top_logprobs as i64).max().filter(|&k| k > 0) else {
        return Ok(Vec::new());
    };
    let k = k.min(vocab);
    let idx = Tensor::from_slice(&asking).f_to_device(logp.device())?;
    let (values, indices) = logp.f_index_select(0, &idx)?.f_topk(k, -1, true, true)?;
    let values: Vec<f32> = Vec::try_from(values.f_to_device(Device::Cpu)?.f_flatten(0, -1)?)?;
    let indices: Vec<i64> = Vec::try_from(indices.f_to_device(Device::Cpu)?.f_flatten(0, -1)?)?;
    let mut top = vec![Vec::new(); rows.len()];
    for (i, &r) in asking.iter().enumerate() {
        let r = r as usize;
        let start = i * k as usize;
        let want = rows[r].top_logprobs.min(k as usize);
        top[r] = (start..start + want).map(|j| TopLogprob { token: indices[j] as u32, logprob: values[j] }).collect();
    }
    Ok(top)
}

/// Filters `s` (`[S, vocab]` tempered log-probabilities, banned ids at -inf) by each row's top-k, min-p and
/// top-p, and draws one index per row at the row's uniform number.
fn inverse_cdf(s: &Tensor, specs: &[RowSpec<'_>], vocab: i64) -> Result<Tensor> {
    let device = s.device();
    let n = specs.len() as i64;
    let column = |v: Vec<f32>| -> Result<Tensor> { Ok(Tensor::from_slice(&v).f_view([n, 1])?.f_to_device(device)?) };
    let mut s = s.shallow_clone();
    let max_k = specs.iter().map(|r| r.top_k as i64).filter(|&k| k > 0 && k < vocab).max();
    if let Some(max_k) = max_k {
        let (values, _) = s.f_topk(max_k, -1, true, true)?;
        let kth: Vec<i64> =
            specs.iter().map(|r| if r.top_k > 0 { (r.top_k as i64).min(max_k) - 1 } else { max_k - 1 }).collect();
        let kth = Tensor::from_slice(&kth).f_view([n, 1])?.f_to_device(device)?;
        let threshold = values.f_gather(-1, &kth, false)?;
        let off: Vec<f32> = specs
            .iter()
            .map(|r| if r.top_k > 0 && (r.top_k as i64) < vocab { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        // A row without top-k gets threshold -inf (k-th value + -inf); a row with it gets its k-th value (+ 0).
        let threshold = threshold + column(off)?;
        s = s.f_masked_fill(&s.f_lt_tensor(&threshold)?, f64::NEG_INFINITY)?;
    }
    if specs.iter().any(|r| r.min_p > 0.0) {
        let floor: Vec<f32> =
            specs.iter().map(|r| if r.min_p > 0.0 { r.min_p.ln() } else { f32::NEG_INFINITY }).collect();
        let (max, _) = s.f_max_dim(-1, true)?;
        s = s.f_masked_fill(&s.f_lt_tensor(&(max + column(floor)?))?, f64::NEG_INFINITY)?;
    }
    if specs.iter().any(|r| r.top_p < 1.0) {
        let (sorted, order) = s.f_sort(-1, true)?;
        let probs = sorted.f_softmax(-1, Kind::Float)?;
        let before = probs.f_cumsum(-1, Kind::Float)? - &probs;
        // A token goes when the tokens ranked above it already reach top_p; rows without top-p never drop any.
        let limit: Vec<f32> = specs.iter().map(|r| if r.top_p < 1.0 { r.top_p } else { f32::INFINITY }).collect();
        let drop = before.f_ge_tensor(&column(limit)?)?;
        let sorted = sorted.f_masked_fill(&drop, f64::NEG_INFINITY)?;
        s = s.f_scatter(-1, &order, &sorted)?;
    }
    let cdf = s.f_softmax(-1, Kind::Float)?.f_cumsum(-1, Kind::Float)?;
    let total = cdf.f_narrow(1, vocab - 1, 1)?;
    let u: Vec<f32> = specs.iter().map(|r| r.uniform as f32).collect();
    let target = total * column(u)?;
    // The first index whose cumulative mass reaches the target; it always has positive probability because the
    // target is positive and the cumulative sum only grows at such indices.
    let chosen = cdf.f_lt_tensor(&target)?.f_sum_dim_intlist(-1, false, Kind::Int64)?;
    Ok(chosen.f_clamp_max(vocab - 1)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(temperature: f32, uniform: f64) -> RowSpec<'static> {
        RowSpec { temperature, top_k: 0, top_p: 1.0, min_p: 0.0, uniform, banned: &[], top_logprobs: 0, allowed: None }
    }

    fn logits() -> Tensor {
        // Probabilities 0.1, 0.2, 0.3, 0.4 on row 0; row 1 prefers token 0.
        Tensor::from_slice(&[0.1f32, 0.2, 0.3, 0.4, 0.7, 0.1, 0.1, 0.1]).view([2, 4]).log()
    }

    /// The row-wise CPU path draws what the libtorch path draws, with the same logprobs, over many rows of a
    /// realistic vocabulary: greedy and sampled, with temperatures and banned ids (one of them the row's most
    /// likely token), uniform numbers across (0, 1).
    #[test]
    fn the_row_path_agrees_with_the_libtorch_path() {
        tch::manual_seed(9);
        let (rows, vocab) = (64, 5000);
        let logits = Tensor::randn([rows, vocab], (Kind::Float, Device::Cpu)) * 4.0;
        let top = Vec::<i64>::try_from(logits.argmax(-1, false)).unwrap();
        let banned: Vec<[i64; 2]> = top.iter().map(|&t| [t, 7]).collect();
        let specs: Vec<RowSpec<'_>> = (0..rows as usize)
            .map(|r| RowSpec {
                temperature: [0.0, 1.0, 0.7, 1.3][r % 4],
                uniform: crate::rng::uniform(3, r as u64, 0),
                banned: if r % 3 == 0 { &banned[r] } else { &[] },
                ..spec(1.0, 0.5)
            })
            .collect();
        let data = Vec::<f32>::try_from(logits.flatten(0, -1)).unwrap();
        let ours = rows::sample(&data, vocab as usize, &specs).expect("every row is a simple one");
        let theirs = sample_tensors(&logits, &specs).unwrap();
        assert_eq!(ours.ids, theirs.ids);
        for (a, b) in ours.logprobs.iter().zip(&theirs.logprobs) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        // A row with a filter or top logprobs is left to the libtorch path.
        assert!(
            rows::sample(&data[..vocab as usize], vocab as usize, &[RowSpec { top_k: 5, ..spec(1.0, 0.5) }]).is_none()
        );
    }

    #[test]
    fn greedy_takes_argmax_and_reports_the_untempered_logprob() {
        let out = sample(&logits(), &[spec(0.0, 0.5), spec(0.0, 0.5)]).unwrap();
        assert_eq!(out.ids, vec![3, 0]);
        assert!((out.logprobs[0] - 0.4f32.ln()).abs() < 1e-6);
        assert!((out.logprobs[1] - 0.7f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn inverse_cdf_follows_the_uniform_number() {
        // Row 0 cumulative: 0.1, 0.3, 0.6, 1.0.
        for (u, want) in [(0.05, 0), (0.25, 1), (0.59, 2), (0.61, 3), (0.999, 3)] {
            let out = sample(&logits(), &[spec(1.0, u), spec(0.0, 0.5)]).unwrap();
            assert_eq!(out.ids, vec![want, 0], "u = {u}");
        }
    }

    #[test]
    fn temperature_scales_the_logprob() {
        let out = sample(&logits(), &[spec(0.5, 0.999), spec(2.0, 0.001)]).unwrap();
        let p = [0.1f32, 0.2, 0.3, 0.4].map(|p| p * p);
        let z: f32 = p.iter().sum();
        assert_eq!(out.ids[0], 3);
        assert!((out.logprobs[0] - (p[3] / z).ln()).abs() < 1e-5);
        let q = [0.7f32, 0.1, 0.1, 0.1].map(f32::sqrt);
        let z: f32 = q.iter().sum();
        assert_eq!(out.ids[1], 0);
        assert!((out.logprobs[1] - (q[0] / z).ln()).abs() < 1e-5);
    }

    #[test]
    fn filters_restrict_the_support() {
        let l = logits();
        let many = |f: &dyn Fn(f64) -> RowSpec<'static>| -> Vec<u32> {
            (1..100).map(|i| sample(&l, &[f(i as f64 / 100.0), spec(0.0, 0.5)]).unwrap().ids[0]).collect()
        };
        let top_k = many(&|u| RowSpec { top_k: 2, ..spec(1.0, u) });
        assert!(top_k.iter().all(|&t| t == 2 || t == 3) && top_k.contains(&2));
        // top_p 0.5: 0.4 alone is below 0.5, so {3, 2} stay.
        let top_p = many(&|u| RowSpec { top_p: 0.5, ..spec(1.0, u) });
        assert!(top_p.iter().all(|&t| t == 2 || t == 3) && top_p.contains(&2));
        // min_p 0.6: tokens below 0.24 go.
        let min_p = many(&|u| RowSpec { min_p: 0.6, ..spec(1.0, u) });
        assert!(min_p.iter().all(|&t| t == 2 || t == 3) && min_p.contains(&2));
        let k1 = many(&|u| RowSpec { top_k: 1, ..spec(1.0, u) });
        assert!(k1.iter().all(|&t| t == 3));
    }

    #[test]
    fn top_logprobs_come_from_the_sampled_distribution_only_for_rows_that_ask() {
        let out = sample(&logits(), &[spec(1.0, 0.5), spec(2.0, 0.5)]).unwrap();
        assert!(out.top.is_empty());
        let out = sample(&logits(), &[spec(0.0, 0.5), RowSpec { top_logprobs: 2, ..spec(2.0, 0.5) }]).unwrap();
        assert!(out.top[0].is_empty());
        let q = [0.7f32, 0.1, 0.1, 0.1].map(f32::sqrt);
        let z: f32 = q.iter().sum();
        assert_eq!(out.top[1].len(), 2);
        assert_eq!(out.top[1][0].token, 0);
        assert!((out.top[1][0].logprob - (q[0] / z).ln()).abs() < 1e-5);
        assert!((out.top[1][1].logprob - (q[1] / z).ln()).abs() < 1e-5);
        // More than the vocabulary is capped at the vocabulary.
        let out = sample(&logits(), &[RowSpec { top_logprobs: 9, ..spec(0.0, 0.5) }, spec(0.0, 0.5)]).unwrap();
        let tokens: Vec<u32> = out.top[0].iter().map(|t| t.token).collect();
        assert_eq!(tokens, vec![3, 2, 1, 0]);
    }

    #[test]
    fn banned_ids_are_never_chosen_but_keep_their_logprob_mass() {
        let banned = [3i64, 0];
        let out = sample(
            &logits(),
            &[RowSpec { banned: &banned[..1], ..spec(0.0, 0.5) }, RowSpec { banned: &banned[1..], ..spec(1.0, 0.01) }],
        )
        .unwrap();
        assert_eq!(out.ids[0], 2);
        assert!((out.logprobs[0] - 0.3f32.ln()).abs() < 1e-6);
        assert_ne!(out.ids[1], 0);
    }
}
