//! Serve mode: the rollout model behind an OpenAI-compatible HTTP API, in the same process as the engine, that
//! records every reply as a trainable experience.
//!
//! Agents in any language (the `openai` clients, AgentScope, LangChain) talk to [`serve`]'s server as to any
//! OpenAI endpoint; each choice it returns is kept as an [`trinity_buffer::Experience`] holding the exact
//! sampled token ids, their logprobs, the prompt tokens and the model version. The agent rewards replies by
//! response id (`POST /feedback`) and commits (`POST /commit`), which hands the rewarded experiences to an
//! [`ExperienceSink`] — in `trinity run`, the experience pipeline and the buffer a trainer reads.
//!
//! [`serve_workflows`] serves the same API to the explorer's workflows (`explorer.rollout_model.enable_openai_api`)
//! on a loopback port: each workflow run has a base URL of its own (`/runs/<key>/v1`) under which its replies are
//! filed for it ([`trinity_explorer::OpenAiView`]); there is no `/feedback` or `/commit`. In both, a request's
//! `model` names the rollout model or one of its auxiliary models, whose replies are never recorded.
//!
//! # Endpoints
//! - `POST /v1/chat/completions`: `messages` (system/developer/user/assistant/tool; content as a string or text
//!   parts), `model`, `n` (choices share one prefill), `temperature`, `top_p`, `max_tokens` /
//!   `max_completion_tokens`, `stop`, `seed`, `logprobs` / `top_logprobs` (0–20), `stream` (SSE) with
//!   `stream_options.include_usage`, `tools` / `tool_choice` (`auto`, `none`: tools are rendered through the
//!   chat template's `tools` variable and hermes-style `<tool_call>{json}</tool_call>` blocks in the output
//!   become `tool_calls` with `finish_reason: tool_calls`, when `ServeOptions::auto_tool_choice` allows it; else
//!   `auto` is a 400 as in vLLM without `--enable-auto-tool-choice`; `required` and a named function are
//!   sampled under the tools' JSON schema and always come back as `tool_calls`, as vLLM's structured outputs
//!   do: `forced_tools.rs`, `constrained/`), and vLLM's `return_token_ids` (`prompt_token_ids`,
//!   `choices[].token_ids`), `top_k`, `min_p`, `min_tokens`, `ignore_eos`, `stop_token_ids`,
//!   `add_generation_prompt`, `continue_final_message`; `response_format` `text`, `json_object` and
//!   `json_schema` (the reply's `content` sampled under the schema, as vLLM's structured outputs do:
//!   `response_format.rs`). With `ServeOptions::reasoning_parser` (Trinity's
//!   `reasoning_parser`: `deepseek_r1`, `qwen3`) the model's `<think>...</think>` text is returned as the
//!   message's `reasoning_content` (streamed as `delta.reasoning_content`) and `content` is the answer alone.
//! - `POST /v1/completions`: `prompt` as text, token ids or a batch of either; `logprobs` as a count.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
//! - `POST /feedback {"msg_ids": [...], "reward": r, "task_id"?, "run_id"?}`: a msg id is a response `id`
//!   (all its choices) or `<id>#<choice index>` (one choice). `task_id` groups experiences for group
//!   advantages. Unknown ids: 404 naming them, nothing changed.
//! - `POST /commit`: hands every rewarded experience to the sink, grouped (see [`ExperienceSink`]); unrewarded
//!   ones stay pending.
//!
//! Every endpoint is behind the request guard (`request_guard.rs`): on loopback a `Host` that is not `localhost`
//! or a loopback IP is a 421 (DNS rebinding), a POST body must be `application/json` (415) and a POST from a web
//! page of another origin is a 403, and with [`ServeOptions::api_keys`] every request needs
//! `Authorization: Bearer <key>` (401).
//!
//! Errors are OpenAI-style bodies with the status the clients expect; an unknown field is a 400, as are
//! parameters the engine cannot honour (penalties, logit bias, `response_format` `structural_tag`).
//!
//! # Invariants
//! - A client that disconnects cancels its request: the engine drops its sequences at the next decode step.
//! - Nothing holds the engine between requests: weights synced with `Engine::sync_weights` take effect at the
//!   next decode step while requests are in flight.
//! - The recorder is bounded (`ServeOptions::max_pending_experiences`): a request that would overflow it is
//!   refused with 429 before it generates.
//! - A prompt provably longer than the model accepts is refused before it is tokenized, and a body longer than
//!   such a prompt's JSON can be is refused unread (`prompt_length.rs`).
//! - [`ServerHandle::shutdown`] commits every rewarded experience left, and logs what it cannot hand over.
//! - A recorded experience's response tokens and logprobs are exactly the `token_ids` and logprobs the client
//!   received.

mod chat;
mod completions;
mod constrained;
mod error;
mod forced_tools;
mod generation;
mod ids;
mod large_requests;
mod logprobs;
mod metrics;
mod params;
mod prompt_length;
mod reasoning;
mod recorder;
mod request_guard;
mod response_format;
mod server;
mod sse;
mod target;
mod tool_calls;

pub use error::ServeError;
pub use reasoning::ReasoningParser;
pub use recorder::{CommitReport, ExperienceSink, SinkError, SinkFuture};
pub use server::{ServeOptions, ServerHandle, serve, serve_workflows};
