//! `model:` — the policy model and its length limits.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The model being trained, and the sampling defaults every taskset inherits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// A Hugging Face model directory or a `.gguf` file.
    pub model_path: String,
    /// Model the critic (value head) starts from; empty means `model_path`.
    pub critic_model_path: String,
    /// Chat template (Jinja) that replaces the model's own.
    pub custom_chat_template: Option<String>,
    /// File holding a chat template that replaces the model's own; wins over `custom_chat_template`.
    pub chat_template_path: Option<String>,
    /// Default sampling temperature of rollouts.
    pub temperature: f64,
    /// Default nucleus-sampling mass of rollouts.
    pub top_p: f64,
    /// Default top-k of rollouts; -1 disables it.
    pub top_k: i64,
    /// Number of top logprobs returned per token besides the sampled one; only 0 is supported.
    pub logprobs: u32,
    /// Longest prompt + response, in tokens. Unset: `max_prompt_tokens + max_response_tokens`.
    pub max_model_len: Option<u32>,
    /// Longest prompt, in tokens, with `enable_prompt_truncation` (without it a prompt may fill `max_model_len`
    /// but one token, as vLLM allows). Unset: derived from the other two limits.
    pub max_prompt_tokens: Option<u32>,
    /// Longest response, in tokens, of a model call that names no `max_tokens` (a taskset's
    /// `rollout_args.max_tokens` may not exceed it); a Python workflow's or an OpenAI client's own `max_tokens` is
    /// bounded by `max_model_len` alone, as Trinity-RFT's vLLM engine has it. Unset: derived from the other two
    /// limits.
    pub max_response_tokens: Option<u32>,
    /// Shortest response before end-of-sequence may be sampled.
    pub min_response_tokens: u32,
    /// A prompt longer than `max_prompt_tokens` gets Trinity-RFT's masked placeholders (nothing in them trained)
    /// instead of a rollout; off, it is sampled whole while it fits in `max_model_len`.
    pub enable_prompt_truncation: bool,
    /// Penalty on repeated tokens; trinity's sampler has none, so only 1.0 (off) is accepted.
    pub repetition_penalty: f64,
    /// Passed to chat templates that understand it (Qwen3).
    pub enable_thinking: Option<bool>,
    /// Overrides the model's `rope_scaling` from config.json.
    pub rope_scaling: Option<Value>,
    /// Overrides the model's `rope_theta` from config.json.
    pub rope_theta: Option<f64>,
    /// Trinity-RFT lets transformers run model code shipped with a checkpoint; trinity never runs Python,
    /// so only `false` is accepted.
    pub trust_remote_code: bool,
    /// A hosted model behind an OpenAI-compatible endpoint, evaluated in mode `bench` instead of a local one;
    /// `model_path` is then only the run's name for it.
    pub external_model: ExternalModelConfig,
    /// LoRA: train adapters on the projections instead of every weight (one entry, as in Trinity-RFT).
    pub lora_configs: Option<Vec<LoraConfig>>,
    /// vLLM shards LoRA computation over tensor-parallel ranks; trinity merges the adapter into the rollout
    /// model's weights instead.
    pub fully_sharded_loras: bool,
    /// vLLM's cache of adapters in host memory; trinity serves one adapter, merged.
    pub max_cpu_loras: Option<u32>,
    /// The three length limits as resolution derived them; what the run reads (see [`ModelLengths`]).
    #[serde(skip)]
    pub resolved: ModelLengths,
}

/// A model's length limits after resolution, none of them optional: the resolver derives the missing ones from the
/// others (Trinity-RFT's `_check_model_len`) and refuses a config where it cannot, so a run never has to guess one.
///
/// The `Option` fields beside it keep the file's shape: `None` is "not written", which resolution must tell from a
/// value (a stage re-resolves the config as written; `--dry-run` prints the derived values in them). This view is
/// built once, by the resolver, from those fields; it is not read from or written to a file. An unresolved config
/// (`ModelConfig::default()`) holds zeros here, which no resolved one does (`max_model_len` is at least 2, the
/// other two at least 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelLengths {
    /// Longest prompt + response, in tokens.
    pub max_model_len: u32,
    /// Longest prompt, in tokens.
    pub max_prompt_tokens: u32,
    /// Longest response, in tokens.
    pub max_response_tokens: u32,
}

/// `model.lora_configs[i]`: Trinity-RFT's `LoRAConfig`. The trainer trains adapters `A` `[r, in]` and `B`
/// `[out, r]` on the selected projections (base weights frozen); the rollout engine generates with the adapters
/// merged into its weights; checkpoints hold the adapter as a PEFT directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapter's name in vLLM's model list.
    pub name: Option<String>,
    /// A PEFT adapter directory to start from (its own rank, alpha and modules apply); unset: fresh adapters
    /// (`A` Kaiming-uniform, `B` zero).
    pub path: Option<String>,
    /// The base model's name in vLLM's model list.
    pub base_model_name: Option<String>,
    /// The adapters' rank `r`.
    pub lora_rank: u32,
    /// The adapters' `alpha`: their update is scaled by `alpha / r`.
    pub lora_alpha: u32,
    /// vLLM's dtype for LoRA weights in the rollout engine.
    pub lora_dtype: String,
    /// Projections to adapt: `all-linear` (q/k/v/o, gate/up/down), a list of module names (`[q_proj, v_proj]`,
    /// matched as a name or a dotted suffix) or a regular expression the whole module name must match.
    pub target_modules: Value,
    /// Projections to leave alone, spelled like `target_modules`.
    pub exclude_modules: Option<Value>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            name: None,
            path: None,
            base_model_name: None,
            lora_rank: 32,
            lora_alpha: 32,
            lora_dtype: "auto".to_owned(),
            target_modules: Value::String("all-linear".to_owned()),
            exclude_modules: None,
        }
    }
}

impl ModelConfig {
    /// The LoRA adapter the run trains (the first and only entry of `lora_configs`), if any.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora_configs.as_ref().and_then(|l| l.first())
    }
}

/// `model.external_model`: Trinity-RFT's `ExternalModelConfig`. The endpoint's address and key come from the
/// environment, by variable name, so that neither is written into a config, a log or a resolved dump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ExternalModelConfig {
    /// Evaluate the endpoint instead of `model.model_path` (mode `bench` only, as in Trinity-RFT).
    pub enable: bool,
    /// The `model` every request names (required when enabled).
    pub model_name: Option<String>,
    /// The environment variable holding the endpoint's base URL, as the `openai` client takes it
    /// (`https://api.openai.com/v1`): requests go to `<base URL>/chat/completions`.
    pub base_url_env: String,
    /// The environment variable holding the API key, sent as `Authorization: Bearer <key>` and never logged or
    /// written.
    pub api_key_env: String,
}

impl Default for ExternalModelConfig {
    fn default() -> Self {
        ExternalModelConfig {
            enable: false,
            model_name: None,
            base_url_env: "OPENAI_BASE_URL".to_owned(),
            api_key_env: "OPENAI_API_KEY".to_owned(),
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            model_path: String::new(),
            critic_model_path: String::new(),
            custom_chat_template: None,
            chat_template_path: None,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            logprobs: 0,
            max_model_len: None,
            max_prompt_tokens: None,
            max_response_tokens: None,
            min_response_tokens: 0,
            enable_prompt_truncation: true,
            repetition_penalty: 1.0,
            enable_thinking: None,
            rope_scaling: None,
            rope_theta: None,
            trust_remote_code: false,
            external_model: ExternalModelConfig::default(),
            lora_configs: None,
            fully_sharded_loras: false,
            max_cpu_loras: None,
            resolved: ModelLengths::default(),
        }
    }
}

/// `cluster:` — the machines a run uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Trinity-RFT's Ray address; trinity has no Ray.
    pub ray_address: String,
    /// Trinity-RFT's number of nodes in its Ray cluster; trinity's processes come from the launcher (torchrun,
    /// `trinity launch`), one machine without one.
    pub node_num: u32,
    /// GPUs per node in Trinity-RFT's Ray cluster; trinity runs one process per device under a launcher (the
    /// trainer data-parallel), else explorer and trainer on one device, CUDA when present, else CPU.
    pub gpu_per_node: u32,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig { ray_address: "auto".to_owned(), node_num: 1, gpu_per_node: 8 }
    }
}
