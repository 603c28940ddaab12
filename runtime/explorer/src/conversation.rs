//! One multi-turn conversation of a built-in workflow, recorded as the token sequence the trainer will score.
//!
//! Turns are appended, never re-tokenized: each request sends the sequence so far plus the tokens of the
//! *new* rendered text only (the environment's reply and the next generation prompt, as context), and each
//! answer appends exactly the tokens the model sampled (its actions, with their logprobs). Re-tokenizing the
//! whole conversation could split the model's own tokens differently from how it sampled them, and the trainer
//! would then score tokens the model never produced. The experience is the whole sequence: the prompt is
//! everything before the first answer, the action mask marks the model's tokens.
//!
//! A conversation that already happened (a Python workflow's messages, Trinity-RFT's
//! `convert_messages_to_experience`) is recorded the same way from its rendered texts: context with
//! [`Conversation::extend_text`], each assistant turn with [`Conversation::extend_reply_text`]; its reply tokens
//! carry no logprobs until the caller scores the sequence.
//!
//! This is the one multi-turn recorder: the built-in workflows, Python workflows and WASM workflow plugins
//! (whose chats branch: each sample of a request is a clone that records its own answer, and a later chat
//! continues the clone whose messages and text it extends) all record through it. When a chat template
//! re-renders earlier turns, the recording is not extended ([`TurnError::NotAPrefix`]); what then happens is
//! the caller's choice (a built-in episode ends, a plugin's chat starts a fresh recording).

use trinity_buffer::{Eid, Experience, RoutedExperts};
use trinity_engine::{Completion, SamplingParams};
use trinity_model::ChatMessage;

use crate::rollout_model::RolloutModel;

/// Why a turn could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error("model: {0}")]
    Model(#[from] trinity_model::ModelError),
    #[error("generation: {0}")]
    Engine(#[from] trinity_engine::EngineError),
    /// The chat template rendered the earlier turns differently once new messages were added (some templates
    /// drop earlier reasoning): the recorded tokens are no longer a prefix of the conversation.
    #[error("the chat template re-rendered earlier turns; the conversation cannot be extended token for token")]
    NotAPrefix,
    #[error("the engine returned no completion")]
    NoCompletion,
}

/// The recorded sequence of one conversation.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    mask: Vec<bool>,
    /// Tokens before the first answer.
    prompt_length: Option<usize>,
    /// The text `tokens` stand for (rendered prompts and decoded answers, special tokens kept).
    text: String,
    /// Weights version of the first answer.
    model_version: Option<u64>,
    /// The routed experts of the latest answer's request, when the engine records them: its prompt (the whole
    /// conversation before it) and its answer but the last token. Routing is causal, so its first rows are the
    /// routing of any shorter start of the conversation.
    routed: Option<RoutedExperts>,
    /// Started from token ids rather than text ([`Conversation::from_tokens`]): no rendering continues it.
    untexted: bool,
}

impl Conversation {
    /// A recording that starts from the prompt `tokens` (context) without a text: a plugin's `generate` call.
    /// Only [`Conversation::record`] extends it.
    pub fn from_tokens(tokens: Vec<u32>) -> Conversation {
        let n = tokens.len();
        Conversation { tokens, logprobs: vec![0.0; n], mask: vec![false; n], untexted: true, ..Conversation::default() }
    }

    /// Tokens the sequence would have with `messages` rendered and a generation prompt added: what a request
    /// would send. Context tokens are appended to the recording.
    pub(crate) fn extend_to(&mut self, model: &RolloutModel, messages: &[ChatMessage]) -> Result<usize, TurnError> {
        let rendered = model.render_chat(messages, true)?;
        self.extend_text(model, rendered)
    }

    /// Appends the context tokens of `rendered`, the whole conversation so far as the model sees it, which must
    /// start with the text recorded so far; returns the sequence's length.
    pub fn extend_text(&mut self, model: &RolloutModel, rendered: String) -> Result<usize, TurnError> {
        self.append(model, rendered, false)?;
        Ok(self.tokens.len())
    }

    /// Appends `rendered` (the conversation through an assistant turn the model gave, end-of-turn tokens
    /// included) as that turn: its new tokens are actions, with logprob 0 until the caller scores them.
    pub fn extend_reply_text(&mut self, model: &RolloutModel, rendered: String) -> Result<(), TurnError> {
        self.prompt_length.get_or_insert(self.tokens.len());
        self.model_version.get_or_insert(model.model_version());
        self.append(model, rendered, true)
    }

    /// [`Conversation::extend_text`] for a prompt about to be sent on an untrusted caller's behalf: a text
    /// provably longer than the engine's prompt limit is tokenized only as far as the limit shows
    /// ([`RolloutModel::encode_prompt`]), so the caller pays for at most the longest prompt that fits (the engine
    /// then refuses it).
    pub fn extend_prompt_text(&mut self, model: &RolloutModel, rendered: String) -> Result<usize, TurnError> {
        let delta = self.delta(&rendered)?;
        let tokens = model.encode_prompt(delta, false)?;
        self.push(tokens, rendered, false);
        Ok(self.tokens.len())
    }

    /// Whether `rendered` extends the recorded text, so that [`Conversation::extend_text`] would continue it.
    pub fn continues(&self, rendered: &str) -> bool {
        !self.untexted && rendered.starts_with(self.text.as_str())
    }

    /// The recorded token sequence: what a request for the next answer sends.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The part of `rendered` after the recorded text.
    fn delta<'a>(&self, rendered: &'a str) -> Result<&'a str, TurnError> {
        if self.untexted {
            return Err(TurnError::NotAPrefix);
        }
        rendered.strip_prefix(self.text.as_str()).ok_or(TurnError::NotAPrefix)
    }

    fn append(&mut self, model: &RolloutModel, rendered: String, action: bool) -> Result<(), TurnError> {
        let delta = self.delta(&rendered)?;
        let tokens = model.tokenizer().encode(delta, false)?;
        self.push(tokens, rendered, action);
        Ok(())
    }

    fn push(&mut self, tokens: Vec<u32>, rendered: String, action: bool) {
        self.logprobs.extend(std::iter::repeat_n(0.0, tokens.len()));
        self.mask.extend(std::iter::repeat_n(action, tokens.len()));
        self.tokens.extend(tokens);
        self.text = rendered;
    }

    /// Asks the model for the next answer to the sequence (after [`Conversation::extend_to`]) and records it.
    pub(crate) async fn answer(
        &mut self,
        model: &RolloutModel,
        mut params: SamplingParams,
    ) -> Result<Completion, TurnError> {
        params.n = 1;
        let version = model.model_version();
        let generation = model.generate(self.tokens.clone(), params).await?;
        let completion = generation.completions.into_iter().next().ok_or(TurnError::NoCompletion)?;
        self.record(model, &completion, version)?;
        Ok(completion)
    }

    /// Records `completion`, sampled after [`Conversation::tokens`] with the weights of `version`, as the next
    /// answer: its tokens are actions with their logprobs, its text (special tokens kept) extends the recorded one.
    pub fn record(&mut self, model: &RolloutModel, completion: &Completion, version: u64) -> Result<(), TurnError> {
        self.prompt_length.get_or_insert(self.tokens.len());
        self.model_version.get_or_insert(version);
        self.text.push_str(&model.decode(&completion.tokens)?);
        self.tokens.extend_from_slice(&completion.tokens);
        self.logprobs.extend_from_slice(&completion.logprobs);
        self.mask.extend(std::iter::repeat_n(true, completion.tokens.len()));
        self.routed = completion.routed_experts.as_ref().map(|r| RoutedExperts {
            layers: r.layers,
            top_k: r.top_k,
            ids: r.ids.clone(),
        });
        Ok(())
    }

    /// The routing of `tokens[..end]` (its first `end - 1` tokens, what the model read), when the latest answer's
    /// request covered them.
    fn routing_until(&self, end: usize) -> Option<RoutedExperts> {
        let routed = self.routed.as_ref()?;
        let read = end.checked_sub(1)?;
        let unit = routed.layers * routed.top_k;
        (routed.ids.len() >= read * unit).then(|| RoutedExperts { ids: routed.ids[..read * unit].to_vec(), ..*routed })
    }

    /// Tokens recorded so far (the length a turn starts from, for [`Conversation::turn_experience`]).
    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The experience of one turn of a step-wise workflow: everything recorded before `start` as its prompt (the
    /// earlier answers are context, not trained) and the tokens after it, the turn's answer, as its response.
    /// `None` when nothing was answered after `start`.
    pub(crate) fn turn_experience(&self, start: usize, eid: Eid, model: &RolloutModel) -> Option<Experience> {
        let end = self.mask.iter().rposition(|m| *m).map_or(start, |last| last + 1);
        if end <= start {
            return None;
        }
        let mut experience =
            Experience::single_turn(eid, self.tokens[..end].to_vec(), start, self.logprobs[start..end].to_vec());
        experience.action_mask = self.mask[start..end].to_vec();
        experience.routed_experts = self.routing_until(end);
        experience.model_version = model.model_version();
        experience.prompt_text = model.decode(&experience.tokens[..start]).ok();
        experience.response_text = model.decode(&experience.tokens[start..]).ok();
        Some(experience)
    }

    /// The experience of the conversation: up to its last answer (context tokens after it are not trained).
    /// `None` when the model never answered.
    pub fn into_experience(mut self, eid: Eid, model: &RolloutModel) -> Option<Experience> {
        let prompt_length = self.prompt_length?;
        let end = self.mask.iter().rposition(|m| *m).map_or(prompt_length, |last| last + 1);
        let routed = self.routing_until(end);
        self.tokens.truncate(end);
        self.logprobs.truncate(end);
        self.mask.truncate(end);
        let mut experience =
            Experience::single_turn(eid, self.tokens, prompt_length, self.logprobs[prompt_length..].to_vec());
        experience.action_mask = self.mask[prompt_length..].to_vec();
        experience.routed_experts = routed;
        experience.model_version = self.model_version.unwrap_or(0);
        experience.prompt_text = model.decode(&experience.tokens[..prompt_length]).ok();
        experience.response_text = model.decode(&experience.tokens[prompt_length..]).ok();
        Some(experience)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use trinity_engine::{Engine, EngineConfig, EngineModel};

    use super::*;

    fn tiny_model() -> RolloutModel {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied");
        let loaded = trinity_model::load_model(&dir, tch::Kind::Float, tch::Device::Cpu).unwrap();
        RolloutModel::start(loaded, EngineConfig { max_model_len: 64, max_num_seqs: 4, ..EngineConfig::default() })
            .unwrap()
    }

    fn params(seed: u64) -> SamplingParams {
        SamplingParams { max_tokens: Some(3), seed: Some(seed), ..SamplingParams::default() }
    }

    #[tokio::test]
    async fn two_turns_make_one_experience_masking_only_the_answers() {
        let model = tiny_model();
        let mut conversation = Conversation::default();
        let mut messages = vec![ChatMessage::new("user", "ab")];
        let first_prompt = conversation.extend_to(&model, &messages).unwrap();
        let first = conversation.answer(&model, params(1)).await.unwrap();
        messages.push(ChatMessage::new("assistant", first.text.clone()));
        messages.push(ChatMessage::new("user", "ba"));
        let before_second = conversation.extend_to(&model, &messages).unwrap();
        let second = conversation.answer(&model, params(2)).await.unwrap();
        // The first prompt is exactly what a fresh render of the first message tokenizes to.
        let fresh = model.chat_prompt(&messages[..1], None).unwrap();
        let experience = conversation.into_experience(Eid::default(), &model).unwrap();
        experience.validate().unwrap();
        assert_eq!(experience.prompt_length, first_prompt);
        assert_eq!(&experience.tokens[..first_prompt], &fresh[..]);
        let (a, b) = (first.tokens.len(), second.tokens.len());
        let context = before_second - first_prompt - a;
        assert!(context > 0, "the second user turn is context");
        let mut mask = vec![true; a];
        mask.extend(vec![false; context]);
        mask.extend(vec![true; b]);
        assert_eq!(experience.action_mask, mask);
        assert_eq!(&experience.tokens[first_prompt..first_prompt + a], &first.tokens[..]);
        assert_eq!(&experience.tokens[before_second..], &second.tokens[..]);
        assert_eq!(&experience.logprobs[..a], &first.logprobs[..]);
        assert!(experience.logprobs[a..a + context].iter().all(|l| *l == 0.0));
    }

    /// The Qwen3-MoE fixture (48 ids, as the tiny Llama's tokenizer) with that tokenizer and template, on an
    /// engine recording routing; and a second copy of its decoder.
    fn tiny_moe_model() -> (RolloutModel, trinity_model::Decoder) {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny");
        let mut text =
            trinity_model::load_model(&fixtures.join("llama_tied"), tch::Kind::Float, tch::Device::Cpu).unwrap();
        let moe = fixtures.join("qwen3_moe");
        let decoder = || {
            let config = trinity_model::ModelConfig::from_file(&moe.join("config.json")).unwrap();
            let mut weights = trinity_model::SafetensorsWeights::open_dir(&moe).unwrap();
            trinity_model::Decoder::load(config, &mut weights, tch::Kind::Float, tch::Device::Cpu).unwrap()
        };
        let engine =
            EngineModel { decoder: decoder(), tokenizer: Some(text.tokenizer.clone()), eos_token_ids: vec![2] };
        let config =
            EngineConfig { max_model_len: 64, max_num_seqs: 2, return_routed_experts: true, ..Default::default() };
        let engine = Arc::new(Engine::start(engine, config).unwrap());
        (RolloutModel::new(engine, text.tokenizer, text.chat_template.take()), decoder())
    }

    #[tokio::test]
    async fn a_conversation_keeps_the_routing_of_every_token_its_model_read() {
        let (model, decoder) = tiny_moe_model();
        let mut conversation = Conversation::default();
        let mut messages = vec![ChatMessage::new("user", "ab")];
        conversation.extend_to(&model, &messages).unwrap();
        let first = conversation.answer(&model, params(1)).await.unwrap();
        messages.push(ChatMessage::new("assistant", first.text.clone()));
        messages.push(ChatMessage::new("user", "ba"));
        conversation.extend_to(&model, &messages).unwrap();
        conversation.answer(&model, params(2)).await.unwrap();
        let turn = conversation.turn_experience(conversation.len() - 1, Eid::default(), &model).unwrap();
        let experience = conversation.into_experience(Eid::default(), &model).unwrap();
        experience.validate().unwrap();
        turn.validate().unwrap();
        let routed = experience.routed_experts.as_ref().expect("the engine records routing");
        // The routing of the whole sequence but its last token, as the training forward routes it.
        let read: Vec<i64> = experience.tokens[..experience.tokens.len() - 1].iter().map(|&t| i64::from(t)).collect();
        let ids = tch::Tensor::from_slice(&read).view([1, -1]);
        let want = tch::no_grad(|| decoder.forward_hidden_routed(&ids, None, None, false)).unwrap().experts;
        let want: Vec<u16> = Vec::<i64>::try_from(want.reshape([-1])).unwrap().into_iter().map(|e| e as u16).collect();
        assert_eq!(routed.ids, want);
        assert_eq!(turn.routed_experts, experience.routed_experts, "one turn to the end: the same tokens");
    }

    /// The recorder's rule on a rendering that does not extend what it recorded: it refuses and records
    /// nothing, so that the caller chooses what follows (an episode ends, a plugin's chat starts afresh).
    #[test]
    fn a_re_rendered_history_is_refused_and_records_nothing() {
        let model = tiny_model();
        let mut conversation = Conversation::default();
        conversation.extend_text(&model, "<|im_start|>user\nab".to_owned()).unwrap();
        let before = conversation.tokens().to_vec();
        assert!(conversation.continues("<|im_start|>user\nab<|im_end|>"));
        assert!(!conversation.continues("<|im_start|>user\nba"));
        let refused = conversation.extend_text(&model, "<|im_start|>user\nba".to_owned());
        assert!(matches!(refused, Err(TurnError::NotAPrefix)), "{refused:?}");
        assert_eq!(conversation.tokens(), &before[..]);
        let prompt = conversation.extend_prompt_text(&model, "<|im_start|>user\nab<|im_end|>".to_owned()).unwrap();
        assert_eq!(prompt, model.tokenizer().encode("<|im_start|>user\nab<|im_end|>", false).unwrap().len());
    }

    /// A plugin's `generate` records from token ids: the answer is recorded, but no rendered text continues it.
    #[tokio::test]
    async fn a_recording_from_token_ids_takes_answers_but_no_rendering() {
        let model = tiny_model();
        let messages = [ChatMessage::new("user", "ab")];
        let prompt = model.chat_prompt(&messages, None).unwrap();
        let mut conversation = Conversation::from_tokens(prompt.clone());
        let generation = model.generate(conversation.tokens().to_vec(), params(1)).await.unwrap();
        let completion = &generation.completions[0];
        conversation.record(&model, completion, 3).unwrap();
        let rendered = model.render_chat(&messages, true).unwrap();
        assert!(!conversation.continues(&rendered), "token ids stand for no text");
        assert!(matches!(conversation.clone().extend_text(&model, rendered), Err(TurnError::NotAPrefix)));
        let experience = conversation.into_experience(Eid::default(), &model).unwrap();
        experience.validate().unwrap();
        assert_eq!(experience.tokens, [prompt.clone(), completion.tokens.clone()].concat());
        assert_eq!(experience.prompt_length, prompt.len());
        assert_eq!(experience.action_mask, vec![true; completion.tokens.len()]);
        assert_eq!(experience.logprobs, completion.logprobs);
        assert_eq!(experience.model_version, 3, "the version the caller says the answer was sampled with");
    }

    #[test]
    fn a_past_conversation_marks_exactly_its_assistant_turns() {
        let model = tiny_model();
        let turns = [("user", "ab"), ("assistant", "ba"), ("user", "b"), ("assistant", "a")];
        let messages: Vec<ChatMessage> = turns.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect();
        let mut conversation = Conversation::default();
        for end in [1, 3] {
            conversation.extend_text(&model, model.render_chat(&messages[..end], true).unwrap()).unwrap();
            conversation.extend_reply_text(&model, model.render_chat(&messages[..=end], false).unwrap()).unwrap();
        }
        let experience = conversation.into_experience(Eid::default(), &model).unwrap();
        experience.validate().unwrap();
        let first_prompt = model.chat_prompt(&messages[..1], None).unwrap();
        assert_eq!(experience.prompt_length, first_prompt.len());
        assert_eq!(&experience.tokens[..first_prompt.len()], &first_prompt[..]);
        let response = &experience.tokens[experience.prompt_length..];
        let masked: Vec<u32> =
            response.iter().zip(&experience.action_mask).filter(|(_, m)| **m).map(|(t, _)| *t).collect();
        let text = model.decode(&masked).unwrap();
        assert!(text.starts_with("ba") && text.contains('a'), "{text:?}");
        assert!(!text.contains("user"), "the user turn is context: {text:?}");
        let runs = experience.action_mask.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(runs, 2, "answer, context, answer: {:?}", experience.action_mask);
    }
}
