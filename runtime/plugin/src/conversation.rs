//! The model turns of one workflow run, each recorded by the explorer's [`Conversation`] (the one multi-turn
//! recorder) so that experiences train on exactly what the model sampled.
//!
//! Every `chat` or `generate` call records one [`Turn`] per sample: the messages so far and a recording through
//! that sample's answer. Plugin chats branch: each sample of a request is a clone of the request's recording
//! that records its own answer, and a later chat continues the turn whose messages it extends (that turn's
//! messages, its reply as the assistant message, then new messages) by appending the tokenized *new text only*:
//! re-tokenizing the whole conversation could split the model's own tokens differently from how it sampled
//! them, and the trainer would then score tokens the model never produced.
//!
//! The rule on a re-rendered history: a chat that continues no turn, because its messages extend none or
//! because the chat template rendered the earlier turns differently (some templates drop earlier reasoning),
//! starts a fresh recording whose prompt is the whole rendered conversation. The plugin's earlier answers are
//! then context of that turn's experience, not actions; a built-in workflow's episode ends instead
//! (`TurnError::NotAPrefix`). Both are the caller's choice over the same recorder.

use trinity_explorer::Conversation;
use trinity_model::ChatMessage;

/// One recorded sample and everything before it.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    /// The conversation including this turn's reply as the last (assistant) message; empty for `generate`.
    pub(crate) messages: Vec<ChatMessage>,
    /// The tokens through this turn's answer (what an experience of the turn trains on).
    pub(crate) conversation: Conversation,
}

/// The recorded turn that `messages` (rendered as `rendered`) continue: the longest one whose messages are a
/// prefix of `messages` and whose recorded text is a prefix of `rendered`.
pub(crate) fn continued<'a>(turns: &'a [Turn], messages: &[ChatMessage], rendered: &str) -> Option<&'a Turn> {
    turns
        .iter()
        .filter(|turn| {
            !turn.messages.is_empty()
                && messages.len() > turn.messages.len()
                && messages.starts_with(&turn.messages)
                && turn.conversation.continues(rendered)
        })
        .max_by_key(|turn| turn.messages.len())
}
