//! Data-parallel training: several trainer processes (ranks) share each train step's rows and keep identical
//! parameters, over a [`ProcessGroup`]: Gloo when the ranks train on the CPU, NCCL when each trains on its own GPU
//! (`cuda:LOCAL_RANK`; the group is built by `DistEnv::process_group_on`, see `trinity_collective::transport`).
//! Parameters and gradients are handed to the group on the device they live on, so on CUDA they never pass
//! through host memory; the small control tensors (layout checks, gradient presence, metrics, shared rows) are CPU
//! tensors and go over Gloo in the same group.
//!
//! Contract: every rank calls [`crate::Trainer::train_step`] with the **same** rows (the whole step; rank 0 may read
//! them and hand them to the others with [`share_rows`]). Everything that depends on the whole batch (advantages,
//! mini-batch boundaries, the rows a group function drops) is then computed identically everywhere, and each rank
//! trains only its share:
//! - Forward-only passes (reference logprobs, critic values, recomputed old logprobs): rank r scores its contiguous
//!   share of the rows; the `[N, R]` results are summed over ranks (each row is non-zero on exactly one rank, so the
//!   sum is a gather).
//! - Each mini-batch is cut into contiguous shares (`⌈n/world⌉` or `⌊n/world⌋` rows; DPO pairs stay together), each
//!   rank forms its micro-batches from its share.
//!
//! **Averaging rule.** Each term of a micro-batch's loss is weighted by the micro-batch's share of the whole
//! mini-batch's denominator under the term's aggregation: its trained tokens over the mini-batch's for
//! `token-mean`, its rows over the mini-batch's for the seq-mean modes, 1 for `seq-mean-token-sum-norm`
//! ([`crate::loss_weight`]). The denominators are global: every rank holds the whole step's rows and counts them
//! itself, so this needs no collective. The ranks' gradients are then **summed**, and the result is the gradient
//! of the one-process loss over the whole mini-batch in one micro-batch, whatever the world size, the shares or the
//! micro-batches (a token budget packs them per share), up to the order of floating-point sums. (Averaging the
//! ranks' gradients instead, as DDP does, would be right only for equal shares; veRL's newer actors multiply by
//! `dp_size` for it.) The logged loss is the sum of the weighted contributions, so it is the one-process value too.
//!
//! Gradients are reduced in fp32 (bf16 gradients are widened first, as FSDP's `reduce_dtype=fp32` in veRL) in
//! buckets of [`DataParallel::bucket_bytes`], after every micro-batch of the mini-batch and before clipping: the
//! gradient norm, the clipping and the AdamW update then see identical gradients on every rank, so parameters stay
//! bit-identical. A parameter that has a gradient on any rank gets one on every rank (zeros where it had none), so
//! a rank with an empty share still takes the same optimizer step. Metric means are pooled over all ranks'
//! micro-batches, with their weights.
//!
//! **Sharded** ([`crate::TrainerOptions::zero_stage`], [`crate::optimizer::zero`]): the same step, with AdamW's
//! state (stage 1) and the reduced gradients (stage 2) split over the ranks; each rank updates its shard and the
//! parameters are all-gathered, so they stay identical on every rank.

use std::collections::BTreeMap;
use std::ops::Range;

use tch::{Kind, Tensor};
use trinity_collective::{ProcessGroup, ReduceOp};

use crate::error::{Result, TrainerError};
use crate::optimizer::AdamW;
use crate::optimizer::zero::Zero;

/// Gradient bucket size: a few MiB, so the reduction of one bucket overlaps the packing of the next.
pub const DEFAULT_GRAD_BUCKET_BYTES: usize = 4 << 20;

/// A trainer's process group and how it reduces.
#[derive(Debug)]
pub struct DataParallel {
    group: ProcessGroup,
    /// Gradient and parameter buckets, in bytes (also the buckets of the sharded layout).
    pub bucket_bytes: usize,
    /// Sharded data parallel of the policy's optimizer ([`crate::optimizer::zero`]); `None`: replicated.
    pub(crate) zero: Option<Zero>,
}

/// The contiguous share of `0..n` that `rank` of `world` takes, in units of `unit` items (DPO pairs: 2).
pub fn share(n: usize, rank: usize, world: usize, unit: usize) -> Range<usize> {
    let unit = unit.max(1);
    let units = n.div_ceil(unit);
    let (base, extra) = (units / world, units % world);
    let start = rank * base + rank.min(extra);
    let end = start + base + usize::from(rank < extra);
    (start * unit).min(n)..(end * unit).min(n)
}

impl DataParallel {
    pub fn new(group: ProcessGroup) -> Self {
        DataParallel { group, bucket_bytes: DEFAULT_GRAD_BUCKET_BYTES, zero: None }
    }

    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    pub fn into_group(self) -> ProcessGroup {
        self.group
    }

    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }

    /// This rank's items of `items` (see [`share`]).
    pub fn my_share<T: Clone>(&self, items: &[T], unit: usize) -> Vec<T> {
        items[share(items.len(), self.rank(), self.world_size(), unit)].to_vec()
    }

    /// Sums `t` over the ranks in place.
    pub fn sum(&self, t: &mut Tensor) -> Result<()> {
        Ok(self.group.allreduce(t, ReduceOp::Sum)?)
    }

    /// Broadcasts `tensors` from rank 0 in place, after checking that every rank holds the same names, shapes and
    /// dtypes (a mismatch fails on every rank instead of corrupting memory or hanging).
    pub fn broadcast_from_rank_zero(&self, what: &str, tensors: &mut [(String, Tensor)]) -> Result<()> {
        let layout: String = tensors.iter().map(|(n, t)| format!("{n}:{:?}:{:?};", t.size(), t.kind())).collect();
        let root = self.group.broadcast_bytes(layout.as_bytes(), 0)?;
        let mut mismatch = Tensor::from_slice(&[i32::from(root != layout.as_bytes())]);
        self.group.allreduce(&mut mismatch, ReduceOp::Max)?;
        if mismatch.f_int64_value(&[0])? != 0 {
            return Err(TrainerError::DataParallel(format!(
                "the ranks hold different {what} (names, shapes or dtypes); every rank must build the same model"
            )));
        }
        // On their own device: NCCL broadcasts CUDA parameters in place, Gloo CPU ones.
        let mut flat: Vec<Tensor> = Vec::with_capacity(tensors.len());
        for (_, t) in tensors.iter() {
            flat.push(if t.is_contiguous() { t.f_detach()? } else { t.f_contiguous()? });
        }
        self.group.broadcast_buckets(&mut flat, 0, self.bucket_bytes.max(1 << 20) * 8)?;
        tch::no_grad(|| -> Result<()> {
            for ((_, t), received) in tensors.iter_mut().zip(&flat) {
                if t.data_ptr() != received.data_ptr() {
                    t.f_copy_(received)?;
                }
            }
            Ok(())
        })
    }

    /// Whether each of `params` has a gradient on any rank.
    pub(crate) fn gradients_anywhere(&self, params: &[Tensor]) -> Result<Vec<bool>> {
        let has: Vec<f32> = params.iter().map(|p| if p.grad().defined() { 1.0 } else { 0.0 }).collect();
        let mut any = Tensor::from_slice(&has);
        self.group.allreduce(&mut any, ReduceOp::Max)?;
        Ok(Vec::<f32>::try_from(&any)?.into_iter().map(|a| a != 0.0).collect())
    }

    /// The optimizer step of a mini-batch whose backward passes are done on every rank: gradients reduced over
    /// the ranks, clipped to `max_norm` by their global norm, and `optimizer` updated with `lr` unless the norm is
    /// not finite; sharded ([`crate::optimizer::zero`]) when this group shards the optimizer. Returns the norm.
    pub(crate) fn optimizer_step(&self, optimizer: &mut AdamW, max_norm: f64, lr: f64) -> Result<f64> {
        if let Some(zero) = &self.zero {
            return zero.step(self, optimizer, max_norm, lr);
        }
        self.reduce_gradients(&optimizer.param_vars())?;
        let norm = optimizer.clip_grad_norm(max_norm)?;
        if norm.is_finite() {
            optimizer.step(lr)?;
        }
        Ok(norm)
    }

    /// Sums the gradients of `params` over the ranks, in fp32 buckets (see the module docs).
    pub fn reduce_gradients(&self, params: &[Tensor]) -> Result<()> {
        let any = self.gradients_anywhere(params)?;
        let mut grads = Vec::new();
        let mut targets = Vec::new();
        for (p, &wanted) in params.iter().zip(&any) {
            if !wanted {
                continue;
            }
            let mut g = p.grad();
            if !g.defined() {
                // Defines a zero gradient: tch has no setter for `.grad`, and a backward of 0·Σp accumulates zeros.
                (p.f_sum(p.kind())? * 0.0).f_backward()?;
                g = p.grad();
            }
            // Widened on the gradient's own device (a CUDA gradient stays on its GPU for NCCL).
            let wide = if g.kind() == Kind::Float && g.is_contiguous() {
                g.shallow_clone()
            } else {
                g.f_to_kind(Kind::Float)?.f_contiguous()?
            };
            grads.push(wide);
            targets.push(g);
        }
        self.group.allreduce_buckets(&mut grads, ReduceOp::Sum, self.bucket_bytes)?;
        tch::no_grad(|| -> Result<()> {
            for (mut g, reduced) in targets.into_iter().zip(&grads) {
                if g.data_ptr() != reduced.data_ptr() {
                    g.f_copy_(reduced)?;
                }
            }
            Ok(())
        })
    }

    /// Pools per-rank weighted metric sums and weights (name → (Σ weight · value, Σ weight)) into the same totals
    /// on every rank.
    pub fn pool_metrics(&self, local: &BTreeMap<String, (f64, f64)>) -> Result<BTreeMap<String, (f64, f64)>> {
        let mut bytes = Vec::new();
        for (name, (sum, weight)) in local {
            bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
            bytes.extend_from_slice(name.as_bytes());
            bytes.extend_from_slice(&sum.to_le_bytes());
            bytes.extend_from_slice(&weight.to_le_bytes());
        }
        let mut pooled: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for part in self.group.allgather_bytes(&bytes)? {
            let mut rest = &part[..];
            while !rest.is_empty() {
                let bad = || TrainerError::DataParallel("a rank sent malformed metrics".into());
                let take = |rest: &mut &[u8], n: usize| -> Result<Vec<u8>> {
                    if rest.len() < n {
                        return Err(bad());
                    }
                    let (head, tail) = rest.split_at(n);
                    *rest = tail;
                    Ok(head.to_vec())
                };
                let len = u32::from_le_bytes(take(&mut rest, 4)?.try_into().map_err(|_| bad())?) as usize;
                let name = String::from_utf8(take(&mut rest, len)?).map_err(|_| bad())?;
                let sum = f64::from_le_bytes(take(&mut rest, 8)?.try_into().map_err(|_| bad())?);
                let weight = f64::from_le_bytes(take(&mut rest, 8)?.try_into().map_err(|_| bad())?);
                let e = pooled.entry(name).or_default();
                e.0 += sum;
                e.1 += weight;
            }
        }
        Ok(pooled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_everything_once_and_keep_pairs() {
        for (n, world, unit) in [(8, 2, 1), (5, 2, 1), (1, 3, 1), (0, 2, 1), (10, 3, 2), (6, 4, 2)] {
            let parts: Vec<Range<usize>> = (0..world).map(|r| share(n, r, world, unit)).collect();
            let mut next = 0;
            for p in &parts {
                assert_eq!(p.start, next, "{n} {world} {unit}: {parts:?}");
                assert!(p.start % unit == 0);
                next = p.end;
            }
            assert_eq!(next, n);
            let sizes: Vec<usize> = parts.iter().map(|p| p.len()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= unit, "{sizes:?}");
        }
        assert_eq!(share(5, 0, 2, 1), 0..3);
        assert_eq!(share(5, 1, 2, 1), 3..5);
    }
}
