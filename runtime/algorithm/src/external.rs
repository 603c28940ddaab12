//! Components from elsewhere: the extension point through which components that are not compiled into this
//! crate (today: the algorithm libraries `trinity-algorithm-library` loads) join the registry. A provider
//! implements [`ExternalComponents`] and calls [`register`] once; [`crate::registry`] consults every registered
//! provider after the built-ins, so configs, `trinity algorithm eval` and the trainer use their components by name
//! exactly like built-ins.
//!
//! This seam exists so the loss math does not link the plugin ABI (abi_stable, libloading): the loader depends on
//! this crate, never the other way round.
//!
//! Invariants:
//! * A provider never offers a name a built-in already has (it refuses the clash when it adds the component), so
//!   the registry's lookup order only matters for speed.
//! * Providers are `'static` and never removed: the argument tables and components they hand out may be held for
//!   the rest of the process.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};
use tch::Tensor;
use trinity_config::Preset;

use crate::advantage::AdvantageFn;
use crate::args::{ArgSpec, Args};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;
use crate::policy_loss::PolicyLossFn;
use crate::registry::Kind;

/// A source of components beyond the built-ins. Every lookup returns `None` for a name the source does not have.
pub trait ExternalComponents: fmt::Debug + Send + Sync {
    /// The names of every component of one kind this source provides.
    fn names(&self, kind: Kind) -> Vec<String>;

    /// The accepted arguments of a component, including those every KL function or entropy loss has (the host
    /// applies those: [`crate::kl::KL_ARGS`], [`crate::entropy::ENTROPY_ARGS`]).
    fn arg_specs(&self, kind: Kind, name: &str) -> Option<&'static [ArgSpec]>;

    /// Where a component comes from (the library file), for listings.
    fn origin(&self, kind: Kind, name: &str) -> Option<PathBuf>;

    /// A preset by `algorithm_type`; an error when the source has it but cannot express it as a [`Preset`].
    fn preset(&self, name: &str) -> Option<Result<Preset, AlgorithmError>>;

    /// An advantage function bound to its resolved arguments; the flag says whether it runs in the trainer.
    fn advantage_fn(&self, name: &str, args: &Args) -> Option<(Box<dyn AdvantageFn>, bool)>;

    /// A policy loss bound to its resolved arguments.
    fn policy_loss_fn(&self, name: &str, args: &Args) -> Option<Box<dyn PolicyLossFn>>;

    /// A KL function's per-token estimator; the coefficient, aggregation and controller stay the host's.
    fn kl_estimator(&self, name: &str) -> Option<Arc<dyn ExternalKl>>;

    /// An entropy loss's unscaled aggregate; the coefficient stays the host's.
    fn entropy_loss(&self, name: &str) -> Option<Arc<dyn ExternalEntropy>>;
}

/// The per-token estimate of an external KL function.
pub trait ExternalKl: fmt::Debug + Send + Sync {
    /// KL of `logprob` from `reference` per token (the shape of `logprob`), with every resolved argument.
    fn kl(
        &self,
        logprob: &Tensor,
        reference: &Tensor,
        old: Option<&Tensor>,
        args: &Map<String, Value>,
    ) -> Result<Tensor, AlgorithmError>;
}

/// The unscaled aggregate of an external entropy loss.
pub trait ExternalEntropy: fmt::Debug + Send + Sync {
    /// The aggregate (a scalar) under loss aggregation `mode`, and its metrics.
    fn entropy(
        &self,
        batch: &Batch,
        mode: &str,
        args: &Map<String, Value>,
    ) -> Result<(Tensor, Metrics), AlgorithmError>;
}

static SOURCES: RwLock<Vec<&'static dyn ExternalComponents>> = RwLock::new(Vec::new());

/// Adds a source of components; registering the same source again does nothing.
pub fn register(source: &'static dyn ExternalComponents) {
    // A poisoned lock only means another thread panicked while holding it; the list is only ever pushed to.
    let mut all = SOURCES.write().unwrap_or_else(|e| e.into_inner());
    if !all.iter().any(|known| std::ptr::addr_eq(*known, source)) {
        all.push(source);
    }
}

/// Every registered source, in registration order.
fn sources() -> Vec<&'static dyn ExternalComponents> {
    SOURCES.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The first source's answer to `lookup`.
pub(crate) fn find<T>(lookup: impl Fn(&dyn ExternalComponents) -> Option<T>) -> Option<T> {
    sources().into_iter().find_map(lookup)
}

/// The names of every external component of one kind, across sources.
pub(crate) fn names(kind: Kind) -> Vec<String> {
    sources().into_iter().flat_map(|s| s.names(kind)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advantage::AdvantageOutput;
    use crate::args::{ArgDefault, arg};
    use crate::kl::KL_ARGS;
    use crate::registry;

    /// A source with one advantage function and one KL function, as a loader would provide them.
    #[derive(Debug)]
    struct Fake;

    const ADVANTAGE: &str = "external_test_advantage";
    const KL: &str = "external_test_kl";
    static ADVANTAGE_ARGS: &[ArgSpec] = &[arg("scale", ArgDefault::Float(2.0))];

    #[derive(Debug)]
    struct Scaled(f64);

    impl AdvantageFn for Scaled {
        fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
            let advantages = &batch.action_mask * self.0;
            Ok(AdvantageOutput {
                returns: advantages.shallow_clone(),
                advantages,
                metrics: Metrics::new(),
                rows: None,
                action_mask: None,
            })
        }
    }

    #[derive(Debug)]
    struct Difference;

    impl ExternalKl for Difference {
        fn kl(
            &self,
            logprob: &Tensor,
            reference: &Tensor,
            _old: Option<&Tensor>,
            _args: &Map<String, Value>,
        ) -> Result<Tensor, AlgorithmError> {
            Ok(logprob - reference)
        }
    }

    impl ExternalComponents for Fake {
        fn names(&self, kind: Kind) -> Vec<String> {
            match kind {
                Kind::AdvantageFn => vec![ADVANTAGE.to_owned()],
                Kind::KlFn => vec![KL.to_owned()],
                _ => Vec::new(),
            }
        }

        fn arg_specs(&self, kind: Kind, name: &str) -> Option<&'static [ArgSpec]> {
            match (kind, name) {
                (Kind::AdvantageFn, ADVANTAGE) => Some(ADVANTAGE_ARGS),
                (Kind::KlFn, KL) => Some(KL_ARGS),
                _ => None,
            }
        }

        fn origin(&self, kind: Kind, name: &str) -> Option<PathBuf> {
            self.arg_specs(kind, name).map(|_| PathBuf::from("/fake/libexternal.so"))
        }

        fn preset(&self, _name: &str) -> Option<Result<Preset, AlgorithmError>> {
            None
        }

        fn advantage_fn(&self, name: &str, args: &Args) -> Option<(Box<dyn AdvantageFn>, bool)> {
            let scale = args.f64("scale").ok()?;
            (name == ADVANTAGE).then(|| (Box::new(Scaled(scale)) as Box<dyn AdvantageFn>, true))
        }

        fn policy_loss_fn(&self, _name: &str, _args: &Args) -> Option<Box<dyn PolicyLossFn>> {
            None
        }

        fn kl_estimator(&self, name: &str) -> Option<Arc<dyn ExternalKl>> {
            (name == KL).then(|| Arc::new(Difference) as Arc<dyn ExternalKl>)
        }

        fn entropy_loss(&self, _name: &str) -> Option<Arc<dyn ExternalEntropy>> {
            None
        }
    }

    static FAKE: Fake = Fake;

    #[test]
    fn a_registered_source_joins_the_registry_by_name() {
        register(&FAKE);
        register(&FAKE);
        assert_eq!(sources().iter().filter(|s| std::ptr::addr_eq(**s, &FAKE as &dyn ExternalComponents)).count(), 1);
        assert!(registry::names(Kind::AdvantageFn).iter().any(|n| n == ADVANTAGE));
        assert!(!registry::builtin_names(Kind::AdvantageFn).iter().any(|n| n == ADVANTAGE));

        let listing = registry::list();
        let item = listing.iter().find(|l| l.kind == Kind::KlFn && l.name == KL).unwrap();
        assert_eq!(item.library.as_deref(), Some(std::path::Path::new("/fake/libexternal.so")));
        assert_eq!(item.default_args["kl_coef"], 0.001);
        assert!(listing.iter().find(|l| l.name == "grpo" && l.kind == Kind::AdvantageFn).unwrap().library.is_none());

        let args = registry::resolve_args(Kind::AdvantageFn, ADVANTAGE, None).unwrap();
        let (advantage, in_trainer) = registry::advantage_fn(ADVANTAGE, &args).unwrap();
        assert!(in_trainer);
        let batch = Batch::new(Tensor::from_slice(&[1.0f32, 1.0, 0.0]).view([1, 3]));
        let out = advantage.compute(&batch).unwrap();
        assert_eq!(Vec::<f32>::try_from(out.advantages.view([-1])).unwrap(), [2.0, 2.0, 0.0]);

        let bad = serde_json::json!({"nope": 1});
        let err = registry::resolve_args(Kind::AdvantageFn, ADVANTAGE, bad.as_object()).unwrap_err().to_string();
        assert!(err.contains("nope") && err.contains("scale"), "{err}");

        let args = registry::resolve_args(Kind::KlFn, KL, None).unwrap();
        let kl = registry::kl_fn(KL, &args).unwrap();
        let (x, y) = (Tensor::from_slice(&[0.5f32, -1.0]), Tensor::from_slice(&[0.25f32, -2.0]));
        assert_eq!(Vec::<f32>::try_from(kl.calculate(&x, &y, None).unwrap()).unwrap(), [0.25, 1.0]);
        assert_eq!(kl.kl_coef, 0.001);
    }
}
