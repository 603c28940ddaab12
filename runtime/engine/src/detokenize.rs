//! Incremental detokenization: the text a sample's tokens spell, grown one token at a time.
//!
//! Decoding a token alone is wrong for byte-level BPE (a multi-byte character can span tokens) and for
//! SentencePiece-style decoders (a leading space depends on the previous token), so new text is found as
//! `decode(tokens[prefix..]) - decode(tokens[prefix..read])` with a window that starts a few tokens back,
//! the scheme of Hugging Face's text-generation-inference; text ending in U+FFFD (an incomplete character) is
//! held back until the next token completes it. Special tokens are skipped, as in [`crate::Completion::text`].
//!
//! Invariant: `text` is the decoded text (special tokens skipped) of all tokens up to `read`.

use trinity_model::Tokenizer;

use crate::error::{EngineError, Result};

/// Tokens of context kept in front of the new tokens when decoding a delta.
const CONTEXT_TOKENS: usize = 6;

/// The text of a growing token sequence; one per sample. Used by the engine for stop strings and by servers
/// that stream text.
#[derive(Debug, Clone, Default)]
pub struct IncrementalText {
    text: String,
    prefix: usize,
    read: usize,
}

impl IncrementalText {
    /// Takes in the newest tokens (`tokens` is the whole sequence so far, of which this has seen a prefix) and
    /// returns the text they add; empty while an incomplete character is held back.
    pub fn push(&mut self, tokenizer: &Tokenizer, tokens: &[u32]) -> Result<&str> {
        let before = tokenizer.decode(&tokens[self.prefix..self.read], true).map_err(EngineError::Model)?;
        let after = tokenizer.decode(&tokens[self.prefix..], true).map_err(EngineError::Model)?;
        let old = self.text.len();
        match after.get(before.len()..) {
            Some(d) if after.len() > before.len() && after.starts_with(&before) && !after.ends_with('\u{FFFD}') => {
                self.text.push_str(d);
                self.read = tokens.len();
                self.prefix = self.read.saturating_sub(CONTEXT_TOKENS);
            }
            _ => {}
        }
        Ok(&self.text[old..])
    }

    /// All text so far.
    pub fn text(&self) -> &str {
        &self.text
    }
}
