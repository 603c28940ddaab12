//! Response-token logprobs and entropy through the output head, in chunks, with bounded memory.
//!
//! The head turns `[B, R, hidden]` into `[B, R, vocab]` logits — for SmolLM2 at 8 × 164 tokens that is 250 MB
//! in fp32 — and autograd keeps each chunk's logits until the backward pass, so memory would grow with
//! sequence × vocabulary even when computed in chunks. The loss is therefore differentiated in two halves:
//!
//! 1. [`forward`]: chunk by chunk (`chunk_tokens` rows × positions at a time), the logprob of each target,
//!    `ℓ = z_y − logsumexp(z)`, and optionally the entropy `H = logsumexp(z) − Σ softmax(z)·z`, with
//!    `z = logits / temperature` in fp32, from a detached copy (a leaf) of the hidden states.
//! 2. The caller builds its loss on leaf tensors holding ℓ (and H) and gets `∂loss/∂ℓ` (and `∂loss/∂H`).
//! 3. [`backward`]: backpropagates `Σ ∂loss/∂ℓ · ℓ (+ Σ ∂loss/∂H · H)` through the head — accumulating the
//!    head's weight gradient and the hidden-state gradient — and then the hidden-state gradient through the
//!    decoder with one backward call.
//!
//! Two ways to get through the head in step 3, chosen per call by the size of the logits ([`HeadMode`]):
//! - *keep*: step 1 records autograd history, step 3 replays it. No extra compute; the logits of the whole
//!   micro-batch stay alive in between (`B·R·vocab·4` bytes).
//! - *recompute*: step 1 runs under `no_grad` and keeps only `[B, R]` results (and each position's
//!   logsumexp); step 3 recomputes the logits and forms their gradient in closed form. Both run over slabs of
//!   the vocabulary that stay in cache, without autograd ([`slabs`]). Memory is one slab; the price is one more
//!   head matmul.
//!
//! Both equal plain autograd through the whole head (tested).

use tch::{Kind, Tensor};
use trinity_model::Decoder;
use trinity_model::vocab_softmax::RowGrads;

use crate::error::{Result, TrainerError};

mod slabs;

/// Logprobs and entropy of the response tokens, `[B, R]` f32, without autograd history.
#[derive(Debug)]
pub struct HeadStats {
    pub logprob: Tensor,
    pub entropy: Option<Tensor>,
}

/// How step 3 gets through the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadMode {
    /// Keep the autograd history when the micro-batch's fp32 logits take at most this many bytes, else
    /// recompute.
    KeepUpTo(i64),
    /// Always recompute (memory of one chunk).
    Recompute,
}

/// What step 1 hands to step 3.
#[derive(Debug)]
pub struct HeadPass {
    /// The values for the loss.
    pub stats: HeadStats,
    /// The detached hidden states the head ran on.
    leaf: Tensor,
    /// Kept mode: ℓ (and H when its gradient is wanted) with autograd history back to `leaf`.
    kept: Option<(Tensor, Option<Tensor>)>,
    /// Recompute mode: each position's logsumexp `[B, R]`.
    lse: Option<Tensor>,
    entropy_grad: bool,
}

/// ℓ for one chunk, and H when asked: with autograd history when gradients are enabled, except that H has
/// none unless `entropy_grad`.
fn chunk(
    decoder: &Decoder,
    hidden: &Tensor,
    targets: &Tensor,
    temperature: f64,
    entropy: bool,
    entropy_grad: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let logits = decoder.logits(hidden)?.f_to_kind(Kind::Float)?;
    let z = if temperature != 1.0 { logits / temperature } else { logits };
    let lse = z.f_logsumexp([-1], false)?;
    let picked = z.f_gather(-1, &targets.f_unsqueeze(-1)?, false)?.f_squeeze_dim(-1)?;
    let logprob = picked - &lse;
    let entropy_of = |z: &Tensor, lse: &Tensor| -> Result<Tensor> {
        let p = z.f_softmax(-1, Kind::Float)?;
        Ok(lse - (p * z).f_sum_dim_intlist(-1, false, Kind::Float)?)
    };
    let entropy = match (entropy, entropy_grad) {
        (false, _) => None,
        (true, true) => Some(entropy_of(&z, &lse)?),
        (true, false) => Some(tch::no_grad(|| entropy_of(&z.detach(), &lse.detach()))?),
    };
    Ok((logprob, entropy))
}

/// Step 1 without any gradient: logprobs of `targets` `[B, R]` given `hidden` `[B, R, hidden]` (and the
/// entropy when asked). For scoring (reference model, rollout logprobs).
pub fn score(
    decoder: &Decoder,
    hidden: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk_tokens: i64,
    entropy: bool,
) -> Result<HeadStats> {
    let (stats, _) = slab_stats(decoder, hidden, targets, temperature, chunk_tokens, entropy)?;
    Ok(stats)
}

/// `[B, R, hidden]` hidden states as `[B·R, hidden]` rows and `[B, R]` targets as `[B·R]`, with the row ranges of
/// at most `chunk_tokens` rows the head runs one at a time. The rows keep the hidden states' autograd history.
struct FlatRows {
    hidden: Tensor,
    targets: Tensor,
    chunks: Vec<(i64, i64)>,
    /// `[B, R]`, to shape per-row results back.
    shape: [i64; 2],
}

impl FlatRows {
    fn new(hidden: &Tensor, targets: &Tensor, chunk_tokens: i64) -> Result<Self> {
        let size = hidden.size();
        let (rows, width) = (size[0] * size[1], size[2]);
        let chunks = (0..rows).step_by(chunk_tokens.max(1) as usize).map(|s| (s, chunk_tokens.min(rows - s))).collect();
        Ok(FlatRows {
            hidden: hidden.f_reshape([rows, width])?,
            targets: targets.f_reshape([rows])?,
            chunks,
            shape: [size[0], size[1]],
        })
    }

    /// Runs `f` on each chunk's rows and targets and joins the per-row tensors it returns (each in the same
    /// slot on every call) into `[B, R]` ones.
    fn each<const N: usize>(
        &self,
        mut f: impl FnMut(&Tensor, &Tensor) -> Result<[Option<Tensor>; N]>,
    ) -> Result<[Option<Tensor>; N]> {
        let mut parts: [Vec<Tensor>; N] = std::array::from_fn(|_| Vec::new());
        for &(start, len) in &self.chunks {
            let out = f(&self.hidden.f_narrow(0, start, len)?, &self.targets.f_narrow(0, start, len)?)?;
            for (slot, t) in parts.iter_mut().zip(out) {
                slot.extend(t);
            }
        }
        let mut joined: [Option<Tensor>; N] = std::array::from_fn(|_| None);
        for (out, slot) in joined.iter_mut().zip(parts) {
            *out = match slot.len() {
                0 if self.chunks.is_empty() => Some(Tensor::f_zeros(self.shape, (Kind::Float, self.hidden.device()))?),
                0 => None,
                _ => Some(Tensor::f_cat(&slot, 0)?.f_view(self.shape)?),
            };
        }
        Ok(joined)
    }
}

/// Step 1 over vocabulary slabs ([`slabs::forward`]), `chunk_tokens` rows at a time: the stats and each
/// position's logsumexp, `[B, R]` each.
fn slab_stats(
    decoder: &Decoder,
    hidden: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk_tokens: i64,
    entropy: bool,
) -> Result<(HeadStats, Tensor)> {
    let rows = FlatRows::new(&hidden.f_detach()?, targets, chunk_tokens)?;
    let [logprob, ent, lse] = rows.each(|h, y| {
        let part = slabs::forward(decoder.head_weight(), h, y, temperature, entropy)?;
        Ok([Some(part.logprob), part.entropy, Some(part.lse)])
    })?;
    let missing = || TrainerError::InvalidBatch("no rows to score".into());
    let entropy = if entropy { ent } else { None };
    Ok((HeadStats { logprob: logprob.ok_or_else(missing)?, entropy }, lse.ok_or_else(missing)?))
}

/// Step 1 for training: as [`score`], remembering what [`backward`] needs. `entropy_grad`: the loss will
/// depend on H (a nonzero entropy coefficient).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    decoder: &Decoder,
    hidden: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk_tokens: i64,
    entropy: bool,
    entropy_grad: bool,
    mode: HeadMode,
) -> Result<HeadPass> {
    let size = hidden.size();
    let logit_bytes =
        size.first().copied().unwrap_or(0) * size.get(1).copied().unwrap_or(0) * decoder.config().vocab_size * 4;
    let keep = matches!(mode, HeadMode::KeepUpTo(limit) if logit_bytes <= limit);
    if keep {
        let leaf = hidden.f_detach()?.set_requires_grad(true);
        let [lp, ent] = FlatRows::new(&leaf, targets, chunk_tokens)?.each(|h, y| {
            let (lp, ent) = chunk(decoder, h, y, temperature, entropy, entropy_grad)?;
            Ok([Some(lp), ent])
        })?;
        let lp = lp.ok_or_else(|| TrainerError::InvalidBatch("no rows to score".into()))?;
        let ent = if entropy { ent } else { None };
        let stats = HeadStats { logprob: lp.f_detach()?, entropy: ent.as_ref().map(Tensor::f_detach).transpose()? };
        let kept_ent = if entropy_grad { ent } else { None };
        Ok(HeadPass { stats, leaf, kept: Some((lp, kept_ent)), lse: None, entropy_grad })
    } else {
        let (stats, lse) = slab_stats(decoder, hidden, targets, temperature, chunk_tokens, entropy || entropy_grad)?;
        Ok(HeadPass { stats, leaf: hidden.f_detach()?, kept: None, lse: Some(lse), entropy_grad })
    }
}

/// Step 3: backpropagates `grad_logprob` (and `grad_entropy`), both `[B, R]`, through the head and then through
/// `hidden` (which must carry the decoder's autograd graph). Accumulates into the parameters' `.grad`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    decoder: &Decoder,
    pass: HeadPass,
    hidden: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk_tokens: i64,
    grad_logprob: &Tensor,
    grad_entropy: Option<&Tensor>,
) -> Result<()> {
    let device = hidden.device();
    let grad_logprob = grad_logprob.f_to_device(device)?;
    let grad_entropy = if pass.entropy_grad { grad_entropy.map(|g| g.f_to_device(device)).transpose()? } else { None };
    let weighted = |lp: &Tensor, ent: Option<Tensor>, start: i64, len: i64| -> Result<Tensor> {
        let s = (lp * grad_logprob.f_narrow(1, start, len)?).f_sum(Kind::Float)?;
        Ok(match (ent, &grad_entropy) {
            (Some(ent), Some(g)) => s + (ent * g.f_narrow(1, start, len)?).f_sum(Kind::Float)?,
            _ => s,
        })
    };
    let grad_hidden = match (pass.kept, pass.lse) {
        (Some((lp, ent)), _) => {
            let r = hidden.size().get(1).copied().unwrap_or(0);
            weighted(&lp, ent, 0, r)?.f_backward()?;
            pass.leaf.grad()
        }
        (None, Some(lse)) => {
            // The entropy's gradient through the logits needs μ = lse − H per position.
            let mu = match (&grad_entropy, &pass.stats.entropy) {
                (Some(_), Some(h)) => Some(&lse - h),
                _ => None,
            };
            let upstream = RowGrads { logprob: &grad_logprob, entropy: mu.as_ref().zip(grad_entropy.as_ref()) };
            return recomputed_backward(
                decoder,
                &pass.leaf,
                hidden,
                targets,
                temperature,
                chunk_tokens,
                &lse,
                upstream,
            );
        }
        (None, None) => unreachable!("a head pass keeps its graph or its logsumexp"),
    };
    if grad_hidden.defined() && hidden.requires_grad() {
        trinity_model::backward_with(hidden, &grad_hidden)?;
    }
    Ok(())
}

/// Step 3 in recompute mode: the head's gradients over vocabulary slabs ([`slabs::backward`]), added into the
/// head weight's gradient as they are, then carried through the decoder from the hidden states (one backward).
#[allow(clippy::too_many_arguments)]
fn recomputed_backward(
    decoder: &Decoder,
    leaf: &Tensor,
    hidden: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk_tokens: i64,
    lse: &Tensor,
    upstream: RowGrads,
) -> Result<()> {
    let size = leaf.size();
    let rows = size[0] * size[1];
    let w = decoder.head_weight();
    let FlatRows { hidden: h, targets: y, chunks, .. } = FlatRows::new(leaf, targets, chunk_tokens)?;
    let flat = |t: &Tensor| t.f_reshape([rows]);
    let (lse, g_lp) = (flat(lse)?, flat(&upstream.logprob.f_to_kind(Kind::Float)?)?);
    let entropy = match upstream.entropy {
        Some((mu, g)) => Some((flat(mu)?, flat(g)?)),
        None => None,
    };
    let mut grad_w = if w.requires_grad() { Some(Tensor::f_zeros(w.size(), (Kind::Float, w.device()))?) } else { None };
    let mut grad_h = Vec::new();
    for (start, len) in chunks {
        let part = |t: &Tensor| t.f_narrow(0, start, len);
        let entropy = match &entropy {
            Some((mu, g)) => Some((part(mu)?, part(g)?)),
            None => None,
        };
        let upstream = RowGrads { logprob: &part(&g_lp)?, entropy: entropy.as_ref().map(|(mu, g)| (mu, g)) };
        grad_h.push(slabs::backward(w, &part(&h)?, &part(&y)?, temperature, &part(&lse)?, upstream, grad_w.as_mut())?);
    }
    if let Some(grad_w) = grad_w {
        // Into the head weight's own gradient (for tied embeddings the decoder's embedding gradient adds to it
        // in the backward below).
        trinity_model::accumulate_grad(w, grad_w)?;
    }
    if hidden.requires_grad() && !grad_h.is_empty() {
        trinity_model::backward_with(hidden, &Tensor::f_cat(&grad_h, 0)?.f_view(&size[..])?)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tch::Device;
    use trinity_model::{Family, ModelConfig, RandomWeights};

    pub(crate) fn tiny() -> Decoder {
        let _rng = crate::torch_rng();
        tch::manual_seed(3);
        let config = ModelConfig {
            vocab_size: 40,
            hidden_size: 16,
            intermediate_size: 24,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            max_position_embeddings: 64,
            ..ModelConfig::tiny(Family::Llama)
        };
        Decoder::load(config, &mut RandomWeights, Kind::Float, Device::Cpu).unwrap()
    }

    fn grads(d: &Decoder) -> Vec<Tensor> {
        d.named_parameters().unwrap().iter().map(|(_, p)| p.grad().copy()).collect()
    }

    fn zero(d: &Decoder) {
        for (_, mut p) in d.named_parameters().unwrap() {
            p.zero_grad();
        }
    }

    /// Two-pass gradients equal plain autograd through the full log-softmax, for logprob and entropy terms.
    #[test]
    fn recomputed_backward_equals_autograd() {
        let d = tiny();
        let ids = Tensor::from_slice(&[3i64, 7, 9, 11, 2, 5, 8, 13, 21, 34]).view([2, 5]);
        let targets = ids.narrow(1, 1, 4);
        let weights = Tensor::from_slice(&[0.3f32, -1.0, 0.5, 2.0, 1.0, 0.0, -0.5, 0.25]).view([2, 4]);
        let t = 0.7;

        let hidden = d.forward_hidden(&ids, None).unwrap().narrow(1, 0, 4);
        let z = d.logits(&hidden).unwrap() / t;
        let lp = z.log_softmax(-1, Kind::Float);
        let picked = lp.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1);
        let ent = -(lp.exp() * &lp).sum_dim_intlist(-1, false, Kind::Float);
        ((&picked * &weights).sum(Kind::Float) + (&ent * 0.1).sum(Kind::Float)).backward();
        let want = grads(&d);
        zero(&d);

        for mode in [HeadMode::Recompute, HeadMode::KeepUpTo(1 << 20), HeadMode::KeepUpTo(0)] {
            zero(&d);
            let hidden = d.forward_hidden(&ids, None).unwrap().narrow(1, 0, 4);
            let pass = forward(&d, &hidden, &targets, t, 3, true, true, mode).unwrap();
            assert_eq!(pass.kept.is_some(), mode == HeadMode::KeepUpTo(1 << 20));
            let stats = &pass.stats;
            assert!((&stats.logprob - picked.detach()).abs().max().double_value(&[]) < 1e-5);
            assert!((stats.entropy.as_ref().unwrap() - ent.detach()).abs().max().double_value(&[]) < 1e-5);
            let g_ent = Tensor::full([2, 4], 0.1, (Kind::Float, Device::Cpu));
            backward(&d, pass, &hidden, &targets, t, 3, &weights, Some(&g_ent)).unwrap();
            for (a, b) in grads(&d).iter().zip(&want) {
                assert!((a - b).abs().max().double_value(&[]) < 1e-5, "{mode:?}");
            }
        }
    }
}
