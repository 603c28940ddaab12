//! `explorer:` — rollout workers, evaluation cadence and the generation engine.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The explorer: runs workflows against the rollout model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ExplorerConfig {
    /// Name used in logs and metrics.
    pub name: String,
    /// Workflow instances running at once per rollout engine; their requests are batched together.
    pub runner_per_model: u32,
    /// Seconds one task may run before it is abandoned (and retried).
    pub max_timeout: u64,
    /// Retries of a task that failed or timed out; after that it is counted as failed and skipped.
    pub max_retry_times: u32,
    /// Environment variables visible to workflows.
    pub env_vars: Map<String, Value>,
    /// Evaluate the eval tasksets every this many explore steps.
    pub eval_interval: u64,
    /// Also evaluate before the first step.
    pub eval_on_startup: bool,
    /// In `bench` mode, evaluate only the latest checkpoint.
    pub bench_on_latest_checkpoint: bool,
    /// The generation engine serving rollouts.
    pub rollout_model: RolloutModelConfig,
    /// Address the `serve` mode listens on.
    pub listen_address: String,
    /// Port of the `serve` mode's OpenAI-compatible API.
    pub proxy_port: u16,
}

impl Default for ExplorerConfig {
    fn default() -> Self {
        ExplorerConfig {
            name: "explorer".to_owned(),
            runner_per_model: 8,
            max_timeout: 1800,
            max_retry_times: 2,
            env_vars: Map::new(),
            eval_interval: 100,
            eval_on_startup: true,
            bench_on_latest_checkpoint: false,
            rollout_model: RolloutModelConfig::default(),
            listen_address: "0.0.0.0".to_owned(),
            proxy_port: 8010,
        }
    }
}

/// The rollout engine. trinity runs its own libtorch engine; Trinity-RFT's vLLM tuning knobs are accepted
/// for compatibility and reported as having no effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutModelConfig {
    /// `vllm` and `vllm_async` (Trinity-RFT's names) and `native` all select trinity's engine.
    pub engine_type: String,
    /// Rollout engines; one per device, so only 1 is supported.
    pub engine_num: u32,
    /// Tensor-parallel degree; only 1 is supported.
    pub tensor_parallel_size: u32,
    /// Weight dtype of the rollout engine: `bfloat16`, `float16` or `float32`.
    pub dtype: String,
    /// Seed of the rollout sampler.
    pub seed: u64,
    /// Chat template that replaces the model's own for rollouts.
    pub chat_template: Option<String>,
    /// Passed to chat templates that understand it (Qwen3).
    pub enable_thinking: Option<bool>,
    /// Record every request and response (for the `serve` mode).
    pub enable_history: bool,
    /// Expose the engine over an OpenAI-compatible API to workflows.
    pub enable_openai_api: bool,
    /// Never stop at end-of-sequence (length benchmarks).
    pub ignore_eos: bool,
    /// Fraction of device memory the engine's KV cache may take.
    pub gpu_memory_utilization: f64,
    /// vLLM knob; no effect in trinity.
    pub use_v1: Option<bool>,
    /// vLLM knob; no effect in trinity.
    pub enforce_eager: Option<bool>,
    /// vLLM knob; no effect in trinity.
    pub enable_prefix_caching: Option<bool>,
    /// vLLM knob; no effect in trinity.
    pub enable_chunked_prefill: Option<bool>,
}

impl Default for RolloutModelConfig {
    fn default() -> Self {
        RolloutModelConfig {
            engine_type: "vllm".to_owned(),
            engine_num: 1,
            tensor_parallel_size: 1,
            dtype: "bfloat16".to_owned(),
            seed: 42,
            chat_template: None,
            enable_thinking: None,
            enable_history: false,
            enable_openai_api: false,
            ignore_eos: false,
            gpu_memory_utilization: 0.9,
            use_v1: None,
            enforce_eager: None,
            enable_prefix_caching: None,
            enable_chunked_prefill: None,
        }
    }
}
