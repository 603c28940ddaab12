//! The softmax over a vocabulary taken in slabs of columns: each row's logprob of its target, its entropy and its
//! logsumexp, gathered slab by slab with an online logsumexp (running maximum and rescaled sums, as flash
//! attention does), and the loss's gradient by one slab's logits in closed form. The trainer's output head runs on
//! these (`trinity_trainer::logprobs`, whose `slabs` module says why the head goes in slabs).
//!
//! With `z = logits / T`, `lse = logsumexp(z)`, `p = softmax(z)` and `μ = Σ p z`:
//! - the logprob `ℓ = z_y − lse` and the entropy `H = lse − μ`;
//! - `∂ℓ/∂z = onehot(y) − p` and `∂H/∂z = −p (z − μ)`; the logits' gradient is that over `T`.
//!
//! On AVX-512 and AVX2 CPUs each slab is one fused pass each way (`csrc/train_ops.cpp`), reading the matmul's logits in
//! their dtype and computing in fp32. Spelled out in libtorch ops it is about ten kernels each way, every one
//! streaming a slab through memory: 150 ms of a 1.33 s SmolLM2 train step (8 × 164 tokens, bf16, 2 cores of a
//! Xeon with AMX). Elsewhere those libtorch ops run, with the same results to fp32 rounding.

use tch::{Device, Kind, Tensor};

use crate::error::Result;
#[cfg(train_ops)]
use crate::train_ops::{call, call_in_place, ffi, handle, kernel_set};

/// Each row's softmax statistics so far, `[rows]` f32 each.
#[derive(Debug)]
pub struct VocabSoftmax {
    max: Tensor,
    sum: Tensor,
    /// `Σ e^(z − max) · z`, kept when the entropy is wanted.
    weighted: Option<Tensor>,
    /// `z_y`, once the slab holding `y` has been added.
    picked: Tensor,
}

/// What [`VocabSoftmax::finish`] gives, `[rows]` f32 each.
#[derive(Debug)]
pub struct VocabStats {
    pub logprob: Tensor,
    pub entropy: Option<Tensor>,
    /// `logsumexp(z)`, which [`logits_grad`] needs to form `p` slab by slab.
    pub lse: Tensor,
}

/// The upstream gradients of a row's logprob `∂loss/∂ℓ` and, when the loss depends on the entropy, `(μ, ∂loss/∂H)`
/// with `μ = lse − H`: `[rows]` f32 each.
#[derive(Debug, Clone, Copy)]
pub struct RowGrads<'a> {
    pub logprob: &'a Tensor,
    pub entropy: Option<(&'a Tensor, &'a Tensor)>,
}

impl VocabSoftmax {
    /// No slab yet, for `rows` rows; `entropy`: gather what the entropy needs too.
    pub fn new(rows: i64, entropy: bool, device: Device) -> Result<Self> {
        let options = (Kind::Float, device);
        Ok(VocabSoftmax {
            max: Tensor::f_full([rows], f64::NEG_INFINITY, options)?,
            sum: Tensor::f_zeros([rows], options)?,
            weighted: if entropy { Some(Tensor::f_zeros([rows], options)?) } else { None },
            picked: Tensor::f_zeros([rows], options)?,
        })
    }

    /// Folds in the slab of vocabulary columns `[start, start + cols)`: `logits` `[rows, cols]` (in the model's
    /// dtype, as the head's matmul gives them) for targets `y` `[rows]` (int64).
    pub fn add(&mut self, logits: &Tensor, y: &Tensor, start: i64, temperature: f64) -> Result<()> {
        #[cfg(train_ops)]
        if let Some(isa) = kernel_set(logits) {
            let (z, y) = (logits.f_contiguous()?, y.f_contiguous()?);
            let weighted = self.weighted.as_ref().map_or(std::ptr::null_mut(), handle);
            // SAFETY: live tch tensors (or null) borrowed for the call; the C++ side checks their shapes and
            // dtypes, reads the logits and targets, and writes only the four `[rows]` statistics in place.
            return call_in_place("vocab softmax", || unsafe {
                ffi::trinity_vocab_softmax_add(
                    isa as i64,
                    handle(&z),
                    handle(&y),
                    start,
                    temperature,
                    handle(&self.max),
                    handle(&self.sum),
                    weighted,
                    handle(&self.picked),
                )
            });
        }
        tch::no_grad(|| {
            let (rows, cols) = (logits.size()[0], logits.size()[1]);
            let z = scaled(logits, temperature)?;
            let next = self.max.f_maximum(&z.f_amax([-1], false)?)?;
            let rescale = (&self.max - &next).f_exp()?;
            let e = (&z - next.f_unsqueeze(1)?).f_exp()?;
            self.sum = &self.sum * &rescale + e.f_sum_dim_intlist(-1, false, Kind::Float)?;
            if let Some(weighted) = &self.weighted {
                // Σ e·z per row as a batched dot product: one read of each, no [rows, cols] temporary.
                let dot = e.f_unsqueeze(1)?.f_bmm(&z.f_unsqueeze(2)?)?.f_view([rows])?;
                self.weighted = Some(weighted * &rescale + dot);
            }
            let (inside, local) = target_in(y, start, cols)?;
            self.picked = z.f_gather(1, &local, false)?.f_squeeze_dim(1)?.f_where_self(&inside, &self.picked)?;
            self.max = next;
            Ok(())
        })
    }

    /// The statistics over every slab added.
    pub fn finish(self) -> Result<VocabStats> {
        let lse = &self.max + self.sum.f_log()?;
        let entropy = match self.weighted {
            Some(weighted) => Some(&lse - weighted / &self.sum),
            None => None,
        };
        Ok(VocabStats { logprob: self.picked - &lse, entropy, lse })
    }
}

/// `∂loss/∂logits` for the slab of columns `[start, start + cols)` (`logits` `[rows, cols]`, targets `y`), given
/// each row's `lse` over the whole vocabulary and its upstream gradients. In the logits' dtype.
pub fn logits_grad(
    logits: &Tensor,
    y: &Tensor,
    start: i64,
    temperature: f64,
    lse: &Tensor,
    upstream: RowGrads,
) -> Result<Tensor> {
    #[cfg(train_ops)]
    if let Some(isa) = kernel_set(logits) {
        let (z, y) = (logits.f_contiguous()?, y.f_contiguous()?);
        let (mu, g_ent) =
            upstream.entropy.map_or((std::ptr::null_mut(), std::ptr::null_mut()), |(mu, g)| (handle(mu), handle(g)));
        // SAFETY: live tch tensors (or nulls, both or neither) borrowed for the call; the C++ side checks their
        // shapes and dtypes, only reads them, and returns a new tensor.
        return call("vocab logits gradient", |out| unsafe {
            ffi::trinity_vocab_logits_grad(
                isa as i64,
                handle(&z),
                handle(&y),
                start,
                temperature,
                handle(lse),
                handle(upstream.logprob),
                mu,
                g_ent,
                out,
            )
        });
    }
    tch::no_grad(|| {
        let z = scaled(logits, temperature)?;
        let p = (&z - lse.f_unsqueeze(1)?).f_exp()?;
        let minus_g = upstream.logprob.f_neg()?.f_unsqueeze(1)?;
        let mut grad = match upstream.entropy {
            None => p * &minus_g,
            Some((mu, g)) => &p * &minus_g - p * (z - mu.f_unsqueeze(1)?) * g.f_unsqueeze(1)?,
        };
        let (inside, local) = target_in(y, start, logits.size()[1])?;
        let at_target = upstream.logprob.f_where_scalarother(&inside, 0.0)?.f_unsqueeze(1)?;
        grad = grad.f_scatter_add(1, &local, &at_target)?;
        if temperature != 1.0 {
            grad = grad.f_div_scalar_(temperature)?;
        }
        Ok(grad.f_to_kind(logits.kind())?)
    })
}

/// The logits in fp32 over the temperature.
fn scaled(logits: &Tensor, temperature: f64) -> Result<Tensor> {
    let z = logits.f_to_kind(Kind::Float)?;
    Ok(if temperature != 1.0 { z / temperature } else { z })
}

/// For each row, whether its target falls in the slab `[start, start + cols)`, and where (`[rows, 1]`, clamped
/// into the slab when it does not).
fn target_in(y: &Tensor, start: i64, cols: i64) -> Result<(Tensor, Tensor)> {
    let inside = y.f_ge(start)?.f_logical_and(&y.f_lt(start + cols)?)?;
    let local = (y - start).f_clamp(0, cols - 1)?.f_unsqueeze(1)?;
    Ok((inside, local))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slab by slab (several, the last one short, with a temperature) the statistics and the logits' gradient
    /// equal the whole-vocabulary formulas under autograd, in fp32; in bf16 and f16 to their precision, on every
    /// path this CPU has. f16 takes the libtorch path on every CPU, fp32 and bf16 each instruction set's kernels
    /// where the CPU has it, and libtorch's ops.
    #[test]
    fn slabs_match_the_whole_vocabulary_under_autograd() {
        tch::manual_seed(7);
        let (rows, vocab, cols, t) = (5, 300, 128, 0.7);
        let z0 = Tensor::randn([rows, vocab], (Kind::Float, Device::Cpu)) * 3.0;
        let y = Tensor::from_slice(&[0i64, 127, 128, 299, 200]);
        let (g_lp, g_ent) = (Tensor::from_slice(&[0.3f32, -1.0, 0.5, 2.0, 0.0]), 0.2);

        let z = z0.detach().set_requires_grad(true);
        let lp = (&z / t).log_softmax(-1, Kind::Float);
        let want_lp = lp.gather(1, &y.unsqueeze(1), false).squeeze_dim(1);
        let want_ent = -(lp.exp() * &lp).sum_dim_intlist(-1, false, Kind::Float);
        ((&want_lp * &g_lp).sum(Kind::Float) + (&want_ent * g_ent).sum(Kind::Float)).backward();
        let want_grad = z.grad();

        let kinds = [(Kind::Float, 2e-5), (Kind::BFloat16, 0.02), (Kind::Half, 0.005)];
        #[cfg(train_ops)]
        let paths = crate::train_ops::testing::paths();
        #[cfg(not(train_ops))]
        let paths = [()];
        for (path, (kind, tolerance)) in paths.into_iter().flat_map(|p| kinds.map(|k| (p, k))) {
            #[cfg(train_ops)]
            let _path = crate::train_ops::testing::Forced::new(path);
            let logits = z0.to_kind(kind);
            let mut softmax = VocabSoftmax::new(rows, true, Device::Cpu).unwrap();
            for start in (0..vocab).step_by(cols as usize) {
                let len = cols.min(vocab - start);
                softmax.add(&logits.narrow(1, start, len), &y, start, t).unwrap();
            }
            let stats = softmax.finish().unwrap();
            let entropy = stats.entropy.unwrap();
            let close = |a: &Tensor, b: &Tensor, what: &str| {
                let (diff, scale) = ((a.to_kind(Kind::Float) - b).abs().max().double_value(&[]), b.abs().max());
                let scale = scale.double_value(&[]).max(1.0);
                assert!(diff <= tolerance * scale, "{path:?} {kind:?} {what}: {diff} (values up to {scale})");
            };
            close(&stats.logprob, &want_lp.detach(), "logprob");
            close(&entropy, &want_ent.detach(), "entropy");

            let mu = &stats.lse - &entropy;
            let g_ent = Tensor::full([rows], g_ent, (Kind::Float, Device::Cpu));
            let upstream = RowGrads { logprob: &g_lp, entropy: Some((&mu, &g_ent)) };
            let parts: Vec<Tensor> = (0..vocab)
                .step_by(cols as usize)
                .map(|start| {
                    let len = cols.min(vocab - start);
                    let g = logits_grad(&logits.narrow(1, start, len), &y, start, t, &stats.lse, upstream).unwrap();
                    assert_eq!(g.kind(), kind);
                    g
                })
                .collect();
            close(&Tensor::cat(&parts, 1), &want_grad, "logits gradient");
        }
    }

    /// A slab whose targets are not one int64 per row is an error naming what is wrong, not a crash.
    #[test]
    fn mismatched_targets_are_an_error() {
        let logits = Tensor::zeros([4, 64], (Kind::Float, Device::Cpu));
        let mut softmax = VocabSoftmax::new(4, false, Device::Cpu).unwrap();
        assert!(softmax.add(&logits, &Tensor::zeros([3], (Kind::Int64, Device::Cpu)), 0, 1.0).is_err());
    }
}
