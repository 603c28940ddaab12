//! Parameters from a GGUF file under Hugging Face names: name mapping, dequantization, and undoing llama.cpp's
//! q/k row permutation.
//!
//! llama.cpp's converter permutes the rows of Llama's `q_proj` and `k_proj` (per head, interleaving the two
//! rotary halves) because its RoPE kernel rotates adjacent pairs; transformers rotates halves. We apply the
//! inverse permutation so the HF forward pass works on the weights. Qwen2/Qwen3 files use the "neox" RoPE
//! layout in llama.cpp and are stored unpermuted.
//!
//! A `qwen3moe` file stacks each layer's experts into one tensor per projection (`blk.N.ffn_gate_exps.weight`
//! `[experts, moe_intermediate, hidden]`, and `ffn_up_exps`, `ffn_down_exps`), where Hugging Face names every
//! expert's projection; an expert is decoded from its own byte range of the stacked tensor (each expert is whole
//! rows, so whole quantization blocks), and the router is `ffn_gate_inp`.

use tch::{Device, Kind, Tensor};

use crate::config::{Family, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::weights::{WeightSource, check_shape};

/// A GGUF file as a [`WeightSource`].
#[derive(Debug)]
pub struct GgufWeights<'a> {
    gguf: &'a GgufFile,
    config: &'a ModelConfig,
}

impl<'a> GgufWeights<'a> {
    /// Wraps an open file; `config` (usually [`ModelConfig::from_gguf`]) decides the permutation heads.
    pub fn new(gguf: &'a GgufFile, config: &'a ModelConfig) -> Self {
        Self { gguf, config }
    }
}

/// The llama.cpp tensor name for an HF parameter name, and for an expert's projection the expert's index in the
/// stacked tensor of that name.
pub(crate) fn gguf_location(hf: &str) -> Option<(String, Option<i64>)> {
    let expert = hf.strip_prefix("model.layers.").and_then(|rest| {
        let (layer, rest) = rest.split_once(".mlp.experts.")?;
        let (index, rest) = rest.split_once('.')?;
        let name = match rest {
            "gate_proj.weight" => "ffn_gate_exps",
            "up_proj.weight" => "ffn_up_exps",
            "down_proj.weight" => "ffn_down_exps",
            _ => return None,
        };
        Some((format!("blk.{layer}.{name}.weight"), Some(index.parse().ok()?)))
    });
    expert.or_else(|| gguf_name(hf).map(|name| (name, None)))
}

/// The llama.cpp tensor name for an HF parameter name (not an expert's: see [`gguf_location`]).
pub(crate) fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let name = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "mlp.gate" => "ffn_gate_inp",
        _ => return None,
    };
    Some(format!("blk.{layer}.{name}.{suffix}"))
}

/// Inverse of llama.cpp's `permute`: rows grouped as `[heads, head_dim/2, 2]` become `[heads, 2, head_dim/2]`.
pub(crate) fn unpermute_rows(t: &Tensor, heads: i64) -> Result<Tensor> {
    let size = t.size();
    let rows = size[0];
    let mut grouped = vec![heads, rows / heads / 2, 2];
    grouped.extend_from_slice(&size[1..]);
    Ok(t.f_reshape(&grouped)?.f_transpose(1, 2)?.f_reshape(&size)?.f_contiguous()?)
}

impl WeightSource for GgufWeights<'_> {
    fn load(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let (file_name, expert) =
            gguf_location(name).ok_or_else(|| ModelError::MissingTensor { tensor: name.to_owned() })?;
        let info = self
            .gguf
            .tensor_info(&file_name)
            .ok_or_else(|| ModelError::MissingTensor { tensor: format!("{name} (gguf `{file_name}`)") })?;
        let label = || format!("{name} (gguf `{file_name}`)");
        // For an expert, `[experts, rows, cols]` in the file.
        let experts = info.shape.first().copied().unwrap_or(0);
        match expert {
            None => check_shape(&label(), shape, &info.shape)?,
            Some(e) => {
                let stacked: Vec<i64> = std::iter::once(experts).chain(shape.iter().copied()).collect();
                check_shape(&label(), &stacked, &info.shape)?;
                if !(0..experts).contains(&e) {
                    return Err(ModelError::ShapeMismatch {
                        tensor: label(),
                        expected: stacked,
                        found: info.shape.clone(),
                    });
                }
            }
        }
        // Refused before the output is allocated: a tensor of an undecodable type has no checked byte range, so
        // its dims alone must never size an allocation.
        if !info.ggml_type.is_decodable() {
            return Err(ModelError::UnsupportedQuantization { tensor: file_name, ggml_type: info.ggml_type.name() });
        }
        let mut data = self.gguf.tensor_data(info);
        if let Some(e) = expert {
            // Expert `e` is the `e`-th of `experts` equal byte ranges (each expert is whole rows, so whole blocks);
            // dequantize_into checks that the range holds exactly its values.
            let per = data.len() / experts as usize;
            data = &data[per * e as usize..per * (e as usize + 1)];
        }
        let mut t = Tensor::f_empty(shape, (Kind::Float, Device::Cpu))?;
        let numel = t.numel();
        let expected = match expert {
            None => info.numel(),
            Some(_) => info.numel() / experts.max(1) as usize,
        };
        if numel != expected {
            return Err(ModelError::ShapeMismatch {
                tensor: name.to_owned(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        {
            // SAFETY: `t` is a freshly allocated, contiguous f32 CPU tensor of exactly `numel` elements that
            // nothing else references; the slice is dropped before `t` is used again.
            let out = unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<f32>(), numel) };
            crate::dequant::dequantize_into(info.ggml_type, data, out)
                .map_err(|ggml_type| ModelError::UnsupportedQuantization { tensor: file_name.clone(), ggml_type })?;
        }
        if self.config.family == Family::Llama {
            if name.ends_with("self_attn.q_proj.weight") || name.ends_with("self_attn.q_proj.bias") {
                t = unpermute_rows(&t, self.config.num_attention_heads)?;
            } else if name.ends_with("self_attn.k_proj.weight") || name.ends_with("self_attn.k_proj.bias") {
                t = unpermute_rows(&t, self.config.num_key_value_heads)?;
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_llama_cpp() {
        assert_eq!(gguf_name("model.layers.12.self_attn.k_proj.bias").unwrap(), "blk.12.attn_k.bias");
        assert_eq!(gguf_name("model.layers.0.mlp.down_proj.weight").unwrap(), "blk.0.ffn_down.weight");
        assert_eq!(gguf_name("model.layers.3.self_attn.q_norm.weight").unwrap(), "blk.3.attn_q_norm.weight");
        assert_eq!(gguf_name("lm_head.weight").unwrap(), "output.weight");
        assert!(gguf_name("model.rotary_emb.inv_freq").is_none());
        assert_eq!(gguf_name("model.layers.2.mlp.gate.weight").unwrap(), "blk.2.ffn_gate_inp.weight");
        let expert = gguf_location("model.layers.2.mlp.experts.17.down_proj.weight").unwrap();
        assert_eq!(expert, ("blk.2.ffn_down_exps.weight".to_owned(), Some(17)));
        assert_eq!(gguf_location("model.layers.1.mlp.up_proj.weight").unwrap(), ("blk.1.ffn_up.weight".into(), None));
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(heads, 2, rows/heads/2, cols).swapaxes(1, 2).reshape(rows, cols)
        let heads = 3;
        let w = Tensor::arange(3 * 8 * 2, (Kind::Float, Device::Cpu)).view([24, 2]);
        let permuted = w.reshape([heads, 2, 4, 2]).transpose(1, 2).reshape([24, 2]);
        assert!(unpermute_rows(&permuted, heads).unwrap().equal(&w));
    }
}
