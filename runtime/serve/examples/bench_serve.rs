//! Serve-mode throughput: 16 concurrent streaming HTTP clients against `trinity generate`'s engine path, on
//! the same model, prompts and lengths, in one process and on one engine, rounds interleaved so that machine
//! load hits both alike.
//!
//! ```text
//! cargo run --release -p trinity-serve --example bench_serve -- [--model PATH.gguf] [--max-tokens 128]
//!     [--rounds 3] [--threads N] [--runtime-threads 1]
//! ```
//!
//! Paths measured each round (greedy, forced length: every request generates exactly `--max-tokens`):
//! - `generate`: what `trinity generate` does: every prompt submitted at once (`Engine::submit`), tokens / the
//!   time from the first submission to the last completion. Results arrive whole, so it has no time to first
//!   token.
//! - `engine stream`: the same with `Engine::submit_stream` and no HTTP: the engine's own time to first token.
//! - `serve`: the server on a loopback port, one client task per prompt, each a `stream: true` chat completion
//!   over its own connection; tokens counted from the streamed `token_ids`; time to first token measured by
//!   the client, from sending its request to the first chunk carrying a token.
//!
//! Clients, server and engine share the machine's cores, as they would with a local agent.

// The trinity binary's allocator, so that the figures are the binary's.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[path = "../../cli/src/allocator.rs"]
mod allocator;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use trinity_buffer::Experience;
use trinity_engine::{Engine, EngineConfig, EngineModel, GenerationEvent, SamplingParams};
use trinity_explorer::RolloutModel;
use trinity_serve::{CommitReport, ExperienceSink, ServeOptions, SinkFuture};

struct Args {
    model: PathBuf,
    max_tokens: usize,
    rounds: usize,
    threads: Option<usize>,
    runtime_threads: usize,
}

fn args() -> Args {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut args = Args {
        model: root.join(".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        max_tokens: 128,
        rounds: 3,
        threads: None,
        runtime_threads: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => args.model = value.into(),
            "--max-tokens" => args.max_tokens = value.parse().expect("--max-tokens N"),
            "--rounds" => args.rounds = value.parse().expect("--rounds N"),
            "--threads" => args.threads = Some(value.parse().expect("--threads N")),
            "--runtime-threads" => args.runtime_threads = value.parse().expect("--runtime-threads N"),
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// Discards commits (the benchmark never commits; the server needs a sink).
struct Discard;

impl ExperienceSink for Discard {
    fn commit(&self, experiences: Vec<Experience>) -> SinkFuture<'_> {
        Box::pin(async move { Ok(CommitReport { accepted: experiences.len(), ..CommitReport::default() }) })
    }
}

/// One path's figures for one round.
struct Figures {
    tokens: usize,
    seconds: f64,
    first_tokens: Vec<f64>,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.tokens as f64 / self.seconds
    }

    fn ttft(&self) -> String {
        if self.first_tokens.is_empty() {
            return "-".into();
        }
        let mut t = self.first_tokens.clone();
        t.sort_by(f64::total_cmp);
        format!("{:.3} / {:.3}", t[t.len() / 2], t[t.len() - 1])
    }
}

fn params(max_tokens: usize) -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) }
}

async fn generate(engine: &Engine, prompts: &[Vec<u32>], max_tokens: usize) -> Figures {
    let start = Instant::now();
    let pending: Vec<_> = prompts.iter().map(|p| engine.submit(p.clone(), params(max_tokens)).unwrap()).collect();
    let mut tokens = 0;
    for p in pending {
        tokens += p.await.unwrap().completions[0].tokens.len();
    }
    Figures { tokens, seconds: start.elapsed().as_secs_f64(), first_tokens: Vec::new() }
}

async fn engine_stream(engine: &Engine, prompts: &[Vec<u32>], max_tokens: usize) -> Figures {
    let start = Instant::now();
    let streams: Vec<_> =
        prompts.iter().map(|p| engine.submit_stream(p.clone(), params(max_tokens)).unwrap()).collect();
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let (mut tokens, mut first) = (0, None);
                while let Some(event) = stream.next().await {
                    if let GenerationEvent::Token(_) = event.unwrap() {
                        first.get_or_insert_with(|| start.elapsed().as_secs_f64());
                        tokens += 1;
                    }
                }
                (tokens, first.unwrap_or_default())
            })
        })
        .collect();
    let mut figures = Figures { tokens: 0, seconds: 0.0, first_tokens: Vec::new() };
    for task in tasks {
        let (tokens, first) = task.await.unwrap();
        figures.tokens += tokens;
        figures.first_tokens.push(first);
    }
    figures.seconds = start.elapsed().as_secs_f64();
    figures
}

/// One streaming client: returns (tokens, seconds to the first token).
async fn client(addr: SocketAddr, messages: Value, max_tokens: usize) -> (usize, f64) {
    let body = json!({
        "messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
        "stream": true, "return_token_ids": true,
    });
    let start = Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::post("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let mut body = sender.send_request(request).await.unwrap().into_body();
    let (mut tokens, mut first, mut pending) = (0, None, String::new());
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.unwrap().into_data() else { continue };
        pending.push_str(std::str::from_utf8(&data).unwrap());
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(payload) = event.trim().strip_prefix("data: ") else { continue };
            if payload == "[DONE]" {
                continue;
            }
            let chunk: Value = serde_json::from_str(payload).unwrap();
            let n = chunk["choices"][0]["token_ids"].as_array().map_or(0, Vec::len);
            if n > 0 {
                first.get_or_insert_with(|| start.elapsed().as_secs_f64());
                tokens += n;
            }
        }
    }
    (tokens, first.unwrap_or_default())
}

async fn serve(addr: SocketAddr, conversations: &[Value], max_tokens: usize) -> Figures {
    let start = Instant::now();
    let tasks: Vec<_> = conversations.iter().map(|m| tokio::spawn(client(addr, m.clone(), max_tokens))).collect();
    let mut figures = Figures { tokens: 0, seconds: 0.0, first_tokens: Vec::new() };
    for task in tasks {
        let (tokens, first) = task.await.unwrap();
        figures.tokens += tokens;
        figures.first_tokens.push(first);
    }
    figures.seconds = start.elapsed().as_secs_f64();
    figures
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map_or_else(|_| "?".into(), |l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
}

fn main() {
    // As the `trinity` binary does: leave the libtorch pool to the engine thread.
    let threads = trinity_model::hand_over_threads();
    let args = args();
    let threads = args.threads.unwrap_or(threads);
    let prompts_file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/bench/prompts.jsonl");
    let conversations: Vec<Value> = std::fs::read_to_string(&prompts_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["messages"].clone())
        .collect();
    let model = trinity_model::load_model(&args.model, tch::Kind::Float, tch::Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask setup` for SmolLM2)", args.model.display()));
    let template = model.chat_template.as_ref().expect("the model has a chat template");
    let prompts: Vec<Vec<u32>> = conversations
        .iter()
        .map(|m| model.tokenizer.encode(&template.render(m.as_array().unwrap(), true, None).unwrap(), false).unwrap())
        .collect();
    // `trinity generate`'s engine settings: one slot per prompt, room for the longest prompt and the response.
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let config = EngineConfig {
        max_model_len: longest + args.max_tokens,
        max_num_seqs: prompts.len(),
        num_threads: Some(threads),
        ..EngineConfig::default()
    };
    let tokenizer = model.tokenizer.clone();
    let chat_template = model.chat_template;
    let engine =
        EngineModel { decoder: model.decoder, tokenizer: Some(model.tokenizer), eos_token_ids: model.eos_token_ids };
    let engine = Arc::new(Engine::start(engine, config).unwrap());
    let rollout = Arc::new(RolloutModel::new(Arc::clone(&engine), tokenizer, chat_template));

    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.runtime_threads).enable_all().build().unwrap();
    runtime.block_on(async {
        let options = ServeOptions {
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            model_name: "smollm2".into(),
            ..ServeOptions::default()
        };
        let server = trinity_serve::serve(options, Arc::clone(&rollout), Arc::new(Discard)).await.unwrap();
        let addr = server.local_addr();
        println!(
            "serve bench: {}, {} prompts x {} tokens (greedy, forced length), f32, {threads} engine threads, {} runtime threads",
            args.model.file_name().unwrap_or_default().to_string_lossy(),
            prompts.len(),
            args.max_tokens,
            args.runtime_threads,
        );
        // Warm-up: the first passes pay page faults and kernel packing.
        let _ = generate(&engine, &prompts, 8).await;
        let _ = serve(addr, &conversations, 8).await;
        println!("{:<6} {:<28} {:>7} {:>8} {:>9} {:>20}  load avg", "round", "path", "tokens", "seconds", "tokens/s", "TTFT s (median / max)");
        let mut rates: [Vec<f64>; 3] = Default::default();
        let mut ttfts: [Vec<f64>; 2] = Default::default();
        for round in 1..=args.rounds {
            // The paths take turns going first, so a load that rises or falls during a round hits each alike.
            for turn in 0..3 {
                let path = (turn + round - 1) % 3;
                let (name, f) = match path {
                    0 => ("generate (Engine::submit)", generate(&engine, &prompts, args.max_tokens).await),
                    1 => ("engine stream (no HTTP)", engine_stream(&engine, &prompts, args.max_tokens).await),
                    _ => ("serve: 16 streaming clients", serve(addr, &conversations, args.max_tokens).await),
                };
                let (rate, ttft, load) = (f.rate(), f.ttft(), load_average());
                println!("{round:<6} {name:<28} {:>7} {:>8.2} {rate:>9.1} {ttft:>20}  {load}", f.tokens, f.seconds);
                rates[path].push(rate);
                if path > 0 {
                    let mut t = f.first_tokens.clone();
                    t.sort_by(f64::total_cmp);
                    ttfts[path - 1].push(t[t.len() / 2]);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            let mid = v.len() / 2;
            if v.len().is_multiple_of(2) { (v[mid - 1] + v[mid]) / 2.0 } else { v[mid] }
        };
        let (generate, stream, serve) = (median(&rates[0]), median(&rates[1]), median(&rates[2]));
        println!(
            "median tokens/s: generate {generate:.1}, engine stream {stream:.1}, serve {serve:.1} ({:.2}x generate); median TTFT: engine stream {:.3} s, serve {:.3} s",
            serve / generate,
            median(&ttfts[0]),
            median(&ttfts[1]),
        );
        server.shutdown().await.unwrap();
    });
}
