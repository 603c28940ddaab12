//! trinity's built-in reward functions, with Trinity-RFT's names and outputs, and generators of the
//! project's own small tasks.
//!
//! A reward function scores one response against a task's reference answer and returns named components
//! ([`RewardComponents`]); the workflow sums them into the experience's reward and reports each component as
//! a metric. Functions are registered by name with `inventory` ([`registry`]): `math_reward`,
//! `accuracy_reward`, `math_boxed_reward`, `format_reward`, `countdown_reward`, `math_dapo_reward`, and
//! `rm_gallery_reward` for RM-Gallery's rule-based `math_verify_reward` ([`rm_gallery`]; its judge rewards call a
//! model service and are not built in).
//!
//! Errors ([`RewardError`]) mean the *task* is broken (missing or unparseable reference answer, bad
//! `reward_fn_args`); a wrong or malformed *response* is never an error, only a low score.
//!
//! Answer checking is numeric, not symbolic (see [`answer`]): Trinity-RFT's `math_verify` also proves
//! symbolic equalities (`\frac{\pi}{2}` vs `\pi/2`); here non-numeric answers are compared as normalised
//! text.

pub mod answer;
pub mod arithmetic_tasks;
pub mod countdown;
pub mod countdown_tasks;
pub mod dapo;
pub mod error;
pub mod expr;
pub mod format;
pub mod math;
pub mod registry;
pub mod rm_gallery;
mod rng;

pub use crate::error::RewardError;
pub use crate::registry::{
    GroupReward, RewardComponents, RewardEntry, RewardFn, RewardInput, lookup, names, register, score, score_group,
    total,
};
