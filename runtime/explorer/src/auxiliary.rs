//! Auxiliary models (`explorer.auxiliary_models`): judges and teachers beside the policy.
//!
//! Each runs on a generation engine of its own, with its own dtype and length limits, and is never trained: weight
//! sync reaches only the rollout model. Workflows find them on the rollout model
//! ([`RolloutModel::auxiliary_models`], in config order, or by name), as Trinity-RFT's workflows find theirs in
//! `self.auxiliary_models`.

use std::sync::Arc;

use tch::Tensor;
use trinity_engine::{EngineError, SamplingParams};
use trinity_model::{ChatMessage, ModelError};

use crate::rollout_model::RolloutModel;

/// Positions scored per chunk of the output head when a teacher scores a sequence (bounds the logits held at
/// once, as the trainer does).
const LOGPROB_CHUNK: i64 = 256;

/// Why an auxiliary model could not answer.
#[derive(Debug, thiserror::Error)]
pub enum AuxiliaryError {
    #[error("auxiliary model `{model}`: {source}")]
    Engine { model: String, source: EngineError },
    #[error("auxiliary model `{model}`: {source}")]
    Model { model: String, source: ModelError },
    #[error(
        "auxiliary model `{model}`: token id {token} is outside its vocabulary of {vocab}; a teacher must share the \
         policy's tokenizer"
    )]
    Vocabulary { model: String, token: u32, vocab: usize },
}

/// A judge or teacher model, reached by its name.
#[derive(Debug, Clone)]
pub struct AuxiliaryModel {
    name: String,
    model: Arc<RolloutModel>,
    /// The configured sampler seed; workflows derive each request's seed from it and the task.
    seed: u64,
}

impl AuxiliaryModel {
    pub fn new(name: impl Into<String>, model: Arc<RolloutModel>) -> Self {
        AuxiliaryModel { name: name.into(), model, seed: 42 }
    }

    /// Sets the seed requests to this model derive theirs from (`seed` of its config).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The name configs and the OpenAI-compatible API use (`name`, else `model_path`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model as a generation endpoint (chat template, tokenizer, engine).
    pub fn model(&self) -> &Arc<RolloutModel> {
        &self.model
    }

    /// The model's reply to `messages` (one sample), for judges.
    pub async fn chat(&self, messages: &[ChatMessage], params: SamplingParams) -> Result<String, AuxiliaryError> {
        let prompt = self.model.chat_prompt(messages, None).map_err(|source| self.model_error(source))?;
        let generation = self
            .model
            .generate(prompt, SamplingParams { n: 1, ..params })
            .await
            .map_err(|source| AuxiliaryError::Engine { model: self.name.clone(), source })?;
        Ok(generation.completions.into_iter().next().map(|c| c.text).unwrap_or_default())
    }

    /// The model's logprob of each of `tokens[1..]` given the tokens before it, at `temperature` (logits divided
    /// by it, as the trainer scores the policy): a teacher's view of a student's sequence. It runs on the
    /// engine's thread between two decode steps, so it needs no second copy of the weights.
    pub async fn logprobs(&self, tokens: &[u32], temperature: f64) -> Result<Vec<f32>, AuxiliaryError> {
        let vocab = self.model.engine().info().vocab_size;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(AuxiliaryError::Vocabulary { model: self.name.clone(), token, vocab });
        }
        if tokens.len() < 2 {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let scored = self
            .model
            .engine()
            .with_decoder(move |decoder| {
                tch::no_grad(|| {
                    let t = ids.len() as i64;
                    let ids = Tensor::from_slice(&ids).to_device(decoder.device()).view([1, t]);
                    let hidden = decoder.forward_hidden(&ids, None)?;
                    let logprobs = decoder.token_logprobs(
                        &hidden.narrow(1, 0, t - 1),
                        &ids.narrow(1, 1, t - 1),
                        temperature,
                        LOGPROB_CHUNK,
                    )?;
                    Vec::<f32>::try_from(logprobs.to_kind(tch::Kind::Float).view([-1]).to_device(tch::Device::Cpu))
                        .map_err(|e| ModelError::InvalidInput(format!("teacher logprobs: {e}")))
                })
            })
            .await
            .map_err(|source| AuxiliaryError::Engine { model: self.name.clone(), source })?;
        scored.map_err(|source| self.model_error(source))
    }

    fn model_error(&self, source: ModelError) -> AuxiliaryError {
        AuxiliaryError::Model { model: self.name.clone(), source }
    }
}
