//! The architecture description of a decoder: read from Hugging Face `config.json` or GGUF metadata, written
//! back as a `config.json` that transformers loads.
//!
//! One struct covers the families because they differ only in switches: Qwen2 adds q/k/v biases, Qwen3 adds
//! per-head RMSNorm on q and k, Llama may have biases (`attention_bias`) and llama3 RoPE scaling, and Qwen3-MoE
//! is Qwen3 whose layers' MLPs are mixtures of experts ([`MoeConfig`]).

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// The model families we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM` (SmolLM, Llama 2/3).
    Llama,
    /// `Qwen2ForCausalLM` (Qwen2, Qwen2.5): biases on q, k, v.
    Qwen2,
    /// `Qwen3ForCausalLM`: RMSNorm on q and k per head, no biases.
    Qwen3,
    /// `Qwen3MoeForCausalLM`: Qwen3's attention, sparse mixture-of-experts MLPs ([`ModelConfig::moe`]).
    Qwen3Moe,
}

pub(crate) const SUPPORTED: &str = "llama, qwen2, qwen3, qwen3_moe";

impl Family {
    /// From HF `model_type` (or GGUF `general.architecture`, which uses the same words).
    pub fn from_model_type(model_type: &str) -> Result<Self> {
        match model_type {
            "llama" | "mistral" | "smollm" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            // llama.cpp's architecture name has no underscore.
            "qwen3_moe" | "qwen3moe" => Ok(Self::Qwen3Moe),
            other => Err(ModelError::UnknownArchitecture { architecture: other.to_owned(), supported: SUPPORTED }),
        }
    }

    /// HF `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3_moe",
        }
    }

    /// HF `architectures[0]`.
    pub fn architecture(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Qwen3Moe => "Qwen3MoeForCausalLM",
        }
    }

    /// Per-head RMSNorm on q and k.
    fn qk_norm(self) -> bool {
        matches!(self, Self::Qwen3 | Self::Qwen3Moe)
    }
}

/// The sparse MLP of a mixture-of-experts model (transformers' `Qwen3MoeSparseMoeBlock`): a router (a linear map
/// from the hidden state to one logit per expert, no bias) whose softmax, taken in fp32, picks the top
/// `num_experts_per_tok` experts of each token; their SwiGLU MLPs (width `moe_intermediate_size`) are summed,
/// weighted by those probabilities (renormalised to sum 1 over the chosen ones when `norm_topk_prob`).
///
/// A separate struct rather than more family switches because which layers are sparse is itself configuration
/// (`mlp_only_layers`, `decoder_sparse_step`), and the next MoE families (Qwen2-MoE's shared expert) extend this
/// rather than the attention switches.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts per sparse layer (`num_experts`; transformers 5 writes it as `num_local_experts`).
    pub num_experts: i64,
    /// Experts each token is routed to (top-k).
    pub num_experts_per_tok: i64,
    /// Width of each expert's MLP.
    pub moe_intermediate_size: i64,
    /// Renormalise the chosen experts' probabilities to sum 1.
    pub norm_topk_prob: bool,
    /// Layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0` and it is not in `mlp_only_layers`.
    pub decoder_sparse_step: i64,
    /// Layers that keep a dense MLP of `intermediate_size`.
    pub mlp_only_layers: Vec<i64>,
    /// Weight of the load-balancing loss in transformers' training loss (kept for the trainer; the model crate
    /// only computes the loss, [`crate::load_balancing_loss`]).
    pub router_aux_loss_coef: f64,
    /// Whether the checkpoint asks for router logits (and so the load-balancing loss) during training.
    pub output_router_logits: bool,
}

impl MoeConfig {
    /// Whether layer `layer` has a sparse MLP.
    pub fn is_sparse(&self, layer: i64) -> bool {
        !self.mlp_only_layers.contains(&layer) && (layer + 1) % self.decoder_sparse_step == 0
    }
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's piecewise frequency scaling.
    Llama3 {
        /// Scale for low frequencies.
        factor: f64,
        /// Wavelength bound (as a divisor of the original context) below which frequencies are kept.
        low_freq_factor: f64,
        /// Wavelength bound above which frequencies are fully scaled.
        high_freq_factor: f64,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

/// Everything the decoder needs to know about its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Model family.
    pub family: Family,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: i64,
    /// Model width.
    pub hidden_size: i64,
    /// MLP width.
    pub intermediate_size: i64,
    /// Number of decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads (GQA when fewer than query heads).
    pub num_key_value_heads: i64,
    /// Per-head width (Qwen3 sets it independently of hidden/heads).
    pub head_dim: i64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Context length the model supports.
    pub max_position_embeddings: i64,
    /// Whether `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on q, k, v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama `attention_bias` sets both).
    pub o_bias: bool,
    /// Biases on the MLP projections (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// Per-head RMSNorm on q and k (Qwen3).
    pub qk_norm: bool,
    /// BOS id from the config (informational; the tokenizer decides what to add).
    pub bos_token_id: Option<i64>,
    /// EOS ids (a config may list several).
    pub eos_token_ids: Vec<i64>,
    /// The dtype the checkpoint declares (`torch_dtype` / `dtype`), e.g. `bfloat16`.
    pub torch_dtype: Option<String>,
    /// The mixture-of-experts MLPs, for [`Family::Qwen3Moe`] (always set there, never elsewhere).
    pub moe: Option<MoeConfig>,
}

fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a Value> {
    obj.get(key).ok_or_else(|| ModelError::Metadata { key: key.to_owned(), reason: "absent".into() })
}

fn get_i64(obj: &Map<String, Value>, key: &str) -> Result<i64> {
    get(obj, key)?
        .as_i64()
        .ok_or_else(|| ModelError::Metadata { key: key.to_owned(), reason: "expected an integer".into() })
}

fn opt_f64(obj: &Map<String, Value>, key: &str, default: f64) -> Result<f64> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => {
            v.as_f64().ok_or_else(|| ModelError::Metadata { key: key.to_owned(), reason: "expected a number".into() })
        }
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &str, default: bool) -> Result<bool> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => {
            v.as_bool().ok_or_else(|| ModelError::Metadata { key: key.to_owned(), reason: "expected a bool".into() })
        }
    }
}

fn ids(v: Option<&Value>) -> Vec<i64> {
    match v {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    }
}

/// Reads the JSON file at `path` and parses it with `parse`; a missing file, bad JSON or a bad key is an error
/// naming the file (and the key), whichever architecture's `config.json` it is.
pub(crate) fn read_config_json<T>(path: &Path, parse: impl FnOnce(&Value) -> Result<T>) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ModelError::MissingFile { path: path.to_path_buf() }
        } else {
            ModelError::io(path, e)
        }
    })?;
    let value: Value =
        serde_json::from_str(&text).map_err(|source| ModelError::Json { path: path.to_path_buf(), source })?;
    parse(&value).map_err(|e| match e {
        ModelError::Metadata { key, reason } => {
            ModelError::InvalidFile { path: path.to_path_buf(), reason: format!("`{key}` {reason}") }
        }
        other => ModelError::in_file(path, other),
    })
}

impl ModelConfig {
    /// Reads a `config.json` file.
    pub fn from_file(path: &Path) -> Result<Self> {
        read_config_json(path, Self::from_json)
    }

    /// Parses a `config.json` value.
    pub fn from_json(value: &Value) -> Result<Self> {
        let obj = value.as_object().ok_or_else(|| ModelError::Metadata {
            key: "config.json".into(),
            reason: "expected a JSON object".into(),
        })?;
        let model_type = get(obj, "model_type")?
            .as_str()
            .ok_or_else(|| ModelError::Metadata { key: "model_type".into(), reason: "expected a string".into() })?;
        let family = Family::from_model_type(model_type)?;
        let hidden_size = get_i64(obj, "hidden_size")?;
        let num_attention_heads = get_i64(obj, "num_attention_heads")?;
        let num_key_value_heads = match obj.get("num_key_value_heads") {
            Some(Value::Number(n)) => n.as_i64().unwrap_or(num_attention_heads),
            _ => num_attention_heads,
        };
        let head_dim = match obj.get("head_dim") {
            Some(Value::Number(n)) => n.as_i64(),
            _ => None,
        };
        let head_dim = derived_head_dim(head_dim, hidden_size, num_attention_heads, "num_attention_heads")?;
        // transformers 5 nests rope settings in `rope_parameters`; older configs use `rope_theta`/`rope_scaling`.
        let rope_obj = obj.get("rope_parameters").or_else(|| obj.get("rope_scaling")).and_then(Value::as_object);
        let rope_theta = match rope_obj.and_then(|r| r.get("rope_theta")).and_then(Value::as_f64) {
            Some(t) => t,
            None => opt_f64(obj, "rope_theta", 10000.0)?,
        };
        let rope_scaling = match rope_obj {
            None => RopeScaling::None,
            Some(r) => parse_rope_scaling(r)?,
        };
        if opt_bool(obj, "use_sliding_window", false)? {
            return Err(ModelError::UnsupportedConfig {
                key: "use_sliding_window".into(),
                reason: "sliding-window attention is not implemented".into(),
            });
        }
        let attention_bias = opt_bool(obj, "attention_bias", false)?;
        let (qkv_bias, o_bias) = match family {
            Family::Qwen2 => (true, false),
            Family::Llama | Family::Qwen3 | Family::Qwen3Moe => (attention_bias, attention_bias),
        };
        let moe = match family {
            Family::Qwen3Moe => Some(moe_from_json(obj)?),
            _ => None,
        };
        let config = Self {
            family,
            vocab_size: get_i64(obj, "vocab_size")?,
            hidden_size,
            intermediate_size: get_i64(obj, "intermediate_size")?,
            num_hidden_layers: get_i64(obj, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: opt_f64(obj, "rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_scaling,
            max_position_embeddings: obj.get("max_position_embeddings").and_then(Value::as_i64).unwrap_or(4096),
            tie_word_embeddings: opt_bool(obj, "tie_word_embeddings", false)?,
            qkv_bias,
            o_bias,
            // Only Llama reads `mlp_bias`: transformers builds Qwen2 and Qwen3 MLPs without biases whatever the
            // config says (and `to_json` writes the key for Llama alone).
            mlp_bias: opt_bool(obj, "mlp_bias", false)? && family == Family::Llama,
            qk_norm: family.qk_norm(),
            bos_token_id: obj.get("bos_token_id").and_then(Value::as_i64),
            eos_token_ids: ids(obj.get("eos_token_id")),
            torch_dtype: obj.get("dtype").or_else(|| obj.get("torch_dtype")).and_then(Value::as_str).map(str::to_owned),
            moe,
        };
        config.validate()?;
        Ok(config)
    }

    /// Builds the config from GGUF metadata (`<arch>.block_count` etc.). `tie_word_embeddings` follows from
    /// whether the file has an `output.weight` tensor: llama.cpp writes it only when it differs from the embedding.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let arch = gguf.require_str("general.architecture")?.to_owned();
        let family = Family::from_model_type(&arch)?;
        let key = |k: &str| format!("{arch}.{k}");
        // A count past i64::MAX saturates; `validate` refuses it with the key's name.
        let u = |k: &str| -> Result<i64> { Ok(i64::try_from(gguf.require_u64(&key(k))?).unwrap_or(i64::MAX)) };
        // f32 metadata is widened through its shortest decimal form, so 1e-5 stays 1e-5 (not 9.99999974e-6) in
        // the config.json we write.
        let f = |k: &str, default: f64| match gguf.get(&key(k)) {
            Some(crate::gguf::GgufValue::F32(v)) => v.to_string().parse().unwrap_or(f64::from(*v)),
            Some(v) => v.as_f64().unwrap_or(default),
            None => default,
        };
        let hidden_size = u("embedding_length")?;
        let num_attention_heads = u("attention.head_count")?;
        let num_key_value_heads = u("attention.head_count_kv").unwrap_or(num_attention_heads);
        let head_dim = gguf.get(&key("attention.key_length")).and_then(|v| v.as_i64());
        let head_dim = derived_head_dim(head_dim, hidden_size, num_attention_heads, &key("attention.head_count"))?;
        let vocab_size = match u("vocab_size") {
            Ok(v) => v,
            Err(_) => gguf
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map(|a| a.len() as i64)
                .ok_or_else(|| ModelError::Metadata { key: key("vocab_size"), reason: "absent".into() })?,
        };
        let rope_scaling = match gguf.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear { factor: f("rope.scaling.factor", 1.0) },
            Some(other) => {
                return Err(ModelError::UnsupportedConfig {
                    key: key("rope.scaling.type"),
                    reason: format!("rope scaling `{other}` is not implemented"),
                });
            }
        };
        let tok = |k: &str| gguf.get(k).and_then(|v| v.as_i64());
        let config = Self {
            family,
            vocab_size,
            hidden_size,
            intermediate_size: u("feed_forward_length")?,
            num_hidden_layers: u("block_count")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f("attention.layer_norm_rms_epsilon", 1e-6),
            rope_theta: f("rope.freq_base", 10000.0),
            rope_scaling,
            max_position_embeddings: u("context_length").unwrap_or(4096),
            tie_word_embeddings: gguf.tensor_info("output.weight").is_none(),
            qkv_bias: family == Family::Qwen2 || gguf.tensor_info("blk.0.attn_q.bias").is_some(),
            o_bias: gguf.tensor_info("blk.0.attn_output.bias").is_some(),
            mlp_bias: gguf.tensor_info("blk.0.ffn_up.bias").is_some(),
            qk_norm: family.qk_norm(),
            bos_token_id: tok("tokenizer.ggml.bos_token_id"),
            eos_token_ids: tok("tokenizer.ggml.eos_token_id").into_iter().collect(),
            torch_dtype: None,
            moe: match family {
                Family::Qwen3Moe => Some(moe_from_gguf(gguf, &arch, u("block_count")?)?),
                _ => None,
            },
        };
        config.validate().map_err(|e| match e {
            // GGUF metadata keys carry the architecture prefix (`llama.block_count`).
            ModelError::Metadata { key: k, reason } => ModelError::Metadata { key: gguf_key(&arch, &k), reason },
            other => other,
        })?;
        Ok(config)
    }

    /// Query heads per key/value head.
    pub fn gqa_groups(&self) -> i64 {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// The `config.json` transformers needs to rebuild this model, with `torch_dtype` set to `dtype`.
    pub fn to_json(&self, dtype: &str) -> Value {
        let mut v = json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": dtype,
            "use_cache": true,
        });
        let obj = v.as_object_mut();
        if let Some(obj) = obj {
            if self.family == Family::Llama {
                obj.insert("attention_bias".into(), json!(self.o_bias));
                obj.insert("mlp_bias".into(), json!(self.mlp_bias));
            }
            if matches!(self.family, Family::Qwen3 | Family::Qwen3Moe) {
                obj.insert("attention_bias".into(), json!(self.qkv_bias));
            }
            if let Some(moe) = &self.moe {
                for (key, value) in [
                    ("num_experts", json!(moe.num_experts)),
                    ("num_experts_per_tok", json!(moe.num_experts_per_tok)),
                    ("moe_intermediate_size", json!(moe.moe_intermediate_size)),
                    ("norm_topk_prob", json!(moe.norm_topk_prob)),
                    ("decoder_sparse_step", json!(moe.decoder_sparse_step)),
                    ("mlp_only_layers", json!(moe.mlp_only_layers)),
                    ("router_aux_loss_coef", json!(moe.router_aux_loss_coef)),
                    ("output_router_logits", json!(moe.output_router_logits)),
                ] {
                    obj.insert(key.into(), value);
                }
            }
            if let Some(b) = self.bos_token_id {
                obj.insert("bos_token_id".into(), json!(b));
            }
            match self.eos_token_ids.as_slice() {
                [] => {}
                [one] => {
                    obj.insert("eos_token_id".into(), json!(one));
                }
                many => {
                    obj.insert("eos_token_id".into(), json!(many));
                }
            }
            let scaling = match &self.rope_scaling {
                RopeScaling::None => Value::Null,
                RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
                RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                    json!({
                        "rope_type": "llama3",
                        "factor": factor,
                        "low_freq_factor": low_freq_factor,
                        "high_freq_factor": high_freq_factor,
                        "original_max_position_embeddings": original_max_position_embeddings,
                    })
                }
            };
            obj.insert("rope_scaling".into(), scaling);
        }
        v
    }
}

/// Upper bounds on each dimension. No released model comes near them (the largest vocabularies are ~256k tokens,
/// the widest models ~25k); a value past one is a corrupt or crafted file, refused before anything is sized
/// from it.
const MAX_VOCAB: i64 = 1 << 24;
const MAX_WIDTH: i64 = 1 << 17;
const MAX_FFN: i64 = 1 << 20;
const MAX_LAYERS: i64 = 1 << 12;
const MAX_HEADS: i64 = 1 << 12;
const MAX_HEAD_DIM: i64 = 1 << 12;
const MAX_CONTEXT: i64 = 1 << 24;

fn out_of_range(key: &str, reason: String) -> ModelError {
    ModelError::Metadata { key: key.to_owned(), reason }
}

/// `value` must lie in `1..=max`.
fn check_dim(key: &str, value: i64, max: i64) -> Result<()> {
    if (1..=max).contains(&value) {
        Ok(())
    } else {
        Err(out_of_range(key, format!("must be between 1 and {max}, found {value}")))
    }
}

/// `value` must be a finite number above zero.
fn check_positive(key: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(out_of_range(key, format!("must be a finite number above 0, found {value}")))
    }
}

/// The per-head width: as given, else `hidden / heads` (checking `heads` first, so a crafted `0` is an error
/// naming `heads_key` rather than a division by zero).
fn derived_head_dim(given: Option<i64>, hidden: i64, heads: i64, heads_key: &str) -> Result<i64> {
    match given {
        Some(head_dim) => Ok(head_dim),
        None => {
            check_dim(heads_key, heads, MAX_HEADS)?;
            Ok(hidden / heads)
        }
    }
}

/// The GGUF metadata key of a `config.json` field, for errors about a GGUF file.
fn gguf_key(arch: &str, field: &str) -> String {
    let key = match field {
        "hidden_size" => "embedding_length",
        "intermediate_size" => "feed_forward_length",
        "num_hidden_layers" => "block_count",
        "num_attention_heads" => "attention.head_count",
        "num_key_value_heads" => "attention.head_count_kv",
        "head_dim" => "attention.key_length",
        "max_position_embeddings" => "context_length",
        "rms_norm_eps" => "attention.layer_norm_rms_epsilon",
        "rope_theta" => "rope.freq_base",
        "vocab_size" => "vocab_size",
        "num_experts" => "expert_count",
        "num_experts_per_tok" => "expert_used_count",
        "moe_intermediate_size" => "expert_feed_forward_length",
        other if other.starts_with(&format!("{arch}.")) => return other.to_owned(),
        other => other,
    };
    format!("{arch}.{key}")
}

impl ModelConfig {
    /// Refuses dimensions the decoder cannot be built from: zero, negative or absurdly large sizes, heads that do
    /// not divide, an odd head width (RoPE rotates halves), non-finite norms and RoPE settings. Every error names
    /// the `config.json` key.
    pub fn validate(&self) -> Result<()> {
        check_dim("vocab_size", self.vocab_size, MAX_VOCAB)?;
        check_dim("hidden_size", self.hidden_size, MAX_WIDTH)?;
        check_dim("intermediate_size", self.intermediate_size, MAX_FFN)?;
        check_dim("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS)?;
        check_dim("num_attention_heads", self.num_attention_heads, MAX_HEADS)?;
        check_dim("num_key_value_heads", self.num_key_value_heads, self.num_attention_heads)?;
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(out_of_range(
                "num_key_value_heads",
                format!(
                    "{} query heads are not a multiple of {} key/value heads",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        check_dim("head_dim", self.head_dim, MAX_HEAD_DIM)?;
        if self.head_dim % 2 != 0 {
            return Err(out_of_range(
                "head_dim",
                format!("must be even (RoPE rotates halves), found {}", self.head_dim),
            ));
        }
        check_dim("max_position_embeddings", self.max_position_embeddings, MAX_CONTEXT)?;
        check_positive("rms_norm_eps", self.rms_norm_eps)?;
        if let Some(moe) = &self.moe {
            moe.validate(self.num_hidden_layers)?;
        }
        check_positive("rope_theta", self.rope_theta)?;
        match self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => check_positive("rope_scaling.factor", factor)?,
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                check_positive("rope_scaling.factor", factor)?;
                check_positive("rope_scaling.low_freq_factor", low_freq_factor)?;
                check_positive("rope_scaling.high_freq_factor", high_freq_factor)?;
                check_positive("rope_scaling.original_max_position_embeddings", original_max_position_embeddings)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(out_of_range(
                        "rope_scaling.high_freq_factor",
                        format!("must exceed low_freq_factor ({low_freq_factor}), found {high_freq_factor}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

const MAX_EXPERTS: i64 = 1 << 12;

impl MoeConfig {
    fn validate(&self, layers: i64) -> Result<()> {
        check_dim("num_experts", self.num_experts, MAX_EXPERTS)?;
        check_dim("num_experts_per_tok", self.num_experts_per_tok, self.num_experts)?;
        check_dim("moe_intermediate_size", self.moe_intermediate_size, MAX_FFN)?;
        check_dim("decoder_sparse_step", self.decoder_sparse_step, MAX_LAYERS)?;
        if let Some(bad) = self.mlp_only_layers.iter().find(|&&l| !(0..layers).contains(&l)) {
            return Err(out_of_range("mlp_only_layers", format!("layer {bad} is not in 0..{layers}")));
        }
        if !self.router_aux_loss_coef.is_finite() || self.router_aux_loss_coef < 0.0 {
            return Err(out_of_range(
                "router_aux_loss_coef",
                format!("must be a finite number of at least 0, found {}", self.router_aux_loss_coef),
            ));
        }
        Ok(())
    }
}

/// The MoE keys of a Qwen3-MoE `config.json`, with transformers' defaults where a key is absent.
fn moe_from_json(obj: &Map<String, Value>) -> Result<MoeConfig> {
    let num_experts = match obj.get("num_experts").filter(|v| !v.is_null()) {
        Some(_) => get_i64(obj, "num_experts")?,
        None => get_i64(obj, "num_local_experts")?,
    };
    let opt_i64 = |key: &str, default: i64| match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => {
            v.as_i64().ok_or_else(|| ModelError::Metadata { key: key.to_owned(), reason: "expected an integer".into() })
        }
    };
    let mlp_only_layers = match obj.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| {
                v.as_i64().ok_or_else(|| ModelError::Metadata {
                    key: "mlp_only_layers".into(),
                    reason: "expected a list of layer indices".into(),
                })
            })
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(ModelError::Metadata {
                key: "mlp_only_layers".into(),
                reason: "expected a list of layer indices".into(),
            });
        }
    };
    Ok(MoeConfig {
        num_experts,
        num_experts_per_tok: opt_i64("num_experts_per_tok", 8)?,
        moe_intermediate_size: get_i64(obj, "moe_intermediate_size")?,
        norm_topk_prob: opt_bool(obj, "norm_topk_prob", false)?,
        decoder_sparse_step: opt_i64("decoder_sparse_step", 1)?,
        mlp_only_layers,
        router_aux_loss_coef: opt_f64(obj, "router_aux_loss_coef", 0.001)?,
        output_router_logits: opt_bool(obj, "output_router_logits", false)?,
    })
}

/// The MoE shape of a llama.cpp `qwen3moe` file: `expert_count`, `expert_used_count`,
/// `expert_feed_forward_length`. llama.cpp renormalises the top-k weights of every Qwen3-MoE (there is no
/// metadata key for it) and makes a layer dense only by leaving out its router, so a layer without
/// `blk.N.ffn_gate_inp.weight` is listed in `mlp_only_layers`.
fn moe_from_gguf(gguf: &GgufFile, arch: &str, layers: i64) -> Result<MoeConfig> {
    let u =
        |k: &str| -> Result<i64> { Ok(i64::try_from(gguf.require_u64(&format!("{arch}.{k}"))?).unwrap_or(i64::MAX)) };
    let mlp_only_layers = (0..layers.min(MAX_LAYERS))
        .filter(|i| gguf.tensor_info(&format!("blk.{i}.ffn_gate_inp.weight")).is_none())
        .collect();
    Ok(MoeConfig {
        num_experts: u("expert_count")?,
        num_experts_per_tok: u("expert_used_count")?,
        moe_intermediate_size: u("expert_feed_forward_length")?,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers,
        router_aux_loss_coef: 0.001,
        output_router_logits: false,
    })
}

fn parse_rope_scaling(r: &Map<String, Value>) -> Result<RopeScaling> {
    let ty = r.get("rope_type").or_else(|| r.get("type")).and_then(Value::as_str).unwrap_or("default");
    let num = |k: &str| {
        r.get(k).and_then(Value::as_f64).ok_or_else(|| ModelError::Metadata {
            key: format!("rope_scaling.{k}"),
            reason: "absent or not a number".into(),
        })
    };
    match ty {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: num("factor")? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        }),
        other => Err(ModelError::UnsupportedConfig {
            key: "rope_scaling.rope_type".into(),
            reason: format!("`{other}` is not implemented (default, linear and llama3 are)"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({
            "model_type": "qwen2", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
            "rope_theta": 1e6, "tie_word_embeddings": true, "eos_token_id": [1, 2]
        })
    }

    #[test]
    fn parses_qwen2_and_round_trips() {
        let c = ModelConfig::from_json(&base()).unwrap();
        assert_eq!(c.family, Family::Qwen2);
        assert!(c.qkv_bias && !c.o_bias && !c.qk_norm);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.gqa_groups(), 2);
        assert_eq!(c.eos_token_ids, vec![1, 2]);
        let again = ModelConfig::from_json(&c.to_json("float32")).unwrap();
        assert_eq!(ModelConfig { torch_dtype: None, ..again }, c);
    }

    #[test]
    fn llama3_rope_scaling_and_unknown_architecture() {
        let mut v = base();
        v["model_type"] = json!("llama");
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let c = ModelConfig::from_json(&v).unwrap();
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        assert_eq!(ModelConfig::from_json(&c.to_json("float32")).unwrap().rope_scaling, c.rope_scaling);
        v["model_type"] = json!("gpt_neox");
        let err = ModelConfig::from_json(&v).unwrap_err();
        assert!(matches!(err, ModelError::UnknownArchitecture { ref architecture, .. } if architecture == "gpt_neox"));
        v["model_type"] = json!("llama");
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        assert!(matches!(ModelConfig::from_json(&v), Err(ModelError::UnsupportedConfig { .. })));
    }

    #[test]
    fn zero_and_absurd_dimensions_are_named_errors() {
        let cases: [(&str, Value); 10] = [
            ("num_attention_heads", json!(0)),
            ("num_attention_heads", json!(-4)),
            ("num_key_value_heads", json!(0)),
            ("num_key_value_heads", json!(3)),
            ("hidden_size", json!(0)),
            ("vocab_size", json!(i64::MAX)),
            ("num_hidden_layers", json!(1_000_000_000)),
            ("head_dim", json!(7)),
            ("rms_norm_eps", json!(-1.0)),
            ("max_position_embeddings", json!(0)),
        ];
        for (key, value) in cases {
            let mut v = base();
            v[key] = value.clone();
            let err = ModelConfig::from_json(&v).unwrap_err();
            assert!(matches!(err, ModelError::Metadata { key: ref k, .. } if k == key), "{key} = {value}: {err}");
        }
        let mut v = base();
        v["rope_theta"] = json!(0.0);
        assert!(ModelConfig::from_json(&v).unwrap_err().to_string().contains("rope_theta"));
    }

    /// Found by the `hf_config` fuzz target's round-trip check: a Qwen2 config with `mlp_bias: true` expected
    /// MLP biases that neither transformers nor our own `to_json` know of.
    #[test]
    fn mlp_bias_is_llama_only() {
        let mut v = base();
        v["mlp_bias"] = json!(true);
        let c = ModelConfig::from_json(&v).unwrap();
        assert!(!c.mlp_bias);
        assert_eq!(ModelConfig::from_json(&c.to_json("float32")).unwrap().mlp_bias, c.mlp_bias);
        v["model_type"] = json!("llama");
        assert!(ModelConfig::from_json(&v).unwrap().mlp_bias);
    }

    fn qwen3_moe() -> Value {
        let mut v = base();
        v["model_type"] = json!("qwen3_moe");
        v["head_dim"] = json!(8);
        v["num_local_experts"] = json!(4);
        v["num_experts_per_tok"] = json!(2);
        v["moe_intermediate_size"] = json!(8);
        v["norm_topk_prob"] = json!(true);
        v["mlp_only_layers"] = json!([1]);
        v
    }

    #[test]
    fn qwen3_moe_parses_and_round_trips() {
        let c = ModelConfig::from_json(&qwen3_moe()).unwrap();
        assert_eq!(c.family, Family::Qwen3Moe);
        assert!(c.qk_norm && !c.qkv_bias);
        let moe = c.moe.clone().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size), (4, 2, 8));
        assert!(moe.norm_topk_prob && moe.is_sparse(0) && !moe.is_sparse(1));
        let json = c.to_json("bfloat16");
        assert_eq!(json["architectures"][0], "Qwen3MoeForCausalLM");
        assert_eq!(json["num_experts"], 4);
        let again = ModelConfig::from_json(&json).unwrap();
        assert_eq!(ModelConfig { torch_dtype: None, ..again }, c);
        // Every other layer sparse: 1, 3, ...
        let step = MoeConfig { decoder_sparse_step: 2, mlp_only_layers: vec![], ..moe };
        assert_eq!((0..4).map(|l| step.is_sparse(l)).collect::<Vec<_>>(), [false, true, false, true]);
        assert!(ModelConfig::from_json(&base()).unwrap().moe.is_none());
    }

    #[test]
    fn bad_moe_keys_are_named() {
        let cases: [(&str, Value); 5] = [
            ("num_experts_per_tok", json!(5)),
            ("num_experts_per_tok", json!(0)),
            ("moe_intermediate_size", json!(0)),
            ("mlp_only_layers", json!([2])),
            ("decoder_sparse_step", json!(0)),
        ];
        for (key, value) in cases {
            let mut v = qwen3_moe();
            v[key] = value.clone();
            let err = ModelConfig::from_json(&v).unwrap_err();
            assert!(matches!(err, ModelError::Metadata { key: ref k, .. } if k == key), "{key} = {value}: {err}");
        }
        let mut v = qwen3_moe();
        v.as_object_mut().unwrap().remove("moe_intermediate_size");
        assert!(ModelConfig::from_json(&v).unwrap_err().to_string().contains("moe_intermediate_size"));
    }

    #[test]
    fn missing_key_is_named() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("hidden_size");
        let err = ModelConfig::from_json(&v).unwrap_err();
        assert!(err.to_string().contains("`hidden_size`"), "{err}");
    }
}
