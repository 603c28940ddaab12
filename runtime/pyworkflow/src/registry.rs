//! Which non-dotted workflow names are Python workflows: the names in Trinity-RFT's own `WORKFLOWS` registry in
//! the user's interpreter, with what `TRINITY_PLUGIN_DIRS` registers there.
//!
//! trinity learns it by asking the interpreter (the worker script's import check) about a name no built-in or
//! plugin has, once per name and process: the answer says whether the registry knows the name and, when it
//! does, whether the class and the packages its modules import are there. The config's resolution
//! ([`crate::is_python_workflow_name`]) and the `--dry-run` check ([`crate::check`]) share that answer, so a
//! registered name costs one interpreter start. A name Python does not know either keeps the config's
//! unknown-workflow error, with [`unknown_note`] saying what Python answered.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::error::PyWorkflowError;

/// The worker's Python side, as `worker.rs` runs it (the ModelWrapper stand-in, then the worker); its
/// `--check NAME` mode is the registry lookup.
const WORKER_SCRIPT: &str = concat!(include_str!("../python/model.py"), include_str!("../python/worker.py"));

/// What the interpreter said about one name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// The interpreter could not be started, or did not answer with its JSON line.
    Unreachable(String),
    /// The interpreter runs, but `trinity` (or what its registry module imports) does not import.
    NoRegistry { import: String, detail: String },
    /// Trinity-RFT's registry answered.
    Registry {
        /// Whether the registry (with the plugin dirs) has the name.
        registered: bool,
        /// Every name the registry has.
        names: Vec<String>,
        /// The packages the workflow needs that are not installed; empty when it imports.
        missing: Vec<String>,
        /// The Python side's explanation when the workflow does not import.
        detail: String,
    },
}

/// Answers by workflow name, for this process's interpreter.
static ANSWERS: Mutex<BTreeMap<String, Arc<Answer>>> = Mutex::new(BTreeMap::new());

/// The interpreter's answer about `name`, asked once per process.
pub(crate) fn answer(interpreter: &Path, name: &str) -> Arc<Answer> {
    let mut answers = ANSWERS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(answer) = answers.get(name) {
        return Arc::clone(answer);
    }
    // Held while asking: a second caller for the same name waits for this answer instead of starting another
    // interpreter (resolution and the runtime fallback may ask at once).
    let answer = Arc::new(ask(interpreter, name));
    answers.insert(name.to_owned(), Arc::clone(&answer));
    answer
}

/// The answer already given about `name`, if it was asked.
pub(crate) fn cached(name: &str) -> Option<Arc<Answer>> {
    ANSWERS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name).cloned()
}

fn ask(interpreter: &Path, name: &str) -> Answer {
    let output = match std::process::Command::new(interpreter)
        .args(["-u", "-c", WORKER_SCRIPT, "--check", name])
        .stdin(Stdio::null())
        .output()
    {
        Ok(output) => output,
        Err(error) => return Answer::Unreachable(format!("cannot be started: {error}")),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        tracing::debug!(target: "python_workflow", "python registry lookup ({name}): {line}");
    }
    match stdout.lines().next().and_then(|line| serde_json::from_str::<Value>(line).ok()) {
        Some(reply) => parse(&reply),
        None => Answer::Unreachable(format!(
            "answered {:?} ({})",
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or_default()
        )),
    }
}

/// The check's JSON line as an [`Answer`].
fn parse(reply: &Value) -> Answer {
    let text = |key: &str| reply[key].as_str().unwrap_or_default().to_owned();
    let Some(registered) = reply["registered"].as_bool() else {
        return Answer::NoRegistry {
            import: reply["import"].as_str().unwrap_or("trinity").to_owned(),
            detail: text("error"),
        };
    };
    let strings = |key: &str| -> Vec<String> {
        reply[key]
            .as_array()
            .map(|items| items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let mut missing = strings("imports");
    if missing.is_empty()
        && reply["ok"].as_bool() != Some(true)
        && let Some(import) = reply["import"].as_str()
    {
        missing.push(import.to_owned());
    }
    let detail = if reply["ok"].as_bool() == Some(true) || !registered {
        String::new()
    } else if missing.is_empty() {
        // Registered, but the class failed to load for another reason than a missing package.
        format!("the workflow's module raised on import:\n{}", text("error"))
    } else {
        text("error")
    };
    Answer::Registry { registered, names: strings("names"), missing, detail }
}

/// Whether Trinity-RFT's registry in `interpreter` has the workflow `name`.
pub(crate) fn is_registered(interpreter: &Path, name: &str) -> bool {
    matches!(*answer(interpreter, name), Answer::Registry { registered: true, .. })
}

/// The `--dry-run` check of a registered name, from its answer: the packages it lacks, with the pip line.
pub(crate) fn check(interpreter: &Path, name: &str) -> Result<(), PyWorkflowError> {
    let interpreter_path = || PathBuf::from(interpreter);
    match &*answer(interpreter, name) {
        Answer::Registry { missing, detail, .. } if missing.is_empty() && detail.is_empty() => Ok(()),
        Answer::Registry { missing, detail, .. } if missing.is_empty() => Err(PyWorkflowError::Check {
            workflow: name.to_owned(),
            interpreter: interpreter_path(),
            answer: detail.clone(),
        }),
        Answer::Registry { missing, detail, .. } => Err(PyWorkflowError::Import {
            workflow: name.to_owned(),
            interpreter: interpreter_path(),
            import: missing.join("`, `"),
            pip: pip_line(missing),
            detail: detail.clone(),
        }),
        Answer::NoRegistry { import, detail } => Err(PyWorkflowError::Import {
            workflow: name.to_owned(),
            interpreter: interpreter_path(),
            pip: pip_line(std::slice::from_ref(import)),
            import: import.clone(),
            detail: detail.clone(),
        }),
        Answer::Unreachable(answer) => Err(PyWorkflowError::Check {
            workflow: name.to_owned(),
            interpreter: interpreter_path(),
            answer: answer.clone(),
        }),
    }
}

/// What the interpreter said about a workflow name that neither trinity nor Python's registry has, for the
/// config's unknown-workflow error; `None` when Python was not asked about it. `native` are trinity's own names,
/// left out of the registry's list.
pub(crate) fn unknown_note(interpreter: &Path, name: &str, native: &[String]) -> Option<String> {
    let shown = interpreter.display();
    Some(match &*cached(name)? {
        Answer::Registry { registered: false, names, .. } => {
            let python_only: Vec<&str> = names.iter().filter(|n| !native.contains(n)).map(String::as_str).collect();
            let plugin_dirs = std::env::var("TRINITY_PLUGIN_DIRS").unwrap_or_default();
            let dirs = if plugin_dirs.is_empty() {
                String::from("TRINITY_PLUGIN_DIRS is not set")
            } else {
                format!("TRINITY_PLUGIN_DIRS={plugin_dirs}")
            };
            format!(
                "Trinity-RFT's WORKFLOWS registry in `{shown}` ({dirs}) has no `{name}` either; the Python \
                 workflows it has beyond trinity's: {}",
                python_only.join(", ")
            )
        }
        Answer::Registry { registered: true, .. } => return None,
        Answer::NoRegistry { import, detail } => format!(
            "the Python workflow host could not look `{name}` up in Trinity-RFT's WORKFLOWS registry: `{shown}` \
             cannot import `{import}` (`{}`): {}",
            pip_line(std::slice::from_ref(import)),
            detail.lines().last().unwrap_or_default()
        ),
        Answer::Unreachable(answer) => format!(
            "the Python workflow host could not look `{name}` up in Trinity-RFT's WORKFLOWS registry: the \
             interpreter `{shown}` {answer}; set TRINITY_PYTHON to a Python with `pip install trinity-rft==0.6.0`"
        ),
    })
}

/// The `pip install` line for missing top-level modules: Trinity-RFT's package for `trinity`, the distribution
/// for the few modules whose distribution has another name, else the module's name (alfworld, gymnasium,
/// textworld are their own distributions). AgentScope is given the range Trinity-RFT 0.6.0's `agent` extra
/// names (agentscope 2 has no `agentscope.agent.ReActAgent`, which 0.6.0's workflows build) with the two
/// packages agentscope 1.x needs but leaves open: `mcp` below 2 (its 2.x client dropped the
/// `streamablehttp_client` agentscope imports) and `greenlet` (SQLAlchemy 2.1's asyncio module, which agentscope
/// imports, no longer brings it).
fn pip_line(modules: &[String]) -> String {
    const DISTRIBUTIONS: &[(&str, &str)] = &[
        ("trinity", "trinity-rft==0.6.0"),
        ("agentscope", "'agentscope>=1.0.19,<2' 'mcp<2' greenlet"),
        ("yaml", "pyyaml"),
        ("sklearn", "scikit-learn"),
        ("PIL", "pillow"),
        ("cv2", "opencv-python"),
        ("bs4", "beautifulsoup4"),
        ("math_verify", "math-verify"),
    ];
    let names: Vec<&str> = modules
        .iter()
        .map(|module| {
            let top = module.split('.').next().unwrap_or(module);
            DISTRIBUTIONS.iter().find(|(m, _)| *m == top).map_or(top, |(_, dist)| dist)
        })
        .collect();
    format!("pip install {}", names.join(" "))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_registered_name_with_missing_packages_names_them_all_in_the_pip_line() {
        let answer = parse(&json!({"ok": false, "registered": true, "names": ["alfworld_workflow"],
            "import": "alfworld", "imports": ["alfworld", "textworld"], "error": "`m` imports `textworld` (line 3)"}));
        let Answer::Registry { registered, missing, .. } = &answer else { panic!("{answer:?}") };
        assert!(registered);
        assert_eq!(pip_line(missing), "pip install alfworld textworld");
    }

    #[test]
    fn an_unregistered_name_and_a_missing_trinity_are_told_apart() {
        let unknown = parse(&json!({"ok": false, "registered": false, "names": ["a", "b"], "error": "no"}));
        assert_eq!(
            unknown,
            Answer::Registry {
                registered: false,
                names: vec!["a".into(), "b".into()],
                missing: Vec::new(),
                detail: String::new()
            }
        );
        let no_trinity = parse(&json!({"ok": false, "import": "trinity", "error": "No module named 'trinity'"}));
        assert!(matches!(no_trinity, Answer::NoRegistry { ref import, .. } if import == "trinity"));
        assert_eq!(pip_line(&["trinity.common".to_owned()]), "pip install trinity-rft==0.6.0");
    }

    #[test]
    fn agentscope_is_installed_in_the_range_trinity_rft_060_runs() {
        let line = pip_line(&["agentscope.agent".to_owned(), "gymnasium".to_owned()]);
        assert_eq!(line, "pip install 'agentscope>=1.0.19,<2' 'mcp<2' greenlet gymnasium");
    }

    #[test]
    fn a_registered_class_that_raises_on_import_keeps_the_traceback() {
        let answer =
            parse(&json!({"ok": false, "registered": true, "names": [], "import": null, "error": "Traceback: boom"}));
        let Answer::Registry { missing, detail, .. } = answer else { panic!() };
        assert!(missing.is_empty());
        assert!(detail.contains("boom"), "{detail}");
    }
}
