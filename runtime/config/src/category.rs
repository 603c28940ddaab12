//! One rule for every key: what trinity does with it, written once and shown in the generated reference.
//!
//! - **honoured**: its value changes what runs.
//! - **placement**: how Trinity-RFT spreads work over devices or how an engine manages memory (parallel sizes,
//!   engine counts, memory fractions, token budgets, offload, logging and service knobs). Accepted; when the
//!   user sets one, one note names the key and says what it maps to here or why it has no effect. A placement
//!   key never refuses a config: it does not change the numbers.
//! - **derived**: Trinity-RFT itself overwrites the value from another key (most of veRL's tree), so it has no
//!   effect there either. Accepted with a note naming the key that decides.
//! - **refused**: a value other than the default would change results in a way trinity cannot honour; such a
//!   value is an error that says why and what to do. The default (or `null`) is accepted.
//!
//! [`RULES`] (and [`crate::verl_category::VERL_RULES`] for `trainer.trainer_config`) give the category of every property of every schema definition; [`annotate`] writes them into
//! the JSON Schema (`x-trinity-category`, `x-trinity-note`), where the key walk ([`crate::keys`]) reads them
//! while it checks the user's tree. Keys trinity has no field for at all are in [`crate::keys`]'s table.

use serde_json::Value;

/// What trinity does with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Honoured,
    Placement,
    Derived,
    Refused,
}

impl Category {
    /// The name used in the schema and the reference.
    pub fn name(self) -> &'static str {
        match self {
            Category::Honoured => "honoured",
            Category::Placement => "placement",
            Category::Derived => "derived",
            Category::Refused => "refused",
        }
    }

    /// The category named `name` in the schema.
    pub fn parse(name: &str) -> Option<Category> {
        [Category::Honoured, Category::Placement, Category::Derived, Category::Refused]
            .into_iter()
            .find(|c| c.name() == name)
    }
}

use Category::{Derived as D, Honoured as H, Placement as P, Refused as R};

pub(crate) const NO_GPU_SPLIT: &str = "processes and devices come from the launcher: under torchrun or `trinity launch` one process per device, the trainer data-parallel over WORLD_SIZE ranks; otherwise one process on this machine's device (CUDA when present, else CPU); the count here has no effect";
pub(crate) const ONE_ENGINE: &str = "trinity runs one generation engine and batches concurrent requests in it (concurrency is explorer.runner_per_model); no effect here";
pub(crate) const VLLM: &str = "a vLLM engine setting; trinity's own engine has no such knob, so it has no effect here";
pub(crate) const PREFIX_CACHING: &str = "trinity's engine always keeps recent prompts and conversations in free KV-cache slots for later prompts that start the same way (vLLM's automatic prefix caching), forgets them at every weight sync, and gives the same outputs up to rounding either way; so this key has no effect here";
pub(crate) const SEQ_PARALLEL: &str =
    "sequences are not split across devices in trinity; sequence parallelism has no effect on the numbers";
pub(crate) const TOKEN_BUDGET: &str = "mapped onto trinity's micro-batch token budget of each data-parallel rank (trainer.max_token_len_per_gpu), lowered on a CPU to what fits in memory";
pub(crate) const MICRO_BATCH: &str = "micro-batches only split the gradient accumulation; trinity forms them by token budget (trainer.max_token_len_per_gpu), or by actor.ppo_micro_batch_size_per_gpu rows when use_dynamic_bsz is false";
pub(crate) const STRATEGY: &str = "trinity trains with its own libtorch trainer, data-parallel over the launcher's ranks: with `fsdp`/`fsdp2` each rank keeps its share of the parameters, gradients and optimizer state, and of the KL reference model's parameters (ZeRO-3, each layer gathered around its computations; the actor's `fsdp_config.reshard_after_forward: false` keeps the parameters whole on every rank, ZeRO-2), and Megatron's parallelism is not implemented";
pub(crate) const REF_FSDP: &str = "the reference model is sharded as the actor is (each rank keeps its share under ZeRO-3, each layer gathered around its forward; whole on every rank under ZeRO-2), and trinity's trainer manages its memory itself, so these settings have no effect here";
pub(crate) const OFFLOAD: &str = "a memory / offload / kernel setting of veRL's engines; trinity's trainer manages its memory itself, so it has no effect here";
pub(crate) const CKPT_CONTENTS: &str =
    "trinity always checkpoints weights, optimizer state and run state together; no effect here";
pub(crate) const RAY: &str = "trinity does not use Ray; no effect here";
pub(crate) const PROFILER: &str = "veRL's profiler; trinity reports its own phase timings, so it has no effect here";
pub(crate) const LOGGING: &str = "logging only; trinity logs its fixed set of metrics, so it has no effect on the run";
pub(crate) const VERL_SET: &str = "Trinity-RFT sets it itself from the top-level config; the value here is replaced";
pub(crate) const MEGATRON_OPT: &str =
    "a Megatron optimizer setting; trinity's AdamW has no such knob, so it has no effect here";
pub(crate) const LORA: &str = "Trinity-RFT sets veRL's LoRA keys from model.lora_configs; set LoRA there (lora_rank, lora_alpha, target_modules, exclude_modules, path) and remove it";
pub(crate) const LORA_MERGED: &str = "a vLLM setting for serving LoRA adapters; trinity's rollout engine generates with the adapter merged into its weights, so no effect here";
pub(crate) const PYTHON_LIB: &str = "it imports Python code, and trinity runs no Python; remove it";
pub(crate) const OVERRIDE_MODEL: &str = "it changes the model's architecture config, which trinity reads only from the checkpoint's config.json; edit that file instead";
pub(crate) const LOAD_WEIGHT: &str =
    "training from random weights is not supported; remove it to start from the checkpoint";
pub(crate) const REWARD_MODEL: &str = "Trinity-RFT computes rewards in workflows and reward functions (default_reward_fn_type), not veRL's reward workers; remove it";

/// The category of every property, by (schema definition, key), with the note users see.
pub const RULES: &[(&str, &str, Category, &str)] = &[
    ("Config", "mode", H, ""),
    ("Config", "project", H, ""),
    ("Config", "group", H, ""),
    ("Config", "name", H, ""),
    ("Config", "checkpoint_root_dir", H, ""),
    ("Config", "continue_from_checkpoint", H, ""),
    ("Config", "algorithm", H, ""),
    ("Config", "data_processor", H, ""),
    ("Config", "model", H, ""),
    ("Config", "cluster", H, ""),
    ("Config", "buffer", H, ""),
    ("Config", "explorer", H, ""),
    ("Config", "trainer", H, ""),
    ("Config", "monitor", H, ""),
    ("Config", "synchronizer", H, ""),
    ("Config", "log", H, ""),
    ("Config", "stages", H, ""),
    ("Config", "plugins", H, ""),
    ("Config", "ray_namespace", P, RAY),
    ("Config", "ignore_validator_suggestions", P, "trinity has no GPU-memory estimator to silence; no effect here"),
    // algorithm
    ("AlgorithmConfig", "algorithm_type", H, ""),
    ("AlgorithmConfig", "repeat_times", H, ""),
    ("AlgorithmConfig", "optimizer", H, ""),
    ("AlgorithmConfig", "sample_strategy", H, ""),
    ("AlgorithmConfig", "sample_strategy_args", H, ""),
    ("AlgorithmConfig", "advantage_fn", H, ""),
    ("AlgorithmConfig", "advantage_fn_args", H, ""),
    ("AlgorithmConfig", "kl_penalty_fn", H, ""),
    ("AlgorithmConfig", "kl_penalty_fn_args", H, ""),
    ("AlgorithmConfig", "policy_loss_fn", H, ""),
    ("AlgorithmConfig", "policy_loss_fn_args", H, ""),
    ("AlgorithmConfig", "kl_loss_fn", H, ""),
    ("AlgorithmConfig", "kl_loss_fn_args", H, ""),
    ("AlgorithmConfig", "entropy_loss_fn", H, ""),
    ("AlgorithmConfig", "entropy_loss_fn_args", H, ""),
    ("AlgorithmConfig", "loss_agg_mode", H, ""),
    ("AlgorithmConfig", "enable_router_replay", H, ""),
    ("AlgorithmConfig", "bypass_old_logprobs", H, ""),
    ("AlgorithmConfig", "rollout_correction", H, ""),
    ("OptimizerConfig", "lr", H, ""),
    ("OptimizerConfig", "lr_warmup_steps", H, ""),
    ("OptimizerConfig", "lr_warmup_steps_ratio", H, ""),
    ("OptimizerConfig", "min_lr_ratio", H, ""),
    ("OptimizerConfig", "warmup_style", H, ""),
    ("OptimizerConfig", "lr_scheduler_type", H, ""),
    ("OptimizerConfig", "optimizer_type", H, ""),
    ("OptimizerConfig", "betas", H, ""),
    ("OptimizerConfig", "eps", H, ""),
    ("OptimizerConfig", "weight_decay", H, ""),
    ("OptimizerConfig", "clip_grad", H, ""),
    // data_processor
    ("DataProcessorConfig", "experience_pipeline", H, ""),
    ("ExperiencePipelineConfig", "operators", H, ""),
    (
        "ExperiencePipelineConfig",
        "save_input",
        P,
        "trinity keeps no separate copy of the pipeline's input (the experience buffer keeps what trains); no effect here",
    ),
    (
        "ExperiencePipelineConfig",
        "input_save_path",
        R,
        "trinity keeps no separate copy of the pipeline's input; remove it (the experience buffer's `path` keeps what trains)",
    ),
    ("OperatorConfig", "name", H, ""),
    ("OperatorConfig", "args", H, ""),
    // model and cluster
    ("ModelConfig", "model_path", H, ""),
    ("ModelConfig", "critic_model_path", H, ""),
    ("ModelConfig", "custom_chat_template", H, ""),
    ("ModelConfig", "chat_template_path", H, ""),
    ("ModelConfig", "temperature", H, ""),
    ("ModelConfig", "top_p", H, ""),
    ("ModelConfig", "top_k", H, ""),
    ("ModelConfig", "logprobs", H, ""),
    ("ModelConfig", "max_model_len", H, ""),
    ("ModelConfig", "max_prompt_tokens", H, ""),
    ("ModelConfig", "max_response_tokens", H, ""),
    ("ModelConfig", "min_response_tokens", H, ""),
    ("ModelConfig", "enable_prompt_truncation", H, ""),
    ("ModelConfig", "repetition_penalty", H, ""),
    ("ModelConfig", "enable_thinking", H, ""),
    ("ModelConfig", "rope_scaling", H, ""),
    ("ModelConfig", "rope_theta", H, ""),
    ("ModelConfig", "trust_remote_code", H, ""),
    ("ModelConfig", "external_model", H, ""),
    ("ModelConfig", "lora_configs", H, ""),
    ("ModelConfig", "fully_sharded_loras", P, LORA_MERGED),
    ("ModelConfig", "max_cpu_loras", P, LORA_MERGED),
    (
        "LoraConfig",
        "name",
        P,
        "names the adapter in vLLM's model list; trinity's rollout model generates with the adapter merged into its weights and answers under model.model_path, so no effect here",
    ),
    ("LoraConfig", "path", H, ""),
    (
        "LoraConfig",
        "base_model_name",
        P,
        "names the base model in vLLM's model list; trinity reads the base model from model.model_path, so no effect here",
    ),
    ("LoraConfig", "lora_rank", H, ""),
    ("LoraConfig", "lora_alpha", H, ""),
    (
        "LoraConfig",
        "lora_dtype",
        P,
        "vLLM's dtype for adapter weights in the rollout engine; trinity merges the adapter into the engine's weights, which keep explorer.rollout_model.dtype, so no effect here",
    ),
    ("LoraConfig", "target_modules", H, ""),
    ("LoraConfig", "exclude_modules", H, ""),
    ("ExternalModelConfig", "enable", H, ""),
    ("ExternalModelConfig", "model_name", H, ""),
    ("ExternalModelConfig", "base_url_env", H, ""),
    ("ExternalModelConfig", "api_key_env", H, ""),
    ("ClusterConfig", "ray_address", P, RAY),
    ("ClusterConfig", "node_num", P, NO_GPU_SPLIT),
    ("ClusterConfig", "gpu_per_node", P, NO_GPU_SPLIT),
    // buffer
    ("BufferConfig", "batch_size", H, ""),
    ("BufferConfig", "train_batch_size", H, ""),
    ("BufferConfig", "total_epochs", H, ""),
    ("BufferConfig", "total_steps", H, ""),
    ("BufferConfig", "explorer_input", H, ""),
    ("BufferConfig", "trainer_input", H, ""),
    ("ExplorerInput", "taskset", H, ""),
    ("ExplorerInput", "tasksets", H, ""),
    ("ExplorerInput", "eval_tasksets", H, ""),
    ("ExplorerInput", "default_workflow_type", H, ""),
    ("ExplorerInput", "default_eval_workflow_type", H, ""),
    ("ExplorerInput", "default_reward_fn_type", H, ""),
    ("ExplorerInput", "system_prompt", H, ""),
    ("ExplorerInput", "reply_prefix", H, ""),
    ("TasksetConfig", "name", H, ""),
    ("TasksetConfig", "storage_type", H, ""),
    ("TasksetConfig", "path", H, ""),
    ("TasksetConfig", "subset_name", H, ""),
    ("TasksetConfig", "split", H, ""),
    ("TasksetConfig", "format", H, ""),
    ("TasksetConfig", "rollout_args", H, ""),
    ("TasksetConfig", "workflow_args", H, ""),
    ("TasksetConfig", "reward_fn_args", H, ""),
    ("TasksetConfig", "default_workflow_type", H, ""),
    ("TasksetConfig", "default_reward_fn_type", H, ""),
    ("TasksetConfig", "task_selector", H, ""),
    ("TasksetConfig", "data_selector", H, ""),
    ("TasksetConfig", "repeat_times", H, ""),
    (
        "TasksetConfig",
        "enable_progress_bar",
        P,
        "trinity reads rows without a progress bar; display only, no effect on the run",
    ),
    (
        "TasksetConfig",
        "max_retry_times",
        P,
        "retries of SQL reads; trinity reads tasksets from files, so no effect here",
    ),
    (
        "TasksetConfig",
        "max_retry_interval",
        P,
        "retries of SQL reads; trinity reads tasksets from files, so no effect here",
    ),
    ("FormatConfig", "prompt_type", H, ""),
    ("FormatConfig", "prompt_key", H, ""),
    ("FormatConfig", "response_key", H, ""),
    ("FormatConfig", "system_prompt_key", H, ""),
    ("FormatConfig", "system_prompt", H, ""),
    ("FormatConfig", "messages_key", H, ""),
    ("FormatConfig", "tools_key", H, ""),
    ("FormatConfig", "reply_prefix", H, ""),
    ("FormatConfig", "workflow_key", H, ""),
    ("FormatConfig", "reward_fn_key", H, ""),
    ("FormatConfig", "chosen_key", H, ""),
    ("FormatConfig", "rejected_key", H, ""),
    (
        "FormatConfig",
        "enable_concatenated_multi_turn",
        R,
        "trinity trains the last assistant turn of a multi-turn SFT row only; remove it or split the rows",
    ),
    ("FormatConfig", "chat_template", H, ""),
    ("FormatConfig", "enable_thinking", H, ""),
    ("RolloutArgs", "temperature", H, ""),
    ("RolloutArgs", "top_p", H, ""),
    ("RolloutArgs", "top_k", H, ""),
    ("RolloutArgs", "min_p", H, ""),
    ("RolloutArgs", "max_tokens", H, ""),
    ("RolloutArgs", "min_tokens", H, ""),
    ("RolloutArgs", "logprobs", H, ""),
    ("RolloutArgs", "n", H, ""),
    ("RolloutArgs", "seed", H, ""),
    ("RolloutArgs", "stop", H, ""),
    ("SelectorConfig", "selector_type", H, ""),
    ("SelectorConfig", "seed", H, ""),
    ("SelectorConfig", "feature_keys", H, ""),
    ("SelectorConfig", "kwargs", H, ""),
    ("TrainerInput", "experience_buffer", H, ""),
    ("TrainerInput", "auxiliary_buffers", H, ""),
    ("ExperienceBufferConfig", "name", H, ""),
    ("ExperienceBufferConfig", "storage_type", H, ""),
    ("ExperienceBufferConfig", "path", H, ""),
    ("ExperienceBufferConfig", "capacity", H, ""),
    ("ExperienceBufferConfig", "max_read_timeout", H, ""),
    ("ExperienceBufferConfig", "replay_buffer", H, ""),
    ("ExperienceBufferConfig", "split", H, ""),
    ("ExperienceBufferConfig", "subset_name", H, ""),
    ("ExperienceBufferConfig", "format", H, ""),
    (
        "ExperienceBufferConfig",
        "enable_progress_bar",
        P,
        "trinity reads rows without a progress bar; display only, no effect on the run",
    ),
    ("ExperienceBufferConfig", "schema_type", D, "derived from the algorithm (`sft` rows for auxiliary SFT buffers)"),
    ("ExperienceBufferConfig", "total_epochs", H, ""),
    (
        "ExperienceBufferConfig",
        "data_selector",
        R,
        "the trainer reads experience buffers and SFT/DPO rows in order; remove it",
    ),
    ("ReplayBufferConfig", "enable", H, ""),
    ("ReplayBufferConfig", "priority_fn", H, ""),
    ("ReplayBufferConfig", "reuse_cooldown_time", H, ""),
    ("ReplayBufferConfig", "priority_fn_args", H, ""),
    // explorer
    ("ExplorerConfig", "name", H, ""),
    ("ExplorerConfig", "runner_per_model", H, ""),
    ("ExplorerConfig", "max_timeout", H, ""),
    ("ExplorerConfig", "max_retry_times", H, ""),
    ("ExplorerConfig", "env_vars", H, ""),
    ("ExplorerConfig", "eval_interval", H, ""),
    ("ExplorerConfig", "eval_on_startup", H, ""),
    ("ExplorerConfig", "bench_on_latest_checkpoint", H, ""),
    ("ExplorerConfig", "rollout_model", H, ""),
    ("ExplorerConfig", "listen_address", H, ""),
    ("ExplorerConfig", "proxy_port", H, ""),
    ("ExplorerConfig", "runner_num", D, "deprecated in Trinity-RFT; explorer.runner_per_model decides"),
    (
        "ExplorerConfig",
        "concurrent_mode",
        P,
        "trinity runs every repeat of a task as one batched request, and up to explorer.runner_per_model tasks at once; no effect here",
    ),
    (
        "ExplorerConfig",
        "max_repeat_times_per_runner",
        P,
        "trinity runs every repeat of a task as one batched request on its one engine; splitting a group over runners has no effect here",
    ),
    ("ExplorerConfig", "auxiliary_models", H, ""),
    ("ExplorerConfig", "over_rollout", H, ""),
    ("ExplorerConfig", "dynamic_timeout", H, ""),
    (
        "ExplorerConfig",
        "service_status_check_interval",
        P,
        "how often Trinity-RFT's serve mode checks its vLLM engines' weight versions; trinity's one engine loads published weights within 2 s, between decode steps",
    ),
    (
        "ExplorerConfig",
        "min_running_model_num",
        P,
        "how many of Trinity-RFT's vLLM engines keep serving while others sync; trinity's one engine syncs between decode steps and never stops serving",
    ),
    (
        "ExplorerConfig",
        "db_url",
        P,
        "where Trinity-RFT's serve mode keeps its request history; trinity holds uncommitted replies in memory (bounded) and stores committed ones in the experience buffer",
    ),
    ("ExplorerConfig", "runner_state_report_interval", P, LOGGING),
    ("ExplorerConfig", "runner_prepare_concurrency", P, "trinity prepares workflows in-process; no effect here"),
    ("ExplorerConfig", "runner_prepare_max_retries", P, "trinity prepares workflows in-process; no effect here"),
    ("ExplorerConfig", "max_inflight_batches", H, ""),
    ("ExplorerConfig", "python_workflows", H, ""),
    ("PythonWorkflowLimits", "max_model_calls", H, ""),
    ("PythonWorkflowLimits", "max_model_tokens", H, ""),
    ("OverRolloutConfig", "ratio", H, ""),
    ("OverRolloutConfig", "wait_after_min", H, ""),
    (
        "OverRolloutConfig",
        "return_partial_tasks",
        P,
        "trinity's built-in and WASM workflows return a task's rollouts as one group (one batched request, or all of an agent's programs; a failed rollout fails the task, which is retried), so no task ends with some repeats finished; and Trinity-RFT 0.6.0 drops the unfinished tasks of an over-rolled train step with or without it; it decides only, as 0.6.0's runner does, whether a Python workflow class that cannot repeat goes on with a task's other runs after one raised (true) or skips them (false), the finished runs being kept either way",
    ),
    ("DynamicTimeoutConfig", "enable", H, ""),
    ("DynamicTimeoutConfig", "ratio", H, ""),
    ("DynamicTimeoutConfig", "warmup_min_steps", H, ""),
    ("RolloutModelConfig", "engine_type", P, "every engine type runs on trinity's own libtorch engine"),
    ("RolloutModelConfig", "engine_num", P, ONE_ENGINE),
    (
        "RolloutModelConfig",
        "tensor_parallel_size",
        P,
        "trinity's engine runs on one device; tensor parallelism has no effect here",
    ),
    ("RolloutModelConfig", "dtype", H, ""),
    ("RolloutModelConfig", "seed", H, ""),
    ("RolloutModelConfig", "chat_template", H, ""),
    ("RolloutModelConfig", "enable_thinking", H, ""),
    ("RolloutModelConfig", "enable_history", H, ""),
    ("RolloutModelConfig", "enable_openai_api", H, ""),
    ("RolloutModelConfig", "ignore_eos", H, ""),
    (
        "RolloutModelConfig",
        "gpu_memory_utilization",
        P,
        "trinity's engine sizes its KV cache per batch; a memory fraction has no effect here",
    ),
    ("RolloutModelConfig", "use_v1", P, VLLM),
    ("RolloutModelConfig", "enforce_eager", P, VLLM),
    ("RolloutModelConfig", "enable_prefix_caching", P, PREFIX_CACHING),
    ("RolloutModelConfig", "enable_chunked_prefill", P, VLLM),
    ("RolloutModelConfig", "enable_log_requests", P, VLLM),
    ("RolloutModelConfig", "bundle_indices", P, RAY),
    ("RolloutModelConfig", "enable_auto_tool_choice", H, ""),
    ("RolloutModelConfig", "tool_call_parser", H, ""),
    ("RolloutModelConfig", "reasoning_parser", H, ""),
    ("RolloutModelConfig", "data_parallel_size", P, ONE_ENGINE),
    (
        "RolloutModelConfig",
        "pipeline_parallel_size",
        P,
        "trinity's engine runs on one device; pipeline parallelism has no effect here",
    ),
    (
        "RolloutModelConfig",
        "enable_expert_parallel",
        P,
        "trinity's models are dense and run on one device; no effect here",
    ),
    ("RolloutModelConfig", "extra_engine_args", P, VLLM),
    (
        "RolloutModelConfig",
        "weight_sync_buffer_size",
        P,
        "trinity copies weights in place or through checkpoints; an NCCL buffer size has no effect here",
    ),
    ("AuxiliaryModelConfig", "model_path", H, ""),
    ("AuxiliaryModelConfig", "name", H, ""),
    ("AuxiliaryModelConfig", "engine_type", P, "every engine type runs on trinity's own libtorch engine"),
    ("AuxiliaryModelConfig", "engine_num", P, ONE_ENGINE),
    (
        "AuxiliaryModelConfig",
        "tensor_parallel_size",
        P,
        "trinity's engine runs on one device; tensor parallelism has no effect here",
    ),
    ("AuxiliaryModelConfig", "dtype", H, ""),
    ("AuxiliaryModelConfig", "seed", H, ""),
    ("AuxiliaryModelConfig", "chat_template", H, ""),
    ("AuxiliaryModelConfig", "enable_thinking", H, ""),
    ("AuxiliaryModelConfig", "max_model_len", H, ""),
    ("AuxiliaryModelConfig", "max_prompt_tokens", H, ""),
    ("AuxiliaryModelConfig", "max_response_tokens", H, ""),
    (
        "AuxiliaryModelConfig",
        "gpu_memory_utilization",
        P,
        "trinity's engine sizes its KV cache per batch; a memory fraction has no effect here",
    ),
    ("AuxiliaryModelConfig", "enforce_eager", P, VLLM),
    ("AuxiliaryModelConfig", "enable_prefix_caching", P, PREFIX_CACHING),
    // trainer
    ("TrainerConfig", "name", H, ""),
    ("TrainerConfig", "trainer_type", P, "every trainer type runs on trinity's own libtorch trainer"),
    ("TrainerConfig", "trainer_strategy", P, STRATEGY),
    ("TrainerConfig", "save_interval", H, ""),
    ("TrainerConfig", "total_steps", H, ""),
    (
        "TrainerConfig",
        "save_hf_checkpoint",
        P,
        "every trinity checkpoint holds the policy as a Hugging Face directory (what a run resumes from), so there is nothing to switch",
    ),
    ("TrainerConfig", "grad_clip", H, ""),
    (
        "TrainerConfig",
        "use_dynamic_bsz",
        P,
        "mapped: true forms micro-batches by token budget (max_token_len_per_gpu), false by rows (ppo_micro_batch_size_per_gpu); micro-batches only split the gradient accumulation",
    ),
    ("TrainerConfig", "max_token_len_per_gpu", P, TOKEN_BUDGET),
    ("TrainerConfig", "ulysses_sequence_parallel_size", P, SEQ_PARALLEL),
    ("TrainerConfig", "save_strategy", P, "trinity writes checkpoints from one process; no effect here"),
    (
        "TrainerConfig",
        "fix_actor_microbatch_loss_scale",
        R,
        "this experimental Trinity-RFT loss scaling changes the gradient and trinity does not implement it; remove it",
    ),
    ("TrainerConfig", "trainer_config", H, ""),
    ("TrainerConfig", "max_checkpoints_to_keep", H, ""),
    ("TrainerConfig", "enable_preview", P, LOGGING),
    ("TrainerConfig", "use_remove_padding", P, OFFLOAD),
    (
        "TrainerConfig",
        "balance_batch",
        P,
        "veRL reorders rows so data-parallel ranks get similar token counts; with one device there is nothing to balance",
    ),
    ("TrainerConfig", "critic_warmup", H, ""),
    ("TrainerConfig", "param_offload", H, ""),
    ("TrainerConfig", "optimizer_offload", H, ""),
    ("TrainerConfig", "grad_offload", P, OFFLOAD),
    ("TrainerConfig", "offload_policy", H, ""),
    ("TrainerConfig", "megatron", P, STRATEGY),
    ("TrainerConfig", "dtype", H, ""),
    // monitor, synchronizer, log, stages, plugins
    ("MonitorConfig", "monitor_type", H, ""),
    ("MonitorConfig", "monitor_args", H, ""),
    (
        "MonitorConfig",
        "detailed_stats",
        H,
        "evaluations also report std, max and min of the workflows' per-experience metrics",
    ),
    ("MonitorConfig", "enable_ray_timeline", P, RAY),
    ("SynchronizerConfig", "sync_method", H, ""),
    ("SynchronizerConfig", "sync_style", H, ""),
    ("SynchronizerConfig", "sync_interval", H, ""),
    ("SynchronizerConfig", "sync_offset", H, ""),
    ("SynchronizerConfig", "sync_timeout", H, ""),
    ("SynchronizerConfig", "wait_for_checkpoint", P, "unused by Trinity-RFT itself; no effect"),
    ("SynchronizerConfig", "explorer_sync_interval", H, ""),
    ("SynchronizerConfig", "trainer_sync_interval", H, ""),
    ("SynchronizerConfig", "group_name", P, "trinity has no NCCL weight-sync group; no effect here"),
    ("LogConfig", "level", H, ""),
    ("LogConfig", "group_by_node", P, "trinity runs on one node; no effect here"),
    ("StageConfig", "stage_name", H, ""),
    ("StageConfig", "mode", H, ""),
    ("StageConfig", "algorithm", H, ""),
    ("StageConfig", "buffer", H, ""),
    ("StageConfig", "data_processor", H, ""),
    ("StageConfig", "explorer", H, ""),
    ("StageConfig", "trainer", H, ""),
    ("PluginSpec", "path", H, ""),
    ("PluginSpec", "override_builtin", H, ""),
    ("PluginSpec", "allow_dir", H, ""),
    ("PluginSpec", "max_memory_mib", H, ""),
    ("PluginSpec", "timeout_s", H, ""),
    ("PluginSpec", "max_model_calls", H, ""),
    ("PluginSpec", "max_model_tokens", H, ""),
];

/// The rule of `key` in definition `def`.
pub fn rule(def: &str, key: &str) -> Option<(Category, &'static str)> {
    RULES
        .iter()
        .chain(crate::verl_category::VERL_RULES)
        .find(|(d, k, _, _)| *d == def && *k == key)
        .map(|(_, _, category, note)| (*category, *note))
}

/// Writes every property's category and note into the schema (`x-trinity-category`, `x-trinity-note`).
pub fn annotate(schema: &mut Value) {
    annotate_definition(schema, "Config");
    if let Some(defs) = schema.get_mut("$defs").and_then(Value::as_object_mut) {
        for (name, def) in defs.iter_mut() {
            annotate_definition(def, name);
        }
    }
}

fn annotate_definition(def: &mut Value, name: &str) {
    let Some(properties) = def.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (key, property) in properties.iter_mut() {
        let (Some((category, note)), Some(property)) = (rule(name, key), property.as_object_mut()) else {
            continue;
        };
        property.insert("x-trinity-category".to_owned(), Value::from(category.name()));
        if !note.is_empty() {
            property.insert("x-trinity-note".to_owned(), Value::from(note));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::json_schema;

    /// Every property of every definition has a category, and every rule names a real property.
    #[test]
    fn every_schema_property_has_a_category() {
        let schema = json_schema();
        let mut definitions = vec![("Config".to_owned(), schema.clone())];
        definitions.extend(schema["$defs"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())));
        let mut missing = Vec::new();
        let mut checked = 0;
        for (name, def) in &definitions {
            for (key, property) in def.get("properties").and_then(Value::as_object).into_iter().flatten() {
                checked += 1;
                match property.get("x-trinity-category").and_then(Value::as_str).and_then(Category::parse) {
                    Some(Category::Honoured) => {}
                    Some(_) => assert!(
                        property.get("x-trinity-note").and_then(Value::as_str).is_some_and(|n| n.len() > 10),
                        "{name}.{key}: placement, derived and refused keys need a note saying why"
                    ),
                    None => missing.push(format!("{name}.{key}")),
                }
            }
        }
        assert!(missing.is_empty(), "properties without a category: {missing:?}");
        assert!(checked > 300, "only {checked} properties walked");
        for (def, key, _, _) in RULES.iter().chain(crate::verl_category::VERL_RULES) {
            let def_schema = definitions.iter().find(|(n, _)| n == def).map(|(_, d)| d);
            assert!(
                def_schema.and_then(|d| d.get("properties")).and_then(|p| p.get(*key)).is_some(),
                "rule {def}.{key} names no schema property"
            );
        }
    }

    #[test]
    fn placement_keys_never_refuse_and_refused_keys_have_a_default() {
        let schema = json_schema();
        for (def, key, category, _) in RULES.iter().chain(crate::verl_category::VERL_RULES) {
            if *category != Category::Refused {
                continue;
            }
            let def_schema = if *def == "Config" { &schema } else { &schema["$defs"][*def] };
            assert!(
                def_schema["properties"][*key].get("default").is_some(),
                "{def}.{key} is refused unless default, so it needs a default"
            );
        }
    }
}
