//! The explorer: runs workflows against the rollout model and turns their answers into scored experiences.
//!
//! * [`RolloutModel`] is what a workflow talks to: chat-template rendering, tokenization and batched generation
//!   through the [`trinity_engine::Engine`], stamped with the weights' model version.
//! * [`Workflow`] is the interface every workflow implements — the built-ins here, and WASM workflows through
//!   the same trait. Built-ins register by name with `inventory` ([`WorkflowEntry`]), plugins at run time
//!   ([`register_workflow`]).
//!   The built-ins are Trinity-RFT's workflows that need no outside environment, under its names: single-turn
//!   math and Q&A (`simple_workflow`, `math_workflow`, `math_boxed_workflow`, their `async_*` names,
//!   `math_eval_workflow`), `countdown`, `tool_call_workflow` (ToolACE function calling), the multi-step
//!   `sudoku_workflow` (one experience per step) and the multi-turn `frozen_lake_workflow` (one experience per
//!   run over the whole conversation, see `conversation.rs`). Workflows that call an auxiliary model
//!   ([`AuxiliaryModel`], `explorer.auxiliary_models`): on-policy distillation (`on_policy_distill_workflow`,
//!   `on_policy_distill_math_workflow`: the teacher's logprobs of every sampled token) and LLM-judged rewards
//!   (`math_ruler_workflow`, `async_math_ruler_workflow`, `rubric_judge_workflow`); `rubric_judge_openai_workflow`
//!   asks a judge over an OpenAI-compatible endpoint, `math_trainable_ruler_workflow` makes the policy its own
//!   judge and trains the judgements, and `math_rm_workflow` rewards with the taskset's reward function. `agent_process_workflow` runs an agent program per rollout
//!   against the rollout model's OpenAI view ([`OpenAiSession`], `enable_openai_api`) and trains on the replies
//!   recorded there (`enable_history`).
//! * [`ExperienceOperator`]s transform one explore step's experiences before they enter the buffer: Trinity-RFT's
//!   pure ones are built in ([`OperatorEntry`]), plugins register by name ([`register_operator`]), and
//!   [`apply_pipeline`] runs a configured pipeline, collecting the selectors' feedback.
//! * [`ExternalModel`] is an OpenAI-compatible endpoint that stands in for the rollout model in mode `bench`
//!   (`model.external_model`): the workflows that only send messages and read text run on it unchanged
//!   ([`runs_on_external_model`]); the runner refuses the others.
//! * [`run_tasks`] runs a batch of tasks with `runner_per_model` workflows in flight, a per-task timeout and
//!   retries; a task that fails for good is logged and counted, never fatal to the run.

mod agent_process_workflow;
mod auxiliary;
mod conversation;
mod countdown_workflow;
mod distill_workflow;
mod error;
mod external_model;
mod frozen_lake_workflow;
mod judge_endpoint;
mod judge_workflow;
mod math_boxed_workflow;
mod math_eval_workflow;
mod math_rm_workflow;
mod math_workflow;
mod openai_view;
mod operator;
mod pass_rate_calculator;
mod python_json;
mod reward_filters;
mod reward_shaping_mapper;
mod rollout_model;
mod runner;
mod sudoku_workflow;
mod tool_call_workflow;
mod trainable_ruler_workflow;
mod workflow;

pub use agent_process_workflow::set_agent_environment;
pub use auxiliary::{AuxiliaryError, AuxiliaryModel};
pub use conversation::{Conversation, TurnError};
pub use error::ExplorerError;
pub use external_model::{
    ExternalChoice, ExternalModel, ExternalModelError, ExternalReply, external_model_workflows, response_tokens,
    runs_on_external_model,
};
pub use math_workflow::mix as seed_mix;
pub use openai_view::{OpenAiSession, OpenAiView, RunBudget, RunClosed};
pub use operator::{
    ExperienceOperator, OperatorEntry, OperatorOutput, PipelineOutput, apply_operators, apply_pipeline,
    apply_pipeline_blocking, builtin_operators, lookup_operator, operator_names, register_operator,
};
pub use python_json::Dumps;
pub use rollout_model::RolloutModel;
pub use runner::{
    BatchControl, DynamicTimeout, OverRollout, RunReport, RunnerOptions, TaskFailure, run_batch, run_tasks,
};
pub use workflow::{
    NameTaken, Workflow, WorkflowContext, WorkflowEntry, WorkflowFallback, WorkflowFuture, build_workflow,
    builtin_workflows, is_plugin_workflow, lookup_workflow, register_workflow, set_workflow_fallback, workflow_names,
};
