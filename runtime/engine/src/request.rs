//! What goes into the engine (a prompt and its parameters) and what comes out (one completion per sample).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde::Serialize;
use tokio::sync::oneshot;

use crate::error::{EngineError, Result};
use crate::sampling_params::SamplingParams;

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The model produced one of its end-of-sequence ids (kept as the last token).
    Eos,
    /// A stop string appeared in the text or a `stop_token_ids` id was produced.
    Stop,
    /// `max_tokens`, the engine's `max_response_tokens`, or `max_model_len` (prompt + response) was reached:
    /// the response is truncated.
    Length,
}

/// One sample of a prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    /// Decoded text without special tokens, cut before a matched stop string; empty when the engine has no
    /// tokenizer.
    pub text: String,
    /// Generated token ids, including a final end-of-sequence or stop id and the tokens that completed a stop
    /// string (what the policy produced, so what the trainer should score).
    pub tokens: Vec<u32>,
    /// `log_softmax(logits / T)[token]` in f32 for each token, `T` the sampling temperature (1 when greedy):
    /// exactly what the training forward pass computes (see the crate docs).
    pub logprobs: Vec<f32>,
    /// Why the sample ended.
    pub finish_reason: FinishReason,
}

/// The answer to one request: its `n` completions in sample order.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The engine-assigned request id (as in error messages and logs).
    pub request: u64,
    /// One completion per sample.
    pub completions: Vec<Completion>,
}

/// A request on its way to, or waiting in, the scheduler.
#[derive(Debug)]
pub(crate) struct PendingRequest {
    pub(crate) id: u64,
    pub(crate) prompt: Vec<u32>,
    pub(crate) params: SamplingParams,
    /// The request's seed (drawn at submission when the parameters carry none).
    pub(crate) seed: u64,
    pub(crate) reply: oneshot::Sender<Result<Generation>>,
}

/// A submitted request: await it (async) or [`PendingGeneration::wait`] for it (blocking). Dropping it cancels
/// the request and frees its KV-cache slots at the next decode step.
#[derive(Debug)]
pub struct PendingGeneration {
    pub(crate) id: u64,
    pub(crate) reply: oneshot::Receiver<Result<Generation>>,
}

impl PendingGeneration {
    /// The engine-assigned request id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Blocks the current thread until the request finishes. Must not be called from async code (use `.await`).
    pub fn wait(self) -> Result<Generation> {
        self.reply.blocking_recv().unwrap_or(Err(EngineError::Stopped))
    }
}

impl Future for PendingGeneration {
    type Output = Result<Generation>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.reply).poll(cx).map(|r| r.unwrap_or(Err(EngineError::Stopped)))
    }
}
