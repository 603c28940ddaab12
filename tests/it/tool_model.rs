//! A tiny model that calls a tool, written as an HF directory so that `trinity run` serves and trains it.
//!
//! Its one layer is zero, so each position's logits depend only on its own token. The embeddings and the output
//! head hold two parts in separate hidden dimensions:
//! - a chain `\n → <tool_call> → {"name":"get_weather",...} → </tool_call> → <|im_end|>` (logit 40 for the next
//!   link, 0 for every other token). Every chat prompt ends with the template's `<|im_start|>assistant\n`, so
//!   a plain chat reply is a `get_weather` call with probability ≈ 1 at any temperature;
//! - seeded random rows for every other token, so a reply that continues other text (`continue_final_message`)
//!   samples from a spread distribution whose logprobs are far from 0: a train step on those tokens checks
//!   something.
//!
//! It proves the path (tools rendered through the template, sampled tokens parsed into `tool_calls`, recorded
//! and trained exactly), not that any model can call tools.

use std::path::Path;

use serde_json::json;
use tch::{Device, Kind, Tensor};
use trinity_model::{ChatTemplate, Decoder, Family, ModelConfig, Tokenizer, WeightSource};

/// What the model says when it calls its tool.
pub const TOOL_CALL_JSON: &str = r#"{"name":"get_weather","arguments":{"city":"Paris"}}"#;

/// Qwen's layout: tools in a system block, calls as `<tool_call>` JSON (ChatML without tools).
const TEMPLATE: &str = "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools><|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n{% if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}{% else %}{{ message.content }}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Ids after the 256 byte tokens (a byte's id is its value).
const IM_START: i64 = 256;
pub const IM_END: i64 = 257;
const CALL_OPEN: i64 = 258;
const CALL_JSON: i64 = 259;
const CALL_CLOSE: i64 = 260;
const VOCAB: i64 = 264;
pub const HIDDEN: i64 = 16;
/// Hidden dimensions of the chain; the random part uses the others.
const CHAIN_DIMS: i64 = 4;

/// GPT-2's byte-level alphabet: the character each byte is written as in the vocabulary.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap();
    }
    let mut next = 256;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(next).unwrap();
            printable.push(b);
            next += 1;
        }
    }
    chars
}

/// Writes `dir/tokenizer.json`: GPT-2's byte-level alphabet (id = byte), the ChatML tokens and the tool-call
/// tokens; other tiny test models share it.
fn tokenizer(dir: &Path) -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    for (id, token) in [
        (IM_START, "<|im_start|>"),
        (IM_END, "<|im_end|>"),
        (CALL_OPEN, "<tool_call>"),
        (CALL_JSON, TOOL_CALL_JSON),
        (CALL_CLOSE, "</tool_call>"),
    ] {
        vocab.insert(token.to_owned(), json!(id));
    }
    let special = |id: i64, content: &str| json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(IM_START, "<|im_start|>"), special(IM_END, "<|im_end|>")],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []},
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    let config = json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"});
    Tokenizer::from_files(&path, Some(&config)).unwrap()
}

/// The chain in dimensions `0..CHAIN_DIMS`, seeded random rows in the rest.
struct Weights;

impl WeightSource for Weights {
    fn load(&mut self, name: &str, shape: &[i64]) -> trinity_model::Result<Tensor> {
        let chain =
            [(i64::from(b'\n'), CALL_OPEN), (CALL_OPEN, CALL_JSON), (CALL_JSON, CALL_CLOSE), (CALL_CLOSE, IM_END)];
        let zeros = || Tensor::zeros(shape, (Kind::Float, Device::Cpu));
        let random = |scale: f64| {
            let t = zeros();
            t.narrow(1, CHAIN_DIMS, HIDDEN - CHAIN_DIMS)
                .copy_(&(Tensor::randn([shape[0], HIDDEN - CHAIN_DIMS], (Kind::Float, Device::Cpu)) * scale));
            t
        };
        Ok(if name.ends_with("norm.weight") {
            Tensor::ones(shape, (Kind::Float, Device::Cpu))
        } else if name == "model.embed_tokens.weight" {
            let t = random(1.0);
            for (j, (from, _)) in chain.iter().enumerate() {
                let _ = t.get(*from).zero_();
                let _ = t.get(*from).get(j as i64).fill_(1.0);
            }
            t
        } else if name == "lm_head.weight" {
            // The final norm scales a one-hot row to 4: logit 40 for the next link, 0 for the rest; a random row
            // (norm 4 over 12 dimensions) meets random head rows of scale 0.5 in logits of spread ~2.
            let t = random(0.5);
            for (j, (_, to)) in chain.iter().enumerate() {
                let _ = t.get(*to).get(j as i64).fill_(10.0);
            }
            t
        } else {
            zeros()
        })
    }
}

/// Writes the model to `dir` as an HF directory (config, safetensors, tokenizer and chat template).
pub fn write_tool_model(dir: &Path) {
    tch::manual_seed(7);
    write_model(dir, &mut Weights);
}

/// Writes a [`model_config`] model with `weights` to `dir` as an HF directory (config, safetensors, [`tokenizer`]
/// and the ChatML [`TEMPLATE`]).
pub fn write_model(dir: &Path, weights: &mut dyn WeightSource) {
    std::fs::create_dir_all(dir).unwrap();
    let tokenizer = tokenizer(dir);
    let decoder = Decoder::load(model_config(), weights, Kind::Float, Device::Cpu).unwrap();
    let template = ChatTemplate::new(TEMPLATE, Some("<|im_start|>"), Some("<|im_end|>")).unwrap();
    trinity_model::save_hf_parts(&decoder, &tokenizer, Some(&template), &[IM_END], dir).unwrap();
}

/// One Llama layer over [`tokenizer`]'s vocabulary, [`HIDDEN`] wide, ending a reply at `<|im_end|>`.
fn model_config() -> ModelConfig {
    ModelConfig {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: 32,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        max_position_embeddings: 4096,
        tie_word_embeddings: false,
        eos_token_ids: vec![IM_END],
        ..ModelConfig::tiny(Family::Llama)
    }
}
