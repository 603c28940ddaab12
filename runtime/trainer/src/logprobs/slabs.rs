//! The output head in slabs of the vocabulary, with its gradient written by hand.
//!
//! Why: the head's matmul `[rows, hidden] × [hidden, vocab]` writes `rows × vocab` logits (118 MB for 600
//! positions of a 49k vocabulary), and every operation after it — logsumexp, the entropy's softmax and product,
//! autograd's own passes backward — reads and writes that much again from memory. Measured on SmolLM2's head
//! with 2 threads (Zen 3): the whole-vocabulary matmul runs at 82–94 GFLOP/s, the same work in slabs of 2048
//! columns at 119, because each slab's logits stay in cache for the operations that follow. So the head is
//! computed slab by slab: forward, each slab's logits fold into the rows' running softmax statistics
//! ([`VocabSoftmax`]); backward, the logits' gradient is formed per slab in closed form
//! ([`vocab_softmax::logits_grad`]) and multiplied straight into the gradients of the hidden states and of the
//! head's weight. No autograd graph is built for the head.

use tch::{Kind, Tensor};
use trinity_model::vocab_softmax::{self, RowGrads, VocabSoftmax, VocabStats};

use crate::error::Result;

/// Bytes of fp32 logits one slab should hold: small enough to stay in a core's share of the last-level cache.
const SLAB_BYTES: i64 = 4 << 20;

/// Vocabulary columns per slab for `rows` rows: about [`SLAB_BYTES`] of logits, between 512 and 4096 columns
/// (below 512 the matmul itself loses efficiency), a multiple of 128.
fn slab_columns(rows: i64, vocab: i64) -> i64 {
    let columns = (SLAB_BYTES / (4 * rows.max(1))).clamp(512, 4096);
    (columns / 128 * 128).min(vocab).max(1)
}

/// The logits of the slab `[start, start + columns)` of the vocabulary for rows `h` `[rows, hidden]`, from the
/// matmul in the model's dtype (as the whole-vocabulary head computes them).
fn logits(w: &Tensor, h: &Tensor, start: i64, columns: i64) -> Result<Tensor> {
    Ok(h.f_mm(&w.f_narrow(0, start, columns)?.f_tr()?)?)
}

/// Logprob of `y` `[rows]` (and the entropy when asked) for hidden states `h` `[rows, hidden]` under the head
/// `w` `[vocab, hidden]`, in one pass over the vocabulary. Without gradients.
pub(super) fn forward(w: &Tensor, h: &Tensor, y: &Tensor, temperature: f64, entropy: bool) -> Result<VocabStats> {
    tch::no_grad(|| {
        let (rows, vocab) = (h.size()[0], w.size()[0]);
        let columns = slab_columns(rows, vocab);
        let mut softmax = VocabSoftmax::new(rows, entropy, h.device())?;
        let mut start = 0;
        while start < vocab {
            let len = columns.min(vocab - start);
            softmax.add(&logits(w, h, start, len)?, y, start, temperature)?;
            start += len;
        }
        Ok(softmax.finish()?)
    })
}

/// Backward through the head for rows `h` `[rows, hidden]` with targets `y`, given the forward's `lse`: returns
/// `∂loss/∂h` `[rows, hidden]` fp32 and, when `grad_w` is given (`[vocab, hidden]` fp32), adds `∂loss/∂w` to
/// it. Without gradients (nothing here is recorded).
pub(super) fn backward(
    w: &Tensor,
    h: &Tensor,
    y: &Tensor,
    temperature: f64,
    lse: &Tensor,
    upstream: RowGrads,
    mut grad_w: Option<&mut Tensor>,
) -> Result<Tensor> {
    tch::no_grad(|| {
        let (rows, vocab) = (h.size()[0], w.size()[0]);
        let columns = slab_columns(rows, vocab);
        // fp32 weights multiply in fp32. A bf16 (or f16) head multiplies in its own dtype, the logits' gradient
        // in it, as autocast runs a bf16 linear's backward; sums stay fp32. On a CPU with AMX that is several
        // times the fp32 rate, and it spares converting every weight slab to fp32 on each pass.
        let low = w.kind() != Kind::Float;
        let h_w = h.f_to_kind(w.kind())?;
        let mut grad_h = Tensor::f_zeros([rows, h.size()[1]], (Kind::Float, h.device()))?;
        let mut start = 0;
        while start < vocab {
            let len = columns.min(vocab - start);
            let grad_z =
                vocab_softmax::logits_grad(&logits(w, &h_w, start, len)?, y, start, temperature, lse, upstream)?;
            let w_slab = w.f_narrow(0, start, len)?;
            if low {
                grad_h += grad_z.f_mm(&w_slab)?.f_to_kind(Kind::Float)?;
                if let Some(grad_w) = grad_w.as_deref_mut() {
                    let mut rows_of_w = grad_w.f_narrow(0, start, len)?;
                    rows_of_w += grad_z.f_tr()?.f_mm(&h_w)?.f_to_kind(Kind::Float)?;
                }
            } else {
                grad_h = grad_h.f_addmm(&grad_z, &w_slab)?;
                if let Some(grad_w) = grad_w.as_deref_mut() {
                    let mut rows_of_w = grad_w.f_narrow(0, start, len)?;
                    let _ = rows_of_w.f_addmm_(&grad_z.f_tr()?, &h_w)?;
                }
            }
            start += len;
        }
        Ok(grad_h)
    })
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;

    /// Slabs (several, the last one short) give what the whole-vocabulary formulas and autograd give.
    #[test]
    fn slabs_match_the_whole_vocabulary_forward_and_backward() {
        let _rng = crate::torch_rng();
        tch::manual_seed(7);
        let (rows, hidden, vocab) = (5, 8, 9000);
        let w = Tensor::randn([vocab, hidden], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let h = Tensor::randn([rows, hidden], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let y = Tensor::from_slice(&[0i64, 4095, 4096, 8999, 5000]);
        assert!(slab_columns(rows, vocab) < vocab, "the test must cross slab boundaries");
        let (t, g_lp, g_ent) = (0.7, Tensor::from_slice(&[0.3f32, -1.0, 0.5, 2.0, 0.0]), 0.2);

        let z = h.mm(&w.tr()) / t;
        let lp = z.log_softmax(-1, Kind::Float);
        let want_lp = lp.gather(1, &y.unsqueeze(1), false).squeeze_dim(1);
        let want_ent = -(lp.exp() * &lp).sum_dim_intlist(-1, false, Kind::Float);
        ((&want_lp * &g_lp).sum(Kind::Float) + (&want_ent * g_ent).sum(Kind::Float)).backward();

        let stats = forward(&w.detach(), &h.detach(), &y, t, true).unwrap();
        let close = |a: &Tensor, b: &Tensor, what: &str| {
            // fp32 sums over 9000 terms in another order: relative to the values' size.
            let (diff, scale) = ((a - b).abs().max().double_value(&[]), b.abs().max().double_value(&[]));
            assert!(diff <= 2e-5 * scale.max(1.0), "{what}: {diff} (values up to {scale})");
        };
        close(&stats.logprob, &want_lp.detach(), "logprob");
        let entropy = stats.entropy.unwrap();
        close(&entropy, &want_ent.detach(), "entropy");

        let mu = &stats.lse - &entropy;
        let g_ent = Tensor::full([rows], g_ent, (Kind::Float, Device::Cpu));
        let upstream = RowGrads { logprob: &g_lp, entropy: Some((&mu, &g_ent)) };
        let mut grad_w = Tensor::zeros([vocab, hidden], (Kind::Float, Device::Cpu));
        let grad_h = backward(&w.detach(), &h.detach(), &y, t, &stats.lse, upstream, Some(&mut grad_w)).unwrap();
        close(&grad_h, &h.grad(), "hidden gradient");
        close(&grad_w, &w.grad(), "head weight gradient");

        // A bf16 head multiplies in bf16: the fp32 results to bf16's precision, for bf16 copies of the same inputs.
        let (w16, h16) = (w.detach().to_kind(Kind::BFloat16), h.detach().to_kind(Kind::BFloat16));
        let stats = forward(&w16, &h16, &y, t, true).unwrap();
        let mu = &stats.lse - stats.entropy.as_ref().unwrap();
        let upstream = RowGrads { logprob: &g_lp, entropy: Some((&mu, &g_ent)) };
        let mut grad_w16 = Tensor::zeros([vocab, hidden], (Kind::Float, Device::Cpu));
        let grad_h16 = backward(&w16, &h16, &y, t, &stats.lse, upstream, Some(&mut grad_w16)).unwrap();
        assert_eq!((grad_h16.kind(), grad_w16.kind()), (Kind::Float, Kind::Float));
        let near = |a: &Tensor, b: &Tensor, what: &str| {
            let (diff, scale) = ((a - b).abs().max().double_value(&[]), b.abs().max().double_value(&[]));
            assert!(diff <= 0.05 * scale, "{what}: {diff} (values up to {scale})");
        };
        near(&grad_h16, &h.grad(), "bf16 hidden gradient");
        near(&grad_w16, &w.grad(), "bf16 head weight gradient");
    }
}
