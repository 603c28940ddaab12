//! LoRA in a run (`model.lora_configs`): which adapters the policy trains and where they start.
//!
//! The trainer's policy carries the adapters (the base frozen, see `trinity_model`'s `lora` module); the rollout
//! engine never does: it receives the merged weights at every sync ([`crate::trainer::Trainer::weights`]) and,
//! when a run starts from an existing adapter, loads the base model with that adapter merged
//! ([`merge_start_adapter`]). A checkpoint holds the adapter in [`LORA_ADAPTER_DIR`].

use std::path::Path;

use trinity_config::Config;
use trinity_config::model::LoraConfig;
use trinity_model::{Decoder, LoraSpec, ModuleSelector};

use crate::error::RftError;
use crate::models::model_error;

/// A checkpoint's PEFT adapter directory (beside `hf/`, which holds the merged weights).
pub(crate) const LORA_ADAPTER_DIR: &str = "lora_adapter";

/// The spec of fresh adapters from the config's first (only) entry.
fn fresh_spec(lora: &LoraConfig) -> Result<LoraSpec, RftError> {
    let selector = |value, key: &str| {
        ModuleSelector::from_json(value, key).map_err(|e| model_error(Path::new("model.lora_configs"), e))
    };
    Ok(LoraSpec {
        rank: i64::from(lora.lora_rank),
        alpha: f64::from(lora.lora_alpha),
        target_modules: selector(&lora.target_modules, "model.lora_configs[0].target_modules")?,
        exclude_modules: lora
            .exclude_modules
            .as_ref()
            .map(|v| selector(v, "model.lora_configs[0].exclude_modules"))
            .transpose()?,
        dropout: 0.0,
        use_rslora: false,
    })
}

/// Attaches the run's adapters to the trainer's `policy`: those of `resumed` (a checkpoint's adapter directory)
/// when resuming, else `lora_configs[0].path`, else fresh ones seeded by `explorer.rollout_model.seed`. Returns
/// their settings, `None` when the run trains every weight.
pub(crate) fn attach(
    config: &Config,
    policy: &mut Decoder,
    resumed: Option<&Path>,
) -> Result<Option<LoraSpec>, RftError> {
    let Some(lora) = config.model.lora() else { return Ok(None) };
    let from = resumed.map(Path::to_owned).or_else(|| lora.path.as_ref().map(Into::into));
    let spec = match from {
        Some(dir) => {
            let spec = policy.load_lora(&dir).map_err(|e| model_error(&dir, e))?;
            tracing::info!(
                "LoRA: adapters from {} (rank {}, alpha {}), base weights frozen",
                dir.display(),
                spec.rank,
                spec.alpha
            );
            spec
        }
        None => {
            let spec = fresh_spec(lora)?;
            let seed = config.explorer.rollout_model.seed;
            let count =
                policy.add_lora(&spec, seed).map_err(|e| model_error(Path::new(&config.model.model_path), e))?;
            tracing::info!(
                "LoRA: fresh adapters (rank {}, alpha {}) on {count} projections, base weights frozen",
                spec.rank,
                spec.alpha
            );
            spec
        }
    };
    let trainable: i64 = policy.lora_parameters().iter().map(|(_, t)| t.numel() as i64).sum();
    let total: i64 = policy
        .named_parameters()
        .map_err(|e| model_error(Path::new("policy"), e))?
        .iter()
        .map(|(_, t)| t.numel() as i64)
        .sum();
    tracing::info!(
        "LoRA: {trainable} trainable parameters ({:.2}% of {total})",
        100.0 * trainable as f64 / total.max(1) as f64
    );
    Ok(Some(spec))
}

/// A rollout engine loading the base model of a run that starts from an existing adapter
/// (`lora_configs[0].path`) generates with that adapter merged in, as Trinity-RFT's vLLM serves it from the
/// start. Without a path the adapters start at zero and the base model is already the policy.
pub(crate) fn merge_start_adapter(config: &Config, model_path: &Path, decoder: &mut Decoder) -> Result<(), RftError> {
    let Some(path) = config.model.lora().and_then(|l| l.path.as_ref()) else { return Ok(()) };
    if model_path != Path::new(&config.model.model_path) {
        return Ok(());
    }
    let dir = Path::new(path);
    decoder.load_lora(dir).map_err(|e| model_error(dir, e))?;
    decoder.merge_lora().map_err(|e| model_error(dir, e))?;
    tracing::info!("rollout model: {} with the adapter in {} merged", model_path.display(), dir.display());
    Ok(())
}
