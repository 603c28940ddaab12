//! Integration tests: the `trinity` binary run as a user runs it, in temporary directories.

mod agent_example;
mod agent_process;
mod algorithm_plugins;
mod async_rl;
mod auxiliary_models;
mod cli;
mod compat;
mod compat_runs;
mod config;
mod config_rules;
mod cpt;
mod data_parallel;
mod digit_model;
mod external_model;
mod model_commands;
mod monitors;
mod over_rollout;
mod plugins;
mod python_env_workflows;
mod python_workflow;
mod rft;
mod serve;
mod studio;
mod support;
mod tool_model;
mod wheel;
