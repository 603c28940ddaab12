//! `explorer:` — rollout workers, evaluation cadence and the generation engine.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::model::ModelLengths;

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
    /// Environment variables for the workflows' processes, as Trinity-RFT sets them on its workflow runners: here
    /// the environment of `agent_process_workflow` programs (strings, numbers or booleans).
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
    /// Deprecated Trinity-RFT spelling of `runner_per_model × engine_num`.
    pub runner_num: Option<u32>,
    /// How Trinity-RFT runs the repeats of a non-batched workflow (`sequential`, `asynchronous`,
    /// `multi-threading`).
    pub concurrent_mode: String,
    /// Largest number of a task's repeats one runner takes; Trinity-RFT splits bigger groups across runners.
    pub max_repeat_times_per_runner: Option<u32>,
    /// Models besides the policy that workflows call (judges, teachers), each on an engine of its own and never
    /// trained; workflows take them in this order (Trinity-RFT's `auxiliary_models[0]` is the first).
    pub auxiliary_models: Vec<AuxiliaryModelConfig>,
    /// End a train step before its slowest tasks are done (Trinity-RFT 0.6.0's over-rollout); needs a
    /// `sync_style` other than `fixed`.
    pub over_rollout: OverRolloutConfig,
    /// Adapt the task timeout to the observed task time.
    pub dynamic_timeout: DynamicTimeoutConfig,
    /// Seconds between the `serve` mode's checks for new weights.
    pub service_status_check_interval: u64,
    /// Rollout engines the `serve` mode keeps serving while others reload weights.
    pub min_running_model_num: u32,
    /// Database of the `serve` mode's request history.
    pub db_url: Option<String>,
    /// Seconds between runner state reports in the log; 0 disables them.
    pub runner_state_report_interval: u64,
    /// Runners preparing at once (newer Trinity-RFT).
    pub runner_prepare_concurrency: u32,
    /// Retries of a runner's preparation (newer Trinity-RFT).
    pub runner_prepare_max_retries: u32,
    /// With `synchronizer.sync_style: fully_async`, the train batches the explorer keeps in flight (submitted and
    /// not yet stored) at once; at the limit it first finishes the oldest (Trinity-RFT 0.6.0).
    pub max_inflight_batches: u32,
    /// The model budget of each task of a Python workflow (a Trinity-RFT workflow class run by trinity's Python
    /// workflow host), as a WASM workflow plugin's `plugins:` entry sets one.
    pub python_workflows: PythonWorkflowLimits,
}

/// `explorer.python_workflows`: what one attempt of a task of a Python workflow may ask of the model, over every
/// model wrapper it holds (`self.model`, its clones and the auxiliary models' wrappers) and every OpenAI client
/// they hand out (`get_openai_client`, `get_openai_async_client`, `self.auxiliary_models`: a chat completion of
/// `n` choices is one call, a completions request one call per prompt; the request past a limit gets a 429 the
/// client raises as `RateLimitError`, without retrying). `max_timeout`
/// bounds how long an attempt runs; this bounds the engine work it asks for, so that a runaway loop cannot keep
/// the engine busy, at the other tasks' expense, until its timeout. The call past either limit raises
/// `ModelBudgetExceeded` (a `RuntimeError`) in the workflow, later calls raise it too, and the task fails, as a
/// WASM workflow's does, whatever the workflow does with the exception.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PythonWorkflowLimits {
    /// Most generation calls (`chat`, `generate`: one per prompt; and their async forms) one task attempt may
    /// make (default 1024, a WASM plugin's).
    pub max_model_calls: u32,
    /// Most tokens the model may generate for one task attempt, over all its calls and samples (default
    /// 4194304, a WASM plugin's).
    pub max_model_tokens: u64,
}

impl Default for PythonWorkflowLimits {
    fn default() -> Self {
        PythonWorkflowLimits { max_model_calls: 1024, max_model_tokens: 1 << 22 }
    }
}

/// `explorer.over_rollout`: do not wait for the slowest tasks of a train step. Once `ceil(batch_size × (1 −
/// ratio))` of its tasks are done (succeeded or failed for good), the step waits `wait_after_min` seconds more,
/// then cancels the tasks still running and trains on what is done; evaluations always wait for every task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OverRolloutConfig {
    /// Fraction of a step's tasks the explorer may leave unfinished, in [0, 1); 0 waits for all.
    pub ratio: f64,
    /// Seconds to wait for stragglers once the required tasks are done.
    pub wait_after_min: f64,
    /// Keep the finished repeats of an unfinished task; for a Python workflow class that cannot repeat, also run
    /// a task's other repeats after one raised (Trinity-RFT 0.6.0's runner's `collect_partial_runs`).
    pub return_partial_tasks: bool,
}

impl Default for OverRolloutConfig {
    fn default() -> Self {
        OverRolloutConfig { ratio: 0.0, wait_after_min: 30.0, return_partial_tasks: false }
    }
}

/// `explorer.dynamic_timeout`: a task timeout that follows the observed task time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DynamicTimeoutConfig {
    /// An attempt of a task may take `min(max_timeout, ratio × mean task time)`, the mean over the train tasks
    /// done so far, once `warmup_min_steps` train steps ended with every task done.
    pub enable: bool,
    /// Multiple of the mean task time.
    pub ratio: f64,
    /// Train steps with every task done before the timeout adapts (Trinity-RFT 0.6.0).
    pub warmup_min_steps: u32,
}

impl Default for DynamicTimeoutConfig {
    fn default() -> Self {
        DynamicTimeoutConfig { enable: false, ratio: 3.0, warmup_min_steps: 1 }
    }
}

impl ExplorerConfig {
    /// `env_vars` as (name, value) pairs: strings as they are, numbers and booleans as YAML writes them (the
    /// resolver refuses anything else).
    pub fn environment(&self) -> Vec<(String, String)> {
        self.env_vars
            .iter()
            .map(|(name, value)| {
                let value = match value {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                (name.clone(), value)
            })
            .collect()
    }
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
            // Trinity-RFT listens on every interface by default; an unauthenticated server that generates and
            // takes rewards is loopback-only unless the config asks otherwise.
            listen_address: "127.0.0.1".to_owned(),
            proxy_port: 8010,
            runner_num: None,
            concurrent_mode: "sequential".to_owned(),
            max_repeat_times_per_runner: None,
            auxiliary_models: Vec::new(),
            over_rollout: OverRolloutConfig::default(),
            dynamic_timeout: DynamicTimeoutConfig::default(),
            service_status_check_interval: 60,
            min_running_model_num: 1,
            db_url: None,
            runner_state_report_interval: 0,
            runner_prepare_concurrency: 128,
            runner_prepare_max_retries: 3,
            max_inflight_batches: 2,
            python_workflows: PythonWorkflowLimits::default(),
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
    /// Trinity-RFT's number of rollout engines; trinity runs one engine and batches concurrent requests in it.
    pub engine_num: u32,
    /// Tensor-parallel degree of Trinity-RFT's engines; trinity's engine runs on one device.
    pub tensor_parallel_size: u32,
    /// Weight dtype of the rollout engine: `bfloat16`, `float16` or `float32`; `bfloat16` runs with fp32 weights on
    /// a CPU without native bf16 (libtorch would emulate it many times slower).
    pub dtype: String,
    /// Seed of the rollout sampler.
    pub seed: u64,
    /// Chat template that replaces the model's own for rollouts.
    pub chat_template: Option<String>,
    /// Passed to chat templates that understand it (Qwen3).
    pub enable_thinking: Option<bool>,
    /// Record every reply workflows receive over the OpenAI-compatible API (`enable_openai_api`), filed under the
    /// workflow run that asked, so agent workflows (`agent_process_workflow`) train on exactly those tokens.
    pub enable_history: bool,
    /// Serve the rollout model (and the auxiliary models, by name) to workflows over an OpenAI-compatible API on
    /// a loopback port, through the same engine; each workflow run gets a base URL of its own.
    pub enable_openai_api: bool,
    /// Never stop at end-of-sequence (length benchmarks).
    pub ignore_eos: bool,
    /// Fraction of device memory the engine's KV cache may take.
    pub gpu_memory_utilization: f64,
    /// vLLM knob; no effect in trinity.
    pub use_v1: Option<bool>,
    /// vLLM knob; no effect in trinity.
    pub enforce_eager: Option<bool>,
    /// vLLM's automatic prefix caching; trinity's engine always caches prompt starts, so no effect.
    pub enable_prefix_caching: Option<bool>,
    /// vLLM knob; no effect in trinity.
    pub enable_chunked_prefill: Option<bool>,
    /// vLLM knob: log every request.
    pub enable_log_requests: bool,
    /// Ray placement-group bundles of the engine.
    pub bundle_indices: Option<String>,
    /// Let the OpenAI-compatible API (mode `serve`, `enable_openai_api`) turn tool-call text into `tool_calls` for
    /// `tool_choice: "auto"`, with `tool_call_parser`; without it such requests are refused, as vLLM does.
    pub enable_auto_tool_choice: bool,
    /// Parser of tool calls in the OpenAI-compatible API's responses: `hermes` (`<tool_call>{json}</tool_call>`,
    /// Qwen's format) is the one trinity has.
    pub tool_call_parser: Option<String>,
    /// Splits `<think>...</think>` text of the OpenAI-compatible API's chat replies into `reasoning_content`,
    /// as vLLM's `deepseek_r1` or `qwen3` parser does (serve mode and `enable_openai_api` workflows).
    pub reasoning_parser: Option<String>,
    /// Data-parallel replicas inside one engine (newer Trinity-RFT).
    pub data_parallel_size: u32,
    /// Pipeline-parallel degree of one engine (newer Trinity-RFT).
    pub pipeline_parallel_size: u32,
    /// Expert parallelism of mixture-of-experts models (newer Trinity-RFT).
    pub enable_expert_parallel: bool,
    /// Extra engine-specific arguments of vLLM / SGLang (newer Trinity-RFT).
    pub extra_engine_args: Map<String, Value>,
    /// Buffer of batched NCCL weight sync, in MB (newer Trinity-RFT).
    pub weight_sync_buffer_size: u32,
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
            enable_log_requests: false,
            bundle_indices: None,
            enable_auto_tool_choice: false,
            tool_call_parser: None,
            reasoning_parser: None,
            data_parallel_size: 1,
            pipeline_parallel_size: 1,
            enable_expert_parallel: false,
            extra_engine_args: Map::new(),
            weight_sync_buffer_size: 1024,
        }
    }
}

/// `explorer.auxiliary_models[i]`: a judge or teacher model. It gets a generation engine of its own (its own
/// dtype and length limits) and keeps its weights: weight sync only ever reaches the rollout model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AuxiliaryModelConfig {
    /// HF directory or GGUF file of the model (required).
    pub model_path: String,
    /// The name workflows and the OpenAI-compatible API reach the model by; its `model_path` when unset.
    pub name: Option<String>,
    /// `vllm` and `vllm_async` (Trinity-RFT's names) and `native` all select trinity's engine.
    pub engine_type: String,
    /// Trinity-RFT's number of engines of this model; trinity runs one and batches concurrent requests in it.
    pub engine_num: u32,
    /// Tensor-parallel degree of Trinity-RFT's engines; trinity's engine runs on one device.
    pub tensor_parallel_size: u32,
    /// Weight dtype of the model's engine: `bfloat16`, `float16` or `float32`; `bfloat16` runs with fp32 weights
    /// on a CPU without native bf16.
    pub dtype: String,
    /// Seed of the model's sampler.
    pub seed: u64,
    /// Chat template that replaces the model's own.
    pub chat_template: Option<String>,
    /// Passed to chat templates that understand it (Qwen3).
    pub enable_thinking: Option<bool>,
    /// Longest sequence (prompt and response) the model's engine holds; unset: `model.max_model_len`.
    pub max_model_len: Option<u32>,
    /// Longest prompt the model accepts; unset: `model.max_prompt_tokens`.
    pub max_prompt_tokens: Option<u32>,
    /// Most tokens one reply of the model may have (what a judge's reply is capped at); unset:
    /// `model.max_response_tokens`.
    pub max_response_tokens: Option<u32>,
    /// Fraction of device memory the engine's KV cache may take.
    pub gpu_memory_utilization: f64,
    /// vLLM knob; no effect in trinity.
    pub enforce_eager: Option<bool>,
    /// vLLM's automatic prefix caching; trinity's engine always caches prompt starts, so no effect.
    pub enable_prefix_caching: Option<bool>,
    /// The three length limits as resolution filled them (each unset one is the policy model's), which the
    /// model's engine and its callers read; see [`ModelLengths`].
    #[serde(skip)]
    pub resolved: ModelLengths,
}

impl Default for AuxiliaryModelConfig {
    fn default() -> Self {
        AuxiliaryModelConfig {
            model_path: String::new(),
            name: None,
            engine_type: "vllm".to_owned(),
            engine_num: 1,
            tensor_parallel_size: 1,
            dtype: "bfloat16".to_owned(),
            seed: 42,
            chat_template: None,
            enable_thinking: None,
            max_model_len: None,
            max_prompt_tokens: None,
            max_response_tokens: None,
            gpu_memory_utilization: 0.9,
            enforce_eager: None,
            enable_prefix_caching: None,
            resolved: ModelLengths::default(),
        }
    }
}

impl AuxiliaryModelConfig {
    /// The name the model is reached by.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.model_path)
    }
}
