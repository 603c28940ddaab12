//! `trinity score`: per-token logprobs of responses under a model, one JSON line per input line, with progress on
//! stderr (stdout may be the results).

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use trinity_model::{DeviceRequest, ScoreRequest, load_model, parse_kind, score, select_device};

/// Score responses: for each `{"prompt", "response"}` line (or `{"messages"}` with `--chat`), print the prompt and
/// response token ids and log p(response token | all earlier tokens).
#[derive(Debug, Args)]
pub(crate) struct ScoreArgs {
    /// A Hugging Face model directory or a `.gguf` file.
    #[arg(long, value_name = "PATH")]
    pub(crate) model: PathBuf,

    /// JSONL input: `{"prompt": str, "response": str}` per line; with `--chat` also `{"messages": [...]}`,
    /// where the last message's content is the response and the chat template renders the others.
    #[arg(long, value_name = "FILE.jsonl")]
    pub(crate) input: PathBuf,

    /// Where to write the JSONL results (`{"prompt_tokens", "response_tokens", "logprobs"}`); stdout if absent.
    #[arg(long, value_name = "FILE.jsonl")]
    pub(crate) output: Option<PathBuf>,

    /// Accept `{"messages": [...]}` lines, rendered with the model's chat template.
    #[arg(long)]
    pub(crate) chat: bool,

    /// Device: `auto` (CUDA when usable, else CPU), `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub(crate) device: String,

    /// Parameter dtype for the forward pass: `f32` / `float32` or `bf16` / `bfloat16` (the config's `rollout_model.dtype`
    /// spellings work too).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "float32", "bfloat16"])]
    pub(crate) dtype: String,
}

pub(crate) fn run(args: ScoreArgs) -> anyhow::Result<()> {
    let kind = parse_kind(&args.dtype)?;
    let file = std::fs::File::open(&args.input).with_context(|| format!("cannot open {}", args.input.display()))?;
    let mut requests = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", args.input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let request: ScoreRequest = serde_json::from_str(&line).with_context(|| {
            format!("{}:{}: expected {{\"prompt\", \"response\"}} or {{\"messages\"}}", args.input.display(), n + 1)
        })?;
        if matches!(request, ScoreRequest::Chat { .. }) && !args.chat {
            bail!("{}:{}: a `messages` line needs --chat", args.input.display(), n + 1);
        }
        requests.push(request);
    }
    let device = select_device(DeviceRequest::parse(&args.device)?)?;
    tracing::info!("scoring on {device:?}");
    crate::generate::warn_on_emulated_bf16(&args.dtype, trinity_model::fast_bf16(device));
    let model = load_model(&args.model, kind, device).with_context(|| format!("loading {}", args.model.display()))?;
    // Scored a slice at a time, so the progress display moves; each slice is still sorted by length and batched
    // by `score` itself, and a slice of a twentieth of the file (at least 64 rows) keeps those batches full.
    let slice = requests.len().div_ceil(20).max(64);
    let mut progress = crate::progress::Count::start("score", "rows", requests.len());
    let started = std::time::Instant::now();
    let (mut scored, mut tokens) = (Vec::with_capacity(requests.len()), 0);
    for chunk in requests.chunks(slice) {
        let done = score(&model, chunk)?;
        tokens += done.iter().map(|s| s.prompt_tokens.len() + s.response_tokens.len()).sum::<usize>();
        progress.advance(chunk.len(), Some((tokens as f64 / started.elapsed().as_secs_f64(), "tokens/s")));
        scored.extend(done);
    }
    progress.finish();
    let out: Box<dyn Write> = match &args.output {
        Some(path) => {
            Box::new(std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = BufWriter::new(out);
    for s in &scored {
        serde_json::to_writer(&mut out, s)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
