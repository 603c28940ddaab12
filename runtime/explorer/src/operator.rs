//! Experience operators: transform one explore step's experiences before they enter the buffer (filter groups,
//! reshape rewards, add fields), reporting metrics.
//!
//! Built-in operators (Trinity-RFT's pure ones: `reward_filter`, `reward_shaping_mapper`,
//! `pass_rate_calculator`, ...) register by name with `inventory` ([`OperatorEntry`]); plugins register at run
//! time ([`register_operator`]) and are consulted first. [`apply_pipeline`] runs a configured pipeline with one
//! rule: an operator that fails costs its own effect on this batch, never the batch — the experiences go on
//! unchanged, the error is logged and counted (`pipeline/<name>/errors`).
//!
//! Besides metrics, an operator may return feedback for the task selectors (Trinity's `selector_metric`): the
//! observed pass rates of the rows it saw, which a `difficulty_based` selector learns from
//! (`TaskScheduler::feedback`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};
use trinity_buffer::Experience;
use trinity_buffer::selector::PassRates;

use crate::workflow::NameTaken;

/// What an operator made of a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorOutput {
    pub experiences: Vec<Experience>,
    /// Reported as `pipeline/<operator>/<name>`.
    pub metrics: BTreeMap<String, f64>,
    /// Observed pass rates per taskset, for the task selectors (empty for most operators).
    pub selector_feedback: Vec<PassRates>,
}

/// One experience operator.
pub trait ExperienceOperator: Send + Sync + std::fmt::Debug {
    /// Transforms `experiences`; `args` are the operator's `args` from the config. The error is a message for
    /// the log: the caller names the operator.
    fn apply(&self, experiences: &[Experience], args: &Map<String, Value>) -> Result<OperatorOutput, String>;
}

/// A built-in operator, registered by name.
pub struct OperatorEntry {
    /// The name configs use (`data_processor.experience_pipeline.operators[].name`).
    pub name: &'static str,
    /// One line for `trinity plugins list`.
    pub description: &'static str,
    /// Builds the operator.
    pub build: fn() -> Box<dyn ExperienceOperator>,
}

impl std::fmt::Debug for OperatorEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorEntry").field("name", &self.name).finish_non_exhaustive()
    }
}

inventory::collect!(OperatorEntry);

/// The built-in operator called `name`.
pub fn lookup_builtin_operator(name: &str) -> Option<&'static OperatorEntry> {
    inventory::iter::<OperatorEntry>().find(|entry| entry.name == name)
}

/// Every built-in operator, sorted by name.
pub fn builtin_operators() -> Vec<&'static OperatorEntry> {
    let mut all: Vec<&'static OperatorEntry> = inventory::iter::<OperatorEntry>().collect();
    all.sort_by_key(|entry| entry.name);
    all
}

static OPERATORS: RwLock<BTreeMap<String, Arc<dyn ExperienceOperator>>> = RwLock::new(BTreeMap::new());

/// Registers `operator` under `name` for the rest of the process. A built-in of the same name is an error unless
/// `replace_builtin` (the plugin then wins); a second registration of one name is always an error.
pub fn register_operator(
    name: &str,
    operator: Arc<dyn ExperienceOperator>,
    replace_builtin: bool,
) -> Result<(), NameTaken> {
    let mut all = OPERATORS.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    if all.contains_key(name) {
        return Err(NameTaken { kind: "operator", name: name.to_owned(), by: "another plugin" });
    }
    if lookup_builtin_operator(name).is_some() && !replace_builtin {
        return Err(NameTaken { kind: "operator", name: name.to_owned(), by: "a built-in operator" });
    }
    all.insert(name.to_owned(), operator);
    Ok(())
}

/// The operator registered as `name`: a plugin, else a built-in.
pub fn lookup_operator(name: &str) -> Option<Arc<dyn ExperienceOperator>> {
    if let Some(operator) = OPERATORS.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name) {
        return Some(Arc::clone(operator));
    }
    lookup_builtin_operator(name).map(|entry| Arc::from((entry.build)()))
}

/// Every operator name, built-in or plugin, sorted.
pub fn operator_names() -> Vec<String> {
    let mut names: Vec<String> = inventory::iter::<OperatorEntry>().map(|entry| entry.name.to_owned()).collect();
    names.extend(OPERATORS.read().unwrap_or_else(|poisoned| poisoned.into_inner()).keys().cloned());
    names.sort_unstable();
    names.dedup();
    names
}

/// What a pipeline made of one step's experiences.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PipelineOutput {
    pub experiences: Vec<Experience>,
    /// `pipeline/<operator>/<name>`, plus `pipeline/<operator>/errors` (0 or 1) for every operator.
    pub metrics: BTreeMap<String, f64>,
    /// Every operator's selector feedback, in pipeline order; hand it to `TaskScheduler::feedback`.
    pub selector_feedback: Vec<PassRates>,
}

/// Runs `operators` (name, args) in order over `experiences`. Every output experience is validated; an operator
/// that fails, is not registered or returns an invalid experience is skipped for this batch (logged, counted).
pub fn apply_pipeline<'a>(
    operators: impl IntoIterator<Item = (&'a str, &'a Map<String, Value>)>,
    experiences: Vec<Experience>,
) -> PipelineOutput {
    let mut out = PipelineOutput { experiences, ..PipelineOutput::default() };
    for (name, args) in operators {
        let result = match lookup_operator(name) {
            Some(operator) => operator.apply(&out.experiences, args).and_then(|output| {
                for experience in &output.experiences {
                    experience.validate().map_err(|e| format!("invalid output experience: {e}"))?;
                }
                Ok(output)
            }),
            None => Err("no operator of this name is registered".to_owned()),
        };
        match result {
            Ok(output) => {
                out.metrics.extend(output.metrics.into_iter().map(|(k, v)| (format!("pipeline/{name}/{k}"), v)));
                out.metrics.insert(format!("pipeline/{name}/errors"), 0.0);
                out.experiences = output.experiences;
                out.selector_feedback.extend(output.selector_feedback);
            }
            Err(message) => {
                tracing::error!("operator `{name}` failed; this batch goes on without it: {message}");
                out.metrics.insert(format!("pipeline/{name}/errors"), 1.0);
            }
        }
    }
    out
}

/// [`apply_pipeline`] on a blocking thread, for async callers: an operator plugin's call blocks until it returns
/// or reaches its deadline, and on the async runtime that would stall every workflow, weight sync and request in
/// flight for as long.
pub async fn apply_pipeline_blocking(
    operators: Vec<(String, Map<String, Value>)>,
    experiences: Vec<Experience>,
) -> PipelineOutput {
    let job = tokio::task::spawn_blocking(move || {
        apply_pipeline(operators.iter().map(|(name, args)| (name.as_str(), args)), experiences)
    });
    match job.await {
        Ok(output) => output,
        // An operator's panic goes on as it would have on this thread.
        Err(error) => match error.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            // A blocking task is cancelled only by a runtime shutting down, which never polls this future again.
            Err(error) => unreachable!("the operator pipeline was cancelled: {error}"),
        },
    }
}

/// [`apply_pipeline`] without the selector feedback: the experiences and the metrics.
pub fn apply_operators<'a>(
    operators: impl IntoIterator<Item = (&'a str, &'a Map<String, Value>)>,
    experiences: Vec<Experience>,
) -> (Vec<Experience>, BTreeMap<String, f64>) {
    let out = apply_pipeline(operators, experiences);
    (out.experiences, out.metrics)
}

/// An optional number argument of an operator.
pub(crate) fn number_arg(args: &Map<String, Value>, key: &str, default: f64) -> Result<f64, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value.as_f64().ok_or_else(|| format!("args.{key} must be a number, found {value}")),
    }
}

/// Experiences grouped by `group_id` (runs of one task), groups in order of first appearance.
pub(crate) fn groups(experiences: &[Experience]) -> Vec<Vec<&Experience>> {
    let mut order: Vec<&str> = Vec::new();
    let mut by_id: BTreeMap<&str, Vec<&Experience>> = BTreeMap::new();
    for experience in experiences {
        let members = by_id.entry(&experience.group_id).or_default();
        if members.is_empty() {
            order.push(&experience.group_id);
        }
        members.push(experience);
    }
    order.into_iter().filter_map(|id| by_id.remove(id)).collect()
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
            Ok(OperatorOutput {
                experiences: experiences.iter().take(1).cloned().collect(),
                metrics,
                ..Default::default()
            })
        }
    }

    #[derive(Debug)]
    struct Breaks;

    impl ExperienceOperator for Breaks {
        fn apply(&self, experiences: &[Experience], _: &Map<String, Value>) -> Result<OperatorOutput, String> {
            let mut broken: Vec<Experience> = experiences.to_vec();
            broken[0].reward = f64::NAN;
            Ok(OperatorOutput { experiences: broken, ..Default::default() })
        }
    }

    #[test]
    fn a_failing_operator_costs_only_its_effect() {
        register_operator("test_keep_first", Arc::new(KeepFirst), false).unwrap();
        register_operator("test_breaks", Arc::new(Breaks), false).unwrap();
        assert!(register_operator("test_breaks", Arc::new(Breaks), true).is_err());
        let taken = register_operator("reward_filter", Arc::new(Breaks), false).unwrap_err();
        assert!(taken.to_string().contains("built-in"), "{taken}");
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
