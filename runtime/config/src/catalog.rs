//! What the configuration needs to know about registered components, without depending on them.
//!
//! Algorithms, workflows and rewards live in crates that link libtorch or wasmtime. The configuration only
//! needs their names, the presets' component choices and the default arguments, so those crates implement
//! [`Catalog`] and the CLI hands it to [`crate::Config::resolve`]. A change to config parsing then never
//! relinks the heavy crates.

use serde_json::{Map, Value};

/// The kinds of named component a config refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ComponentKind {
    /// `algorithm.algorithm_type`: a preset bundling the components below.
    AlgorithmType,
    /// `algorithm.advantage_fn`.
    AdvantageFn,
    /// `algorithm.policy_loss_fn`.
    PolicyLossFn,
    /// `algorithm.kl_penalty_fn` and `algorithm.kl_loss_fn` share one set of KL functions.
    KlFn,
    /// `algorithm.entropy_loss_fn`.
    EntropyLossFn,
    /// `algorithm.sample_strategy`.
    SampleStrategy,
    /// `default_workflow_type` and friends.
    Workflow,
    /// `default_reward_fn_type`.
    RewardFn,
    /// Experience pipeline operators.
    Operator,
}

impl ComponentKind {
    /// The word used in messages and in `trinity plugins list`.
    pub fn label(self) -> &'static str {
        match self {
            ComponentKind::AlgorithmType => "algorithm type",
            ComponentKind::AdvantageFn => "advantage function",
            ComponentKind::PolicyLossFn => "policy loss",
            ComponentKind::KlFn => "KL function",
            ComponentKind::EntropyLossFn => "entropy loss",
            ComponentKind::SampleStrategy => "sample strategy",
            ComponentKind::Workflow => "workflow",
            ComponentKind::RewardFn => "reward function",
            ComponentKind::Operator => "operator",
        }
    }
}

/// The defaults an `algorithm_type` preset contributes (Trinity-RFT's `AlgorithmType.default_config()`).
///
/// `None` means the preset leaves the global fallback in place.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preset {
    pub repeat_times: Option<u32>,
    pub sample_strategy: Option<String>,
    pub advantage_fn: Option<String>,
    pub policy_loss_fn: Option<String>,
    pub kl_penalty_fn: Option<String>,
    pub kl_loss_fn: Option<String>,
    pub entropy_loss_fn: Option<String>,
    pub loss_agg_mode: Option<String>,
    /// Arguments the preset sets for its components, merged over the component defaults.
    pub advantage_fn_args: Option<Map<String, Value>>,
    pub policy_loss_fn_args: Option<Map<String, Value>>,
    /// The preset trains a critic (value head); PPO.
    pub use_critic: bool,
    /// The preset needs reference-model logprobs.
    pub use_reference: bool,
    /// The advantage runs in the trainer rather than as the last explorer-side pipeline operator.
    pub compute_advantage_in_trainer: bool,
    /// What the experience buffer holds for this preset.
    pub schema: ExperienceSchema,
}

/// The row type an algorithm trains on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExperienceSchema {
    /// Rollouts with rewards (RL).
    #[default]
    Experience,
    /// Supervised (prompt, response) or message rows.
    Sft,
    /// Preference pairs (chosen, rejected).
    Dpo,
    /// Plain text for continued pre-training (Trinity-RFT 0.6.0's `cpt`): every token but the first is trained.
    Cpt,
}

impl ExperienceSchema {
    /// Trinity-RFT's name, as `schema_type` holds it.
    pub fn name(self) -> &'static str {
        match self {
            ExperienceSchema::Experience => "experience",
            ExperienceSchema::Sft => "sft",
            ExperienceSchema::Dpo => "dpo",
            ExperienceSchema::Cpt => "cpt",
        }
    }

    /// The schema `schema_type` names, or `None` for a name Trinity-RFT has no schema of.
    pub fn from_name(name: &str) -> Option<Self> {
        [ExperienceSchema::Experience, ExperienceSchema::Sft, ExperienceSchema::Dpo, ExperienceSchema::Cpt]
            .into_iter()
            .find(|s| s.name() == name)
    }
}

/// Registered components, as seen by the configuration.
pub trait Catalog {
    /// Every registered name of one kind, sorted; used for validation and did-you-mean suggestions.
    fn names(&self, kind: ComponentKind) -> Vec<String>;

    /// The preset of an `algorithm_type`, or `None` when no such preset is registered.
    fn preset(&self, algorithm_type: &str) -> Option<Preset>;

    /// The default arguments of one component, or `None` when it is not registered.
    fn default_args(&self, kind: ComponentKind, name: &str) -> Option<Map<String, Value>>;

    /// Whether `name` is valid though not among [`Catalog::names`]: a name resolved when the run starts, such as
    /// a workflow given as a dotted path to a Python class (the Python workflow host checks it at `--dry-run`).
    fn accepts(&self, _kind: ComponentKind, _name: &str) -> bool {
        false
    }

    /// What else was consulted about a `name` that is neither registered nor accepted, and what it said (the
    /// Python workflow host's answer from Trinity-RFT's registry), appended to the unknown-name error.
    fn unknown_note(&self, _kind: ComponentKind, _name: &str) -> Option<String> {
        None
    }
}

/// A catalog for unit tests of resolution rules: every name is registered (an empty list means "not checked")
/// and every preset is plain, except that `sft`, `dpo` and `cpt` train on datasets.
#[cfg(test)]
pub(crate) struct AnyName;

#[cfg(test)]
impl Catalog for AnyName {
    fn names(&self, _kind: ComponentKind) -> Vec<String> {
        Vec::new()
    }
    fn preset(&self, algorithm_type: &str) -> Option<Preset> {
        let schema = match algorithm_type {
            "sft" => ExperienceSchema::Sft,
            "dpo" => ExperienceSchema::Dpo,
            "cpt" => ExperienceSchema::Cpt,
            _ => ExperienceSchema::Experience,
        };
        Some(Preset { schema, ..Preset::default() })
    }
    fn default_args(&self, _kind: ComponentKind, _name: &str) -> Option<Map<String, Value>> {
        None
    }
}
