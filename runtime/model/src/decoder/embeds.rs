//! The full-sequence forward from input embeddings and given rotary tables, for models whose inputs are not
//! plain token embeddings with 1-D positions: Qwen2.5-VL puts the vision tower's outputs in place of its image
//! placeholders and rotates by 3-D positions ([`crate::vision`]). The layers are the text decoder's own.

use tch::{Kind, Tensor};

use super::{Decoder, merge_heads};
use crate::attention::{self, causal};
use crate::checkpoint;
use crate::error::{ModelError, Result};
use crate::layer_hook;

impl Decoder {
    /// Final-normed hidden states `[B, T, hidden]` of the layers run on `embeds` `[B, T, hidden]` (in the model
    /// dtype), rotated by `cos`/`sin` `[B, T, head_dim]`, with causal attention over the real tokens of
    /// `attention_mask` `[B, T]` (nonzero at real tokens; all real without one). Differentiable, recomputed in
    /// the backward when [`Decoder::set_recompute_activations`] is on, each layer inside the thread's
    /// [`layer_hook`].
    pub(crate) fn forward_hidden_from_embeds(
        &self,
        embeds: Tensor,
        cos: &Tensor,
        sin: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let size = embeds.size();
        let [b, t, _] = size[..] else {
            return Err(ModelError::InvalidInput(format!("embeddings must be [B, T, hidden], got {size:?}")));
        };
        let device = self.device();
        let mask = match attention_mask {
            None => None,
            Some(m) => {
                let valid = m.f_to_device(device)?.f_ne(0)?;
                // Causal over real keys; a query always sees itself, so padding rows never go fully masked.
                Some(
                    causal(t, device)?
                        .f_view([1, 1, t, t])?
                        .f_logical_and(&valid.f_view([b, 1, 1, t])?)?
                        .f_logical_or(&Tensor::f_eye(t, (Kind::Bool, device))?)?,
                )
            }
        };
        let recompute = self.recompute && checkpoint::grad_mode_enabled();
        let mut x =
            if recompute && !embeds.requires_grad() { embeds.f_detach()?.set_requires_grad(true) } else { embeds };
        let dims = self.dims();
        let hook = layer_hook::current();
        for (index, layer) in self.layers.iter().enumerate() {
            let (layer, cos, sin) = (layer.share(), cos.shallow_clone(), sin.shallow_clone());
            let mask = mask.as_ref().map(Tensor::shallow_clone);
            let run = move |x: &Tensor| -> Result<Tensor> {
                let h = dims.rms_norm(x, &layer.input_norm)?;
                let (q, k, v) = dims.qkv(&layer, None, &h, &cos, &sin)?;
                let heads_first = |t: Tensor| t.f_transpose(1, 2);
                let attn = attention::attend(&heads_first(q)?, &heads_first(k)?, &heads_first(v)?, mask.as_ref())?;
                Ok(dims.finish_layer(&layer, None, x.shallow_clone(), &merge_heads(&attn)?, None)?.0)
            };
            // Around each layer the thread's layer hook, as in `forward_hidden` (ZeRO stage 3 gathers there).
            let run = layer_hook::hooked(hook.clone(), index, recompute, run);
            x = if recompute { checkpoint::segment(&x, Box::new(run))? } else { run(&x)? };
        }
        self.rms_norm(&x, &self.norm)
    }
}
