//! What goes into the engine (a prompt and its parameters) and what comes out (one completion per sample).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::error::{EngineError, Result};
use crate::sampling_params::SamplingParams;

/// A completion's routing ([`Completion::routed_experts`]).
pub use trinity_model::RoutedExperts;

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The model produced one of its end-of-sequence ids (kept as the last token).
    Eos,
    /// A stop string appeared in the text or a `stop_token_ids` id was produced.
    Stop,
    /// `max_tokens` (else the engine's `max_response_tokens`) or `max_model_len` (prompt + response) was reached:
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
    /// The experts each token was routed to, when the engine records them
    /// ([`crate::EngineConfig::return_routed_experts`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routed_experts: Option<RoutedExperts>,
}

/// How a mixture-of-experts model's routing is laid out ([`crate::EngineInfo::routing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RoutingLayout {
    /// Sparse layers.
    pub layers: usize,
    /// Experts a token is routed to in each.
    pub top_k: usize,
    /// Experts a layer holds.
    pub num_experts: usize,
}

/// The answer to one request: its `n` completions in sample order.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The engine-assigned request id (as in error messages and logs).
    pub request: u64,
    /// One completion per sample.
    pub completions: Vec<Completion>,
}

/// One of the most likely tokens at a generated position, with its logprob under the same distribution as the
/// sampled token's (`log_softmax(logits / T)`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TopLogprob {
    /// The token id.
    pub token: u32,
    /// Its logprob.
    pub logprob: f32,
}

/// A token of a streamed request, delivered as soon as the decode step that sampled it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamedToken {
    /// Which sample (`0..n`) the token belongs to.
    pub sample: usize,
    /// The sampled id.
    pub token: u32,
    /// Its logprob, as in [`Completion::logprobs`].
    pub logprob: f32,
    /// The [`SamplingParams::top_logprobs`] most likely tokens at this position, most likely first; empty when
    /// none were asked for.
    pub top_logprobs: Vec<TopLogprob>,
}

/// What a [`GenerationStream`] yields.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// A sample produced a token.
    Token(StreamedToken),
    /// A sample ended; `completion` holds all its tokens and logprobs (the ones streamed before) and its final
    /// text (cut before a matched stop string).
    Finished {
        /// Which sample ended.
        sample: usize,
        /// The whole sample.
        completion: Completion,
    },
}

/// Where the scheduler sends a request's result: all at once, or event by event.
#[derive(Debug)]
pub(crate) enum Reply {
    Whole(oneshot::Sender<Result<Generation>>),
    Stream(mpsc::UnboundedSender<Result<GenerationEvent>>),
}

impl Reply {
    /// Whether the caller went away (dropped its handle or stream), so the request can be dropped.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            Reply::Whole(sender) => sender.is_closed(),
            Reply::Stream(sender) => sender.is_closed(),
        }
    }

    /// Answers the request with `error` (a stream gets it as its last event).
    pub(crate) fn fail(self, error: EngineError) {
        match self {
            Reply::Whole(sender) => {
                let _ = sender.send(Err(error));
            }
            Reply::Stream(sender) => {
                let _ = sender.send(Err(error));
            }
        }
    }
}

/// A request on its way to, or waiting in, the scheduler.
#[derive(Debug)]
pub(crate) struct PendingRequest {
    pub(crate) id: u64,
    pub(crate) prompt: Vec<u32>,
    pub(crate) params: SamplingParams,
    /// The request's seed (drawn at submission when the parameters carry none).
    pub(crate) seed: u64,
    pub(crate) reply: Reply,
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

/// A submitted streaming request ([`crate::Engine::submit_stream`]): each sampled token as its decode step
/// ends, each sample's end, then `None`. An error is the last event. Dropping the stream (or
/// [`GenerationStream::cancel`]) cancels the request: its sequences leave the batch and free their KV-cache
/// slots at the next decode step.
#[derive(Debug)]
pub struct GenerationStream {
    pub(crate) id: u64,
    pub(crate) events: mpsc::UnboundedReceiver<Result<GenerationEvent>>,
}

impl GenerationStream {
    /// The engine-assigned request id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event; `None` once every sample has finished (or after an error).
    pub async fn next(&mut self) -> Option<Result<GenerationEvent>> {
        self.events.recv().await
    }

    /// Polls for the next event (for adapting the stream to other stream types).
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<GenerationEvent>>> {
        self.events.poll_recv(cx)
    }

    /// Blocks the current thread for the next event. Must not be called from async code (use `.next()`).
    pub fn blocking_next(&mut self) -> Option<Result<GenerationEvent>> {
        self.events.blocking_recv()
    }

    /// Cancels the request (the same as dropping the stream).
    pub fn cancel(self) {}
}
