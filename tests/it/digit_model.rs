//! A tiny model that answers every chat with a random number, for tests of agents that expect numbers.
//!
//! Its one layer is zero, so each position's logits depend only on its own token. Every token embeds to hidden
//! dimension 0 except `\n` (dimension 1), which ends the template's `<|im_start|>assistant\n`: after it the ten
//! digits are equally likely and nothing else is; after a digit, a digit or `<|im_end|>`. A reply is thus one or
//! more digits, and sampling it has real entropy, so a train step on it has gradients.

use std::path::Path;

use tch::{Device, Kind, Tensor};
use trinity_model::WeightSource;

use crate::tool_model::{HIDDEN, IM_END, write_model};

// The logits below assume that the final norm scales a one-hot row by √16.
const _: () = assert!(HIDDEN == 16);

/// Embeddings and output head as above; zero layers, unit norms.
struct Weights;

impl WeightSource for Weights {
    fn load(&mut self, name: &str, shape: &[i64]) -> trinity_model::Result<Tensor> {
        let zeros = || Tensor::zeros(shape, (Kind::Float, Device::Cpu));
        let digits = i64::from(b'0')..=i64::from(b'9');
        Ok(if name.ends_with("norm.weight") {
            Tensor::ones(shape, (Kind::Float, Device::Cpu))
        } else if name == "model.embed_tokens.weight" {
            let t = zeros();
            let _ = t.narrow(1, 0, 1).fill_(1.0);
            let mut newline = t.get(i64::from(b'\n'));
            let _ = newline.zero_();
            let _ = newline.get(1).fill_(1.0);
            t
        } else if name == "lm_head.weight" {
            // The final norm scales a one-hot row to √HIDDEN = 4: a head entry of 1 is a logit of 4, one of -5 a
            // logit of -20 (never sampled). After a digit, `<|im_end|>` (logit 4.8) ends the reply about a
            // quarter of the time at temperature 0.7.
            let t = zeros();
            let _ = t.narrow(1, 0, 2).fill_(-5.0);
            for digit in digits {
                let _ = t.get(digit).narrow(0, 0, 2).fill_(1.0);
            }
            let _ = t.get(IM_END).get(0).fill_(1.2);
            t
        } else {
            zeros()
        })
    }
}

/// Writes the model to `dir` as an HF directory (config, safetensors, byte-level tokenizer, ChatML template).
pub fn write_digit_model(dir: &Path) {
    write_model(dir, &mut Weights);
}
