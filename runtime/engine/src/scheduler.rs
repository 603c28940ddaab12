//! The scheduler: the one thread that owns the model and the KV cache and runs continuous batching.
//!
//! Each iteration: take new commands (blocking only when there is nothing to do), drop cancelled requests,
//! admit waiting requests in arrival order while KV-cache slots and the prefill token budget allow and prefill
//! them together (one forward pass over their right-padded prompts, one slot each; the other `n - 1` samples of
//! a request get copies of that slot), then run one decode step for every running sequence. A sequence that
//! finishes leaves the batch at once and frees its slot; a request is answered when its last sample finishes.
//! Requests that do not fit wait in the queue (back-pressure); nothing is ever dropped for lack of room.
//!
//! Invariants between iterations:
//! - `running[i].slot == i`: the running sequences occupy slots `0..running.len()`, so every decode step hands
//!   the model a contiguous slot range and attention reads the cache in place (the model copies the cache
//!   rows only for a non-contiguous slot list). When sequences finish, the highest-slot survivors move down
//!   into the holes ([`trinity_model::KvCache::copy_slot`], one copy of each moved sequence, once).
//! - A free slot has cache length 0, except the slots of the [`PrefixCache`]: recent prompts kept while no
//!   sequence needs their slots, so that a later prompt sharing a start with one of them (the system prompt and
//!   chat-template header of every task, an agent's conversation so far) prefills only the rest. They are
//!   forgotten whenever the model may have changed (every [`Command::WithDecoder`]).
//! - Per running sequence, the cache holds `prompt + tokens - 1` positions: the newest token is fed by the next
//!   decode step. A sample ends (`length`) when `prompt + tokens` reaches `max_model_len`, so the cache never
//!   needs more than `max_model_len - 1` positions.
//!
//! libtorch calls block, so this runs on a dedicated OS thread, never on an async runtime's workers; callers
//! talk to it through channels (see [`crate::Engine`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tch::Tensor;
use trinity_model::{Decoder, KvCache, Tokenizer};

use crate::constraint::{ConstraintError, ConstraintState, row_mask};
use crate::error::{EngineError, Result};
use crate::prefix_cache::{MIN_REUSE, Match, PrefixCache, common_start};
use crate::request::{
    Completion, FinishReason, Generation, GenerationEvent, PendingRequest, Reply, RoutedExperts, StreamedToken,
    TopLogprob,
};
use crate::rng::uniform;
use crate::sampling::{RowSpec, sample};
use crate::sampling_params::SamplingParams;
use crate::stats::EngineStats;
use crate::stop::StopStrings;

/// A closure run on the scheduler thread with the model, between steps (weight sync, inspection).
pub(crate) type DecoderTask = Box<dyn FnOnce(&mut Decoder) + Send>;

/// Messages from [`crate::Engine`] handles to the scheduler.
pub(crate) enum Command {
    Generate(PendingRequest),
    WithDecoder(DecoderTask),
    Shutdown,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Generate(r) => write!(f, "Generate({})", r.id),
            Command::WithDecoder(_) => f.write_str("WithDecoder"),
            Command::Shutdown => f.write_str("Shutdown"),
        }
    }
}

/// A request whose constraint could not go on, and what it reported.
type ConstraintFailure = (u64, ConstraintError);

/// A request whose samples are running.
struct RequestState {
    params: SamplingParams,
    seed: u64,
    /// The prompt, which a finished single sample's conversation entry in the prefix cache starts with.
    prompt: Vec<u32>,
    /// Most new tokens per sample, all limits applied.
    max_new: usize,
    /// Ids masked while a sample is below `min_tokens`: the model's EOS ids (unless ignored) and stop ids.
    banned: Vec<i64>,
    /// Finished samples of a request answered as a whole (a streamed request gets each one as it ends).
    completions: Vec<Option<Completion>>,
    unfinished: usize,
    reply: Reply,
}

/// One sample being generated.
struct Sequence {
    request: u64,
    sample: usize,
    slot: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    stop: Option<StopStrings>,
    /// The experts of every token read so far, `[tokens, layers, k]` flat, when the engine records them.
    routed: Vec<u16>,
    /// Where the sample is in its request's constraint, when it has one.
    constraint: Option<Box<dyn ConstraintState>>,
}

/// Everything the scheduler thread owns.
pub(crate) struct Scheduler {
    decoder: Decoder,
    cache: KvCache,
    tokenizer: Option<Tokenizer>,
    eos: Vec<u32>,
    max_model_len: usize,
    max_response_tokens: Option<usize>,
    max_prefill_tokens: usize,
    commands: Receiver<Command>,
    waiting: VecDeque<PendingRequest>,
    requests: HashMap<u64, RequestState>,
    running: Vec<Sequence>,
    stats: Arc<Mutex<EngineStats>>,
    /// Recent prompts and conversations kept in free slots (see the module docs).
    prefixes: PrefixCache,
    /// The pass in progress, counted into `stats` as soon as its tokens are sampled (before any reply goes
    /// out, so a caller that sees its answer also sees it in the stats), or at the end of a failed pass.
    pass: Option<Pass>,
    /// Record each token's routed experts ([`crate::EngineConfig::return_routed_experts`]); the layout is
    /// `(sparse layers, top k)`.
    routed: Option<(usize, usize)>,
}

/// A forward pass being timed.
struct Pass {
    started: Instant,
    kind: PassKind,
}

enum PassKind {
    /// Prompt tokens (padding and shared prefixes counted once per prompt).
    Prefill(u64),
    /// Sequences in the decode step.
    Decode(u64),
}

/// The settings the scheduler needs, resolved by [`crate::Engine::start`].
pub(crate) struct SchedulerSetup {
    pub(crate) tokenizer: Option<Tokenizer>,
    pub(crate) eos: Vec<u32>,
    pub(crate) max_model_len: usize,
    pub(crate) max_response_tokens: Option<usize>,
    pub(crate) max_prefill_tokens: usize,
    pub(crate) routed: bool,
}

/// Tokens at the start of every prompt in `requests` that one prefill can share (each prompt keeps at least
/// its last token for the ragged pass, whose hidden state gives the first token's logits); 0 when not worth it.
fn shared_prefix(requests: &[PendingRequest]) -> usize {
    let Some((first, rest)) = requests.split_first() else { return 0 };
    if rest.is_empty() {
        return 0;
    }
    let mut len = first.prompt.len() - 1;
    for r in rest {
        len = common_start(&first.prompt[..len], &r.prompt[..r.prompt.len() - 1]);
    }
    if len >= MIN_REUSE { len } else { 0 }
}

/// Stores `tokens` (held by `src`) in the prefix cache. A failed store only costs later prefills: the cache
/// drops the entry, and nothing else depends on it.
fn store(prefixes: &mut PrefixCache, cache: &mut KvCache, first_free: usize, src: usize, tokens: &[u32]) {
    if let Err(error) = prefixes.insert(cache, first_free, src, tokens) {
        tracing::warn!(%error, "a prompt could not be kept in the prefix cache");
    }
}

/// Each row's routed experts from a `[B, T, L, k]` routing tensor: its first `lens[b]` tokens, flat. One
/// device→host transfer for the batch.
fn routing_rows(experts: &Tensor, lens: &[usize], (layers, k): (usize, usize)) -> Result<Vec<Vec<u16>>> {
    let size = experts.size();
    if size.len() != 4 || size[2] as usize != layers || size[3] as usize != k {
        return Err(EngineError::Model(trinity_model::ModelError::InvalidInput(format!(
            "the model returned routed experts of shape {size:?}, not [B, T, {layers}, {k}]"
        ))));
    }
    let width = size[1] as usize * layers * k;
    let flat =
        Vec::<i64>::try_from(experts.f_to_kind(tch::Kind::Int64)?.f_reshape([-1])?.f_to_device(tch::Device::Cpu)?)?;
    Ok(lens
        .iter()
        .enumerate()
        .map(|(b, &n)| flat[b * width..b * width + n * layers * k].iter().map(|&e| e as u16).collect())
        .collect())
}

/// What happened to a sequence after its newest token.
enum Outcome {
    Running,
    Finished(FinishReason, Option<String>),
    /// The sample's constraint could not take the token; its request fails.
    Failed(ConstraintError),
}

impl Scheduler {
    pub(crate) fn new(
        decoder: Decoder,
        cache: KvCache,
        setup: SchedulerSetup,
        commands: Receiver<Command>,
        stats: Arc<Mutex<EngineStats>>,
    ) -> Self {
        let k = decoder.config().moe.as_ref().map_or(0, |m| m.num_experts_per_tok as usize);
        let routed = setup.routed.then(|| (decoder.sparse_layers().len(), k));
        Self {
            decoder,
            cache,
            tokenizer: setup.tokenizer,
            eos: setup.eos,
            max_model_len: setup.max_model_len,
            max_response_tokens: setup.max_response_tokens,
            max_prefill_tokens: setup.max_prefill_tokens,
            commands,
            waiting: VecDeque::new(),
            requests: HashMap::new(),
            running: Vec::new(),
            stats,
            prefixes: PrefixCache::default(),
            pass: None,
            routed,
        }
    }

    /// Serves until a shutdown command arrives or every handle is gone; then fails what is left with
    /// [`EngineError::Stopped`].
    pub(crate) fn run(mut self) {
        tch::no_grad(|| {
            'serve: loop {
                if self.running.is_empty() && self.waiting.is_empty() {
                    match self.commands.recv() {
                        Ok(command) => {
                            if !self.handle(command) {
                                break 'serve;
                            }
                        }
                        Err(_) => break 'serve,
                    }
                }
                loop {
                    match self.commands.try_recv() {
                        Ok(command) => {
                            if !self.handle(command) {
                                break 'serve;
                            }
                        }
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => break 'serve,
                    }
                }
                self.drop_cancelled();
                self.admit();
                if !self.running.is_empty() {
                    self.decode_step();
                }
                debug_assert!(self.invariants_hold(), "scheduler invariants broken");
            }
        });
        for request in self.waiting.drain(..) {
            request.reply.fail(EngineError::Stopped);
        }
        for (_, state) in self.requests.drain() {
            state.reply.fail(EngineError::Stopped);
        }
    }

    /// Takes one command; `false` means shut down.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Generate(request) => self.waiting.push_back(request),
            Command::WithDecoder(task) => {
                // New weights (or adapters) make the cached keys and values stale.
                self.prefixes.clear(&mut self.cache);
                task(&mut self.decoder);
            }
            Command::Shutdown => return false,
        }
        true
    }

    /// Forgets requests whose caller dropped the handle (or stream), waiting or running.
    fn drop_cancelled(&mut self) {
        let waiting = self.waiting.len();
        self.waiting.retain(|r| !r.reply.is_closed());
        let mut count = waiting - self.waiting.len();
        let cancelled: Vec<u64> =
            self.requests.iter().filter(|(_, s)| s.reply.is_closed()).map(|(&id, _)| id).collect();
        if !cancelled.is_empty() {
            for id in &cancelled {
                self.requests.remove(id);
            }
            let gone: Vec<usize> =
                (0..self.running.len()).filter(|&i| cancelled.contains(&self.running[i].request)).collect();
            self.remove_sequences(&gone);
            count += cancelled.len();
        }
        if count > 0 {
            tracing::debug!(requests = count, "cancelled by their callers");
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.cancelled_requests += count as u64;
            stats.running_sequences = self.running.len();
            stats.waiting_requests = self.waiting.len();
        }
    }

    /// Admits waiting requests in arrival order while slots and the prefill budget allow, and prefills them.
    fn admit(&mut self) {
        let free = self.cache.num_slots() - self.running.len();
        let mut slots_needed = 0;
        let mut longest = 0;
        let mut admitted = Vec::new();
        while let Some(front) = self.waiting.front() {
            let n = front.params.n;
            let new_longest = longest.max(front.prompt.len());
            if slots_needed + n > free
                || (!admitted.is_empty() && new_longest * (admitted.len() + 1) > self.max_prefill_tokens)
            {
                break;
            }
            slots_needed += n;
            longest = new_longest;
            if let Some(request) = self.waiting.pop_front() {
                admitted.push(request);
            }
        }
        if !admitted.is_empty() {
            let ids: Vec<u64> = admitted.iter().map(|r| r.id).collect();
            let prompt_tokens = admitted.iter().map(|r| r.prompt.len() as u64).sum();
            self.pass = Some(Pass { started: Instant::now(), kind: PassKind::Prefill(prompt_tokens) });
            if let Err(error) = self.prefill(admitted) {
                self.fail_requests(&ids, "prefill", &error);
                // A pass that failed half-way may have set lengths of slots that never got a sequence.
                for slot in self.running.len()..self.cache.num_slots() {
                    let _ = self.cache.reset(slot);
                }
                self.prefixes.clear(&mut self.cache);
            }
            self.count_pass(0);
        }
    }

    /// Prefills `admitted` (one slot each, from `running.len()` on), copies each prompt's slot for its other
    /// samples, samples every sample's first token and adds the sequences to the batch.
    ///
    /// Each prompt's start comes from the prefix cache or, when the admitted prompts share a longer one (a
    /// system prompt and chat-template header, typically), from one pass over it; the rest of every prompt
    /// follows as one ragged pass, and the prompts join the prefix cache.
    fn prefill(&mut self, admitted: Vec<PendingRequest>) -> Result<()> {
        let base = self.running.len();
        let m = admitted.len();
        let first_free = base + admitted.iter().map(|r| r.params.n).sum::<usize>();
        let heads: Vec<&[u32]> = admitted.iter().map(|r| &r.prompt[..r.prompt.len() - 1]).collect();
        self.prefixes.make_room(&mut self.cache, first_free, &heads)?;
        // Recording routing, every prompt runs whole: a start copied from another slot has no routing to report.
        let starts = if self.routed.is_some() { vec![0; m] } else { self.fill_starts(&admitted, &heads, base)? };
        let device = self.decoder.device();
        let width = admitted.iter().zip(&starts).map(|(r, &s)| r.prompt.len() - s).max().unwrap_or(0);
        let mut ids = vec![0i64; m * width];
        let mut lens = Vec::with_capacity(m);
        let mut samples = Vec::with_capacity(m);
        for (row, (request, &start)) in admitted.into_iter().zip(&starts).enumerate() {
            for (j, &token) in request.prompt[start..].iter().enumerate() {
                ids[row * width + j] = i64::from(token);
            }
            lens.push(request.prompt.len() - start);
            let constraint = request.params.constraint.clone();
            samples.push((request.id, request.params.n, request.params.stop.clone(), constraint));
            self.start_request(request);
        }
        let ids = Tensor::from_slice(&ids).f_view([m as i64, width as i64])?.f_to_device(device)?;
        let slots: Vec<usize> = (base..base + m).collect();
        let (hidden, experts) = self.decoder.forward_with_cache_routed(&ids, &mut self.cache, &slots, &lens)?;
        let prompt_routing = match self.routed {
            Some(layout) => routing_rows(&experts, &lens, layout)?,
            None => {
                for (row, (id, ..)) in samples.iter().enumerate() {
                    if let Some(state) = self.requests.get(id) {
                        store(&mut self.prefixes, &mut self.cache, first_free, base + row, &state.prompt);
                    }
                }
                vec![Vec::new(); m]
            }
        };
        let logits = self.decoder.logits(&self.decoder.last_hidden(&hidden, &lens)?)?;

        // Slots: each request's first sample in its prefill slot (`base + row`), the other samples after all
        // prefill slots, in request order; `rows` maps each sequence (in slot order) to its prompt's logits row.
        let mut sequences = Vec::new();
        let mut extra_slot = base + m;
        for (row, (request, n, stop, constraint)) in samples.into_iter().enumerate() {
            for sample in 0..n {
                let slot = if sample == 0 {
                    base + row
                } else {
                    self.cache.copy_slot(base + row, extra_slot)?;
                    extra_slot += 1;
                    extra_slot - 1
                };
                let stop = (!stop.is_empty()).then(|| StopStrings::new(&stop));
                let routed = prompt_routing[row].clone();
                let constraint = constraint.as_ref().map(|c| c.0.start());
                let (tokens, logprobs) = (Vec::new(), Vec::new());
                sequences
                    .push((row as i64, Sequence { request, sample, slot, tokens, logprobs, stop, routed, constraint }));
            }
        }
        sequences.sort_by_key(|(_, s)| s.slot);
        let rows: Vec<i64> = sequences.iter().map(|(row, _)| *row).collect();
        let rows = Tensor::from_slice(&rows).f_to_device(device)?;
        let logits = logits.f_index_select(0, &rows)?;
        self.running.extend(sequences.into_iter().map(|(_, s)| s));
        self.sample_and_advance(&logits, base)
    }

    /// Fills the prefill slot of each admitted prompt (`base + row`) with the longest start it need not
    /// compute, and returns each slot's length; `heads` are the prompts without their last tokens.
    ///
    /// A prompt takes its start from the cached prompt sharing the longest one. When all admitted prompts share
    /// a longer start than any cached prompt gives, that start is computed once (after what the cache holds of
    /// it) in the first slot and copied into the others; a prompt with a shorter cached start than the shared
    /// one takes the shared one from the cached prompt with the longest.
    fn fill_starts(&mut self, admitted: &[PendingRequest], heads: &[&[u32]], base: usize) -> Result<Vec<usize>> {
        let m = admitted.len();
        let matches: Vec<Option<Match>> = heads.iter().map(|head| self.prefixes.lookup(head)).collect();
        let best = matches.iter().flatten().max_by_key(|m| m.len).copied();
        let best_len = best.map_or(0, |b| b.len);
        let shared = shared_prefix(admitted);
        let mut reused = 0;
        let starts = if shared > best_len {
            if let Some(b) = best {
                self.cache.copy_prefix(b.slot, base, b.len)?;
                reused = b.len * m;
            }
            let prefix: Vec<i64> = admitted[0].prompt[best_len..shared].iter().map(|&t| i64::from(t)).collect();
            let prefix = Tensor::from_slice(&prefix)
                .f_view([1, (shared - best_len) as i64])?
                .f_to_device(self.decoder.device())?;
            // Only the cache matters here: the prefix's hidden states predict nothing that is sampled.
            let _ = self.decoder.forward_with_cache(&prefix, &mut self.cache, &[base], &[shared - best_len])?;
            for slot in base + 1..base + m {
                self.cache.copy_slot(base, slot)?;
            }
            vec![shared; m]
        } else {
            let mut starts = Vec::with_capacity(m);
            for (row, own) in matches.into_iter().enumerate() {
                let take = match (own, best) {
                    (Some(own), _) if own.len >= shared => Some(own),
                    (_, Some(b)) if shared > 0 => Some(Match { slot: b.slot, len: shared }),
                    _ => None,
                };
                let len = take.map_or(0, |t| t.len);
                if let Some(t) = take {
                    self.cache.copy_prefix(t.slot, base + row, t.len)?;
                }
                reused += len;
                starts.push(len);
            }
            starts
        };
        if reused > 0 {
            self.stats.lock().unwrap_or_else(|e| e.into_inner()).reused_prompt_tokens += reused as u64;
        }
        Ok(starts)
    }

    /// Registers an admitted request with its limits resolved.
    fn start_request(&mut self, request: PendingRequest) {
        let p = &request.params;
        // Validation at submission guarantees a prompt shorter than max_model_len.
        let room = self.max_model_len - request.prompt.len();
        // `max_response_tokens` is the default of a request that names no `max_tokens`, as Trinity-RFT's vLLM
        // engine has it (its default sampling parameters); a request's own `max_tokens` is bounded only by the
        // room `max_model_len` leaves (Trinity's FrozenLake asks for up to 10240 tokens a turn).
        let max_new = p.max_tokens.or(self.max_response_tokens).map_or(room, |max| max.min(room));
        let mut banned: Vec<i64> = p.stop_token_ids.iter().map(|&t| i64::from(t)).collect();
        if !p.ignore_eos {
            banned.extend(self.eos.iter().map(|&t| i64::from(t)));
        }
        banned.sort_unstable();
        banned.dedup();
        let completions = match request.reply {
            Reply::Whole(_) => vec![None; p.n],
            Reply::Stream(_) => Vec::new(),
        };
        self.requests.insert(
            request.id,
            RequestState {
                completions,
                unfinished: p.n,
                params: request.params,
                seed: request.seed,
                prompt: request.prompt,
                max_new,
                banned,
                reply: request.reply,
            },
        );
    }

    /// One decode step for every running sequence.
    fn decode_step(&mut self) {
        let b = self.running.len();
        self.pass = Some(Pass { started: Instant::now(), kind: PassKind::Decode(b as u64) });
        let result = (|| -> Result<()> {
            let last: Vec<i64> = self.running.iter().map(|s| s.tokens.last().map_or(0, |&t| i64::from(t))).collect();
            let ids = Tensor::from_slice(&last).f_view([b as i64, 1])?.f_to_device(self.decoder.device())?;
            let slots: Vec<usize> = (0..b).collect();
            let ones = vec![1usize; b];
            let (hidden, experts) = self.decoder.forward_with_cache_routed(&ids, &mut self.cache, &slots, &ones)?;
            if let Some(layout) = self.routed {
                for (seq, row) in self.running.iter_mut().zip(routing_rows(&experts, &ones, layout)?) {
                    seq.routed.extend(row);
                }
            }
            let logits = self.decoder.logits(&hidden.f_squeeze_dim(1)?)?;
            self.sample_and_advance(&logits, 0)
        })();
        if let Err(error) = result {
            let ids: Vec<u64> = self.running.iter().map(|s| s.request).collect();
            self.fail_requests(&ids, "decode", &error);
        }
        self.count_pass(0);
    }

    /// Adds the pass in progress (if not yet counted) and `generated` new tokens to the stats, and sets the
    /// batch's current size.
    fn count_pass(&mut self, generated: u64) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.generated_tokens += generated;
        stats.running_sequences = self.running.len();
        stats.waiting_requests = self.waiting.len();
        if let Some(pass) = self.pass.take() {
            match pass.kind {
                PassKind::Prefill(tokens) => {
                    stats.prefill_tokens += tokens;
                    stats.prefill_time += pass.started.elapsed();
                }
                PassKind::Decode(rows) => {
                    stats.decode_tokens += rows;
                    stats.decode_steps += 1;
                    stats.decode_time += pass.started.elapsed();
                }
            }
        }
    }

    /// Samples a token for `running[first..]` from `logits` (one row each), appends it, finishes the sequences
    /// that are done and compacts the batch.
    fn sample_and_advance(&mut self, logits: &Tensor, first: usize) -> Result<()> {
        let (masks, failed) = self.constraint_masks(logits, first);
        let sampled = {
            let mut specs = Vec::with_capacity(self.running.len() - first);
            for (i, s) in self.running[first..].iter().enumerate() {
                let state = self.requests.get(&s.request).ok_or(EngineError::Stopped)?;
                let p = &state.params;
                let step = s.tokens.len();
                specs.push(RowSpec {
                    temperature: p.temperature,
                    top_k: p.top_k,
                    top_p: p.top_p,
                    min_p: p.min_p,
                    uniform: uniform(state.seed, s.sample as u64, step as u64),
                    banned: if step < p.min_tokens { &state.banned } else { &[] },
                    top_logprobs: p.top_logprobs,
                    allowed: masks.get(i).and_then(Option::as_deref),
                });
            }
            sample(logits, &specs)?
        };
        self.count_pass(sampled.ids.len() as u64);
        let mut constraint_failed = !failed.is_empty();
        for (request, reason) in failed {
            self.fail_constrained(request, reason);
        }
        let mut finished = Vec::new();
        let mut top = sampled.top.into_iter();
        for (i, (&token, &logprob)) in sampled.ids.iter().zip(&sampled.logprobs).enumerate() {
            let index = first + i;
            let top = top.next().unwrap_or_default();
            if !self.requests.contains_key(&self.running[index].request) {
                continue;
            }
            match self.advance(index, token, logprob, top)? {
                Outcome::Running => {}
                Outcome::Finished(reason, text) => {
                    self.keep_conversation(index);
                    self.finish(index, reason, text)?;
                    finished.push(index);
                }
                Outcome::Failed(reason) => {
                    self.fail_constrained(self.running[index].request, reason);
                    constraint_failed = true;
                }
            }
        }
        // Finished samples (in ascending order, as the loop visits them) and, only on a step where a constraint
        // failed, every sample of the failed requests: the ordinary step touches the finished rows alone.
        if constraint_failed {
            let finished: HashSet<usize> = finished.into_iter().collect();
            let gone: Vec<usize> = (0..self.running.len())
                .filter(|i| finished.contains(i) || !self.requests.contains_key(&self.running[*i].request))
                .collect();
            self.remove_sequences(&gone);
        } else {
            self.remove_sequences(&finished);
        }
        Ok(())
    }

    /// Each row's constraint mask (`None` for an unconstrained row); empty when no row has a constraint, which
    /// is every step of ordinary requests. The requests whose constraint failed or allows nothing come back
    /// with the reason, to be failed once the step is sampled (their rows sample unmasked and are dropped).
    fn constraint_masks(&mut self, logits: &Tensor, first: usize) -> (Vec<Option<Vec<bool>>>, Vec<ConstraintFailure>) {
        if self.running[first..].iter().all(|s| s.constraint.is_none()) {
            return (Vec::new(), Vec::new());
        }
        let vocab = logits.size().last().copied().unwrap_or(0) as usize;
        let mut masks = Vec::with_capacity(self.running.len() - first);
        let mut failed = Vec::new();
        for s in &mut self.running[first..] {
            let Some(constraint) = s.constraint.as_mut() else {
                masks.push(None);
                continue;
            };
            let eos_usable = self.requests.get(&s.request).is_some_and(|r| !r.params.ignore_eos);
            match row_mask(constraint.as_mut(), vocab, &self.eos, eos_usable) {
                Ok(Some(mask)) => masks.push(Some(mask)),
                Ok(None) => {
                    failed.push((s.request, "the constraint allows no token of the vocabulary".to_owned()));
                    masks.push(None);
                }
                Err(reason) => {
                    failed.push((s.request, reason));
                    masks.push(None);
                }
            }
        }
        (masks, failed)
    }

    /// Fails `request` because its constraint could not go on; its rows of this step are sampled freely and
    /// dropped.
    fn fail_constrained(&mut self, request: u64, reason: ConstraintError) {
        if let Some(state) = self.requests.remove(&request) {
            tracing::warn!(request, %reason, "constrained sampling failed");
            state.reply.fail(EngineError::ConstraintFailed { request, reason });
        }
    }

    /// Appends a token to `running[index]` (and streams it when its request streams) and decides whether the
    /// sample is done.
    fn advance(&mut self, index: usize, token: u32, logprob: f32, top: Vec<TopLogprob>) -> Result<Outcome> {
        let seq = &mut self.running[index];
        let state = self.requests.get(&seq.request).ok_or(EngineError::Stopped)?;
        let p = &state.params;
        seq.tokens.push(token);
        seq.logprobs.push(logprob);
        if let Reply::Stream(events) = &state.reply {
            // A closed stream is noticed by `drop_cancelled` before the next step.
            let streamed = StreamedToken { sample: seq.sample, token, logprob, top_logprobs: top };
            let _ = events.send(Ok(GenerationEvent::Token(streamed)));
        }
        let generated = seq.tokens.len();
        if p.stop_token_ids.contains(&token) {
            return Ok(Outcome::Finished(FinishReason::Stop, None));
        }
        if !p.ignore_eos && self.eos.contains(&token) {
            return Ok(Outcome::Finished(FinishReason::Eos, None));
        }
        if let Some(constraint) = seq.constraint.as_mut() {
            if let Err(reason) = constraint.advance(token) {
                return Ok(Outcome::Failed(reason));
            }
            // A sample that cannot end on an end-of-sequence token ends where its output is complete.
            if constraint.must_end() && (p.ignore_eos || self.eos.is_empty()) {
                return Ok(Outcome::Finished(FinishReason::Stop, None));
            }
        }
        if let (Some(stop), Some(tokenizer)) = (seq.stop.as_mut(), self.tokenizer.as_ref())
            && let Some(text) = stop.push(tokenizer, &seq.tokens, generated >= p.min_tokens)?
        {
            return Ok(Outcome::Finished(FinishReason::Stop, Some(text)));
        }
        if generated >= state.max_new || state.prompt.len() + generated >= self.max_model_len {
            return Ok(Outcome::Finished(FinishReason::Length, None));
        }
        Ok(Outcome::Running)
    }

    /// Stores a finished sample of a single-sample request in the prefix cache: its prompt and answer, as far as
    /// its slot holds them (all but the newest token), which is where an agent's next turn starts.
    fn keep_conversation(&mut self, index: usize) {
        let seq = &self.running[index];
        let Some(state) = self.requests.get(&seq.request) else { return };
        if state.params.n != 1 || self.routed.is_some() {
            return;
        }
        let held = self.cache.len(seq.slot);
        let tokens: Vec<u32> = state.prompt.iter().chain(&seq.tokens).take(held).copied().collect();
        store(&mut self.prefixes, &mut self.cache, self.running.len(), seq.slot, &tokens);
    }

    /// Records `running[index]`'s completion and answers its request when it was the last sample.
    fn finish(&mut self, index: usize, reason: FinishReason, text: Option<String>) -> Result<()> {
        let seq = &mut self.running[index];
        let text = match (text, &self.tokenizer) {
            (Some(text), _) => text,
            (None, Some(tokenizer)) => tokenizer.decode(&seq.tokens, true)?,
            (None, None) => String::new(),
        };
        let completion = Completion {
            text,
            tokens: std::mem::take(&mut seq.tokens),
            logprobs: std::mem::take(&mut seq.logprobs),
            finish_reason: reason,
            routed_experts: self.routed.map(|(layers, top_k)| RoutedExperts {
                layers,
                top_k,
                ids: std::mem::take(&mut seq.routed),
            }),
        };
        let id = seq.request;
        let Some(state) = self.requests.get_mut(&id) else { return Ok(()) };
        match &state.reply {
            Reply::Stream(events) => {
                let _ = events.send(Ok(GenerationEvent::Finished { sample: seq.sample, completion }));
            }
            Reply::Whole(_) => state.completions[seq.sample] = Some(completion),
        }
        state.unfinished -= 1;
        if state.unfinished == 0
            && let Some(state) = self.requests.remove(&id)
        {
            self.stats.lock().unwrap_or_else(|e| e.into_inner()).requests += 1;
            // A stream ends when its sender is dropped here, after its last sample's event.
            if let Reply::Whole(reply) = state.reply {
                let completions = state.completions.into_iter().flatten().collect();
                let _ = reply.send(Ok(Generation { request: id, completions }));
            }
        }
        Ok(())
    }

    /// Answers `ids` with the error and drops all their sequences.
    fn fail_requests(&mut self, ids: &[u64], phase: &'static str, error: &EngineError) {
        let reason = error.to_string();
        tracing::warn!(requests = ?ids, phase, %reason, "generation step failed");
        for id in ids {
            if let Some(state) = self.requests.remove(id) {
                state.reply.fail(EngineError::StepFailed { request: *id, phase, reason: reason.clone() });
            }
        }
        let gone: Vec<usize> = (0..self.running.len()).filter(|&i| ids.contains(&self.running[i].request)).collect();
        self.remove_sequences(&gone);
    }

    /// Removes `running[i]` for every `i` in `gone` (ascending), frees their slots and moves the highest-slot
    /// survivors into the holes so that `running[i].slot == i` holds again.
    fn remove_sequences(&mut self, gone: &[usize]) {
        if gone.is_empty() {
            return;
        }
        let freed: Vec<usize> = gone.iter().map(|&i| self.running[i].slot).collect();
        for &slot in &freed {
            // Resetting a slot in range cannot fail; the slot is only ever one the cache handed out.
            let _ = self.cache.reset(slot);
        }
        let mut keep = Vec::with_capacity(self.running.len() - gone.len());
        for (i, seq) in std::mem::take(&mut self.running).into_iter().enumerate() {
            if gone.binary_search(&i).is_err() {
                keep.push(seq);
            }
        }
        let n = keep.len();
        let mut holes: Vec<usize> = freed.into_iter().filter(|&slot| slot < n).collect();
        holes.sort_unstable_by(|a, b| b.cmp(a));
        let mut broken = Vec::new();
        for seq in keep.iter_mut().filter(|s| s.slot >= n) {
            let Some(hole) = holes.pop() else { break };
            let moved = self.cache.copy_slot(seq.slot, hole).and_then(|()| self.cache.reset(seq.slot));
            if let Err(error) = moved {
                broken.push((seq.request, EngineError::Model(error)));
            }
            seq.slot = hole;
        }
        keep.sort_by_key(|s| s.slot);
        self.running = keep;
        for (id, error) in broken {
            self.fail_requests(&[id], "decode", &error);
        }
    }

    /// Whether the invariants of the module docs hold (checked after every iteration in debug builds).
    fn invariants_hold(&self) -> bool {
        let running_ok = self.running.iter().enumerate().all(|(i, s)| {
            s.slot == i
                && self
                    .requests
                    .get(&s.request)
                    .is_some_and(|r| self.cache.len(i) + 1 == r.prompt.len() + s.tokens.len())
        });
        let mut free = (self.running.len()..self.cache.num_slots()).filter(|&slot| !self.prefixes.holds(slot));
        running_ok
            && self.prefixes.consistent(&self.cache, self.running.len())
            && free.all(|slot| self.cache.len(slot) == 0)
    }
}
