//! The PPO critic: a decoder with a value head (`Linear(hidden, 1)`), trained by its own AdamW, as veRL's
//! `DataParallelPPOCritic` (a separate copy of the backbone, `critic_model_path` defaulting to the policy's).
//!
//! The value of response token `t` is read at the hidden state that predicts it (column `P − 1 + t`, the same
//! columns as the policy's logprobs), so `V_t` is the value of the state before token `t` is generated.
//!
//! Value loss (veRL's `compute_value_loss`, `cliprange_value` default 0.5):
//! ```text
//! V̂ = clip(V, V_old − c, V_old + c);  L = ½·agg(max((V − R)², (V̂ − R)²), m)
//! vf_clipfrac = masked_mean((V̂ − R)² > (V − R)²)
//! ```
//! Micro-batch losses are weighted like the actor's terms ([`crate::loss_weight`]: by their share of the whole
//! step's denominator under the aggregation) and accumulated, so that micro-batches and ranks' shares add up to the
//! one-process loss; one optimizer step per train step with its own gradient clipping and learning-rate schedule.

use tch::{Device, Kind, Tensor};
use trinity_algorithm::masked::masked_mean;
use trinity_algorithm::metrics::Metrics;
use trinity_algorithm::{AggCounts, LossAggMode};
use trinity_model::Decoder;

use crate::batch::{PaddedInputs, TrainRow};
use crate::data_parallel::DataParallel;
use crate::error::Result;
use crate::loss_weight::{RowCounts, Weight};
use crate::lr_schedule::LrSchedule;
use crate::micro_batch::rows_layout_tokens;
use crate::optimizer::{AdamW, AdamWSettings};
use crate::recompute::RecomputePlan;

/// A value model with its optimizer.
#[derive(Debug)]
pub struct Critic {
    decoder: Decoder,
    head_weight: Tensor,
    head_bias: Tensor,
    optimizer: AdamW,
    schedule: LrSchedule,
    grad_clip: f64,
    cliprange_value: f64,
    /// Which update micro-batches recompute the backbone's layers (none unless the trainer sets a plan).
    recompute: Option<RecomputePlan>,
}

/// What one critic update reports (veRL's `critic/*` metrics without the prefix).
#[derive(Debug)]
pub(crate) struct CriticUpdate {
    pub metrics: Metrics,
}

/// `n` standard normal draws from `seed` ([`trinity_rng::SplitMix64::next_normal`]), for initialising a head
/// reproducibly.
fn seeded_normals(seed: u64, n: usize) -> Vec<f64> {
    let mut rng = trinity_rng::SplitMix64::new(seed);
    (0..n).map(|_| rng.next_normal()).collect()
}

impl Critic {
    /// Wraps `decoder` (the critic backbone) with a fresh value head (normal(0, 0.02) weights, zero bias, as
    /// transformers initializes a token-classification head) and an AdamW over both. The head's weights come
    /// from `seed` alone, not from libtorch's global generator, so a run repeated with the same config trains the
    /// same critic whatever else drew random numbers before. `offload`: the optimizer's state in host memory
    /// (`optimizer_offload`, [`AdamW::placed`]).
    pub fn new(
        decoder: Decoder,
        optimizer: &trinity_config::algorithm::OptimizerConfig,
        schedule: LrSchedule,
        cliprange_value: f64,
        seed: u64,
        offload: bool,
    ) -> Result<Self> {
        let h = decoder.config().hidden_size;
        let device = decoder.device();
        let draws: Vec<f32> = seeded_normals(seed, h as usize).into_iter().map(|x| (x * 0.02) as f32).collect();
        let head_weight = Tensor::f_from_slice(&draws)?.f_reshape([1, h])?.f_to_device(device)?.set_requires_grad(true);
        let head_bias = Tensor::f_zeros([1], (Kind::Float, device))?.set_requires_grad(true);
        let mut params = decoder.named_parameters()?;
        params.push(("score.weight".into(), head_weight.shallow_clone()));
        params.push(("score.bias".into(), head_bias.shallow_clone()));
        let optimizer_state = AdamW::placed(params, AdamWSettings::from(optimizer), offload)?;
        Ok(Critic {
            decoder,
            head_weight,
            head_bias,
            optimizer: optimizer_state,
            schedule,
            grad_clip: optimizer.clip_grad,
            cliprange_value,
            recompute: None,
        })
    }

    /// Recompute the backbone's layers in the update's micro-batches that `plan` says to (`None`: in none).
    pub(crate) fn set_recompute(&mut self, plan: Option<RecomputePlan>) {
        self.recompute = plan;
    }

    /// The backbone.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The value head's weight `[1, hidden]` and bias `[1]`.
    pub fn value_head(&self) -> (&Tensor, &Tensor) {
        (&self.head_weight, &self.head_bias)
    }

    /// The critic's optimizer (for checkpoints).
    pub fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    /// Mutable optimizer (for restoring checkpoints).
    pub fn optimizer_mut(&mut self) -> &mut AdamW {
        &mut self.optimizer
    }

    /// Restores the backbone and head from a safetensors file of named fp32 tensors (as
    /// [`crate::Trainer::save_state`] writes), in place.
    pub fn load_weights(&mut self, path: &std::path::Path) -> Result<()> {
        let saved: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(path)?.into_iter().collect();
        let mut params = self.decoder.named_parameters()?;
        params.push(("score.weight".into(), self.head_weight.shallow_clone()));
        params.push(("score.bias".into(), self.head_bias.shallow_clone()));
        tch::no_grad(|| -> Result<()> {
            for (name, mut p) in params {
                let t = saved.get(&name).ok_or_else(|| crate::error::TrainerError::OptimizerState {
                    path: path.to_path_buf(),
                    problem: format!("no critic weight `{name}`"),
                })?;
                if t.size() != p.size() {
                    return Err(crate::error::TrainerError::OptimizerState {
                        path: path.to_path_buf(),
                        problem: format!("critic weight `{name}` has shape {:?}, expected {:?}", t.size(), p.size()),
                    });
                }
                p.f_copy_(t)?;
            }
            Ok(())
        })
    }

    /// Values of the response positions of `rows[micro]`, `[b, R]` f32 on the model's device; differentiable
    /// when gradients are enabled.
    fn values_of(&self, rows: &[TrainRow], micro: &[usize]) -> Result<Tensor> {
        let inputs = PaddedInputs::new(rows, micro, self.decoder.device())?;
        let hidden = inputs.hidden(&self.decoder)?.f_to_kind(Kind::Float)?;
        Ok(hidden.f_linear(&self.head_weight, Some(&self.head_bias))?.f_squeeze_dim(-1)?)
    }

    /// Values without gradients, `[b, R]` on the CPU (R = longest response in `micro`).
    pub fn values(&self, rows: &[TrainRow], micro: &[usize]) -> Result<Tensor> {
        tch::no_grad(|| Ok(self.values_of(rows, micro)?.f_to_device(Device::Cpu)?))
    }

    /// One critic update over `micro_batches` (lists of indices into `rows`). `returns`, `old_values` and
    /// `mask` are `[N, width]` CPU tensors indexed by row (`N = rows.len()`); `whole` counts the rows and trained
    /// tokens of the step (the loss denominators, over every rank's share), `counts` each row's. With `dp`,
    /// `micro_batches` are this rank's, gradients are summed over the ranks before clipping and the metrics are
    /// pooled.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn update(
        &mut self,
        rows: &[TrainRow],
        micro_batches: &[Vec<usize>],
        returns: &Tensor,
        old_values: &Tensor,
        mask: &Tensor,
        agg: LossAggMode,
        counts: &RowCounts,
        whole: AggCounts,
        step: u64,
        dp: Option<&DataParallel>,
    ) -> Result<CriticUpdate> {
        self.optimizer.zero_grad();
        let width = mask.size()[1];
        // `vf_loss` sums the weighted micro-batch losses; the token means are weighted by the tokens' share.
        let (mut vf_loss, mut clipfrac, mut vpred, mut token_share) = (0.0, 0.0, 0.0, 0.0);
        for micro in micro_batches {
            let idx = Tensor::from_slice(&micro.iter().map(|&i| i as i64).collect::<Vec<_>>());
            let recompute = match &mut self.recompute {
                Some(plan) => plan.recompute(rows_layout_tokens(rows, micro), "critic"),
                None => false,
            };
            self.decoder.set_recompute_activations(recompute)?;
            let v = self.values_of(rows, micro)?.f_to_device(Device::Cpu)?;
            let v = v.f_constant_pad_nd([0, width - v.size()[1]])?;
            let (ret, old, m) =
                (returns.f_index_select(0, &idx)?, old_values.f_index_select(0, &idx)?, mask.f_index_select(0, &idx)?);
            let clipped =
                v.f_clamp_tensor(Some(&(&old - self.cliprange_value)), Some(&(&old + self.cliprange_value)))?;
            let l1 = (&v - &ret).f_square()?;
            let l2 = (clipped - &ret).f_square()?;
            let part = counts.of(micro, false);
            let weight = Weight::new(Some(agg), part, whole).loss;
            let tokens = Weight::new(Some(LossAggMode::TokenMean), part, whole).share;
            let loss = agg.aggregate(&l1.f_maximum(&l2)?, &m, None) * (0.5 * weight);
            let fraction = masked_mean(&l2.f_gt_tensor(&l1)?.f_to_kind(Kind::Float)?, &m, None);
            clipfrac += tokens * fraction.f_double_value(&[])?;
            vpred += tokens * masked_mean(&v.f_detach()?, &m, None).f_double_value(&[])?;
            token_share += tokens;
            vf_loss += loss.f_double_value(&[])?;
            if loss.requires_grad() {
                loss.f_backward()?;
            }
        }
        if let Some(dp) = dp {
            dp.reduce_gradients(&self.optimizer.param_vars())?;
            let mut sums = Tensor::from_slice(&[vf_loss, clipfrac, vpred, token_share]);
            dp.sum(&mut sums)?;
            let sums = Vec::<f64>::try_from(&sums)?;
            (vf_loss, clipfrac, vpred, token_share) = (sums[0], sums[1], sums[2], sums[3]);
        }
        let n = if token_share > 0.0 { token_share } else { 1.0 };
        let grad_norm = self.optimizer.clip_grad_norm(self.grad_clip)?;
        let lr = self.schedule.lr(step);
        if grad_norm.is_finite() {
            self.optimizer.step(lr)?;
        }
        self.optimizer.zero_grad();
        let metrics = Metrics::from([
            ("vf_loss".to_owned(), vf_loss),
            ("vf_clipfrac".to_owned(), clipfrac / n),
            ("vpred_mean".to_owned(), vpred / n),
            ("grad_norm".to_owned(), grad_norm),
            ("lr".to_owned(), lr),
        ]);
        Ok(CriticUpdate { metrics })
    }
}
