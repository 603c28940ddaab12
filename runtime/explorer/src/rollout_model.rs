//! The rollout model as workflows see it.
//!
//! Usually a local model: a generation engine with its tokenizer and chat template. In mode `bench` it may
//! instead be an external model (`model.external_model`), an OpenAI-compatible endpoint that takes chat messages
//! and returns text; the workflows that need no more than that reach it through the same
//! `math_workflow::sample_group` as a local model, and the runner refuses every other workflow before it runs
//! (`external_model::runs_on_external_model`). So the token-level accessors ([`RolloutModel::engine`],
//! [`RolloutModel::tokenizer`]) are only ever called on a local model; the modes that hand out an engine (both,
//! explore, serve, train) never build an external one, which config resolution allows in mode `bench` only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use trinity_engine::{Engine, Generation, SamplingParams};
use trinity_model::{ChatMessage, ChatTemplate, ModelError, Tokenizer};

use crate::auxiliary::AuxiliaryModel;
use crate::external_model::ExternalModel;
use crate::openai_view::{OpenAiSession, OpenAiView};

/// What answers the rollout model's requests.
// A process holds one or two rollout models, each behind an `Arc`: the local variant's size costs nothing, and
// boxing it would add an indirection to every tokenizer call.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Backend {
    /// A local generation engine and the text side of its model.
    Local { engine: Arc<Engine>, tokenizer: Tokenizer, chat_template: Option<ChatTemplate> },
    /// An OpenAI-compatible endpoint (mode `bench` only).
    External(Arc<ExternalModel>),
}

/// The generation engine plus the text side of the model (tokenizer, chat template) and the version of the
/// weights it serves, or an external endpoint. Shared by every running workflow; the engine batches their
/// requests together.
#[derive(Debug)]
pub struct RolloutModel {
    backend: Backend,
    version: AtomicU64,
    /// `model.enable_prompt_truncation`: a prompt over the engine's limit yields masked placeholder experiences
    /// instead of failing its task.
    truncate_long_prompts: bool,
    /// `explorer.auxiliary_models`, in config order: the judges and teachers workflows call beside this model.
    auxiliary: Vec<AuxiliaryModel>,
    /// `enable_openai_api`: the in-process OpenAI-compatible server in front of this model, set once it listens.
    openai: OnceLock<Arc<OpenAiView>>,
}

impl RolloutModel {
    pub fn new(engine: Arc<Engine>, tokenizer: Tokenizer, chat_template: Option<ChatTemplate>) -> Self {
        Self::with_backend(Backend::Local { engine, tokenizer, chat_template })
    }

    /// The rollout model of mode `bench` with `model.external_model`: every request goes to `endpoint`.
    pub fn external(endpoint: ExternalModel) -> Self {
        Self::with_backend(Backend::External(Arc::new(endpoint)))
    }

    fn with_backend(backend: Backend) -> Self {
        RolloutModel {
            backend,
            version: AtomicU64::new(0),
            truncate_long_prompts: true,
            auxiliary: Vec::new(),
            openai: OnceLock::new(),
        }
    }

    /// The endpoint, when this is an external model.
    pub fn external_model(&self) -> Option<&Arc<ExternalModel>> {
        match &self.backend {
            Backend::External(endpoint) => Some(endpoint),
            Backend::Local { .. } => None,
        }
    }

    /// The local parts, or why there are none.
    fn local(&self) -> Result<(&Arc<Engine>, &Tokenizer, Option<&ChatTemplate>), ModelError> {
        match &self.backend {
            Backend::Local { engine, tokenizer, chat_template } => Ok((engine, tokenizer, chat_template.as_ref())),
            Backend::External(endpoint) => Err(ModelError::InvalidInput(format!(
                "the model is the external endpoint {}, which takes chat messages and returns text: it has no \
                 tokenizer, chat template or engine here",
                endpoint.url()
            ))),
        }
    }

    /// The local parts, for the accessors that hand them out.
    ///
    /// # Panics
    /// On an external model: only mode `bench` builds one, and its runner refuses, before they run, the workflows
    /// that would reach these (see the module documentation); reaching this is a programming error.
    fn local_parts(&self) -> (&Arc<Engine>, &Tokenizer, Option<&ChatTemplate>) {
        match self.local() {
            Ok(parts) => parts,
            Err(error) => panic!("{error}"),
        }
    }

    /// Makes the OpenAI-compatible server at `view` reachable from workflows ([`RolloutModel::openai_session`]).
    /// Only the first call counts: a model is served by one server.
    pub fn set_openai_view(&self, view: Arc<OpenAiView>) {
        if self.openai.set(view).is_err() {
            tracing::warn!("the rollout model already has an OpenAI-compatible server; keeping the first");
        }
    }

    /// The OpenAI-compatible server in front of this model, when `enable_openai_api` started one.
    pub fn openai_view(&self) -> Option<&Arc<OpenAiView>> {
        self.openai.get()
    }

    /// A workflow run's own base URL on the OpenAI-compatible server (and, with `enable_history`, its recorded
    /// replies); `None` without `enable_openai_api`.
    pub fn openai_session(&self) -> Option<OpenAiSession> {
        self.openai.get().map(OpenAiSession::open)
    }

    /// Gives workflows these judges and teachers (`explorer.auxiliary_models`, in config order).
    pub fn with_auxiliary_models(mut self, models: Vec<AuxiliaryModel>) -> Self {
        self.auxiliary = models;
        self
    }

    /// The auxiliary models in config order (Trinity-RFT's workflows take `auxiliary_models[0]` as their judge
    /// or teacher).
    pub fn auxiliary_models(&self) -> &[AuxiliaryModel] {
        &self.auxiliary
    }

    /// The auxiliary model called `name`.
    pub fn auxiliary_model(&self, name: &str) -> Option<&AuxiliaryModel> {
        self.auxiliary.iter().find(|m| m.name() == name)
    }

    /// Sets `model.enable_prompt_truncation` (Trinity-RFT's default is on): with it, a workflow whose prompt is
    /// longer than the engine accepts gets placeholder experiences ([`RolloutModel::prompt_over_limit`]) instead
    /// of a failed task.
    pub fn with_prompt_truncation(mut self, enable: bool) -> Self {
        self.truncate_long_prompts = enable;
        self
    }

    /// The engine's prompt limit when `prompt_tokens` exceed it and prompt truncation is on; `None` when the
    /// prompt fits, or when truncation is off (the engine then refuses the request and the task fails).
    pub fn prompt_over_limit(&self, prompt_tokens: usize) -> Option<usize> {
        let (engine, _, _) = self.local().ok()?;
        let limit = engine.info().max_prompt_tokens;
        (self.truncate_long_prompts && prompt_tokens > limit).then_some(limit)
    }

    /// The engine, for weight synchronisation.
    ///
    /// # Panics
    /// On an external model (see [`RolloutModel::external_model`] and the module documentation).
    pub fn engine(&self) -> &Arc<Engine> {
        self.local_parts().0
    }

    /// # Panics
    /// On an external model (see [`RolloutModel::external_model`] and the module documentation).
    pub fn tokenizer(&self) -> &Tokenizer {
        self.local_parts().1
    }

    /// The model's chat template, for callers that render more than role/content pairs (tool schemas, tool
    /// calls in the history: the OpenAI-compatible server); `None` for a model without one, and for an external
    /// model, whose endpoint renders with its own.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.local().ok().and_then(|(_, _, template)| template)
    }

    /// How many weight updates the served weights include; stamped on every experience.
    pub fn model_version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Records that the engine now serves weights of `version` (called by the synchronizer after a sync).
    pub fn set_model_version(&self, version: u64) {
        self.version.store(version, Ordering::Release);
    }

    /// Renders `messages` with the chat template and a generation prompt, appends `reply_prefix` (a pre-filled
    /// start of the assistant's turn), and tokenizes without adding special tokens (the template has them).
    pub fn chat_prompt(&self, messages: &[ChatMessage], reply_prefix: Option<&str>) -> Result<Vec<u32>, ModelError> {
        let mut text = self.render_chat(messages, true)?;
        if let Some(prefix) = reply_prefix {
            text.push_str(prefix);
        }
        self.local()?.1.encode(&text, false)
    }

    /// The text the model sees for `messages`: the chat template, or plain `Role:` lines for a model without
    /// one; with `add_generation_prompt` it ends where the assistant's reply starts.
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, ModelError> {
        let (_, _, chat_template) = self.local()?;
        Ok(match chat_template {
            Some(template) => template.apply(messages, add_generation_prompt)?,
            // A model without a chat template (a base model) gets the messages as plain lines, the way
            // Trinity-RFT's `use_base` prompts look.
            None => {
                let mut text = String::new();
                for message in messages {
                    text.push_str(&format!("{}:\n{}\n", capitalize(&message.role), message.content));
                }
                if add_generation_prompt {
                    text.push_str("Assistant:\n");
                }
                text
            }
        })
    }

    /// Decodes token ids, keeping special tokens (for prompt texts in experiences).
    pub fn decode(&self, tokens: &[u32]) -> Result<String, ModelError> {
        self.local()?.1.decode(tokens, false)
    }

    /// Generates `params.n` samples of one prompt; the engine batches concurrent calls. An external model takes
    /// messages, not token ids: it answers with an error.
    pub async fn generate(&self, prompt: Vec<u32>, params: SamplingParams) -> trinity_engine::Result<Generation> {
        let (engine, _, _) = self.local()?;
        engine.generate(prompt, params).await
    }
}

fn capitalize(role: &str) -> String {
    let mut chars = role.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
