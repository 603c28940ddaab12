//! Reasoning text in the model's output, split from the answer as vLLM's `--reasoning-parser` does
//! (Trinity-RFT's `explorer.rollout_model.reasoning_parser`): a thinking model writes
//! `<think>...</think>answer`, and the API returns the thinking as the message's `reasoning_content` and only
//! the answer as its `content`, so an agent's next turn (and its tool-call parsing) sees the answer alone.
//!
//! Two of vLLM's parsers, with their rules for text that is not well-formed:
//! - `deepseek_r1`: a leading `<think>` is optional (DeepSeek-R1's template puts it in the prompt); everything
//!   up to `</think>` is reasoning, and without `</think>` the whole reply is reasoning (it was cut off while
//!   thinking).
//! - `qwen3`: only a reply with both `<think>` and `</think>` has reasoning; anything else is all content.
//!
//! Streaming follows the same rules as far as the text so far allows: while the reply could still begin with
//! `<think>` nothing is sent, and a possible start of `</think>` at the end waits for the next token. A `qwen3`
//! reply that opens `<think>` and never closes it has streamed its thinking as reasoning, where the whole
//! reply says content (vLLM streams it the same way).

use crate::tool_calls::partial_tag_len;

/// The reasoning parsers trinity has, under vLLM's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// vLLM's `deepseek_r1`.
    DeepSeekR1,
    /// vLLM's `qwen3`.
    Qwen3,
}

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

impl ReasoningParser {
    /// The names configs use, in the order error messages list them.
    pub const NAMES: [&'static str; 2] = ["deepseek_r1", "qwen3"];

    /// The parser vLLM calls `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "deepseek_r1" => Some(Self::DeepSeekR1),
            "qwen3" => Some(Self::Qwen3),
            _ => None,
        }
    }

    /// A finished reply split into its reasoning and its content (each `None` when empty, as vLLM returns them).
    pub(crate) fn split(self, text: &str) -> (Option<String>, Option<String>) {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        if self == Self::Qwen3 && !(text.contains(THINK_START) && text.contains(THINK_END)) {
            return (None, some(text));
        }
        // vLLM partitions at the first `<think>` and keeps what follows it.
        let body = text.split_once(THINK_START).map_or(text, |(_, after)| after);
        match body.split_once(THINK_END) {
            Some((reasoning, content)) => (some(reasoning), some(content)),
            None if self == Self::Qwen3 => (None, some(body)),
            None => (some(body), None),
        }
    }
}

/// Where a streamed choice is in its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Phase {
    /// Nothing decided: the text so far could still be the start of `<think>`.
    #[default]
    Opening,
    /// Inside the reasoning; `</think>` not seen yet.
    Reasoning,
    /// Past the reasoning (or there is none): the rest is content.
    Content,
}

/// What a streamed choice can release now.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Release {
    /// Reasoning text to send.
    pub(crate) reasoning: String,
    /// Where content starts in the text, once known (the released prefix is consumed up to there).
    pub(crate) content_from: Option<usize>,
}

/// Advances a streamed choice whose text so far is `text`, of which `*consumed` bytes are dealt with; returns
/// the reasoning that can go out. Content is released by the caller from `*consumed` on once the phase is
/// [`Phase::Content`].
pub(crate) fn advance(parser: ReasoningParser, phase: &mut Phase, text: &str, consumed: &mut usize) -> Release {
    let mut release = Release::default();
    if *phase == Phase::Opening {
        if THINK_START.starts_with(text) && text.len() < THINK_START.len() {
            return release;
        }
        if let Some(rest_at) = text.strip_prefix(THINK_START).map(|_| THINK_START.len()) {
            *consumed = rest_at;
            *phase = Phase::Reasoning;
        } else if parser == ReasoningParser::DeepSeekR1 {
            *phase = Phase::Reasoning;
        } else {
            *phase = Phase::Content;
            release.content_from = Some(*consumed);
            return release;
        }
    }
    if *phase == Phase::Reasoning {
        let rest = &text[*consumed..];
        match rest.find(THINK_END) {
            Some(at) => {
                release.reasoning = rest[..at].to_owned();
                *consumed += at + THINK_END.len();
                *phase = Phase::Content;
                release.content_from = Some(*consumed);
            }
            None => {
                let mut end = text.len() - partial_tag_len(text, THINK_END);
                while end > *consumed && !text.is_char_boundary(end) {
                    end -= 1;
                }
                if end > *consumed {
                    release.reasoning = text[*consumed..end].to_owned();
                    *consumed = end;
                }
            }
        }
    }
    release
}

#[cfg(test)]
mod tests {
    use super::ReasoningParser::{DeepSeekR1, Qwen3};
    use super::*;

    fn pair(r: Option<&str>, c: Option<&str>) -> (Option<String>, Option<String>) {
        (r.map(str::to_owned), c.map(str::to_owned))
    }

    #[test]
    fn whole_replies_split_as_vllm_splits_them() {
        assert_eq!(DeepSeekR1.split("<think>plan</think>42"), pair(Some("plan"), Some("42")));
        assert_eq!(DeepSeekR1.split("plan</think>42"), pair(Some("plan"), Some("42")));
        assert_eq!(DeepSeekR1.split("still thinking"), pair(Some("still thinking"), None));
        assert_eq!(DeepSeekR1.split("<think>plan</think>"), pair(Some("plan"), None));
        assert_eq!(Qwen3.split("<think>plan</think>42"), pair(Some("plan"), Some("42")));
        assert_eq!(Qwen3.split("42"), pair(None, Some("42")));
        assert_eq!(Qwen3.split("plan</think>42"), pair(None, Some("plan</think>42")));
        assert_eq!(Qwen3.split("<think>unfinished"), pair(None, Some("<think>unfinished")));
        assert_eq!(ReasoningParser::from_name("qwen3"), Some(Qwen3));
        assert_eq!(ReasoningParser::from_name("granite"), None);
    }

    /// Feeds `pieces` one at a time as a stream would and returns (reasoning sent, content start, phase).
    fn stream(parser: ReasoningParser, pieces: &[&str]) -> (String, Option<usize>, Phase) {
        let (mut phase, mut consumed, mut text, mut reasoning, mut from) =
            (Phase::default(), 0, String::new(), String::new(), None);
        for piece in pieces {
            text.push_str(piece);
            let release = advance(parser, &mut phase, &text, &mut consumed);
            reasoning.push_str(&release.reasoning);
            from = from.or(release.content_from);
        }
        (reasoning, from, phase)
    }

    #[test]
    fn streamed_tags_split_across_tokens_are_held_until_they_are_whole() {
        let (reasoning, from, phase) = stream(DeepSeekR1, &["<th", "ink>", "pl", "an</", "thi", "nk>", "42"]);
        assert_eq!((reasoning.as_str(), from, phase), ("plan", Some(19), Phase::Content));
        // A possible `</think>` start is not sent as reasoning while it may still complete.
        let (reasoning, _, phase) = stream(DeepSeekR1, &["a", "b</th"]);
        assert_eq!((reasoning.as_str(), phase), ("ab", Phase::Reasoning));
        // qwen3 without `<think>` is content from the first byte, once it cannot be the tag.
        let (reasoning, from, phase) = stream(Qwen3, &["<", "b>"]);
        assert_eq!((reasoning.as_str(), from, phase), ("", Some(0), Phase::Content));
        let (_, from, phase) = stream(Qwen3, &["<thi"]);
        assert_eq!((from, phase), (None, Phase::Opening));
    }
}
