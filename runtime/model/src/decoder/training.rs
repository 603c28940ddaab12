//! The full-sequence forwards that training and scoring run ([`Decoder::forward_hidden`] and its shared-prompt
//! form), each layer kept for autograd or recomputed in the backward ([`Decoder::set_recompute_activations`]).

use std::sync::{Arc, Mutex};

use tch::{Kind, Tensor};

use super::{Decoder, Dims, merge_heads, routing_layout};
use crate::attention::{self, causal};
use crate::checkpoint;
use crate::error::{ModelError, Result};
use crate::layer_hook;
use crate::rope;

impl Decoder {
    /// Recompute each layer's activations in the backward instead of keeping them from the forward (veRL's
    /// `enable_gradient_checkpointing`): a differentiable forward then keeps one `[tokens, hidden]` tensor a layer
    /// (the layer's input) where it kept about `8·hidden + 3·intermediate` values a token and layer, for one more
    /// forward of the layers in the backward. The gradients are the same. Errors when this build cannot recompute
    /// ([`checkpoint::AVAILABLE`]).
    pub fn set_recompute_activations(&mut self, on: bool) -> Result<()> {
        if on && !checkpoint::AVAILABLE {
            return Err(ModelError::InvalidInput(checkpoint::UNAVAILABLE.into()));
        }
        self.recompute = on;
        Ok(())
    }

    /// Whether [`Decoder::set_recompute_activations`] is on.
    pub fn recomputes_activations(&self) -> bool {
        self.recompute
    }

    /// The input of the first layer, and whether the layers are recomputed in this forward: only when asked and
    /// autograd records. A recomputed layer hands gradients only through an input that requires one, so an
    /// embedding output that does not (a frozen embedding, as under LoRA) becomes a leaf that does.
    pub(super) fn first_layer_input(&self, embedded: Tensor) -> Result<(Tensor, bool)> {
        if !(self.recompute && checkpoint::grad_mode_enabled()) {
            return Ok((embedded, false));
        }
        if embedded.requires_grad() {
            return Ok((embedded, true));
        }
        Ok((embedded.f_detach()?.set_requires_grad(true), true))
    }

    /// Full-sequence forward for training and scoring: final-normed hidden states `[B, T, hidden]`.
    ///
    /// `input_ids`: `[B, T]` int64. `attention_mask`: `[B, T]`, nonzero for real tokens; padding may be on either
    /// side. Positions count real tokens only (a left-padded row starts at position 0 at its first real token),
    /// as transformers does when given a mask. Outputs at padding positions are finite but meaningless.
    /// Differentiable when called with gradients enabled.
    pub fn forward_hidden(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        Ok(self.forward_hidden_routed(input_ids, attention_mask, None, false)?.hidden)
    }

    /// [`Decoder::forward_hidden`] of a mixture-of-experts model, with its routing: the experts every token was
    /// routed to (`[B, T, L, k]` int64 over the `L` [`Decoder::sparse_layers`]; `[B, T, 0, 0]` for a dense model)
    /// and, when `router_logits` is asked for, each sparse layer's router logits `[B·T, experts]` (differentiable,
    /// for [`crate::load_balancing_loss`]).
    ///
    /// `replay` `[B, T, L, k]` (any integer kind) routes each token to the given experts instead of its router's
    /// top k (routing replay: a trainer computing with the experts its rollout chose); the weights are still this
    /// model's router probabilities at those experts, so gradients reach the router. Positions at padding may
    /// hold any valid expert id.
    ///
    /// Router logits cannot be had with activation recompute on ([`Decoder::set_recompute_activations`]): a
    /// recomputed layer hands the backward one output, its hidden states.
    pub fn forward_hidden_routed(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        replay: Option<&Tensor>,
        router_logits: bool,
    ) -> Result<RoutedHidden> {
        let size = input_ids.size();
        let [b, t] = size[..] else {
            return Err(ModelError::InvalidInput(format!("input_ids must be [B, T], got {size:?}")));
        };
        let sparse = self.sparse_layers();
        let replay = match replay {
            None => None,
            Some(r) => {
                let k = self.config.moe.as_ref().map_or(0, |m| m.num_experts_per_tok);
                let want = [b, t, sparse.len() as i64, k];
                if sparse.is_empty() || r.size() != want {
                    return Err(ModelError::InvalidInput(format!(
                        "replayed experts of shape {:?}; this model wants {want:?} ([B, T, sparse layers, top k])",
                        r.size()
                    )));
                }
                Some(r.f_to_device(self.device())?)
            }
        };
        let device = self.device();
        let input_ids = input_ids.f_to_device(device)?;
        let (positions, mask) = match attention_mask {
            None => (Tensor::f_arange(t, (Kind::Int64, device))?.f_unsqueeze(0)?.f_expand([b, t], false)?, None),
            Some(m) => {
                let (pos, mask) = padded_positions_and_mask(&m.f_to_device(device)?.f_ne(0)?)?;
                (pos, Some(mask))
            }
        };
        let (cos, sin) = rope::cos_sin(&self.inv_freq, &positions, self.kind)?;
        let (x, recompute) = self.first_layer_input(self.embed(&input_ids)?)?;
        if recompute && router_logits && !sparse.is_empty() {
            return Err(ModelError::InvalidInput(
                "router logits (the load-balancing loss) need activation recompute off".into(),
            ));
        }
        let (hidden, experts, router_logits) =
            self.run_layers(x, recompute, &cos, &sin, mask.as_ref(), replay.as_ref(), router_logits)?;
        Ok(RoutedHidden { hidden, experts: routing_layout(experts, b, t)?, router_logits })
    }

    /// The layers and the final norm over `x` `[B, T, hidden]`, the one layer loop of the full-sequence forwards
    /// ([`Decoder::forward_hidden_routed`] and the embeddings' forward of [`crate::vision`]): rotated by
    /// `cos`/`sin` `[B, T, head_dim]`, attending under `mask` (`[B, 1, T, T]`; causal without one), each layer
    /// inside the thread's [`layer_hook`] and, when `recompute`, recomputed in the backward. `replay`
    /// `[B, T, L, k]` forces the sparse layers' experts. Returns the final-normed hidden states, each sparse
    /// layer's experts `[B·T, k]` and, when `router_logits`, its router logits.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_layers(
        &self,
        mut x: Tensor,
        recompute: bool,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        replay: Option<&Tensor>,
        router_logits: bool,
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)> {
        let rows = x.size()[..2].iter().product::<i64>();
        let sparse = self.sparse_layers();
        let dims = self.dims();
        let hook = layer_hook::current();
        let (mut experts, mut logits) = (Vec::new(), Vec::new());
        for (index, layer) in self.layers.iter().enumerate() {
            let (layer, cos, sin) = (layer.share(), cos.shallow_clone(), sin.shallow_clone());
            let mask = mask.map(Tensor::shallow_clone);
            let layer_replay = match (replay, sparse.iter().position(|&s| s == index)) {
                (Some(r), Some(l)) => Some(r.f_select(2, l as i64)?.f_reshape([rows, -1])?),
                _ => None,
            };
            // A recomputed layer runs twice; both runs route alike, and the last one's decisions are kept.
            let decided = Arc::new(Mutex::new(None));
            let record = Arc::clone(&decided);
            let run = move |x: &Tensor| -> Result<Tensor> {
                let h = dims.rms_norm(x, &layer.input_norm)?;
                let (q, k, v) = dims.qkv(&layer, None, &h, &cos, &sin)?;
                let heads_first = |t: Tensor| t.f_transpose(1, 2);
                let attn = attention::attend(&heads_first(q)?, &heads_first(k)?, &heads_first(v)?, mask.as_ref())?;
                let (out, routed) =
                    dims.finish_layer(&layer, None, x.shallow_clone(), &merge_heads(&attn)?, layer_replay.as_ref())?;
                if let (Some(routed), Ok(mut slot)) = (routed, record.lock()) {
                    *slot = Some((routed.experts, routed.logits));
                }
                Ok(out)
            };
            x = run_layer(recompute, &x, layer_hook::hooked(hook.clone(), index, recompute, run))?;
            if let Some((e, l)) = decided.lock().ok().and_then(|mut slot| slot.take()) {
                experts.push(e);
                if router_logits {
                    logits.push(l);
                }
            }
        }
        Ok((self.rms_norm(&x, &self.norm)?, experts, logits))
    }

    /// [`Decoder::forward_hidden`] for rows that share prompts, running each distinct prompt once: GRPO trains on
    /// `repeat_times` responses per prompt, and recomputing (and backpropagating through) the same prompt for
    /// every one of them is work proportional to `repeat_times × prompt length` that gives the same numbers.
    ///
    /// - `prompts`: `[G, P]` int64, the distinct prompts, left-padded; `prompt_mask` `[G, P]`, nonzero for real
    ///   tokens.
    /// - `groups[n]`: the prompt of response row `n`; `responses` `[N, R]` int64, right-padded with any id;
    ///   `response_lens[n]` its real tokens (1..=R).
    ///
    /// Returns the final-normed hidden states of the prompts `[G, P, hidden]` and of the responses
    /// `[N, R, hidden]`, equal (to float rounding) to `forward_hidden` of each full row `prompt ++ response`:
    /// response position `j` of row `n` is at position `len(prompt) + j`, sees its prompt's real tokens and its
    /// own first `j + 1` tokens. Outputs at padding positions are zeros. The real prompt and response tokens —
    /// padding left out, as veRL's `use_remove_padding` does — run through every projection and MLP as one flat
    /// batch; only attention is split, in the padded layout, with each response's keys and values being its
    /// prompt's (gathered, so gradients from all of a prompt's responses add up in it) followed by its own.
    /// Differentiable.
    pub fn forward_hidden_shared_prompts(
        &self,
        prompts: &Tensor,
        prompt_mask: &Tensor,
        groups: &[i64],
        responses: &Tensor,
        response_lens: &[i64],
    ) -> Result<(Tensor, Tensor)> {
        let (ps, rs) = (prompts.size(), responses.size());
        let (&[g, p], &[n, r]) = (&ps[..], &rs[..]) else {
            return Err(ModelError::InvalidInput(format!("prompts {ps:?} and responses {rs:?} must be 2-D")));
        };
        if prompt_mask.size() != ps
            || groups.len() as i64 != n
            || groups.iter().any(|&i| i < 0 || i >= g)
            || response_lens.len() as i64 != n
            || response_lens.iter().any(|&l| l < 1 || l > r)
        {
            return Err(ModelError::InvalidInput(format!(
                "prompt mask {:?} for prompts {ps:?}; {} group ids in 0..{g} and {} lengths in 1..={r} for {n} \
                 responses",
                prompt_mask.size(),
                groups.len(),
                response_lens.len()
            )));
        }
        let device = self.device();
        let (tp, tr) = (g * p, n * r);
        let group = Tensor::from_slice(groups).f_to_device(device)?;
        let valid = prompt_mask.f_to_device(device)?.f_ne(0)?;
        let (prompt_pos, prompt_attn_mask) = padded_positions_and_mask(&valid)?;
        let prompt_len = valid.f_sum_dim_intlist(1, false, Kind::Int64)?;
        let response_pos = prompt_len.f_index_select(0, &group)?.f_unsqueeze(1)?
            + Tensor::f_arange(r, (Kind::Int64, device))?.f_unsqueeze(0)?;
        let positions = Tensor::f_cat(&[prompt_pos.f_reshape([tp])?, response_pos.f_reshape([tr])?], 0)?;
        // The real tokens of the flat layout (prompts, then responses): only they run through the projections.
        let lens = Tensor::from_slice(response_lens).f_to_device(device)?;
        let response_valid =
            Tensor::f_arange(r, (Kind::Int64, device))?.f_unsqueeze(0)?.f_lt_tensor(&lens.f_unsqueeze(1)?)?;
        let real = Tensor::f_cat(&[valid.f_reshape([tp])?, response_valid.f_reshape([tr])?], 0)?
            .f_nonzero()?
            .f_squeeze_dim(1)?;
        let positions = positions.f_index_select(0, &real)?;
        let (cos, sin) = rope::cos_sin(&self.inv_freq, &positions.f_unsqueeze(0)?, self.kind)?;
        // Response attention: the prompt's real keys, then its own keys causally.
        let own = causal(r, device)?.f_view([1, 1, r, r])?.f_expand([n, 1, r, r], false)?;
        let seen = valid.f_index_select(0, &group)?.f_view([n, 1, 1, p])?.f_expand([n, 1, r, p], false)?;
        let response_attn_mask = Tensor::f_cat(&[seen, own], 3)?;
        let layout = SharedLayout {
            real,
            group,
            prompt_mask: prompt_attn_mask,
            response_mask: response_attn_mask,
            sizes: [g, p, n, r],
            dims: self.dims(),
        };

        let ids = Tensor::f_cat(&[prompts.f_reshape([tp])?, responses.f_reshape([tr])?], 0)?.f_to_device(device)?;
        let (mut x, recompute) =
            self.first_layer_input(self.embed(&ids.f_index_select(0, &layout.real)?.f_unsqueeze(0)?)?)?;
        let hook = layer_hook::current();
        for (index, layer) in self.layers.iter().enumerate() {
            let (layer, cos, sin, layout) = (layer.share(), cos.shallow_clone(), sin.shallow_clone(), layout.share());
            let run = move |x: &Tensor| -> Result<Tensor> {
                let dims = layout.dims;
                let h = dims.rms_norm(x, &layer.input_norm)?;
                let (q, k, v) = dims.qkv(&layer, None, &h, &cos, &sin)?;
                Ok(dims.finish_layer(&layer, None, x.shallow_clone(), &layout.attend(&q, &k, &v)?, None)?.0)
            };
            x = run_layer(recompute, &x, layer_hook::hooked(hook.clone(), index, recompute, run))?;
        }
        let x = self.rms_norm(&x, &self.norm)?.f_squeeze_dim(0)?;
        let hidden = self.config.hidden_size;
        let x = Tensor::f_zeros([tp + tr, hidden], (x.kind(), device))?.f_index_copy(0, &layout.real, &x)?;
        Ok((x.f_narrow(0, 0, tp)?.f_reshape([g, p, hidden])?, x.f_narrow(0, tp, tr)?.f_reshape([n, r, hidden])?))
    }
}

/// What [`Decoder::forward_hidden_routed`] returns.
#[derive(Debug)]
pub struct RoutedHidden {
    /// Final-normed hidden states `[B, T, hidden]`, as [`Decoder::forward_hidden`] gives them.
    pub hidden: Tensor,
    /// `[B, T, L, k]` int64: the experts of every token in each sparse layer (the replayed ones when replaying).
    pub experts: Tensor,
    /// Each sparse layer's router logits `[B·T, experts]`, when asked for; empty otherwise.
    pub router_logits: Vec<Tensor>,
}

/// `run(x)`: kept for autograd, or recomputed in the backward ([`checkpoint::segment`]).
fn run_layer(recompute: bool, x: &Tensor, run: impl Fn(&Tensor) -> Result<Tensor> + Send + 'static) -> Result<Tensor> {
    if recompute { checkpoint::segment(x, Box::new(run)) } else { run(x) }
}

/// For rows `valid` `[B, T]` (true at real tokens, padding anywhere): positions counting real tokens only and
/// the `[B, 1, T, T]` attention mask, causal over real keys. A query always sees itself, so rows of padding
/// never go fully masked (NaN in softmax).
fn padded_positions_and_mask(valid: &Tensor) -> Result<(Tensor, Tensor)> {
    let positions = (valid.f_to_kind(Kind::Int64)?.f_cumsum(1, Kind::Int64)? - 1).f_clamp_min(0)?;
    Ok((positions, padded_mask(valid)?))
}

/// [`padded_positions_and_mask`]'s mask alone, for a forward given its positions.
pub(super) fn padded_mask(valid: &Tensor) -> Result<Tensor> {
    let size = valid.size();
    let (b, t) = (size[0], size[1]);
    Ok(causal(t, valid.device())?
        .f_view([1, 1, t, t])?
        .f_logical_and(&valid.f_view([b, 1, 1, t])?)?
        .f_logical_or(&Tensor::f_eye(t, (Kind::Bool, valid.device()))?)?)
}

/// Where the real tokens of [`Decoder::forward_hidden_shared_prompts`]'s flat layout sit in the padded prompt
/// and response blocks its attention runs in, and those blocks' masks.
struct SharedLayout {
    /// Positions of the real tokens in the flat `[G·P + N·R]` layout.
    real: Tensor,
    /// `[N]`: each response's prompt.
    group: Tensor,
    /// `[G, 1, P, P]`.
    prompt_mask: Tensor,
    /// `[N, 1, R, P + R]`.
    response_mask: Tensor,
    /// `[G, P, N, R]`.
    sizes: [i64; 4],
    dims: Dims,
}

impl SharedLayout {
    /// A copy sharing the tensors, for one layer's recomputation to own.
    fn share(&self) -> SharedLayout {
        SharedLayout {
            real: self.real.shallow_clone(),
            group: self.group.shallow_clone(),
            prompt_mask: self.prompt_mask.shallow_clone(),
            response_mask: self.response_mask.shallow_clone(),
            sizes: self.sizes,
            dims: self.dims,
        }
    }

    /// Real tokens `[1, K, h, D]` → the padded prompt part `[G, h, P, D]` and response part `[N, h, R, D]` (zeros
    /// at padding, which no real query attends to).
    fn split(&self, t: &Tensor, h: i64) -> Result<(Tensor, Tensor)> {
        let [g, p, n, r] = self.sizes;
        let (tp, tr, d) = (g * p, n * r, self.dims.head_dim);
        let padded = Tensor::f_zeros([tp + tr, h, d], (t.kind(), t.device()))?.f_index_copy(
            0,
            &self.real,
            &t.f_squeeze_dim(0)?,
        )?;
        Ok((
            padded.f_narrow(0, 0, tp)?.f_reshape([g, p, h, d])?.f_transpose(1, 2)?,
            padded.f_narrow(0, tp, tr)?.f_reshape([n, r, h, d])?.f_transpose(1, 2)?,
        ))
    }

    /// Attention of the real tokens' q `[1, K, H, D]`, k and v `[1, K, KVH, D]`: each prompt over itself, each
    /// response over its prompt's keys and then its own. Returns `[1, K, H·D]`.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let [g, p, n, r] = self.sizes;
        let Dims { heads, kv_heads, head_dim: d, .. } = self.dims;
        let ((qp, qr), (kp, kr), (vp, vr)) =
            (self.split(q, heads)?, self.split(k, kv_heads)?, self.split(v, kv_heads)?);
        let attn_p = attention::attend(&qp, &kp, &vp, Some(&self.prompt_mask))?;
        let keys = Tensor::f_cat(&[kp.f_index_select(0, &self.group)?, kr], 2)?;
        let values = Tensor::f_cat(&[vp.f_index_select(0, &self.group)?, vr], 2)?;
        let attn_r = attention::attend(&qr, &keys, &values, Some(&self.response_mask))?;
        let attn = Tensor::f_cat(
            &[
                attn_p.f_transpose(1, 2)?.f_reshape([g * p, heads * d])?,
                attn_r.f_transpose(1, 2)?.f_reshape([n * r, heads * d])?,
            ],
            0,
        )?;
        Ok(attn.f_index_select(0, &self.real)?.f_unsqueeze(0)?)
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use crate::config::{Family, ModelConfig};
    use crate::decoder::Decoder;
    use crate::lora::LoraSpec;
    use crate::weights::RandomWeights;

    /// A loss over both forwards: padded rows (one left-padded) and two prompts shared by three responses.
    fn loss(m: &Decoder) -> Tensor {
        let ids = Tensor::from_slice(&[0i64, 0, 3, 1, 4, 1, 5, 9, 2, 6, 5, 3]).view([2, 6]);
        let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
        let full = m.forward_hidden(&ids, Some(&mask)).unwrap();
        let prompts = Tensor::from_slice(&[0i64, 2, 7, 1, 8, 2]).view([2, 3]);
        let prompt_mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1]).view([2, 3]);
        let responses = Tensor::from_slice(&[8i64, 2, 8, 4, 0, 0, 5, 9, 0]).view([3, 3]);
        let (hp, hr) =
            m.forward_hidden_shared_prompts(&prompts, &prompt_mask, &[0, 1, 1], &responses, &[3, 1, 2]).unwrap();
        let h = m.config().hidden_size;
        // Fixed weights, so that every output position counts differently.
        let weigh = |t: &Tensor, seed: i64| {
            let w = Tensor::arange(t.numel() as i64, (Kind::Float, Device::Cpu)).view(t.size().as_slice());
            (t.to_kind(Kind::Float) * ((w * 0.37 + seed as f64).sin())).sum(Kind::Float)
        };
        assert_eq!(hp.size()[2], h);
        weigh(&full, 1) + weigh(&hp, 2) + weigh(&hr, 3)
    }

    /// Every gradient the loss gives (parameters, LoRA adapters included), taken and cleared, by name.
    fn grads(m: &Decoder) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = m
            .var_store()
            .variables()
            .into_iter()
            .chain(m.lora_parameters())
            .filter(|(_, v)| v.grad().defined())
            .map(|(name, mut v)| {
                let g = v.grad().copy();
                v.zero_grad();
                (name, g)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.dedup_by(|a, b| a.0 == b.0);
        out
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a.to_kind(Kind::Float) - b.to_kind(Kind::Float)).abs().max().double_value(&[])
    }

    /// Rank-4 adapters on every projection whose B is not zero, so that they change the outputs and gradients.
    fn add_live_adapters(m: &mut Decoder) {
        m.add_lora(&LoraSpec::all_linear(4, 8.0), 3).unwrap();
        tch::no_grad(|| {
            for (name, t) in m.lora_parameters() {
                if name.contains("lora_B") {
                    t.shallow_clone().copy_(&(Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.1));
                }
            }
        });
    }

    fn assert_same_gradients(want: &[(String, Tensor)], got: &[(String, Tensor)], case: &str) {
        for ((name, w), (_, g)) in want.iter().zip(got) {
            let scale = w.abs().max().double_value(&[]).max(1e-6);
            assert!(max_diff(w, g) / scale < 1e-5, "{case}: gradient of {name}");
        }
    }

    /// Kept or recomputed, the layers give the same loss and the same gradients, in every family and dtype (bf16
    /// takes attention's training path, which the recomputed layer's first run must take too), and with LoRA
    /// adapters on a frozen base (whose embedding output needs no gradient, so the recomputed layers need an input
    /// that does). LoRA's dropout, drawn from libtorch's global generator, which this binary's other tests draw
    /// from in parallel, is tested in a process of its own (`tests/recompute_lora_dropout.rs`).
    #[test]
    fn recomputed_layers_give_the_kept_layers_values_and_gradients() {
        let cases = [
            (Family::Llama, Kind::Float, false),
            (Family::Qwen2, Kind::Float, false),
            (Family::Qwen3, Kind::Float, false),
            (Family::Qwen2, Kind::BFloat16, false),
            (Family::Qwen2, Kind::Float, true),
        ];
        for (family, kind, with_lora) in cases {
            tch::manual_seed(0);
            let mut m = Decoder::load(ModelConfig::tiny(family), &mut RandomWeights, kind, Device::Cpu).unwrap();
            if with_lora {
                add_live_adapters(&mut m);
            }
            let layers = m.config().num_hidden_layers as usize;
            let mut run = |recompute: bool| {
                m.set_recompute_activations(recompute).unwrap();
                tch::manual_seed(11);
                let before = crate::checkpoint::recomputed();
                let l = loss(&m);
                l.backward();
                // Each of the loss's two forwards recomputes every layer once, or none.
                let expected = if recompute { 2 * layers } else { 0 };
                assert_eq!(crate::checkpoint::recomputed() - before, expected, "{family:?} recomputations");
                (l.double_value(&[]), grads(&m))
            };
            let (kept_loss, kept) = run(false);
            let (recomputed_loss, recomputed) = run(true);
            let case = format!("{family:?} {kind:?} lora {with_lora}");
            assert_eq!(kept_loss, recomputed_loss, "{case}: the forward's values");
            assert_eq!(
                kept.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                recomputed.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                "{case}: the same tensors get gradients"
            );
            assert!(kept.len() > 10, "{case}: {} gradients", kept.len());
            assert_same_gradients(&kept, &recomputed, &case);
        }
    }

    /// A recomputed layer computes with the adapters as the forward had them, even when they are switched off
    /// before the backward.
    #[test]
    fn recomputation_uses_the_adapters_as_the_forward_had_them() {
        let mut m =
            Decoder::load(ModelConfig::tiny(Family::Qwen2), &mut RandomWeights, Kind::Float, Device::Cpu).unwrap();
        add_live_adapters(&mut m);
        let mut run = |recompute: bool| {
            m.set_recompute_activations(recompute).unwrap();
            let l = loss(&m);
            m.without_lora(|| l.backward());
            grads(&m)
        };
        let (kept, recomputed) = (run(false), run(true));
        assert_eq!(kept.len(), recomputed.len());
        assert_same_gradients(&kept, &recomputed, "adapters switched off for the backward");
    }

    /// Without autograd nothing is recomputed or kept: the plain forward's values.
    #[test]
    fn recomputation_leaves_a_forward_without_autograd_alone() {
        let mut m =
            Decoder::load(ModelConfig::tiny(Family::Qwen2), &mut RandomWeights, Kind::Float, Device::Cpu).unwrap();
        let want = tch::no_grad(|| loss(&m));
        m.set_recompute_activations(true).unwrap();
        let got = tch::no_grad(|| loss(&m));
        assert!(!got.requires_grad());
        assert_eq!(want.double_value(&[]), got.double_value(&[]));
    }
}
