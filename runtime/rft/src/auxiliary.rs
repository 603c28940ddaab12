//! `explorer.auxiliary_models`: the judges and teachers workflows call, each loaded on a generation engine of its
//! own (its own dtype, length limits and chat template) beside the rollout engine, and never trained.

use std::path::Path;
use std::sync::Arc;

use trinity_config::Config;
use trinity_config::explorer::AuxiliaryModelConfig;
use trinity_engine::EngineConfig;
use trinity_explorer::{AuxiliaryModel, RolloutModel};
use trinity_model::ChatTemplate;

use crate::error::RftError;
use crate::models::{self, model_error};

/// Loads every auxiliary model of `config`, in config order.
pub(crate) fn load_all(config: &Config, device: tch::Device, threads: usize) -> Result<Vec<AuxiliaryModel>, RftError> {
    config.explorer.auxiliary_models.iter().map(|aux| load(config, aux, device, threads)).collect()
}

fn load(
    config: &Config,
    aux: &AuxiliaryModelConfig,
    device: tch::Device,
    threads: usize,
) -> Result<AuxiliaryModel, RftError> {
    let path = Path::new(&aux.model_path);
    let kind = models::engine_kind(&aux.dtype, device);
    let mut loaded = models::load(path, kind, device, threads)?;
    let template = match &aux.chat_template {
        Some(source) => {
            let (bos, eos) = (loaded.tokenizer.bos_token(), loaded.tokenizer.eos_token());
            Some(ChatTemplate::new(source, bos, eos).map_err(|e| model_error(path, e))?)
        }
        None => loaded.chat_template.take(),
    };
    loaded.chat_template = template.map(|t| t.with_enable_thinking(aux.enable_thinking));
    let engine_config = EngineConfig {
        max_model_len: aux.resolved.max_model_len as usize,
        // Each running workflow asks its judge or teacher one request at a time.
        max_num_seqs: (config.explorer.runner_per_model as usize).clamp(1, 256),
        max_prompt_tokens: Some(aux.resolved.max_prompt_tokens as usize),
        max_response_tokens: Some(aux.resolved.max_response_tokens as usize),
        kv_cache_bytes: models::cpu_kv_budget(device),
        num_threads: Some(threads),
        ..EngineConfig::default()
    };
    let model = Arc::new(RolloutModel::start(loaded, engine_config)?);
    tracing::info!("auxiliary model `{}` ({}) on an engine of its own", aux.name(), aux.model_path);
    Ok(AuxiliaryModel::new(aux.name(), model).with_seed(aux.seed))
}
