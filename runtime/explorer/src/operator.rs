//! Experience operators: transform one explore step's experiences before they enter the buffer (filter groups,
//! reshape rewards, add fields), reporting metrics.
//!
//! Operators come from plugins and register by name at run time. [`apply_operators`] runs a configured pipeline
//! with one rule: an operator that fails costs its own effect on this batch, never the batch — the experiences
//! go on unchanged, the error is logged and counted (`pipeline/<name>/errors`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};
use trinity_buffer::Experience;

use crate::workflow::NameTaken;

/// What an operator made of a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorOutput {
    pub experiences: Vec<Experience>,
    /// Reported as `pipeline/<operator>/<name>`.
    pub metrics: BTreeMap<String, f64>,
}

/// One experience operator.
pub trait ExperienceOperator: Send + Sync + std::fmt::Debug {
    /// Transforms `experiences`; `args` are the operator's `args` from the config. The error is a message for
    /// the log: the caller names the operator.
    fn apply(&self, experiences: &[Experience], args: &Map<String, Value>) -> Result<OperatorOutput, String>;
}

static OPERATORS: RwLock<BTreeMap<String, Arc<dyn ExperienceOperator>>> = RwLock::new(BTreeMap::new());

/// Registers `operator` under `name` for the rest of the process; a name is registered once. (There are no
/// built-in operators yet, so `replace_builtin` has nothing to replace; it is taken for symmetry with
/// workflows and rewards.)
pub fn register_operator(
    name: &str,
    operator: Arc<dyn ExperienceOperator>,
    _replace_builtin: bool,
) -> Result<(), NameTaken> {
    let mut all = OPERATORS.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    if all.contains_key(name) {
        return Err(NameTaken { kind: "operator", name: name.to_owned(), by: "another plugin" });
    }
    all.insert(name.to_owned(), operator);
    Ok(())
}

/// The operator registered as `name`.
pub fn lookup_operator(name: &str) -> Option<Arc<dyn ExperienceOperator>> {
    OPERATORS.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name).cloned()
}

/// Every registered operator name, sorted.
pub fn operator_names() -> Vec<String> {
    OPERATORS.read().unwrap_or_else(|poisoned| poisoned.into_inner()).keys().cloned().collect()
}

/// Runs `operators` (name, args) in order over `experiences`. Every output experience is validated; an operator
/// that fails, is not registered or returns an invalid experience is skipped for this batch (logged, counted).
pub fn apply_operators<'a>(
    operators: impl IntoIterator<Item = (&'a str, &'a Map<String, Value>)>,
    mut experiences: Vec<Experience>,
) -> (Vec<Experience>, BTreeMap<String, f64>) {
    let mut metrics = BTreeMap::new();
    for (name, args) in operators {
        let result = match lookup_operator(name) {
            Some(operator) => operator.apply(&experiences, args).and_then(|output| {
                for experience in &output.experiences {
                    experience.validate().map_err(|e| format!("invalid output experience: {e}"))?;
                }
                Ok(output)
            }),
            None => Err("no operator of this name is registered".to_owned()),
        };
        match result {
            Ok(output) => {
                metrics.extend(output.metrics.into_iter().map(|(k, v)| (format!("pipeline/{name}/{k}"), v)));
                metrics.insert(format!("pipeline/{name}/errors"), 0.0);
                experiences = output.experiences;
            }
            Err(message) => {
                tracing::error!("operator `{name}` failed; this batch goes on without it: {message}");
                metrics.insert(format!("pipeline/{name}/errors"), 1.0);
            }
        }
    }
    (experiences, metrics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trinity_buffer::Eid;

    #[derive(Debug)]
    struct KeepFirst;

    impl ExperienceOperator for KeepFirst {
        fn apply(&self, experiences: &[Experience], _: &Map<String, Value>) -> Result<OperatorOutput, String> {
            let mut metrics = BTreeMap::new();
            metrics.insert("kept".to_owned(), 1.0);
            Ok(OperatorOutput { experiences: experiences.iter().take(1).cloned().collect(), metrics })
        }
    }

    #[derive(Debug)]
    struct Breaks;

    impl ExperienceOperator for Breaks {
        fn apply(&self, experiences: &[Experience], _: &Map<String, Value>) -> Result<OperatorOutput, String> {
            let mut broken: Vec<Experience> = experiences.to_vec();
            broken[0].reward = f64::NAN;
            Ok(OperatorOutput { experiences: broken, metrics: BTreeMap::new() })
        }
    }

    #[test]
    fn a_failing_operator_costs_only_its_effect() {
        register_operator("test_keep_first", Arc::new(KeepFirst), false).unwrap();
        register_operator("test_breaks", Arc::new(Breaks), false).unwrap();
        assert!(register_operator("test_breaks", Arc::new(Breaks), true).is_err());
        let batch: Vec<Experience> = (0..3)
            .map(|run| Experience::single_turn(Eid { run, ..Eid::default() }, vec![1, 2, 3], 1, vec![0.0; 2]))
            .collect();
        let args = Map::new();
        let ops = [("test_breaks", &args), ("missing", &args), ("test_keep_first", &args)];
        let (out, metrics) = apply_operators(ops, batch);
        assert_eq!(out.len(), 1);
        assert!(out[0].reward.is_finite());
        assert_eq!(metrics["pipeline/test_breaks/errors"], 1.0);
        assert_eq!(metrics["pipeline/missing/errors"], 1.0);
        assert_eq!(metrics["pipeline/test_keep_first/kept"], 1.0);
    }
}
