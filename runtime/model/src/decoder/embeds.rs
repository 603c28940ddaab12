//! The full-sequence forward from input embeddings and given rotary tables, for models whose inputs are not
//! plain token embeddings with 1-D positions: Qwen2.5-VL puts the vision tower's outputs in place of its image
//! placeholders and rotates by 3-D positions ([`crate::vision`]). The layers are the text decoder's own.

use tch::Tensor;

use super::Decoder;
use super::training::padded_mask;
use crate::error::{ModelError, Result};

impl Decoder {
    /// Final-normed hidden states `[B, T, hidden]` of the layers run on `embeds` `[B, T, hidden]` (in the model
    /// dtype), rotated by `cos`/`sin` `[B, T, head_dim]`, with causal attention over the real tokens of
    /// `attention_mask` `[B, T]` (nonzero at real tokens; all real without one). Differentiable, recomputed in
    /// the backward when [`Decoder::set_recompute_activations`] is on, each layer inside the thread's
    /// [`crate::layer_hook`]: the layers of [`Decoder::forward_hidden`], run by the same loop.
    pub(crate) fn forward_hidden_from_embeds(
        &self,
        embeds: Tensor,
        cos: &Tensor,
        sin: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let size = embeds.size();
        if size.len() != 3 {
            return Err(ModelError::InvalidInput(format!("embeddings must be [B, T, hidden], got {size:?}")));
        }
        let mask = match attention_mask {
            None => None,
            Some(m) => Some(padded_mask(&m.f_to_device(self.device())?.f_ne(0)?)?),
        };
        let (x, recompute) = self.first_layer_input(embeds)?;
        Ok(self.run_layers(x, recompute, cos, sin, mask.as_ref(), None, false)?.0)
    }
}
