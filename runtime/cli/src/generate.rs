//! `trinity generate`: completions for a file of prompts through the generation engine, one JSON line per
//! input line, in input order, with progress and a throughput summary on stderr (stdout may be the results).

use std::io::{BufRead, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};
use trinity_engine::{Engine, EngineConfig, EngineModel, SamplingParams};
use trinity_model::{DeviceRequest, hand_over_threads, load_model, parse_kind, select_device};

/// Generate completions: for each `{"prompt": str}` line (or `{"messages": [...]}` with `--chat`), write
/// `{"prompt", "completions": [{"text", "tokens", "logprobs", "finish_reason"}]}`. All prompts are submitted at
/// once and batched continuously; `logprobs` are log_softmax(logits / temperature) of the chosen tokens
/// (temperature 1 when greedy), as the trainer computes them.
#[derive(Debug, Args)]
pub(crate) struct GenerateArgs {
    /// A Hugging Face model directory or a `.gguf` file.
    #[arg(long, value_name = "PATH")]
    pub(crate) model: PathBuf,

    /// JSONL input: `{"prompt": str}` per line (tokenized with the tokenizer's special tokens, e.g. BOS), or
    /// with `--chat` `{"messages": [...]}` (rendered by the chat template with the generation prompt).
    #[arg(long, value_name = "FILE.jsonl")]
    pub(crate) input: PathBuf,

    /// Where to write the JSONL results; stdout if absent.
    #[arg(long, value_name = "FILE.jsonl")]
    pub(crate) output: Option<PathBuf>,

    /// Accept `{"messages": [...]}` lines, rendered with the model's chat template.
    #[arg(long)]
    pub(crate) chat: bool,

    /// Completions per prompt (they share the prompt's prefill).
    #[arg(long, default_value_t = 1)]
    pub(crate) n: usize,

    /// Most new tokens per completion.
    #[arg(long, default_value_t = 256)]
    pub(crate) max_tokens: usize,

    /// End-of-sequence is masked until this many tokens are generated.
    #[arg(long, default_value_t = 0)]
    pub(crate) min_tokens: usize,

    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) temperature: f32,

    /// Nucleus sampling mass (1 keeps every token).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) top_p: f32,

    /// Keep only the K most likely tokens (0 keeps all).
    #[arg(long, default_value_t = 0)]
    pub(crate) top_k: usize,

    /// Drop tokens less likely than this fraction of the most likely one (0 keeps all).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) min_p: f32,

    /// Seed: prompt `i` (0-based line of the input) samples with seed `S + i`, so a run is reproducible.
    #[arg(long, value_name = "S")]
    pub(crate) seed: Option<u64>,

    /// Stop string (repeatable): a completion ends when its text contains it; the text stops before it.
    #[arg(long, value_name = "TEXT")]
    pub(crate) stop: Vec<String>,

    /// Do not stop at end-of-sequence tokens: every completion runs to --max-tokens (for benchmarks).
    #[arg(long)]
    pub(crate) ignore_eos: bool,

    /// Sequences decoded at once (KV-cache slots); more wait for a free slot.
    #[arg(long, default_value_t = 16, value_name = "B")]
    pub(crate) batch_size: usize,

    /// Most tokens per sequence, prompt plus completion; default: longest prompt + --max-tokens, capped by
    /// the model's context length.
    #[arg(long, value_name = "N")]
    pub(crate) max_model_len: Option<usize>,

    /// KV-cache budget in MiB; fewer than --batch-size slots are used when it holds fewer.
    #[arg(long, value_name = "MIB")]
    pub(crate) kv_cache_mb: Option<u64>,

    /// libtorch threads for generation (default: libtorch's choice, one per core).
    #[arg(long)]
    pub(crate) threads: Option<usize>,

    /// Device: `auto` (CUDA when usable, else CPU), `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub(crate) device: String,

    /// Parameter dtype: `f32` / `float32` or `bf16` / `bfloat16` (the config's `rollout_model.dtype`
    /// spellings work too).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "float32", "bfloat16"])]
    pub(crate) dtype: String,
}

/// `--dtype bf16` is honoured as asked, but on a CPU without AVX512-BF16 or AMX libtorch emulates bf16 matmuls,
/// several times slower than f32 (where `trinity run` falls back to fp32 rollouts on its own, because
/// `bfloat16` is Trinity-RFT's default rather than a choice); the user should know why the run is slow.
pub(crate) fn warn_on_emulated_bf16(dtype: &str, native_bf16: bool) {
    if matches!(dtype, "bf16" | "bfloat16") && !native_bf16 {
        tracing::warn!(
            "--dtype {dtype}: this CPU has no native bf16 (AVX512-BF16 or AMX), so libtorch emulates bf16, several \
             times slower than f32; --dtype f32 is faster here"
        );
    }
}

pub(crate) fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    // The engine thread does the work with a thread pool of its own; this one must not start a second pool.
    let threads = hand_over_threads();
    let threads = args.threads.unwrap_or(threads);
    let inputs = read_inputs(&args)?;
    let kind = parse_kind(&args.dtype)?;
    let device = select_device(DeviceRequest::parse(&args.device)?)?;
    warn_on_emulated_bf16(&args.dtype, trinity_model::fast_bf16(device));
    let model = load_model(&args.model, kind, device).with_context(|| format!("loading {}", args.model.display()))?;
    let loaded = started.elapsed();

    let mut prompts = Vec::with_capacity(inputs.len());
    for (line, input) in &inputs {
        let tokens = match input.get("messages") {
            Some(Value::Array(messages)) => {
                let template = model.chat_template.as_ref().context("--chat: the model has no chat template")?;
                model.tokenizer.encode(&template.render(messages, true, None)?, false)?
            }
            _ => match input.get("prompt") {
                Some(Value::String(text)) => model.tokenizer.encode(text, true)?,
                _ => bail!("{}:{line}: expected {{\"prompt\": str}} or {{\"messages\": [...]}}", args.input.display()),
            },
        };
        prompts.push(tokens);
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let context = usize::try_from(model.decoder.config().max_position_embeddings).unwrap_or(usize::MAX);
    let max_model_len = args.max_model_len.unwrap_or_else(|| (longest + args.max_tokens).min(context.max(2)));
    let config = EngineConfig {
        max_model_len,
        max_num_seqs: args.batch_size,
        kv_cache_bytes: args.kv_cache_mb.map(|mib| mib << 20),
        num_threads: Some(threads),
        ..EngineConfig::default()
    };
    let engine = Engine::start(EngineModel::from(model), config)?;
    let info = engine.info().clone();
    tracing::info!(
        slots = info.num_slots,
        max_model_len = info.max_model_len,
        kv_cache_mib = info.kv_cache_bytes >> 20,
        device = ?info.device,
        "generation engine ready"
    );

    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let generating = Instant::now();
    let mut pending = Vec::with_capacity(prompts.len());
    for (i, tokens) in prompts.into_iter().enumerate() {
        let params = SamplingParams {
            n: args.n,
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p,
            seed: args.seed.map(|s| s.wrapping_add(i as u64)),
            max_tokens: Some(args.max_tokens),
            min_tokens: args.min_tokens,
            stop: args.stop.clone(),
            ignore_eos: args.ignore_eos,
            ..SamplingParams::default()
        };
        let line = inputs[i].0;
        pending.push(engine.submit(tokens, params).with_context(|| format!("{}:{line}", args.input.display()))?);
    }

    let out: Box<dyn Write> = match &args.output {
        Some(path) => {
            Box::new(std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = BufWriter::new(out);
    // Results on the terminal share the screen with a live progress line on stderr: each is written whole, with
    // the progress line moved out of its way.
    let on_screen = args.output.is_none() && std::io::stdout().is_terminal();
    let mut progress = crate::progress::Count::start("generate", "prompts", inputs.len());
    let mut completions = 0;
    for ((line, input), handle) in inputs.iter().zip(pending) {
        let generation = handle.wait().with_context(|| format!("{}:{line}", args.input.display()))?;
        completions += generation.completions.len();
        let prompt = input.get("messages").or_else(|| input.get("prompt")).cloned().unwrap_or(Value::Null);
        let mut write = || -> anyhow::Result<()> {
            serde_json::to_writer(&mut out, &json!({ "prompt": prompt, "completions": generation.completions }))?;
            out.write_all(b"\n")?;
            if on_screen {
                out.flush()?;
            }
            Ok(())
        };
        if on_screen { crate::progress::around_log(write) } else { write() }?;
        let rate = engine.stats().generated_tokens as f64 / generating.elapsed().as_secs_f64();
        progress.advance(1, Some((rate, "tokens/s")));
    }
    progress.finish();
    out.flush()?;
    let generation_s = generating.elapsed().as_secs_f64();

    let stats = engine.stats();
    let wall = started.elapsed().as_secs_f64();
    eprintln!(
        "generate: {} prompts ({prompt_tokens} tokens), {completions} completions, {} generated tokens",
        inputs.len(),
        stats.generated_tokens
    );
    eprintln!(
        "  prefill {:.0} tok/s ({:.2} s), decode {:.0} tok/s ({:.2} s, {} steps of up to {} sequences)",
        stats.prefill_tokens_per_second(),
        stats.prefill_time.as_secs_f64(),
        stats.decode_tokens_per_second(),
        stats.decode_time.as_secs_f64(),
        stats.decode_steps,
        info.num_slots
    );
    if stats.reused_prompt_tokens > 0 {
        eprintln!(
            "  {} prompt tokens copied from the prefix cache (earlier prompts) instead of computed",
            stats.reused_prompt_tokens
        );
    }
    eprintln!(
        "  generation {generation_s:.2} s from the first request to the last completion: {:.1} tok/s",
        stats.generated_tokens as f64 / generation_s
    );
    eprintln!(
        "  wall {wall:.2} s (model load {:.2} s): {:.1} generated tok/s overall",
        loaded.as_secs_f64(),
        stats.generated_tokens as f64 / wall
    );
    Ok(())
}

/// Non-empty input lines with their 1-based line numbers.
fn read_inputs(args: &GenerateArgs) -> anyhow::Result<Vec<(usize, Value)>> {
    let file = std::fs::File::open(&args.input).with_context(|| format!("cannot open {}", args.input.display()))?;
    let mut inputs = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", args.input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value =
            serde_json::from_str(&line).with_context(|| format!("{}:{}: not JSON", args.input.display(), n + 1))?;
        if value.get("messages").is_some() && !args.chat {
            bail!("{}:{}: a `messages` line needs --chat", args.input.display(), n + 1);
        }
        inputs.push((n + 1, value));
    }
    Ok(inputs)
}
