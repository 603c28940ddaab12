//! The actor's update over one mini-batch (step 4 of [`crate::trainer`]'s docs): micro-batches, run in passes.

use tch::{Device, Kind, Tensor};
use trinity_algorithm::Batch;

use super::{MetricMeans, Trainer, pad_to};
use crate::batch::TrainRow;
use crate::error::Result;
use crate::micro_batch::{passes, rows_layout_tokens};

/// What every pass of one mini-batch's update reads: the step's rows, their batch fields, and the mini-batch's
/// row count (the loss-scale denominator).
#[derive(Clone, Copy)]
pub(super) struct MiniBatch<'a> {
    pub(super) rows: &'a [TrainRow],
    pub(super) batch: &'a Batch,
    pub(super) active: usize,
}

impl Trainer {
    /// Step 4 (actor): accumulates the gradients of one mini-batch over its micro-batches and adds their metrics
    /// to `means`. Returns how many rows ran forward only ([`super::forward_only`]).
    pub(super) fn update_actor(
        &mut self,
        mini: &MiniBatch,
        micro_batches: &[Vec<usize>],
        means: &mut MetricMeans,
    ) -> Result<usize> {
        self.optimizer.zero_grad();
        let mut forward_only = 0;
        for pass in passes(mini.rows, micro_batches, self.options.pass_tokens) {
            forward_only += self.actor_pass(mini, &micro_batches[pass], means)?;
        }
        Ok(forward_only)
    }

    /// One forward/backward pass over the rows of consecutive `micro_batches` ([`crate::micro_batch::passes`]):
    /// each micro-batch's loss on its slice of the pass's logprobs, scaled by its rows, and the sum of their
    /// gradients backpropagated once. Returns how many rows ran forward only.
    fn actor_pass(&mut self, mini: &MiniBatch, micro_batches: &[Vec<usize>], means: &mut MetricMeans) -> Result<usize> {
        let MiniBatch { rows, batch, active } = *mini;
        let width = batch.len() as i64;
        let c = &self.components;
        let entropy_coef = c.entropy_coef();
        let want_entropy = self.options.entropy_metric || entropy_coef != 0.0;
        let pass_rows: Vec<usize> = micro_batches.concat();
        let recompute = self.recompute.recompute(rows_layout_tokens(rows, &pass_rows), "policy");
        self.policy.set_recompute_activations(recompute)?;
        let pass = self.pass_forward(rows, batch, &pass_rows, want_entropy)?;
        let r = pass.response_width;
        let (logprob, entropy) = (pass.logprob.shallow_clone(), pass.entropy.as_ref().map(Tensor::shallow_clone));
        let shape = [pass_rows.len() as i64, r];
        let grad_lp = Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))?;
        let grad_ent = if entropy_coef != 0.0 && entropy.is_some() {
            Some(Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))?)
        } else {
            None
        };
        let mut any_grad = false;
        let mut offset = 0i64;
        for micro in micro_batches {
            let k = micro.len() as i64;
            let idx: Vec<i64> = micro.iter().map(|&i| i as i64).collect();
            let mut mb = batch.select_rows(&idx);
            let lp_leaf = pad_to(&logprob.f_narrow(0, offset, k)?, width)?.set_requires_grad(true);
            mb.logprob = Some(lp_leaf.shallow_clone());
            let ent_leaf = match &entropy {
                Some(e) => Some(pad_to(&e.f_narrow(0, offset, k)?, width)?.set_requires_grad(grad_ent.is_some())),
                None => None,
            };
            mb.entropy = ent_leaf.as_ref().map(Tensor::shallow_clone);

            let (pg_loss, m) = c.policy_loss.f.loss(&mb)?;
            means.add("actor/", m);
            let entropy_term = match &c.entropy {
                Some(e) if mb.entropy.is_some() => {
                    let (scaled, _, m) = e.f.loss(&mb, c.loss_agg_mode, &e.name)?;
                    means.add("actor/", m);
                    scaled
                }
                _ => Tensor::from(0f32),
            };
            let kl_term = match &c.kl_loss {
                Some(k) => {
                    let (scaled, _, m) = k.f.loss(&mb, c.loss_agg_mode, &k.name)?;
                    means.add("actor/", m);
                    scaled
                }
                None => Tensor::from(0f32),
            };
            let loss = pg_loss - entropy_term + kl_term;
            if let Some(e) = &mb.entropy {
                let h = trinity_algorithm::masked::masked_mean(e, &mb.action_mask, None);
                means.add("actor/", [("entropy".to_owned(), h.f_double_value(&[])?)]);
            }
            means.add("actor/", [("loss".to_owned(), loss.f_double_value(&[])?)]);
            let scaled = loss * (micro.len() as f64 / active as f64);
            if scaled.requires_grad() {
                any_grad = true;
                let mut leaves = vec![lp_leaf.shallow_clone()];
                if let (Some(_), Some(e)) = (&grad_ent, &ent_leaf) {
                    leaves.push(e.shallow_clone());
                }
                let grads = Tensor::f_run_backward(&[&scaled], &leaves, false, false)?;
                grad_lp.f_narrow(0, offset, k)?.f_copy_(&grads[0].f_narrow(1, 0, r)?)?;
                if let (Some(g), Some(d)) = (&grad_ent, grads.get(1)) {
                    g.f_narrow(0, offset, k)?.f_copy_(&d.f_narrow(1, 0, r)?)?;
                }
            }
            offset += k;
        }
        if !any_grad {
            return Ok(0);
        }
        // `pass_backward` moves the upstream gradients to the hidden states' device itself.
        self.pass_backward(rows, &pass_rows, pass, &grad_lp, grad_ent.as_ref())
    }
}
