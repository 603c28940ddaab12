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
    ("math_rm_workflow", "the RM-Gallery Python reward-model library"),
    ("rm_gallery_reward", "the RM-Gallery Python reward-model library"),
    ("math_trainable_ruler_workflow", "an auxiliary judge model served next to the policy"),
    ("simple_mm_workflow", "a vision-language model and image inputs"),
    ("bots_ref_eval_collect_math_boxed_workflow", "Python code from Trinity-RFT's BOTS example"),
];

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
const AUXILIARY_WORKFLOWS: &[&str] =
    &["on_policy_distill_workflow", "on_policy_distill_math_workflow", "math_ruler_workflow", "rubric_judge_workflow"];

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
}
