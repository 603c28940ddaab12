//! Constrained sampling: a request may carry a [`TokenConstraint`] (a grammar, a JSON schema) that decides, at
//! every step of each of its samples, which tokens may come next.
//!
//! The engine asks the sample's [`ConstraintState`] for its allowed tokens before each sampling step, samples
//! from the masked distribution (the row's filters, temperature and `min_tokens` applying on top), and hands it
//! the chosen token. The model's end-of-sequence ids are allowed exactly when the state says the output may
//! end ([`ConstraintState::can_end`]) and never otherwise; when the output must end
//! ([`ConstraintState::must_end`]) only they are allowed, and a sample that cannot end that way (`ignore_eos`,
//! a model without one) stops there with finish reason `stop`.
//!
//! **Logprobs stay unmasked.** The logprob reported for a constrained token is `log_softmax(logits / T)[y]`
//! over the whole vocabulary, as for every other token (and as vLLM's default raw logprobs are): the trainer
//! recomputes exactly that from the model and knows nothing of the mask, so the first step's importance ratio
//! stays 1. The mask shapes which token is drawn, like top-k or the `min_tokens` ban.
//!
//! **Cost.** Nothing of this runs for a step whose rows carry no constraint. A constrained row needs its mask
//! on the sampling path: the row-wise CPU path applies it in place, the libtorch path (filters, top logprobs,
//! another device) uploads one boolean mask for the step's rows.

use std::fmt;
use std::sync::Arc;

/// What a constraint's state reports when it cannot go on; the engine fails the request with it.
pub type ConstraintError = String;

/// A constraint on a request's output; [`TokenConstraint::start`] gives each sample its own state.
pub trait TokenConstraint: Send + Sync + fmt::Debug {
    /// The state before a sample's first token.
    fn start(&self) -> Box<dyn ConstraintState>;
}

/// One sample's progress through a constraint.
pub trait ConstraintState: Send {
    /// Which token ids may come next (indexed by id; ids past its end are not allowed). End-of-sequence ids
    /// are the engine's to allow (see the module docs), whatever this says of them.
    fn allowed(&mut self) -> Result<Arc<[bool]>, ConstraintError>;
    /// Moves past `token` (one that [`ConstraintState::allowed`] allowed).
    fn advance(&mut self, token: u32) -> Result<(), ConstraintError>;
    /// Whether the output so far is complete, so that the sample may end here.
    fn can_end(&self) -> bool;
    /// Whether the output is complete and nothing may follow.
    fn must_end(&self) -> bool;
}

/// A request's constraint, shared by its samples ([`crate::SamplingParams::constraint`]). Two are equal when
/// they are the same object.
#[derive(Clone)]
pub struct Constraint(pub Arc<dyn TokenConstraint>);

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The mask a constrained row samples under, `vocab` wide: the state's allowed ids, and the end-of-sequence
/// ids when the output may end. `None` when nothing at all is allowed.
pub(crate) fn row_mask(
    state: &mut dyn ConstraintState,
    vocab: usize,
    eos: &[u32],
    eos_usable: bool,
) -> Result<Option<Vec<bool>>, ConstraintError> {
    let mut mask = vec![false; vocab];
    if !state.must_end() {
        let allowed = state.allowed()?;
        let n = allowed.len().min(vocab);
        mask[..n].copy_from_slice(&allowed[..n]);
    }
    for &id in eos {
        if let Some(slot) = mask.get_mut(id as usize) {
            *slot = eos_usable && state.can_end();
        }
    }
    Ok(mask.contains(&true).then_some(mask))
}
