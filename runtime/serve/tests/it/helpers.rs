//! Models, servers and an HTTP client for the tests.
//!
//! Two models: the two-layer Llama fixture other crates test with (real tokenizer and chat template, random
//! weights: it generates gibberish), and a "tool model" built here whose output is fixed by construction, so a
//! tool call can be tested end to end through real sampling: its layers are zero, so each position's logits
//! depend only on its own token, and its embeddings and output head form a chain
//! `\n → <tool_call> → {"name":"get_weather",...} → </tool_call> → <|im_end|>`. Every chat prompt ends with
//! the template's `<|im_start|>assistant\n`, so the model "calls" `get_weather` with probability ≈ 1 at any
//! temperature. It proves the server's path (tools rendered through the template, sampled tokens parsed into
//! `tool_calls`, recorded exactly), not that any model can call tools.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};
use trinity_buffer::Experience;
use trinity_engine::{Engine, EngineConfig, EngineModel};
use trinity_explorer::RolloutModel;
use trinity_model::{ChatTemplate, Decoder, Family, ModelConfig, Tokenizer, WeightSource};
use trinity_serve::{CommitReport, ExperienceSink, ServeOptions, ServerHandle, SinkFuture};

pub fn tiny_model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied")
}

/// The Llama fixture as a rollout model with `slots` KV-cache slots of `max_model_len` tokens.
pub fn tiny_rollout(slots: usize, max_model_len: usize) -> Arc<RolloutModel> {
    let loaded = trinity_model::load_model(&tiny_model_dir(), Kind::Float, Device::Cpu).unwrap();
    let config = EngineConfig { max_model_len, max_num_seqs: slots, ..EngineConfig::default() };
    Arc::new(RolloutModel::start(loaded, config).unwrap())
}

/// What the tool model says.
pub const TOOL_CALL_JSON: &str = r#"{"name":"get_weather","arguments":{"city":"Paris"}}"#;

/// The tool model's chat template: Qwen's layout, tools in a system block.
const TOOL_TEMPLATE: &str = "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools><|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n{% if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}{% else %}{{ message.content }}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

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

/// Ids of the tool model's vocabulary: 256 bytes, then these.
pub const IM_START: i64 = 256;
pub const IM_END: i64 = 257;
const CALL_OPEN: i64 = 258;
const CALL_JSON: i64 = 259;
const CALL_CLOSE: i64 = 260;
const THINK_OPEN: i64 = 261;
const THINK_TEXT_ID: i64 = 262;
const THINK_CLOSE: i64 = 263;
const TOOL_VOCAB: i64 = 264;

/// What the thinking tool model thinks before its call (one token).
pub const THINK_TEXT: &str = "need:get_weather(Paris)";

fn tool_tokenizer(dir: &Path) -> Tokenizer {
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
        (THINK_OPEN, "<think>"),
        (THINK_TEXT_ID, THINK_TEXT),
        (THINK_CLOSE, "</think>"),
    ] {
        vocab.insert(token.to_owned(), json!(id));
    }
    let special = |id: i64, content: &str| json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        // `<think>` and `</think>` are added tokens that are not special, as in Qwen3's tokenizer: a prompt that
        // holds them reads them as one token each.
        "added_tokens": [
            special(IM_START, "<|im_start|>"), special(IM_END, "<|im_end|>"),
            json!({"id": THINK_OPEN, "content": "<think>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}),
            json!({"id": THINK_CLOSE, "content": "</think>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}),
        ],
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

/// Zero layers; embeddings and output head that chain each `(from, to)` link: the token after `from` is `to`.
struct ChainWeights(Vec<(i64, i64)>);

const HIDDEN: i64 = 16;

impl WeightSource for ChainWeights {
    fn load(&mut self, name: &str, shape: &[i64]) -> trinity_model::Result<Tensor> {
        let chain = &self.0;
        let zeros = || Tensor::zeros(shape, (Kind::Float, Device::Cpu));
        Ok(if name.ends_with("norm.weight") {
            Tensor::ones(shape, (Kind::Float, Device::Cpu))
        } else if name == "model.embed_tokens.weight" {
            let t = zeros();
            for (j, (from, _)) in chain.iter().enumerate() {
                let _ = t.get(*from).get(j as i64).fill_(1.0);
            }
            t
        } else if name == "lm_head.weight" {
            let t = zeros();
            for (j, (_, to)) in chain.iter().enumerate() {
                // The final norm scales a one-hot row to 4: logit 40 for the next token, 0 for the rest.
                let _ = t.get(*to).get(j as i64).fill_(10.0);
            }
            t
        } else {
            zeros()
        })
    }
}

/// The tool model as a rollout model: `\n → <tool_call> → JSON → </tool_call> → <|im_end|>`.
pub fn tool_rollout() -> Arc<RolloutModel> {
    chain_rollout(&[], 1024)
}

/// The tool model with room for 8192 tokens (forced tool choices sample long random strings on it).
pub fn long_tool_rollout() -> Arc<RolloutModel> {
    chain_rollout(&[], 8192)
}

/// The tool model thinking first: `\n → <think> → THINK_TEXT → </think> → <tool_call> → ...`.
pub fn thinking_tool_rollout() -> Arc<RolloutModel> {
    chain_rollout(&[THINK_OPEN, THINK_TEXT_ID, THINK_CLOSE], 1024)
}

/// The thinking tool model with room for 8192 tokens (a constrained answer after the thinking is random text).
pub fn long_thinking_tool_rollout() -> Arc<RolloutModel> {
    chain_rollout(&[THINK_OPEN, THINK_TEXT_ID, THINK_CLOSE], 8192)
}

/// The tool model with `before_call` said between the prompt's last newline and the call.
fn chain_rollout(before_call: &[i64], max_model_len: usize) -> Arc<RolloutModel> {
    let newline = i64::from(b'\n');
    let path: Vec<i64> = [newline]
        .into_iter()
        .chain(before_call.iter().copied())
        .chain([CALL_OPEN, CALL_JSON, CALL_CLOSE, IM_END])
        .collect();
    let chain: Vec<(i64, i64)> = path.windows(2).map(|w| (w[0], w[1])).collect();
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = tool_tokenizer(dir.path());
    let config = ModelConfig {
        vocab_size: TOOL_VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: 32,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        max_position_embeddings: max_model_len.max(4096) as i64,
        tie_word_embeddings: false,
        eos_token_ids: vec![IM_END],
        ..ModelConfig::tiny(Family::Llama)
    };
    let decoder = Decoder::load(config, &mut ChainWeights(chain), Kind::Float, Device::Cpu).unwrap();
    let template = ChatTemplate::new(TOOL_TEMPLATE, Some("<|im_start|>"), Some("<|im_end|>")).unwrap();
    let model = EngineModel { decoder, tokenizer: Some(tokenizer.clone()), eos_token_ids: vec![IM_END] };
    let engine =
        Engine::start(model, EngineConfig { max_model_len, max_num_seqs: 4, ..EngineConfig::default() }).unwrap();
    Arc::new(RolloutModel::new(Arc::new(engine), tokenizer, Some(template)))
}

/// A sink that keeps every commit (and can be told to refuse).
#[derive(Debug, Default)]
pub struct MemorySink {
    pub commits: Mutex<Vec<Vec<Experience>>>,
    pub refuse: std::sync::atomic::AtomicBool,
}

impl ExperienceSink for MemorySink {
    fn commit(&self, experiences: Vec<Experience>) -> SinkFuture<'_> {
        Box::pin(async move {
            if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
                return Err("the buffer is closed".into());
            }
            let accepted = experiences.len();
            let mut commits = self.commits.lock().unwrap();
            commits.push(experiences);
            Ok(CommitReport { accepted, step: Some(commits.len() as u64), ..CommitReport::default() })
        })
    }
}

impl MemorySink {
    pub fn all(&self) -> Vec<Vec<Experience>> {
        self.commits.lock().unwrap().clone()
    }
}

/// A server on a free loopback port.
pub async fn start(rollout: Arc<RolloutModel>, options: ServeOptions) -> (ServerHandle, Arc<MemorySink>) {
    let sink = Arc::new(MemorySink::default());
    let options = ServeOptions { address: SocketAddr::from(([127, 0, 0, 1], 0)), ..options };
    let handle = trinity_serve::serve(options, rollout, Arc::clone(&sink) as Arc<dyn ExperienceSink>).await.unwrap();
    (handle, sink)
}

pub fn options(model: &str) -> ServeOptions {
    ServeOptions { model_name: model.into(), ..ServeOptions::default() }
}

/// One HTTP/1 request on a fresh connection; the body as bytes.
pub async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>) -> (u16, Bytes) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let mut builder = hyper::Request::builder().method(method).uri(path).header("host", addr.to_string());
    if body.is_some() {
        builder = builder.header("content-type", "application/json");
    }
    let request = builder.body(Full::new(Bytes::copy_from_slice(body.unwrap_or_default()))).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, bytes)
}

pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, bytes) = request(addr, "POST", path, Some(body.to_string().as_bytes())).await;
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes))))
}

pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, bytes) = request(addr, "GET", path, None).await;
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// A streamed request: the `data:` payloads in order (`[DONE]` included).
pub async fn post_stream(addr: SocketAddr, path: &str, body: &Value) -> (u16, Vec<String>) {
    let (status, bytes) = request(addr, "POST", path, Some(body.to_string().as_bytes())).await;
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_owned)
        .collect();
    (status, data)
}

/// The JSON chunks of a stream (everything before `[DONE]`), checking that it ends with `[DONE]`.
pub fn chunks(data: &[String]) -> Vec<Value> {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

/// The value of a Prometheus sample line `name value`.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
        .parse()
        .unwrap()
}
