//! Stop strings: a search for the stop strings in the text that each new token adds to a sample.
//!
//! The text comes from [`crate::IncrementalText`]; the search only scans the new text plus the longest stop
//! string's length before it, so a step costs O(window), not O(length of the sample).

use trinity_model::Tokenizer;

use crate::detokenize::IncrementalText;
use crate::error::Result;

/// Per-sample stop-string state.
#[derive(Debug)]
pub(crate) struct StopStrings {
    stops: Vec<String>,
    longest: usize,
    text: IncrementalText,
}

impl StopStrings {
    pub(crate) fn new(stops: &[String]) -> Self {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        Self { stops: stops.to_vec(), longest, text: IncrementalText::default() }
    }

    /// Takes in the newest token (`tokens` is the whole sample so far). When `check` is set and a stop string
    /// now appears in the text, returns the text before its first occurrence.
    pub(crate) fn push(&mut self, tokenizer: &Tokenizer, tokens: &[u32], check: bool) -> Result<Option<String>> {
        let old = self.text.text().len();
        if self.text.push(tokenizer, tokens)?.is_empty() {
            return Ok(None);
        }
        if !check {
            return Ok(None);
        }
        let text = self.text.text();
        let mut start = old.saturating_sub(self.longest.saturating_sub(1));
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let window = &text[start..];
        let first = self.stops.iter().filter_map(|s| window.find(s.as_str())).min();
        Ok(first.map(|at| text[..start + at].to_owned()))
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
