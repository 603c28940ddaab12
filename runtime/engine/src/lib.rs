//! The generation engine: batched KV-cache decoding with continuous batching, sampling, and logprobs that equal
//! the trainer's.
//!
//! # Using it
//! ```text
//! let model = trinity_model::load_model(path, Kind::Float, Device::Cpu)?;
//! let engine = Engine::start(EngineModel::from(model), EngineConfig { max_model_len: 2048, ..Default::default() })?;
//! // From any number of tasks at once (their requests share decode steps):
//! let generation = engine.generate(prompt_tokens, SamplingParams { n: 8, temperature: 1.0, ..Default::default() }).await?;
//! for c in &generation.completions { /* c.tokens, c.logprobs, c.text, c.finish_reason */ }
//! // Colocated weight sync between explore steps (in place, no copy of the trainer's tensors until here):
//! engine.sync_weights(trainer_decoder.named_parameters()?).await?;
//! ```
//! Blocking callers use `engine.submit(..)?.wait()`. Servers use `engine.submit_stream(..)?`: every sampled
//! token (with its logprob and, when [`SamplingParams::top_logprobs`] asks, the most likely alternatives) as its
//! decode step ends, then each sample's [`Completion`]; dropping the stream cancels the request and frees its
//! KV-cache slots at the next step, so a client that disconnects stops costing decode time.
//!
//! # How it runs
//! One dedicated OS thread (the [`scheduler`]) owns the [`trinity_model::Decoder`] and a preallocated
//! [`trinity_model::KvCache`] of `slots × max_model_len` positions. Requests arrive over a channel; between
//! decode steps the scheduler admits waiting requests (prefilled together; a prefix common to all of them, such
//! as a system prompt, computed once; a start an earlier prompt or conversation shares copied from the prefix
//! cache, `prefix_cache.rs`; `n` samples sharing one prefill through slot copies), runs one decode step for all
//! running sequences, and lets finished ones leave at once. Running sequences always occupy the first slots, so
//! the model reads the cache in place (no per-layer gather), and each step makes one device→host
//! transfer (the sampled ids with their logprobs).
//! When all slots are busy requests wait in arrival order: the cache never grows and nothing crashes.
//!
//! # Logprobs
//! The logprob of a generated token `y` sampled at temperature `T` is
//! `log_softmax(logits / T)[y]`, in f32, where `logits` are the model's output-layer values in the model's dtype
//! (cast to f32 before scaling), and `T = 1` for greedy decoding. This is exactly what the trainer computes with
//! [`trinity_model::Decoder::token_logprobs`] at the rollout temperature. Top-k, top-p, min-p and the
//! end-of-sequence mask of `min_tokens` restrict which token is drawn but do not enter the logprob (the trainer
//! does not know about them). In f32 the engine's values equal the training forward pass's within 1e-4 (the
//! cached decode path sums attention in a different order; 5e-5 measured on SmolLM2-135M).
//!
//! # Constrained sampling
//! A request's [`SamplingParams::constraint`] ([`TokenConstraint`]) gives each sample a state that says which
//! tokens may come next; the step samples from the masked distribution while the reported logprob stays the
//! unmasked one above, which is what the trainer recomputes. Steps without constrained rows do none of this.
//!
//! # Routed experts
//! With [`EngineConfig::return_routed_experts`], a mixture-of-experts model's completions carry the experts its
//! router chose for every token it read, prompt and response ([`Completion::routed_experts`]), which the
//! trainer's routing replay forces so that training computes with the rollout's experts. Prompts are then
//! prefilled whole (no prefix reuse), and each forward pass makes one more device→host transfer.
//!
//! # Reproducibility
//! Each sample draws from its own counter-based stream keyed by (request seed, sample index, token index)
//! ([`rng`]), never from torch's global generator, so a seeded request gives the same tokens whichever requests
//! share its batch — up to floating-point differences between batch shapes in the matmul kernels, which can
//! flip a choice between near-tied tokens.
//!
//! # Limits and truncation
//! A prompt longer than `max_model_len - 1` (or `max_prompt_tokens`) cannot start and fails with
//! [`EngineError::PromptTooLong`]; a sample that reaches `max_tokens` (a request without one: the engine's
//! `max_response_tokens`) or `max_model_len` ends with [`FinishReason::Length`]. A request asking for more samples than the cache has
//! slots fails with [`EngineError::TooManySamples`], and a KV-cache budget below one slot fails at start-up
//! with [`EngineError::KvBudgetTooSmall`].

mod constraint;
mod detokenize;
mod engine;
mod engine_config;
mod error;
mod prefix_cache;
mod request;
mod rng;
mod sampling;
mod sampling_params;
mod scheduler;
mod stats;
mod stop;
mod weight_sync;

pub use constraint::{Constraint, ConstraintError, ConstraintState, TokenConstraint};
pub use detokenize::IncrementalText;
pub use engine::{Engine, EngineInfo, EngineModel};
pub use engine_config::EngineConfig;
pub use error::{EngineError, Result};
pub use request::{
    Completion, FinishReason, Generation, GenerationEvent, GenerationStream, PendingGeneration, RoutedExperts,
    RoutingLayout, StreamedToken, TopLogprob,
};
pub use sampling_params::SamplingParams;
pub use stats::EngineStats;
pub use weight_sync::WeightSink;
