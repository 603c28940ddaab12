//! The frozen reference model: the policy as it was at the start of training, for KL terms.
//!
//! Its variables are frozen (no gradients are ever recorded) and it only runs under `no_grad`. It may be kept
//! in a smaller dtype than the policy (bf16) to save memory; logprobs are computed in fp32 from its logits
//! with the same temperature as the policy's.

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};
use trinity_model::{Decoder, ModelError, WeightSource};

use crate::batch::{PaddedInputs, TrainRow};
use crate::error::Result;
use crate::logprobs;

/// A frozen decoder that scores responses.
#[derive(Debug)]
pub struct ReferenceModel {
    decoder: Decoder,
}

/// Hands out copies of another model's parameters.
struct CopyOf(HashMap<String, Tensor>);

impl WeightSource for CopyOf {
    fn load(&mut self, name: &str, _shape: &[i64]) -> trinity_model::Result<Tensor> {
        let t = self.0.get(name).ok_or_else(|| ModelError::MissingTensor { tensor: name.to_owned() })?;
        // A real copy: the decoder would otherwise adopt the policy's storage as its own variable.
        Ok(tch::no_grad(|| t.f_to_device(Device::Cpu).and_then(|t| t.f_detach_copy()))?)
    }
}

/// An independent (trainable) copy of `model` in dtype `kind` on the same device.
pub(crate) fn copy_decoder(model: &Decoder, kind: Kind) -> Result<Decoder> {
    let mut source = CopyOf(model.named_parameters()?.into_iter().collect());
    Ok(Decoder::load(model.config().clone(), &mut source, kind, model.device())?)
}

impl ReferenceModel {
    /// Freezes `decoder` (loaded from the reference checkpoint) as the reference.
    pub fn new(mut decoder: Decoder) -> Self {
        decoder.var_store_mut().freeze();
        ReferenceModel { decoder }
    }

    /// A frozen copy of `policy`'s current weights, stored in `kind`.
    pub fn from_policy(policy: &Decoder, kind: Kind) -> Result<Self> {
        Ok(Self::new(copy_decoder(policy, kind)?))
    }

    /// The frozen decoder.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Logprobs of the response tokens of `rows[micro]`, `[b, R]` f32 on the CPU (R = longest response there).
    pub fn logprobs(&self, rows: &[TrainRow], micro: &[usize], temperature: f64, chunk_tokens: i64) -> Result<Tensor> {
        response_logprobs(&self.decoder, rows, micro, temperature, chunk_tokens, false)
    }
}

/// Logprobs of the response tokens of `rows[micro]` under `decoder`, without gradients: `[b, R]` f32 on the CPU
/// (R = longest response there). The reference model's scores, and the policy's when old logprobs are recomputed
/// (`replay`: with the rows' routed experts, [`crate::router_replay`]).
pub(crate) fn response_logprobs(
    decoder: &Decoder,
    rows: &[TrainRow],
    micro: &[usize],
    temperature: f64,
    chunk_tokens: i64,
    replay: bool,
) -> Result<Tensor> {
    let inputs = PaddedInputs::with_replay(rows, micro, decoder.device(), replay)?;
    tch::no_grad(|| {
        let hidden = inputs.hidden(decoder)?;
        let stats = logprobs::score(decoder, &hidden, &inputs.targets, temperature, chunk_tokens, false)?;
        Ok(stats.logprob.f_to_device(Device::Cpu)?)
    })
}
