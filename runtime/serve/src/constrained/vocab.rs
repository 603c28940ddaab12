//! The automaton lifted to tokens: each token's bytes, a trie over them, and the mask of the tokens whose bytes
//! keep a state alive, as the engine's [`TokenConstraint`].
//!
//! A token's bytes are what the engine's final text decodes it to: for a byte-level BPE vocabulary (GPT-2's
//! alphabet: SmolLM2, Qwen, Llama 3) the token's characters mapped back to bytes, so tokens holding part of a
//! UTF-8 character count; for other vocabularies the token decoded alone (with `<0xNN>` byte-fallback tokens as
//! their byte), and a token that decodes to a replacement character is never allowed. Special tokens (those
//! the decoder skips) are never allowed: the engine adds the end-of-sequence ids itself.
//!
//! A mask walks the trie depth first from the state, stepping the automaton one byte per trie edge, so a byte
//! shared by many tokens is stepped once and a dead prefix prunes every token under it. Masks are cached by
//! state, per constraint (shared by a request's samples): inside a string, and at every repeated structural
//! position, the state repeats and the mask is a lookup.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use trinity_engine::{ConstraintError, ConstraintState, TokenConstraint};
use trinity_model::Tokenizer;

use super::automaton::State;
use super::schema::Schema;

/// How many masks a constraint keeps (each one byte per vocabulary entry).
const MAX_CACHED_MASKS: usize = 256;

#[derive(Debug, Default)]
struct TrieNode {
    children: Vec<(u8, u32)>,
    /// Tokens whose bytes end here.
    tokens: Vec<u32>,
}

/// A tokenizer's vocabulary as bytes, with a trie over them; built once per model.
#[derive(Debug)]
pub(crate) struct TokenIndex {
    bytes: Vec<Option<Box<[u8]>>>,
    nodes: Vec<TrieNode>,
}

/// GPT-2's byte-level alphabet: the byte each character of a token stands for.
fn byte_level_decoder() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut map: HashMap<char, u8> = printable.iter().filter_map(|&b| Some((char::from_u32(b)?, b as u8))).collect();
    let mut next = 256;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            if let Some(c) = char::from_u32(next) {
                map.insert(c, b as u8);
            }
            printable.push(b);
            next += 1;
        }
    }
    map
}

impl TokenIndex {
    /// Every token's bytes (see the module docs) and the trie over them.
    pub(crate) fn new(tokenizer: &Tokenizer) -> Self {
        let byte_level = tokenizer.token_to_id("Ġ").is_some();
        let alphabet = byte_level_decoder();
        let bytes: Vec<Option<Box<[u8]>>> = (0..tokenizer.vocab_size() as u32)
            .map(|id| {
                let special = tokenizer.decode(&[id], true).is_ok_and(|text| text.is_empty());
                if special {
                    return None;
                }
                let token = tokenizer.id_to_token(id)?;
                if byte_level {
                    return token
                        .chars()
                        .map(|c| alphabet.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .map(Into::into);
                }
                if let Some(hex) = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
                    return u8::from_str_radix(hex, 16).ok().map(|b| Box::from([b]));
                }
                let text = tokenizer.decode(&[id], false).ok()?;
                (!text.is_empty() && !text.contains('\u{FFFD}')).then(|| text.into_bytes().into())
            })
            .collect();
        let mut nodes = vec![TrieNode::default()];
        for (id, token) in bytes.iter().enumerate() {
            let Some(token) = token else { continue };
            let mut at = 0usize;
            for &b in token.iter() {
                at = match nodes[at].children.iter().find(|(c, _)| *c == b) {
                    Some(&(_, child)) => child as usize,
                    None => {
                        nodes.push(TrieNode::default());
                        let child = nodes.len() - 1;
                        nodes[at].children.push((b, child as u32));
                        child
                    }
                };
            }
            nodes[at].tokens.push(id as u32);
        }
        Self { bytes, nodes }
    }

    /// The tokens whose bytes keep `state` alive, indexed by id.
    pub(crate) fn mask(&self, schema: &Schema, state: &State) -> Vec<bool> {
        let mut mask = vec![false; self.bytes.len()];
        let mut pending: Vec<(u32, State)> = vec![(0, state.clone())];
        while let Some((node, state)) = pending.pop() {
            for &(b, child) in &self.nodes[node as usize].children {
                let next = state.feed_byte(schema, b);
                if next.is_dead() {
                    continue;
                }
                let child_node = &self.nodes[child as usize];
                for &token in &child_node.tokens {
                    mask[token as usize] = true;
                }
                if !child_node.children.is_empty() {
                    pending.push((child, next));
                }
            }
        }
        mask
    }

    fn bytes(&self, token: u32) -> Option<&[u8]> {
        self.bytes.get(token as usize)?.as_deref()
    }
}

/// A compiled schema over a model's vocabulary: the engine's constraint for one request.
#[derive(Debug)]
pub(crate) struct JsonConstraint {
    schema: Schema,
    index: Arc<TokenIndex>,
    masks: Mutex<HashMap<State, Arc<[bool]>>>,
}

impl JsonConstraint {
    pub(crate) fn new(schema: Schema, index: Arc<TokenIndex>) -> Self {
        Self { schema, index, masks: Mutex::new(HashMap::new()) }
    }

    fn mask(&self, state: &State) -> Arc<[bool]> {
        let cached = self.masks.lock().unwrap_or_else(|e| e.into_inner()).get(state).cloned();
        if let Some(mask) = cached {
            return mask;
        }
        let mask: Arc<[bool]> = self.index.mask(&self.schema, state).into();
        let mut masks = self.masks.lock().unwrap_or_else(|e| e.into_inner());
        if masks.len() >= MAX_CACHED_MASKS {
            masks.clear();
        }
        masks.insert(state.clone(), Arc::clone(&mask));
        mask
    }
}

/// The engine's handle on a [`JsonConstraint`]: each sample's state shares its mask cache.
#[derive(Debug, Clone)]
pub(crate) struct SharedJson(pub(crate) Arc<JsonConstraint>);

impl TokenConstraint for SharedJson {
    fn start(&self) -> Box<dyn ConstraintState> {
        let state = State::start(&self.0.schema);
        Box::new(JsonState { constraint: Arc::clone(&self.0), state })
    }
}

/// One sample's automaton state.
struct JsonState {
    constraint: Arc<JsonConstraint>,
    state: State,
}

impl ConstraintState for JsonState {
    fn allowed(&mut self) -> Result<Arc<[bool]>, ConstraintError> {
        Ok(self.constraint.mask(&self.state))
    }

    fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        let bytes = self.constraint.index.bytes(token).ok_or_else(|| format!("token {token} has no text"))?;
        let next = self.state.feed(&self.constraint.schema, bytes);
        if next.is_dead() {
            return Err(format!(
                "token {token} ({:?}) does not continue the JSON value",
                String::from_utf8_lossy(bytes)
            ));
        }
        self.state = next;
        Ok(())
    }

    fn can_end(&self) -> bool {
        self.state.can_end()
    }

    fn must_end(&self) -> bool {
        self.state.must_end()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;

    use super::*;

    /// The SmolLM2 GGUF that `cargo xtask setup` installs (or `TRINITY_SMOLLM2_GGUF`); a missing file fails the
    /// test, saying how to install it.
    fn smollm2_tokenizer() -> Tokenizer {
        let path = std::env::var_os("TRINITY_SMOLLM2_GGUF").map(std::path::PathBuf::from).unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
        assert!(path.exists(), "SmolLM2 GGUF not found at {}: run `cargo xtask setup`", path.display());
        let gguf = trinity_model::GgufFile::open(&path).unwrap();
        Tokenizer::from_gguf(&gguf).unwrap()
    }

    /// On SmolLM2's 49,152-token vocabulary: the trie's mask equals feeding every token's bytes on its own, at
    /// states along a tool call (structure, a key, inside a string, a number), and the mask's cost is printed
    /// (built fresh each time, then from the cache).
    #[test]
    fn smollm2_masks_equal_the_brute_force_masks_and_their_cost_is_printed() {
        let tokenizer = smollm2_tokenizer();
        let built = Instant::now();
        let index = Arc::new(TokenIndex::new(&tokenizer));
        let build_ms = built.elapsed().as_secs_f64() * 1e3;
        let comma = index.bytes(tokenizer.encode(",", false).unwrap()[0]).unwrap().to_vec();
        assert_eq!(comma, b",");
        assert!(index.bytes(tokenizer.eos_token_id().unwrap()).is_none(), "special tokens are never allowed");
        let params = json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]});
        let schema = Schema::tool_calls([("get_weather", Some(&params))]);
        let constraint = JsonConstraint::new(schema.clone(), Arc::clone(&index));
        let prefixes = [
            "",
            "[",
            "[{\"name\": \"get_",
            "[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Par",
            "[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"P\",\"days\":1",
        ];
        let mut fresh = Vec::new();
        for prefix in prefixes {
            let state = State::start(&schema).feed(&schema, prefix.as_bytes());
            assert!(!state.is_dead(), "{prefix}");
            let started = Instant::now();
            let mask = index.mask(&schema, &state);
            fresh.push(started.elapsed().as_secs_f64() * 1e3);
            let brute: Vec<bool> = (0..index.bytes.len() as u32)
                .map(|t| index.bytes(t).is_some_and(|b| !state.feed(&schema, b).is_dead()))
                .collect();
            assert_eq!(mask, brute, "after {prefix:?}");
            assert!(mask.contains(&true));
            constraint.mask(&state);
        }
        let state = State::start(&schema).feed(&schema, prefixes[3].as_bytes());
        let started = Instant::now();
        for _ in 0..100 {
            constraint.mask(&state);
        }
        let cached_us = started.elapsed().as_secs_f64() * 1e4;
        println!(
            "SmolLM2 vocabulary: index built in {build_ms:.0} ms; a fresh mask {} ms at the states {prefixes:?}; a cached one {cached_us:.1} us",
            fresh.iter().map(|ms| format!("{ms:.2}")).collect::<Vec<_>>().join(" / ")
        );
    }
}
