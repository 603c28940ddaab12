//! The actor's update over one mini-batch (step 4 of [`crate::trainer`]'s docs): micro-batches, run in passes.

use tch::{Device, Kind, Tensor};
use trinity_algorithm::entropy::EntropyKind;
use trinity_algorithm::loss::{combine, loss_terms};
use trinity_algorithm::{AggCounts, Batch, LossAggMode};

use super::{MetricMeans, Trainer, indices as indices_of, pad_to};
use crate::batch::TrainRow;
use crate::error::Result;
use crate::loss_weight::{RowCounts, Weight};
use crate::micro_batch::{passes, rows_layout_tokens};

/// What every pass of one mini-batch's update reads: the step's rows, their batch fields, their trained tokens, and
/// the whole mini-batch's counts (the denominators of its loss terms, over every rank's share; see
/// [`crate::loss_weight`]).
#[derive(Clone, Copy)]
pub(super) struct MiniBatch<'a> {
    pub(super) rows: &'a [TrainRow],
    pub(super) batch: &'a Batch,
    pub(super) counts: &'a RowCounts,
    /// All the mini-batch's rows.
    pub(super) whole: AggCounts,
    /// Its usual (non-expert) rows: the denominators of the `mix` entropy bonus.
    pub(super) usual: AggCounts,
    /// The step's `[N, R]` rollout-correction importance weights, when `rollout_is` is set.
    pub(super) is_weights: Option<&'a Tensor>,
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
        let passes = passes(mini.rows, micro_batches, self.options.pass_tokens);
        // Under stage 3 every rank runs as many passes as the busiest one, idle ones gathering and reducing only.
        let most = self.most_passes(passes.len())?;
        for pass in &passes {
            forward_only += self.sharded_pass(true, |t| t.actor_pass(mini, &micro_batches[pass.clone()], means))?;
        }
        self.idle_passes(most - passes.len(), true)?;
        Ok(forward_only)
    }

    /// One forward/backward pass over the rows of consecutive `micro_batches` ([`crate::micro_batch::passes`]):
    /// each micro-batch's loss terms on its slice of the pass's logprobs, each weighted by the micro-batch's share
    /// of the mini-batch's denominator ([`crate::loss_weight`]), and the sum of their gradients backpropagated
    /// once. Returns how many rows ran forward only.
    fn actor_pass(&mut self, mini: &MiniBatch, micro_batches: &[Vec<usize>], means: &mut MetricMeans) -> Result<usize> {
        let MiniBatch { rows, batch, counts, whole, usual, is_weights } = *mini;
        let mode = self.components.loss_agg_mode;
        let width = batch.len() as i64;
        let c = &self.components;
        let entropy_coef = c.entropy_coef();
        let want_entropy = self.options.entropy_metric || entropy_coef != 0.0;
        let pass_rows: Vec<usize> = micro_batches.concat();
        let recompute = self.recompute.recompute(rows_layout_tokens(rows, &pass_rows), "policy");
        let aux_coef = crate::router_replay::aux_loss_coef(&self.policy);
        // Router logits need the layers' activations kept (a recomputed layer hands back its output only).
        self.policy.set_recompute_activations(recompute && aux_coef.is_none())?;
        let pass = self.pass_forward(rows, batch, &pass_rows, want_entropy)?;
        if let (Some(coef), Some(aux)) = (aux_coef, pass.router_aux_loss()) {
            // This pass's share of the mini-batch's rows weighs its forward's loss, so the mini-batch trains the
            // row-weighted mean over its passes (transformers adds coef × loss to each forward's loss).
            let share = pass_rows.len() as f64 / whole.rows.max(1.0);
            let value = aux.f_double_value(&[])?;
            means.add_weighted("actor/", [("router_aux_loss".to_owned(), value)], Weight { loss: 1.0, share });
            crate::router_replay::backward_keeping_graph(&self.policy, &(aux * (coef * share)))?;
        }
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

            // Each term weighs by this micro-batch's share of its own denominator over the whole mini-batch.
            let part = counts.of(micro, false);
            let all_rows = Weight::new(Some(mode), part, whole);
            let (pg_loss, m) = c.policy_loss.f.loss(&mb)?;
            let pg_weight = Weight::new(c.policy_loss.f.loss_agg_mode(), part, whole);
            means.add_weighted("actor/", m, pg_weight);
            let pg_term = pg_loss * pg_weight.loss;
            // veRL multiplies each token's policy-loss term by its importance weight before aggregating. Every
            // built-in loss (dpo aside, refused) gets its gradient on a token's logprob from that token's term
            // only, so the weighted loss's gradient is the loss's gradient times the weight, token by token; the
            // policy loss is therefore backpropagated on its own and its gradient scaled. Its logged value stays
            // the unweighted one.
            let weighted = is_weights.map(|w| w.index_select(0, &indices_of(micro)));
            let pg_part = match &weighted {
                Some(_) => pg_term.detach(),
                None => pg_term.shallow_clone(),
            };
            // The entropy and KL terms as `trinity algorithm eval` takes them (trinity_algorithm::loss), each
            // weighted by this micro-batch's share.
            let entropy_fn = c.entropy.as_ref().map(|e| (e.name.as_str(), &e.f));
            let kl_fn = c.kl_loss.as_ref().map(|k| (k.name.as_str(), &k.f));
            let terms = loss_terms(entropy_fn, kl_fn, &mb, mode)?;
            let entropy_term = match (terms.entropy, &c.entropy) {
                (Some(t), Some(e)) => {
                    let weight = match e.f.kind {
                        EntropyKind::Mix => {
                            let usual_part = counts.of(micro, true);
                            // No usual row: no bonus (a seq-mean over no rows would be NaN).
                            (usual_part.rows > 0.0).then(|| Weight::new(Some(mode), usual_part, usual))
                        }
                        _ => Some(all_rows),
                    };
                    weight.map(|weight| {
                        means.add_weighted("actor/", t.metrics, weight);
                        t.scaled * weight.loss
                    })
                }
                _ => None,
            };
            let kl_term = terms.kl.map(|t| {
                means.add_weighted("actor/", t.metrics, all_rows);
                t.scaled * all_rows.loss
            });
            let loss = combine(pg_part, entropy_term, kl_term);
            if let Some(e) = &mb.entropy {
                let h = trinity_algorithm::masked::masked_mean(e, &mb.action_mask, None);
                let tokens = Weight::new(Some(LossAggMode::TokenMean), part, whole);
                means.add_weighted("actor/", [("entropy".to_owned(), h.f_double_value(&[])?)], tokens);
            }
            // `loss` is already this micro-batch's weighted contribution: the mini-batch's is their sum.
            let rows_share = Weight::new(None, part, whole).share;
            let contribution = Weight { loss: 1.0, share: rows_share };
            means.add_weighted("actor/", [("loss".to_owned(), loss.f_double_value(&[])?)], contribution);
            if loss.requires_grad() {
                any_grad = true;
                let mut leaves = vec![lp_leaf.shallow_clone()];
                if let (Some(_), Some(e)) = (&grad_ent, &ent_leaf) {
                    leaves.push(e.shallow_clone());
                }
                let grads = Tensor::f_run_backward(&[&loss], &leaves, false, false)?;
                grad_lp.f_narrow(0, offset, k)?.f_copy_(&grads[0].f_narrow(1, 0, r)?)?;
                if let (Some(g), Some(d)) = (&grad_ent, grads.get(1)) {
                    g.f_narrow(0, offset, k)?.f_copy_(&d.f_narrow(1, 0, r)?)?;
                }
            }
            if let Some(w) = &weighted
                && pg_term.requires_grad()
            {
                any_grad = true;
                let grads = Tensor::f_run_backward(&[&pg_term], &[&lp_leaf], false, false)?;
                let scaled = (&grads[0] * w.f_to_kind(grads[0].kind())?).f_narrow(1, 0, r)?;
                let _ = grad_lp.f_narrow(0, offset, k)?.f_add_(&scaled)?;
            }
            offset += k;
        }
        // A sharded pass must run its backward through every layer (zero gradients then), as the ranks' passes
        // share their collectives.
        if !any_grad && !self.fully_sharded() {
            return Ok(0);
        }
        // `pass_backward` moves the upstream gradients to the hidden states' device itself.
        self.pass_backward(rows, &pass_rows, pass, &grad_lp, grad_ent.as_ref())
    }
}
