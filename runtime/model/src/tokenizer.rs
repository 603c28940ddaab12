//! Tokenizers from a Hugging Face `tokenizer.json` or from GGUF metadata, through the `tokenizers` crate.
//!
//! A GGUF file has no `tokenizer.json`; it stores the vocabulary, merges, token types and special ids under
//! `tokenizer.ggml.*`. We rebuild the same `tokenizer.json` that transformers builds from those keys (byte-level
//! BPE with the pre-tokenizer split llama.cpp's `tokenizer.ggml.pre` names, control tokens as special added
//! tokens, user-defined ones as plain added tokens), so ids match transformers' GGUF tokenizer exactly.
//!
//! Added tokens (ChatML `<|im_start|>` etc.) are always matched whole in the text, whether or not special tokens
//! are "added": `add_special_tokens` only controls the post-processor (BOS/EOS insertion).
//!
//! [`Tokenizer::max_text_bytes`] bounds how long a text of at most so many tokens can be, so a caller can refuse
//! a text far over a token limit without tokenizing it (tokenizing costs about 100 bytes of memory a byte of
//! text: a 5 MB prompt took 534 MB). The bound is `tokens × B`, where `B` is the most bytes of input one token can
//! stand for. It holds when no step of the pipeline can make text vanish, so every input byte ends up in some
//! token: a BPE model that knows every byte (byte-level, or byte fallback) or maps each unknown character to its
//! own unknown token; pre-tokenizers that only split (none that remove whitespace); added tokens that absorb no
//! whitespace; normalizers that are the identity, prepend text, or (Unicode normal forms, lowercasing) shrink a
//! text at most 4-fold, since they never delete a character and a character is at most 4 bytes (a composition
//! joins at most 3 characters of at least 2 bytes, or 3 Hangul jamo of 3 bytes, into one of 2–3 bytes). Then `B`
//! is the longest token (in bytes of the text it matches: one byte per character of a byte-level vocabulary
//! entry) times that 4. Any other tokenizer has no bound, and callers tokenize the whole text.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, GgufValue};

/// A tokenizer plus the special tokens transformers' `tokenizer_config.json` describes.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    unk_token: Option<String>,
    add_bos_token: bool,
    add_eos_token: bool,
    model_max_length: Option<u64>,
    /// The most bytes of input one token stands for, when the pipeline bounds it (see the module docs).
    bytes_per_token: Option<usize>,
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// A special-token entry of `tokenizer_config.json`: a string or an `AddedToken` object with `content`.
fn special(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` and, when given, the special tokens and flags of `tokenizer_config.json`.
    pub fn from_files(tokenizer_json: &Path, tokenizer_config: Option<&Value>) -> Result<Self> {
        let text = std::fs::read_to_string(tokenizer_json).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ModelError::MissingFile { path: tokenizer_json.to_path_buf() }
            } else {
                ModelError::io(tokenizer_json, e)
            }
        })?;
        // The JSON is checked on its own first: the `tokenizers` crate panics (an `expect` in its decoder's
        // deserializer) when a syntax error falls inside the `decoder` object, and a valid document cannot
        // reach that panic.
        serde_json::from_str::<serde::de::IgnoredAny>(&text)
            .map_err(|source| ModelError::Json { path: tokenizer_json.to_path_buf(), source })?;
        let inner = text
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| ModelError::InvalidFile { path: tokenizer_json.to_path_buf(), reason: e.to_string() })?;
        let empty = serde_json::Map::new();
        let cfg = tokenizer_config.and_then(Value::as_object).unwrap_or(&empty);
        Ok(Self {
            bos_token: special(cfg.get("bos_token")),
            eos_token: special(cfg.get("eos_token")),
            pad_token: special(cfg.get("pad_token")),
            unk_token: special(cfg.get("unk_token")),
            add_bos_token: cfg.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false),
            add_eos_token: cfg.get("add_eos_token").and_then(Value::as_bool).unwrap_or(false),
            model_max_length: cfg.get("model_max_length").and_then(Value::as_u64),
            bytes_per_token: bytes_per_token(&inner),
            inner,
        })
    }

    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata. Only byte-level BPE
    /// (`tokenizer.ggml.model = gpt2`, used by Llama 3, SmolLM, Qwen) is supported.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let model = gguf.require_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer.ggml.model `{model}` is not supported (only byte-level BPE `gpt2`)"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            let arr = gguf
                .require(key)?
                .as_array()
                .ok_or_else(|| ModelError::Metadata { key: key.to_owned(), reason: "expected an array".into() })?;
            Ok(arr.iter().map(|v| v.as_str().unwrap_or_default().to_owned()).collect())
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<i64> = gguf
            .get("tokenizer.ggml.token_type")
            .and_then(GgufValue::as_array)
            .map(|a| a.iter().map(|v| v.as_i64().unwrap_or(1)).collect())
            .unwrap_or_default();
        let pre = gguf.get("tokenizer.ggml.pre").and_then(GgufValue::as_str);
        let add_prefix_space =
            gguf.get("tokenizer.ggml.add_space_prefix").and_then(GgufValue::as_bool).unwrap_or(false);
        let alphabet = byte_alphabet();
        let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
        let mut vocab = serde_json::Map::new();
        for (i, t) in tokens.iter().enumerate() {
            let spelled = if in_alphabet(t) { t.clone() } else { t.bytes().map(|b| alphabet[b as usize]).collect() };
            vocab.insert(spelled, json!(i));
        }
        let merges: Vec<Value> = merges.iter().filter_map(|m| m.split_once(' ').map(|(a, b)| json!([a, b]))).collect();
        let mut added = Vec::new();
        for (i, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
            // 3 = CONTROL (special), 4 = USER_DEFINED (added, not special). A control token spelled outside the
            // byte alphabet is a llama.cpp mislabel and is left to BPE, as transformers does.
            let special = match ty {
                3 if in_alphabet(t) => true,
                4 => false,
                _ => continue,
            };
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": special,
            }));
        }
        let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": true, "use_regex": use_regex});
        let pre_tokenizer = match pre.and_then(split_regex) {
            Some(regex) => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
                byte_level(false),
            ]}),
            None => byte_level(true),
        };
        let id_of = |key: &str| gguf.get(key).and_then(GgufValue::as_u64).and_then(|i| tokens.get(i as usize).cloned());
        let bos_token = id_of("tokenizer.ggml.bos_token_id");
        let add_bos_token = gguf.get("tokenizer.ggml.add_bos_token").and_then(GgufValue::as_bool).unwrap_or(false);
        let add_eos_token = gguf.get("tokenizer.ggml.add_eos_token").and_then(GgufValue::as_bool).unwrap_or(false);
        let eos_token = id_of("tokenizer.ggml.eos_token_id");
        let json = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor(
                add_bos_token.then_some(()).and(bos_token.as_deref()).and_then(|t| vocab.get(t).map(|id| (t, id.clone()))),
                add_eos_token.then_some(()).and(eos_token.as_deref()).and_then(|t| vocab.get(t).map(|id| (t, id.clone()))),
            ),
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges,
            },
        });
        let inner: tokenizers::Tokenizer = serde_json::from_value(json).map_err(tok_err)?;
        Ok(Self {
            bytes_per_token: bytes_per_token(&inner),
            inner,
            bos_token,
            eos_token,
            pad_token: id_of("tokenizer.ggml.padding_token_id"),
            unk_token: id_of("tokenizer.ggml.unknown_token_id"),
            add_bos_token,
            add_eos_token,
            model_max_length: None,
        })
    }

    /// Token ids of `text`. With `add_special_tokens` the post-processor may add BOS/EOS; special tokens written
    /// in the text are single ids either way.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self.inner.encode_fast(text, add_special_tokens).map_err(tok_err)?.get_ids().to_vec())
    }

    /// The most bytes a text that encodes to at most `tokens` tokens can have; a longer text has more tokens, so
    /// it can be refused without being tokenized. `None` when this tokenizer's pipeline gives no such bound (see
    /// the module docs).
    pub fn max_text_bytes(&self, tokens: usize) -> Option<usize> {
        self.bytes_per_token.map(|per_token| tokens.saturating_mul(per_token))
    }

    /// Text of `ids`, optionally without special tokens.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(tok_err)
    }

    /// The id of a token (added tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// BOS token text.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// EOS token text.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Padding token text.
    pub fn pad_token(&self) -> Option<&str> {
        self.pad_token.as_deref()
    }

    /// Unknown token text.
    pub fn unk_token(&self) -> Option<&str> {
        self.unk_token.as_deref()
    }

    /// EOS id, if the EOS token is in the vocabulary.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    /// Padding id, if any.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    /// The wrapped `tokenizers` object, for batch encoding and offsets.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` (with `chat_template` when given) into `dir`.
    pub fn save(&self, dir: &Path, chat_template: Option<&str>) -> Result<()> {
        let path = dir.join("tokenizer.json");
        let text = self.inner.to_string(false).map_err(tok_err)?;
        std::fs::write(&path, text).map_err(|e| ModelError::io(&path, e))?;
        let mut cfg = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos_token,
            "add_eos_token": self.add_eos_token,
            "clean_up_tokenization_spaces": false,
        });
        if let Some(obj) = cfg.as_object_mut() {
            for (k, v) in [
                ("bos_token", &self.bos_token),
                ("eos_token", &self.eos_token),
                ("pad_token", &self.pad_token),
                ("unk_token", &self.unk_token),
            ] {
                obj.insert(k.into(), v.as_ref().map_or(Value::Null, |s| json!(s)));
            }
            if let Some(n) = self.model_max_length {
                obj.insert("model_max_length".into(), json!(n));
            }
            if let Some(t) = chat_template {
                obj.insert("chat_template".into(), json!(t));
            }
        }
        let path = dir.join("tokenizer_config.json");
        let text =
            serde_json::to_string_pretty(&cfg).map_err(|source| ModelError::Json { path: path.clone(), source })?;
        std::fs::write(&path, text).map_err(|e| ModelError::io(&path, e))
    }
}

/// The most bytes of input one token can stand for, when no step of `tokenizer`'s pipeline can drop text (see
/// the module docs); `None` otherwise.
fn bytes_per_token(tokenizer: &tokenizers::Tokenizer) -> Option<usize> {
    let shrink = match tokenizer.get_normalizer() {
        None => 1,
        Some(normalizer) => normalizer_shrink(&serde_json::to_value(normalizer).ok()?)?,
    };
    let byte_level = match tokenizer.get_pre_tokenizer() {
        None => false,
        Some(pre) => splits_only(&serde_json::to_value(pre).ok()?)?,
    };
    let tokenizers::models::ModelWrapper::BPE(bpe) = tokenizer.get_model() else { return None };
    let vocab = bpe.get_vocab();
    let knows_every_byte = if byte_level {
        byte_alphabet().iter().all(|c| vocab.contains_key(&c.to_string()))
    } else {
        bpe.byte_fallback && (0..=255u8).all(|b| vocab.contains_key(&format!("<0x{b:02X}>")))
    };
    // An unknown character becomes one unknown token (unless unknowns are fused), so it stands for at most 4 bytes.
    let unknown_bytes = match (&bpe.unk_token, bpe.fuse_unk) {
        _ if knows_every_byte => 0,
        (Some(_), false) => 4,
        _ => return None,
    };
    // A byte-level entry writes each byte as one character; other entries are text (prefixes and `▁` only make
    // them longer than what they match).
    let entry_bytes = |token: &str| if byte_level { token.chars().count() } else { token.len() };
    let longest_entry = vocab.keys().map(|t| entry_bytes(t)).max().unwrap_or(0);
    let mut longest_added = 0;
    for added in tokenizer.get_added_tokens_decoder().values() {
        // A token that strips the whitespace beside it stands for any run of whitespace.
        if added.lstrip || added.rstrip {
            return None;
        }
        longest_added = longest_added.max(added.content.len());
    }
    let longest = longest_entry.max(longest_added).max(unknown_bytes).max(1);
    Some(longest.saturating_mul(shrink))
}

/// How many times shorter a normalizer (as `tokenizer.json` writes it) can make a text; `None` when it can
/// delete text.
fn normalizer_shrink(normalizer: &Value) -> Option<usize> {
    match normalizer.get("type")?.as_str()? {
        "Prepend" | "ByteLevel" => Some(1),
        // No character vanishes; at most 4 bytes become 1 (see the module docs).
        "NFC" | "NFD" | "NFKC" | "NFKD" | "Lowercase" => Some(4),
        "Replace" => {
            let pattern = normalizer.get("pattern")?.get("String")?.as_str()?;
            let content = normalizer.get("content")?.as_str()?;
            (!content.is_empty()).then(|| pattern.len().div_ceil(content.len()).max(1))
        }
        "Sequence" => normalizer
            .get("normalizers")?
            .as_array()?
            .iter()
            .try_fold(1usize, |shrink, n| Some(shrink.saturating_mul(normalizer_shrink(n)?))),
        _ => None,
    }
}

/// Whether a pre-tokenizer (as `tokenizer.json` writes it) is byte-level, when it only splits text and never
/// removes any; `None` when it can remove text (whitespace splitters, a `Removed` split).
fn splits_only(pre: &Value) -> Option<bool> {
    match pre.get("type")?.as_str()? {
        "ByteLevel" => Some(true),
        "Metaspace" | "Digits" | "UnicodeScripts" => Some(false),
        "Split" | "Punctuation" => (pre.get("behavior")?.as_str()? != "Removed").then_some(false),
        "Sequence" => {
            pre.get("pretokenizers")?.as_array()?.iter().try_fold(false, |any, p| Some(any | splits_only(p)?))
        }
        _ => None,
    }
}

/// `TemplateProcessing` that adds the given BOS/EOS (token, id) around each sequence.
fn post_processor(bos: Option<(&str, Value)>, eos: Option<(&str, Value)>) -> Value {
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = serde_json::Map::new();
    if let Some((t, id)) = &bos {
        single.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
        pair.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
        specials.insert((*t).to_owned(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    pair.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let Some((t, id)) = &eos {
        single.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
        pair.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
        specials.insert((*t).to_owned(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    if let Some((t, _)) = &bos {
        pair.push(json!({"SpecialToken": {"id": t, "type_id": 1}}));
    }
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
    if let Some((t, _)) = &eos {
        pair.push(json!({"SpecialToken": {"id": t, "type_id": 1}}));
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}

/// GPT-2's byte → printable character table (`bytes_to_unicode`): printable Latin-1 bytes map to themselves,
/// the rest to code points from U+0100 up, in byte order.
fn byte_alphabet() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut next = 256u32;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                let c = char::from_u32(next).unwrap_or('?');
                next += 1;
                c
            }
        })
        .collect()
}

/// The pre-tokenizer split regex for a `tokenizer.ggml.pre` value, where it differs from GPT-2's.
fn split_regex(pre: &str) -> Option<&'static str> {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let table: HashMap<&str, &str> = [
        ("llama3", LLAMA3),
        ("llama-v3", LLAMA3),
        ("llama-bpe", LLAMA3),
        ("falcon3", LLAMA3),
        ("dbrx", LLAMA3),
        ("smaug-bpe", LLAMA3),
        ("qwen2", QWEN2),
        ("deepseek-r1-qwen", QWEN2),
        ("megrez", QWEN2),
    ]
    .into_iter()
    .collect();
    table.get(pre).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `tokenizer` fuzz target: a syntax error inside `decoder` panicked in the `tokenizers` crate
    /// (`fuzz/regressions/tokenizer/` keeps the inputs it found).
    #[test]
    fn syntax_error_inside_the_decoder_is_a_json_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, r#"{"decoder": {"type": "ByteLevel", "add_prefix_space": tru}}"#).unwrap();
        let err = Tokenizer::from_files(&path, None).unwrap_err();
        assert!(matches!(err, ModelError::Json { ref path, .. } if path.ends_with("tokenizer.json")), "{err}");
        assert!(err.to_string().contains("tokenizer.json") && err.to_string().contains("line 1"), "{err}");
    }

    /// The fixture's `tokenizer.json`; its vocabulary has 48 entries, not every byte.
    fn tiny_json() -> Value {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny/llama_tied");
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap()
    }

    fn from_json(json: &Value) -> Tokenizer {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        Tokenizer::from_files(&path, None).unwrap()
    }

    /// The fixture with every byte in its vocabulary, and this normalizer and pre-tokenizer.
    fn tiny_with(normalizer: Value, pre_tokenizer: Value) -> Tokenizer {
        let mut json = tiny_json();
        let vocab = json["model"]["vocab"].as_object_mut().unwrap();
        for c in byte_alphabet() {
            let next = vocab.len() + 3;
            vocab.entry(c.to_string()).or_insert(json!(next));
        }
        json["normalizer"] = normalizer;
        json["pre_tokenizer"] = pre_tokenizer;
        from_json(&json)
    }

    fn byte_level() -> Value {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
    }

    #[test]
    fn a_text_longer_than_the_bound_has_more_tokens() {
        let tokenizer = tiny_with(Value::Null, byte_level());
        // The longest entry is the added token `<|endoftext|>`: 13 bytes.
        assert_eq!(tokenizer.max_text_bytes(10), Some(130));
        let texts = [
            "<|endoftext|><|endoftext|><|im_start|>".to_owned(),
            "ab1 ".repeat(300),
            "           ".repeat(50),
            "é😀\n\u{0}".repeat(40),
            "abababababab".repeat(100),
        ];
        for text in texts {
            let tokens = tokenizer.encode(&text, true).unwrap().len();
            let bound = tokenizer.max_text_bytes(tokens).unwrap();
            assert!(text.len() <= bound, "{} bytes in {tokens} tokens, bound {bound}: {text:?}", text.len());
        }
    }

    #[test]
    fn pipelines_that_can_drop_text_have_no_bound() {
        let bound = |normalizer: Value, pre: Value| tiny_with(normalizer, pre).max_text_bytes(1);
        assert_eq!(bound(Value::Null, byte_level()), Some(13));
        assert_eq!(bound(json!({"type": "NFC"}), byte_level()), Some(52));
        let sequence = json!({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]});
        assert_eq!(bound(sequence, byte_level()), Some(208));
        assert_eq!(bound(json!({"type": "Strip", "strip_left": true, "strip_right": true}), byte_level()), None);
        let whitespace = json!({"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, byte_level()]});
        assert_eq!(bound(Value::Null, whitespace), None);
        let removed = json!({"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": false});
        assert_eq!(bound(Value::Null, json!({"type": "Sequence", "pretokenizers": [removed, byte_level()]})), None);
        // A byte-level vocabulary without every byte drops the bytes it lacks (the fixture as it is).
        assert_eq!(from_json(&tiny_json()).max_text_bytes(1), None);
    }

    #[test]
    fn byte_alphabet_is_gpt2s() {
        let a = byte_alphabet();
        assert_eq!(a[b' ' as usize], 'Ġ');
        assert_eq!(a[b'\n' as usize], 'Ċ');
        assert_eq!(a[b'A' as usize], 'A');
        let unique: std::collections::HashSet<char> = a.iter().copied().collect();
        assert_eq!(unique.len(), 256);
    }

    #[test]
    fn missing_tokenizer_json_is_named() {
        let err = Tokenizer::from_files(Path::new("/nonexistent/tokenizer.json"), None).unwrap_err();
        assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
        assert!(err.to_string().contains("tokenizer.json"));
    }
}
