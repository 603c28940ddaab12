//! `trinity convert`: a GGUF file into a Hugging Face model directory that transformers loads.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Convert a GGUF model (F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K) into an HF directory with f32 safetensors
/// weights, config.json, generation_config.json, tokenizer.json and tokenizer_config.json (with the chat template).
#[derive(Debug, Args)]
pub(crate) struct ConvertArgs {
    /// The GGUF file to convert.
    #[arg(long, value_name = "FILE")]
    pub(crate) gguf: PathBuf,

    /// The directory to write (created if needed).
    #[arg(long, value_name = "DIR")]
    pub(crate) output: PathBuf,
}

pub(crate) fn run(args: ConvertArgs) -> anyhow::Result<()> {
    // Shown on stderr: stdout says what was written.
    let mut progress = crate::progress::Phases::start("convert");
    progress.begin(format!("{} to {}", args.gguf.display(), args.output.display()));
    trinity_model::convert_gguf_to_hf(&args.gguf, &args.output)
        .with_context(|| format!("converting {} to {}", args.gguf.display(), args.output.display()))?;
    progress.finish();
    println!("wrote {}", args.output.display());
    Ok(())
}
