//! The engine handle: start the scheduler thread, submit requests from any thread or task, sync weights.
//!
//! The handle is `Send + Sync`: share it as `&Engine` or `Arc<Engine>` between any number of tasks. Requests
//! are checked here, on the caller's side, so that a malformed request fails at once with a named error and
//! never reaches the batch. Dropping the handle shuts the scheduler down (what is still running is answered
//! with [`EngineError::Stopped`]) and joins its thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tch::{Device, Kind, Tensor};
use tokio::sync::oneshot;
use trinity_model::{Decoder, LoadedModel, Tokenizer};

use crate::engine_config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::request::{Generation, GenerationStream, PendingGeneration, PendingRequest, Reply, RoutingLayout};
use crate::rng::fresh_seed;
use crate::sampling_params::SamplingParams;
use crate::scheduler::{Command, Scheduler, SchedulerSetup};
use crate::stats::EngineStats;
use crate::weight_sync::{NamedCopy, WeightSink};

/// What the engine serves: the network, optionally its tokenizer (for text, stop strings), and the token ids
/// that end a sample.
#[derive(Debug)]
pub struct EngineModel {
    /// The network; the engine owns it on its scheduler thread.
    pub decoder: Decoder,
    /// Decodes completions to text and finds stop strings; without it completions have empty text.
    pub tokenizer: Option<Tokenizer>,
    /// End-of-sequence ids (generation_config.json, config.json or the tokenizer's EOS).
    pub eos_token_ids: Vec<i64>,
}

impl From<LoadedModel> for EngineModel {
    /// Takes the decoder, tokenizer and EOS ids; the chat template stays with the caller's copy of the
    /// tokenizer side (clone `tokenizer` first when the caller still needs it).
    fn from(model: LoadedModel) -> Self {
        Self { decoder: model.decoder, tokenizer: Some(model.tokenizer), eos_token_ids: model.eos_token_ids }
    }
}

/// Facts about a running engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineInfo {
    /// KV-cache slots: the most sequences decoded at once.
    pub num_slots: usize,
    /// Most tokens per sequence (prompt + response).
    pub max_model_len: usize,
    /// Longest accepted prompt.
    pub max_prompt_tokens: usize,
    /// Vocabulary size of the model's output layer.
    pub vocab_size: usize,
    /// Model dtype.
    pub kind: Kind,
    /// Model device.
    pub device: Device,
    /// Bytes the KV cache takes.
    pub kv_cache_bytes: u64,
    /// A mixture-of-experts model's routing layout (`None` for a dense model), the shape of
    /// [`crate::Completion::routed_experts`].
    pub routing: Option<RoutingLayout>,
    /// Whether completions carry their routed experts ([`EngineConfig::return_routed_experts`]).
    pub returns_routed_experts: bool,
}

/// A running generation engine; see the crate docs for the request lifecycle.
#[derive(Debug)]
pub struct Engine {
    commands: Sender<Command>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Mutex<EngineStats>>,
    next_id: AtomicU64,
    info: EngineInfo,
    prompt_limit_name: &'static str,
    has_tokenizer: bool,
}

impl Engine {
    /// Allocates the KV cache and starts the scheduler thread.
    ///
    /// Errors: a config out of range, a KV-cache budget below one slot, or the allocation failing.
    pub fn start(model: EngineModel, config: EngineConfig) -> Result<Self> {
        let EngineModel { decoder, tokenizer, eos_token_ids } = model;
        let kind = decoder.kind();
        // A packed bf16 model decodes with an fp32 cache (Decoder::prepare_decode runs on the engine thread).
        let cache_kind = decoder.decode_cache_kind();
        let num_slots = config.num_slots(decoder.config(), cache_kind)?;
        let (max_prompt_tokens, prompt_limit_name) = config.prompt_limit();
        let routing = decoder.config().moe.as_ref().map(|moe| RoutingLayout {
            layers: decoder.sparse_layers().len(),
            top_k: moe.num_experts_per_tok as usize,
            num_experts: moe.num_experts as usize,
        });
        let routing = routing.filter(|r| r.layers > 0);
        if config.return_routed_experts && routing.is_none() {
            return Err(EngineError::InvalidConfig {
                key: "return_routed_experts",
                reason: format!(
                    "the model ({:?}) has no mixture-of-experts layer, so there are no routed experts to return",
                    decoder.config().family
                ),
            });
        }
        let info = EngineInfo {
            num_slots,
            max_model_len: config.max_model_len,
            max_prompt_tokens,
            vocab_size: decoder.config().vocab_size as usize,
            kind,
            device: decoder.device(),
            kv_cache_bytes: config.bytes_per_slot(decoder.config(), cache_kind) * num_slots as u64,
            routing,
            returns_routed_experts: config.return_routed_experts,
        };
        let eos = eos_token_ids.iter().filter_map(|&t| u32::try_from(t).ok()).collect();
        let has_tokenizer = tokenizer.is_some();
        let setup = SchedulerSetup {
            tokenizer,
            eos,
            max_model_len: config.max_model_len,
            max_response_tokens: config.max_response_tokens,
            max_prefill_tokens: config.max_prefill_tokens,
            routed: config.return_routed_experts,
        };
        // libtorch's intra-op thread count is per thread: carry the caller's (or the configured) setting over.
        let threads = config.num_threads.map_or_else(tch::get_num_threads, |n| n as i32);
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let (commands, receiver) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let thread_stats = Arc::clone(&stats);
        let max_model_len = config.max_model_len;
        let thread = std::thread::Builder::new()
            .name("trinity-engine".into())
            .spawn(move || {
                tch::set_num_threads(threads);
                let mut decoder = decoder;
                match decoder.prepare_decode() {
                    Ok(packed) => tracing::debug!(packed, "packed small-batch decode kernels"),
                    Err(error) => {
                        let _ = ready_tx.send(Err(error.into()));
                        return;
                    }
                }
                let cache = match decoder.new_cache(num_slots, max_model_len) {
                    Ok(cache) => cache,
                    Err(error) => {
                        let _ = ready_tx.send(Err(error.into()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                Scheduler::new(decoder, cache, setup, receiver, thread_stats).run();
            })
            .map_err(|e| EngineError::InvalidConfig { key: "thread", reason: format!("cannot start: {e}") })?;
        ready_rx.recv().unwrap_or(Err(EngineError::Stopped))?;
        tracing::debug!(?info, "generation engine started");
        Ok(Self {
            commands,
            thread: Some(thread),
            stats,
            next_id: AtomicU64::new(0),
            info,
            prompt_limit_name,
            has_tokenizer,
        })
    }

    /// Sizes and limits of this engine.
    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// A snapshot of the work done so far.
    pub fn stats(&self) -> EngineStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a request and returns at once; await the result (or [`PendingGeneration::wait`]).
    ///
    /// Errors at once (request never queued): an empty prompt, a prompt over the prompt limit, a token id
    /// outside the vocabulary, `n` above the number of KV-cache slots, invalid sampling parameters, or a
    /// stopped engine.
    pub fn submit(&self, prompt: Vec<u32>, params: SamplingParams) -> Result<PendingGeneration> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.check(id, &prompt, &params)?;
        let (reply, receiver) = oneshot::channel();
        self.queue(id, prompt, params, Reply::Whole(reply))?;
        Ok(PendingGeneration { id, reply: receiver })
    }

    /// Queues a request whose tokens are delivered as they are sampled (for servers that stream, and for
    /// callers that may give up early); checked like [`Engine::submit`]. Dropping the returned stream cancels
    /// the request.
    pub fn submit_stream(&self, prompt: Vec<u32>, params: SamplingParams) -> Result<GenerationStream> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.check(id, &prompt, &params)?;
        // Unbounded: a stream holds at most `n × max_tokens` events, all of which the caller asked for; the
        // scheduler thread must never block on a slow reader.
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        self.queue(id, prompt, params, Reply::Stream(sender))?;
        Ok(GenerationStream { id, events })
    }

    fn queue(&self, id: u64, prompt: Vec<u32>, params: SamplingParams, reply: Reply) -> Result<()> {
        let seed = params.seed.unwrap_or_else(fresh_seed);
        let request = PendingRequest { id, prompt, params, seed, reply };
        self.commands.send(Command::Generate(request)).map_err(|_| EngineError::Stopped)
    }

    /// Generates completions for `prompt`; any number of callers may await at once, and their requests are
    /// batched together.
    pub async fn generate(&self, prompt: Vec<u32>, params: SamplingParams) -> Result<Generation> {
        self.submit(prompt, params)?.await
    }

    /// Runs `task` on the scheduler thread with exclusive access to the decoder, between two steps, and returns
    /// its result. Sequences already running continue afterwards with whatever the task left.
    pub async fn with_decoder<R, F>(&self, task: F) -> Result<R>
    where
        F: FnOnce(&mut Decoder) -> R + Send + 'static,
        R: Send + 'static,
    {
        let (reply, receiver) = oneshot::channel();
        let command = Command::WithDecoder(Box::new(move |decoder: &mut Decoder| {
            let _ = reply.send(task(decoder));
        }));
        self.commands.send(command).map_err(|_| EngineError::Stopped)?;
        receiver.await.map_err(|_| EngineError::Stopped)
    }

    /// Copies new weights into the engine's decoder in place (colocated weight sync), between two steps.
    ///
    /// `weights` are `(HF name, tensor)` pairs covering every parameter, typically the trainer's
    /// [`Decoder::named_parameters`] (shallow handles, no copy until here; any dtype/device, converted while
    /// copying). The engine's tensors keep their storage. The caller must not modify the source tensors until
    /// this returns. Errors name a missing parameter or a shape mismatch; on error some tensors may already
    /// hold the new values.
    pub async fn sync_weights(&self, weights: Vec<(String, Tensor)>) -> Result<()> {
        self.with_decoder(move |decoder| {
            let mut copy = NamedCopy::new(decoder);
            copy.part(weights)?;
            copy.finish()
        })
        .await?
    }

    /// Starts an in-place weight sync whose tensors come part by part ([`WeightSink::send`]), for a source that
    /// never holds the whole model at once: ZeRO stage 3 gathers its parameters layer by layer. The scheduler
    /// holds the decoder from the first part to [`WeightSink::finish`], so no decode step ever reads a model
    /// that is half one version and half the next.
    pub fn weight_sink(&self) -> Result<WeightSink> {
        // A rendezvous channel: `send` returns once the scheduler has taken the part, so at most the part being
        // copied and the one the caller is producing exist at once.
        let (parts, incoming) = mpsc::sync_channel::<Vec<(String, Tensor)>>(0);
        let (reply, done) = oneshot::channel();
        let command = Command::WithDecoder(Box::new(move |decoder: &mut Decoder| {
            let mut copy = NamedCopy::new(decoder);
            let mut result = Ok(());
            // Every part is taken even after a failure, so the sender (inside a collective that other ranks
            // join) never blocks; the first error is the answer.
            for part in incoming {
                if result.is_ok() {
                    result = copy.part(part);
                }
            }
            let _ = reply.send(result.and_then(|()| copy.finish()));
        }));
        self.commands.send(command).map_err(|_| EngineError::Stopped)?;
        Ok(WeightSink { parts, done })
    }

    fn check(&self, id: u64, prompt: &[u32], params: &SamplingParams) -> Result<()> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt { request: id });
        }
        if prompt.len() > self.info.max_prompt_tokens {
            return Err(EngineError::PromptTooLong {
                request: id,
                prompt_tokens: prompt.len(),
                limit: self.info.max_prompt_tokens,
                limit_name: self.prompt_limit_name,
            });
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            return Err(EngineError::InvalidParams {
                request: id,
                param: "prompt",
                reason: format!("token id {bad} is outside the vocabulary of {}", self.info.vocab_size),
            });
        }
        if params.n > self.info.num_slots {
            return Err(EngineError::TooManySamples { request: id, n: params.n, slots: self.info.num_slots });
        }
        params.validate(id, self.info.vocab_size, self.has_tokenizer)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
