//! The model turns of one workflow run, recorded so that experiences train on exactly what the model sampled.
//!
//! Every `chat` or `generate` call records one [`Turn`] per sample: the whole token sequence so far, which of
//! its tokens the model produced (the action mask), their logprobs, and the text the sequence stands for. A chat
//! whose messages continue an earlier turn (that turn's messages, its reply as the assistant message, then new
//! messages) extends that turn's tokens with the tokenized *new text only*: re-tokenizing the whole conversation
//! could split the model's own tokens differently from how it sampled them, and the trainer would then score
//! tokens the model never produced.

use trinity_engine::Completion;
use trinity_model::ChatMessage;

/// One recorded sample and everything before it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Turn {
    /// The conversation including this turn's reply as the last (assistant) message; empty for `generate`.
    pub(crate) messages: Vec<ChatMessage>,
    /// The text `tokens` stand for (chat turns only): the rendered prompt, then the reply's tokens decoded with
    /// their special tokens.
    pub(crate) text: Option<String>,
    pub(crate) tokens: Vec<u32>,
    /// Sampling logprob per token (0 for context tokens).
    pub(crate) logprobs: Vec<f32>,
    /// Which tokens the model generated.
    pub(crate) mask: Vec<bool>,
    /// Tokens before the first model token: the prompt of the experience.
    pub(crate) prompt_length: usize,
    /// Weights version of the first turn of the conversation (the oldest weights the experience depends on).
    pub(crate) model_version: u64,
}

/// The start of a request: tokens to send and what they continue.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Prefix {
    pub(crate) tokens: Vec<u32>,
    pub(crate) logprobs: Vec<f32>,
    pub(crate) mask: Vec<bool>,
    pub(crate) prompt_length: usize,
    pub(crate) model_version: Option<u64>,
}

impl Prefix {
    /// A fresh prompt: every token is context.
    pub(crate) fn fresh(tokens: Vec<u32>) -> Prefix {
        let n = tokens.len();
        Prefix { tokens, logprobs: vec![0.0; n], mask: vec![false; n], prompt_length: n, model_version: None }
    }

    /// `turn`'s sequence followed by `delta` context tokens.
    pub(crate) fn continuing(turn: &Turn, delta: Vec<u32>) -> Prefix {
        let mut prefix = Prefix {
            tokens: turn.tokens.clone(),
            logprobs: turn.logprobs.clone(),
            mask: turn.mask.clone(),
            prompt_length: turn.prompt_length,
            model_version: Some(turn.model_version),
        };
        prefix.logprobs.extend(std::iter::repeat_n(0.0, delta.len()));
        prefix.mask.extend(std::iter::repeat_n(false, delta.len()));
        prefix.tokens.extend(delta);
        prefix
    }

    /// The turn a completion of this prefix makes.
    pub(crate) fn extend(
        &self,
        completion: &Completion,
        messages: Vec<ChatMessage>,
        text: Option<String>,
        version: u64,
    ) -> Turn {
        let mut turn = Turn {
            messages,
            text,
            tokens: self.tokens.clone(),
            logprobs: self.logprobs.clone(),
            mask: self.mask.clone(),
            prompt_length: self.prompt_length,
            model_version: self.model_version.unwrap_or(version),
        };
        turn.tokens.extend_from_slice(&completion.tokens);
        turn.logprobs.extend_from_slice(&completion.logprobs);
        turn.mask.extend(std::iter::repeat_n(true, completion.tokens.len()));
        turn
    }
}

/// The recorded turn that `messages` (rendered as `rendered`) continue: the longest one whose messages are a
/// prefix of `messages` and whose text is a prefix of `rendered`.
pub(crate) fn continued<'a>(turns: &'a [Turn], messages: &[ChatMessage], rendered: &str) -> Option<&'a Turn> {
    turns
        .iter()
        .filter(|turn| {
            !turn.messages.is_empty()
                && messages.len() > turn.messages.len()
                && messages.starts_with(&turn.messages)
                && turn.text.as_deref().is_some_and(|text| rendered.starts_with(text))
        })
        .max_by_key(|turn| turn.messages.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use trinity_engine::FinishReason;

    fn completion(tokens: Vec<u32>) -> Completion {
        let n = tokens.len();
        Completion {
            text: "a".into(),
            tokens,
            logprobs: vec![-0.5; n],
            finish_reason: FinishReason::Eos,
            routed_experts: None,
        }
    }

    #[test]
    fn continuing_a_turn_masks_only_model_tokens() {
        let user = ChatMessage::new("user", "go");
        let first = Prefix::fresh(vec![1, 2, 3]);
        let turn = first.extend(
            &completion(vec![7, 8]),
            vec![user.clone(), ChatMessage::new("assistant", "a")],
            Some("P:a".into()),
            4,
        );
        assert_eq!(turn.mask, [false, false, false, true, true]);
        assert_eq!(turn.prompt_length, 3);

        let messages = vec![user.clone(), ChatMessage::new("assistant", "a"), ChatMessage::new("user", "again")];
        let found = continued(std::slice::from_ref(&turn), &messages, "P:a then").unwrap();
        let second = Prefix::continuing(found, vec![9]).extend(&completion(vec![5]), messages.clone(), None, 6);
        assert_eq!(second.tokens, [1, 2, 3, 7, 8, 9, 5]);
        assert_eq!(second.mask, [false, false, false, true, true, false, true]);
        assert_eq!(second.logprobs, [0.0, 0.0, 0.0, -0.5, -0.5, 0.0, -0.5]);
        assert_eq!(second.model_version, 4, "the oldest weights of the conversation");

        // A conversation whose earlier reply was edited is not a continuation.
        let edited = vec![user, ChatMessage::new("assistant", "b"), ChatMessage::new("user", "again")];
        assert!(continued(std::slice::from_ref(&turn), &edited, "P:b then").is_none());
        assert!(continued(std::slice::from_ref(&turn), &messages, "Q:a then").is_none());
    }
}
