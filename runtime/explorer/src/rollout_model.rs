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

use trinity_engine::{Engine, EngineConfig, EngineError, EngineModel, Generation, SamplingParams};
use trinity_model::{ChatMessage, ChatTemplate, LoadedModel, ModelError, Tokenizer};

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

    /// A model directory's weights behind an engine of their own, rendering with the directory's tokenizer and
    /// chat template (a caller that renders otherwise sets `loaded.chat_template` first).
    pub fn start(loaded: LoadedModel, config: EngineConfig) -> Result<Self, EngineError> {
        let mut loaded = loaded;
        let tokenizer = loaded.tokenizer.clone();
        let template = loaded.chat_template.take();
        let engine = Engine::start(EngineModel::from(loaded), config)?;
        Ok(Self::new(Arc::new(engine), tokenizer, template))
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
    /// start of the assistant's turn), and tokenizes without adding special tokens (the template has them), as
    /// [`RolloutModel::encode_prompt`] does.
    pub fn chat_prompt(&self, messages: &[ChatMessage], reply_prefix: Option<&str>) -> Result<Vec<u32>, ModelError> {
        let mut text = self.render_chat(messages, true)?;
        if let Some(prefix) = reply_prefix {
            text.push_str(prefix);
        }
        self.encode_prompt(&text, false)
    }

    /// Tokenizes a prompt for the engine; a text provably longer than the engine's prompt limit (`limit` =
    /// `max_prompt_tokens`; see [`Tokenizer::max_text_bytes`]) is not tokenized whole: the result is the first
    /// `limit + 1` tokens of a head of it, which [`RolloutModel::prompt_over_limit`] reports as over the limit
    /// (placeholders, with `enable_prompt_truncation`) and the engine refuses (without). Tokenizing costs about
    /// 100 bytes of memory a byte of text, so a 10 MB task prompt tokenized whole doubled a run's peak memory;
    /// this way it costs about as much as the longest prompt that fits (typically far less: the head starts at 8
    /// bytes a token and doubles until it holds `limit + 1` tokens).
    pub fn encode_prompt(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        let (engine, tokenizer, _) = self.local()?;
        let limit = engine.info().max_prompt_tokens;
        let Some(most) = tokenizer.max_text_bytes(limit).filter(|&most| text.len() > most) else {
            return tokenizer.encode(text, add_special_tokens);
        };
        // A head longer than `most` bytes has more than `limit` tokens too, so the loop ends there at the latest.
        let cap = most.saturating_add(4);
        let mut head_bytes = limit.saturating_add(1).saturating_mul(8).min(cap);
        loop {
            let head = &text[..text.floor_char_boundary(head_bytes.min(text.len()))];
            let mut tokens = tokenizer.encode(head, add_special_tokens)?;
            if tokens.len() > limit || head.len() == text.len() || head_bytes >= cap {
                tracing::debug!(
                    "a prompt of {} bytes is longer than {limit} tokens can be ({most} bytes); tokenized its first {} bytes",
                    text.len(),
                    head.len()
                );
                tokens.truncate(limit.saturating_add(1));
                return Ok(tokens);
            }
            head_bytes = head_bytes.saturating_mul(2).min(cap);
        }
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use trinity_engine::{EngineConfig, EngineModel};

    use super::*;

    /// The tiny fixture with prompts of at most 31 tokens (`max_model_len` 32), its tokenizer's vocabulary
    /// completed with every byte (as it lacks some, its tokenizer bounds no text; the prompts here use only
    /// tokens it has).
    fn tiny_model() -> RolloutModel {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied");
        let mut loaded = trinity_model::load_model(&dir, tch::Kind::Float, tch::Device::Cpu).unwrap();
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap();
        let vocab = json["model"]["vocab"].as_object_mut().unwrap();
        // GPT-2's byte alphabet: printable Latin-1 bytes as themselves, the others from U+0100 up in byte order.
        let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let mut shifted = 256;
        for byte in 0..256u32 {
            let c = if printable(byte) {
                byte
            } else {
                shifted += 1;
                shifted - 1
            };
            // The three added tokens follow the 48 entries.
            let next = vocab.len() + 3;
            vocab.entry(char::from_u32(c).unwrap().to_string()).or_insert(next.into());
        }
        let path = std::env::temp_dir().join(format!("trinity-explorer-tokenizer-{}.json", std::process::id()));
        std::fs::write(&path, json.to_string()).unwrap();
        let tokenizer = Tokenizer::from_files(&path, None).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(tokenizer.max_text_bytes(1).is_some());
        let template = loaded.chat_template.take();
        let config = EngineConfig { max_model_len: 32, max_num_seqs: 2, ..EngineConfig::default() };
        RolloutModel::new(Arc::new(Engine::start(EngineModel::from(loaded), config).unwrap()), tokenizer, template)
    }

    #[test]
    fn a_prompt_far_over_the_limit_is_tokenized_only_as_far_as_the_limit() {
        let model = tiny_model();
        let limit = model.engine().info().max_prompt_tokens;
        // 10 MB: tokenized whole it would be ~2.5 M tokens and ~1 GB of the tokenizer's working memory.
        let huge = "ab1 ".repeat(2_500_000);
        let tokens = model.encode_prompt(&huge, false).unwrap();
        assert_eq!(tokens.len(), limit + 1);
        assert_eq!(model.prompt_over_limit(tokens.len()), Some(limit));
        assert_eq!(tokens[..8], model.tokenizer().encode(&huge[..64], false).unwrap()[..8]);
        let chat = model.chat_prompt(&[ChatMessage::new("user", huge)], None).unwrap();
        assert_eq!(chat.len(), limit + 1);
        // A prompt that may fit is tokenized whole, exactly as the tokenizer does.
        let short = "ab1 ab";
        assert_eq!(model.encode_prompt(short, true).unwrap(), model.tokenizer().encode(short, true).unwrap());
        let near = "ab1 ".repeat(40);
        assert_eq!(model.encode_prompt(&near, false).unwrap(), model.tokenizer().encode(&near, false).unwrap());
    }
}
