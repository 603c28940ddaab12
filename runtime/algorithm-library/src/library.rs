//! The loaded libraries and their components, and the [`ExternalComponents`] view of them that
//! trinity-algorithm's registry consults after the built-ins.
//!
//! Invariants:
//! * A name is unique per kind across built-ins and every loaded library; a clash is an error at load, naming
//!   both sides, never a silent override.
//! * Each file is loaded on its own (trinity-plugin-sdk's `load`, one abi_stable header per file), so two
//!   libraries never alias. Loading the same file twice returns the first registration.
//! * Libraries are never unloaded (abi_stable leaks them, as anything may point into them); so the argument
//!   tables built here are leaked too, which lets them be the same `&'static [ArgSpec]` built-ins use.
//! * Everything a library returns is checked (shapes, row indices) before the trainer sees it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Once, RwLock};

use serde::Serialize;
use serde_json::{Map, Value};
use tch::Tensor;
use trinity_algorithm::advantage::{AdvantageFn, AdvantageOutput};
use trinity_algorithm::args::{ArgDefault, ArgSpec, Args};
use trinity_algorithm::entropy::ENTROPY_ARGS;
use trinity_algorithm::external::{self, ExternalComponents, ExternalEntropy, ExternalKl};
use trinity_algorithm::kl::KL_ARGS;
use trinity_algorithm::metrics::Metrics;
use trinity_algorithm::policy_loss::PolicyLossFn;
use trinity_algorithm::registry::{self, Kind};
use trinity_algorithm::{AlgorithmError, Batch};
use trinity_config::{ExperienceSchema, Preset};
use trinity_plugin_sdk::algorithm::{self as sdk, ComponentKind, LoadedComponent};

use crate::error::LibraryError;

/// The algorithm-library API this trinity speaks: the trinity-plugin-sdk version libraries must be built with
/// (in Cargo's compatibility sense), and what a registry index's `api` range is matched against.
pub const API_VERSION: &str = trinity_plugin_sdk::algorithm::compat::SDK_VERSION;

/// A loaded library, as `trinity plugins list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LibraryInfo {
    /// The library crate's name.
    pub name: String,
    pub version: String,
    /// The file it was loaded from.
    pub path: PathBuf,
    /// The trinity-plugin-sdk it was built against.
    pub sdk_version: String,
    pub components: Vec<ComponentInfo>,
}

/// One component of a loaded library.
#[derive(Debug, Clone, Serialize)]
pub struct ComponentInfo {
    pub kind: Kind,
    pub name: String,
    /// The author's one-line description (may be empty).
    pub doc: String,
}

/// A component of a loaded library, with its argument table in the registry's form.
#[derive(Debug)]
struct LibraryComponent {
    kind: Kind,
    args: &'static [ArgSpec],
    library: String,
    inner: LoadedComponent,
}

impl LibraryComponent {
    /// An error of this component, naming it and its library.
    fn error(&self, message: impl Into<String>) -> AlgorithmError {
        AlgorithmError::Library {
            kind: self.kind,
            name: self.inner.name.clone(),
            library: self.library.clone(),
            message: message.into(),
        }
    }

    fn check_shape(&self, what: &str, t: &Tensor, want: &[i64]) -> Result<(), AlgorithmError> {
        let got = t.size();
        if got != want {
            return Err(self.error(format!("returned a {what} of shape {got:?}, expected {want:?}")));
        }
        Ok(())
    }
}

impl ExternalKl for LibraryComponent {
    /// Runs the library's KL estimator; its result must have the shape of `logprob`.
    fn kl(
        &self,
        logprob: &Tensor,
        reference: &Tensor,
        old: Option<&Tensor>,
        args: &Map<String, Value>,
    ) -> Result<Tensor, AlgorithmError> {
        let kl = self.inner.kl(logprob, reference, old, args).map_err(|e| self.error(e.message()))?;
        self.check_shape("KL", &kl, &logprob.size())?;
        Ok(kl)
    }
}

impl ExternalEntropy for LibraryComponent {
    /// Runs the library's entropy loss: the unscaled aggregate (a scalar) and its metrics.
    fn entropy(
        &self,
        batch: &Batch,
        mode: &str,
        args: &Map<String, Value>,
    ) -> Result<(Tensor, Metrics), AlgorithmError> {
        let out =
            with_sdk_batch(batch, |b| self.inner.entropy_loss(b, mode, args)).map_err(|e| self.error(e.message()))?;
        self.check_shape("entropy loss", &out.loss, &[])?;
        Ok((out.loss, out.metrics))
    }
}

/// Loaded libraries and their components, in load order.
struct Loaded {
    info: LibraryInfo,
    /// The canonical path, to recognise a second registration of the same file.
    canonical: PathBuf,
    components: Vec<Arc<LibraryComponent>>,
}

static LIBRARIES: RwLock<Vec<Loaded>> = RwLock::new(Vec::new());

fn libraries() -> std::sync::RwLockReadGuard<'static, Vec<Loaded>> {
    // A poisoned lock only means another thread panicked while holding it; the list itself is only ever
    // replaced whole (push), so it is consistent.
    LIBRARIES.read().unwrap_or_else(|e| e.into_inner())
}

fn kind_of(kind: ComponentKind) -> Kind {
    match kind {
        ComponentKind::Preset => Kind::AlgorithmType,
        ComponentKind::AdvantageFn => Kind::AdvantageFn,
        ComponentKind::PolicyLoss => Kind::PolicyLoss,
        ComponentKind::KlFn => Kind::KlFn,
        ComponentKind::EntropyLoss => Kind::EntropyLoss,
    }
}

/// Loads an algorithm library file and registers its components. Loading a file already registered returns its
/// first registration.
pub fn register_file(path: &Path) -> Result<LibraryInfo, LibraryError> {
    offer_to_registry();
    let canonical = std::fs::canonicalize(path)
        .map_err(|e| LibraryError::File { path: path.to_owned(), message: format!("cannot read it: {e}") })?;
    if let Some(known) = libraries().iter().find(|l| l.canonical == canonical) {
        return Ok(known.info.clone());
    }
    let library = sdk::load(&canonical)?;
    let mut components = Vec::new();
    for inner in library.components {
        let kind = kind_of(inner.kind);
        let args = arg_table(kind, &inner).map_err(|message| AlgorithmError::Library {
            kind,
            name: inner.name.clone(),
            library: library.name.clone(),
            message,
        })?;
        components.push(Arc::new(LibraryComponent { kind, args, library: library.name.clone(), inner }));
    }
    let info = LibraryInfo {
        name: library.name,
        version: library.version,
        path: canonical.clone(),
        sdk_version: library.versions.sdk,
        components: components
            .iter()
            .map(|c| ComponentInfo { kind: c.kind, name: c.inner.name.clone(), doc: c.inner.doc.clone() })
            .collect(),
    };

    let mut all = LIBRARIES.write().unwrap_or_else(|e| e.into_inner());
    if let Some(known) = all.iter().find(|l| l.canonical == canonical) {
        return Ok(known.info.clone());
    }
    for (i, c) in components.iter().enumerate() {
        let name = &c.inner.name;
        let clash = |other: String| LibraryError::NameClash {
            kind: c.kind,
            name: name.clone(),
            path: canonical.clone(),
            other,
        };
        if registry::builtin_names(c.kind).contains(name) {
            return Err(clash("a built-in".to_owned()));
        }
        if components[..i].iter().any(|o| o.kind == c.kind && &o.inner.name == name) {
            return Err(clash("another component of the same library".to_owned()));
        }
        if let Some(other) = all.iter().find(|l| l.components.iter().any(|o| o.kind == c.kind && &o.inner.name == name))
        {
            return Err(clash(format!("algorithm library `{}` ({})", other.info.name, other.info.path.display())));
        }
    }
    all.push(Loaded { info: info.clone(), canonical, components });
    tracing::info!(
        "loaded algorithm library `{}` {} from {} ({} components)",
        info.name,
        info.version,
        info.path.display(),
        info.components.len()
    );
    Ok(info)
}

/// Every library loaded so far, in load order.
pub fn loaded() -> Vec<LibraryInfo> {
    libraries().iter().map(|l| l.info.clone()).collect()
}

/// A loaded component by kind and name.
fn find(kind: Kind, name: &str) -> Option<Arc<LibraryComponent>> {
    libraries().iter().flat_map(|l| &l.components).find(|c| c.kind == kind && c.inner.name == name).cloned()
}

/// The loaded libraries as trinity-algorithm's registry sees them: every lookup reads the list above.
#[derive(Debug)]
struct Libraries;

static LIBRARIES_SOURCE: Libraries = Libraries;

/// Registers the loaded libraries with trinity-algorithm's registry, once per process (before the first library
/// is added, so its components are visible as soon as `register_file` returns).
fn offer_to_registry() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| external::register(&LIBRARIES_SOURCE));
}

impl ExternalComponents for Libraries {
    fn names(&self, kind: Kind) -> Vec<String> {
        libraries()
            .iter()
            .flat_map(|l| &l.components)
            .filter(|c| c.kind == kind)
            .map(|c| c.inner.name.clone())
            .collect()
    }

    fn arg_specs(&self, kind: Kind, name: &str) -> Option<&'static [ArgSpec]> {
        find(kind, name).map(|c| c.args)
    }

    /// The file of the library that provides a component.
    fn origin(&self, kind: Kind, name: &str) -> Option<PathBuf> {
        libraries()
            .iter()
            .find(|l| l.components.iter().any(|c| c.kind == kind && c.inner.name == name))
            .map(|l| l.info.path.clone())
    }

    fn preset(&self, name: &str) -> Option<Result<Preset, AlgorithmError>> {
        preset(name)
    }

    fn advantage_fn(&self, name: &str, args: &Args) -> Option<(Box<dyn AdvantageFn>, bool)> {
        advantage_fn(name, args)
    }

    fn policy_loss_fn(&self, name: &str, args: &Args) -> Option<Box<dyn PolicyLossFn>> {
        policy_loss_fn(name, args)
    }

    fn kl_estimator(&self, name: &str) -> Option<Arc<dyn ExternalKl>> {
        find(Kind::KlFn, name).map(|c| c as Arc<dyn ExternalKl>)
    }

    fn entropy_loss(&self, name: &str) -> Option<Arc<dyn ExternalEntropy>> {
        find(Kind::EntropyLoss, name).map(|c| c as Arc<dyn ExternalEntropy>)
    }
}

/// The argument table of a component in the registry's form: the arguments every KL function or entropy loss
/// has (applied by the host), then the component's own. Leaked: libraries live as long as the process.
fn arg_table(kind: Kind, c: &LoadedComponent) -> Result<&'static [ArgSpec], String> {
    let mut specs: Vec<ArgSpec> = match kind {
        Kind::KlFn => KL_ARGS.to_vec(),
        Kind::EntropyLoss => ENTROPY_ARGS.to_vec(),
        _ => Vec::new(),
    };
    for (name, value) in &c.args {
        if specs.iter().any(|s| s.name == name) {
            return Err(format!("argument `{name}` is already an argument of every {kind}"));
        }
        let default = match value {
            Value::Null => ArgDefault::Null,
            Value::Bool(b) => ArgDefault::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => ArgDefault::Int(i),
                (None, Some(f)) => ArgDefault::Float(f),
                _ => return Err(format!("argument `{name}` has a default out of range: {n}")),
            },
            Value::String(s) => ArgDefault::Str(Box::leak(s.clone().into_boxed_str())),
            other => {
                return Err(format!(
                    "argument `{name}` has default {other}; defaults must be null, a boolean, a number or a string"
                ));
            }
        };
        specs.push(ArgSpec { name: Box::leak(name.clone().into_boxed_str()), default });
    }
    Ok(Box::leak(specs.into_boxed_slice()))
}

/// A library's preset in the configuration's form.
fn preset(name: &str) -> Option<Result<Preset, AlgorithmError>> {
    let c = find(Kind::AlgorithmType, name)?;
    let p = c.inner.preset.clone()?;
    let schema = match p.schema.as_deref().map(ExperienceSchema::from_name) {
        None => ExperienceSchema::Experience,
        Some(Some(schema)) => schema,
        Some(None) => {
            let other = p.schema.as_deref().unwrap_or_default();
            return Some(Err(c.error(format!("unknown schema `{other}`; use experience, sft, dpo or cpt"))));
        }
    };
    Some(Ok(Preset {
        repeat_times: p.repeat_times,
        sample_strategy: p.sample_strategy,
        advantage_fn: p.advantage_fn,
        policy_loss_fn: p.policy_loss_fn,
        kl_penalty_fn: p.kl_penalty_fn,
        kl_loss_fn: p.kl_loss_fn,
        entropy_loss_fn: p.entropy_loss_fn,
        loss_agg_mode: p.loss_agg_mode,
        advantage_fn_args: p.advantage_fn_args,
        policy_loss_fn_args: p.policy_loss_fn_args,
        use_critic: p.use_critic,
        use_reference: p.use_reference,
        compute_advantage_in_trainer: p.compute_advantage_in_trainer,
        schema,
    }))
}

/// Lends a trinity-algorithm batch to a library call as the SDK's borrowed view.
fn with_sdk_batch<R>(batch: &Batch, call: impl FnOnce(&sdk::Batch<'_>) -> R) -> R {
    fn ids(v: &Option<Vec<String>>) -> Option<Vec<&str>> {
        v.as_ref().map(|v| v.iter().map(String::as_str).collect())
    }
    let (group_id, run_id) = (ids(&batch.group_id), ids(&batch.run_id));
    let view = sdk::Batch {
        action_mask: &batch.action_mask,
        logprob: batch.logprob.as_ref(),
        old_logprob: batch.old_logprob.as_ref(),
        ref_logprob: batch.ref_logprob.as_ref(),
        advantages: batch.advantages.as_ref(),
        token_level_rewards: batch.token_level_rewards.as_ref(),
        values: batch.values.as_ref(),
        entropy: batch.entropy.as_ref(),
        teacher_logprob: batch.teacher_logprob.as_ref(),
        reward: batch.reward.as_deref(),
        reward_baselines: batch.reward_baselines.as_deref(),
        group_id: group_id.as_deref(),
        run_id: run_id.as_deref(),
        step: batch.step.as_deref(),
        expert_mask: batch.expert_mask.as_deref(),
    };
    call(&view)
}

/// A library's advantage function bound to its arguments.
#[derive(Debug)]
struct LibraryAdvantage {
    component: Arc<LibraryComponent>,
    args: Map<String, Value>,
}

impl AdvantageFn for LibraryAdvantage {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let c = &self.component;
        let out = with_sdk_batch(batch, |b| c.inner.advantage(b, &self.args)).map_err(|e| c.error(e.message()))?;
        let shape = batch.action_mask.size();
        c.check_shape("advantages", &out.advantages, &shape)?;
        c.check_shape("returns", &out.returns, &shape)?;
        if let Some(rows) = &out.rows
            && let Some(bad) = rows.iter().find(|&&r| r < 0 || r as usize >= batch.rows())
        {
            return Err(c.error(format!("returned row index {bad} for a batch of {} rows", batch.rows())));
        }
        Ok(AdvantageOutput {
            advantages: out.advantages,
            returns: out.returns,
            metrics: out.metrics,
            rows: out.rows,
            action_mask: None,
        })
    }
}

/// A library's policy loss bound to its arguments.
#[derive(Debug)]
struct LibraryPolicyLoss {
    component: Arc<LibraryComponent>,
    args: Map<String, Value>,
}

impl PolicyLossFn for LibraryPolicyLoss {
    /// A library's loss gets the whole batch view and may read the reference logprobs.
    fn reads_ref_logprob(&self) -> bool {
        true
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let c = &self.component;
        let out = with_sdk_batch(batch, |b| c.inner.policy_loss(b, &self.args)).map_err(|e| c.error(e.message()))?;
        c.check_shape("loss", &out.loss, &[])?;
        Ok((out.loss, out.metrics))
    }
}

/// Builds a library's advantage function; the flag says whether it runs in the trainer.
fn advantage_fn(name: &str, args: &Args) -> Option<(Box<dyn AdvantageFn>, bool)> {
    let component = find(Kind::AdvantageFn, name)?;
    let in_trainer = component.inner.compute_in_trainer;
    Some((Box::new(LibraryAdvantage { component, args: args.values().clone() }), in_trainer))
}

/// Builds a library's policy loss.
fn policy_loss_fn(name: &str, args: &Args) -> Option<Box<dyn PolicyLossFn>> {
    let component = find(Kind::PolicyLoss, name)?;
    Some(Box::new(LibraryPolicyLoss { component, args: args.values().clone() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_aggregation_matches_the_built_in_one() {
        let x = Tensor::from_slice(&[1.0f32, -2.0, 3.5, 4.0, 5.0, 0.25]).view([2, 3]);
        let m = Tensor::from_slice(&[1.0f32, 1.0, 0.0, 1.0, 0.0, 1.0]).view([2, 3]);
        for name in trinity_algorithm::LossAggMode::NAMES {
            let ours =
                name.parse::<trinity_algorithm::LossAggMode>().unwrap().aggregate(&x, &m, None).double_value(&[]);
            let theirs = sdk::aggregate(&x, &m, name).unwrap().double_value(&[]);
            assert!((ours - theirs).abs() < 1e-6, "{name}: {ours} vs {theirs}");
        }
    }

    #[test]
    fn a_missing_or_foreign_file_is_an_error_naming_it() {
        let err = register_file(Path::new("/nonexistent/libnothing.so")).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/libnothing.so"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("libfake.so");
        std::fs::write(&fake, b"not a shared library").unwrap();
        let err = register_file(&fake).unwrap_err().to_string();
        assert!(err.contains("libfake.so") && err.contains("cannot load algorithm library"), "{err}");
        assert!(loaded().iter().all(|l| !l.path.ends_with("libfake.so")));
    }
}
