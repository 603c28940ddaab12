//! The registry of components: built-ins, collected with `inventory` from the registration next to each
//! component, then the components registered from elsewhere ([`crate::external`]: the algorithm libraries
//! `trinity-algorithm-library` loads); and its [`Catalog`] view for configuration validation. An external name
//! never shadows a built-in (the loader refuses the clash), so the lookup order only matters for speed.

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};
use trinity_config::{Catalog, ComponentKind, Preset};

use crate::advantage::{AdvantageFn, AdvantageFnEntry};
use crate::args::{ArgDefault, ArgSpec, Args, arg, defaults_map};
use crate::entropy::{ENTROPY_ARGS, EntropyLossFn, EntropyLossFnEntry};
use crate::error::AlgorithmError;
use crate::external;
use crate::kl::{KL_ARGS, KlFn, KlFnEntry};
use crate::policy_loss::{PolicyLossFn, PolicyLossFnEntry};
use crate::preset::PresetEntry;

/// The kinds of component this crate registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    AlgorithmType,
    AdvantageFn,
    PolicyLoss,
    KlFn,
    EntropyLoss,
    SampleStrategy,
}

impl Kind {
    /// Every kind, in listing order.
    pub const ALL: [Kind; 6] =
        [Kind::AlgorithmType, Kind::AdvantageFn, Kind::PolicyLoss, Kind::KlFn, Kind::EntropyLoss, Kind::SampleStrategy];

    /// The configuration's name for the kind.
    pub fn component_kind(self) -> ComponentKind {
        match self {
            Kind::AlgorithmType => ComponentKind::AlgorithmType,
            Kind::AdvantageFn => ComponentKind::AdvantageFn,
            Kind::PolicyLoss => ComponentKind::PolicyLossFn,
            Kind::KlFn => ComponentKind::KlFn,
            Kind::EntropyLoss => ComponentKind::EntropyLossFn,
            Kind::SampleStrategy => ComponentKind::SampleStrategy,
        }
    }

    fn from_component_kind(kind: ComponentKind) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.component_kind() == kind)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.component_kind().label())
    }
}

/// A registered sample strategy: only its name and arguments live here (sampling belongs to the buffer).
#[derive(Debug)]
pub struct SampleStrategyEntry {
    pub name: &'static str,
    pub args: &'static [ArgSpec],
}

inventory::collect!(SampleStrategyEntry);

inventory::submit! { SampleStrategyEntry { name: "default", args: &[] } }
inventory::submit! { SampleStrategyEntry { name: "warmup", args: &[] } }
inventory::submit! {
    SampleStrategyEntry { name: "staleness_control", args: &[arg("max_staleness", ArgDefault::Null)] }
}
inventory::submit! {
    SampleStrategyEntry {
        name: "mix",
        args: &[arg("expert_data_ratio", ArgDefault::Float(0.5)), arg("sft_dataset_name", ArgDefault::Str("sft_dataset"))],
    }
}

/// The accepted arguments of a registered component, or `None` when no such component exists.
pub fn arg_specs(kind: Kind, name: &str) -> Option<&'static [ArgSpec]> {
    builtin_arg_specs(kind, name).or_else(|| external::find(|s| s.arg_specs(kind, name)))
}

fn builtin_arg_specs(kind: Kind, name: &str) -> Option<&'static [ArgSpec]> {
    match kind {
        Kind::AlgorithmType => inventory::iter::<PresetEntry>.into_iter().find(|e| e.name == name).map(|_| &[][..]),
        Kind::AdvantageFn => advantage_entry(name).map(|e| e.args),
        Kind::PolicyLoss => policy_loss_entry(name).map(|e| e.args),
        Kind::KlFn => kl_entry(name).map(|_| KL_ARGS),
        Kind::EntropyLoss => entropy_entry(name).map(|_| ENTROPY_ARGS),
        Kind::SampleStrategy => {
            inventory::iter::<SampleStrategyEntry>.into_iter().find(|e| e.name == name).map(|e| e.args)
        }
    }
}

/// Every registered name of one kind (built-in or external), sorted.
pub fn names(kind: Kind) -> Vec<String> {
    let mut names = builtin_names(kind);
    names.extend(external::names(kind));
    names.sort();
    names
}

/// The built-in names of one kind, sorted (what an external component may not be named).
pub fn builtin_names(kind: Kind) -> Vec<String> {
    let mut names: Vec<String> = match kind {
        Kind::AlgorithmType => inventory::iter::<PresetEntry>.into_iter().map(|e| e.name.to_owned()).collect(),
        Kind::AdvantageFn => inventory::iter::<AdvantageFnEntry>.into_iter().map(|e| e.name.to_owned()).collect(),
        Kind::PolicyLoss => inventory::iter::<PolicyLossFnEntry>.into_iter().map(|e| e.name.to_owned()).collect(),
        Kind::KlFn => inventory::iter::<KlFnEntry>.into_iter().map(|e| e.name.to_owned()).collect(),
        Kind::EntropyLoss => inventory::iter::<EntropyLossFnEntry>.into_iter().map(|e| e.name.to_owned()).collect(),
        Kind::SampleStrategy => inventory::iter::<SampleStrategyEntry>.into_iter().map(|e| e.name.to_owned()).collect(),
    };
    names.sort();
    names
}

fn unknown(kind: Kind, name: &str) -> AlgorithmError {
    AlgorithmError::UnknownComponent { kind, name: name.to_owned(), known: names(kind) }
}

fn advantage_entry(name: &str) -> Option<&'static AdvantageFnEntry> {
    inventory::iter::<AdvantageFnEntry>.into_iter().find(|e| e.name == name)
}

fn policy_loss_entry(name: &str) -> Option<&'static PolicyLossFnEntry> {
    inventory::iter::<PolicyLossFnEntry>.into_iter().find(|e| e.name == name)
}

fn kl_entry(name: &str) -> Option<&'static KlFnEntry> {
    inventory::iter::<KlFnEntry>.into_iter().find(|e| e.name == name)
}

fn entropy_entry(name: &str) -> Option<&'static EntropyLossFnEntry> {
    inventory::iter::<EntropyLossFnEntry>.into_iter().find(|e| e.name == name)
}

/// A preset by `algorithm_type`. An external preset that cannot be read (an unknown schema) is logged and treated
/// as absent, so the unknown-name error that follows lists what is available.
pub fn preset(name: &str) -> Option<Preset> {
    if let Some(e) = inventory::iter::<PresetEntry>.into_iter().find(|e| e.name == name) {
        return Some((e.preset)());
    }
    match external::find(|s| s.preset(name))? {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::error!("{e}");
            None
        }
    }
}

/// Resolves `user` arguments for a registered component (defaults filled, unknown names rejected).
pub fn resolve_args(kind: Kind, name: &str, user: Option<&Map<String, Value>>) -> Result<Args, AlgorithmError> {
    let specs = arg_specs(kind, name).ok_or_else(|| unknown(kind, name))?;
    Args::resolve(kind, name, specs, user)
}

/// Builds an advantage function; the flag says whether it runs in the trainer.
pub fn advantage_fn(name: &str, args: &Args) -> Result<(Box<dyn AdvantageFn>, bool), AlgorithmError> {
    match advantage_entry(name) {
        Some(entry) => Ok(((entry.build)(args)?, entry.compute_in_trainer)),
        None => external::find(|s| s.advantage_fn(name, args)).ok_or_else(|| unknown(Kind::AdvantageFn, name)),
    }
}

/// Builds a policy loss.
pub fn policy_loss_fn(name: &str, args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    match policy_loss_entry(name) {
        Some(entry) => (entry.build)(args),
        None => external::find(|s| s.policy_loss_fn(name, args)).ok_or_else(|| unknown(Kind::PolicyLoss, name)),
    }
}

/// Builds a KL function (for the loss or the reward penalty).
pub fn kl_fn(name: &str, args: &Args) -> Result<KlFn, AlgorithmError> {
    match kl_entry(name) {
        Some(entry) => KlFn::from_args(entry.estimator, args),
        None => KlFn::from_external(
            external::find(|s| s.kl_estimator(name)).ok_or_else(|| unknown(Kind::KlFn, name))?,
            args,
        ),
    }
}

/// Builds an entropy loss.
pub fn entropy_loss_fn(name: &str, args: &Args) -> Result<EntropyLossFn, AlgorithmError> {
    match entropy_entry(name) {
        Some(entry) => EntropyLossFn::from_args(entry.kind, args),
        None => EntropyLossFn::from_external(
            external::find(|s| s.entropy_loss(name)).ok_or_else(|| unknown(Kind::EntropyLoss, name))?,
            args,
        ),
    }
}

/// One line of `trinity algorithm list`.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    pub kind: Kind,
    pub name: String,
    /// Every accepted argument with its default (for presets: the preset's choices).
    pub default_args: Map<String, Value>,
    /// The file of the algorithm library (or other external source) that provides it; absent for built-ins.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub library: Option<std::path::PathBuf>,
}

/// Every registered component, by kind then name.
pub fn list() -> Vec<Listing> {
    let mut out = Vec::new();
    for kind in Kind::ALL {
        for name in names(kind) {
            let default_args = match kind {
                Kind::AlgorithmType => preset(&name).map(preset_summary).unwrap_or_default(),
                _ => arg_specs(kind, &name).map(defaults_map).unwrap_or_default(),
            };
            let library = external::find(|s| s.origin(kind, &name));
            out.push(Listing { kind, name, default_args, library });
        }
    }
    out
}

/// A preset's choices as JSON, for listings.
pub fn preset_summary(p: Preset) -> Map<String, Value> {
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        if !v.is_null() {
            m.insert(k.to_owned(), v);
        }
    };
    put("repeat_times", p.repeat_times.map_or(Value::Null, Value::from));
    for (key, value) in [
        ("sample_strategy", &p.sample_strategy),
        ("advantage_fn", &p.advantage_fn),
        ("policy_loss_fn", &p.policy_loss_fn),
        ("kl_penalty_fn", &p.kl_penalty_fn),
        ("kl_loss_fn", &p.kl_loss_fn),
        ("entropy_loss_fn", &p.entropy_loss_fn),
        ("loss_agg_mode", &p.loss_agg_mode),
    ] {
        put(key, value.clone().map_or(Value::Null, Value::from));
    }
    put("advantage_fn_args", p.advantage_fn_args.clone().map_or(Value::Null, Value::Object));
    put("policy_loss_fn_args", p.policy_loss_fn_args.clone().map_or(Value::Null, Value::Object));
    put("use_critic", Value::Bool(p.use_critic));
    put("use_reference", Value::Bool(p.use_reference));
    put("compute_advantage_in_trainer", Value::Bool(p.compute_advantage_in_trainer));
    put("schema", Value::from(p.schema.name()));
    m
}

/// The built-in components as the configuration sees them.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuiltinCatalog;

impl Catalog for BuiltinCatalog {
    fn names(&self, kind: ComponentKind) -> Vec<String> {
        Kind::from_component_kind(kind).map(names).unwrap_or_default()
    }

    fn preset(&self, algorithm_type: &str) -> Option<Preset> {
        preset(algorithm_type)
    }

    fn default_args(&self, kind: ComponentKind, name: &str) -> Option<Map<String, Value>> {
        let kind = Kind::from_component_kind(kind)?;
        match kind {
            Kind::AlgorithmType => preset(name).map(|_| Map::new()),
            _ => arg_specs(kind, name).map(defaults_map),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_component_of_the_issue_is_registered() {
        let has = |kind: Kind, list: &[&str]| {
            let names = names(kind);
            for n in list {
                assert!(names.iter().any(|x| x == n), "{kind} {n} missing");
            }
        };
        has(
            Kind::AdvantageFn,
            &[
                "grpo",
                "opmd",
                "asymre",
                "reinforce",
                "rec",
                "step_wise_grpo",
                "ppo",
                "grpo_verl",
                "rloo",
                "reinforceplusplus",
                "remax",
                "on_policy_distill",
                "jsd",
                "clipb",
                "clipv",
                "gigpo",
            ],
        );
        has(
            Kind::PolicyLoss,
            &[
                "ppo",
                "gspo",
                "cispo",
                "sapo",
                "topr",
                "sppo",
                "opmd",
                "rec",
                "importance_sampling",
                "sft",
                "sft_is",
                "sft_phi",
                "dpo",
                "mix",
                "mix_chord",
            ],
        );
        has(Kind::KlFn, &["none", "k1", "k2", "k3", "low_var_kl", "abs", "corrected_k3"]);
        has(Kind::EntropyLoss, &["default", "mix", "none"]);
        has(
            Kind::AlgorithmType,
            &[
                "ppo",
                "grpo",
                "rloo",
                "reinforceplusplus",
                "opmd",
                "asymre",
                "topr",
                "cispo",
                "gspo",
                "sapo",
                "sppo",
                "rec",
                "multi_step_grpo",
                "mix",
                "mix_chord",
                "sft",
                "dpo",
                "on_policy_distill",
                "jsd",
                "grpo_verl",
                "raft",
                "gigpo",
                "cpt",
            ],
        );
    }

    #[test]
    fn names_are_unique_per_kind() {
        for kind in Kind::ALL {
            let mut n = names(kind);
            let before = n.len();
            n.dedup();
            assert_eq!(before, n.len(), "duplicate {kind}");
        }
    }

    #[test]
    fn catalog_reports_defaults() {
        let c = BuiltinCatalog;
        let ppo = c.default_args(ComponentKind::PolicyLossFn, "ppo").unwrap();
        assert_eq!(ppo["clip_range"], 0.2);
        assert_eq!(ppo["clip_ratio_c"], 3.0);
        assert_eq!(c.default_args(ComponentKind::KlFn, "k2").unwrap()["kl_coef"], 0.001);
        assert!(c.default_args(ComponentKind::AdvantageFn, "nope").is_none());
        assert!(c.names(ComponentKind::Workflow).is_empty());
        assert_eq!(c.preset("grpo").unwrap().repeat_times, Some(2));
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = resolve_args(Kind::PolicyLoss, "ppo2", None).unwrap_err().to_string();
        assert!(err.contains("ppo2") && err.contains("gspo"), "{err}");
    }
}
