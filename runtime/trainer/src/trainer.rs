//! One train step, as Trinity-RFT's veRL trainer runs it (`train_step` + `update_policy`), on one device.
//!
//! For a batch of [`TrainRow`]s:
//! 1. Response-token fields are gathered into an algorithm [`Batch`] of `[N, R]` (R = longest response);
//!    `old_logprob` is the rollout logprobs (Trinity's default `bypass_mode`), or the policy's own before the
//!    update with `rollout_correction.bypass_mode: false` ([`TrainerOptions::recompute_old_logprobs`]).
//! 2. With a reference model: reference logprobs (`no_grad`). With a critic: values (`no_grad`).
//! 3. Advantages, unless every row brings its own: trainer-side functions (preset
//!    `compute_advantage_in_trainer`) after the KL reward penalty; a group (explorer-side) function also runs
//!    here when the rows arrive without advantages, so a loop without an experience pipeline still trains.
//!    Rows a group function drops leave the step, duplicated ones count twice. A function that reads the
//!    policy's entropy (and `necs`) before the update (Clip_B, Clip_V) gets them from one more pass
//!    ([`crate::policy_stats`]), which also gives the recomputed old logprobs; the training mask it narrows is the
//!    step's mask from then on, for every loss term and denominator.
//!    3b. With recomputed old logprobs, the rollout correction (`rollout_correction`, veRL's decoupled mode): the
//!    recomputed old logprobs are compared with the rollout's once for the whole step; rejection sampling sets
//!    the action mask of rejected tokens (or responses) to 0 for every loss term, and each token's policy-loss
//!    term is multiplied by its truncated importance weight π_old/π_rollout (`trainer/actor.rs`).
//! 4. The critic's update (PPO): `critic.ppo_epochs` passes over all rows, one optimizer step each. Then
//!    `ppo_epochs` passes of the actor over the rows, each cut into mini-batches (`ppo_mini_batch_size`; by
//!    default the whole step is one). Per mini-batch: micro-batches
//!    ([`crate::micro_batch`]); per micro-batch the current logprobs with the rollout temperature (and entropy
//!    when a coefficient or the metric needs it), `loss = pg_loss − entropy_coef·H + kl_coef·KL` from
//!    trinity-algorithm's components, each term weighted by the micro-batch's share of the whole mini-batch's
//!    denominator under its aggregation (its trained tokens for `token-mean`, its rows for the seq-mean modes;
//!    [`crate::loss_weight`]), so that the micro-batches add up to the loss of the mini-batch as one micro-batch
//!    (veRL's global token count; Trinity's `micro_bsz / ppo_mini_batch_size` is the seq-mean case), and
//!    backpropagated through the chunked head ([`crate::logprobs`]);
//!    on the CPU consecutive micro-batches share one forward/backward pass ([`TrainerOptions::pass_tokens`]),
//!    each still with its own loss and weight, which changes the work and not the gradient; rows whose
//!    advantages are all 0 under a loss without entropy or KL term run forward only (`forward_only`), checked
//!    against the loss's gradient, which again changes the work and not the gradient;
//!    then one optimizer step: global grad-norm clipping (a non-finite norm skips the update, as veRL does),
//!    AdamW with the train step's scheduled learning rate. `actor/grad_norm` is the mean over these steps.
//!
//! Metrics use Trinity's names: component metrics under `actor/` (`actor/pg_loss`, `actor/pg_clipfrac`,
//! `actor/ppo_kl`, `actor/kl_loss`, …; losses summed with their weights, other metrics weighted by each
//! micro-batch's share, so both are the one-micro-batch values; the mean over mini-batches), `actor/entropy`,
//! `actor/grad_norm`, `actor/lr`, `critic/*` for the critic, trainer-side advantage metrics under
//! `advantage/`, and `perf/*` (`perf/tokens_per_s` counts prompt + response tokens of the trained rows,
//! `perf/forward_only_rows` the rows that ran forward only).
//!
//! Data parallel ([`Trainer::with_process_group`]): every rank runs the step on the same rows and trains its
//! share with the whole mini-batch's denominators; gradients are summed over the ranks before clipping, so a step
//! does not depend on the world size; see [`crate::data_parallel`] for the rule.
//!
//! Precision follows the policy's dtype: fp32 parameters train in fp32; bf16 parameters compute in bf16 while
//! the optimizer keeps fp32 master weights and moments (FSDP `MixedPrecision(param_dtype=bf16)`, which is what
//! veRL runs). libtorch's autocast is not reachable on the CPU through tch 0.24, so this is the bf16 mode on
//! every device.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use trinity_algorithm::Batch;
use trinity_algorithm::advantage::PolicyStats;
use trinity_algorithm::metrics::Metrics;
use trinity_config::ExperienceSchema;
use trinity_config::algorithm::OptimizerConfig;
use trinity_model::Decoder;

use crate::batch::{TrainRow, mask_field, token_field, validate};
use crate::components::Components;
use crate::critic::Critic;
use crate::data_parallel::DataParallel;
use crate::error::{Result, TrainerError};
use crate::loss_weight::{RowCounts, Weight};
use crate::lr_schedule::LrSchedule;
use crate::memory::{StateMemory, TrainedParameters};
use crate::micro_batch::{MicroBatching, passes, split};
use crate::optimizer::zero::{ShardedMemory, Zero, ZeroStage};
use crate::optimizer::zero3::FullShard;
use crate::optimizer::{AdamW, AdamWSettings};
use crate::recompute::{ActivationRecompute, RecomputePlan};
use crate::reference::{ReferenceModel, copy_decoder, response_logprobs};
use memory_fit::{MemoryBudget, allocated_for};

mod actor;
mod forward_only;
mod full_shard;
mod memory_fit;
mod options;

pub use options::{PASS_TOKENS, TrainerOptions};

/// Models a trainer starts from besides the policy. KL terms are measured against the base model and the critic
/// starts from `model.critic_model_path`; a resumed run's policy is neither, so it loads them itself.
#[derive(Debug, Default)]
pub struct StartingModels {
    /// The frozen reference model (any dtype); `None` copies the policy.
    pub reference: Option<Decoder>,
    /// The critic's backbone, in fp32 (a value head is added); `None` copies the policy.
    pub critic: Option<Decoder>,
}

/// Metric name → value of one train step.
pub type StepMetrics = Metrics;

/// The training engine: a policy, its optimizer and schedule, and what the algorithm needs besides.
#[derive(Debug)]
pub struct Trainer {
    policy: Decoder,
    optimizer: AdamW,
    schedule: LrSchedule,
    components: Components,
    reference: Option<ReferenceModel>,
    /// The reference is the LoRA policy with its adapters switched off.
    reference_is_base: bool,
    critic: Option<Critic>,
    options: TrainerOptions,
    global_step: u64,
    dp: Option<DataParallel>,
    /// Rows whose advantages are all 0 run forward only until a pass shows the loss has gradient on them
    /// ([`forward_only`]).
    predict_zero_gradient: bool,
    /// Which of the policy's passes recompute their layers.
    recompute: RecomputePlan,
    /// What passes and micro-batches are sized from ([`memory_fit`]).
    memory_budget: MemoryBudget,
    /// What this rank is expected to hold for the policy's training state.
    state_memory: StateMemory,
    /// Whether the start's memory line was logged (before the first step, once the stage is known).
    memory_announced: bool,
    /// ZeRO stage 3 over more than one rank: the policy's parameters, gradients and optimizer state, sharded
    /// ([`full_shard`]); `self.optimizer` then holds no state.
    full_shard: Option<FullShard>,
    /// Under stage 3, the KL reference's parameters sharded the same way (a frozen layout, forward-only passes).
    reference_shard: Option<FullShard>,
}

/// Sums of per-micro-batch metrics, reduced to means at the end (veRL's `reduce_metrics`).
#[derive(Default)]
/// Weighted metric means: name → (Σ weight · value, Σ share), see [`crate::loss_weight`].
pub(crate) struct MetricMeans(pub(crate) BTreeMap<String, (f64, f64)>);

impl MetricMeans {
    /// Adds values that are already the whole step's (the critic's pooled metrics).
    fn add(&mut self, prefix: &str, metrics: impl IntoIterator<Item = (String, f64)>) {
        self.add_weighted(prefix, metrics, Weight::WHOLE);
    }

    /// Adds one micro-batch's values of a term weighted by `weight`.
    fn add_weighted(&mut self, prefix: &str, metrics: impl IntoIterator<Item = (String, f64)>, weight: Weight) {
        for (k, v) in metrics {
            let w = weight.of_metric(&k);
            let e = self.0.entry(format!("{prefix}{k}")).or_default();
            e.0 += w * v;
            e.1 += weight.share;
        }
    }

    fn into_metrics(self, out: &mut Metrics) {
        out.extend(self.0.into_iter().map(|(k, (s, n))| (k, if n > 0.0 { s / n } else { 0.0 })));
    }
}

/// Pads `[b, r]` to `[b, width]` with zeros on the right.
fn pad_to(t: &Tensor, width: i64) -> Result<Tensor> {
    let r = t.size()[1];
    Ok(if r == width { t.shallow_clone() } else { t.f_constant_pad_nd([0, width - r])? })
}

/// This rank's share of `items` (all of them without a group).
fn share_of(dp: Option<&DataParallel>, items: &[usize], unit: usize) -> Vec<usize> {
    match dp {
        Some(dp) => dp.my_share(items, unit),
        None => items.to_vec(),
    }
}

fn indices(micro: &[usize]) -> Tensor {
    Tensor::from_slice(&micro.iter().map(|&i| i as i64).collect::<Vec<_>>())
}

impl Trainer {
    /// Builds a trainer around `policy` (fp32 or bf16 parameters, see the module docs) whose reference model and
    /// critic start as copies of it: right for a fresh run, where the policy is the base model. A resumed run
    /// passes the base model itself through [`Trainer::with_models`].
    pub fn new(
        policy: Decoder,
        components: Components,
        optimizer: &OptimizerConfig,
        options: TrainerOptions,
    ) -> Result<Self> {
        Self::with_models(policy, StartingModels::default(), components, optimizer, options)
    }

    /// Builds a trainer around `policy` with the reference model and critic backbone of `models`. When the
    /// algorithm uses a reference model and none is given, a frozen copy of `policy` becomes it; when it uses a
    /// critic and no backbone is given, a copy of `policy` in fp32 with a fresh value head becomes it. The
    /// critic's optimizer uses the same settings and schedule.
    pub fn with_models(
        policy: Decoder,
        models: StartingModels,
        components: Components,
        optimizer: &OptimizerConfig,
        options: TrainerOptions,
    ) -> Result<Self> {
        if !(options.temperature.is_finite() && options.temperature > 0.0) {
            return Err(TrainerError::setting("temperature", format!("must be positive, got {}", options.temperature)));
        }
        if options.logit_chunk_tokens < 1 {
            return Err(TrainerError::setting("logit_chunk_tokens", "must be at least 1"));
        }
        crate::memory::check_param_offload(options.param_offload, policy.device())?;
        let weighted = options.rollout_correction.as_ref().is_some_and(|rc| rc.is_level.is_some());
        if weighted && components.policy_loss.name == "dpo" {
            // DPO's loss is per (chosen, rejected) pair, not a sum of per-token terms the weights could scale.
            return Err(TrainerError::setting(
                "rollout_correction.rollout_is",
                "importance weights scale a policy loss token by token; dpo's loss is per pair of responses, so set \
                 rollout_is to null",
            ));
        }
        let available = crate::micro_batch::available_memory();
        let schedule = LrSchedule::new(optimizer, options.total_steps)?;
        // With LoRA adapters only they are trained: the frozen base weights get no gradient and no optimizer state.
        // A state that a data-parallel group may shard is allocated when the trainer knows whether it does, so a
        // sharded rank never holds it whole ([`AdamW::deferred`]).
        let (settings, offload) = (AdamWSettings::from(optimizer), options.optimizer_offload);
        let adamw = match options.zero_stage {
            ZeroStage::Replicated => AdamW::placed(policy.trainable_parameters()?, settings, offload)?,
            _ => AdamW::deferred(policy.trainable_parameters()?, settings, offload)?,
        };
        let trained = TrainedParameters::of(adamw.param_vars().iter());
        let on_cpu = policy.device() == Device::Cpu;
        // A LoRA policy's base weights are the reference: scored with the adapters off (as veRL does with a LoRA
        // actor), no second copy of the model.
        let reference_is_base = components.needs_reference() && models.reference.is_none() && policy.has_lora();
        let copied_reference = components.needs_reference() && models.reference.is_none() && !reference_is_base;
        let reference = match (components.needs_reference(), models.reference) {
            (false, _) => None,
            (true, Some(decoder)) => Some(ReferenceModel::new(decoder)),
            (true, None) if reference_is_base => None,
            (true, None) => {
                Some(ReferenceModel::from_policy(&policy, options.reference_kind.unwrap_or(policy.kind()))?)
            }
        };
        // What the trainer allocates after `available` was measured, besides the policy's own state.
        let copied_reference_bytes = match reference.as_ref().filter(|_| copied_reference) {
            Some(r) => TrainedParameters::of(r.decoder().named_parameters()?.iter().map(|(_, t)| t)).bytes,
            None => 0,
        };
        let mut others = copied_reference_bytes;
        let critic = if components.use_critic {
            let copied = models.critic.is_none();
            let backbone = match models.critic {
                Some(decoder) => decoder,
                None => copy_decoder(&policy, Kind::Float)?,
            };
            let (critic_optimizer, critic_schedule) = match &options.critic_optimizer {
                Some(own) => (own, LrSchedule::new(own, options.total_steps)?),
                None => (optimizer, schedule.clone()),
            };
            let critic = Critic::new(
                backbone,
                critic_optimizer,
                critic_schedule,
                options.cliprange_value,
                options.seed,
                options.optimizer_offload,
            )?;
            let critic_trained = TrainedParameters::of(critic.optimizer().param_vars().iter());
            others += allocated_for(critic_trained, copied, options.optimizer_offload, on_cpu);
            Some(critic)
        } else {
            None
        };
        let layers = policy.config().num_hidden_layers as usize;
        let named = policy.trainable_parameters()?;
        let pass_bytes = crate::optimizer::zero3::pass_bytes(named.iter().map(|(n, t)| (n.as_str(), t)), layers);
        let memory_budget = MemoryBudget {
            available,
            configured: (options.micro_batching, options.pass_tokens),
            others,
            copied_reference_bytes,
            trained,
            pass_bytes,
        };
        let recompute = memory_fit::plan(options.activation_recompute, &policy, None);
        let state_memory = StateMemory::expected(trained, ZeroStage::Replicated, 1, options.optimizer_offload);
        let mut trainer = Trainer {
            policy,
            optimizer: adamw,
            schedule,
            components,
            reference,
            reference_is_base,
            critic,
            options,
            global_step: 0,
            dp: None,
            predict_zero_gradient: true,
            recompute,
            memory_budget,
            state_memory,
            memory_announced: false,
            full_shard: None,
            reference_shard: None,
        };
        trainer.fit_memory(ZeroStage::Replicated, 1, 1);
        Ok(trainer)
    }

    /// Makes this trainer one rank of a data-parallel group: rank 0's parameters, reference model, critic,
    /// optimizer state and step counters are broadcast to every rank (all ranks must have built the same models),
    /// and every later [`Trainer::train_step`] trains this rank's share of its rows (see [`crate::data_parallel`]).
    /// A group of one rank works too and changes nothing.
    pub fn with_process_group(mut self, group: trinity_collective::ProcessGroup) -> Result<Self> {
        if let Some(size) = self.options.fsdp_size
            && size < group.world_size()
            && self.options.zero_stage != ZeroStage::Replicated
        {
            return Err(TrainerError::setting(
                "fsdp_config.fsdp_size",
                format!(
                    "{size} asks for hybrid sharding (shards within groups of {size} ranks, replicated across them),                      which trinity does not implement; set it to -1 to shard over all {} ranks",
                    group.world_size()
                ),
            ));
        }
        let full_shard = self.options.zero_stage == ZeroStage::Parameters && group.world_size() > 1;
        if full_shard {
            self.check_full_shard()?;
        }
        self.dp = Some(DataParallel::new(group));
        self.broadcast_state()?;
        if full_shard {
            // Every layer recomputes in the backward: its graph cannot keep the parameters stage 3 frees.
            self.options.activation_recompute = ActivationRecompute::Always;
            self.shard_parameters()?;
        } else if let Some(dp) = &mut self.dp
            && self.options.zero_stage != ZeroStage::Replicated
            && dp.world_size() > 1
        {
            let (stage, bucket_bytes) = (self.options.zero_stage, self.options.shard_bucket_bytes);
            dp.zero = Some(Zero::new(stage, bucket_bytes, &mut self.optimizer, dp)?);
        }
        // Nothing shards a deferred state (one rank, or a replicated stage): it is allocated whole now. Under
        // stage 3 the layout holds the state and this optimizer none.
        if !full_shard {
            self.optimizer.materialize()?;
        }
        let stage = match full_shard {
            true => ZeroStage::Parameters,
            false => self.dp.as_ref().and_then(|dp| dp.zero.as_ref()).map_or(ZeroStage::Replicated, Zero::stage),
        };
        self.fit_memory(stage, self.world_size(), crate::memory::local_ranks());
        Ok(self)
    }

    /// With sharded data parallel, the bytes this rank holds for the policy's parameters, gradients and optimizer
    /// state (gradients as at the last update).
    pub fn sharded_memory(&self) -> Option<ShardedMemory> {
        if let Some(shard) = &self.full_shard {
            return Some(Self::full_shard_memory(shard));
        }
        let zero = self.dp.as_ref()?.zero.as_ref()?;
        let mut memory = zero.memory(&self.optimizer, true);
        if zero.stage() == ZeroStage::Gradients {
            memory.gradients = 4 * zero.last_gradient_elements();
        }
        Some(memory)
    }

    /// The data-parallel group, when there is one.
    pub fn process_group(&self) -> Option<&trinity_collective::ProcessGroup> {
        self.dp.as_ref().map(DataParallel::group)
    }

    /// Leaves data-parallel training and returns the group. A sharded optimizer state is gathered whole first (a
    /// collective: every rank leaves together); if that fails the trainer stays in the group and `None` is
    /// returned.
    pub fn take_process_group(&mut self) -> Option<trinity_collective::ProcessGroup> {
        if self.full_shard.is_some() {
            tracing::error!(
                "cannot leave the data-parallel group: under ZeRO stage 3 the policy's parameters exist only as \
                 the ranks' shards"
            );
            return None;
        }
        if let Some(dp) = &self.dp
            && let Some(zero) = &dp.zero
            && let Err(e) = zero.unshard(dp.group(), &mut self.optimizer)
        {
            tracing::error!("cannot leave the data-parallel group: gathering the sharded optimizer state failed: {e}");
            return None;
        }
        self.dp.take().map(DataParallel::into_group)
    }

    /// This trainer's rank (0 without a group): rank 0 writes checkpoints and reports metrics.
    pub fn rank(&self) -> usize {
        self.dp.as_ref().map_or(0, DataParallel::rank)
    }

    /// Ranks training together (1 without a group).
    pub fn world_size(&self) -> usize {
        self.dp.as_ref().map_or(1, DataParallel::world_size)
    }

    /// Copies rank 0's whole training state to every rank.
    fn broadcast_state(&mut self) -> Result<()> {
        let Some(dp) = &self.dp else { return Ok(()) };
        // A sharded state is made whole for the broadcast of rank 0's (loaded whole: `load_state`) and split
        // again after.
        if let Some(zero) = &dp.zero {
            zero.expand(&mut self.optimizer)?;
        }
        // Under stage 3 the policy's parameters and state are sharded: they were broadcast before the sharding,
        // and a loaded state reaches the ranks through `FullShard::load_from_rank_zero`.
        let mut tensors = Vec::new();
        if self.full_shard.is_none() {
            tensors = self.policy.named_parameters()?;
            tensors.extend(self.policy.lora_parameters().into_iter().map(|(n, t)| (format!("lora/{n}"), t)));
            tensors.extend(self.optimizer.state_tensors().into_iter().map(|(n, t)| (format!("optimizer/{n}"), t)));
        }
        // A sharded reference was broadcast before its sharding (it is never loaded from a checkpoint).
        if let Some(reference) = self.reference.as_ref().filter(|_| self.reference_shard.is_none()) {
            let params = reference.decoder().named_parameters()?;
            tensors.extend(params.into_iter().map(|(n, t)| (format!("reference/{n}"), t)));
        }
        let mut critic_step = 0;
        if let Some(critic) = &self.critic {
            let mut params = critic.decoder().named_parameters()?;
            let (w, b) = critic.value_head();
            params.push(("score.weight".into(), w.shallow_clone()));
            params.push(("score.bias".into(), b.shallow_clone()));
            params.extend(critic.optimizer().state_tensors().into_iter().map(|(n, t)| (format!("optimizer/{n}"), t)));
            tensors.extend(params.into_iter().map(|(n, t)| (format!("critic/{n}"), t)));
            critic_step = critic.optimizer().step_count();
        }
        dp.broadcast_from_rank_zero("trainer state", &mut tensors)?;
        let mut steps = Tensor::from_slice(&[self.global_step as i64, self.optimizer.step_count(), critic_step]);
        dp.group().broadcast(&mut steps, 0)?;
        let steps: Vec<i64> = Vec::<i64>::try_from(&steps)?;
        self.global_step = steps[0] as u64;
        self.optimizer.set_step_count(steps[1]);
        if let Some(critic) = &mut self.critic {
            critic.optimizer_mut().set_step_count(steps[2]);
        }
        if let Some(zero) = &dp.zero {
            zero.reshard(&mut self.optimizer)?;
        }
        Ok(())
    }

    /// The policy, e.g. for weight sync: `generation_decoder.copy_weights_from(trainer.policy())`. Under ZeRO
    /// stage 3 ([`Trainer::fully_sharded`]) its parameters are empty between passes: read them through
    /// [`Trainer::policy_weights`] or [`Trainer::with_whole_policy`].
    pub fn policy(&self) -> &Decoder {
        &self.policy
    }

    /// Takes the policy back.
    pub fn into_policy(self) -> Decoder {
        self.policy
    }

    /// The reference model, when the algorithm has one. Under stage 3 its parameters are empty between passes:
    /// the ranks hold its shards ([`Trainer::sharded_reference_memory`]).
    pub fn reference(&self) -> Option<&ReferenceModel> {
        self.reference.as_ref()
    }

    /// The critic, when the algorithm has one.
    pub fn critic(&self) -> Option<&Critic> {
        self.critic.as_ref()
    }

    /// The policy's optimizer (its fp32 master weights are [`AdamW::master_weights`]); under ZeRO stage 3 the
    /// one over this rank's flat shards, one entry a layer and one for the outer parameters.
    pub fn optimizer(&self) -> &AdamW {
        self.full_shard.as_ref().map_or(&self.optimizer, FullShard::optimizer)
    }

    /// The algorithm's components.
    pub fn components(&self) -> &Components {
        &self.components
    }

    /// Train steps taken (the index of the next step's learning rate).
    pub fn global_step(&self) -> u64 {
        self.global_step
    }

    /// The learning rate the next step will use.
    pub fn current_lr(&self) -> f64 {
        self.schedule.lr(self.global_step)
    }

    /// Writes the optimizer state (and the critic's weights and optimizer) into `dir`:
    /// `optimizer.safetensors`, and with a critic `critic.safetensors` (backbone + `score.*`) and
    /// `critic_optimizer.safetensors`. The policy weights themselves are the caller's to save (HF format).
    /// With a sharded optimizer state it is a collective: every rank calls it, the state is gathered to rank 0 and
    /// rank 0 writes the files, in the same format as one process (so any world size can load them).
    pub fn save_state(&self, dir: &Path) -> Result<()> {
        if let (Some(dp), Some(shard)) = (&self.dp, &self.full_shard) {
            shard.save(dp.group(), &dir.join("optimizer.safetensors"))?;
            if dp.rank() != 0 {
                return Ok(());
            }
        } else if let Some(dp) = &self.dp
            && let Some(zero) = &dp.zero
        {
            zero.save(dp.group(), &self.optimizer, &dir.join("optimizer.safetensors"))?;
            if dp.rank() != 0 {
                return Ok(());
            }
        } else {
            self.optimizer.save(&dir.join("optimizer.safetensors"))?;
        }
        if let Some(critic) = &self.critic {
            critic.optimizer().save(&dir.join("critic_optimizer.safetensors"))?;
            let weights: Vec<(String, Tensor)> = critic
                .optimizer()
                .master_weights()
                .into_iter()
                .map(|(n, t)| Ok((n, t.f_to_device(Device::Cpu)?)))
                .collect::<Result<_>>()?;
            trinity_model::write_safetensors(&dir.join("critic.safetensors"), &weights)?;
        }
        Ok(())
    }

    /// A data-parallel follower's part of rank 0's [`Trainer::save_state`]: a sharded optimizer state is gathered
    /// to rank 0 through collectives every rank must join; with a replicated one (or on rank 0) nothing happens.
    /// Under stage 3 it first joins the gathers of the HF export rank 0 writes before the state
    /// ([`Trainer::with_whole_policy`]).
    pub fn share_state_for_save(&self) -> Result<()> {
        if let (Some(dp), Some(shard)) = (&self.dp, &self.full_shard)
            && dp.rank() != 0
        {
            shard.gather_whole(dp.group(), |_| Ok(()))?;
            return shard.save(dp.group(), Path::new(""));
        }
        if let Some(dp) = &self.dp
            && let Some(zero) = &dp.zero
            && dp.rank() != 0
        {
            // Off rank 0 the gather writes nothing, so the path is never used.
            zero.save(dp.group(), &self.optimizer, Path::new(""))?;
        }
        Ok(())
    }

    /// Restores what [`Trainer::save_state`] wrote and sets the step counter to `global_step` (the
    /// checkpoint's step, kept in the caller's metadata).
    pub fn load_state(&mut self, dir: &Path, global_step: u64) -> Result<()> {
        // A sharded state is loaded whole, then split by the broadcast below.
        if let Some(zero) = self.dp.as_ref().and_then(|dp| dp.zero.as_ref()) {
            zero.expand(&mut self.optimizer)?;
        }
        let path = dir.join("optimizer.safetensors");
        if self.full_shard.is_none() {
            self.optimizer.load(&path)?;
        }
        if let Some(critic) = &mut self.critic {
            critic.load_weights(&dir.join("critic.safetensors"))?;
            critic.optimizer_mut().load(&dir.join("critic_optimizer.safetensors"))?;
        }
        self.global_step = global_step;
        // Every rank loads the same files; rank 0's copy is made authoritative anyway.
        self.broadcast_state()?;
        self.load_shards_from_rank_zero(Some(&path))
    }

    /// Stage 3: the policy's state file as rank 0 reads it (`path`; the other ranks' is ignored), each rank keeping
    /// its shards; nothing otherwise.
    fn load_shards_from_rank_zero(&mut self, path: Option<&Path>) -> Result<()> {
        match (&mut self.full_shard, &self.dp) {
            (Some(shard), Some(dp)) => shard.load_from_rank_zero(dp.group(), path),
            _ => Ok(()),
        }
    }

    /// The other side of rank 0's [`Trainer::load_state`] on a rank that does not read the checkpoint itself (it
    /// may run on a machine without the run directory): takes rank 0's whole state, step counters included.
    pub fn receive_state(&mut self) -> Result<()> {
        if self.rank() == 0 {
            return Err(TrainerError::DataParallel(
                "rank 0 loads its state; receive_state is for the other ranks".into(),
            ));
        }
        self.broadcast_state()?;
        self.load_shards_from_rank_zero(None)
    }

    /// Runs one train step on `rows` and returns its metrics.
    pub fn train_step(&mut self, rows: &[TrainRow]) -> Result<StepMetrics> {
        let start = Instant::now();
        if !std::mem::replace(&mut self.memory_announced, true) {
            tracing::info!("{}", self.state_memory.describe(self.memory_budget.trained.elements));
        }
        validate(rows, self.policy.config().vocab_size)?;
        if self.options.router_replay {
            crate::router_replay::check_rows(rows, &self.policy)?;
        }
        let n = rows.len();
        let width = rows.iter().map(TrainRow::response_length).max().unwrap_or(0);
        let w = width as i64;
        let (temperature, chunk) = (self.options.temperature, self.options.logit_chunk_tokens);
        let all: Vec<usize> = (0..n).collect();
        let mut metrics = Metrics::new();

        let mut batch = Batch::new(mask_field(rows.iter(), width)?);
        batch.old_logprob = Some(token_field(rows.iter(), width, |r| Some(&r.logprobs[..]))?);
        let every = |f: fn(&TrainRow) -> bool| rows.iter().all(f);
        if every(|r| r.advantages.is_some()) {
            batch.advantages = Some(token_field(rows.iter(), width, |r| r.advantages.as_deref())?);
        }
        if every(|r| r.token_level_rewards.is_some()) {
            batch.token_level_rewards = Some(token_field(rows.iter(), width, |r| r.token_level_rewards.as_deref())?);
        }
        if every(|r| r.teacher_logprobs.is_some()) {
            batch.teacher_logprob = Some(token_field(rows.iter(), width, |r| r.teacher_logprobs.as_deref())?);
        }
        if every(|r| r.reward.is_some()) {
            batch.reward = Some(rows.iter().map(|r| f64::from(r.reward.unwrap_or(0.0))).collect());
        }
        if every(|r| r.group_id.is_some()) {
            batch.group_id = Some(rows.iter().map(|r| r.group_id.clone().unwrap_or_default()).collect());
        }
        if every(|r| r.run_id.is_some()) {
            batch.run_id = Some(rows.iter().map(|r| r.run_id.clone().unwrap_or_default()).collect());
        }
        if every(|r| r.step.is_some()) {
            batch.step = Some(rows.iter().map(|r| r.step.unwrap_or(0)).collect());
        }
        batch.expert_mask = Some(rows.iter().map(|r| r.expert).collect());

        // Reference logprobs and critic values for every row, micro-batch by micro-batch, without gradients; with
        // `bypass_mode: false` the policy's own logprobs replace the rollout's as `old_logprob`. Data parallel:
        // each rank scores its share and the sum over ranks gathers the rows.
        // Forward only, so nothing is weighted by micro-batch: they run in passes ([`TrainerOptions::pass_tokens`]).
        let forward_micro = split(rows, &share_of(self.dp.as_ref(), &all, 1), self.options.micro_batching)?;
        let forward_batches: Vec<Vec<usize>> = passes(rows, &forward_micro, self.options.pass_tokens)
            .into_iter()
            .map(|pass| forward_micro[pass].concat())
            .collect();
        let replay = self.options.router_replay;
        let zeros = || Tensor::f_zeros([n as i64, w], (Kind::Float, Device::Cpu));
        // One micro-batch's response logprobs of `decoder` into `out`.
        let score = |decoder: &Decoder, micro: &[usize], replay: bool, out: &mut Tensor| -> Result<()> {
            let lp = pad_to(&response_logprobs(decoder, rows, micro, temperature, chunk, replay)?, w)?;
            *out = out.f_index_copy(0, &indices(micro), &lp)?;
            Ok(())
        };
        let wanted = self.policy_stats_wanted(&batch);
        if wanted.any() {
            // One pass gives the statistics the advantage function reads and, when asked, the recomputed old
            // logprobs; the rollout's stay beside them for functions that read those (Clip_B).
            let (mut lp, mut ent, mut necs) = (zeros()?, zeros()?, zeros()?);
            self.policy_forward_passes(&forward_batches, |t, micro| {
                let s = crate::policy_stats::replayed_response_stats(
                    &t.policy,
                    rows,
                    micro,
                    (temperature, chunk),
                    wanted.necs,
                    replay,
                )?;
                let idx = indices(micro);
                lp = lp.f_index_copy(0, &idx, &pad_to(&s.logprob, w)?)?;
                ent = ent.f_index_copy(0, &idx, &pad_to(&s.entropy, w)?)?;
                if let Some(x) = &s.necs {
                    necs = necs.f_index_copy(0, &idx, &pad_to(x, w)?)?;
                }
                Ok(())
            })?;
            if self.options.recompute_old_logprobs {
                batch.rollout_logprob = batch.old_logprob.replace(self.sum_over_ranks(lp)?);
            }
            batch.entropy = Some(self.sum_over_ranks(ent)?);
            batch.necs = if wanted.necs { Some(self.sum_over_ranks(necs)?) } else { None };
        } else if self.options.recompute_old_logprobs {
            let mut out = zeros()?;
            self.policy_forward_passes(&forward_batches, |t, micro| score(&t.policy, micro, replay, &mut out))?;
            batch.old_logprob = Some(self.sum_over_ranks(out)?);
        }
        if self.reference.is_some() {
            // Trinity-RFT's reference keeps its own routing; a LoRA policy's base is scored by the actor, replaying.
            let mut out = zeros()?;
            self.reference_passes(&forward_batches, |reference, micro| score(reference, micro, false, &mut out))?;
            batch.ref_logprob = Some(self.sum_over_ranks(out)?);
        } else if self.reference_is_base {
            let mut out = zeros()?;
            self.policy.without_lora(|| -> Result<()> {
                for micro in &forward_batches {
                    score(&self.policy, micro, replay, &mut out)?;
                }
                Ok(())
            })?;
            batch.ref_logprob = Some(self.sum_over_ranks(out)?);
        }
        if let Some(critic) = &self.critic {
            let mut out = Tensor::f_zeros([n as i64, w], (Kind::Float, Device::Cpu))?;
            for micro in &forward_batches {
                out = out.f_index_copy(0, &indices(micro), &pad_to(&critic.values(rows, micro)?, w)?)?;
            }
            batch.values = Some(self.sum_over_ranks(out)?);
        }

        let (active, returns) = self.advantages(&mut batch, &mut metrics)?;
        let is_weights = self.rollout_correction(rows, width, &mut batch, &mut metrics)?;
        // veRL's update: `ppo_epochs` passes over the step's rows, each pass one optimizer step per mini-batch,
        // gradients accumulated over the mini-batch's micro-batches. The learning rate is the train step's for
        // every optimizer step in it (the schedule advances once per train step, as veRL's scheduler does).
        let lr = self.schedule.lr(self.global_step);
        let mini_batches = self.mini_batches(&active);
        let mut means = MetricMeans::default();
        let (mut grad_norms, mut micro_count, mut forward_only) = (Vec::new(), 0usize, 0usize);
        // DPO rows come as (chosen, rejected) pairs that must share a micro-batch, in order (and a rank's share).
        let dpo = self.components.policy_loss.name == "dpo";
        let how = if dpo { MicroBatching::Rows(2) } else { self.options.micro_batching };
        let unit = if dpo { 2 } else { 1 };
        let micro_batches_of = |mini: &[usize]| split(rows, mini, how);
        let critic_share = share_of(self.dp.as_ref(), &active, unit);
        // Every rank counts the whole step's rows and tokens itself: the loss denominators are global.
        let counts = RowCounts::new(&batch.action_mask, batch.expert_mask.as_deref().unwrap_or(&[]))?;
        // veRL updates the critic first, over the whole step (Trinity-RFT sets its mini-batch to the train batch),
        // `critic.ppo_epochs` times (unset: the actor's epochs).
        if let Some(critic) = &mut self.critic {
            let returns = returns.as_ref().ok_or_else(|| {
                TrainerError::InvalidBatch("the critic needs returns from a trainer-side advantage function".into())
            })?;
            let values = batch.values.as_ref().ok_or_else(|| TrainerError::InvalidBatch("no critic values".into()))?;
            let critic_micro_batches = micro_batches_of(&critic_share)?;
            for _epoch in 0..self.options.critic_epochs.unwrap_or(self.options.ppo_epochs).max(1) {
                let update = critic.update(
                    rows,
                    &critic_micro_batches,
                    returns,
                    values,
                    &batch.action_mask,
                    self.components.loss_agg_mode,
                    &counts,
                    counts.of(&active, false),
                    self.global_step,
                    self.dp.as_ref(),
                )?;
                means.add("critic/", update.metrics);
            }
        }
        // Critic warm-up (veRL's `critic_warmup <= global_steps`, this step being `global_step + 1`).
        let actor_epochs = match self.critic.is_some() && self.options.critic_warmup > self.global_step + 1 {
            true => 0,
            false => self.options.ppo_epochs.max(1),
        };
        metrics.insert("actor/updated".into(), f64::from(u8::from(actor_epochs > 0)));
        for _epoch in 0..actor_epochs {
            for mini in &mini_batches {
                let micro_batches = micro_batches_of(&share_of(self.dp.as_ref(), mini, unit))?;
                micro_count += micro_batches.len();
                let (whole, usual) = (counts.of(mini, false), counts.of(mini, true));
                let is_weights = is_weights.as_ref();
                let mini = actor::MiniBatch { rows, batch: &batch, counts: &counts, whole, usual, is_weights };
                forward_only += self.update_actor(&mini, &micro_batches, &mut means)?;
                let grad_norm = match (&self.dp, &mut self.full_shard) {
                    (Some(dp), Some(shard)) => shard.step(dp.group(), self.options.grad_clip, lr)?,
                    (Some(dp), None) => dp.optimizer_step(&mut self.optimizer, self.options.grad_clip, lr)?,
                    (None, _) => {
                        let norm = self.optimizer.clip_grad_norm(self.options.grad_clip)?;
                        if norm.is_finite() {
                            self.optimizer.step(lr)?;
                        }
                        norm
                    }
                };
                self.optimizer.zero_grad();
                grad_norms.push(grad_norm);
            }
        }
        if let Some(dp) = &self.dp {
            means = MetricMeans(dp.pool_metrics(&means.0)?);
            let mut count = Tensor::from_slice(&[micro_count as i64]);
            dp.sum(&mut count)?;
            micro_count = count.f_int64_value(&[0])? as usize;
        }
        means.into_metrics(&mut metrics);
        self.global_step += 1;
        let grad_norm = grad_norms.iter().sum::<f64>() / grad_norms.len().max(1) as f64;

        let tokens: usize = active.iter().map(|&i| rows[i].tokens.len()).sum();
        let seconds = start.elapsed().as_secs_f64();
        metrics.insert("actor/grad_norm".into(), grad_norm);
        metrics.insert("actor/lr".into(), lr);
        metrics.insert("perf/step_time_s".into(), seconds);
        metrics.insert("perf/total_num_tokens".into(), tokens as f64);
        metrics.insert("perf/tokens_per_s".into(), tokens as f64 / seconds.max(1e-9));
        metrics.insert("perf/micro_batches".into(), micro_count as f64);
        metrics.insert("perf/forward_only_rows".into(), forward_only as f64);
        metrics.insert("actor/optimizer_steps".into(), grad_norms.len() as f64);
        metrics.insert("perf/rows".into(), active.len() as f64);
        Ok(metrics)
    }

    /// `out` summed over the data-parallel ranks (each filled its share's rows), or as it is without a group.
    fn sum_over_ranks(&self, mut out: Tensor) -> Result<Tensor> {
        if let Some(dp) = &self.dp {
            dp.sum(&mut out)?;
        }
        Ok(out)
    }

    /// The step's rows cut into mini-batches of `options.mini_batch_rows` (in order; the last may be shorter), one
    /// optimizer step each; all rows in one mini-batch when unset. For DPO the size counts (chosen, rejected) pairs,
    /// as veRL multiplies `ppo_mini_batch_size` by the rollout count (2 for DPO): a step of `train_batch_size`
    /// pairs is then one optimizer step, as in Trinity-RFT.
    fn mini_batches(&self, active: &[usize]) -> Vec<Vec<usize>> {
        let Some(size) = self.options.mini_batch_rows else {
            return vec![active.to_vec()];
        };
        let pairs = self.components.policy_loss.name == "dpo";
        let size = if pairs { 2 * size.max(1) } else { size.max(1) };
        active.chunks(size).map(<[usize]>::to_vec).collect()
    }

    /// Step 3b of the module docs: with recomputed old logprobs, compares them with the rollout's
    /// ([`trinity_algorithm::rollout_correction`]): rejected tokens leave `batch.action_mask` (so every loss term,
    /// the critic's too, and their denominators skip them), the `rollout_corr/*` metrics are added, and the
    /// importance weights are returned for the policy loss. As in veRL, nothing happens when a row has no rollout
    /// logprobs (SFT rows).
    fn rollout_correction(
        &self,
        rows: &[TrainRow],
        width: usize,
        batch: &mut Batch,
        metrics: &mut Metrics,
    ) -> Result<Option<Tensor>> {
        let Some(settings) = &self.options.rollout_correction else { return Ok(None) };
        let (Some(old), false) = (&batch.old_logprob, rows.iter().any(|r| r.logprobs.is_empty())) else {
            return Ok(None);
        };
        let rollout = token_field(rows.iter(), width, |r| Some(&r.logprobs[..]))?;
        let correction = tch::no_grad(|| {
            trinity_algorithm::rollout_correction::correct(settings, old, &rollout, &batch.action_mask)
        });
        batch.action_mask = correction.mask.f_to_kind(batch.action_mask.kind())?;
        metrics.extend(correction.metrics);
        Ok(correction.weights)
    }

    /// The policy statistics the step's advantage function reads, when step 3 will run it on `batch`.
    fn policy_stats_wanted(&self, batch: &Batch) -> PolicyStats {
        let Some((adv, in_trainer)) = &self.components.advantage else { return PolicyStats::default() };
        let runs = *in_trainer && self.components.compute_advantage_in_trainer;
        if !runs || batch.advantages.is_some() || self.components.schema != ExperienceSchema::Experience {
            return PolicyStats::default();
        }
        adv.f.policy_stats()
    }

    /// Step 3 of the module docs: fills `batch.advantages` unless present; returns the rows that train (indices
    /// into the input, repeats allowed) and the returns when an advantage function ran.
    fn advantages(&mut self, batch: &mut Batch, metrics: &mut Metrics) -> Result<(Vec<usize>, Option<Tensor>)> {
        let all: Vec<usize> = (0..batch.rows()).collect();
        if batch.advantages.is_some() || self.components.schema != ExperienceSchema::Experience {
            return Ok((all, None));
        }
        let Some((adv, in_trainer)) = &self.components.advantage else { return Ok((all, None)) };
        let in_trainer = *in_trainer;
        if in_trainer && !self.components.compute_advantage_in_trainer {
            // The preset does not use this (fallback) advantage function; e.g. raft trains with sft.
            return Ok((all, None));
        }
        if in_trainer && let Some(penalty) = self.components.kl_penalty.as_mut() {
            let scores = batch.token_level_scores(&adv.name)?;
            let (penalized, m) = penalty.f.apply_penalty(batch, &scores, &penalty.name)?;
            batch.token_level_rewards = Some(penalized);
            metrics.extend(m.into_iter().map(|(k, v)| (format!("advantage/{k}"), v)));
        }
        let out = tch::no_grad(|| adv.f.compute(batch))?;
        let prefix = if in_trainer { "advantage/" } else { "" };
        metrics.extend(out.metrics.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)));
        batch.advantages = Some(out.advantages);
        // Clip_B and Clip_V narrow the training mask, as Trinity-RFT rewrites `response_mask`: every loss term and
        // its denominator then skip the tokens they filter out.
        if let Some(mask) = out.action_mask {
            batch.action_mask = mask.f_to_kind(batch.action_mask.kind())?;
        }
        let active = match out.rows {
            Some(r) => r.into_iter().map(|i| i as usize).collect(),
            None => all,
        };
        Ok((active, Some(out.returns)))
    }
}
