//! The decoder-only transformer (Llama / Qwen2 / Qwen3 / Qwen3-MoE) on libtorch.
//!
//! Parameters live in a [`tch::nn::VarStore`] under their Hugging Face names (`model.layers.0.mlp.up_proj.weight`),
//! all trainable, so a trainer can run autograd and an optimizer over [`Decoder::var_store`], a synchronizer can
//! copy weights by name in place ([`Decoder::copy_weights_from`]), and saving writes HF names directly. With tied
//! embeddings `lm_head` is the embedding tensor itself (one variable).
//!
//! Two forward paths share the layer code:
//! - [`Decoder::forward_hidden`]: whole padded sequences `[B, T]` with a padding mask, differentiable; returns
//!   hidden states so that the caller can compute logits / log-softmax in vocabulary-sized chunks
//!   ([`Decoder::token_logprobs`]).
//! - [`Decoder::forward_with_cache`]: generation. New tokens for several cache slots at once (prefill of several
//!   prompts, or one decode step for many sequences, each at its own position), writing keys/values into a
//!   preallocated [`KvCache`] and attending over each slot's valid prefix. Runs under `no_grad`.
//!
//! Numerics follow transformers: RMSNorm in f32 then cast back, RoPE tables in f32, attention through
//! `scaled_dot_product_attention` (GQA handled by the kernel, no repeated k/v), or for short bf16 sequences under
//! autograd its spelled-out product ([`crate::attention`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::decode_step::{self, DecodeLayer, DecodeShape};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::lora::LoraBranch;
use crate::moe::{Expert, Routed, SparseMlp};
use crate::packed::{self, PackedLinear};
use crate::rope;
use crate::train_ops;
use crate::weight_arena::WeightArena;
use crate::weights::{ParamSpec, WeightSource, param_specs};

mod embeds;
mod training;

pub use training::RoutedHidden;

#[derive(Debug)]
pub(crate) struct Linear {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
    /// A LoRA adapter on this projection ([`crate::lora`]), when one is attached.
    pub(crate) lora: Option<LoraBranch>,
}

impl Linear {
    /// A copy sharing the tensors.
    pub(crate) fn share(&self) -> Linear {
        Linear {
            weight: self.weight.shallow_clone(),
            bias: self.bias.as_ref().map(Tensor::shallow_clone),
            lora: self.lora.as_ref().map(LoraBranch::share),
        }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.f_linear(&self.weight, self.bias.as_ref())?;
        match &self.lora {
            Some(lora) => lora.add_to(y, x),
            None => Ok(y),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Layer {
    input_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_norm: Tensor,
    mlp: Mlp,
}

/// A layer's MLP: one SwiGLU, or a mixture of experts ([`crate::moe`]).
#[derive(Debug)]
enum Mlp {
    Dense { gate: Linear, up: Linear, down: Linear },
    Sparse(SparseMlp),
}

impl Mlp {
    fn share(&self) -> Mlp {
        match self {
            Mlp::Dense { gate, up, down } => Mlp::Dense { gate: gate.share(), up: up.share(), down: down.share() },
            Mlp::Sparse(sparse) => Mlp::Sparse(sparse.share()),
        }
    }
}

impl Layer {
    /// A copy sharing the tensors, for a recomputed layer to own ([`crate::checkpoint`]).
    fn share(&self) -> Layer {
        Layer {
            input_norm: self.input_norm.shallow_clone(),
            q: self.q.share(),
            k: self.k.share(),
            v: self.v.share(),
            o: self.o.share(),
            q_norm: self.q_norm.as_ref().map(Tensor::shallow_clone),
            k_norm: self.k_norm.as_ref().map(Tensor::shallow_clone),
            post_norm: self.post_norm.shallow_clone(),
            mlp: self.mlp.share(),
        }
    }

    /// The projections LoRA can adapt, by their module name inside the layer (PEFT's names): the attention
    /// projections, and the MLP's in a dense layer (adapters on experts are not implemented).
    pub(crate) fn linears(&self) -> Vec<(&'static str, &Linear)> {
        let mut out = vec![
            ("self_attn.q_proj", &self.q),
            ("self_attn.k_proj", &self.k),
            ("self_attn.v_proj", &self.v),
            ("self_attn.o_proj", &self.o),
        ];
        if let Mlp::Dense { gate, up, down } = &self.mlp {
            out.extend([("mlp.gate_proj", gate), ("mlp.up_proj", up), ("mlp.down_proj", down)]);
        }
        out
    }

    /// [`Layer::linears`], mutable.
    pub(crate) fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let mut out = vec![
            ("self_attn.q_proj", &mut self.q),
            ("self_attn.k_proj", &mut self.k),
            ("self_attn.v_proj", &mut self.v),
            ("self_attn.o_proj", &mut self.o),
        ];
        if let Mlp::Dense { gate, up, down } = &mut self.mlp {
            out.extend([("mlp.gate_proj", gate), ("mlp.up_proj", up), ("mlp.down_proj", down)]);
        }
        out
    }

    /// The projections the packed decode path stacks into one matmul each, in [`FastLayer::packed_mut`]'s order:
    /// those reading the same input go together (q, k and v; gate and up). Only dense models are packed
    /// ([`Decoder::prepare_decode_on`]); a sparse layer's MLP groups are empty.
    fn packed_groups(&self) -> [Vec<&Linear>; 4] {
        let (gate_up, down) = match &self.mlp {
            Mlp::Dense { gate, up, down } => (vec![gate, up], vec![down]),
            Mlp::Sparse(_) => (Vec::new(), Vec::new()),
        };
        [vec![&self.q, &self.k, &self.v], vec![&self.o], gate_up, down]
    }
}

/// A decoder-only language model with trainable parameters.
#[derive(Debug)]
pub struct Decoder {
    config: ModelConfig,
    pub(crate) vs: VarStore,
    pub(crate) kind: Kind,
    embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    inv_freq: Tensor,
    /// Packed copies for the decode step ([`Decoder::prepare_decode`]); `None` until asked for.
    fast: Option<FastDecode>,
    /// Whether attached LoRA adapters take part in forward passes (off while scoring with the base weights);
    /// shared with every [`LoraBranch`].
    pub(crate) lora_on: Arc<AtomicBool>,
    /// Recompute layer activations in the backward ([`Decoder::set_recompute_activations`]).
    recompute: bool,
}

/// The generation engine's packed weights (see [`crate::packed`]). A packed model computes in fp32 whatever its
/// parameter dtype: the packed projections take and return fp32, and the norms here are fp32 (the parameters
/// themselves for an fp32 model, copies for a bf16 one), as is the KV cache ([`Decoder::new_cache`]).
#[derive(Debug)]
struct FastDecode {
    layers: Vec<FastLayer>,
    lm_head: Option<PackedLinear>,
    norm: Tensor,
    bf16: bool,
    /// The instruction set every packed copy runs on (the fused step runs on it too).
    isa: packed::Isa,
}

#[derive(Debug)]
struct FastLayer {
    qkv: Option<PackedLinear>,
    o: Option<PackedLinear>,
    gate_up: Option<PackedLinear>,
    down: Option<PackedLinear>,
    input_norm: Tensor,
    post_norm: Tensor,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
}

impl FastLayer {
    /// Packs `layer`'s projections for `isa`, into memory from `arena`.
    fn pack(arena: &mut WeightArena, isa: packed::Isa, layer: &Layer) -> Result<Self> {
        let [qkv, o, gate_up, down] = layer.packed_groups().map(|group| pack(arena, isa, &group));
        let (input_norm, post_norm, q_norm, k_norm) = fp32_norms(layer)?;
        Ok(FastLayer { qkv: qkv?, o: o?, gate_up: gate_up?, down: down?, input_norm, post_norm, q_norm, k_norm })
    }

    /// Rewrites the packed copies from `layer` (the one they were packed from) in place, after its weights changed.
    fn repack(&mut self, layer: &Layer) -> Result<()> {
        for (copy, group) in self.packed_mut().into_iter().zip(layer.packed_groups()) {
            if let Some(copy) = copy {
                let (weights, biases) = weights_and_biases(&group);
                copy.repack(&weights, &biases)?;
            }
        }
        (self.input_norm, self.post_norm, self.q_norm, self.k_norm) = fp32_norms(layer)?;
        Ok(())
    }

    /// The packed projections, in [`Layer::packed_groups`]'s order.
    fn packed_mut(&mut self) -> [&mut Option<PackedLinear>; 4] {
        [&mut self.qkv, &mut self.o, &mut self.gate_up, &mut self.down]
    }

    fn fully_packed(&self) -> bool {
        self.qkv.is_some() && self.o.is_some() && self.gate_up.is_some() && self.down.is_some()
    }
}

/// Attention output `[B, heads, T, D]` → `[B, T, heads·D]`, the output projection's input.
fn merge_heads(attn: &Tensor) -> Result<Tensor> {
    let size = attn.size();
    Ok(attn.f_transpose(1, 2)?.f_reshape([size[0], size[2], -1])?)
}

/// `layer`'s norm weights in fp32 (input, post-attention, q, k), shared with it when they already are.
fn fp32_norms(layer: &Layer) -> Result<(Tensor, Tensor, Option<Tensor>, Option<Tensor>)> {
    Ok((
        fp32(&layer.input_norm)?,
        fp32(&layer.post_norm)?,
        layer.q_norm.as_ref().map(fp32).transpose()?,
        layer.k_norm.as_ref().map(fp32).transpose()?,
    ))
}

/// `t` in fp32: itself when it already is, else a copy.
fn fp32(t: &Tensor) -> Result<Tensor> {
    Ok(if t.kind() == Kind::Float { t.shallow_clone() } else { t.f_to_kind(Kind::Float)? })
}

fn pack(arena: &mut WeightArena, isa: packed::Isa, linears: &[&Linear]) -> Result<Option<PackedLinear>> {
    let (weights, biases) = weights_and_biases(linears);
    PackedLinear::pack_for(arena, isa, &weights, &biases)
}

/// The weights and biases of `linears`, as [`PackedLinear`] takes them.
fn weights_and_biases<'a>(linears: &[&'a Linear]) -> (Vec<&'a Tensor>, Vec<Option<&'a Tensor>>) {
    (linears.iter().map(|l| &l.weight).collect(), linears.iter().map(|l| l.bias.as_ref()).collect())
}

/// Each sparse layer's `[B·T, k]` experts → `[B, T, layers, k]` (`[B, T, 0, 0]` for none).
fn routing_layout(layers: Vec<Tensor>, b: i64, t: i64) -> Result<Tensor> {
    if layers.is_empty() {
        return Ok(Tensor::f_zeros([b, t, 0, 0], (Kind::Int64, Device::Cpu))?);
    }
    let k = layers[0].size()[1];
    let n = layers.len() as i64;
    Ok(Tensor::f_stack(&layers, 1)?.f_reshape([b, t, n, k])?)
}

/// Adds `tensor` to the var store under a dotted HF name (tch paths cannot contain dots in one component).
fn add_var(vs: &VarStore, name: &str, tensor: Tensor) -> Tensor {
    let mut parts = name.split('.');
    let last = parts.next_back().unwrap_or(name);
    let mut path = vs.root();
    for p in parts {
        path = path.sub(p);
    }
    path.add(last, tensor, true)
}

fn take(vars: &mut HashMap<String, Tensor>, name: &str) -> Result<Tensor> {
    vars.remove(name).ok_or_else(|| ModelError::MissingTensor { tensor: name.to_owned() })
}

fn linear(vars: &mut HashMap<String, Tensor>, prefix: &str, bias: bool) -> Result<Linear> {
    Ok(Linear {
        weight: take(vars, &format!("{prefix}.weight"))?,
        bias: if bias { Some(take(vars, &format!("{prefix}.bias"))?) } else { None },
        lora: None,
    })
}

/// What a layer's computation needs of the model's configuration, by value, so that a recomputed layer
/// ([`crate::checkpoint`]) can own it.
#[derive(Debug, Clone, Copy)]
struct Dims {
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    eps: f64,
}

impl Dims {
    fn rms_norm(self, x: &Tensor, weight: &Tensor) -> Result<Tensor> {
        train_ops::rms_norm(x, weight, self.eps)
    }

    /// Projections, q/k norm and RoPE: q `[B, T, H, D]`, k and v `[B, T, KVH, D]`.
    fn qkv(
        self,
        layer: &Layer,
        fast: Option<&FastLayer>,
        h: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let size = h.size();
        let (b, t) = (size[0], size[1]);
        let (heads, kv_heads, d) = (self.heads, self.kv_heads, self.head_dim);
        let (q, k, v) = match fast.and_then(|f| f.qkv.as_ref()) {
            Some(qkv) => {
                let y = qkv.forward(h)?;
                if layer.q_norm.is_none() && layer.k_norm.is_none() {
                    // q and k sit side by side in the packed output: rotate all their heads in one pass.
                    let qk = y.f_narrow(-1, 0, (heads + kv_heads) * d)?.f_reshape([b, t, heads + kv_heads, d])?;
                    let qk = rope::apply(&qk, cos, sin)?;
                    let q = qk.f_narrow(2, 0, heads)?;
                    let k = qk.f_narrow(2, heads, kv_heads)?;
                    let v = y.f_narrow(-1, (heads + kv_heads) * d, kv_heads * d)?.f_reshape([b, t, kv_heads, d])?;
                    return Ok((q, k, v));
                }
                let parts = y.f_split_with_sizes([heads * d, kv_heads * d, kv_heads * d], -1)?;
                let [q, k, v] = <[Tensor; 3]>::try_from(parts).map_err(|_| ModelError::InvalidInput("qkv".into()))?;
                (q, k, v)
            }
            None => (layer.q.forward(h)?, layer.k.forward(h)?, layer.v.forward(h)?),
        };
        let q = q.f_reshape([b, t, heads, d])?;
        let k = k.f_reshape([b, t, kv_heads, d])?;
        let v = v.f_reshape([b, t, kv_heads, d])?;
        let (q_norm, k_norm) = match fast {
            Some(f) => (f.q_norm.as_ref(), f.k_norm.as_ref()),
            None => (layer.q_norm.as_ref(), layer.k_norm.as_ref()),
        };
        let q = match q_norm {
            Some(w) => self.rms_norm(&q, w)?,
            None => q,
        };
        let k = match k_norm {
            Some(w) => self.rms_norm(&k, w)?,
            None => k,
        };
        Ok((train_ops::rope(&q, cos, sin)?, train_ops::rope(&k, cos, sin)?, v))
    }

    /// Output projection, residual, MLP, residual. `attn` is `[B, T, H·D]`. A sparse layer also returns what its
    /// router decided for the `B·T` tokens, routing them to `replay` `[B·T, k]` when given.
    fn finish_layer(
        self,
        layer: &Layer,
        fast: Option<&FastLayer>,
        x: Tensor,
        attn: &Tensor,
        replay: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Routed>)> {
        let o = match fast.and_then(|f| f.o.as_ref()) {
            Some(o) => o.forward(attn)?,
            None => layer.o.forward(attn)?,
        };
        let x = x + o;
        let h = self.rms_norm(&x, fast.map_or(&layer.post_norm, |f| &f.post_norm))?;
        let (gate, up, down) = match &layer.mlp {
            Mlp::Dense { gate, up, down } => (gate, up, down),
            Mlp::Sparse(sparse) => {
                let mut routed = sparse.forward(&h, replay)?;
                let out = std::mem::replace(&mut routed.out, Tensor::new());
                return Ok((x + out, Some(routed)));
            }
        };
        let act = match fast.and_then(|f| f.gate_up.as_ref()) {
            Some(gate_up) => {
                let y = gate_up.forward(&h)?;
                let inter = gate_up.out_features() / 2;
                y.f_narrow(-1, 0, inter)?.f_silu()? * y.f_narrow(-1, inter, inter)?
            }
            None => train_ops::swiglu(&gate.forward(&h)?, &up.forward(&h)?)?,
        };
        let mlp = match fast.and_then(|f| f.down.as_ref()) {
            Some(down) => down.forward(&act)?,
            None => down.forward(&act)?,
        };
        Ok((x + mlp, None))
    }
}

impl Decoder {
    /// Builds the model for `config`, filling every parameter from `source`, in dtype `kind` on `device`.
    ///
    /// Each tensor is converted once and becomes the variable (no zero-init pass, no second copy), so peak
    /// memory is the model plus the largest single tensor in flight.
    pub fn load(config: ModelConfig, source: &mut dyn WeightSource, kind: Kind, device: Device) -> Result<Self> {
        if !matches!(kind, Kind::Float | Kind::BFloat16 | Kind::Half | Kind::Double) {
            return Err(ModelError::InvalidInput(format!("model dtype must be a float kind, got {kind:?}")));
        }
        if config.num_key_value_heads <= 0 || config.num_attention_heads % config.num_key_value_heads != 0 {
            return Err(ModelError::UnsupportedConfig {
                key: "num_key_value_heads".into(),
                reason: format!(
                    "{} query heads are not a multiple of {} key/value heads",
                    config.num_attention_heads, config.num_key_value_heads
                ),
            });
        }
        let vs = VarStore::new(device);
        let mut vars = HashMap::new();
        for ParamSpec { name, shape } in param_specs(&config) {
            let t = source.load(&name, &shape)?;
            crate::weights::check_shape(&name, &shape, &t.size())?;
            let t = t.f_to_dtype_layout((kind, device), false, false)?.f_detach()?;
            let var = add_var(&vs, &name, t);
            vars.insert(name, var);
        }
        let mut layers = Vec::new();
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let (q_norm, k_norm) = if config.qk_norm {
                (
                    Some(take(&mut vars, &format!("{p}.self_attn.q_norm.weight"))?),
                    Some(take(&mut vars, &format!("{p}.self_attn.k_norm.weight"))?),
                )
            } else {
                (None, None)
            };
            let mlp = match &config.moe {
                Some(moe) if moe.is_sparse(i) => Mlp::Sparse(SparseMlp {
                    router: take(&mut vars, &format!("{p}.mlp.gate.weight"))?,
                    experts: (0..moe.num_experts)
                        .map(|e| {
                            let e = format!("{p}.mlp.experts.{e}");
                            Ok(Expert {
                                gate: linear(&mut vars, &format!("{e}.gate_proj"), false)?,
                                up: linear(&mut vars, &format!("{e}.up_proj"), false)?,
                                down: linear(&mut vars, &format!("{e}.down_proj"), false)?,
                            })
                        })
                        .collect::<Result<_>>()?,
                    top_k: moe.num_experts_per_tok,
                    norm_topk_prob: moe.norm_topk_prob,
                }),
                _ => Mlp::Dense {
                    gate: linear(&mut vars, &format!("{p}.mlp.gate_proj"), config.mlp_bias)?,
                    up: linear(&mut vars, &format!("{p}.mlp.up_proj"), config.mlp_bias)?,
                    down: linear(&mut vars, &format!("{p}.mlp.down_proj"), config.mlp_bias)?,
                },
            };
            layers.push(Layer {
                input_norm: take(&mut vars, &format!("{p}.input_layernorm.weight"))?,
                q: linear(&mut vars, &format!("{p}.self_attn.q_proj"), config.qkv_bias)?,
                k: linear(&mut vars, &format!("{p}.self_attn.k_proj"), config.qkv_bias)?,
                v: linear(&mut vars, &format!("{p}.self_attn.v_proj"), config.qkv_bias)?,
                o: linear(&mut vars, &format!("{p}.self_attn.o_proj"), config.o_bias)?,
                q_norm,
                k_norm,
                post_norm: take(&mut vars, &format!("{p}.post_attention_layernorm.weight"))?,
                mlp,
            });
        }
        let embed = take(&mut vars, "model.embed_tokens.weight")?;
        let norm = take(&mut vars, "model.norm.weight")?;
        let lm_head =
            if config.tie_word_embeddings { embed.shallow_clone() } else { take(&mut vars, "lm_head.weight")? };
        let inv_freq = rope::inv_freq(&config, device)?;
        let lora_on = Arc::new(AtomicBool::new(true));
        Ok(Self { config, vs, kind, embed, layers, norm, lm_head, inv_freq, fast: None, lora_on, recompute: false })
    }

    /// Packs the weights for fast small-batch decoding where the kernel applies (fp32 or bf16 weights on an x86-64
    /// CPU with AVX-512 or AVX2 + FMA, the fastest set it has; a no-op elsewhere). Costs a second copy of the projection weights; meant for a
    /// generation engine's model, never a model being trained (the packed path has no autograd and is skipped
    /// whenever the input needs gradients). A packed bf16 model then generates with fp32 activations and KV
    /// cache: create the cache after this call. Returns whether packed decoding is now active.
    pub fn prepare_decode(&mut self) -> Result<bool> {
        match packed::Isa::best(self.kind) {
            Some(isa) => self.prepare_decode_on(isa),
            None => {
                self.fast = None;
                Ok(false)
            }
        }
    }

    /// [`Decoder::prepare_decode`] on a given instruction set, `false` where this CPU lacks it for the weights'
    /// dtype (the tests run every set the CPU has; `decode_profile --isa` compares two).
    pub fn prepare_decode_on(&mut self, isa: packed::Isa) -> Result<bool> {
        self.fast = None;
        // The packed kernels know nothing of adapters or experts; a model carrying them keeps the libtorch path.
        if self.device() != Device::Cpu || !isa.runs(self.kind) || self.has_lora() || self.config.moe.is_some() {
            return Ok(false);
        }
        // One arena for the whole model, so that its projections fill whole huge pages together.
        let mut arena = WeightArena::default();
        let layers =
            self.layers.iter().map(|layer| FastLayer::pack(&mut arena, isa, layer)).collect::<Result<Vec<_>>>()?;
        let lm_head = PackedLinear::pack_for(&mut arena, isa, &[&self.lm_head], &[None])?;
        let bf16 = self.kind == Kind::BFloat16;
        // An fp32 model falls back to its own weights for a projection the kernel cannot take; a bf16 model
        // computing in fp32 cannot, so it is packed completely or not at all.
        if bf16 && (lm_head.is_none() || !layers.iter().all(FastLayer::fully_packed)) {
            return Ok(false);
        }
        self.fast = Some(FastDecode { layers, lm_head, norm: fp32(&self.norm)?, bf16, isa });
        Ok(true)
    }

    /// The dtype generation computes in: fp32 once packed ([`Decoder::prepare_decode`]), else the parameters'.
    fn compute_kind(&self) -> Kind {
        if self.fast.is_some() { Kind::Float } else { self.kind }
    }

    /// The KV-cache dtype to budget for before [`Decoder::prepare_decode`] runs: fp32 where the model will be
    /// packed (an upper bound if packing then declines a bf16 model), else the parameters' dtype.
    pub fn decode_cache_kind(&self) -> Kind {
        if self.device() == Device::Cpu && packed::packs(self.kind) { Kind::Float } else { self.kind }
    }

    /// Call after changing weights through shared handles ([`Decoder::var_store`] variables): refreshes the
    /// packed decode copies, if any, so generation sees the new values.
    pub fn weights_changed(&mut self) -> Result<()> {
        if self.has_lora() {
            // Adapters attached since packing: the packed path no longer applies.
            self.fast = None;
        }
        let Some(fast) = self.fast.as_mut() else { return Ok(()) };
        // In place: the same tensors were packed, only their values changed.
        for (packed, layer) in fast.layers.iter_mut().zip(&self.layers) {
            packed.repack(layer)?;
        }
        if let Some(head) = &mut fast.lm_head {
            head.repack(&[&self.lm_head], &[None])?;
        }
        fast.norm = fp32(&self.norm)?;
        Ok(())
    }

    /// The packed layer `i` when the packed path applies to `x` (no gradients wanted).
    fn fast_layer(&self, i: usize, x: &Tensor) -> Option<&FastLayer> {
        if x.requires_grad() {
            return None;
        }
        self.fast.as_ref()?.layers.get(i)
    }

    /// The architecture.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The parameter dtype.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// The variables, for an optimizer (`nn::AdamW::default().build(model.var_store(), lr)`), for freezing a
    /// reference model (`var_store_mut().freeze()`), or for reading weights by HF name (`variables()`).
    pub fn var_store(&self) -> &VarStore {
        &self.vs
    }

    /// Mutable access to the variables (freeze/unfreeze).
    pub fn var_store_mut(&mut self) -> &mut VarStore {
        &mut self.vs
    }

    /// Parameters by HF name in [`param_specs`] order (tied `lm_head` not repeated). With LoRA adapters attached
    /// these are the frozen base weights; [`Decoder::merged_parameters`] gives what the adapted model computes
    /// with and [`Decoder::trainable_parameters`] what an optimizer updates.
    pub fn named_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        let vars = self.vs.variables();
        param_specs(&self.config)
            .into_iter()
            .map(|s| {
                let t = vars.get(&s.name).ok_or_else(|| ModelError::MissingTensor { tensor: s.name.clone() })?;
                Ok((s.name, t.shallow_clone()))
            })
            .collect()
    }

    /// Copies every parameter of `other` (same config, any dtype/device) into this model's tensors in place,
    /// under `no_grad`. This is the colocated weight sync: the generation copy keeps its storage (and any
    /// CUDA graphs or caches referring to it), only values change. When `other` carries LoRA adapters, this model
    /// receives its merged weights ([`Decoder::merged_parameters`]).
    pub fn copy_weights_from(&mut self, other: &Decoder) -> Result<()> {
        if other.config.num_hidden_layers != self.config.num_hidden_layers
            || other.config.hidden_size != self.config.hidden_size
        {
            return Err(ModelError::InvalidInput("copy_weights_from: the two models have different shapes".into()));
        }
        let src: HashMap<String, Tensor> = other.merged_parameters()?.into_iter().collect();
        let mut dst = self.vs.variables();
        tch::no_grad(|| -> Result<()> {
            for spec in param_specs(&self.config) {
                let missing = || ModelError::MissingTensor { tensor: spec.name.clone() };
                let s = src.get(&spec.name).ok_or_else(missing)?;
                let d = dst.get_mut(&spec.name).ok_or_else(missing)?;
                d.f_copy_(s)?;
            }
            Ok(())
        })?;
        self.weights_changed()
    }

    fn rms_norm(&self, x: &Tensor, weight: &Tensor) -> Result<Tensor> {
        self.dims().rms_norm(x, weight)
    }

    fn dims(&self) -> Dims {
        let c = &self.config;
        Dims {
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            eps: c.rms_norm_eps,
        }
    }

    /// Embeds token ids `[B, T]` (int64) into `[B, T, hidden]`.
    pub fn embed(&self, input_ids: &Tensor) -> Result<Tensor> {
        Ok(Tensor::f_embedding(&self.embed, input_ids, -1, false, false)?)
    }

    /// The output head's weight `[vocab, hidden]` (the embedding itself when they are tied), for callers that
    /// compute the head in pieces of the vocabulary and write its gradient themselves (the trainer's head).
    pub fn head_weight(&self) -> &Tensor {
        &self.lm_head
    }

    /// Projects hidden states `[..., hidden]` to logits `[..., vocab]` in the model dtype.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        if let Some(head) = self.fast.as_ref().and_then(|f| f.lm_head.as_ref())
            && !hidden.requires_grad()
        {
            // The packed head takes fp32 input. Decoding gives it fp32 (a packed bf16 model computes in fp32), but
            // scoring a whole sequence (`forward_hidden`: teacher logprobs, a workflow's `logprobs`) runs the
            // layers on libtorch in the parameters' dtype.
            return match hidden.kind() {
                Kind::Float => head.forward(hidden),
                _ => head.forward(&hidden.f_to_kind(Kind::Float)?),
            };
        }
        Ok(hidden.f_linear::<Tensor>(&self.lm_head, None)?)
    }

    /// Full-sequence logits `[B, T, vocab]` (see [`Decoder::forward_hidden`]). For long sequences and big
    /// vocabularies prefer [`Decoder::token_logprobs`], which never materializes all logits at once.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        self.logits(&self.forward_hidden(input_ids, attention_mask)?)
    }

    /// `log softmax(logits / temperature)[target]` for every position: `hidden` `[B, T, hidden]`, `targets`
    /// `[B, T]` int64 → `[B, T]` f32. Computed `chunk` positions at a time so only `[B, chunk, vocab]` logits exist
    /// at once. Differentiable. For next-token scoring pass `hidden[:, :-1]` and `ids[:, 1:]`.
    pub fn token_logprobs(&self, hidden: &Tensor, targets: &Tensor, temperature: f64, chunk: i64) -> Result<Tensor> {
        let t = hidden.size().get(1).copied().unwrap_or(0);
        let chunk = chunk.max(1);
        let targets = targets.f_to_device(hidden.device())?;
        let mut parts = Vec::new();
        let mut start = 0;
        while start < t {
            let len = chunk.min(t - start);
            let logits = self.logits(&hidden.f_narrow(1, start, len)?)?.f_to_kind(Kind::Float)?;
            let logits = if temperature != 1.0 { logits / temperature } else { logits };
            let lp = logits.f_log_softmax(-1, Kind::Float)?;
            let idx = targets.f_narrow(1, start, len)?.f_unsqueeze(-1)?;
            parts.push(lp.f_gather(-1, &idx, false)?.f_squeeze_dim(-1)?);
            start += len;
        }
        if parts.is_empty() {
            return Ok(Tensor::f_zeros([hidden.size()[0], 0], (Kind::Float, hidden.device()))?);
        }
        Ok(Tensor::f_cat(&parts, 1)?)
    }

    /// Generation forward: runs new tokens for several cache slots at once and appends their keys/values.
    ///
    /// - `input_ids`: `[B, T]` int64; row `b` holds `new_lens[b]` new tokens for slot `slots[b]`, right-padded
    ///   to `T` with any id. A prefill of several prompts is one call with `T = longest prompt`; a decode step
    ///   is `T = 1` with `new_lens` all 1.
    /// - Row `b`'s tokens get positions `cache.len(slots[b])..+new_lens[b]` and attend to that slot's cached
    ///   prefix plus themselves (causally). Afterwards `cache.len(slots[b])` has grown by `new_lens[b]`.
    /// - Returns final-normed hidden states `[B, T, hidden]`; take row `b`'s last real position
    ///   ([`Decoder::last_hidden`]) and [`Decoder::logits`] to sample the next token.
    ///
    /// Errors: a slot out of range or repeated, `new_lens[b]` of 0 or more than `T`, or a slot overflowing the
    /// cache's capacity. Runs without gradients.
    pub fn forward_with_cache(
        &self,
        input_ids: &Tensor,
        cache: &mut KvCache,
        slots: &[usize],
        new_lens: &[usize],
    ) -> Result<Tensor> {
        Ok(self.forward_with_cache_routed(input_ids, cache, slots, new_lens)?.0)
    }

    /// [`Decoder::forward_with_cache`], also returning the experts every new token was routed to: `[B, T, L, k]`
    /// int64 for the model's `L` sparse layers ([`Decoder::sparse_layers`]) and `k` experts a token, best first
    /// (`[B, T, 0, 0]` for a dense model). Positions past `new_lens[b]` in row `b` are padding: ignore them. This is
    /// what a rollout records for routing replay (Trinity-RFT's `routed_experts`, one `[L, k]` row a token).
    pub fn forward_with_cache_routed(
        &self,
        input_ids: &Tensor,
        cache: &mut KvCache,
        slots: &[usize],
        new_lens: &[usize],
    ) -> Result<(Tensor, Tensor)> {
        let size = input_ids.size();
        let [b, t] = size[..] else {
            return Err(ModelError::InvalidInput(format!("input_ids must be [B, T], got {size:?}")));
        };
        if slots.len() != b as usize || new_lens.len() != b as usize {
            return Err(ModelError::KvCache(format!(
                "{b} rows but {} slots and {} lengths",
                slots.len(),
                new_lens.len()
            )));
        }
        let capacity = cache.capacity();
        let mut seen = vec![false; cache.num_slots()];
        let mut starts = Vec::with_capacity(slots.len());
        for (&slot, &n) in slots.iter().zip(new_lens) {
            cache.check_slot(slot)?;
            if std::mem::replace(&mut seen[slot], true) {
                return Err(ModelError::KvCache(format!("slot {slot} appears twice in one batch")));
            }
            if n == 0 || n as i64 > t {
                return Err(ModelError::KvCache(format!("slot {slot}: {n} new tokens in a row of {t}")));
            }
            let start = cache.len(slot);
            if start + n > capacity {
                return Err(ModelError::KvCache(format!(
                    "slot {slot}: {start} cached + {n} new tokens exceed capacity {capacity}"
                )));
            }
            starts.push(start);
        }
        if t == 1
            && let Some(hidden) = self.fused_decode(input_ids, cache, slots, &starts)?
        {
            for (&slot, &start) in slots.iter().zip(&starts) {
                cache.set_len(slot, start + 1);
            }
            return Ok((hidden, routing_layout(Vec::new(), b, t)?));
        }
        let device = self.device();
        let kmax = starts.iter().zip(new_lens).map(|(s, n)| s + n).max().unwrap_or(0) as i64;
        // Host-side index tables: positions for RoPE, write columns (padding goes to the scratch column),
        // and the attention mask over the first `kmax` cached columns.
        let mut pos = Vec::with_capacity((b * t) as usize);
        let mut write = Vec::with_capacity((b * t) as usize);
        let mut mask = Vec::with_capacity((b * t * kmax) as usize);
        for (&start, &n) in starts.iter().zip(new_lens) {
            for j in 0..t as usize {
                pos.push((start + j) as i64);
                write.push(if j < n { (start + j) as i64 } else { capacity as i64 });
                let visible = (start + j.min(n - 1)) as i64;
                mask.extend((0..kmax).map(|c| c <= visible));
            }
        }
        let pos = Tensor::from_slice(&pos).f_view([b, t])?.f_to_device(device)?;
        let write = Tensor::from_slice(&write).f_view([b, t])?.f_to_device(device)?;
        let mask = Tensor::from_slice(&mask).f_view([b, 1, t, kmax])?.f_to_device(device)?;
        let slot_ids: Vec<i64> = slots.iter().map(|&s| s as i64).collect();
        let contiguous = slot_ids.iter().enumerate().all(|(i, &s)| s == slot_ids[0] + i as i64);
        let slot_t = Tensor::from_slice(&slot_ids).f_to_device(device)?;
        let slot_rows = slot_t.f_view([b, 1])?.f_expand([b, t], false)?;

        let (kv_heads, head_dim) = (self.config.num_key_value_heads, self.config.head_dim);
        let groups = self.config.num_attention_heads / kv_heads;
        let kind = self.compute_kind();
        let mut experts = Vec::new();
        let hidden = tch::no_grad(|| -> Result<Tensor> {
            let (cos, sin) = rope::cos_sin(&self.inv_freq, &pos, kind)?;
            let mut x = self.embed(&input_ids.f_to_device(device)?)?.f_to_kind(kind)?;
            let dims = self.dims();
            for (i, layer) in self.layers.iter().enumerate() {
                let fast = self.fast_layer(i, &x);
                let h = dims.rms_norm(&x, fast.map_or(&layer.input_norm, |f| &f.input_norm))?;
                let (q, k, v) = dims.qkv(layer, fast, &h, &cos, &sin)?;
                let kc = &mut cache.keys[i];
                let _ = kc.f_index_put_(&[Some(&slot_rows), None, Some(&write)], &k, false)?;
                let vc = &mut cache.values[i];
                let _ = vc.f_index_put_(&[Some(&slot_rows), None, Some(&write)], &v, false)?;
                let (keys, values) = if contiguous {
                    (
                        cache.keys[i].f_narrow(0, slot_ids[0], b)?.f_narrow(2, 0, kmax)?,
                        cache.values[i].f_narrow(0, slot_ids[0], b)?.f_narrow(2, 0, kmax)?,
                    )
                } else {
                    // Narrow to the positions in use before gathering the slots: the gather copies what it is
                    // given, and a slot holds `capacity + 1` positions (model.max_model_len, 2048 and more in
                    // Trinity-RFT's configs) where a decode step reads `kmax`.
                    (
                        cache.keys[i].f_narrow(2, 0, kmax)?.f_index_select(0, &slot_t)?,
                        cache.values[i].f_narrow(2, 0, kmax)?.f_index_select(0, &slot_t)?,
                    )
                };
                let q = q.f_transpose(1, 2)?;
                let attn = if t == 1 && groups > 1 {
                    // Decode step: fold each KV head's query heads into the query-length axis ([B, KVH, G, D];
                    // head h uses KV head h / G) so the kernel runs plain multi-head attention; its GQA path
                    // costs ~4x more on CPU in bf16. The one-row mask broadcasts over the G "positions".
                    let qg = q.f_reshape([b, kv_heads, groups, head_dim])?;
                    let out = Tensor::f_scaled_dot_product_attention(
                        &qg,
                        &keys,
                        &values,
                        Some(&mask),
                        0.0,
                        false,
                        None,
                        false,
                    )?;
                    out.f_reshape([b, kv_heads * groups, 1, head_dim])?
                } else {
                    Tensor::f_scaled_dot_product_attention(&q, &keys, &values, Some(&mask), 0.0, false, None, true)?
                };
                let routed;
                (x, routed) = dims.finish_layer(layer, fast, x, &merge_heads(&attn)?, None)?;
                experts.extend(routed.map(|r| r.experts));
            }
            self.rms_norm(&x, self.fast.as_ref().map_or(&self.norm, |f| &f.norm))
        })?;
        for ((&slot, &start), &n) in slots.iter().zip(&starts).zip(new_lens) {
            cache.set_len(slot, start + n);
        }
        Ok((hidden, routing_layout(experts, b, t)?))
    }

    /// The indices of the layers whose MLP is a mixture of experts, in the order the routing tensors list them.
    pub fn sparse_layers(&self) -> Vec<usize> {
        (0..self.layers.len()).filter(|&i| matches!(self.layers[i].mlp, Mlp::Sparse(_))).collect()
    }

    /// One decode step through the fused kernel ([`crate::decode_step`]) when every layer is packed; `None`
    /// when it does not apply (the caller then takes the libtorch path). `starts[b]` is row `b`'s position, already
    /// checked against the cache's capacity; the caller advances the cache lengths.
    fn fused_decode(
        &self,
        input_ids: &Tensor,
        cache: &mut KvCache,
        slots: &[usize],
        starts: &[usize],
    ) -> Result<Option<Tensor>> {
        let Some(fast) = self.fast.as_ref() else {
            return Ok(None);
        };
        let cache_ok = |t: &Tensor| t.kind() == Kind::Float && t.device() == Device::Cpu && t.is_contiguous();
        if self.config.head_dim % 2 != 0 || !cache.keys.iter().chain(&cache.values).all(cache_ok) {
            return Ok(None);
        }
        let ptr = |t: &Tensor| t.data_ptr() as *const f32;
        let opt = |t: Option<&Tensor>| t.map_or(std::ptr::null(), ptr);
        let mut table = Vec::with_capacity(self.layers.len());
        for (i, f) in fast.layers.iter().enumerate() {
            let (Some(qkv), Some(o), Some(gate_up), Some(down)) = (&f.qkv, &f.o, &f.gate_up, &f.down) else {
                return Ok(None);
            };
            table.push(DecodeLayer {
                input_norm: ptr(&f.input_norm),
                qkv: qkv.weight_ptr(),
                qkv_bias: qkv.bias_ptr(),
                q_norm: opt(f.q_norm.as_ref()),
                k_norm: opt(f.k_norm.as_ref()),
                o: o.weight_ptr(),
                o_bias: o.bias_ptr(),
                post_norm: ptr(&f.post_norm),
                gate_up: gate_up.weight_ptr(),
                gate_up_bias: gate_up.bias_ptr(),
                down: down.weight_ptr(),
                down_bias: down.bias_ptr(),
                keys: cache.keys[i].data_ptr() as *mut f32,
                values: cache.values[i].data_ptr() as *mut f32,
            });
        }
        let c = &self.config;
        let shape = DecodeShape {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            intermediate: c.intermediate_size,
            cache_cols: cache.capacity() as i64 + 1,
            eps: c.rms_norm_eps,
            bf16_weights: i64::from(fast.bf16),
            isa: fast.isa as i64,
        };
        let slot_ids: Vec<i64> = slots.iter().map(|&s| s as i64).collect();
        let positions: Vec<i64> = starts.iter().map(|&s| s as i64).collect();
        let rows = slots.len() as i64;
        tch::no_grad(|| -> Result<Option<Tensor>> {
            let (cos, sin) =
                rope::cos_sin(&self.inv_freq, &Tensor::from_slice(&positions).f_view([rows, 1])?, Kind::Float)?;
            let cos = cos.f_reshape([rows, c.head_dim])?.f_contiguous()?;
            let sin = sin.f_reshape([rows, c.head_dim])?.f_contiguous()?;
            let x = self.embed(&input_ids.f_reshape([rows])?)?.f_to_kind(Kind::Float)?.f_contiguous()?;
            // SAFETY: the table points at this model's fp32 norms and packed copies (contiguous, shaped by `c`,
            // the projections in the dtype `shape.bf16_weights` names; `fast` exists only for CPU models) and at
            // the cache's per-layer tensors, checked fp32 and contiguous above, which the `&mut` borrow keeps to this call. forward_with_cache checked every slot
            // against the cache, refused repeats, and checked `start + 1 <= capacity`, so every position is below
            // `cache_cols - 1`.
            unsafe { decode_step::run(&shape, &table, &slot_ids, &positions, &cos, &sin, &x)? };
            Ok(Some(self.rms_norm(&x, &fast.norm)?.f_unsqueeze(1)?))
        })
    }

    /// Picks each row's hidden state at its last real position: `hidden` `[B, T, H]`, `new_lens[b]` tokens in
    /// row `b` → `[B, H]`.
    pub fn last_hidden(&self, hidden: &Tensor, new_lens: &[usize]) -> Result<Tensor> {
        let idx: Vec<i64> = new_lens.iter().map(|&n| n.saturating_sub(1) as i64).collect();
        let h = hidden.size()[2];
        let idx =
            Tensor::from_slice(&idx).f_to_device(hidden.device())?.f_view([-1, 1, 1])?.f_expand([-1, 1, h], false)?;
        Ok(hidden.f_gather(1, &idx, false)?.f_squeeze_dim(1)?)
    }

    /// Allocates a KV cache matching this model's shapes, generation dtype (fp32 once packed) and device.
    pub fn new_cache(&self, num_slots: usize, capacity: usize) -> Result<KvCache> {
        KvCache::new(&self.config, num_slots, capacity, self.compute_kind(), self.device())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::weights::RandomWeights;

    fn model(family: Family) -> Decoder {
        model_with(tiny(family))
    }

    fn tiny(family: Family) -> ModelConfig {
        let mut c = ModelConfig::tiny(family);
        c.tie_word_embeddings = family != Family::Llama;
        c
    }

    fn model_with(config: ModelConfig) -> Decoder {
        tch::manual_seed(0);
        Decoder::load(config, &mut RandomWeights, Kind::Float, Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn padding_does_not_change_real_positions() {
        let m = model(Family::Qwen3);
        let ids = Tensor::from_slice(&[5i64, 9, 3, 7]).view([1, 4]);
        let plain = m.forward(&ids, None).unwrap();
        // Left-padded and right-padded versions of the same row.
        let left = Tensor::from_slice(&[0i64, 0, 5, 9, 3, 7]).view([1, 6]);
        let lmask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1]).view([1, 6]);
        let l = m.forward(&left, Some(&lmask)).unwrap().narrow(1, 2, 4);
        assert!(max_diff(&plain, &l) < 1e-5);
        let right = Tensor::from_slice(&[5i64, 9, 3, 7, 0, 0]).view([1, 6]);
        let rmask = Tensor::from_slice(&[1i64, 1, 1, 1, 0, 0]).view([1, 6]);
        let r = m.forward(&right, Some(&rmask)).unwrap();
        assert!(max_diff(&plain, &r.narrow(1, 0, 4)) < 1e-5);
        assert!(bool::try_from(r.isfinite().all()).unwrap());
    }

    #[test]
    fn cached_prefill_and_decode_match_full_forward() {
        for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
            let m = model(family);
            let seqs: [&[i64]; 2] = [&[1, 2, 3, 4, 5, 6, 7, 8], &[7, 8, 9, 10, 11, 12, 13, 14]];
            let full: Vec<Tensor> =
                seqs.iter().map(|s| m.forward(&Tensor::from_slice(s).view([1, -1]), None).unwrap()).collect();
            let mut cache = m.new_cache(3, 16).unwrap();
            // Ragged prefill: slot 2 gets 3 tokens of seq 0, slot 0 gets 2 tokens of seq 1.
            let ids = Tensor::from_slice(&[1i64, 2, 3, 7, 8, 0]).view([2, 3]);
            let h = m.forward_with_cache(&ids, &mut cache, &[2, 0], &[3, 2]).unwrap();
            let last = m.logits(&m.last_hidden(&h, &[3, 2]).unwrap()).unwrap();
            assert!(max_diff(&last.get(0), &full[0].get(0).get(2)) < 1e-4);
            assert!(max_diff(&last.get(1), &full[1].get(0).get(1)) < 1e-4);
            assert_eq!((cache.len(2), cache.len(0)), (3, 2));
            // Decode steps at different positions in one batch.
            let mut p = [3usize, 2];
            for _ in 0..3 {
                let ids = Tensor::from_slice(&[seqs[0][p[0]], seqs[1][p[1]]]).view([2, 1]);
                let h = m.forward_with_cache(&ids, &mut cache, &[2, 0], &[1, 1]).unwrap();
                let lg = m.logits(&h).unwrap();
                assert!(max_diff(&lg.get(0).get(0), &full[0].get(0).get(p[0] as i64)) < 1e-4, "{family:?}");
                assert!(max_diff(&lg.get(1).get(0), &full[1].get(0).get(p[1] as i64)) < 1e-4, "{family:?}");
                p[0] += 1;
                p[1] += 1;
            }
            // Sharing a prefix: copy slot 2 into slot 1 and continue there.
            cache.copy_slot(2, 1).unwrap();
            let ids = Tensor::from_slice(&[seqs[0][p[0]]]).view([1, 1]);
            let h = m.forward_with_cache(&ids, &mut cache, &[1], &[1]).unwrap();
            assert!(max_diff(&m.logits(&h).unwrap().get(0).get(0), &full[0].get(0).get(p[0] as i64)) < 1e-4);
        }
    }

    #[test]
    fn packed_decode_matches_libtorch_and_follows_weight_changes() {
        for isa in sets_to_test(Kind::Float) {
            packed_decode_matches_libtorch(isa);
        }
    }

    /// The instruction sets the packed-decode tests must cover for `kind`: every one this CPU has. An AVX2 + FMA
    /// CPU has at least the AVX2 set, so there the tests cannot pass on the libtorch fallback; where it has
    /// none, `prepare_decode` must decline.
    fn sets_to_test(kind: Kind) -> Vec<packed::Isa> {
        let sets = packed::Isa::available(kind);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            assert!(sets.contains(&packed::Isa::Avx2), "{kind:?}: no AVX2 kernel on an AVX2 + FMA CPU");
        }
        let mut m =
            model_with(ModelConfig { head_dim: 16, hidden_size: 64, intermediate_size: 64, ..tiny(Family::Llama) });
        if kind == Kind::BFloat16 {
            m = Decoder::load(m.config().clone(), &mut RandomWeights, kind, Device::Cpu).unwrap();
        }
        assert_eq!(m.prepare_decode().unwrap(), !sets.is_empty(), "{kind:?}");
        assert_eq!(m.fast.as_ref().map(|f| f.isa), sets.first().copied(), "{kind:?}: the fastest set is used");
        sets
    }

    fn packed_decode_matches_libtorch(isa: packed::Isa) {
        // Head size 8 takes the fused step's generic attention; 16 its register-resident variant.
        let configs = [Family::Llama, Family::Qwen2, Family::Qwen3].into_iter().flat_map(|family| {
            let wide = ModelConfig { head_dim: 16, hidden_size: 64, intermediate_size: 64, ..tiny(family) };
            [tiny(family), wide]
        });
        for config in configs {
            let family = config.family;
            let plain = model_with(config.clone());
            // Same weights by copy: tests share the global RNG, so two seeded loads may differ.
            let mut fast = model_with(config);
            fast.copy_weights_from(&plain).unwrap();
            assert!(fast.prepare_decode_on(isa).unwrap());
            let f = fast.fast.as_ref().unwrap();
            assert_eq!(f.isa, isa);
            let packed = f.layers.iter().flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down]).filter(|p| p.is_some());
            assert_eq!(packed.count() + usize::from(f.lm_head.is_some()), 9, "every projection packed");
            let run = |m: &Decoder| {
                let mut cache = m.new_cache(2, 32).unwrap();
                let ids = Tensor::from_slice(&[1i64, 2, 3, 7, 8, 0]).view([2, 3]);
                let h = m.forward_with_cache(&ids, &mut cache, &[0, 1], &[3, 2]).unwrap();
                let mut out = vec![m.logits(&m.last_hidden(&h, &[3, 2]).unwrap()).unwrap()];
                // Past 16 cached positions, so attention's 16-wide softmax chunks and their tails both run.
                for step in 0..20 {
                    let ids = Tensor::from_slice(&[(4 + step) % 32, (9 + 3 * step) % 32]).view([2, 1]);
                    let h = m.forward_with_cache(&ids, &mut cache, &[0, 1], &[1, 1]).unwrap();
                    out.push(m.logits(&h).unwrap().squeeze_dim(1));
                }
                Tensor::stack(&out, 0)
            };
            assert!(max_diff(&run(&plain), &run(&fast)) < 1e-4, "{isa:?} {family:?}");
            // New weights reach the packed copies.
            let other = {
                tch::manual_seed(7);
                Decoder::load(plain.config().clone(), &mut RandomWeights, Kind::Float, Device::Cpu).unwrap()
            };
            fast.copy_weights_from(&other).unwrap();
            assert_eq!(fast.fast.as_ref().map(|f| f.isa), Some(isa), "repacked on the same set");
            assert!(max_diff(&run(&other), &run(&fast)) < 1e-4, "{isa:?} {family:?} after sync");
        }
    }

    /// A batch-1 step whose KV heads do not divide among the threads splits each head's keys into parts and merges
    /// the parts (`csrc/decode_kernels.inc`, `key_parts`): with 3 KV heads and 261 cached keys, 2 threads take 2
    /// parts a head and 4 threads 4. Its logits must be libtorch's attention over the whole row, for both attention
    /// kernels (head size 8: the generic one; 16: the register-resident one).
    #[test]
    fn split_attention_matches_libtorch() {
        let threads = tch::get_num_threads();
        for pool in [2, 4] {
            // This thread's OpenMP pool size, which the fused step reads: any size runs on any machine.
            tch::set_num_threads(pool);
            for isa in sets_to_test(Kind::Float) {
                for head_dim in [8, 16] {
                    let config = ModelConfig {
                        num_attention_heads: 6,
                        num_key_value_heads: 3,
                        head_dim,
                        max_position_embeddings: 512,
                        ..tiny(Family::Qwen3)
                    };
                    let plain = model_with(config.clone());
                    let mut fast = model_with(config);
                    fast.copy_weights_from(&plain).unwrap();
                    assert!(fast.prepare_decode_on(isa).unwrap());
                    let run = |m: &Decoder| {
                        let mut cache = m.new_cache(1, 300).unwrap();
                        let prompt: Vec<i64> = (0..260).map(|i| (i * 7 + 3) % 32).collect();
                        let ids = Tensor::from_slice(&prompt).view([1, 260]);
                        let h = m.forward_with_cache(&ids, &mut cache, &[0], &[260]).unwrap();
                        let mut out = vec![m.logits(&m.last_hidden(&h, &[260]).unwrap()).unwrap()];
                        for step in 0..12_i64 {
                            let ids = Tensor::from_slice(&[(5 + 3 * step) % 32]).view([1, 1]);
                            let h = m.forward_with_cache(&ids, &mut cache, &[0], &[1]).unwrap();
                            out.push(m.logits(&h).unwrap().squeeze_dim(1));
                        }
                        Tensor::stack(&out, 0)
                    };
                    let diff = max_diff(&run(&plain), &run(&fast));
                    assert!(diff < 1e-4, "{isa:?} head size {head_dim}, {pool} threads: {diff}");
                }
            }
        }
        tch::set_num_threads(threads);
    }

    /// Prefill and 20 decode steps for two rows; the stacked logits.
    fn generate_logits(m: &Decoder) -> Tensor {
        let mut cache = m.new_cache(2, 32).unwrap();
        let ids = Tensor::from_slice(&[1i64, 2, 3, 7, 8, 0]).view([2, 3]);
        let h = m.forward_with_cache(&ids, &mut cache, &[0, 1], &[3, 2]).unwrap();
        let mut out = vec![m.logits(&m.last_hidden(&h, &[3, 2]).unwrap()).unwrap().to_kind(Kind::Float)];
        for step in 0..20 {
            let ids = Tensor::from_slice(&[(4 + step) % 32, (9 + 3 * step) % 32]).view([2, 1]);
            let h = m.forward_with_cache(&ids, &mut cache, &[0, 1], &[1, 1]).unwrap();
            out.push(m.logits(&h).unwrap().squeeze_dim(1).to_kind(Kind::Float));
        }
        Tensor::stack(&out, 0)
    }

    #[test]
    fn packed_bf16_decode_computes_in_fp32_with_bf16_weights() {
        for isa in sets_to_test(Kind::BFloat16) {
            packed_bf16_decode_computes_in_fp32(isa);
        }
    }

    fn packed_bf16_decode_computes_in_fp32(isa: packed::Isa) {
        for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
            let config = ModelConfig { head_dim: 16, hidden_size: 64, intermediate_size: 64, ..tiny(family) };
            let load = |kind| Decoder::load(config.clone(), &mut RandomWeights, kind, Device::Cpu).unwrap();
            let weights = load(Kind::BFloat16);
            // The reference: the same (bf16-representable) weights in an fp32 model on libtorch's kernels.
            let mut reference = load(Kind::Float);
            reference.copy_weights_from(&weights).unwrap();
            let mut fast = load(Kind::BFloat16);
            fast.copy_weights_from(&weights).unwrap();
            assert!(fast.prepare_decode_on(isa).unwrap(), "{isa:?} {family:?}: a bf16 model packs on this CPU");
            assert_eq!(fast.fast.as_ref().map(|f| f.isa), Some(isa));
            assert_eq!(fast.new_cache(1, 4).unwrap().keys[0].kind(), Kind::Float, "fp32 cache");
            let want = generate_logits(&reference);
            let scale = want.abs().max().double_value(&[]);
            // Only the matmul inputs are rounded to bf16 (relative error 2^-9 each); a layout error is O(1).
            let packed_error = max_diff(&generate_logits(&fast), &want) / scale;
            assert!(packed_error < 1e-2, "{family:?}: relative error {packed_error}");
            // bf16 activations throughout (the unpacked bf16 model) are no closer to fp32 than the packed path.
            let unpacked_error = max_diff(&generate_logits(&weights), &want) / scale;
            assert!(packed_error <= unpacked_error, "{family:?}: {packed_error} vs bf16 libtorch {unpacked_error}");
            // New weights reach the packed copies.
            let other = load(Kind::BFloat16);
            reference.copy_weights_from(&other).unwrap();
            fast.copy_weights_from(&other).unwrap();
            let want = generate_logits(&reference);
            let error = max_diff(&generate_logits(&fast), &want) / want.abs().max().double_value(&[]);
            assert!(error < 1e-2, "{family:?} after sync: relative error {error}");
        }
    }

    /// A packed bf16 model scoring a whole sequence (layers on libtorch in bf16, then the packed fp32 head) gives
    /// the unpacked bf16 model's logits, to bf16's precision.
    #[test]
    fn a_packed_bf16_model_scores_whole_sequences() {
        for isa in sets_to_test(Kind::BFloat16) {
            let config = ModelConfig { head_dim: 16, hidden_size: 64, intermediate_size: 64, ..tiny(Family::Qwen2) };
            let load = || Decoder::load(config.clone(), &mut RandomWeights, Kind::BFloat16, Device::Cpu).unwrap();
            let unpacked = load();
            let mut packed = load();
            packed.copy_weights_from(&unpacked).unwrap();
            assert!(packed.prepare_decode_on(isa).unwrap(), "{isa:?}: a bf16 model packs on this CPU");
            let ids = Tensor::from_slice(&[1i64, 2, 3, 7, 8, 9]).view([2, 3]);
            // Without gradients, as an engine scores (with them the head is libtorch's linear anyway).
            let want = tch::no_grad(|| unpacked.forward(&ids, None)).unwrap().to_kind(Kind::Float);
            let got = tch::no_grad(|| packed.forward(&ids, None)).unwrap().to_kind(Kind::Float);
            let error = max_diff(&got, &want) / want.abs().max().double_value(&[]);
            assert!(error < 2e-2, "{isa:?}: relative error {error}");
        }
    }

    #[test]
    fn cache_misuse_is_an_error() {
        let m = model(Family::Llama);
        let mut cache = m.new_cache(2, 4).unwrap();
        let ids = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
        assert!(matches!(m.forward_with_cache(&ids, &mut cache, &[5], &[3]), Err(ModelError::KvCache(_))));
        assert!(matches!(m.forward_with_cache(&ids, &mut cache, &[0], &[0]), Err(ModelError::KvCache(_))));
        let _ = m.forward_with_cache(&ids, &mut cache, &[0], &[3]).unwrap();
        let err = m.forward_with_cache(&ids, &mut cache, &[0], &[2]).unwrap_err();
        assert!(err.to_string().contains("exceed capacity"), "{err}");
        let two = Tensor::from_slice(&[1i64, 2]).view([2, 1]);
        assert!(m.forward_with_cache(&two, &mut cache, &[1, 1], &[1, 1]).is_err());
    }

    /// Gradients of every parameter after `loss.backward()`, then zeroed.
    fn take_grads(m: &Decoder) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = m
            .var_store()
            .variables()
            .into_iter()
            .filter(|(_, v)| v.grad().defined())
            .map(|(name, v)| {
                let g = v.grad().copy();
                let _ = v.grad().zero_();
                (name, g)
            })
            .collect();
        assert!(!out.is_empty(), "no gradients");
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    #[test]
    fn shared_prompts_match_full_rows_in_values_and_gradients() {
        // Two prompts (3 and 5 tokens) shared by 2 and 3 responses of 1 to 4 tokens.
        let prompts: [&[i64]; 2] = [&[3, 1, 4], &[1, 5, 9, 2, 6]];
        let responses: [(usize, &[i64]); 5] =
            [(0, &[5, 3, 5, 8]), (0, &[9]), (1, &[7, 9]), (1, &[3, 2, 3, 8]), (1, &[4, 6, 2])];
        let (p, r) = (5_i64, 4_i64);
        for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
            let m = model(family);
            // Full rows as the trainer pads them: prompt left-padded to P, response right-padded to R.
            let (mut ids, mut mask) = (vec![0i64; 5 * 9], vec![0i64; 5 * 9]);
            for (row, (g, resp)) in responses.iter().enumerate() {
                let prompt = prompts[*g];
                let start = row * 9 + (p as usize - prompt.len());
                for (j, &t) in prompt.iter().chain(resp.iter()).enumerate() {
                    ids[start + j] = t;
                    mask[start + j] = 1;
                }
            }
            let full = m
                .forward_hidden(&Tensor::from_slice(&ids).view([5, 9]), Some(&Tensor::from_slice(&mask).view([5, 9])))
                .unwrap();
            // The same rows in the shared layout.
            let (mut pids, mut pmask) = (vec![0i64; 2 * 5], vec![0i64; 2 * 5]);
            for (g, prompt) in prompts.iter().enumerate() {
                for (j, &t) in prompt.iter().enumerate() {
                    pids[g * 5 + 5 - prompt.len() + j] = t;
                    pmask[g * 5 + 5 - prompt.len() + j] = 1;
                }
            }
            let mut rids = vec![0i64; 5 * 4];
            for (row, (_, resp)) in responses.iter().enumerate() {
                rids[row * 4..row * 4 + resp.len()].copy_from_slice(resp);
            }
            let groups: Vec<i64> = responses.iter().map(|(g, _)| *g as i64).collect();
            let (hp, hr) = m
                .forward_hidden_shared_prompts(
                    &Tensor::from_slice(&pids).view([2, p]),
                    &Tensor::from_slice(&pmask).view([2, p]),
                    &groups,
                    &Tensor::from_slice(&rids).view([5, r]),
                    &responses.iter().map(|(_, resp)| resp.len() as i64).collect::<Vec<_>>(),
                )
                .unwrap();
            // Compare every real position, and build the same weighted sum of them on both sides.
            let weights = Tensor::randn([5, 9, m.config().hidden_size], (Kind::Float, Device::Cpu));
            let (mut loss_full, mut loss_shared) = (Tensor::from(0f32), Tensor::from(0f32));
            for (row, (g, resp)) in responses.iter().enumerate() {
                let plen = prompts[*g].len() as i64;
                let (row_i, g_i, rlen) = (row as i64, *g as i64, resp.len() as i64);
                let full_prompt = full.get(row_i).narrow(0, p - plen, plen);
                let shared_prompt = hp.get(g_i).narrow(0, p - plen, plen);
                assert!(max_diff(&full_prompt, &shared_prompt) < 1e-4, "{family:?} row {row} prompt");
                let full_resp = full.get(row_i).narrow(0, p, rlen);
                let shared_resp = hr.get(row_i).narrow(0, 0, rlen);
                assert!(max_diff(&full_resp, &shared_resp) < 1e-4, "{family:?} row {row} response");
                let w = weights.get(row_i);
                loss_full += (full_resp * w.narrow(0, 0, rlen)).sum(Kind::Float);
                loss_shared += (shared_resp * w.narrow(0, 0, rlen)).sum(Kind::Float);
                // The last prompt position predicts the first response token: counted once per response.
                let wl = w.get(8);
                loss_full += (full_prompt.get(plen - 1) * &wl).sum(Kind::Float);
                loss_shared += (shared_prompt.get(plen - 1) * &wl).sum(Kind::Float);
            }
            loss_full.backward();
            let want = take_grads(&m);
            loss_shared.backward();
            let got = take_grads(&m);
            for ((name, w), (_, g)) in want.iter().zip(&got) {
                let scale = w.abs().max().double_value(&[]).max(1e-6);
                assert!(max_diff(w, g) / scale < 1e-4, "{family:?} gradient of {name}: {}", max_diff(w, g) / scale);
            }
        }
    }

    #[test]
    fn gradients_flow_and_weights_copy_in_place() {
        let m = model(Family::Qwen2);
        let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
        let h = m.forward_hidden(&ids, None).unwrap();
        let lp = m.token_logprobs(&h.narrow(1, 0, 3), &ids.narrow(1, 1, 3), 1.0, 2).unwrap();
        let full = m.forward(&ids, None).unwrap().log_softmax(-1, Kind::Float);
        let want = full.narrow(1, 0, 3).gather(-1, &ids.narrow(1, 1, 3).unsqueeze(-1), false).squeeze_dim(-1);
        assert!(max_diff(&lp, &want) < 1e-5);
        lp.sum(Kind::Float).backward();
        let g = m.var_store().variables()["model.layers.0.mlp.up_proj.weight"].grad();
        assert!(g.abs().sum(Kind::Float).double_value(&[]) > 0.0);

        let mut gen_model = {
            tch::manual_seed(1);
            Decoder::load(m.config().clone(), &mut RandomWeights, Kind::BFloat16, Device::Cpu).unwrap()
        };
        let before = gen_model.var_store().variables()["model.norm.weight"].data_ptr();
        gen_model.copy_weights_from(&m).unwrap();
        let after = &gen_model.var_store().variables()["model.norm.weight"];
        assert_eq!(before, after.data_ptr());
        let src = &m.var_store().variables()["model.embed_tokens.weight"];
        let dst = &gen_model.var_store().variables()["model.embed_tokens.weight"];
        assert!(max_diff(&src.to_kind(Kind::BFloat16).to_kind(Kind::Float), &dst.to_kind(Kind::Float)) == 0.0);
    }
}
