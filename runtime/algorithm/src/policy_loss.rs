//! Policy losses: from current logprobs ℓ (with gradient), old logprobs ℓ_old, advantages A and the action
//! mask m to one scalar loss plus metrics.
//!
//! Every loss reads only the batch fields it needs and names the missing one otherwise. The per-token losses
//! are reduced with the component's `loss_agg_mode` argument (see [`crate::aggregation`]).

use std::fmt;

use tch::Tensor;

use crate::args::{ArgSpec, Args};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;

pub mod cispo;
pub mod dpo;
pub mod gspo;
pub mod importance_sampling;
pub mod mix;
pub mod mix_chord;
pub mod opmd;
pub mod ppo;
pub mod rec;
pub mod sapo;
pub mod sft;
pub mod sft_is;
pub mod sft_phi;
pub mod sppo;
pub mod topr;

/// A policy loss built from its arguments.
///
/// `Send` because the RFT loop runs each train step on a thread of its own.
pub trait PolicyLossFn: fmt::Debug + Send {
    /// The loss (a scalar connected to `batch.logprob`) and its metrics.
    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError>;

    /// Whether the loss reads `batch.ref_logprob`. The trainer scores the reference model only when some
    /// component reads its logprobs, so a loss that does must say so (DPO's does, and a library's is taken to).
    fn reads_ref_logprob(&self) -> bool {
        false
    }

    /// The aggregation the loss is a sum of per-row parts under, over all the batch's rows: the trainer then
    /// weighs a micro-batch's loss by [`LossAggMode::part_weight`](crate::LossAggMode::part_weight), so that
    /// micro-batches and data-parallel ranks add up to the whole mini-batch's loss. `None` (the default): the loss
    /// is a mean over the batch's rows (DPO's over its pairs) or of a form the host does not know (`mix`'s own
    /// bookkeeping, a library's loss), and micro-batches are weighted by their rows, Trinity-RFT's scale.
    fn loss_agg_mode(&self) -> Option<crate::LossAggMode> {
        None
    }
}

/// A registered policy loss.
#[derive(Debug)]
pub struct PolicyLossFnEntry {
    pub name: &'static str,
    /// Accepted arguments with their defaults.
    pub args: &'static [ArgSpec],
    pub build: fn(&Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError>,
}

inventory::collect!(PolicyLossFnEntry);

/// The fields most losses read: ℓ, m and, on request, ℓ_old and A.
pub(crate) struct Inputs<'a> {
    pub logprob: &'a Tensor,
    pub mask: &'a Tensor,
}

impl<'a> Inputs<'a> {
    pub(crate) fn new(batch: &'a Batch, component: &str) -> Result<Self, AlgorithmError> {
        Ok(Inputs { logprob: batch.need("logprob", &batch.logprob, component)?, mask: &batch.action_mask })
    }
}

/// `ℓ_old`, required.
pub(crate) fn old_logprob<'a>(batch: &'a Batch, component: &str) -> Result<&'a Tensor, AlgorithmError> {
    batch.need("old_logprob", &batch.old_logprob, component)
}

/// `A`, required.
pub(crate) fn advantages<'a>(batch: &'a Batch, component: &str) -> Result<&'a Tensor, AlgorithmError> {
    batch.need("advantages", &batch.advantages, component)
}

/// The `loss_agg_mode` argument, parsed.
pub(crate) fn agg_mode(args: &Args, name: &str) -> Result<crate::aggregation::LossAggMode, AlgorithmError> {
    args.str(name)?.parse().map_err(|e: String| args.invalid(name, e))
}

/// A metric value from a scalar tensor.
pub(crate) fn item(t: &Tensor) -> f64 {
    t.double_value(&[])
}
