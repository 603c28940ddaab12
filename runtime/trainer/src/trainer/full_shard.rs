//! The trainer under ZeRO stage 3 ([`crate::optimizer::zero3::FullShard`]): which passes run inside a sharded
//! pass, how ranks with fewer passes keep the collectives matched, and what reads the whole policy outside a pass.
//!
//! Every pass of the policy (the actor's training passes, and the forward-only passes that give recomputed old
//! logprobs and the policy statistics) runs inside [`FullShard::pass`], so each layer is gathered around its
//! computations. Ranks train shares of different lengths, so before each group of passes the ranks agree on the
//! most passes any of them runs, and one with fewer runs [`FullShard::idle_pass`]es for the rest: the same
//! collectives in the same order on every rank. What reads the whole policy between passes (the weights handed to
//! the explorer, the HF export of a checkpoint) gathers it unit by unit, a collective every rank joins: rank 0
//! through [`Trainer::policy_parts`] / [`Trainer::with_whole_policy`], the others through
//! [`Trainer::share_whole_policy`].
//!
//! The KL reference model is sharded too, as a frozen layout ([`FullShard::frozen`]): its forward-only passes
//! gather each layer the same way, with idle passes for the ranks with fewer, so a rank holds its share of the
//! reference instead of a whole copy (FSDP shards veRL's reference the same way). The critic stays whole.
//!
//! Stage 3 trains with activation recomputation always on (a layer's freed parameters cannot be kept by a graph),
//! runs every row of a training pass with autograd (a pass is one forward and one backward of every layer), and
//! refuses what cannot work that way: LoRA (its frozen base is not sharded: use stage 2) and the mixture-of-experts
//! load-balancing loss (it needs the layers' activations kept).

use tch::Tensor;
use trinity_collective::ReduceOp;

use super::Trainer;
use crate::error::{Result, TrainerError};
use crate::optimizer::zero3::FullShard;

impl Trainer {
    /// Whether the policy's parameters are sharded (stage 3 over more than one rank).
    pub fn fully_sharded(&self) -> bool {
        self.full_shard.is_some()
    }

    /// What stage 3 cannot train, refused by the key that asks for it.
    pub(super) fn check_full_shard(&self) -> Result<()> {
        let setting = "trainer.trainer_strategy (fsdp/fsdp2: ZeRO stage 3 over several ranks)";
        if self.policy.has_lora() {
            return Err(TrainerError::setting(
                setting,
                "stage 3 shards the trained parameters layer by layer, and a LoRA policy trains only its adapters \
                 over a frozen base it would keep whole on every rank: set fsdp_config.reshard_after_forward: false \
                 (stage 2, which shards the adapters' optimizer state)",
            ));
        }
        if crate::router_replay::aux_loss_coef(&self.policy).is_some() {
            return Err(TrainerError::setting(
                setting,
                "the model's config.json trains the load-balancing loss (output_router_logits), whose backward needs \
                 the layers' activations kept, while stage 3 recomputes every layer: set fsdp_config.\
                 reshard_after_forward: false (stage 2) or output_router_logits to false",
            ));
        }
        if !trinity_model::activation_recompute_available() {
            return Err(TrainerError::setting(
                setting,
                "stage 3 needs activation recomputation, which this build lacks (it was built without libtorch's \
                 headers): set fsdp_config.reshard_after_forward: false (stage 2)",
            ));
        }
        Ok(())
    }

    /// Shards the policy's parameters over the group (after the start's broadcast made them rank 0's on every
    /// rank) and frees the whole ones.
    pub(super) fn shard_parameters(&mut self) -> Result<()> {
        let Some(dp) = &self.dp else { return Ok(()) };
        let layers = self.policy.config().num_hidden_layers as usize;
        let params = self.policy.trainable_parameters()?;
        let shard =
            FullShard::new(params, layers, self.optimizer.settings(), self.options.optimizer_offload, dp.group())?;
        self.full_shard = Some(shard);
        // One forward and one backward per layer in a training pass: every row keeps its graph.
        self.predict_zero_gradient = false;
        if let Some(reference) = &self.reference {
            let layers = reference.decoder().config().num_hidden_layers as usize;
            let params = reference.decoder().named_parameters()?;
            let whole: i64 = params.iter().map(|(_, t)| (t.numel() * t.kind().elt_size_in_bytes()) as i64).sum();
            let shard = FullShard::frozen(params, layers, dp.group())?;
            let memory = shard.memory();
            let gib = |b: i64| b as f64 / f64::from(1u32 << 30);
            tracing::info!(
                "ZeRO stage 3 shards the KL reference model too: {:.2} GiB a rank instead of {:.2} GiB whole, each \
                 layer gathered around its forward",
                gib(memory.parameter_shards),
                gib(whole),
            );
            // The copy counted whole in what the trainer allocates is now a share, and a pass's units beside it.
            let budget = &mut self.memory_budget;
            let copied = budget.copied_reference_bytes;
            let kept = (memory.parameter_shards + memory.pass_parameters) as u64;
            budget.others = budget.others.saturating_sub(copied) + kept.min(copied);
            budget.copied_reference_bytes = kept.min(copied);
            self.reference_shard = Some(shard);
        }
        Ok(())
    }

    /// The KL reference's forward-only passes over `batches` (this rank's), `f` once per batch with the whole
    /// reference: under stage 3 inside passes of its sharded layout, with idle ones after them to the most any
    /// rank runs, so every rank joins the same gathers; directly otherwise.
    pub(super) fn reference_passes(
        &mut self,
        batches: &[Vec<usize>],
        mut f: impl FnMut(&trinity_model::Decoder, &[usize]) -> Result<()>,
    ) -> Result<()> {
        let most = match self.reference_shard {
            Some(_) => self.most_passes(batches.len())?,
            None => batches.len(),
        };
        let Some(reference) = &self.reference else { return Ok(()) };
        let (Some(shard), Some(dp)) = (&mut self.reference_shard, &self.dp) else {
            return batches.iter().try_for_each(|batch| f(reference.decoder(), batch));
        };
        for batch in batches {
            shard.pass(dp.group(), false, || f(reference.decoder(), batch))??;
        }
        for _ in batches.len()..most {
            shard.idle_pass(dp.group(), false)?;
        }
        Ok(())
    }

    /// Under stage 3, what this rank holds of the KL reference model: its shards between passes.
    pub fn sharded_reference_memory(&self) -> Option<crate::optimizer::zero3::FullShardMemory> {
        self.reference_shard.as_ref().map(FullShard::memory)
    }

    /// Runs `f` on the trainer inside one pass of the sharded policy (`train`: with its backward), or directly
    /// when nothing is sharded. `f` runs without the data-parallel group: a pass computes, it does not reduce.
    pub(super) fn sharded_pass<R>(&mut self, train: bool, f: impl FnOnce(&mut Trainer) -> Result<R>) -> Result<R> {
        let Some(mut shard) = self.full_shard.take() else { return f(self) };
        let Some(dp) = self.dp.take() else {
            self.full_shard = Some(shard);
            return f(self);
        };
        let out = shard.pass(dp.group(), train, || f(self));
        self.dp = Some(dp);
        self.full_shard = Some(shard);
        out?
    }

    /// With a sharded policy: the most of `mine` (this rank's pass count) over the ranks, so that every rank
    /// runs that many, idle ones included; `mine` otherwise.
    pub(super) fn most_passes(&self, mine: usize) -> Result<usize> {
        let (Some(_), Some(dp)) = (&self.full_shard, &self.dp) else { return Ok(mine) };
        let mut most = Tensor::from_slice(&[mine as i64]);
        dp.group().allreduce(&mut most, ReduceOp::Max)?;
        Ok(most.f_int64_value(&[0])? as usize)
    }

    /// `count` idle passes of the sharded policy (see the module docs); nothing when it is not sharded.
    pub(super) fn idle_passes(&mut self, count: usize, train: bool) -> Result<()> {
        let (Some(shard), Some(dp)) = (&mut self.full_shard, &self.dp) else { return Ok(()) };
        for _ in 0..count {
            shard.idle_pass(dp.group(), train)?;
        }
        Ok(())
    }

    /// The policy's forward-only passes over `batches` (this rank's), `f` once per batch on a whole policy: inside
    /// sharded passes, with idle ones after them to the most any rank runs, when stage 3 shards it.
    pub(super) fn policy_forward_passes(
        &mut self,
        batches: &[Vec<usize>],
        mut f: impl FnMut(&Trainer, &[usize]) -> Result<()>,
    ) -> Result<()> {
        let most = self.most_passes(batches.len())?;
        for batch in batches {
            self.sharded_pass(false, |t| f(t, batch))?;
        }
        self.idle_passes(most - batches.len(), false)
    }

    /// The policy's weights by HF name, all at once: [`Trainer::policy_parts`] collected, so under stage 3 the
    /// model is whole on this rank in the copies (its own parameters stay sharded). What can take the weights
    /// part by part (the explorer's engine, the weight files and the process group of a sync) should.
    pub fn policy_weights(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        let collected: std::result::Result<(), std::convert::Infallible> = self.policy_parts(|part| {
            out.extend(part);
            Ok(())
        })?;
        let Ok(()) = collected;
        Ok(out)
    }

    /// The names, dtypes and shapes of what [`Trainer::policy_parts`] hands out, in that order, without
    /// gathering anything: enough to lay out a file or a transfer before the first part exists.
    pub fn policy_layout(&self) -> Result<Vec<trinity_model::TensorSpec>> {
        if let (Some(shard), Some(_)) = (&self.full_shard, &self.dp) {
            return Ok(shard.layout());
        }
        let params = self.policy.named_parameters()?;
        Ok(params.iter().map(|(name, t)| trinity_model::TensorSpec::of(name, t)).collect())
    }

    /// Hands the policy's weights by HF name to `consume`, part by part, in [`Trainer::policy_layout`]'s order:
    /// one part holding everything when the policy is whole (the parameters themselves, valid until the next
    /// train step; with LoRA the adapters merged), or under stage 3 one part per unit as it is gathered (a
    /// collective: the other ranks call [`Trainer::share_whole_policy`]), so that at most one unit is whole
    /// here beyond what `consume` keeps. The parts are handles of their own: the trainer freeing a unit does not
    /// touch them.
    ///
    /// `consume`'s first error stops the consuming but not the gathers, which every rank must finish; it is the
    /// inner result. The outer one is the trainer's (a failed collective).
    pub fn policy_parts<E>(
        &self,
        mut consume: impl FnMut(Vec<(String, Tensor)>) -> std::result::Result<(), E>,
    ) -> Result<std::result::Result<(), E>> {
        let (Some(shard), Some(dp)) = (&self.full_shard, &self.dp) else {
            return Ok(consume(self.policy.merged_parameters()?));
        };
        let mut consumed = Ok(());
        shard.gather_whole(dp.group(), |unit| {
            if consumed.is_ok() {
                let part = unit.iter().map(|(name, t)| Ok((name.clone(), t.f_detach()?))).collect::<Result<_>>()?;
                consumed = consume(part);
            }
            Ok(())
        })?;
        Ok(consumed)
    }

    /// Runs `f` with the whole policy: under stage 3 its parameters are gathered into the model for as long as `f`
    /// runs (a collective: the other ranks call [`Trainer::share_whole_policy`]) and freed after.
    pub fn with_whole_policy<R>(&self, f: impl FnOnce(&trinity_model::Decoder) -> R) -> Result<R> {
        match (&self.full_shard, &self.dp) {
            (Some(shard), Some(dp)) => shard.whole(dp.group(), || f(&self.policy)),
            _ => Ok(f(&self.policy)),
        }
    }

    /// A rank's part of rank 0's [`Trainer::policy_weights`] or [`Trainer::with_whole_policy`] under stage 3 (the
    /// same gathers, their results dropped); nothing otherwise.
    pub fn share_whole_policy(&self) -> Result<()> {
        match (&self.full_shard, &self.dp) {
            (Some(shard), Some(dp)) => shard.gather_whole(dp.group(), |_| Ok(())),
            _ => Ok(()),
        }
    }

    /// Stage 3's memory report: the rank's parameter shards, its fp32 gradient shards (as at an update) and its
    /// part of AdamW's state.
    pub(super) fn full_shard_memory(shard: &FullShard) -> crate::ShardedMemory {
        let memory = shard.memory();
        let shard_elements: i64 = shard.optimizer().param_vars().iter().map(|t| t.numel() as i64).sum();
        crate::ShardedMemory {
            parameters: memory.parameter_shards,
            gradients: 4 * shard_elements,
            optimizer_state: memory.optimizer_state,
        }
    }
}
