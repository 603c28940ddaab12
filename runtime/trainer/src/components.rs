//! The algorithm a trainer runs: its components built from a resolved `algorithm:` section through
//! trinity-algorithm's registry, plus the preset's flags (reference model, critic, where advantages run).
//!
//! The config layer has already filled every component name and merged its arguments over the defaults
//! (and copied `loss_agg_mode` into the policy loss's arguments), so this only builds.

use serde_json::Map;
use trinity_algorithm::advantage::AdvantageFn;
use trinity_algorithm::entropy::EntropyLossFn;
use trinity_algorithm::kl::KlFn;
use trinity_algorithm::policy_loss::PolicyLossFn;
use trinity_algorithm::registry::{self, Kind};
use trinity_algorithm::{AlgorithmError, LossAggMode};
use trinity_config::ExperienceSchema;
use trinity_config::algorithm::AlgorithmConfig;

use crate::error::{Result, TrainerError};

/// A named component.
#[derive(Debug)]
pub struct Named<T> {
    pub name: String,
    pub f: T,
}

/// Everything the trainer needs to know about the algorithm.
#[derive(Debug)]
pub struct Components {
    /// `algorithm_type`.
    pub algorithm_type: String,
    /// The advantage function and whether it is a trainer-side one.
    pub advantage: Option<(Named<Box<dyn AdvantageFn>>, bool)>,
    pub policy_loss: Named<Box<dyn PolicyLossFn>>,
    /// KL loss term (absent for `none`).
    pub kl_loss: Option<Named<KlFn>>,
    /// KL reward penalty for trainer-side advantages (absent for `none`).
    pub kl_penalty: Option<Named<KlFn>>,
    /// Entropy term (absent for `none`).
    pub entropy: Option<Named<EntropyLossFn>>,
    pub loss_agg_mode: LossAggMode,
    /// The preset wants reference logprobs.
    pub use_reference: bool,
    /// The preset trains a critic (PPO).
    pub use_critic: bool,
    /// The preset computes advantages in the trainer (after the KL penalty).
    pub compute_advantage_in_trainer: bool,
    /// What rows the algorithm trains on.
    pub schema: ExperienceSchema,
}

fn need<'a>(value: &'a Option<String>, key: &str) -> Result<&'a str> {
    value.as_deref().ok_or_else(|| {
        TrainerError::setting(format!("algorithm.{key}"), "unset; load the config through trinity-config's resolver")
    })
}

impl Components {
    /// Builds the components of a resolved `algorithm:` section.
    pub fn from_config(config: &AlgorithmConfig) -> Result<Self> {
        let preset = registry::preset(&config.algorithm_type).ok_or_else(|| AlgorithmError::UnknownComponent {
            kind: Kind::AlgorithmType,
            name: config.algorithm_type.clone(),
            known: registry::names(Kind::AlgorithmType),
        })?;
        let empty = Map::new();
        let args = |a: &Option<Map<String, serde_json::Value>>| a.clone().unwrap_or_else(|| empty.clone());

        let name = need(&config.advantage_fn, "advantage_fn")?;
        let resolved = registry::resolve_args(Kind::AdvantageFn, name, Some(&args(&config.advantage_fn_args)))?;
        let (f, in_trainer) = registry::advantage_fn(name, &resolved)?;
        let advantage = Some((Named { name: name.to_owned(), f }, in_trainer));

        let name = need(&config.policy_loss_fn, "policy_loss_fn")?;
        let resolved = registry::resolve_args(Kind::PolicyLoss, name, Some(&args(&config.policy_loss_fn_args)))?;
        let policy_loss = Named { name: name.to_owned(), f: registry::policy_loss_fn(name, &resolved)? };

        let kl = |key: &str, n: &Option<String>, a: &Option<Map<String, serde_json::Value>>| -> Result<_> {
            let name = need(n, key)?;
            let resolved = registry::resolve_args(Kind::KlFn, name, Some(&args(a)))?;
            let f = registry::kl_fn(name, &resolved)?;
            Ok(if f.is_none() { None } else { Some(Named { name: name.to_owned(), f }) })
        };
        let kl_loss = kl("kl_loss_fn", &config.kl_loss_fn, &config.kl_loss_fn_args)?;
        let kl_penalty = kl("kl_penalty_fn", &config.kl_penalty_fn, &config.kl_penalty_fn_args)?;

        let name = need(&config.entropy_loss_fn, "entropy_loss_fn")?;
        let resolved = registry::resolve_args(Kind::EntropyLoss, name, Some(&args(&config.entropy_loss_fn_args)))?;
        let f = registry::entropy_loss_fn(name, &resolved)?;
        let entropy = if name == "none" { None } else { Some(Named { name: name.to_owned(), f }) };

        let loss_agg_mode = config
            .loss_agg_mode
            .map(|m| m.name())
            .unwrap_or("token-mean")
            .parse::<LossAggMode>()
            .map_err(|e| TrainerError::setting("algorithm.loss_agg_mode", e))?;
        Ok(Components {
            algorithm_type: config.algorithm_type.clone(),
            advantage,
            policy_loss,
            kl_loss,
            kl_penalty,
            entropy,
            loss_agg_mode,
            use_reference: preset.use_reference,
            use_critic: preset.use_critic,
            compute_advantage_in_trainer: preset.compute_advantage_in_trainer,
            schema: preset.schema,
        })
    }

    /// Whether a train step needs reference logprobs: the preset asks for them (`use_reference`) and a
    /// component reads them — the KL loss, the KL reward penalty of a trainer-side advantage, or the policy loss
    /// ([`PolicyLossFn::reads_ref_logprob`]). Trinity-RFT scores the reference whenever the preset asks, also
    /// for GRPO with `kl_loss_fn: none`, where nothing reads the scores; leaving that forward pass (and the
    /// model copy it runs on) out changes no number. On the GRPO bench's bf16 config it was a forward over every
    /// row of each train step, and its first step also paid for the copy.
    pub fn needs_reference(&self) -> bool {
        let penalty = self.kl_penalty.is_some() && self.advantage.as_ref().is_some_and(|(_, in_trainer)| *in_trainer);
        self.use_reference && (self.kl_loss.is_some() || penalty || self.policy_loss.f.reads_ref_logprob())
    }

    /// The entropy coefficient of the loss (0 without an entropy term).
    pub fn entropy_coef(&self) -> f64 {
        self.entropy.as_ref().map_or(0.0, |e| e.f.entropy_coef)
    }
}
