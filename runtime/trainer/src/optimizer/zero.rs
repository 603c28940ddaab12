//! Sharded data parallel, ZeRO stages 1 and 2 (what FSDP's `SHARD_GRAD_OP`, `reshard_after_forward: false`, gives
//! veRL): AdamW's moments and fp32 master weights, and in stage 2 the reduced gradients, are split over the
//! data-parallel ranks; the parameters stay whole on every rank.
//!
//! **Layout.** The trainable parameters are cut into buckets of consecutive parameters (one dtype and device, at
//! most [`crate::TrainerOptions::shard_bucket_bytes`], as [`trinity_collective::bucket::plan`]); each bucket's flattened elements are cut
//! into `world` equal chunks of `⌈n/world⌉` (the last padded), and rank r owns chunk r of every bucket. A parameter
//! that straddles a chunk boundary is shared: each rank owns the contiguous range of its elements that falls in
//! its chunk. The layout depends only on the parameters' order, dtypes and sizes, so ranks agree on it without
//! talking, and every rank holds about 1/world of the state whatever the sizes of single parameters.
//!
//! **A step.** After the backward of every micro-batch of a mini-batch:
//! - stage 1: gradients are all-reduced as without sharding ([`DataParallel::reduce_gradients`]); each rank reads
//!   its shard of them;
//! - stage 2: each bucket's gradients (widened to fp32, zeros where a rank has none) are reduce-scattered into the
//!   rank's chunk, and the parameters' own gradients are released, bucket by bucket: the rank keeps only its
//!   shard's gradient, in fp32;
//! - clipping takes the global norm from the shards (each rank's sum of squares, summed over the ranks), so it is
//!   the one-process norm up to the order of the sum;
//! - each rank updates its shard (moments, master, and the parameter's elements), and each bucket's updated chunks
//!   are all-gathered into every rank's parameters.
//!
//! A parameter without a gradient on any rank is left alone, as without sharding.
//!
//! **Checkpoints** keep the one-process format: [`Zero::save`] gathers the state to rank 0 bucket by bucket (a
//! collective: every rank calls it), and a loaded or broadcast state is whole on every rank for the moment it
//! takes ([`Zero::expand`]) and then split again ([`Zero::reshard`]), so a run saved on N ranks resumes on any
//! number. That moment holds the whole state on every rank. A fresh state is never whole: the trainer builds it
//! [`AdamW::deferred`] and [`Zero::new`] allocates only the rank's shards.
//!
//! **Offload** (`optimizer_offload`): the shards of moments and masters live in host memory like the whole state
//! ([`super`]); gradients are reduced on the parameters' device and each shard's update copies its gradient to
//! the host, and the state's gathers for checkpoints run on the host.
//!
//! Not here: stage 3 (parameters sharded and gathered per layer: [`super::zero3`]), gradients reduced per bucket
//! during the backward (the full gradients exist until it ends), and the critic's optimizer, which stays
//! replicated.

use std::ops::Range;
use std::path::Path;

use tch::{Device, Kind, Tensor};
use trinity_collective::{ProcessGroup, ReduceOp, Work};

use super::{AdamW, Param};
use crate::data_parallel::DataParallel;
use crate::error::{Result, TrainerError};

/// What sharded data parallel splits over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroStage {
    /// Everything replicated (plain data parallel).
    #[default]
    Replicated,
    /// Stage 1: AdamW's moments and master weights.
    OptimizerState,
    /// Stage 2: the optimizer state and the reduced gradients.
    Gradients,
    /// Stage 3: the parameters too, gathered per layer around its computations ([`super::zero3::FullShard`],
    /// FSDP's `FULL_SHARD`).
    Parameters,
}

impl ZeroStage {
    /// The ZeRO stage number (0 for replicated).
    pub fn number(self) -> u8 {
        match self {
            ZeroStage::Replicated => 0,
            ZeroStage::OptimizerState => 1,
            ZeroStage::Gradients => 2,
            ZeroStage::Parameters => 3,
        }
    }
}

/// Buckets of the sharded layout: a few MiB, as the gradient buckets of plain data parallel.
pub const DEFAULT_SHARD_BUCKET_BYTES: usize = crate::data_parallel::DEFAULT_GRAD_BUCKET_BYTES;

/// Collectives of one kind in flight at once: enough to overlap packing and transfer, few enough that the
/// buffers stay a small multiple of a bucket.
const IN_FLIGHT: usize = 2;

#[derive(Debug, Clone)]
struct Bucket {
    /// Indices of its parameters.
    params: Range<usize>,
    /// Each parameter's first element in the bucket's flattened elements.
    offsets: Vec<i64>,
    numel: i64,
    /// Elements per rank: `⌈numel / world⌉`.
    chunk: i64,
    device: Device,
    /// Whether its parameters have fp32 masters (one dtype per bucket, so all or none).
    masters: bool,
}

/// A sharded optimizer's layout and stage (see the module docs).
#[derive(Debug, Clone)]
pub struct Zero {
    stage: ZeroStage,
    rank: usize,
    world: usize,
    buckets: Vec<Bucket>,
    /// Per parameter: the range of its flattened elements this rank owns (possibly empty).
    owned: Vec<Range<i64>>,
    /// Elements of gradient this rank held when the last update ran (its shards in stage 2, whole gradients in
    /// stage 1), for the memory report.
    last_gradient_elements: std::cell::Cell<i64>,
}

/// Bytes a rank holds for the policy's parameters, gradients and optimizer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardedMemory {
    pub parameters: i64,
    pub gradients: i64,
    pub optimizer_state: i64,
}

impl ShardedMemory {
    pub fn total(&self) -> i64 {
        self.parameters + self.gradients + self.optimizer_state
    }
}

impl Zero {
    /// Shards `optimizer`'s state (deferred, or whole and identical on every rank, as after the start's broadcast)
    /// over the ranks of `dp` for `stage` (the trainer logs the memory per rank it expects, [`crate::memory`]).
    pub fn new(stage: ZeroStage, bucket_bytes: usize, optimizer: &mut AdamW, dp: &DataParallel) -> Result<Zero> {
        let (rank, world) = (dp.rank(), dp.world_size());
        let vars: Vec<Tensor> = optimizer.params.iter().map(|p| p.var.shallow_clone()).collect();
        let mut buckets = Vec::new();
        for range in trinity_collective::bucket::plan(&vars, bucket_bytes.max(1)) {
            let mut offsets = Vec::with_capacity(range.len());
            let mut numel = 0i64;
            for v in &vars[range.clone()] {
                offsets.push(numel);
                numel += v.numel() as i64;
            }
            let first = &optimizer.params[range.start];
            buckets.push(Bucket {
                chunk: (numel + world as i64 - 1) / world as i64,
                device: first.var.device(),
                masters: first.var.kind() != Kind::Float,
                params: range,
                offsets,
                numel,
            });
        }
        let mut owned = vec![0..0; vars.len()];
        for b in &buckets {
            let mine = (rank as i64 * b.chunk).min(b.numel)..((rank as i64 + 1) * b.chunk).min(b.numel);
            for (i, &offset) in b.params.clone().zip(&b.offsets) {
                let n = vars[i].numel() as i64;
                let (lo, hi) = (mine.start.max(offset), mine.end.min(offset + n));
                owned[i] = if lo < hi { lo - offset..hi - offset } else { 0..0 };
            }
        }
        let zero = Zero { stage, rank, world, buckets, owned, last_gradient_elements: std::cell::Cell::new(0) };
        if optimizer.deferred {
            zero.allocate(optimizer)?;
        } else {
            zero.reshard(optimizer)?;
        }
        Ok(zero)
    }

    /// Allocates a deferred state ([`AdamW::deferred`]) as this rank's shards only: zero moments, and masters
    /// cut from the parameters (identical on every rank after the start's broadcast), so the whole state never
    /// exists on any rank.
    fn allocate(&self, optimizer: &mut AdamW) -> Result<()> {
        let offload = optimizer.offloaded;
        tch::no_grad(|| -> Result<()> {
            for (p, range) in optimizer.params.iter_mut().zip(&self.owned) {
                let home = if offload { Device::Cpu } else { p.var.device() };
                let len = range.end - range.start;
                p.exp_avg = Tensor::f_zeros([len], (Kind::Float, home))?;
                p.exp_avg_sq = Tensor::f_zeros([len], (Kind::Float, home))?;
                p.master = match p.var.kind() {
                    Kind::Float => None,
                    _ => Some(
                        p.var.f_view([-1])?.f_narrow(0, range.start, len)?.f_to_kind(Kind::Float)?.f_to_device(home)?,
                    ),
                };
                p.shard = Some(range.clone());
                p.shard_grad = None;
            }
            Ok(())
        })?;
        optimizer.deferred = false;
        Ok(())
    }

    pub fn stage(&self) -> ZeroStage {
        self.stage
    }

    /// What this rank holds (`sharded`) or would hold unsharded: parameters, gradients in the parameters' dtype
    /// (stage 2: this rank's fp32 shards), moments and masters.
    pub fn memory(&self, optimizer: &AdamW, sharded: bool) -> ShardedMemory {
        let bytes = |t: &Tensor| (t.numel() * t.kind().elt_size_in_bytes()) as i64;
        let parameters: i64 = optimizer.params.iter().map(|p| bytes(&p.var)).sum();
        if !sharded {
            let state: i64 = optimizer
                .params
                .iter()
                .map(|p| p.var.numel() as i64 * if p.var.kind() != Kind::Float { 12 } else { 8 })
                .sum();
            return ShardedMemory { parameters, gradients: parameters, optimizer_state: state };
        }
        let gradients = match self.stage {
            ZeroStage::Gradients => 4 * self.owned.iter().map(|r| r.end - r.start).sum::<i64>(),
            _ => parameters,
        };
        ShardedMemory { parameters, gradients, optimizer_state: 4 * optimizer.state_elements() }
    }

    /// Elements of gradient this rank held for its last update (stage 2: only its shards').
    pub fn last_gradient_elements(&self) -> i64 {
        self.last_gradient_elements.get()
    }

    /// Splits a whole state (as [`AdamW::new`] or a load left it) into this rank's shards; the rest is freed.
    pub(crate) fn reshard(&self, optimizer: &mut AdamW) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for (p, range) in optimizer.params.iter_mut().zip(&self.owned) {
                if p.shard.is_some() {
                    continue;
                }
                let cut = |t: &Tensor| -> Result<Tensor> {
                    Ok(t.f_reshape([-1])?.f_narrow(0, range.start, range.end - range.start)?.copy())
                };
                p.exp_avg = cut(&p.exp_avg)?;
                p.exp_avg_sq = cut(&p.exp_avg_sq)?;
                if let Some(m) = &p.master {
                    p.master = Some(cut(m)?);
                }
                p.shard = Some(range.clone());
                p.shard_grad = None;
            }
            Ok(())
        })
    }

    /// Gathers every rank's shards into whole tensors shaped like the parameters: on every rank (`keep`), or
    /// only where `keep` is true (the others take part and drop each bucket). A collective.
    fn gather_state(&self, group: &ProcessGroup, optimizer: &AdamW, keep: bool) -> Result<Vec<Option<Whole>>> {
        let mut out: Vec<Option<Whole>> = (0..optimizer.params.len()).map(|_| None).collect();
        for b in &self.buckets {
            let params = &optimizer.params[b.params.clone()];
            let mut gathered = Vec::with_capacity(3);
            let parts: &[fn(&Param) -> Option<&Tensor>] = if b.masters {
                &[|p| Some(&p.exp_avg), |p| Some(&p.exp_avg_sq), |p| p.master.as_ref()]
            } else {
                &[|p| Some(&p.exp_avg), |p| Some(&p.exp_avg_sq)]
            };
            // The state's own device: host memory when it is offloaded.
            let device = params[0].exp_avg.device();
            for part in parts {
                let pieces: Vec<Tensor> = params.iter().filter_map(|p| part(p).map(Tensor::shallow_clone)).collect();
                let input = self.padded_chunk(b, &pieces, (Kind::Float, device))?;
                let output = Tensor::f_empty([b.chunk * self.world as i64], (Kind::Float, device))?;
                group.allgather_flat_async(&input, &output)?.wait()?;
                gathered.push(output);
            }
            if !keep {
                continue;
            }
            for (k, (i, &offset)) in b.params.clone().zip(&b.offsets).enumerate() {
                let var = &params[k].var;
                let whole = |flat: &Tensor| -> Result<Tensor> {
                    Ok(flat.f_narrow(0, offset, var.numel() as i64)?.f_view(var.size().as_slice())?.copy())
                };
                out[i] = Some(Whole {
                    exp_avg: whole(&gathered[0])?,
                    exp_avg_sq: whole(&gathered[1])?,
                    master: gathered.get(2).map(whole).transpose()?,
                });
            }
        }
        Ok(out)
    }

    /// Makes the state whole on this rank without talking to the others: each shard goes back to its place in
    /// zeros shaped like its parameter. For a state about to be overwritten whole: loaded from a file, or received
    /// by broadcast from rank 0.
    pub(crate) fn expand(&self, optimizer: &mut AdamW) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for p in optimizer.params.iter_mut() {
                let Some(range) = p.shard.take() else { continue };
                let place = |shard: &Tensor| -> Result<Tensor> {
                    let whole = Tensor::f_zeros(p.var.size(), (Kind::Float, shard.device()))?;
                    whole.f_view([-1])?.f_narrow(0, range.start, range.end - range.start)?.f_copy_(shard)?;
                    Ok(whole)
                };
                p.exp_avg = place(&p.exp_avg)?;
                p.exp_avg_sq = place(&p.exp_avg_sq)?;
                if let Some(m) = &p.master {
                    p.master = Some(place(m)?);
                }
                p.shard_grad = None;
            }
            Ok(())
        })
    }

    /// Makes the state whole on every rank (a collective), e.g. for a broadcast or a load that expects it;
    /// [`Zero::reshard`] splits it again.
    pub(crate) fn unshard(&self, group: &ProcessGroup, optimizer: &mut AdamW) -> Result<()> {
        if !optimizer.is_sharded() {
            return Ok(());
        }
        let wholes = self.gather_state(group, optimizer, true)?;
        for (p, whole) in optimizer.params.iter_mut().zip(wholes) {
            let whole = whole.ok_or_else(|| TrainerError::DataParallel("a parameter is in no bucket".into()))?;
            p.exp_avg = whole.exp_avg;
            p.exp_avg_sq = whole.exp_avg_sq;
            p.master = whole.master;
            p.shard = None;
            p.shard_grad = None;
        }
        Ok(())
    }

    /// Writes the state in [`AdamW::save`]'s format from rank 0, gathering it there bucket by bucket. Every rank
    /// calls it.
    pub(crate) fn save(&self, group: &ProcessGroup, optimizer: &AdamW, path: &Path) -> Result<()> {
        let wholes = self.gather_state(group, optimizer, self.rank == 0)?;
        if self.rank != 0 {
            return Ok(());
        }
        let mut tensors: Vec<(String, Tensor)> = Vec::with_capacity(optimizer.params.len() * 3 + 1);
        for (p, whole) in optimizer.params.iter().zip(wholes) {
            let whole = whole.ok_or_else(|| TrainerError::DataParallel("a parameter is in no bucket".into()))?;
            tensors.push((format!("exp_avg/{}", p.name), whole.exp_avg.f_to_device(Device::Cpu)?));
            tensors.push((format!("exp_avg_sq/{}", p.name), whole.exp_avg_sq.f_to_device(Device::Cpu)?));
            if let Some(m) = whole.master {
                tensors.push((format!("master/{}", p.name), m.f_to_device(Device::Cpu)?));
            }
        }
        tensors.push(("step".to_owned(), Tensor::from_slice(&[optimizer.step])));
        trinity_model::write_safetensors(path, &tensors)?;
        Ok(())
    }

    /// This rank's chunk of bucket `b` from `pieces` (its parameters' owned elements, in order, on `device`), as
    /// `kind`, padded with zeros to the chunk size.
    fn padded_chunk(&self, b: &Bucket, pieces: &[Tensor], (kind, device): (Kind, Device)) -> Result<Tensor> {
        let mut flat: Vec<Tensor> = Vec::with_capacity(pieces.len() + 1);
        let mut len = 0;
        for t in pieces {
            if t.numel() > 0 {
                len += t.numel() as i64;
                flat.push(t.f_reshape([-1])?.f_to_kind(kind)?);
            }
        }
        if len < b.chunk {
            flat.push(Tensor::f_zeros([b.chunk - len], (kind, device))?);
        }
        Ok(Tensor::f_cat(&flat, 0)?.f_contiguous()?)
    }

    /// Reduces the gradients of a mini-batch into the shards: stage 1 all-reduces them whole, stage 2
    /// reduce-scatters them (see the module docs). A parameter with a gradient on any rank gets one on every rank.
    fn reduce_gradients(&self, dp: &DataParallel, optimizer: &mut AdamW) -> Result<()> {
        let vars: Vec<Tensor> = optimizer.params.iter().map(|p| p.var.shallow_clone()).collect();
        if self.stage == ZeroStage::OptimizerState {
            dp.reduce_gradients(&vars)?;
            let mut held = 0;
            for (p, range) in optimizer.params.iter_mut().zip(&self.owned) {
                let g = p.var.grad();
                p.shard_grad = None;
                if g.defined() {
                    held += g.numel() as i64;
                    if range.end > range.start {
                        p.shard_grad = Some(g.f_view([-1])?.f_narrow(0, range.start, range.end - range.start)?);
                    }
                }
            }
            self.last_gradient_elements.set(held);
            return Ok(());
        }
        let group = dp.group();
        let wanted = dp.gradients_anywhere(&vars)?;
        let mut in_flight: std::collections::VecDeque<(Work<'_>, usize, Tensor)> = Default::default();
        let mut held = 0;
        let mut finish = |optimizer: &mut AdamW, work: Work<'_>, bucket: usize, shard: Tensor| -> Result<()> {
            work.wait()?;
            let b = &self.buckets[bucket];
            let start = self.rank as i64 * b.chunk;
            for (i, &offset) in b.params.clone().zip(&b.offsets) {
                let range = &self.owned[i];
                let p = &mut optimizer.params[i];
                p.shard_grad = None;
                if wanted[i] && range.end > range.start {
                    let at = offset + range.start - start;
                    p.shard_grad = Some(shard.f_narrow(0, at, range.end - range.start)?);
                    held += range.end - range.start;
                }
            }
            Ok(())
        };
        for (k, b) in self.buckets.iter().enumerate() {
            let mut flat: Vec<Tensor> = Vec::with_capacity(b.params.len() + 1);
            for i in b.params.clone() {
                let var = &mut optimizer.params[i].var;
                let g = var.grad();
                flat.push(match g.defined() {
                    true => g.f_reshape([-1])?.f_to_kind(Kind::Float)?,
                    false => Tensor::f_zeros([var.numel() as i64], (Kind::Float, b.device))?,
                });
            }
            let padding = b.chunk * self.world as i64 - b.numel;
            if padding > 0 {
                flat.push(Tensor::f_zeros([padding], (Kind::Float, b.device))?);
            }
            let input = Tensor::f_cat(&flat, 0)?;
            drop(flat);
            // The rank keeps only its shard: the whole gradients go as soon as they are packed.
            for i in b.params.clone() {
                trinity_model::release_grad(&mut optimizer.params[i].var);
            }
            let shard = Tensor::f_empty([b.chunk], (Kind::Float, b.device))?;
            let work = group.reduce_scatter_flat_async(&input, &shard, ReduceOp::Sum)?;
            in_flight.push_back((work, k, shard));
            if in_flight.len() >= IN_FLIGHT
                && let Some((work, bucket, shard)) = in_flight.pop_front()
            {
                finish(optimizer, work, bucket, shard)?;
            }
        }
        while let Some((work, bucket, shard)) = in_flight.pop_front() {
            finish(optimizer, work, bucket, shard)?;
        }
        self.last_gradient_elements.set(held);
        Ok(())
    }

    /// All-gathers every bucket's updated chunks into the parameters of every rank.
    fn gather_parameters(&self, group: &ProcessGroup, optimizer: &AdamW) -> Result<()> {
        let mut in_flight: std::collections::VecDeque<(Work<'_>, usize, Tensor)> = Default::default();
        let write = |work: Work<'_>, bucket: usize, whole: Tensor| -> Result<()> {
            work.wait()?;
            let b = &self.buckets[bucket];
            tch::no_grad(|| -> Result<()> {
                for (i, &offset) in b.params.clone().zip(&b.offsets) {
                    let var = &optimizer.params[i].var;
                    let part = whole.f_narrow(0, offset, var.numel() as i64)?;
                    var.f_view([-1])?.f_copy_(&part)?;
                }
                Ok(())
            })
        };
        for (k, b) in self.buckets.iter().enumerate() {
            let params = &optimizer.params[b.params.clone()];
            let kind = params[0].var.kind();
            let pieces: Vec<Tensor> = params.iter().map(Param::owned).collect::<Result<_>>()?;
            let input = self.padded_chunk(b, &pieces, (kind, b.device))?;
            let whole = Tensor::f_empty([b.chunk * self.world as i64], (kind, b.device))?;
            in_flight.push_back((group.allgather_flat_async(&input, &whole)?, k, whole));
            if in_flight.len() >= IN_FLIGHT
                && let Some((work, bucket, whole)) = in_flight.pop_front()
            {
                write(work, bucket, whole)?;
            }
        }
        while let Some((work, bucket, whole)) = in_flight.pop_front() {
            write(work, bucket, whole)?;
        }
        Ok(())
    }

    /// One optimizer step of a mini-batch whose backward passes are done: reduces the gradients into the shards,
    /// clips by the global norm, updates this rank's shards with learning rate `lr` (unless the norm is not
    /// finite) and all-gathers the parameters. Returns the norm before clipping.
    pub(crate) fn step(&self, dp: &DataParallel, optimizer: &mut AdamW, max_norm: f64, lr: f64) -> Result<f64> {
        self.reduce_gradients(dp, optimizer)?;
        let mut squares = Tensor::from_slice(&[optimizer.grad_sum_of_squares()?]);
        dp.group().allreduce(&mut squares, ReduceOp::Sum)?;
        let norm = squares.f_double_value(&[0])?.sqrt();
        optimizer.clip_to(norm, max_norm)?;
        if norm.is_finite() {
            optimizer.step(lr)?;
            self.gather_parameters(dp.group(), optimizer)?;
        }
        Ok(norm)
    }
}

/// One parameter's whole state, gathered.
struct Whole {
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    master: Option<Tensor>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_numbers() {
        assert_eq!(ZeroStage::default().number(), 0);
        assert_eq!(ZeroStage::OptimizerState.number(), 1);
        assert_eq!(ZeroStage::Gradients.number(), 2);
    }
}
