//! Reward errors: the task or the configuration is broken, never the response.

/// Why a reward could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RewardError {
    #[error("unknown reward function `{name}`; registered: {known}")]
    Unknown { name: String, known: String },
    #[error("reward `{reward}`: the task has no reference answer (check format.response_key)")]
    MissingTruth { reward: &'static str },
    #[error("reward `{reward}`: reference answer `{truth}` {problem}")]
    BadTruth { reward: &'static str, truth: String, problem: String },
    #[error("reward `{reward}`: reward_fn_args.{key} {problem}")]
    BadArg { reward: &'static str, key: String, problem: String },
    /// A plugin's failure; `message` names the plugin and says what happened.
    #[error("{message}")]
    Plugin { reward: String, message: String },
    #[error(
        "reward function `{name}` is already registered by {by}; set `override_builtin: true` on the plugin to \
         replace a built-in"
    )]
    NameTaken { name: String, by: &'static str },
}
