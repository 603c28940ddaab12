//! Where a decoder's parameters come from: the list of parameters an architecture has (with Hugging Face names
//! and shapes) and the sources that can fill them (safetensors, GGUF, random init).
//!
//! A source returns each tensor on the CPU in whatever float dtype it stores; the decoder converts it to the
//! requested dtype and device once, and that converted tensor *is* the trainable variable (no second copy).

use tch::{Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// One parameter: its Hugging Face name and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// PyTorch shape.
    pub shape: Vec<i64>,
}

/// The parameters of a model built from `config`, in a stable order (embedding, layers, norm, head).
/// `lm_head.weight` is listed only when the embeddings are untied.
pub fn param_specs(config: &ModelConfig) -> Vec<ParamSpec> {
    let h = config.hidden_size;
    let q_out = config.num_attention_heads * config.head_dim;
    let kv_out = config.num_key_value_heads * config.head_dim;
    let ffn = config.intermediate_size;
    let mut specs = vec![ParamSpec { name: "model.embed_tokens.weight".into(), shape: vec![config.vocab_size, h] }];
    let mut add = |name: String, shape: Vec<i64>| specs.push(ParamSpec { name, shape });
    for i in 0..config.num_hidden_layers {
        let p = format!("model.layers.{i}");
        add(format!("{p}.input_layernorm.weight"), vec![h]);
        for (proj, out, bias) in [
            ("q_proj", q_out, config.qkv_bias),
            ("k_proj", kv_out, config.qkv_bias),
            ("v_proj", kv_out, config.qkv_bias),
        ] {
            add(format!("{p}.self_attn.{proj}.weight"), vec![out, h]);
            if bias {
                add(format!("{p}.self_attn.{proj}.bias"), vec![out]);
            }
        }
        add(format!("{p}.self_attn.o_proj.weight"), vec![h, q_out]);
        if config.o_bias {
            add(format!("{p}.self_attn.o_proj.bias"), vec![h]);
        }
        if config.qk_norm {
            add(format!("{p}.self_attn.q_norm.weight"), vec![config.head_dim]);
            add(format!("{p}.self_attn.k_norm.weight"), vec![config.head_dim]);
        }
        add(format!("{p}.post_attention_layernorm.weight"), vec![h]);
        if let Some(moe) = config.moe.as_ref().filter(|m| m.is_sparse(i)) {
            // The router, then each expert's SwiGLU under the names Hugging Face checkpoints use.
            let inter = moe.moe_intermediate_size;
            add(format!("{p}.mlp.gate.weight"), vec![moe.num_experts, h]);
            for e in 0..moe.num_experts {
                for (proj, shape) in
                    [("gate_proj", vec![inter, h]), ("up_proj", vec![inter, h]), ("down_proj", vec![h, inter])]
                {
                    add(format!("{p}.mlp.experts.{e}.{proj}.weight"), shape);
                }
            }
            continue;
        }
        for (proj, shape) in [("gate_proj", vec![ffn, h]), ("up_proj", vec![ffn, h]), ("down_proj", vec![h, ffn])] {
            let out = shape[0];
            add(format!("{p}.mlp.{proj}.weight"), shape);
            if config.mlp_bias {
                add(format!("{p}.mlp.{proj}.bias"), vec![out]);
            }
        }
    }
    add("model.norm.weight".into(), vec![h]);
    if !config.tie_word_embeddings {
        add("lm_head.weight".into(), vec![config.vocab_size, h]);
    }
    specs
}

/// Something that can produce parameter tensors by Hugging Face name.
pub trait WeightSource {
    /// The tensor named `name` (HF naming), on the CPU, any float dtype; must have shape `shape`, else
    /// [`ModelError::ShapeMismatch`]; absent is [`ModelError::MissingTensor`].
    fn load(&mut self, name: &str, shape: &[i64]) -> Result<Tensor>;
}

/// Checks a loaded tensor's shape against the spec.
pub(crate) fn check_shape(name: &str, expected: &[i64], found: &[i64]) -> Result<()> {
    if expected != found {
        return Err(ModelError::ShapeMismatch {
            tensor: name.to_owned(),
            expected: expected.to_vec(),
            found: found.to_vec(),
        });
    }
    Ok(())
}

/// Fresh weights as transformers initializes them: normal(0, 0.02) matrices, ones for norms, zeros for biases.
/// For tests and for training from scratch; seed with [`tch::manual_seed`] first for determinism.
#[derive(Debug, Default)]
pub struct RandomWeights;

impl WeightSource for RandomWeights {
    fn load(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let opts = (Kind::Float, Device::Cpu);
        Ok(if name.ends_with("norm.weight") {
            Tensor::f_ones(shape, opts)?
        } else if name.ends_with(".bias") {
            Tensor::f_zeros(shape, opts)?
        } else {
            (Tensor::f_randn(shape, opts)? * 0.02).f_contiguous()?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;

    #[test]
    fn specs_follow_the_family_switches() {
        let mut c = ModelConfig::tiny(Family::Qwen2);
        let names: Vec<String> = param_specs(&c).into_iter().map(|s| s.name).collect();
        assert!(names.contains(&"model.layers.1.self_attn.k_proj.bias".to_owned()));
        assert!(!names.iter().any(|n| n.contains("o_proj.bias") || n.contains("q_norm")));
        assert!(!names.contains(&"lm_head.weight".to_owned()));
        c.tie_word_embeddings = false;
        c.qk_norm = true;
        let names: Vec<String> = param_specs(&c).into_iter().map(|s| s.name).collect();
        assert!(names.contains(&"lm_head.weight".to_owned()));
        assert!(names.contains(&"model.layers.0.self_attn.q_norm.weight".to_owned()));
    }

    #[test]
    fn sparse_layers_list_the_router_and_every_expert() {
        let c = ModelConfig::tiny_moe();
        let specs = param_specs(&c);
        let shape = |name: &str| specs.iter().find(|s| s.name == name).map(|s| s.shape.clone());
        assert_eq!(shape("model.layers.0.mlp.gate.weight"), Some(vec![4, 32]));
        assert_eq!(shape("model.layers.0.mlp.experts.3.down_proj.weight"), Some(vec![32, 8]));
        assert_eq!(shape("model.layers.1.mlp.gate_proj.weight"), Some(vec![48, 32]), "layer 1 is dense");
        assert!(
            shape("model.layers.0.mlp.gate_proj.weight").is_none() && shape("model.layers.1.mlp.gate.weight").is_none()
        );
    }
}
