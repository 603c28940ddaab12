//! Which model answers a request and where its replies are recorded.
//!
//! The rollout model answers under its served name (or when a request names none); an auxiliary model answers
//! under its own name (`explorer.auxiliary_models[].name`), samples at the temperature the request asks and is
//! never recorded, since only the policy is trained. Replies of the rollout model are recorded for `/feedback`
//! and `/commit` (mode `serve`), or, on a workflow run's URL (`/runs/<key>/v1/...`), filed under that run for
//! its workflow ([`trinity_explorer::OpenAiView`]). A request on a run's URL spends that run's model budget, if
//! its host set one, whichever model it names.

use std::sync::Arc;

use trinity_explorer::{OpenAiView, RolloutModel, RunBudget};

use crate::error::ApiError;
use crate::recorder::Recorder;
use crate::server::AppState;

/// Where the rollout model's replies go.
#[derive(Debug)]
pub(crate) enum Recording {
    /// Mode `serve`: held until the agent rewards and commits them.
    Feedback(Arc<Recorder>),
    /// The workflows' view: filed under the workflow run whose URL the request used.
    Workflows(Arc<OpenAiView>),
}

/// The model a request goes to.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) model: Arc<RolloutModel>,
    /// The name responses carry in `model`.
    pub(crate) name: String,
    /// The rollout model (recorded, sampled at the server's forced temperature) rather than an auxiliary one.
    pub(crate) policy: bool,
    /// The workflow run the request came from (`/runs/<key>/v1/...`).
    pub(crate) run: Option<String>,
    /// The model budget of the workflow run whose URL the request used (an auxiliary model's requests too).
    pub(crate) budget: Option<Arc<dyn RunBudget>>,
}

/// The workflow run key of a request path `/runs/<key>/...`.
pub(crate) fn run_key(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/runs/")?;
    rest.split('/').next().filter(|key| !key.is_empty()).map(str::to_owned)
}

impl AppState {
    /// The model `requested` names (the served one when `None`), for a request that came on `run`'s URL.
    pub(crate) fn target(&self, requested: Option<&str>, run: Option<String>) -> Result<Target, ApiError> {
        if let Some(key) = &run {
            let open = match &self.recording {
                Recording::Workflows(view) => view.is_open(key),
                Recording::Feedback(_) => false,
            };
            if !open {
                return Err(ApiError::not_found(trinity_explorer::RunClosed(key.clone()).to_string(), None));
            }
        }
        let budget = match (&self.recording, &run) {
            (Recording::Workflows(view), Some(key)) => view.budget(key),
            _ => None,
        };
        let served = &self.options.model_name;
        match requested {
            None => Ok(self.policy_target(run, budget)),
            Some(name) if name == served => Ok(self.policy_target(run, budget)),
            Some(name) => match self.rollout.auxiliary_model(name) {
                Some(aux) => Ok(Target {
                    model: Arc::clone(aux.model()),
                    name: name.to_owned(),
                    policy: false,
                    run: None,
                    budget,
                }),
                None => Err(ApiError::model_not_found(name, &self.served_names().join("`, `"))),
            },
        }
    }

    /// The temperature the server imposes on `target`: `ServeOptions::temperature` for the rollout model (its
    /// recorded logprobs must be the ones the trainer recomputes), none for an auxiliary model.
    pub(crate) fn forced_temperature(&self, target: &Target) -> Option<f32> {
        if target.policy { self.options.temperature } else { None }
    }

    fn policy_target(&self, run: Option<String>, budget: Option<Arc<dyn RunBudget>>) -> Target {
        Target { model: Arc::clone(&self.rollout), name: self.options.model_name.clone(), policy: true, run, budget }
    }

    /// Every model name requests may use: the rollout model's, then the auxiliary models' in config order.
    pub(crate) fn served_names(&self) -> Vec<String> {
        let mut names = vec![self.options.model_name.clone()];
        names.extend(self.rollout.auxiliary_models().iter().map(|m| m.name().to_owned()));
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_keys_come_from_the_path_prefix() {
        assert_eq!(run_key("/runs/r7/v1/chat/completions").as_deref(), Some("r7"));
        assert_eq!(run_key("/v1/chat/completions"), None);
        assert_eq!(run_key("/runs//v1/models"), None);
    }
}
