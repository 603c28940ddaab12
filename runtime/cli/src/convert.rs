//! `trinity convert`: a GGUF file, or a base model with a LoRA adapter merged in, into a Hugging Face model
//! directory that transformers loads.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Convert a GGUF model (F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K) into an HF directory with f32 safetensors
/// weights, config.json, generation_config.json, tokenizer.json and tokenizer_config.json (with the chat template);
/// or, with `--adapter`, merge a PEFT LoRA adapter (a LoRA run's `global_step_N/lora_adapter`) into its base model.
#[derive(Debug, Args)]
pub(crate) struct ConvertArgs {
    /// The GGUF file to convert.
    #[arg(long, value_name = "FILE", required_unless_present = "adapter", conflicts_with = "adapter")]
    pub(crate) gguf: Option<PathBuf>,

    /// A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) to merge into its base model.
    #[arg(long, value_name = "DIR")]
    pub(crate) adapter: Option<PathBuf>,

    /// The base model the adapter was trained on (HF directory or GGUF file); default: the adapter's
    /// `base_model_name_or_path`.
    #[arg(long, value_name = "MODEL", requires = "adapter")]
    pub(crate) base: Option<PathBuf>,

    /// The directory to write (created if needed).
    #[arg(long, value_name = "DIR")]
    pub(crate) output: PathBuf,
}

pub(crate) fn run(args: ConvertArgs) -> anyhow::Result<()> {
    // Shown on stderr: stdout says what was written.
    let mut progress = crate::progress::Phases::start("convert");
    match (&args.gguf, &args.adapter) {
        (Some(gguf), _) => {
            progress.begin(format!("{} to {}", gguf.display(), args.output.display()));
            trinity_model::convert_gguf_to_hf(gguf, &args.output)
                .with_context(|| format!("converting {} to {}", gguf.display(), args.output.display()))?;
        }
        (None, Some(adapter)) => {
            let base = match &args.base {
                Some(base) => base.clone(),
                None => trinity_model::adapter_base_model(adapter)?.with_context(|| {
                    format!("{} names no base model (base_model_name_or_path): pass --base", adapter.display())
                })?,
            };
            progress.begin(format!(
                "{} merged into {} to {}",
                adapter.display(),
                base.display(),
                args.output.display()
            ));
            trinity_model::merge_adapter_to_hf(&base, adapter, &args.output).with_context(|| {
                format!("merging {} into {} as {}", adapter.display(), base.display(), args.output.display())
            })?;
        }
        (None, None) => anyhow::bail!("give --gguf FILE or --adapter DIR"),
    }
    progress.finish();
    println!("wrote {}", args.output.display());
    Ok(())
}
