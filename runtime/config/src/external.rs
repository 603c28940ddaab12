//! Trinity-RFT's workflow and reward names that trinity does not have, with what each one needs.
//!
//! A config naming one of these fails at resolution with an error that names it, says what it needs and names
//! the two ways to bring it to trinity, instead of a bare "unknown workflow". Names in the form of a Python
//! class path (`examples.bots.workflow.BOTSWorkflow`) are Trinity-RFT plugins written in Python.

/// Known Trinity-RFT names (workflows and rewards) and what running them takes.
const NEEDS: &[(&str, &str)] = &[
    ("alfworld_workflow", "the ALFWorld text-game environment (Python `alfworld` package and game files)"),
    ("step_wise_alfworld_workflow", "the ALFWorld text-game environment (Python `alfworld` package and game files)"),
    ("RAFT_alfworld_workflow", "the ALFWorld text-game environment (Python `alfworld` package and game files)"),
    ("RAFT_reflect_alfworld_workflow", "the ALFWorld text-game environment (Python `alfworld` package and game files)"),
    ("webshop_workflow", "the WebShop environment (a Python web-shop simulator with its product index)"),
    ("sciworld_workflow", "the ScienceWorld environment (Python `scienceworld`, which runs a Java simulator)"),
    ("email_search_workflow", "an email database with search tools (Python) and an auxiliary judge model"),
    ("agentscope_react_workflow", "the AgentScope Python agent framework"),
    ("agentscope_react_math_workflow", "the AgentScope Python agent framework"),
    ("agentscopev0_react_math_workflow", "the AgentScope Python agent framework"),
    ("agentscope_v1_react_search_workflow", "the AgentScope Python agent framework and a web-search service"),
    ("simple_mm_workflow", "a vision-language model and image inputs"),
    ("bots_ref_eval_collect_math_boxed_workflow", "Python code from Trinity-RFT's BOTS example"),
];

/// Trinity-RFT's experience operators that trinity does not have, with what each one needs.
const OPERATOR_NEEDS: &[(&str, &str)] = &[(
    "data_juicer",
    "the Data-Juicer Python service, which trinity cannot start or reach (Trinity-RFT sends each batch of \
     experiences to it)",
)];

/// What the Trinity-RFT experience operator named `name` needs from outside trinity, when trinity knows it.
pub fn operator_needs(name: &str) -> Option<String> {
    OPERATOR_NEEDS.iter().find(|(n, _)| *n == name).map(|(_, needs)| (*needs).to_owned())
}

/// Trinity-RFT built-ins that need nothing outside trinity but have no trinity port yet.
const NOT_PORTED: &[&str] = &[
    // Trinity-RFT's synthetic long-context workflow of scripts/context_length_test.
    "synthetic_workflow",
];

/// What a Trinity-RFT workflow or reward named `name` needs from outside trinity, when trinity knows it:
/// `Some` for a known Trinity-RFT name or a Python class path, `None` for any other name.
pub fn needs(name: &str) -> Option<String> {
    if let Some((_, needs)) = NEEDS.iter().find(|(n, _)| *n == name) {
        return Some((*needs).to_owned());
    }
    if NOT_PORTED.contains(&name) {
        return Some("a port to trinity, which does not exist yet (it needs nothing outside trinity)".to_owned());
    }
    let segments: Vec<&str> = name.split('.').collect();
    let class_path = segments.len() >= 2
        && segments.iter().all(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    class_path.then(|| format!("the Python class `{name}` (a Trinity-RFT plugin written in Python)"))
}

/// Built-in workflows that call the first of `explorer.auxiliary_models` (a teacher or a judge).
const AUXILIARY_WORKFLOWS: &[&str] = &[
    "on_policy_distill_workflow",
    "on_policy_distill_math_workflow",
    "math_ruler_workflow",
    "async_math_ruler_workflow",
    "rubric_judge_workflow",
];

/// Built-in workflows with no default reward function: Trinity-RFT 0.6.0's reward-model workflows call the
/// taskset's reward and stop when it names none.
const REWARD_REQUIRED_WORKFLOWS: &[&str] = &["math_rm_workflow", "async_math_rm_workflow"];

/// Whether the workflow called `name` needs the taskset to name its reward function.
pub fn needs_reward_fn(name: &str) -> bool {
    REWARD_REQUIRED_WORKFLOWS.contains(&name)
}

/// Built-in workflows whose judge is an OpenAI-compatible endpoint named by `workflow_args`.
const JUDGE_ENDPOINT_WORKFLOWS: &[&str] = &["rubric_judge_openai_workflow"];

/// Whether the workflow called `name` calls a judge over an OpenAI-compatible endpoint
/// ([`judge_endpoint_settings`]).
pub fn needs_judge_endpoint(name: &str) -> bool {
    JUDGE_ENDPOINT_WORKFLOWS.contains(&name)
}

/// Where `rubric_judge_openai_workflow` sends its judge's requests.
#[derive(Clone, PartialEq, Eq)]
pub struct JudgeEndpointSettings {
    /// `workflow_args.judge_model_name`: the model asked for.
    pub model_name: String,
    /// The base URL, from the variable `workflow_args.judge_api_base_url_env` names (`OPENAI_BASE_URL`).
    pub base_url: String,
    /// The API key, from the variable `workflow_args.judge_api_key_env` names (`OPENAI_API_KEY`); empty if unset.
    pub api_key: String,
}

impl std::fmt::Debug for JudgeEndpointSettings {
    // The key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JudgeEndpointSettings")
            .field("model_name", &self.model_name)
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// The judge endpoint of a taskset's `workflow_args`, as Trinity-RFT 0.6.0's `RubricJudgeWorkflowWithAPI` reads
/// it: `judge_model_name` is required, the base URL comes from the environment variable
/// `judge_api_base_url_env` names (default `OPENAI_BASE_URL`) and must be set, the key from
/// `judge_api_key_env` (default `OPENAI_API_KEY`) may be empty. `env` reads a variable. The error says what to set.
pub fn judge_endpoint_settings(
    args: &serde_json::Map<String, serde_json::Value>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<JudgeEndpointSettings, String> {
    let text = |key: &str, default: &str| -> Result<String, String> {
        match args.get(key) {
            None | Some(serde_json::Value::Null) => Ok(default.to_owned()),
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(format!("`workflow_args.{key}` must be a string, not {other}")),
        }
    };
    let model_name = text("judge_model_name", "")?;
    if model_name.is_empty() {
        return Err("needs the judge's model name: set `workflow_args.judge_model_name`".to_owned());
    }
    let base_url_env = text("judge_api_base_url_env", "OPENAI_BASE_URL")?;
    let api_key_env = text("judge_api_key_env", "OPENAI_API_KEY")?;
    let base_url = env(&base_url_env).unwrap_or_default();
    if base_url.is_empty() {
        return Err(format!(
            "needs the judge's base URL in the environment variable `{base_url_env}` (named by \
             `workflow_args.judge_api_base_url_env`), which is not set"
        ));
    }
    Ok(JudgeEndpointSettings { model_name, base_url, api_key: env(&api_key_env).unwrap_or_default() })
}

/// Built-in workflows that train on the replies recorded through the OpenAI API.
const HISTORY_WORKFLOWS: &[&str] = &["agent_process_workflow"];

/// Whether the workflow called `name` needs `enable_openai_api` and `enable_history`.
pub fn needs_openai_history(name: &str) -> bool {
    HISTORY_WORKFLOWS.contains(&name)
}

/// Whether the workflow called `name` needs an auxiliary model to run.
pub fn needs_auxiliary_model(name: &str) -> bool {
    AUXILIARY_WORKFLOWS.contains(&name)
}

/// How to bring a workflow trinity lacks, for error messages.
pub const HOW_TO_BRING: &str = "bring it as a WASM workflow plugin (`cargo xtask new-plugin --kind workflow`, \
     then list it under `plugins:`), run the agent as a program over the OpenAI API (`agent_process_workflow` \
     with `explorer.rollout_model.enable_openai_api` and `enable_history`), or run it outside trinity against \
     trinity's OpenAI-compatible endpoint (`mode: serve`)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_environments_and_python_class_paths() {
        assert!(needs("alfworld_workflow").unwrap().contains("ALFWorld"));
        assert!(
            needs("examples.bots.workflow.bots_math_boxed_workflow.BOTSMathBoxedWorkflow")
                .unwrap()
                .contains("Python class")
        );
        assert_eq!(needs("math_workflw"), None);
        assert_eq!(needs("a..b"), None);
    }

    #[test]
    fn the_judge_endpoint_comes_from_workflow_args_and_the_environment() {
        let args = |v: serde_json::Value| v.as_object().unwrap().clone();
        let env = |key: &str| match key {
            "OPENAI_BASE_URL" => Some("http://judge/v1".to_owned()),
            "MY_URL" => Some("http://mine/v1".to_owned()),
            "MY_KEY" => Some("sk-mine".to_owned()),
            _ => None,
        };
        let settings = judge_endpoint_settings(&args(serde_json::json!({"judge_model_name": "gpt"})), env).unwrap();
        assert_eq!((settings.model_name.as_str(), settings.base_url.as_str()), ("gpt", "http://judge/v1"));
        assert_eq!(settings.api_key, "", "an unset key is sent empty, as the openai client would");
        let custom = serde_json::json!({"judge_model_name": "m", "judge_api_base_url_env": "MY_URL", "judge_api_key_env": "MY_KEY"});
        let settings = judge_endpoint_settings(&args(custom), env).unwrap();
        assert_eq!((settings.base_url.as_str(), settings.api_key.as_str()), ("http://mine/v1", "sk-mine"));
        assert!(!format!("{settings:?}").contains("sk-mine"));
        let missing = judge_endpoint_settings(&args(serde_json::json!({})), env).unwrap_err();
        assert!(missing.contains("judge_model_name"), "{missing}");
        let unset = serde_json::json!({"judge_model_name": "m", "judge_api_base_url_env": "NOPE"});
        assert!(judge_endpoint_settings(&args(unset), env).unwrap_err().contains("`NOPE`"));
    }
}
