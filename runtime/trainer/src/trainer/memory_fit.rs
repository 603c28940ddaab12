//! Sizing the CPU's micro-batches, passes and recomputation to the memory the training state leaves them
//! ([`crate::memory`]): once when the trainer is built (one process), again when it joins a data-parallel group,
//! whose stage and world size change what a rank holds.

use tch::Device;
use trinity_model::Decoder;

use super::Trainer;
use crate::memory::{StateMemory, TrainedParameters, activation_room};
use crate::micro_batch::MicroBatching;
use crate::optimizer::zero::ZeroStage;
use crate::recompute::{ActivationRecompute, RecomputePlan};

/// What the fit starts from, fixed when the trainer is built.
#[derive(Debug, Clone)]
pub(crate) struct MemoryBudget {
    /// `MemAvailable` when the trainer was built, before it allocated anything.
    pub(crate) available: Option<u64>,
    /// The micro-batching and pass size the options asked for, before any lowering.
    pub(crate) configured: (MicroBatching, Option<usize>),
    /// Bytes the trainer allocates besides the policy's gradients and optimizer state: the reference and critic
    /// copies it makes, and the critic's gradients and optimizer state.
    pub(crate) others: u64,
    /// The part of `others` that is the copy of the policy the trainer made as the KL reference (stage 3 shards
    /// it: a rank then holds its share).
    pub(crate) copied_reference_bytes: u64,
    /// The policy's trained parameters.
    pub(crate) trained: TrainedParameters,
    /// Under stage 3, the whole units a pass holds at once ([`crate::optimizer::zero3::pass_bytes`]), measured
    /// while the parameters were whole.
    pub(crate) pass_bytes: u64,
}

/// The recomputation plan for `model` with `room` bytes for activations.
pub(crate) fn plan(mode: ActivationRecompute, model: &Decoder, room: Option<u64>) -> RecomputePlan {
    let c = model.config();
    RecomputePlan::new(mode, model.device(), (c.num_hidden_layers, c.hidden_size, c.intermediate_size), room)
}

/// What the trainer allocates for a model besides its loaded parameters: with `copied` its parameters too (a
/// copy the trainer makes), its gradients and, replicated, its optimizer state.
pub(crate) fn allocated_for(trained: TrainedParameters, copied: bool, offload: bool, on_cpu: bool) -> u64 {
    let state = StateMemory::expected(trained, ZeroStage::Replicated, 1, offload);
    state.allocated_beside_parameters(on_cpu) + if copied { trained.bytes } else { 0 }
}

impl Trainer {
    /// Sizes passes, micro-batches and recomputation for a rank of `world` (`local_ranks` of them on this
    /// machine) holding the policy's state under `stage`, logging a lowered micro-batch budget when it changes.
    pub(super) fn fit_memory(&mut self, stage: ZeroStage, world: usize, local_ranks: usize) {
        let budget = &self.memory_budget;
        let device = self.policy.device();
        let on_cpu = device == Device::Cpu;
        let state = StateMemory::expected(budget.trained, stage, world, self.options.optimizer_offload)
            .with_pass_bytes(budget.pass_bytes);
        let allocated = state.allocated_beside_parameters(on_cpu) + budget.others;
        let room = activation_room(budget.available, local_ranks, allocated);
        self.recompute = plan(self.options.activation_recompute, &self.policy, room);
        let critic_plan =
            self.critic.as_ref().map(|c| plan(self.options.critic_activation_recompute, c.decoder(), room));
        let (configured, configured_pass) = budget.configured;
        self.options.pass_tokens = match (on_cpu, configured_pass, self.recompute.pass_cap()) {
            (true, Some(pass), Some(cap)) => Some(pass.min(cap)),
            (true, pass, _) => pass,
            (false, ..) => None,
        };
        // The critic trains on the same micro-batches, so they must fit its memory too.
        let tightest = std::iter::once(&self.recompute)
            .chain(&critic_plan)
            .filter_map(|p| p.micro_batch_cap().map(|cap| (cap, p.mode())))
            .min_by_key(|&(cap, _)| cap);
        let micro = match (configured, tightest) {
            (MicroBatching::TokenBudget(budget), Some((cap, _))) if cap < budget => MicroBatching::TokenBudget(cap),
            _ => configured,
        };
        if let (MicroBatching::TokenBudget(budget), MicroBatching::TokenBudget(cap), Some((_, mode))) =
            (configured, micro, tightest)
            && cap < budget
            && micro != self.options.micro_batching
        {
            let how = match mode {
                ActivationRecompute::Never => {
                    "with activations kept (enable_gradient_checkpointing: false; true would recompute them and keep \
                     more tokens)"
                }
                _ => "even with activations recomputed",
            };
            let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
            tracing::info!(
                "micro-batch token budget {budget} lowered to {cap} so that a micro-batch fits in memory {how} \
                 ({:.1} GiB available{}, less {:.1} GiB of training state: {:.1} GiB, half of it for activations); \
                 micro-batches are weighted by their rows as in Trinity-RFT, so smaller ones shift the token-mean's \
                 weights slightly",
                gib(self.memory_budget.available.unwrap_or(0)),
                if local_ranks > 1 { format!(" to {local_ranks} ranks on this machine") } else { String::new() },
                gib(allocated),
                gib(room.unwrap_or(0)),
            );
        }
        self.options.micro_batching = micro;
        if let Some(critic) = &mut self.critic {
            critic.set_recompute(critic_plan);
        }
        self.state_memory = state;
    }

    /// What this rank is expected to hold for the policy's parameters, gradients and optimizer state.
    pub fn expected_memory(&self) -> StateMemory {
        self.state_memory
    }
}
