//! Stop strings: incremental detokenization of a sample's tokens and a search for the stop strings in the text
//! that each new token adds.
//!
//! Decoding a token alone is wrong for byte-level BPE (a multi-byte character can span tokens) and for
//! SentencePiece-style decoders (a leading space depends on the previous token), so new text is found as
//! `decode(tokens[prefix..]) - decode(tokens[prefix..read])` with a window that starts a few tokens back,
//! the scheme of Hugging Face's text-generation-inference; text ending in U+FFFD (an incomplete character) is
//! held back until the next token completes it. The search only scans the new text plus the longest stop
//! string's length before it, so a step costs O(window), not O(length of the sample).
//!
//! Invariant: `text` is the decoded text (special tokens skipped) of all tokens up to `read`.

use trinity_model::Tokenizer;

use crate::error::Result;

/// Tokens of context kept in front of the new tokens when decoding a delta.
const CONTEXT_TOKENS: usize = 6;

/// Per-sample stop-string state.
#[derive(Debug)]
pub(crate) struct StopStrings {
    stops: Vec<String>,
    longest: usize,
    text: String,
    prefix: usize,
    read: usize,
}

impl StopStrings {
    pub(crate) fn new(stops: &[String]) -> Self {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        Self { stops: stops.to_vec(), longest, text: String::new(), prefix: 0, read: 0 }
    }

    /// Takes in the newest token (`tokens` is the whole sample so far). When `check` is set and a stop string
    /// now appears in the text, returns the text before its first occurrence.
    pub(crate) fn push(&mut self, tokenizer: &Tokenizer, tokens: &[u32], check: bool) -> Result<Option<String>> {
        let before = tokenizer.decode(&tokens[self.prefix..self.read], true).map_err(crate::EngineError::Model)?;
        let after = tokenizer.decode(&tokens[self.prefix..], true).map_err(crate::EngineError::Model)?;
        let delta = match after.get(before.len()..) {
            Some(d) if after.len() > before.len() && after.starts_with(&before) && !after.ends_with('\u{FFFD}') => d,
            _ => return Ok(None),
        };
        let mut start = self.text.len().saturating_sub(self.longest.saturating_sub(1));
        while !self.text.is_char_boundary(start) {
            start -= 1;
        }
        self.text.push_str(delta);
        self.read = tokens.len();
        self.prefix = self.read.saturating_sub(CONTEXT_TOKENS);
        if !check {
            return Ok(None);
        }
        let window = &self.text[start..];
        let first = self.stops.iter().filter_map(|s| window.find(s.as_str())).min();
        Ok(first.map(|at| self.text[..start + at].to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level BPE tokenizer over a few characters (newline is `Ċ` and `é` is `Ã©` in byte-level form).
    pub(crate) fn tokenizer() -> Tokenizer {
        let vocab: serde_json::Map<String, serde_json::Value> = ["a", "b", "c", "d", "Ċ", "ab", "Ã", "©"]
            .iter()
            .enumerate()
            .map(|(i, t)| ((*t).to_owned(), i.into()))
            .collect();
        let byte_level = serde_json::json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false
        });
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
            "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": [["a", "b"]]
            },
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        Tokenizer::from_files(&path, None).unwrap()
    }

    #[test]
    fn finds_stop_strings_across_tokens_and_cuts_the_text_before_them() {
        let tok = tokenizer();
        let ids = tok.encode("abcd\nab", false).unwrap();
        let mut stop = StopStrings::new(&["d\na".to_owned()]);
        let mut hit = None;
        for i in 1..=ids.len() {
            if let Some(text) = stop.push(&tok, &ids[..i], true).unwrap() {
                hit = Some((i, text));
                break;
            }
        }
        let (at, text) = hit.unwrap();
        assert_eq!(text, "abc");
        assert_eq!(tok.decode(&ids[..at], true).unwrap(), "abcd\nab");
    }

    #[test]
    fn multibyte_characters_are_held_until_complete_and_checks_can_wait() {
        let tok = tokenizer();
        // "é" is two bytes, two byte-level tokens ("Ã", "©").
        let ids = tok.encode("aéb", false).unwrap();
        assert_eq!(ids.len(), 4);
        let mut stop = StopStrings::new(&["éb".to_owned()]);
        assert_eq!(stop.push(&tok, &ids[..1], true).unwrap(), None);
        assert_eq!(stop.push(&tok, &ids[..2], true).unwrap(), None);
        assert_eq!(stop.push(&tok, &ids[..3], false).unwrap(), None);
        assert_eq!(stop.push(&tok, &ids[..4], true).unwrap().as_deref(), Some("a"));
    }
}
