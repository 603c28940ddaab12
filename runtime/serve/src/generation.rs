//! One generation request on its way through the engine: the prompts submitted as streamed engine requests
//! (their samples share a prefill), their events merged, each choice's tokens, logprobs and top logprobs
//! collected, and the finished response recorded.
//!
//! A [`Run`] owns the engine streams: dropping it (the client disconnected, so axum dropped the handler or the
//! response body) drops them, and the engine frees their KV-cache slots at its next step. It also owns the
//! recorder reservation (released if the run never records) and counts itself in the metrics. A request on a
//! workflow run's URL is admitted against the run's model budget before anything is submitted (one call per
//! prompt, each of `n` samples, as the Python host's `generate` and the WASM host count), and what it generated
//! is spent when the run ends, however it ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream, SelectAll};
use trinity_engine::{EngineError, FinishReason, GenerationEvent, SamplingParams, TopLogprob};

use crate::error::ApiError;
use crate::recorder::{ChoiceRecord, Reservation, ResponseRecord, build_experiences};
use crate::server::AppState;
use crate::target::{Recording, Target};

/// A validated request, ready for the engine.
#[derive(Debug)]
pub(crate) struct Job {
    /// `chat.completions` or `completions` (metrics and recorded experiences).
    pub(crate) endpoint: &'static str,
    /// The model that answers and where its replies go.
    pub(crate) target: Target,
    /// One prompt (chat) or several (a batch of completions); each gets `params.n` choices.
    pub(crate) prompts: Vec<Arc<Vec<u32>>>,
    pub(crate) params: SamplingParams,
    /// When the request arrived (latency and time to first token).
    pub(crate) started: Instant,
    /// The parameter that constrained `params` (`tool_choice`, `response_format`), named by the 400 when the
    /// constraint cannot go on; `None` when nothing constrains the output.
    pub(crate) constrained_by: Option<&'static str>,
}

/// One choice being generated.
#[derive(Debug, Default)]
pub(crate) struct ChoiceState {
    /// Which prompt of the job it samples.
    pub(crate) prompt: usize,
    pub(crate) tokens: Vec<u32>,
    pub(crate) logprobs: Vec<f32>,
    /// Per token, the most likely alternatives (empty unless asked).
    pub(crate) top: Vec<Vec<TopLogprob>>,
    /// The engine's final text (cut before a stop string) and finish reason, once finished.
    pub(crate) finished: Option<(String, FinishReason)>,
}

/// What the latest engine event changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Update {
    /// Choice `i` has a new last token.
    Token(usize),
    /// Choice `i` ended.
    Finished(usize),
}

type Tagged = (usize, Result<GenerationEvent, EngineError>);

/// A request in the engine.
pub(crate) struct Run {
    state: Arc<AppState>,
    pub(crate) endpoint: &'static str,
    pub(crate) target: Target,
    events: SelectAll<BoxStream<'static, Tagged>>,
    pub(crate) prompts: Vec<Arc<Vec<u32>>>,
    pub(crate) choices: Vec<ChoiceState>,
    pub(crate) n: usize,
    pub(crate) temperature: f32,
    reservation: Option<Reservation>,
    version_start: u64,
    started: Instant,
    first_token: Option<Duration>,
    unfinished: usize,
    constrained_by: Option<&'static str>,
    /// Set once the response went out whole (or failed with a status already counted).
    done: bool,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run").field("endpoint", &self.endpoint).field("unfinished", &self.unfinished).finish()
    }
}

/// `stop` for both an end-of-sequence token and a stop string or id, as OpenAI reports them.
pub(crate) fn finish_reason_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

impl Run {
    /// Reserves recorder room and submits every prompt; errors (prompt too long, bad parameters, a full
    /// recorder) come back before anything is generated.
    pub(crate) fn start(state: &Arc<AppState>, job: Job) -> Result<Run, ApiError> {
        let n = job.params.n;
        let total = n * job.prompts.len();
        if let Some(budget) = &job.target.budget {
            for _ in &job.prompts {
                budget.admit(n as u64).map_err(ApiError::over_budget)?;
            }
        }
        // Only the rollout model's replies are recorded, and only mode `serve` bounds what it holds.
        let reservation = match &state.recording {
            Recording::Feedback(recorder) if job.target.policy => Some(recorder.reserve(total)?),
            _ => None,
        };
        let engine = job.target.model.engine();
        let version_start = job.target.model.model_version();
        let mut events = SelectAll::new();
        for (i, prompt) in job.prompts.iter().enumerate() {
            let mut stream = engine.submit_stream(prompt.as_ref().clone(), job.params.clone())?;
            let tagged = stream::poll_fn(move |cx| stream.poll_next(cx).map(|e| e.map(|e| (i, e))));
            events.push(tagged.boxed());
        }
        let choices = (0..total).map(|c| ChoiceState { prompt: c / n, ..ChoiceState::default() }).collect();
        state.metrics.enter();
        Ok(Run {
            state: Arc::clone(state),
            endpoint: job.endpoint,
            target: job.target,
            events,
            prompts: job.prompts,
            choices,
            n,
            temperature: job.params.logprob_temperature(),
            reservation,
            version_start,
            started: job.started,
            first_token: None,
            unfinished: total,
            constrained_by: job.constrained_by,
            done: false,
        })
    }

    /// The next change, `None` when every choice has finished; an engine failure is an error (the run is
    /// over then).
    pub(crate) async fn next(&mut self) -> Option<Result<Update, ApiError>> {
        if self.unfinished == 0 {
            return None;
        }
        let Some((prompt, event)) = self.events.next().await else {
            // Every stream ended without finishing all choices: the engine went away.
            return Some(Err(EngineError::Stopped.into()));
        };
        match event {
            Ok(GenerationEvent::Token(token)) => {
                if self.first_token.is_none() {
                    let after = self.started.elapsed();
                    self.first_token = Some(after);
                    self.state.metrics.first_token(after);
                }
                let index = prompt * self.n + token.sample;
                let choice = &mut self.choices[index];
                choice.tokens.push(token.token);
                choice.logprobs.push(token.logprob);
                if !token.top_logprobs.is_empty() {
                    choice.top.push(token.top_logprobs);
                }
                Some(Ok(Update::Token(index)))
            }
            Ok(GenerationEvent::Finished { sample, completion }) => {
                let index = prompt * self.n + sample;
                let choice = &mut self.choices[index];
                // The engine's record is authoritative (it equals what was streamed).
                choice.tokens = completion.tokens;
                choice.logprobs = completion.logprobs;
                choice.finished = Some((completion.text, completion.finish_reason));
                self.unfinished -= 1;
                Some(Ok(Update::Finished(index)))
            }
            Err(error) => {
                self.unfinished = 0;
                let failed_constraint = matches!(error, EngineError::ConstraintFailed { .. });
                let mut error = ApiError::from(error);
                if let (true, Some(param)) = (failed_constraint, self.constrained_by) {
                    error.param = Some(param.to_owned());
                }
                Some(Err(error))
            }
        }
    }

    /// Runs every choice to its end (non-streamed responses).
    pub(crate) async fn finish_all(&mut self) -> Result<(), ApiError> {
        while let Some(update) = self.next().await {
            update?;
        }
        Ok(())
    }

    /// Prompt tokens (each prompt once) and generated tokens so far.
    pub(crate) fn usage(&self) -> (usize, usize) {
        (self.prompts.iter().map(|p| p.len()).sum(), self.choices.iter().map(|c| c.tokens.len()).sum())
    }

    /// Records the finished response under `id`; `finish_reasons` are the choices' reasons as returned (a
    /// parsed tool call counts as `tool_calls`).
    pub(crate) fn record(&mut self, id: &str, finish_reasons: &[&'static str]) {
        let reservation = self.reservation.take();
        let view = match &self.state.recording {
            Recording::Workflows(view) if self.target.policy && self.target.run.is_some() => Some(view),
            _ => None,
        };
        if reservation.is_none() && view.is_none() {
            return;
        }
        let choices = self
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| ChoiceRecord {
                choice: i,
                prompt: Arc::clone(&self.prompts[c.prompt]),
                tokens: c.tokens.clone(),
                logprobs: c.logprobs.clone(),
                text: c.finished.as_ref().map(|(text, _)| text.clone()).unwrap_or_default(),
                finish_reason: finish_reasons.get(i).copied().unwrap_or("stop"),
            })
            .collect();
        let response = ResponseRecord {
            id: id.to_owned(),
            endpoint: self.endpoint,
            versions: (self.version_start, self.target.model.model_version()),
            temperature: self.temperature,
            choices,
        };
        let tokenizer = self.target.model.tokenizer();
        let prompt_text = |prompt: &[u32]| tokenizer.decode(prompt, false).ok();
        if let Some(reservation) = reservation {
            reservation.record(response, &prompt_text);
        } else if let (Some(view), Some(run)) = (view, &self.target.run)
            && let Err(closed) = view.record(run, build_experiences(&response, &prompt_text))
        {
            // The workflow finished (or failed) while its request ran; nobody is left to train on the reply.
            tracing::debug!("{closed}");
        }
    }

    /// Marks the response as delivered: counts its tokens and latency.
    pub(crate) fn complete(&mut self) {
        if !self.done {
            self.done = true;
            let (prompt, completion) = self.usage();
            self.state.metrics.tokens(prompt, completion);
            self.state.metrics.request_done(self.endpoint, 200, self.started.elapsed());
        }
    }

    /// Marks the run as failed with `error` (already sent to the client).
    pub(crate) fn failed(&mut self, error: &ApiError) {
        if !self.done {
            self.done = true;
            self.state.metrics.request_done(self.endpoint, error.status.as_u16(), self.started.elapsed());
        }
    }

    /// The server's state (for tokenizer access while rendering).
    pub(crate) fn state(&self) -> &Arc<AppState> {
        &self.state
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(budget) = &self.target.budget {
            budget.spend(self.usage().1 as u64);
        }
        self.state.metrics.leave();
        if !self.done {
            // The client went away before the response was complete; the engine streams drop with `self`.
            self.state.metrics.cancelled();
            self.state.metrics.request_done(self.endpoint, 499, self.started.elapsed());
            tracing::debug!(endpoint = self.endpoint, "request cancelled: the client disconnected");
        }
    }
}
