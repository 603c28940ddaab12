//! What a Python workflow's `self.model` says about its model: Trinity-RFT's `InferenceModelConfig` of the
//! rollout model and of each auxiliary model, how the runner repeats a non-batched workflow, and each task's model
//! budget.
//!
//! Trinity-RFT fills an auxiliary model's unset sampling and length settings from `model:` and always serves it
//! over the OpenAI API without history; the same is done here, so `model_config`, `generate_kwargs` and
//! `config.name` read as they do there.

use std::sync::RwLock;

use serde_json::{Value, json};
use trinity_config::Config;
use trinity_config::explorer::PythonWorkflowLimits;

use crate::PyWorkflowError;

/// The running config's model settings, as the worker builds its `InferenceModelConfig`s from them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    /// `InferenceModelConfig` fields of the rollout model.
    pub(crate) rollout: Value,
    /// The same for each `explorer.auxiliary_models` entry, in config order.
    pub(crate) auxiliary: Vec<Value>,
    /// `explorer.concurrent_mode`.
    pub(crate) concurrent_mode: String,
    /// `explorer.over_rollout.return_partial_tasks`: whether a non-repeatable workflow's other runs go on after
    /// one raised (Trinity-RFT's runner's `collect_partial_runs`).
    pub(crate) collect_partial_runs: bool,
    /// `explorer.python_workflows`: each task attempt's model budget.
    pub(crate) limits: PythonWorkflowLimits,
}

/// Process-wide because workflows are built by name and see no config; stages set theirs in turn.
static SETTINGS: RwLock<Option<Settings>> = RwLock::new(None);

/// Records the model settings and budgets the Python workflows of this run see (replacing those of an earlier
/// stage); a budget of zero is refused, since no workflow could make a single call.
pub fn configure(config: &Config) -> Result<(), PyWorkflowError> {
    let limits = config.explorer.python_workflows.clone();
    for (key, value) in
        [("max_model_calls", u64::from(limits.max_model_calls)), ("max_model_tokens", limits.max_model_tokens)]
    {
        if value == 0 {
            return Err(PyWorkflowError::Setting {
                key: format!("explorer.python_workflows.{key}"),
                message: "must be positive: a Python workflow could not make a single model call".to_owned(),
            });
        }
    }
    let model = &config.model;
    let rollout_model = &config.explorer.rollout_model;
    let shared = json!({
        "temperature": model.temperature,
        "top_p": model.top_p,
        "top_k": model.top_k,
        "logprobs": model.logprobs,
        "max_model_len": model.max_model_len,
        "max_prompt_tokens": model.max_prompt_tokens,
        "max_response_tokens": model.max_response_tokens,
        "min_response_tokens": model.min_response_tokens,
        "enable_prompt_truncation": model.enable_prompt_truncation,
        "repetition_penalty": model.repetition_penalty,
        "api_key": "EMPTY",
    });
    let mut rollout = shared.clone();
    extend(
        &mut rollout,
        json!({
            "model_path": model.model_path,
            "engine_type": rollout_model.engine_type,
            "dtype": rollout_model.dtype,
            "seed": rollout_model.seed,
            "chat_template": rollout_model.chat_template,
            "enable_thinking": rollout_model.enable_thinking.or(model.enable_thinking),
            "enable_history": rollout_model.enable_history,
            "enable_openai_api": rollout_model.enable_openai_api,
        }),
    );
    let auxiliary = config
        .explorer
        .auxiliary_models
        .iter()
        .map(|aux| {
            let mut settings = shared.clone();
            extend(
                &mut settings,
                json!({
                    "model_path": aux.model_path,
                    "name": aux.name(),
                    "engine_type": aux.engine_type,
                    "dtype": aux.dtype,
                    "seed": aux.seed,
                    "chat_template": aux.chat_template,
                    "enable_thinking": aux.enable_thinking.or(model.enable_thinking),
                    "enable_history": false,
                    "enable_openai_api": true,
                }),
            );
            for (key, own) in [
                ("max_model_len", aux.max_model_len),
                ("max_prompt_tokens", aux.max_prompt_tokens),
                ("max_response_tokens", aux.max_response_tokens),
            ] {
                if let Some(own) = own {
                    settings[key] = own.into();
                }
            }
            settings
        })
        .collect();
    let settings = Settings {
        rollout,
        auxiliary,
        concurrent_mode: config.explorer.concurrent_mode.clone(),
        collect_partial_runs: config.explorer.over_rollout.return_partial_tasks,
        limits,
    };
    *SETTINGS.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(settings);
    Ok(())
}

fn extend(target: &mut Value, more: Value) {
    if let (Value::Object(target), Value::Object(more)) = (target, more) {
        target.extend(more);
    }
}

/// The recorded settings; without [`configure`], only the rollout model's path (what `install` was given).
pub(crate) fn current() -> Settings {
    let settings = SETTINGS.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    settings.unwrap_or_else(|| Settings {
        rollout: json!({"model_path": crate::MODEL_PATH.get(), "api_key": "EMPTY"}),
        auxiliary: Vec::new(),
        concurrent_mode: "sequential".to_owned(),
        collect_partial_runs: false,
        limits: PythonWorkflowLimits::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auxiliary_models_take_unset_settings_from_the_model_section() {
        let mut config = Config::default();
        config.model.model_path = "policy".to_owned();
        config.model.temperature = 0.7;
        config.model.max_response_tokens = Some(16);
        config.explorer.rollout_model.enable_openai_api = true;
        config.explorer.auxiliary_models.push(trinity_config::explorer::AuxiliaryModelConfig {
            model_path: "judge-path".to_owned(),
            max_response_tokens: Some(4),
            ..Default::default()
        });
        config.explorer.concurrent_mode = "asynchronous".to_owned();
        config.explorer.python_workflows.max_model_calls = 7;
        configure(&config).unwrap();
        let settings = current();
        assert_eq!(settings.rollout["model_path"], "policy");
        assert_eq!(settings.rollout["enable_openai_api"], true);
        assert_eq!(settings.rollout["max_response_tokens"], 16);
        let judge = &settings.auxiliary[0];
        assert_eq!(judge["name"], "judge-path", "the name defaults to the path");
        assert_eq!(judge["temperature"], 0.7);
        assert_eq!(judge["max_response_tokens"], 4);
        assert_eq!(judge["enable_history"], false);
        assert_eq!(settings.concurrent_mode, "asynchronous");
        assert_eq!((settings.limits.max_model_calls, settings.limits.max_model_tokens), (7, 1 << 22));
    }

    #[test]
    fn a_zero_budget_is_refused_naming_its_key() {
        let mut config = Config::default();
        config.explorer.python_workflows.max_model_tokens = 0;
        let error = configure(&config).unwrap_err().to_string();
        assert!(error.contains("explorer.python_workflows.max_model_tokens"), "{error}");
    }
}
