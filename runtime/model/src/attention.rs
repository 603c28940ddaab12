//! Attention over whole sequences for training and scoring: libtorch's `scaled_dot_product_attention`, or, where
//! it is slow, the same product spelled out in matmuls.
//!
//! Why two paths: libtorch's CPU flash-attention backward in bf16 takes 10–14× its forward at the sequence
//! lengths RL fine-tuning trains on (a few hundred tokens). Measured with libtorch 2.11 on 2 cores of a Xeon with
//! AMX, 8 rows × 110 tokens × 9 heads (GQA 3:1, SmolLM2's): 16–17.5 ms backward against 1.2–1.4 ms forward (fp32:
//! 4.5 ms backward), 30 layers of it half a SmolLM2 backward. The spelled-out product (`Q·Kᵀ`, mask, softmax in
//! f32, `·V`) runs both directions on bf16 matmuls, about 3 ms backward and 2 ms forward there; the example
//! `bench_train --dtype bf16 --seq 106` (8 rows) went from 2.18–2.34 s an iteration (backward 1.79–1.91 s) to
//! 1.81–1.85 s (backward 1.37–1.44 s). It holds the `[rows, heads, T, T]` probabilities for the backward, which
//! the flash kernel does not, and its matmuls grow with T² where flash's blocks stay in cache: past ~200 keys flash is
//! faster (PyTorch 2.11, 4 rows × 256 keys: 11.8 ms against 15.4 ms, fwd + bwd) and the scores start to weigh in
//! memory. So the matmul path runs only where gradients flow, in bf16, with at most [`SHORT_KEYS`] keys;
//! everything else (fp32, where libtorch's backward is fine, scoring without gradients, long sequences) keeps the
//! flash kernel.
//!
//! Numerics of the matmul path are transformers' eager attention in bf16: scores rounded to bf16 by the matmul,
//! scaled, masked and softmaxed in f32, probabilities rounded to bf16 for the product with V. The softmax between
//! the two products is one fused kernel each way where the CPU has AVX-512 or AVX2
//! ([`train_ops::attention_softmax`]; on `bench_train --dtype bf16` at 8 × 164 tokens it took the iteration from
//! 1.42 to 1.36 s on an AVX-512 CPU); its backward works from the rounded probabilities, which the product with V
//! saves anyway.

use tch::{Device, Kind, Tensor};

use crate::error::Result;
use crate::train_ops;

/// The most keys the matmul path takes (see the module docs). At this length its saved probabilities, 2 bytes per
/// (head, query, key) with the fused softmax and 6 without, stay below a layer's other saved activations for the
/// model shapes trinity runs (SmolLM2 and Qwen2.5 0.5B–7B: ~10 KiB against 24–220 KiB per token).
pub(crate) const SHORT_KEYS: i64 = 192;

/// Attention of q `[B, H, Tq, D]` over k, v `[B, KVH, Tk, D]` (H a multiple of KVH, query head `h` reading kv head
/// `h / (H / KVH)`), returning `[B, H, Tq, D]`. `allowed` is a bool mask broadcastable to `[B, 1, Tq, Tk]`, true
/// where a query may attend; without one, attention is causal (query `i` sees keys `0..=i`, Tq = Tk).
pub(crate) fn attend(q: &Tensor, k: &Tensor, v: &Tensor, allowed: Option<&Tensor>) -> Result<Tensor> {
    let keys = k.size()[2];
    // A recomputed layer's first run counts as training, so that it and its recomputation take the same path.
    let trains = [q, k, v].into_iter().any(crate::checkpoint::recording);
    if trains && q.kind() == Kind::BFloat16 && keys <= SHORT_KEYS {
        return spelled_out(q, k, v, allowed);
    }
    Ok(match allowed {
        None => Tensor::f_scaled_dot_product_attention::<Tensor>(q, k, v, None, 0.0, true, None, true)?,
        Some(m) => Tensor::f_scaled_dot_product_attention(q, k, v, Some(m), 0.0, false, None, true)?,
    })
}

/// `[T(q), T(k)]` bool, true where `k <= q`.
pub(crate) fn causal(t: i64, device: Device) -> Result<Tensor> {
    let ar = Tensor::f_arange(t, (Kind::Int64, device))?;
    Ok(ar.f_unsqueeze(0)?.f_le_tensor(&ar.f_unsqueeze(1)?)?)
}

/// The matmul path. The query heads that share a kv head are stacked along the query axis (`[B, KVH, G·Tq, D]`),
/// so each kv head's keys and values are read once, in place, by one batched matmul; the softmax over the stacked
/// rows takes the scale and the mask ([`train_ops::attention_softmax`]).
fn spelled_out(q: &Tensor, k: &Tensor, v: &Tensor, allowed: Option<&Tensor>) -> Result<Tensor> {
    let [b, heads, tq, d] = q.size()[..] else { unreachable!("q is 4-D") };
    let kv_heads = k.size()[1];
    let stacked = q.f_reshape([b, kv_heads, heads / kv_heads * tq, d])?;
    let scores = stacked.f_matmul(&k.f_transpose(-1, -2)?)?;
    let probs = train_ops::attention_softmax(&scores, allowed, tq, 1.0 / (d as f64).sqrt())?;
    Ok(probs.f_matmul(v)?.f_view([b, heads, tq, d])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values and gradients of the matmul path against libtorch's kernel in f32 on the same bf16 inputs, for a
    /// causal call and a padded (masked) one, GQA 3:1.
    #[test]
    fn matmul_path_matches_flash_in_values_and_gradients() {
        tch::manual_seed(7);
        let (b, heads, kv_heads, t, d) = (3, 6, 2, 37, 16);
        let inputs = || {
            let make = |h: i64| (Tensor::randn([b, h, t, d], (Kind::Float, Device::Cpu))).to_kind(Kind::BFloat16);
            (make(heads), make(kv_heads), make(kv_heads))
        };
        let (q0, k0, v0) = inputs();
        let upstream = Tensor::randn([b, heads, t, d], (Kind::Float, Device::Cpu));
        // Row 1 left-padded by 5, row 2 right-padded by 9 (keys only: a padded query's output is unused).
        let valid = Tensor::ones([b, t], (Kind::Bool, Device::Cpu));
        let _ = valid.get(1).narrow(0, 0, 5).fill_(0);
        let _ = valid.get(2).narrow(0, t - 9, 9).fill_(0);
        let causal = causal(t, Device::Cpu).unwrap().view([1, 1, t, t]);
        let padded =
            causal.logical_and(&valid.view([b, 1, 1, t])).logical_or(&Tensor::eye(t, (Kind::Bool, Device::Cpu)));
        for mask in [None, Some(&padded)] {
            let run = |kind: Kind, matmul: bool| {
                let leaf = |x: &Tensor| x.detach().to_kind(kind).set_requires_grad(true);
                let (q, k, v) = (leaf(&q0), leaf(&k0), leaf(&v0));
                let out = if matmul {
                    spelled_out(&q, &k, &v, mask).unwrap()
                } else {
                    let k2 = k.repeat_interleave_self_int(heads / kv_heads, 1, None);
                    let v2 = v.repeat_interleave_self_int(heads / kv_heads, 1, None);
                    match mask {
                        None => {
                            Tensor::scaled_dot_product_attention::<Tensor>(&q, &k2, &v2, None, 0.0, true, None, false)
                        }
                        Some(m) => Tensor::scaled_dot_product_attention(&q, &k2, &v2, Some(m), 0.0, false, None, false),
                    }
                };
                (out.to_kind(Kind::Float) * &upstream).sum(Kind::Float).backward();
                [out, q.grad(), k.grad(), v.grad()].map(|t| t.to_kind(Kind::Float))
            };
            let reference = run(Kind::Float, false);
            let ours = run(Kind::BFloat16, true);
            for (name, (r, o)) in ["out", "dq", "dk", "dv"].iter().zip(reference.iter().zip(ours.iter())) {
                let scale = r.abs().max().double_value(&[]);
                let err = (r - o).abs().max().double_value(&[]);
                assert!(err <= 0.05 * scale, "{name} (mask {}): max error {err} at scale {scale}", mask.is_some());
            }
        }
    }

    /// [`attend`] on each of its paths (no gradients, short keys with gradients, long keys with gradients) gives
    /// libtorch's kernel's values.
    #[test]
    fn both_paths_give_the_same_values() {
        let make = |t: i64, grad: bool| {
            Tensor::randn([1, 2, t, 8], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16).set_requires_grad(grad)
        };
        for (t, grad) in [(8, false), (8, true), (SHORT_KEYS + 1, true)] {
            let (q, k, v) = (make(t, grad), make(t, grad), make(t, grad));
            let ours = attend(&q, &k, &v, None).unwrap().to_kind(Kind::Float);
            let flash = Tensor::scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, 0.0, true, None, false)
                .to_kind(Kind::Float);
            let err = (&ours - &flash).abs().max().double_value(&[]);
            assert!(err < 0.05, "t {t}, grad {grad}: {err}");
        }
    }
}
