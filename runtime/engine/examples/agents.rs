//! Concurrent multi-turn agents against one engine: how much of each turn's prompt the engine computes again.
//!
//! Each agent holds a chat (a shared system prompt, its own task, then its answers and a new user message per
//! turn), renders it with the model's chat template and sends it as one request, waiting for the answer before
//! its next turn: what agent workflows and `trinity serve` clients do. All agents run at once, so their turns
//! interleave in the engine. Prints wall time, prefill and decode figures and the prompt tokens copied from
//! the prefix cache.
//!
//! ```text
//! cargo run --release -p trinity-engine --example agents -- [MODEL] [AGENTS] [TURNS] [MAX_TOKENS]
//! ```
//! MODEL defaults to `TRINITY_SMOLLM2_GGUF`; 8 agents, 6 turns, 32 new tokens a turn; greedy decoding, fp32 on
//! the CPU, 2 rounds after a warm-up request.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use tch::{Device, Kind};
use trinity_engine::{Engine, EngineConfig, EngineModel, SamplingParams};
use trinity_model::{ChatTemplate, Tokenizer};

const SYSTEM: &str = "You are a careful assistant that solves arithmetic step by step. Keep every answer short, \
                      show the intermediate results, and finish with the final number on its own line.";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model_path = args
        .first()
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("TRINITY_SMOLLM2_GGUF").map(PathBuf::from))
        .ok_or_else(|| anyhow::anyhow!("give a model path or set TRINITY_SMOLLM2_GGUF"))?;
    let number = |i: usize, default: usize| args.get(i).map_or(Ok(default), |a| a.parse::<usize>());
    let (agents, turns, max_tokens) = (number(1, 8)?, number(2, 6)?, number(3, 32)?);

    let mut loaded = trinity_model::load_model(&model_path, Kind::Float, Device::Cpu)?;
    let template = loaded.chat_template.take().ok_or_else(|| anyhow::anyhow!("the model has no chat template"))?;
    let template = Arc::new(template);
    let tokenizer = loaded.tokenizer.clone();
    let config = EngineConfig { max_model_len: 2048, max_num_seqs: 64, ..Default::default() };
    let engine = Arc::new(Engine::start(EngineModel::from(loaded), config)?);
    let params = SamplingParams { temperature: 0.0, max_tokens: Some(max_tokens), ..Default::default() };

    let warm = tokenizer.encode("Warm-up: 1 + 1 =", false)?;
    engine.submit(warm, params.clone())?.wait()?;
    println!("{agents} agents × {turns} turns, up to {max_tokens} new tokens a turn, greedy, fp32");
    for round in 1..=2 {
        let before = engine.stats();
        let started = Instant::now();
        let threads: Vec<_> = (0..agents)
            .map(|agent| {
                let (engine, template, tokenizer, params) =
                    (Arc::clone(&engine), Arc::clone(&template), tokenizer.clone(), params.clone());
                std::thread::spawn(move || {
                    converse(&engine, &template, &tokenizer, &params, round * agents + agent, turns)
                })
            })
            .collect();
        let mut generated = 0;
        for thread in threads {
            generated += thread.join().map_err(|_| anyhow::anyhow!("an agent panicked"))??;
        }
        let wall = started.elapsed().as_secs_f64();
        let s = engine.stats();
        let prefill = s.prefill_tokens - before.prefill_tokens;
        let reused = s.reused_prompt_tokens - before.reused_prompt_tokens;
        println!(
            "round {round}: wall {wall:.2} s | prompt tokens {prefill}, copied from the prefix cache {reused} \
             ({:.0}%) | prefill {:.2} s | decode {:.2} s | {generated} tokens generated",
            100.0 * reused as f64 / prefill.max(1) as f64,
            (s.prefill_time - before.prefill_time).as_secs_f64(),
            (s.decode_time - before.decode_time).as_secs_f64(),
        );
    }
    Ok(())
}

/// One conversation (agent `agent`'s own numbers, so no two share more than the system prompt); returns the
/// tokens it generated.
fn converse(
    engine: &Engine,
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    params: &SamplingParams,
    agent: usize,
    turns: usize,
) -> anyhow::Result<usize> {
    let (a, b) = (17 + 13 * agent, 29 + 7 * agent);
    let mut messages: Vec<Value> = vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": format!("Agent {agent}: start from {a} and add {b}. What do you get?")}),
    ];
    let mut generated = 0;
    for turn in 1..=turns {
        let text = template.render(&messages, true, None)?;
        let prompt = tokenizer.encode(&text, false)?;
        let answer = engine.submit(prompt, params.clone())?.wait()?;
        let completion = &answer.completions[0];
        generated += completion.tokens.len();
        messages.push(json!({"role": "assistant", "content": completion.text}));
        messages.push(json!({"role": "user", "content": format!("Now add {} to that (step {turn}).", 3 + turn)}));
    }
    Ok(generated)
}
