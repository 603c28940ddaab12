//! The forward of one actor pass, with the rows whose loss has no gradient left out of the backward.
//!
//! GRPO's group-normalised advantage is exactly 0 for every row of a group whose rewards are all equal (all
//! wrong early in a run, all right late: half the groups of the quickstart's run), and a PPO-style loss `−A·ratio`
//! then has zero gradient on the row. Such a row still needs its logprobs: the loss value and its metrics (clip
//! fraction, `ppo_kl`, entropy) count it, as Trinity-RFT's do. It does not need the backward, which is two
//! thirds of its cost (three quarters with a recomputed head). So a row predicted to have no gradient (every
//! advantage 0, no entropy or KL term in the loss) runs forward without autograd, and only the others keep a
//! graph.
//!
//! The prediction is checked against what it predicts: the loss's gradient with respect to each row's logprobs,
//! which the pass computes anyway before the decoder's backward. A loss with gradient at zero advantage (an SFT
//! term on expert rows, a library's loss) fails the check; those rows then run forward again with autograd and
//! backward, and the trainer stops predicting for the rest of the run. The parameters' gradient is therefore the
//! one a backward over every row gives, whatever the loss.

use tch::{Device, Kind, Tensor};
use trinity_algorithm::Batch;

use super::{Trainer, indices, pad_to};
use crate::batch::{PaddedInputs, TrainRow};
use crate::error::Result;
use crate::logprobs::{self, HeadPass};

/// Rows of a pass that run with autograd: their positions in the pass, inputs, hidden states and head pass.
struct GraphRows {
    positions: Vec<usize>,
    inputs: PaddedInputs,
    hidden: Tensor,
    head: HeadPass,
    /// The load-balancing loss of the rows' routing, when the policy trains it.
    aux: Option<Tensor>,
}

/// A pass's logprobs (and entropy), `[rows, R]` on the CPU in the pass's row order, and what its backward needs.
pub(super) struct PassForward {
    pub(super) logprob: Tensor,
    pub(super) entropy: Option<Tensor>,
    /// `R`: the pass's longest response.
    pub(super) response_width: i64,
    graph: Option<GraphRows>,
    /// Positions in the pass of the rows that ran without autograd.
    forward_only: Vec<usize>,
}

impl PassForward {
    /// The load-balancing loss of the pass's rows (all of them keep a graph when it is trained).
    pub(super) fn router_aux_loss(&self) -> Option<&Tensor> {
        self.graph.as_ref().and_then(|g| g.aux.as_ref())
    }
}

impl Trainer {
    /// Which of `pass_rows` are predicted to have no gradient: every advantage exactly 0 (a NaN is not), under a
    /// loss with no entropy or KL term, while no earlier pass of the run disproved the prediction.
    fn predicted_without_gradient(&self, batch: &Batch, pass_rows: &[usize]) -> Result<Vec<bool>> {
        let c = &self.components;
        let predict = self.predict_zero_gradient
            && c.entropy_coef() == 0.0
            && c.kl_loss.is_none()
            && crate::router_replay::aux_loss_coef(&self.policy).is_none();
        let Some(advantages) = batch.advantages.as_ref().filter(|_| predict && !pass_rows.is_empty()) else {
            return Ok(vec![false; pass_rows.len()]);
        };
        let largest = advantages.f_index_select(0, &indices(pass_rows))?.f_abs()?.f_amax([1], false)?;
        Ok(Vec::<f32>::try_from(largest.f_to_kind(Kind::Float)?)?.into_iter().map(|a| a == 0.0).collect())
    }

    /// The forward of the pass over `pass_rows`: the rows predicted to have no gradient without autograd, the
    /// others with it.
    pub(super) fn pass_forward(
        &self,
        rows: &[TrainRow],
        batch: &Batch,
        pass_rows: &[usize],
        want_entropy: bool,
    ) -> Result<PassForward> {
        let quiet = self.predicted_without_gradient(batch, pass_rows)?;
        let (forward_only, graph): (Vec<usize>, Vec<usize>) = (0..pass_rows.len()).partition(|&k| quiet[k]);
        let width = pass_rows.iter().map(|&i| rows[i].response_length()).max().unwrap_or(0) as i64;
        let graph =
            if graph.is_empty() { None } else { Some(self.graph_rows(rows, pass_rows, graph, want_entropy)?) };
        let (logprob, entropy) = match &graph {
            // The common case, every row with a graph: the head's results as they are.
            Some(g) if forward_only.is_empty() => (
                g.head.stats.logprob.f_to_device(Device::Cpu)?,
                g.head.stats.entropy.as_ref().map(|e| e.f_to_device(Device::Cpu)).transpose()?,
            ),
            _ => self.joined_stats(rows, pass_rows, graph.as_ref(), &forward_only, width, want_entropy)?,
        };
        Ok(PassForward { logprob, entropy, response_width: width, graph, forward_only })
    }

    /// The pass's logprobs (and entropy), `[rows, width]`: the graph rows' from their head pass, the others from a
    /// forward without autograd.
    fn joined_stats(
        &self,
        rows: &[TrainRow],
        pass_rows: &[usize],
        graph: Option<&GraphRows>,
        forward_only: &[usize],
        width: i64,
        want_entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let shape = [pass_rows.len() as i64, width];
        let mut logprob = Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))?;
        let mut entropy = if want_entropy { Some(Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))?) } else { None };
        let mut place = |positions: &[usize], stats: &logprobs::HeadStats| -> Result<()> {
            let at = indices(positions);
            logprob = logprob.f_index_copy(0, &at, &pad_to(&stats.logprob.f_to_device(Device::Cpu)?, width)?)?;
            if let (Some(all), Some(part)) = (entropy.as_mut(), &stats.entropy) {
                *all = all.f_index_copy(0, &at, &pad_to(&part.f_to_device(Device::Cpu)?, width)?)?;
            }
            Ok(())
        };
        if let Some(g) = graph {
            place(&g.positions, &g.head.stats)?;
        }
        if !forward_only.is_empty() {
            let quiet_rows: Vec<usize> = forward_only.iter().map(|&k| pass_rows[k]).collect();
            let (temperature, chunk) = (self.options.temperature, self.options.logit_chunk_tokens);
            let stats = tch::no_grad(|| -> Result<logprobs::HeadStats> {
                let inputs =
                    PaddedInputs::with_replay(rows, &quiet_rows, self.policy.device(), self.options.router_replay)?;
                let hidden = inputs.hidden(&self.policy)?;
                logprobs::score(&self.policy, &hidden, &inputs.targets, temperature, chunk, want_entropy)
            })?;
            place(forward_only, &stats)?;
        }
        Ok((logprob, entropy))
    }

    /// The forward with autograd of the pass rows at `positions`.
    fn graph_rows(
        &self,
        rows: &[TrainRow],
        pass_rows: &[usize],
        positions: Vec<usize>,
        want_entropy: bool,
    ) -> Result<GraphRows> {
        let step_rows: Vec<usize> = positions.iter().map(|&k| pass_rows[k]).collect();
        let aux = crate::router_replay::aux_loss_coef(&self.policy).is_some();
        let inputs =
            PaddedInputs::with_routing(rows, &step_rows, self.policy.device(), self.options.router_replay, aux)?;
        let (hidden, aux) = inputs.hidden_routed(&self.policy)?;
        let c = &self.components;
        let head = logprobs::forward(
            &self.policy,
            &hidden,
            &inputs.targets,
            self.options.temperature,
            self.options.logit_chunk_tokens,
            want_entropy,
            c.entropy_coef() != 0.0,
            self.options.head_mode,
        )?;
        Ok(GraphRows { positions, inputs, hidden, head, aux })
    }

    /// Backpropagates the loss's gradient with respect to the pass's logprobs (and entropy), `[rows, R]`, through
    /// the head and the decoder. The rows that ran forward only must have none; when some do, the prediction was
    /// wrong for this loss: they run again with autograd, and no later pass predicts.
    pub(super) fn pass_backward(
        &mut self,
        rows: &[TrainRow],
        pass_rows: &[usize],
        pass: PassForward,
        grad_logprob: &Tensor,
        grad_entropy: Option<&Tensor>,
    ) -> Result<usize> {
        let PassForward { graph, forward_only, .. } = pass;
        let mut parts: Vec<GraphRows> = graph.into_iter().collect();
        let mut quiet = forward_only.len();
        if !forward_only.is_empty() {
            let at = indices(&forward_only);
            let largest =
                |g: &Tensor| -> Result<f64> { Ok(g.f_index_select(0, &at)?.f_abs()?.f_max()?.f_double_value(&[])?) };
            let moved =
                largest(grad_logprob)? != 0.0 || grad_entropy.map(largest).transpose()?.is_some_and(|m| m != 0.0);
            if moved {
                tracing::info!(
                    "the policy loss `{}` has gradient on rows whose advantages are all 0, so every row of this run \
                     now keeps its autograd graph",
                    self.components.policy_loss.name
                );
                self.predict_zero_gradient = false;
                // The entropy is needed again only when the loss differentiates it.
                let entropy_grad = self.components.entropy_coef() != 0.0;
                parts.push(self.graph_rows(rows, pass_rows, forward_only, entropy_grad)?);
                quiet = 0;
            }
        }
        for part in parts {
            let at = indices(&part.positions);
            let r = part.inputs.response_width;
            let own = |g: &Tensor| -> Result<Tensor> { Ok(g.f_index_select(0, &at)?.f_narrow(1, 0, r)?) };
            let grad_ent = grad_entropy.map(own).transpose()?;
            logprobs::backward(
                &self.policy,
                part.head,
                &part.hidden,
                &part.inputs.targets,
                self.options.temperature,
                self.options.logit_chunk_tokens,
                &own(grad_logprob)?,
                grad_ent.as_ref(),
            )?;
        }
        Ok(quiet)
    }
}
