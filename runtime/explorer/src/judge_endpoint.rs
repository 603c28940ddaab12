//! A judge over an OpenAI-compatible endpoint, for `rubric_judge_openai_workflow` (Trinity-RFT 0.6.0's
//! `RubricJudgeWorkflowWithAPI`).
//!
//! The taskset's `workflow_args` name the model (`judge_model_name`) and the environment variables that hold the
//! base URL and the key (`judge_api_base_url_env`, `judge_api_key_env`, default `OPENAI_BASE_URL` and
//! `OPENAI_API_KEY`), read when a task starts, as Trinity-RFT reads them when it builds the workflow; config
//! resolution refuses a taskset whose variables are not set, with the same rules
//! ([`trinity_config::external::judge_endpoint_settings`]). Requests go out through [`ExternalModel`], the client
//! of `model.external_model`, so they share its redirect, timeout and key handling: one sample, temperature 0,
//! no response limit (the endpoint's own), as Trinity-RFT asks.

use std::sync::Arc;
use std::time::Duration;

use trinity_buffer::Task;
use trinity_engine::SamplingParams;
use trinity_model::ChatMessage;

use crate::error::ExplorerError;
use crate::external_model::{ExternalModel, ExternalModelError};
use crate::math_workflow::describe;

/// How long one judge request may take: the `openai` client's default timeout, which Trinity-RFT keeps.
const JUDGE_TIMEOUT: Duration = Duration::from_secs(600);

/// The endpoint one task's answers are judged by.
#[derive(Debug, Clone)]
pub(crate) struct JudgeEndpoint {
    model: Arc<ExternalModel>,
}

impl JudgeEndpoint {
    /// The endpoint `task.workflow_args` and the environment name, or the error that says what to set.
    pub(crate) fn from_task(task: &Task) -> Result<JudgeEndpoint, ExplorerError> {
        let settings =
            trinity_config::external::judge_endpoint_settings(&task.workflow_args, |var| std::env::var(var).ok())
                .map_err(|message| ExplorerError::Task {
                    task: describe(task),
                    message: format!("rubric_judge_openai_workflow {message}"),
                })?;
        let model = ExternalModel::new(&settings.base_url, settings.model_name, settings.api_key, None, JUDGE_TIMEOUT);
        Ok(JudgeEndpoint { model: Arc::new(model) })
    }

    /// The judge's reply to `messages`: the first choice's text.
    pub(crate) async fn chat(&self, task: &Task, messages: &[ChatMessage]) -> Result<String, ExplorerError> {
        let params =
            SamplingParams { n: 1, temperature: 0.0, seed: None, max_tokens: None, ..SamplingParams::default() };
        let external = |source| ExplorerError::External { task: describe(task), source };
        let reply = self.model.chat(messages, &params).await.map_err(external)?;
        let choice = reply.choices.into_iter().next().ok_or_else(|| {
            external(ExternalModelError::Reply { url: self.model.url().to_owned(), message: "no choices".into() })
        })?;
        Ok(choice.text)
    }
}
