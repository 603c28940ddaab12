//! The sparse mixture-of-experts MLP of Qwen3-MoE ([`crate::MoeConfig`]), the routing it chose, routing replay,
//! and the load-balancing loss of its router logits.
//!
//! Each token's hidden state goes through a router (`[experts, hidden]`, no bias); the softmax of the router
//! logits, in fp32, ranks the experts, the top `k` run, and their SwiGLU outputs are summed weighted by their
//! probabilities (renormalised over the `k` when `norm_topk_prob`), as transformers' `Qwen3MoeSparseMoeBlock`
//! computes. Tokens are grouped by expert (one stable sort of the `tokens·k` choices) so that each expert runs
//! one matmul over exactly the tokens routed to it, and one `index_add` scatters the weighted outputs back; a
//! dense all-experts product would cost `experts / k` times the work.
//!
//! Routing replay (veRL's router replay, which Trinity-RFT's `enable_router_replay` turns on): a caller may give
//! the experts each token must use, as a generation engine chose them, so that a trainer whose own router would
//! pick others still computes with the rollout's experts. The weights then are the trainer's router
//! probabilities at those experts (renormalised the same way), so the router keeps getting gradients.

use tch::{Kind, Tensor};

use crate::decoder::Linear;
use crate::error::{ModelError, Result};
use crate::train_ops;

/// The experts a mixture-of-experts model routed a sequence's tokens to, as the generation engine records them
/// and the trainer replays them: Trinity-RFT's `routed_experts`, `[tokens, layers, top_k]` row-major, one row for
/// every token a forward pass read (the prompt, then every generated token but the last: `prompt + generated −
/// 1` rows), the `top_k` experts of each of the model's sparse layers ([`crate::Decoder::sparse_layers`]) best
/// first. The buffer stores the same ids in its own compact form (`trinity_buffer::RoutedExperts`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RoutedExperts {
    /// Sparse layers a token row covers.
    pub layers: usize,
    /// Experts a token is routed to in each layer.
    pub top_k: usize,
    /// The expert ids, `tokens × layers × top_k` of them.
    pub ids: Vec<u16>,
}

impl RoutedExperts {
    /// Token rows held.
    pub fn tokens(&self) -> usize {
        self.ids.len() / (self.layers * self.top_k).max(1)
    }
}

/// One expert: a SwiGLU MLP of width `moe_intermediate_size`.
#[derive(Debug)]
pub(crate) struct Expert {
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

impl Expert {
    fn share(&self) -> Expert {
        Expert { gate: self.gate.share(), up: self.up.share(), down: self.down.share() }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.down.forward(&train_ops::swiglu(&self.gate.forward(x)?, &self.up.forward(x)?)?)
    }
}

/// A layer's router and experts.
#[derive(Debug)]
pub(crate) struct SparseMlp {
    /// `[experts, hidden]` (HF `mlp.gate.weight`).
    pub(crate) router: Tensor,
    pub(crate) experts: Vec<Expert>,
    pub(crate) top_k: i64,
    pub(crate) norm_topk_prob: bool,
}

/// What a sparse layer computed and decided for its `N` tokens.
#[derive(Debug)]
pub(crate) struct Routed {
    /// The MLP output, shaped as the input.
    pub(crate) out: Tensor,
    /// `[N, k]` int64: the experts each token used, best first (in the given order when replayed).
    pub(crate) experts: Tensor,
    /// `[N, experts]`: the router logits in the model's dtype, for the load-balancing loss.
    pub(crate) logits: Tensor,
}

impl SparseMlp {
    /// A copy sharing the tensors, for a recomputed layer to own.
    pub(crate) fn share(&self) -> SparseMlp {
        SparseMlp {
            router: self.router.shallow_clone(),
            experts: self.experts.iter().map(Expert::share).collect(),
            top_k: self.top_k,
            norm_topk_prob: self.norm_topk_prob,
        }
    }

    /// Runs the MLP over `h` `[..., hidden]`; `replay` `[N, k]` (N the number of tokens in `h`), when given, is
    /// the experts every token must use.
    pub(crate) fn forward(&self, h: &Tensor, replay: Option<&Tensor>) -> Result<Routed> {
        let size = h.size();
        let hidden = size.last().copied().unwrap_or(0);
        let x = h.f_reshape([-1, hidden])?;
        let n = x.size()[0];
        let logits = x.f_linear::<Tensor>(&self.router, None)?;
        let probs = logits.f_softmax(-1, Kind::Float)?;
        let (weights, experts) = match replay {
            None => probs.f_topk(self.top_k, -1, true, true)?,
            Some(forced) => {
                let forced = self.check_replay(forced, n, x.device())?;
                (probs.f_gather(-1, &forced, false)?, forced)
            }
        };
        let weights = if self.norm_topk_prob {
            weights.f_div(&weights.f_sum_dim_intlist(-1, true, Kind::Float)?)?
        } else {
            weights
        };
        let out = self.run_experts(&x, &experts, &weights.f_to_kind(x.kind())?)?;
        Ok(Routed { out: out.f_reshape(&size)?, experts, logits })
    }

    /// Replayed experts as int64 on `device`, checked: `[n, k]`, every id below the number of experts.
    fn check_replay(&self, forced: &Tensor, n: i64, device: tch::Device) -> Result<Tensor> {
        let want = [n, self.top_k];
        if forced.size() != want {
            return Err(ModelError::InvalidInput(format!(
                "replayed experts of shape {:?} for {n} tokens routed to {} experts each (want {want:?})",
                forced.size(),
                self.top_k
            )));
        }
        let forced = forced.f_to_kind(Kind::Int64)?.f_to_device(device)?;
        if n > 0 {
            let (lo, hi) = (forced.f_min()?.int64_value(&[]), forced.f_max()?.int64_value(&[]));
            let experts = self.experts.len() as i64;
            if lo < 0 || hi >= experts {
                return Err(ModelError::InvalidInput(format!(
                    "replayed expert ids run from {lo} to {hi}; this model's layers have experts 0..{experts}"
                )));
            }
        }
        Ok(forced)
    }

    /// `Σ_j weights[t, j] · expert[experts[t, j]](x[t])` for every token `t` of `x` `[N, hidden]`.
    fn run_experts(&self, x: &Tensor, experts: &Tensor, weights: &Tensor) -> Result<Tensor> {
        let flat = experts.f_reshape([-1])?;
        // Stable, so that each expert's tokens keep their order and every token's outputs are added in the
        // order of its experts' ids, as transformers' loop over the experts adds them.
        let order = flat.f_argsort_stable(true, 0, false)?;
        let token = order.f_floor_divide_scalar(self.top_k)?;
        let counts = flat.f_bincount(None::<Tensor>, self.experts.len() as i64)?;
        let counts = Vec::<i64>::try_from(&counts)?;
        let grouped = x.f_index_select(0, &token)?;
        let mut parts = Vec::new();
        let mut start = 0;
        for (expert, &count) in self.experts.iter().zip(&counts) {
            if count > 0 {
                parts.push(expert.forward(&grouped.f_narrow(0, start, count)?)?);
                start += count;
            }
        }
        if parts.is_empty() {
            return Ok(x.f_zeros_like()?);
        }
        let w = weights.f_reshape([-1])?.f_index_select(0, &order)?.f_unsqueeze(1)?;
        let y = Tensor::f_cat(&parts, 0)?.f_mul(&w)?;
        Ok(x.f_zeros_like()?.f_index_add(0, &token, &y)?)
    }
}

/// The load-balancing loss of transformers' `load_balancing_loss_func` (Switch Transformer, eqs. 4-6) over the
/// router logits of every sparse layer (`[B·T, experts]` each, the `router_logits` of
/// [`crate::Decoder::forward_hidden_routed`]): `experts · Σ_e f_e · P_e`, where `f_e` is the fraction of top-`k`
/// choices, and `P_e` the mean router probability, of expert `e` over the real tokens (`attention_mask` `[B, T]`,
/// nonzero at real tokens; all tokens without it) of all layers. A trainer adds `router_aux_loss_coef` times it to
/// its loss. Differentiable through `P_e`; zero for no layers. fp32 scalar.
pub fn load_balancing_loss(
    router_logits: &[Tensor],
    num_experts: i64,
    top_k: i64,
    attention_mask: Option<&Tensor>,
) -> Result<Tensor> {
    let Some(first) = router_logits.first() else {
        return Ok(Tensor::f_zeros([], (Kind::Float, tch::Device::Cpu))?);
    };
    let device = first.device();
    let opts = (Kind::Float, device);
    let rows = first.size()[0];
    let mask = match attention_mask {
        Some(m) => m.f_reshape([-1])?.f_to_device(device)?.f_ne(0)?.f_to_kind(Kind::Float)?,
        None => Tensor::f_ones([rows], opts)?,
    };
    if mask.size()[0] != rows {
        return Err(ModelError::InvalidInput(format!(
            "an attention mask of {} tokens for router logits of {rows}",
            mask.size()[0]
        )));
    }
    let choice_mask = mask.f_unsqueeze(1)?.f_expand([rows, top_k], false)?.f_reshape([-1])?;
    let mut chosen = Tensor::f_zeros([num_experts], opts)?;
    let mut prob_sum = Tensor::f_zeros([num_experts], opts)?;
    let mut total = Tensor::f_zeros([], opts)?;
    for logits in router_logits {
        if logits.size() != [rows, num_experts] {
            return Err(ModelError::InvalidInput(format!(
                "router logits of shape {:?} among layers of [{rows}, {num_experts}]",
                logits.size()
            )));
        }
        let probs = logits.f_softmax(-1, Kind::Float)?;
        let (_, picked) = probs.f_topk(top_k, -1, true, true)?;
        let picks = Tensor::f_zeros([num_experts], opts)?.f_scatter_add(0, &picked.f_reshape([-1])?, &choice_mask)?;
        chosen = chosen.f_add(&picks)?;
        prob_sum = prob_sum.f_add(&probs.f_mul(&mask.f_unsqueeze(1)?)?.f_sum_dim_intlist(0, false, Kind::Float)?)?;
        total = total.f_add(&mask.f_sum(Kind::Float)?)?;
    }
    let per_expert = chosen.f_div(&total)?.f_mul(&prob_sum.f_div(&total)?)?;
    Ok(per_expert.f_sum(Kind::Float)?.f_mul_scalar(num_experts)?)
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::*;

    fn linear(out: i64, inp: i64) -> Linear {
        Linear { weight: Tensor::randn([out, inp], (Kind::Float, Device::Cpu)) * 0.3, bias: None, lora: None }
    }

    fn mlp(experts: i64, top_k: i64, norm: bool) -> SparseMlp {
        tch::manual_seed(5);
        SparseMlp {
            router: Tensor::randn([experts, 6], (Kind::Float, Device::Cpu)),
            experts: (0..experts)
                .map(|_| Expert { gate: linear(4, 6), up: linear(4, 6), down: linear(6, 4) })
                .collect(),
            top_k,
            norm_topk_prob: norm,
        }
    }

    /// Every expert on every token, masked to the chosen ones: the dense reference the grouping must equal.
    fn dense_reference(m: &SparseMlp, x: &Tensor, experts: &Tensor, weights: &Tensor) -> Tensor {
        let mut out = x.zeros_like();
        for (e, expert) in m.experts.iter().enumerate() {
            let y = expert.forward(x).unwrap();
            let w = (weights * experts.eq(e as i64).to_kind(Kind::Float)).sum_dim_intlist(-1, true, Kind::Float);
            out += y * w;
        }
        out
    }

    #[test]
    fn grouped_experts_equal_the_dense_sum_and_weights_renormalise() {
        for norm in [false, true] {
            let m = mlp(5, 2, norm);
            let x = Tensor::randn([3, 4, 6], (Kind::Float, Device::Cpu));
            let routed = m.forward(&x, None).unwrap();
            let flat = x.reshape([12, 6]);
            let probs = flat.linear::<Tensor>(&m.router, None).softmax(-1, Kind::Float);
            let (mut w, idx) = probs.topk(2, -1, true, true);
            assert!(routed.experts.equal(&idx));
            if norm {
                w = &w / w.sum_dim_intlist(-1, true, Kind::Float);
            }
            let want = dense_reference(&m, &flat, &idx, &w).reshape([3, 4, 6]);
            assert!((routed.out - want).abs().max().double_value(&[]) < 1e-5, "norm {norm}");
        }
    }

    #[test]
    fn replayed_experts_are_used_with_the_routers_probabilities() {
        let m = mlp(4, 2, true);
        let x = Tensor::randn([5, 6], (Kind::Float, Device::Cpu));
        let own = m.forward(&x, None).unwrap();
        // The two experts each token's router ranks last.
        let probs = x.linear::<Tensor>(&m.router, None).softmax(-1, Kind::Float);
        let (_, worst) = probs.topk(2, -1, false, true);
        let replayed = m.forward(&x, Some(&worst)).unwrap();
        assert!(replayed.experts.equal(&worst));
        let w = probs.gather(-1, &worst, false);
        let w = &w / w.sum_dim_intlist(-1, true, Kind::Float);
        let want = dense_reference(&m, &x, &worst, &w);
        assert!((&replayed.out - want).abs().max().double_value(&[]) < 1e-5);
        assert!((&replayed.out - &own.out).abs().max().double_value(&[]) > 1e-3, "other experts, other output");
        let bad = Tensor::from_slice(&[0i64, 4]).view([1, 2]).expand([5, 2], false);
        assert!(m.forward(&x, Some(&bad)).unwrap_err().to_string().contains("experts 0..4"));
        assert!(m.forward(&x, Some(&worst.narrow(0, 0, 4))).is_err());
    }

    #[test]
    fn balanced_routing_has_loss_k_and_padding_is_left_out() {
        // Uniform router probabilities: P_e = 1/E, and the choices' fractions sum to k, so the loss is k.
        let logits = Tensor::zeros([6, 4], (Kind::Float, Device::Cpu));
        let loss = load_balancing_loss(&[logits.shallow_clone(), logits], 4, 2, None).unwrap();
        assert!((loss.double_value(&[]) - 2.0).abs() < 1e-6);
        // Expert 0 takes all the probability and is in every token's top k: f_0 = 1 and P_0 = 1 (P_e = 0 for the
        // rest), so the loss is E · 1 · 1 = E.
        let sharp = Tensor::full([3, 4], -30.0, (Kind::Float, Device::Cpu));
        let _ = sharp.narrow(1, 0, 1).fill_(30.0);
        let loss = load_balancing_loss(&[sharp.shallow_clone()], 4, 2, None).unwrap();
        assert!((loss.double_value(&[]) - 4.0).abs() < 1e-4, "{}", loss.double_value(&[]));
        // Padding rows do not count: a padded copy with garbage at the padding gives the same loss.
        let padded = Tensor::cat(&[sharp, Tensor::randn([2, 4], (Kind::Float, Device::Cpu))], 0);
        let mask = Tensor::from_slice(&[1i64, 1, 1, 0, 0]).view([1, 5]);
        let masked = load_balancing_loss(&[padded], 4, 2, Some(&mask)).unwrap();
        assert!((masked.double_value(&[]) - 4.0).abs() < 1e-4);
        assert_eq!(load_balancing_loss(&[], 4, 2, None).unwrap().double_value(&[]), 0.0);
    }
}
