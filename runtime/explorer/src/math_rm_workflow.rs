//! `math_rm_workflow` and `async_math_rm_workflow`: Trinity-RFT 0.6.0's `MathRMWorkflow`, the reward-model
//! workflow.
//!
//! In 0.6.0 the reward model is not an auxiliary model: the workflow samples the group for `[system?, user]` as
//! `simple_workflow` does (no default system prompt) and rewards each answer with the taskset's reward function,
//! called with the whole experience, the messages and the ground truth; its components become the metrics and
//! their sum the reward. That reward function is where a reward model lives: 0.5.2 shipped `rm_gallery_reward`
//! (RM-Gallery's rule and LLM-judge rewards in Python), which 0.6.0 no longer registers, so there the workflow runs
//! with a user's reward class and stops on a task without one. trinity keeps `rm_gallery_reward` for the one
//! RM-Gallery reward that needs no model (`reward_name: math_verify_reward`, as `grpo_math` names it; see
//! `trinity_reward::rm_gallery`), and otherwise does the same over its own reward
//! registry: built-in rewards and WASM reward plugins (which see the response, the truth, the prompt and
//! `reward_fn_args`), and no default, so a taskset that names no reward function is refused before the run.

use crate::math_workflow::SingleTurn;
use crate::workflow::{Workflow, WorkflowEntry};

fn math_rm() -> Box<dyn Workflow> {
    Box::new(SingleTurn { default_system_prompt: None, default_reward: None, name: "math_rm_workflow" })
}

inventory::submit! {
    WorkflowEntry {
        name: "math_rm_workflow",
        description: "one question, one answer, rewarded by the taskset's reward function (no default: a reward model's plugin or a built-in)",
        build: math_rm,
    }
}

// Trinity-RFT's async twin runs the same code through its async model API; every workflow here is async.
inventory::submit! {
    WorkflowEntry {
        name: "async_math_rm_workflow",
        description: "Trinity's async name of math_rm_workflow (the same workflow)",
        build: math_rm,
    }
}
