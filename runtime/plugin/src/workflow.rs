//! Workflow plugins: one task in, scored experiences out, with the rollout model as an async host interface.
//!
//! Each task run gets a fresh Store (instantiation from the pre-linked component takes tens of microseconds),
//! so a trap, the deadline or the memory limit costs exactly that task. The deadline counts the plugin's own
//! time only: the epoch callback subtracts the time spent awaiting the model, and yields to the async runtime
//! at every tick so that a plugin computing for a while never starves the other workflows in flight.
//!
//! Since waiting for the model does not count toward the deadline, the model itself is budgeted: at most
//! [`PluginLimits::max_model_calls`] requests and [`PluginLimits::max_model_tokens`] generated tokens per task
//! run; the request past either traps the plugin ([`ModelBudgetExceeded`]). What the plugin returns is bounded
//! too: at most one experience per recorded turn (or per rollout, `repeat_times`), counted before any is built.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use trinity_buffer::{Eid, Experience, Task};
use trinity_engine::{FinishReason, SamplingParams};
use trinity_explorer::{
    AuxiliaryModel, Conversation, ExplorerError, RolloutModel, Workflow, WorkflowContext, WorkflowFuture, seed_mix,
};
use trinity_model::ChatMessage;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Store, UpdateDeadline};

use crate::bindings::reward::trinity::plugin::types as wit;
use crate::bindings::workflow::exports::trinity::plugin::workflow as export;
use crate::bindings::workflow::trinity::plugin::model;
use crate::bindings::workflow::{WorkflowPlugin as WorkflowWorld, WorkflowPluginPre as WorkflowPre};
use crate::component::PluginKind;
use crate::conversation::{Turn, continued};
use crate::engine::{PluginLimits, StoreState, engine};
use crate::error::PluginError;
use crate::instance::{DeadlineExceeded, ModelBudgetExceeded, PluginInfo, call_error, limited_store, metrics_map};

/// Host calls of the `model` interface: a trap (the budget) or the interface's own `result<_, string>`.
type ModelResult<T> = wasmtime::Result<Result<T, String>>;

/// A loaded workflow plugin.
pub struct WorkflowPlugin {
    info: PluginInfo,
    limits: PluginLimits,
    pre: WorkflowPre<StoreState<Session>>,
}

impl std::fmt::Debug for WorkflowPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowPlugin").field("info", &self.info).finish_non_exhaustive()
    }
}

/// One task run's view of the model and its recorded turns.
pub(crate) struct Session {
    model: Option<Arc<RolloutModel>>,
    defaults: SamplingParams,
    seed: u64,
    calls: u64,
    /// Tokens the model generated for this task run so far.
    generated: u64,
    /// The run's model budget.
    max_calls: u64,
    max_tokens: u64,
    turns: Vec<Turn>,
    /// When the current export call started, and how much of it was spent in host calls.
    started: Instant,
    host_time: Duration,
    deadline: Duration,
}

impl Session {
    fn new(model: Option<Arc<RolloutModel>>, defaults: SamplingParams, seed: u64, limits: &PluginLimits) -> Self {
        Session {
            model,
            defaults,
            seed,
            calls: 0,
            generated: 0,
            max_calls: u64::from(limits.max_model_calls),
            max_tokens: limits.max_model_tokens,
            turns: Vec::new(),
            started: Instant::now(),
            host_time: Duration::ZERO,
            deadline: limits.call_timeout,
        }
    }

    /// Admits one more request of `n` samples, or says which budget it would break (the call then traps).
    fn admit(&self, n: u32) -> Result<(), ModelBudgetExceeded> {
        if self.calls >= self.max_calls {
            return Err(ModelBudgetExceeded(format!(
                "request {} is past the limit of {} model calls per task (max_model_calls)",
                self.calls + 1,
                self.max_calls
            )));
        }
        let left = self.max_tokens.saturating_sub(self.generated);
        if u64::from(n.max(1)) > left {
            return Err(ModelBudgetExceeded(format!(
                "{} tokens generated of the {} allowed per task (max_model_tokens); a request of n = {n} cannot fit",
                self.generated, self.max_tokens
            )));
        }
        Ok(())
    }

    /// Counts what a request generated.
    fn spend(&mut self, generation: &trinity_engine::Generation) {
        let tokens: usize = generation.completions.iter().map(|c| c.tokens.len()).sum();
        self.generated = self.generated.saturating_add(tokens as u64);
    }

    fn model(&self) -> Result<&Arc<RolloutModel>, String> {
        self.model.as_ref().ok_or_else(|| "the model is not available while the plugin is being loaded".to_owned())
    }

    /// Engine parameters for one request; without a seed from the plugin each call gets its own, derived from
    /// the task's seed and the call's position, so rollouts of one task differ but a run is reproducible.
    fn params(&self, params: &model::SamplingParams) -> SamplingParams {
        SamplingParams {
            n: params.n.max(1) as usize,
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: params.top_k as usize,
            min_p: params.min_p,
            seed: Some(params.seed.unwrap_or_else(|| seed_mix(&[self.seed, self.calls]))),
            max_tokens: params.max_tokens.map(|t| t as usize),
            min_tokens: params.min_tokens as usize,
            stop: params.stop.clone(),
            ..SamplingParams::default()
        }
    }

    async fn chat(
        &mut self,
        messages: Vec<wit::Message>,
        params: model::SamplingParams,
    ) -> ModelResult<Vec<model::Completion>> {
        self.admit(params.n).map_err(wasmtime::Error::new)?;
        // Counted whether or not the request succeeds: failing requests also cost host time, which the
        // deadline does not see.
        self.calls += 1;
        Ok(self.chat_within_budget(messages, params).await)
    }

    async fn chat_within_budget(
        &mut self,
        messages: Vec<wit::Message>,
        params: model::SamplingParams,
    ) -> Result<Vec<model::Completion>, String> {
        let model = Arc::clone(self.model()?);
        let messages: Vec<ChatMessage> = messages.into_iter().map(|m| ChatMessage::new(m.role, m.content)).collect();
        let rendered = model.render_chat(&messages, true).map_err(|e| e.to_string())?;
        // `encode_prompt` stops tokenizing a text provably longer than the prompt limit: a guest that sends
        // megabytes costs what the longest prompt that fits costs, and the engine refuses it.
        let mut prefix = continued(&self.turns, &messages, &rendered)
            .map_or_else(Conversation::default, |turn| turn.conversation.clone());
        prefix.extend_prompt_text(&model, rendered).map_err(|e| e.to_string())?;
        let params = self.params(&params);
        let version = model.model_version();
        let generation = model.generate(prefix.tokens().to_vec(), params).await.map_err(|e| e.to_string())?;
        self.spend(&generation);
        let mut out = Vec::with_capacity(generation.completions.len());
        for completion in &generation.completions {
            let mut history = messages.clone();
            history.push(ChatMessage::new("assistant", completion.text.clone()));
            let mut conversation = prefix.clone();
            conversation.record(&model, completion, version).map_err(|e| e.to_string())?;
            out.push(self.record(Turn { messages: history, conversation }, completion));
        }
        Ok(out)
    }

    async fn generate(
        &mut self,
        prompt: Vec<u32>,
        params: model::SamplingParams,
    ) -> ModelResult<Vec<model::Completion>> {
        self.admit(params.n).map_err(wasmtime::Error::new)?;
        self.calls += 1;
        Ok(self.generate_within_budget(prompt, params).await)
    }

    async fn generate_within_budget(
        &mut self,
        prompt: Vec<u32>,
        params: model::SamplingParams,
    ) -> Result<Vec<model::Completion>, String> {
        let model = Arc::clone(self.model()?);
        let prefix = Conversation::from_tokens(prompt);
        let params = self.params(&params);
        let version = model.model_version();
        let generation = model.generate(prefix.tokens().to_vec(), params).await.map_err(|e| e.to_string())?;
        self.spend(&generation);
        let mut out = Vec::with_capacity(generation.completions.len());
        for completion in &generation.completions {
            let mut conversation = prefix.clone();
            conversation.record(&model, completion, version).map_err(|e| e.to_string())?;
            out.push(self.record(Turn { messages: Vec::new(), conversation }, completion));
        }
        Ok(out)
    }

    /// The auxiliary model called `name`, or an error naming the ones there are.
    fn auxiliary(&self, name: &str) -> Result<AuxiliaryModel, String> {
        let model = self.model()?;
        model.auxiliary_model(name).cloned().ok_or_else(|| {
            let names: Vec<&str> = model.auxiliary_models().iter().map(AuxiliaryModel::name).collect();
            if names.is_empty() {
                format!("no auxiliary model `{name}`: the config lists none (explorer.auxiliary_models)")
            } else {
                format!("no auxiliary model `{name}` (explorer.auxiliary_models has `{}`)", names.join("`, `"))
            }
        })
    }

    async fn chat_auxiliary(
        &mut self,
        name: String,
        messages: Vec<wit::Message>,
        params: model::SamplingParams,
    ) -> ModelResult<Vec<model::AuxiliaryReply>> {
        self.admit(params.n).map_err(wasmtime::Error::new)?;
        self.calls += 1;
        Ok(self.chat_auxiliary_within_budget(&name, messages, params).await)
    }

    async fn chat_auxiliary_within_budget(
        &mut self,
        name: &str,
        messages: Vec<wit::Message>,
        params: model::SamplingParams,
    ) -> Result<Vec<model::AuxiliaryReply>, String> {
        let auxiliary = self.auxiliary(name)?;
        let messages: Vec<ChatMessage> = messages.into_iter().map(|m| ChatMessage::new(m.role, m.content)).collect();
        let prompt =
            auxiliary.model().chat_prompt(&messages, None).map_err(|e| format!("auxiliary model `{name}`: {e}"))?;
        let generation = auxiliary
            .model()
            .generate(prompt, self.params(&params))
            .await
            .map_err(|e| format!("auxiliary model `{name}`: {e}"))?;
        self.spend(&generation);
        Ok(generation
            .completions
            .into_iter()
            .map(|c| model::AuxiliaryReply {
                text: c.text,
                tokens: c.tokens,
                logprobs: c.logprobs,
                finish_reason: finish_reason(c.finish_reason),
            })
            .collect())
    }

    async fn auxiliary_logprobs(&mut self, name: String, tokens: Vec<u32>, temperature: f32) -> ModelResult<Vec<f32>> {
        self.admit(1).map_err(wasmtime::Error::new)?;
        self.calls += 1;
        let auxiliary = match self.auxiliary(&name) {
            Ok(auxiliary) => auxiliary,
            Err(error) => return Ok(Err(error)),
        };
        if !(temperature.is_finite() && temperature > 0.0) {
            return Ok(Err(format!("temperature {temperature} must be a positive number")));
        }
        Ok(auxiliary.logprobs(&tokens, f64::from(temperature)).await.map_err(|e| e.to_string()))
    }

    fn record(&mut self, turn: Turn, completion: &trinity_engine::Completion) -> model::Completion {
        self.turns.push(turn);
        model::Completion {
            turn: (self.turns.len() - 1) as u64,
            text: completion.text.clone(),
            tokens: completion.tokens.clone(),
            logprobs: completion.logprobs.clone(),
            finish_reason: finish_reason(completion.finish_reason),
        }
    }
}

fn finish_reason(reason: FinishReason) -> model::FinishReason {
    match reason {
        FinishReason::Eos => model::FinishReason::Eos,
        FinishReason::Stop => model::FinishReason::Stop,
        FinishReason::Length => model::FinishReason::Length,
    }
}

/// Times a host call so that the deadline counts only the plugin's own time.
macro_rules! timed {
    ($state:expr, $body:expr) => {{
        let started = Instant::now();
        let result = $body;
        $state.extra.host_time += started.elapsed();
        result
    }};
}

impl model::Host for StoreState<Session> {
    async fn default_params(&mut self) -> wasmtime::Result<model::SamplingParams> {
        let d = &self.extra.defaults;
        Ok(model::SamplingParams {
            n: 1,
            temperature: d.temperature,
            top_p: d.top_p,
            top_k: d.top_k as u32,
            min_p: d.min_p,
            max_tokens: d.max_tokens.map(|t| t as u32),
            min_tokens: d.min_tokens as u32,
            stop: d.stop.clone(),
            seed: None,
        })
    }

    async fn chat(
        &mut self,
        messages: Vec<wit::Message>,
        params: model::SamplingParams,
    ) -> ModelResult<Vec<model::Completion>> {
        timed!(self, self.extra.chat(messages, params).await)
    }

    async fn generate(
        &mut self,
        prompt: Vec<u32>,
        params: model::SamplingParams,
    ) -> ModelResult<Vec<model::Completion>> {
        timed!(self, self.extra.generate(prompt, params).await)
    }

    async fn auxiliary_models(&mut self) -> wasmtime::Result<Vec<String>> {
        Ok(self
            .extra
            .model
            .as_ref()
            .map(|model| model.auxiliary_models().iter().map(|m| m.name().to_owned()).collect())
            .unwrap_or_default())
    }

    async fn chat_auxiliary(
        &mut self,
        model: String,
        messages: Vec<wit::Message>,
        params: model::SamplingParams,
    ) -> ModelResult<Vec<model::AuxiliaryReply>> {
        timed!(self, self.extra.chat_auxiliary(model, messages, params).await)
    }

    async fn auxiliary_logprobs(&mut self, model: String, tokens: Vec<u32>, temperature: f32) -> ModelResult<Vec<f32>> {
        timed!(self, self.extra.auxiliary_logprobs(model, tokens, temperature).await)
    }

    async fn tokenize(&mut self, text: String) -> ModelResult<Vec<u32>> {
        Ok(self.extra.model().and_then(|model| model.tokenizer().encode(&text, false).map_err(|e| e.to_string())))
    }

    async fn detokenize(&mut self, tokens: Vec<u32>) -> ModelResult<String> {
        Ok(self.extra.model().and_then(|model| model.decode(&tokens).map_err(|e| e.to_string())))
    }

    async fn apply_chat_template(
        &mut self,
        messages: Vec<wit::Message>,
        add_generation_prompt: bool,
    ) -> ModelResult<String> {
        let messages: Vec<ChatMessage> = messages.into_iter().map(|m| ChatMessage::new(m.role, m.content)).collect();
        Ok(self
            .extra
            .model()
            .and_then(|model| model.render_chat(&messages, add_generation_prompt).map_err(|e| e.to_string())))
    }
}

impl WorkflowPlugin {
    pub(crate) fn load(path: &Path, component: &Component, limits: PluginLimits) -> Result<Self, PluginError> {
        let link = |e: wasmtime::Error| PluginError::Link { path: path.to_owned(), message: format!("{e:#}") };
        let mut linker = Linker::new(engine()?);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(link)?;
        WorkflowWorld::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state).map_err(link)?;
        let pre = WorkflowPre::new(linker.instantiate_pre(component).map_err(link)?).map_err(link)?;
        let label = path.display().to_string();
        // The metadata call is async like every export of this world; a scoped thread with its own runtime
        // runs it whether or not the caller is inside one.
        let info = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| PluginError::Engine { message: e.to_string() })?;
                    runtime.block_on(async {
                        let session = Session::new(None, SamplingParams::default(), 0, &limits);
                        let mut store = workflow_store(&label, &limits, session, path)?;
                        let bindings =
                            pre.instantiate_async(&mut store).await.map_err(|e| call_error(&label, &limits, &e))?;
                        let info = bindings.call_info(&mut store).await;
                        store.data().drain_output();
                        let info = info.map_err(|e| call_error(&label, &limits, &e))?;
                        PluginInfo::from_guest(path, PluginKind::Workflow, info)
                    })
                })
                .join()
                .unwrap_or_else(|_| Err(PluginError::Engine { message: "loading the plugin panicked".into() }))
        })?;
        Ok(WorkflowPlugin { info, limits, pre })
    }

    /// Who the plugin is.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    async fn run_task(&self, task: &Task, ctx: &WorkflowContext) -> Result<Vec<Experience>, PluginError> {
        let name = &self.info.name;
        let defaults = default_params(task);
        let seed = seed_mix(&[
            task.rollout_args.seed.unwrap_or(42),
            task.batch_id,
            task.taskset_id as u64,
            task.index as u64,
            u64::from(ctx.attempt),
        ]);
        let session = Session::new(Some(Arc::clone(&ctx.model)), defaults, seed, &self.limits);
        let mut store = workflow_store(name, &self.limits, session, &self.info.path)?;
        let bindings = self.pre.instantiate_async(&mut store).await.map_err(|e| call_error(name, &self.limits, &e))?;
        store.data_mut().extra.started = Instant::now();
        store.data_mut().extra.host_time = Duration::ZERO;
        let context = export::RunContext { repeat_times: ctx.repeat_times, attempt: ctx.attempt };
        let result = bindings.trinity_plugin_workflow().call_run(&mut store, &wit_task(task), context).await;
        store.data().drain_output();
        let result = result.map_err(|e| call_error(name, &self.limits, &e))?;
        let experiences = result.map_err(|message| PluginError::Guest { plugin: name.clone(), message })?;
        let session = &store.data().extra;
        // Counted before anything is built: each experience copies its turn's tokens.
        let limit = session.turns.len().max(ctx.repeat_times as usize);
        if experiences.len() > limit {
            return Err(PluginError::TooManyExperiences {
                plugin: name.clone(),
                returned: experiences.len(),
                turns: session.turns.len(),
                repeat_times: ctx.repeat_times,
                limit,
            });
        }
        experiences
            .into_iter()
            .enumerate()
            .map(|(run, experience)| self.experience(task, &ctx.model, session, run, experience))
            .collect()
    }

    /// Builds one experience from the turn it names.
    fn experience(
        &self,
        task: &Task,
        model: &RolloutModel,
        session: &Session,
        run: usize,
        from: export::Experience,
    ) -> Result<Experience, PluginError> {
        let name = &self.info.name;
        let bad = |message: String| PluginError::Output { plugin: name.clone(), message };
        let turn = usize::try_from(from.turn).ok().and_then(|t| session.turns.get(t)).ok_or_else(|| {
            bad(format!("experience {run} names turn {}, but the run made {} turn(s)", from.turn, session.turns.len()))
        })?;
        if !from.reward.is_finite() {
            return Err(bad(format!("experience {run} has reward {}", from.reward)));
        }
        let metrics = metrics_map(name, &format!("experience {run}"), from.metrics)?;
        let mut info = parse_object(&from.info).map_err(|e| bad(format!("experience {run}: info: {e}")))?;
        let eid = Eid { batch: task.batch_id, task: task.index as u64, run: run as u64, step: 0 };
        // Every turn recorded an answer, so the recording makes an experience.
        let mut experience = turn
            .conversation
            .clone()
            .into_experience(eid, model)
            .ok_or_else(|| bad(format!("experience {run} names turn {}, which has no answer", from.turn)))?;
        experience.reward = from.reward;
        experience.metrics = metrics;
        info.insert("taskset".to_owned(), task.taskset.clone().into());
        info.insert("workflow".to_owned(), name.clone().into());
        experience.info = info;
        experience.validate().map_err(|e| bad(e.to_string()))?;
        Ok(experience)
    }
}

impl Workflow for WorkflowPlugin {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            self.run_task(task, ctx).await.map_err(|error| ExplorerError::Plugin {
                task: format!("{}#{}", task.taskset, task.index),
                message: error.to_string(),
            })
        })
    }
}

/// A Store for one workflow run: memory limit, and an epoch callback that enforces the deadline on the
/// plugin's own time and yields to the runtime at every tick.
fn workflow_store(
    name: &str,
    limits: &PluginLimits,
    session: Session,
    path: &Path,
) -> Result<Store<StoreState<Session>>, PluginError> {
    let mut store = limited_store(name, limits, session, path)?;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|context| {
        let session = &context.data().extra;
        let own_time = session.started.elapsed().saturating_sub(session.host_time);
        if own_time > session.deadline {
            return Err(wasmtime::Error::new(DeadlineExceeded));
        }
        Ok(UpdateDeadline::Yield(1))
    });
    Ok(store)
}

fn wit_task(task: &Task) -> wit::Task {
    wit::Task {
        taskset: task.taskset.clone(),
        index: task.index as u64,
        prompt: task.prompt(),
        truth: task.truth(),
        system_prompt: task.system_prompt(),
        raw: Value::Object(task.raw.clone()).to_string(),
        args: Value::Object(task.workflow_args.clone()).to_string(),
    }
}

/// The task's rollout arguments as engine parameters (one sample).
fn default_params(task: &Task) -> SamplingParams {
    let args = &task.rollout_args;
    SamplingParams {
        n: 1,
        temperature: args.temperature.unwrap_or(1.0) as f32,
        top_p: args.top_p.unwrap_or(1.0) as f32,
        top_k: args.top_k.filter(|k| *k > 0).map_or(0, |k| k as usize),
        min_p: args.min_p.unwrap_or(0.0) as f32,
        max_tokens: args.max_tokens.map(|t| t as usize),
        min_tokens: args.min_tokens.unwrap_or(0) as usize,
        stop: args.stop.clone(),
        ..SamplingParams::default()
    }
}

fn parse_object(text: &str) -> Result<Map<String, Value>, String> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("not a JSON object".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use trinity_engine::EngineConfig;
    use trinity_model::ChatTemplate;

    use super::*;

    /// ChatML whose generation prompt opens the answer with `ok.`, which the history does not show: as
    /// DeepSeek-R1's template forces `<think>` and Qwen3's drops earlier reasoning, it renders the earlier turns
    /// differently once new messages follow.
    const REWRITING_TEMPLATE: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + \
        '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\nok.' }}{% endif %}";

    /// A task run's session on the model crate's tiny Llama behind a real engine, with `template` or, when
    /// `None`, the fixture's own ChatML template.
    fn session(template: Option<&str>) -> (Session, Arc<RolloutModel>) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied");
        let mut loaded = trinity_model::load_model(&dir, tch::Kind::Float, tch::Device::Cpu).unwrap();
        if let Some(source) = template {
            loaded.chat_template = Some(ChatTemplate::new(source, None, None).unwrap());
        }
        let config = EngineConfig { max_model_len: 64, max_num_seqs: 4, ..EngineConfig::default() };
        let model = Arc::new(RolloutModel::start(loaded, config).unwrap());
        (Session::new(Some(Arc::clone(&model)), SamplingParams::default(), 7, &PluginLimits::default()), model)
    }

    fn params(seed: u64) -> model::SamplingParams {
        model::SamplingParams {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            max_tokens: Some(3),
            min_tokens: 0,
            stop: Vec::new(),
            seed: Some(seed),
        }
    }

    fn message(role: &str, content: &str) -> wit::Message {
        wit::Message { role: role.to_owned(), content: content.to_owned() }
    }

    /// Chats `ab`, then the history with the answer and `ba`; returns both completions and the second chat's
    /// messages.
    async fn two_chats(session: &mut Session) -> (model::Completion, model::Completion, Vec<ChatMessage>) {
        let first = session.chat_within_budget(vec![message("user", "ab")], params(1)).await.unwrap().remove(0);
        let history = vec![message("user", "ab"), message("assistant", &first.text), message("user", "ba")];
        let messages = history.iter().map(|m| ChatMessage::new(m.role.clone(), m.content.clone())).collect();
        let second = session.chat_within_budget(history, params(2)).await.unwrap().remove(0);
        (first, second, messages)
    }

    fn experience_of(session: &Session, turn: u64, model: &RolloutModel) -> Experience {
        let turn = &session.turns[turn as usize];
        let experience = turn.conversation.clone().into_experience(Eid::default(), model).unwrap();
        experience.validate().unwrap();
        experience
    }

    #[tokio::test]
    async fn a_chat_extending_a_turn_continues_its_recording() {
        let (mut session, model) = session(None);
        let (first, second, messages) = two_chats(&mut session).await;
        let experience = experience_of(&session, second.turn, &model);
        let first_prompt = model.chat_prompt(&messages[..1], None).unwrap();
        assert_eq!(experience.prompt_length, first_prompt.len());
        assert_eq!(&experience.tokens[..first_prompt.len()], &first_prompt[..]);
        let (a, b) = (first.tokens.len(), second.tokens.len());
        let context = experience.action_mask.len() - a - b;
        assert!(context > 0, "the second user turn is context");
        let mut mask = vec![true; a];
        mask.extend(vec![false; context]);
        mask.extend(vec![true; b]);
        assert_eq!(experience.action_mask, mask, "both answers are actions, as the model sampled them");
        assert_eq!(&experience.tokens[first_prompt.len()..][..a], &first.tokens[..]);
        assert_eq!(&experience.logprobs[..a], &first.logprobs[..]);
    }

    /// The rule on a re-rendered history: a chat whose messages extend a turn but whose rendering does not
    /// extend that turn's recorded text starts a fresh recording of the whole rendered conversation, in which
    /// the earlier answer is context; the earlier turn's own recording is kept as it was.
    #[tokio::test]
    async fn a_chat_whose_template_rewrote_history_starts_a_fresh_recording() {
        let (mut session, model) = session(Some(REWRITING_TEMPLATE));
        let (first, second, messages) = two_chats(&mut session).await;
        let rendered = model.render_chat(&messages, true).unwrap();
        assert!(messages.starts_with(&session.turns[first.turn as usize].messages));
        assert!(continued(&session.turns, &messages, &rendered).is_none(), "the template rewrote `ok.` away");
        let experience = experience_of(&session, second.turn, &model);
        let prompt = model.chat_prompt(&messages, None).unwrap();
        assert_eq!(experience.prompt_length, prompt.len(), "the whole re-rendered conversation is the prompt");
        assert_eq!(&experience.tokens[..prompt.len()], &prompt[..]);
        assert_eq!(&experience.tokens[prompt.len()..], &second.tokens[..]);
        assert_eq!(experience.action_mask, vec![true; second.tokens.len()], "only the new answer is trained");
        assert_eq!(experience.logprobs, second.logprobs);
        let earlier = experience_of(&session, first.turn, &model);
        let first_prompt = model.chat_prompt(&messages[..1], None).unwrap();
        assert_eq!(earlier.tokens, [first_prompt, first.tokens].concat());
    }
}
