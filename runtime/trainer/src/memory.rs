//! What a rank's training state takes in memory, by ZeRO stage, world size and optimizer offload, and the room
//! that leaves the CPU's micro-batches and recomputation ([`crate::micro_batch`], [`crate::recompute`]).
//!
//! Per trained parameter of `e` bytes (4 in fp32, 2 in bf16) a rank holds:
//! - the parameter, `e` bytes, whole on every rank in stages 0 to 2;
//! - its gradient during the backward, `e` bytes, whole in every stage: gradients accumulate over a
//!   mini-batch's micro-batches and are reduced after its last backward. Stage 2 then keeps an fp32 shard of
//!   1/N of them (4 bytes an element) for the update and releases the whole ones bucket by bucket, so the
//!   shard never lives at the same time as a pass's activations;
//! - AdamW's two fp32 moments, 8 bytes, and for a parameter not stored in fp32 its fp32 master, 4 more. Stages 1
//!   and 2 keep 1/N of them on each rank; with `optimizer_offload` they are in host memory, which on a CPU run
//!   is the same memory.
//!
//! Stage 3 ([`crate::optimizer::zero3`]) keeps 1/N of everything: `e/N` bytes of parameter shard, a 4/N-byte fp32
//! gradient shard that accumulates over a mini-batch's passes (so it lives beside the activations), and 1/N of
//! AdamW's state, 9 bytes a bf16 parameter on 2 ranks (`(2 + 4 + 12) / 2`) against stage 2's 10 and stage 0's 16.
//! A pass adds the whole units it holds at once (the outer unit of embedding, norm and head, a layer and the
//! next one's prefetch) and their whole gradients until they are reduce-scattered, bounded by
//! [`StateMemory::with_pass_bytes`]; the whole parameters loaded before the trainer was built are freed.
//!
//! The activation budget starts from the memory available when the trainer is built: the policy and the models
//! handed to the trainer are loaded by then, what the trainer allocates afterwards is not. So that is subtracted
//! before half of the rest goes to activations: the policy's gradients and optimizer state as this rank holds
//! them during a backward, and the reference and critic copies and state the trainer makes. Ranks on one machine
//! (`LOCAL_WORLD_SIZE`) all saw the same free memory, so on the CPU each takes its share of it.

use tch::{Kind, Tensor};

use crate::optimizer::zero::ZeroStage;

/// Sizes of the parameters an optimizer trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrainedParameters {
    /// Elements of all of them.
    pub elements: u64,
    /// Their bytes in the parameters' own dtypes.
    pub bytes: u64,
    /// Elements of those not stored in fp32, which get an fp32 master copy.
    pub mixed_precision_elements: u64,
}

impl TrainedParameters {
    pub fn of<'a>(params: impl IntoIterator<Item = &'a Tensor>) -> Self {
        let mut out = TrainedParameters::default();
        for p in params {
            let n = p.numel() as u64;
            out.elements += n;
            out.bytes += n * p.kind().elt_size_in_bytes() as u64;
            if p.kind() != Kind::Float {
                out.mixed_precision_elements += n;
            }
        }
        out
    }

    /// Parameters of `elements` elements stored in `kind` (for projections of other model sizes).
    pub fn uniform(elements: u64, kind: Kind) -> Self {
        let mixed = if kind == Kind::Float { 0 } else { elements };
        TrainedParameters {
            elements,
            bytes: elements * kind.elt_size_in_bytes() as u64,
            mixed_precision_elements: mixed,
        }
    }
}

/// The bytes one rank holds for a trained model's parameters, gradients and optimizer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateMemory {
    /// The stage in effect (with one rank nothing is sharded: [`ZeroStage::Replicated`]).
    pub stage: ZeroStage,
    pub world: usize,
    /// The parameters, whole.
    pub parameters: u64,
    /// Gradients during the backward, whole, in the parameters' dtypes.
    pub gradients: u64,
    /// Stage 2: this rank's fp32 shard of the reduced gradients, held for the update after the backward.
    pub gradient_shard: u64,
    /// AdamW's moments and fp32 masters this rank holds.
    pub optimizer_state: u64,
    /// Whether the optimizer state is in host memory (`optimizer_offload`).
    pub optimizer_offloaded: bool,
    /// Bytes of the parameters as loaded, whole (what stage 3 frees, keeping its shards and a pass's units).
    pub loaded: u64,
}

impl StateMemory {
    /// What a rank of `world` is expected to hold for `trained` under `stage`.
    pub fn expected(trained: TrainedParameters, stage: ZeroStage, world: usize, offload: bool) -> Self {
        let world = world.max(1);
        let stage = if world == 1 { ZeroStage::Replicated } else { stage };
        let n = world as u64;
        let state = 8 * trained.elements + 4 * trained.mixed_precision_elements;
        StateMemory {
            stage,
            world,
            parameters: trained.bytes,
            gradients: trained.bytes,
            gradient_shard: match stage {
                ZeroStage::Gradients | ZeroStage::Parameters => 4 * trained.elements.div_ceil(n),
                _ => 0,
            },
            optimizer_state: if stage == ZeroStage::Replicated { state } else { state.div_ceil(n) },
            optimizer_offloaded: offload,
            loaded: trained.bytes,
        }
        .with_pass_bytes(0)
    }

    /// Stage 3: `gathered`, the bytes of the whole units a pass holds at once ([`crate::optimizer::zero3::
    /// pass_bytes`]), added to the parameter shards and, as their gradients before the reduce-scatter, to the
    /// gradients. Other stages are unchanged.
    pub fn with_pass_bytes(mut self, gathered: u64) -> Self {
        if self.stage == ZeroStage::Parameters {
            self.parameters = self.loaded.div_ceil(self.world as u64) + gathered;
            self.gradients = gathered;
        }
        self
    }

    /// What the training state adds to the memory a pass's activations share, after the parameters are loaded:
    /// the gradients and, unless it is offloaded off an accelerator, the optimizer state. `on_cpu`: the
    /// parameters' device is the host, so offloaded state counts too.
    pub fn allocated_beside_parameters(&self, on_cpu: bool) -> u64 {
        let state = if self.optimizer_offloaded && !on_cpu { 0 } else { self.optimizer_state };
        match self.stage {
            // The shards and a pass's units replace the loaded parameters, and the gradient shards accumulate
            // during the passes.
            ZeroStage::Parameters => {
                (self.parameters + self.gradients + self.gradient_shard + state).saturating_sub(self.loaded)
            }
            _ => self.gradients + state,
        }
    }

    /// The start's log line: the stage and what a rank holds.
    pub fn describe(&self, parameters: u64) -> String {
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        let per = |b: u64| b as f64 / parameters.max(1) as f64;
        let what = match (self.stage, self.world) {
            (ZeroStage::Replicated, 1) => "training state: one process, nothing sharded".to_owned(),
            (ZeroStage::Replicated, w) => format!("training state: data parallel over {w} ranks, replicated"),
            (ZeroStage::OptimizerState, w) => format!(
                "sharded data parallel: ZeRO stage 1 over {w} ranks (optimizer state sharded; parameters and \
                 gradients whole)"
            ),
            (ZeroStage::Gradients, w) => format!(
                "sharded data parallel: ZeRO stage 2 over {w} ranks (optimizer state and reduced gradients sharded; \
                 parameters whole)"
            ),
            (ZeroStage::Parameters, w) => format!(
                "sharded data parallel: ZeRO stage 3 over {w} ranks (parameters, gradients and optimizer state \
                 sharded; each layer gathered around its computations, activations recomputed)"
            ),
        };
        let shard = match (self.gradient_shard, self.stage) {
            (0, _) => String::new(),
            (s, ZeroStage::Parameters) => format!(" and a {:.2} GiB fp32 shard accumulating them", gib(s)),
            (s, _) => format!(", then a {:.2} GiB fp32 shard of them for the update", gib(s)),
        };
        let peak = match self.stage {
            ZeroStage::Parameters => self.parameters + self.gradients + self.gradient_shard + self.optimizer_state,
            _ => self.parameters + self.gradients + self.optimizer_state,
        };
        let (parameters_what, gradients_what) = match self.stage {
            ZeroStage::Parameters => ("shards and a pass's whole units", "a pass's whole units' gradients"),
            _ => ("", "gradients"),
        };
        let place = if self.optimizer_offloaded { "in host memory (optimizer_offload)" } else { "with the parameters" };
        let parameters_what = if parameters_what.is_empty() { String::new() } else { format!(" ({parameters_what})") };
        format!(
            "{what}: per rank {parameters} parameters{parameters_what} {:.2} GiB, {gradients_what} {:.2} GiB during \
             the backward{shard}, optimizer state (AdamW's moments and fp32 masters) {:.2} GiB {place}; {:.1} bytes a \
             parameter at the backward's peak",
            gib(self.parameters),
            gib(self.gradients),
            gib(self.optimizer_state),
            per(peak),
        )
    }
}

/// The memory a pass's activations may use on this rank: its share of `available` (ranks on one machine all
/// measured the same free memory) less what the trainer allocates after measuring it. `None` when unknown.
pub(crate) fn activation_room(available: Option<u64>, local_ranks: usize, allocated_after: u64) -> Option<u64> {
    available.map(|a| (a / local_ranks.max(1) as u64).saturating_sub(allocated_after))
}

/// `param_offload` (or `offload_policy`) on `device`: a CPU run holds the parameters in host memory already; on an
/// accelerator moving them there between uses is not implemented, so it is refused with what to do instead.
pub(crate) fn check_param_offload(param_offload: bool, device: tch::Device) -> crate::Result<()> {
    if !param_offload || device == tch::Device::Cpu {
        return Ok(());
    }
    Err(crate::TrainerError::setting(
        "trainer.param_offload (or fsdp_config.param_offload / offload_policy)",
        format!(
            "parameter offload is not implemented on {device:?}: the parameters stay on the training device; set it \
             to false. optimizer_offload: true moves AdamW's moments and fp32 masters (12 of the 16 bytes a parameter \
             of bf16 training) to host memory, and more data-parallel ranks under trainer_strategy fsdp/fsdp2 split \
             them"
        ),
    ))
}

/// Data-parallel ranks on this machine, as the launcher says (`LOCAL_WORLD_SIZE`); 1 when it does not.
pub(crate) fn local_ranks() -> usize {
    std::env::var("LOCAL_WORLD_SIZE").ok().and_then(|v| v.parse().ok()).filter(|&n| n >= 1).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen2.5-0.5B's 494,032,768 parameters in bf16 with fp32 masters.
    const QWEN_05B: u64 = 494_032_768;

    #[test]
    fn stages_divide_what_they_shard_by_the_world() {
        let p = TrainedParameters::uniform(QWEN_05B, Kind::BFloat16);
        let zero = StateMemory::expected(p, ZeroStage::Replicated, 2, false);
        assert_eq!((zero.parameters, zero.gradients, zero.gradient_shard), (2 * QWEN_05B, 2 * QWEN_05B, 0));
        assert_eq!(zero.optimizer_state, 12 * QWEN_05B);
        let one = StateMemory::expected(p, ZeroStage::OptimizerState, 2, false);
        assert_eq!((one.gradients, one.gradient_shard, one.optimizer_state), (2 * QWEN_05B, 0, 6 * QWEN_05B));
        let two = StateMemory::expected(p, ZeroStage::Gradients, 4, false);
        assert_eq!((two.parameters, two.gradients), (2 * QWEN_05B, 2 * QWEN_05B));
        assert_eq!((two.gradient_shard, two.optimizer_state), (QWEN_05B, 3 * QWEN_05B));
        // One rank shards nothing whatever the stage.
        let alone = StateMemory::expected(p, ZeroStage::Gradients, 1, false);
        assert_eq!(
            (alone.stage, alone.optimizer_state, alone.gradient_shard),
            (ZeroStage::Replicated, 12 * QWEN_05B, 0)
        );
        // fp32 parameters are their own masters: 8 bytes of moments; an odd count rounds each rank's share up.
        let fp32 = StateMemory::expected(TrainedParameters::uniform(7, Kind::Float), ZeroStage::Gradients, 2, false);
        assert_eq!((fp32.parameters, fp32.optimizer_state, fp32.gradient_shard), (28, 28, 16));
    }

    /// Stage 3 on 2 ranks: 9 bytes a bf16 parameter in shards and state, plus a pass's whole units (and their
    /// gradients), and the loaded parameters it frees count against what it allocates.
    #[test]
    fn stage_3_shards_the_parameters_too() {
        let p = TrainedParameters::uniform(QWEN_05B, Kind::BFloat16);
        let three = StateMemory::expected(p, ZeroStage::Parameters, 2, false);
        assert_eq!((three.parameters, three.gradients), (QWEN_05B, 0));
        assert_eq!((three.gradient_shard, three.optimizer_state), (2 * QWEN_05B, 6 * QWEN_05B));
        let per = (three.parameters + three.gradient_shard + three.optimizer_state) as f64 / QWEN_05B as f64;
        assert_eq!(per, 9.0);
        let pass = three.with_pass_bytes(1000);
        assert_eq!((pass.parameters, pass.gradients), (QWEN_05B + 1000, 1000));
        // Loaded whole (2 bytes), held as a 1-byte shard: the trainer allocates 8 bytes more a parameter less 1.
        assert_eq!(pass.allocated_beside_parameters(true), 7 * QWEN_05B + 2000);
        let line = pass.describe(p.elements);
        assert!(line.starts_with("sharded data parallel: ZeRO stage 3 over 2 ranks"), "{line}");
        assert!(line.contains("9.0 bytes a parameter"), "{line}");
        // Other stages ignore a pass's units.
        let two = StateMemory::expected(p, ZeroStage::Gradients, 2, false);
        assert_eq!(two.with_pass_bytes(1000), two);
    }

    #[test]
    fn sizes_come_from_the_tensors_dtypes() {
        let a = Tensor::zeros([3, 4], (Kind::BFloat16, tch::Device::Cpu));
        let b = Tensor::zeros([5], (Kind::Float, tch::Device::Cpu));
        let p = TrainedParameters::of([&a, &b]);
        assert_eq!(p, TrainedParameters { elements: 17, bytes: 24 + 20, mixed_precision_elements: 12 });
        assert_eq!(StateMemory::expected(p, ZeroStage::Replicated, 1, false).optimizer_state, 8 * 17 + 4 * 12);
    }

    /// Offloaded state leaves an accelerator's memory, not the host's; gradients always count.
    #[test]
    fn room_for_activations_is_the_ranks_share_less_the_state() {
        let p = TrainedParameters::uniform(1000, Kind::Float);
        let m = StateMemory::expected(p, ZeroStage::Gradients, 2, true);
        assert_eq!(m.allocated_beside_parameters(true), 4000 + 4000);
        assert_eq!(m.allocated_beside_parameters(false), 4000);
        assert_eq!(activation_room(Some(100_000), 2, 8000), Some(42_000));
        assert_eq!(activation_room(Some(10_000), 2, 8000), Some(0));
        assert_eq!(activation_room(None, 1, 8000), None);
        let line = m.describe(p.elements);
        assert!(line.starts_with("sharded data parallel: ZeRO stage 2 over 2 ranks"), "{line}");
        assert!(line.contains("in host memory (optimizer_offload)"), "{line}");
    }

    /// Parameter offload holds on the CPU and is refused, naming the keys and what to do, elsewhere.
    #[test]
    fn parameter_offload_is_refused_off_the_cpu() {
        assert!(
            check_param_offload(true, tch::Device::Cpu).is_ok()
                && check_param_offload(false, tch::Device::Cuda(0)).is_ok()
        );
        let refused = check_param_offload(true, tch::Device::Cuda(0)).unwrap_err().to_string();
        assert!(refused.contains("param_offload") && refused.contains("optimizer_offload: true"), "{refused}");
    }
}
