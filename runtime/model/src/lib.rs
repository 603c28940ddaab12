//! Model layer: decoder-only transformers (Llama, Qwen2/2.5, Qwen3) on libtorch, loaded from Hugging Face
//! directories or GGUF files, with their tokenizer and chat template, saved back as Hugging Face directories.
//!
//! Entry points:
//! - [`load_model`]: an HF directory or a `.gguf` file → [`LoadedModel`] (decoder + tokenizer + chat template).
//! - [`Decoder`]: the network. Training uses [`Decoder::forward_hidden`] + [`Decoder::token_logprobs`];
//!   generation uses [`Decoder::forward_with_cache`] with a [`KvCache`].
//! - [`score`]: per-token logprobs of responses given prompts.
//! - [`save_hf_dir`] and [`convert_gguf_to_hf`]: write a directory that transformers loads.
//! - LoRA ([`LoraSpec`], `lora` module): adapters on the projections, trained while the base stays frozen,
//!   merged for generation, saved and loaded as PEFT adapter directories.
//!
//! Training (gradients flow into the `VarStore` variables):
//! ```text
//! let m = load_model(path, Kind::BFloat16, Device::Cpu)?;
//! let hidden = m.decoder.forward_hidden(&ids /*[B,T]*/, Some(&mask /*[B,T]*/))?;
//! let lp = m.decoder.token_logprobs(&hidden.narrow(1, 0, t - 1), &ids.narrow(1, 1, t - 1), temperature, 256)?;
//! // loss from lp (masked to response tokens) -> backward -> nn::AdamW over m.decoder.var_store()
//! ```
//! Generation (no gradients; slots are sequences, each at its own position):
//! ```text
//! let mut cache = m.decoder.new_cache(num_slots, max_model_len)?;
//! let h = m.decoder.forward_with_cache(&prompts /*[B,Tmax] right-padded*/, &mut cache, &slots, &prompt_lens)?;
//! let logits = m.decoder.logits(&m.decoder.last_hidden(&h, &prompt_lens)?)?; // [B, vocab] -> sample
//! cache.copy_slot(slot, other_slot)?; // n samples share one prefill
//! let h = m.decoder.forward_with_cache(&next /*[B,1]*/, &mut cache, &slots, &[1; B])?; // one decode step
//! cache.reset(slot)?; // request finished
//! ```
//! Weight sync into a generation copy: `gen.decoder.copy_weights_from(&trainer.decoder)` (in place, no_grad).

mod attention;
mod chat_template;
mod checkpoint;
mod config;
mod decode_step;
mod decoder;
mod dequant;
mod device;
mod direct_file;
mod error;
mod gguf;
mod gguf_weights;
mod grad;
mod hf;
mod kv_cache;
pub mod layer_hook;
mod lora;
mod moe;
mod packed;
mod rope;
mod safetensors_io;
mod score;
mod tiny;
mod tokenizer;
mod train_ops;
pub mod vision;
pub mod vocab_softmax;
mod weight_arena;
mod weights;

pub use chat_template::{ChatMessage, ChatTemplate, civil_from_days};
pub use config::{Family, ModelConfig, MoeConfig, RopeScaling};
pub use decoder::{Decoder, RoutedHidden};
pub use dequant::GgmlType;
pub use device::{DeviceRequest, cuda_devices, fast_bf16, hand_over_threads, select_device};
pub use error::{ModelError, Result};
pub use gguf::{GgufFile, GgufTensorInfo, GgufValue};
pub use gguf_weights::GgufWeights;
pub use grad::{accumulate_grad, backward_with, release_grad};
pub use hf::{
    LoadedModel, adapter_base_model, convert_gguf_to_hf, load_model, merge_adapter_to_hf, save_hf_dir, save_hf_parts,
};
pub use kv_cache::KvCache;
pub use lora::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraSpec, ModuleSelector};
pub use moe::{RoutedExperts, load_balancing_loss};
pub use packed::Isa as PackedIsa;
pub use safetensors_io::{SafetensorsWeights, SafetensorsWriter, TensorSpec, write_safetensors};
pub use score::{ScoreRequest, ScoredSequence, score};
pub use tokenizer::Tokenizer;
pub use weights::{ParamSpec, RandomWeights, WeightSource, param_specs};

/// Whether this build can recompute layer activations in the backward ([`Decoder::set_recompute_activations`]):
/// it needs libtorch's headers at build time.
pub fn activation_recompute_available() -> bool {
    checkpoint::AVAILABLE
}

/// Parses a dtype name as configs and the CLI spell it (`f32`, `float32`, `bf16`, `bfloat16`, `f16`, `float16`).
pub fn parse_kind(name: &str) -> Result<tch::Kind> {
    match name {
        "f32" | "float32" | "float" => Ok(tch::Kind::Float),
        "bf16" | "bfloat16" => Ok(tch::Kind::BFloat16),
        "f16" | "float16" | "half" => Ok(tch::Kind::Half),
        other => Err(ModelError::InvalidInput(format!("unknown dtype `{other}` (f32, bf16, f16)"))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn libtorch_links() {
        let t = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
        assert_eq!(f64::try_from(t.sum(tch::Kind::Float)).unwrap(), 6.0);
    }
}
