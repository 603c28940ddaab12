//! `cargo xtask new-plugin` (scaffold a WASM plugin crate) and `cargo xtask build-plugins` (build them all).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

/// What a new plugin provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Kind {
    /// A reward function (`default_reward_fn_type`).
    Reward,
    /// A workflow (`default_workflow_type`).
    Workflow,
    /// An experience operator (`data_processor.experience_pipeline.operators`).
    Operator,
}

/// Writes `plugins/NAME` (a `cdylib` crate on the plugin SDK with a working example and a test) and adds it to
/// the workspace members.
pub(crate) fn new_plugin(root: &Path, kind: Kind, name: &str) -> Result<()> {
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        bail!("plugin name `{name}`: use lowercase letters, digits and `_`, starting with a letter");
    }
    let dir = root.join("plugins").join(name);
    if dir.exists() {
        bail!("{} already exists", dir.display());
    }
    std::fs::create_dir_all(dir.join("src")).with_context(|| format!("cannot create {}", dir.display()))?;
    let (what, source) = match kind {
        Kind::Reward => ("reward", REWARD_TEMPLATE),
        Kind::Workflow => ("workflow", WORKFLOW_TEMPLATE),
        Kind::Operator => ("operator", OPERATOR_TEMPLATE),
    };
    let manifest = MANIFEST_TEMPLATE.replace("{name}", name).replace("{kind}", what);
    std::fs::write(dir.join("Cargo.toml"), manifest)?;
    std::fs::write(dir.join("src/lib.rs"), source.replace("{name}", name).replace("{Type}", &camel_case(name)))?;
    add_member(&root.join("Cargo.toml"), &format!("plugins/{name}"))?;
    println!("created {} ({what} plugin)", dir.display());
    println!("  test:  cargo test -p {name}");
    println!("  build: cargo xtask build-plugins   (or cargo build -p {name} --target wasm32-wasip2 --release)");
    println!("  use:   trinity run --config ... --plugin target/wasm32-wasip2/release/{name}.wasm");
    Ok(())
}

/// Builds every WASM plugin crate under `plugins/` and prints where each `.wasm` is.
pub(crate) fn build_plugins(root: &Path) -> Result<Vec<PathBuf>> {
    let packages = wasm_plugins(root)?;
    if packages.is_empty() {
        println!("no WASM plugin under {}", root.join("plugins").display());
        return Ok(Vec::new());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(root).args(["build", "--release", "--target", "wasm32-wasip2"]);
    for package in &packages {
        command.args(["-p", package]);
    }
    let status = command.status().context("cannot run cargo")?;
    if !status.success() {
        bail!(
            "building the plugins for wasm32-wasip2 failed ({status}); if the target is missing, \
             `cargo xtask setup` or `rustup target add wasm32-wasip2` installs it"
        );
    }
    let out = crate::target_dir(root).join("wasm32-wasip2/release");
    let mut paths = Vec::new();
    for package in &packages {
        let path = out.join(format!("{package}.wasm"));
        let size = std::fs::metadata(&path).with_context(|| format!("{} was not built", path.display()))?.len();
        println!("  {:<28} {:>8} KiB  {}", package, size / 1024, path.display());
        paths.push(path);
    }
    Ok(paths)
}

/// Package names of the crates under `plugins/` that build WASM components (they use the SDK's `wasm`
/// feature); algorithm libraries there are native and left out.
fn wasm_plugins(root: &Path) -> Result<Vec<String>> {
    let dir = root.join("plugins");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut packages = Vec::new();
    for entry in entries {
        let manifest = entry?.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let wasm = text.lines().any(|line| line.contains("trinity-plugin-sdk") && line.contains("\"wasm\""));
        let name = text.lines().find_map(|line| {
            let value = line.trim().strip_prefix("name")?.trim().strip_prefix('=')?.trim();
            Some(value.trim_matches('"').to_owned())
        });
        if let (true, Some(name)) = (wasm, name) {
            packages.push(name);
        }
    }
    packages.sort();
    Ok(packages)
}

/// Adds `member` to the `[workspace] members` list of `manifest`, keeping the list sorted.
fn add_member(manifest: &Path, member: &str) -> Result<()> {
    let text = std::fs::read_to_string(manifest)?;
    let start = text.find("members = [").context("no `members = [` in the workspace manifest")?;
    let end = start + text[start..].find(']').context("unterminated members list")?;
    let mut members: Vec<String> = text[start..end]
        .lines()
        .skip(1)
        .map(|l| l.trim().trim_end_matches(',').trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect();
    if members.iter().any(|m| m == member) {
        return Ok(());
    }
    members.push(member.to_owned());
    members.sort();
    let list: String = members.iter().map(|m| format!("    \"{m}\",\n")).collect();
    let updated = format!("{}members = [\n{list}{}", &text[..start], &text[end..]);
    std::fs::write(manifest, updated).with_context(|| format!("cannot write {}", manifest.display()))
}

fn camel_case(name: &str) -> String {
    name.split('_')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| first.to_ascii_uppercase().to_string() + chars.as_str())
        })
        .collect()
}

const MANIFEST_TEMPLATE: &str = r#"[package]
name = "{name}"
description = "trinity {kind} plugin"
version = "0.1.0"
edition.workspace = true
license.workspace = true
publish = false

[lib]
# cdylib: the .wasm component; rlib: so `cargo test` can run the unit tests natively.
crate-type = ["cdylib", "rlib"]

[dependencies]
trinity-plugin-sdk = { workspace = true, features = ["wasm"] }

[lints]
workspace = true
"#;

const REWARD_TEMPLATE: &str = r#"//! `{name}`: a trinity reward plugin.
//!
//! Scores one response against the task's reference answer. Build with `cargo xtask build-plugins`, then
//! `trinity run --config ... --plugin target/wasm32-wasip2/release/{name}.wasm` with
//! `default_reward_fn_type: {name}`.

use trinity_plugin_sdk::wasm::reward::{Metric, Reward, Task, metric};

struct {Type};

impl Reward for {Type} {
    const NAME: &'static str = "{name}";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "exact match of the trimmed response and reference answer";

    fn score(task: &Task, response: &str) -> Result<Vec<Metric>, String> {
        let truth = task.truth.as_deref().ok_or("the task has no reference answer")?;
        let correct = response.trim() == truth.trim();
        Ok(vec![metric("accuracy", if correct { 1.0 } else { 0.0 })])
    }
}

trinity_plugin_sdk::export_reward!({Type});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference() {
        let task = Task {
            taskset: "t".into(),
            index: 0,
            prompt: None,
            truth: Some("42".into()),
            system_prompt: None,
            raw: "{}".into(),
            args: "{}".into(),
        };
        assert_eq!({Type}::score(&task, " 42 ").unwrap()[0].value, 1.0);
        assert_eq!({Type}::score(&task, "41").unwrap()[0].value, 0.0);
    }
}
"#;

const WORKFLOW_TEMPLATE: &str = r#"//! `{name}`: a trinity workflow plugin.
//!
//! Asks the model the task's prompt, then once more with its own answer in view, and rewards a final answer
//! that contains the reference. Build with `cargo xtask build-plugins`, then `trinity run --config ...
//! --plugin target/wasm32-wasip2/release/{name}.wasm` with `default_workflow_type: {name}`.

use trinity_plugin_sdk::wasm::workflow::{Experience, RunContext, Task, Workflow, chat_once, message, metric};

struct {Type};

impl Workflow for {Type} {
    const NAME: &'static str = "{name}";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "answer, reconsider, then scored against the reference";

    fn run(task: &Task, context: &RunContext) -> Result<Vec<Experience>, String> {
        let prompt = task.prompt.clone().ok_or("the task has no prompt")?;
        let mut experiences = Vec::new();
        for _ in 0..context.repeat_times {
            let mut messages = vec![message("user", prompt.clone())];
            let first = chat_once(&messages)?;
            messages.push(message("assistant", first.text));
            messages.push(message("user", "Check your answer and give it again."));
            let last = chat_once(&messages)?;
            let reward = reward(task.truth.as_deref(), &last.text);
            experiences.push(Experience { turn: last.turn, reward, metrics: vec![metric("accuracy", reward)], info: String::new() });
        }
        Ok(experiences)
    }
}

trinity_plugin_sdk::export_workflow!({Type});

/// 1 when the answer contains the reference.
fn reward(truth: Option<&str>, answer: &str) -> f64 {
    match truth {
        Some(truth) if answer.contains(truth.trim()) => 1.0,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewards_answers_containing_the_reference() {
        assert_eq!(reward(Some("42"), "it is 42."), 1.0);
        assert_eq!(reward(Some("42"), "it is 41."), 0.0);
        assert_eq!(reward(None, "42"), 0.0);
    }
}
"#;

const OPERATOR_TEMPLATE: &str = r#"//! `{name}`: a trinity experience operator plugin.
//!
//! Subtracts `args.penalty` (default 0.001) per response token from every reward: a length penalty. Build with
//! `cargo xtask build-plugins`, load with `--plugin target/wasm32-wasip2/release/{name}.wasm`, and name it in
//! `data_processor.experience_pipeline.operators`.

use trinity_plugin_sdk::wasm::operator::{ExperienceUpdate, ExperienceView, Operator, OperatorOutput, metric};
use trinity_plugin_sdk::wasm::serde_json::{Map, Value};

struct {Type};

impl Operator for {Type} {
    const NAME: &'static str = "{name}";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "length penalty on rewards";

    fn apply(experiences: &[ExperienceView], args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        let penalty = match args.get("penalty") {
            None => 0.001,
            Some(value) => value.as_f64().ok_or("args.penalty must be a number")?,
        };
        let updates: Vec<ExperienceUpdate> = experiences
            .iter()
            .enumerate()
            .map(|(i, e)| ExperienceUpdate {
                source: i as u32,
                reward: Some(e.reward - penalty * f64::from(e.response_length)),
                metrics: Vec::new(),
                info: String::new(),
            })
            .collect();
        let tokens: u32 = experiences.iter().map(|e| e.response_length).sum();
        Ok(OperatorOutput { experiences: updates, metrics: vec![metric("penalized_tokens", f64::from(tokens))] })
    }
}

trinity_plugin_sdk::export_operator!({Type});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalizes_length() {
        let view = ExperienceView {
            uid: "0/0/0/0".into(),
            group_id: "0/0".into(),
            reward: 1.0,
            prompt_length: 4,
            response_length: 100,
            action_tokens: 100,
            prompt_text: None,
            response_text: None,
            metrics: Vec::new(),
            info: "{}".into(),
        };
        let out = {Type}::apply(&[view], &Map::new()).unwrap();
        assert!((out.experiences[0].reward.unwrap() - 0.9).abs() < 1e-12);
    }
}
"#;
