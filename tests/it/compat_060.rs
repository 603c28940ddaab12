//! The 136 names Trinity-RFT 0.6.0 registers (tests/fixtures/trinity-rft-0.6.0/registry.txt, read from its
//! registries' `default_mapping` dicts): each one runs in trinity or is refused with a message that says what
//! brings it.
//!
//! A name runs when trinity registers it: `trinity plugins list --json` for the algorithm components, rewards,
//! operators and workflows trinity has itself; for the rest (monitors, selectors, priority functions, readers,
//! and workflows the Python workflow host runs through Trinity-RFT's own `WORKFLOWS` in the venv of
//! `cargo xtask setup`), a `--dry-run` of a config that names it, which resolves and checks what the run would
//! (a Python workflow's module must import). Every other name is in [`REFUSED`] with the issue or reason that
//! brings it and a piece of text its refusal must contain. The test prints both counts.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use crate::support::{tiny_model_dir, trinity_rft_python, workspace_root};

/// The names trinity refuses: (registry, name, the issue or reason that brings it, text its refusal contains).
const REFUSED: &[(&str, &str, &str, &str)] = &[
    ("experience_operators", "data_juicer", "issue 14 (item 5): Data-Juicer is a Python service", "Data-Juicer"),
    ("reader", "sql", "no issue: SQL experience buffers are read, SQL tasksets are not", "`sql` tasksets are not read"),
    ("workflows", "RAFT_alfworld_workflow", "issue 46", "pip install alfworld textworld"),
    ("workflows", "RAFT_reflect_alfworld_workflow", "issue 46", "pip install alfworld textworld"),
    ("workflows", "alfworld_workflow", "issue 46", "pip install alfworld textworld"),
    ("workflows", "step_wise_alfworld_workflow", "issue 46", "pip install alfworld textworld"),
    ("workflows", "agentscope_react_math_workflow", "issue 46", "install 'agentscope"),
    ("workflows", "agentscope_react_workflow", "issue 46", "install 'agentscope"),
    ("workflows", "agentscope_v1_react_search_workflow", "issue 46", "install 'agentscope"),
    ("workflows", "agentscope_workflow_adapter", "issue 46", "install 'agentscope"),
    ("workflows", "agentscope_workflow_adapter_v1", "issue 46", "install 'agentscope"),
    ("workflows", "agentscopev0_react_math_workflow", "issue 46", "install 'agentscope"),
    ("workflows", "as_react_workflow", "issue 46", "install 'agentscope"),
    ("workflows", "email_search_workflow", "issue 46", "install 'agentscope"),
    ("workflows", "intercode_sql_workflow", "issue 46", "pip install intercode"),
    ("workflows", "sciworld_workflow", "issue 46", "pip install scienceworld"),
    ("workflows", "webshop_workflow", "issue 46", "pip install gym web_agent_site"),
];

/// The kind `trinity plugins list` gives a registry's names, for the registries it lists.
fn listed_kind(registry: &str) -> Option<&'static str> {
    Some(match registry {
        "advantage_fn" => "advantage function",
        "algorithm" => "algorithm type",
        "entropy_loss_fn" => "entropy loss",
        "experience_operators" => "operator",
        "kl_fn" => "KL function",
        "policy_loss_fn" => "policy loss",
        "reward_functions" => "reward",
        "sample_strategy" => "sample strategy",
        "workflows" => "workflow",
        _ => return None,
    })
}

/// The fixture's `(registry, name)` rows.
fn registry_names() -> Vec<(String, String)> {
    let path = workspace_root().join("tests/fixtures/trinity-rft-0.6.0/registry.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let (header, rows) = text.split_once('\n').unwrap();
    assert!(header.starts_with("# Trinity-RFT 0.6.0: the 136 names"), "{header}");
    rows.lines()
        .map(|line| {
            let (registry, name) = line.split_once(' ').unwrap();
            (registry.to_owned(), name.to_owned())
        })
        .collect()
}

/// `(kind, name)` of everything `trinity plugins list --json` lists, checked against `trinity algorithm list`.
fn listed() -> BTreeSet<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let lines = |args: &[&str]| -> Vec<serde_json::Value> {
        let output = trinity(dir.path(), args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let text = |v: &serde_json::Value, key: &str| v[key].as_str().unwrap().to_owned();
    let plugins: BTreeSet<(String, String)> =
        lines(&["plugins", "list", "--json"]).iter().map(|v| (text(v, "kind"), text(v, "name"))).collect();
    for algorithm in lines(&["algorithm", "list", "--json"]).iter().filter(|v| v["kind"] == "algorithm_type") {
        assert!(plugins.contains(&("algorithm type".to_owned(), text(algorithm, "name"))), "{algorithm}");
    }
    plugins
}

fn trinity(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir)
        .args(args)
        .env_remove("RUST_LOG")
        .env("TRINITY_PYTHON", trinity_rft_python())
        .env_remove("TRINITY_PLUGIN_DIRS")
        .output()
        .expect("the trinity binary runs")
}

/// A GRPO config on the tiny model with `taskset` (taskset keys), then `rest` (top-level sections or `buffer`
/// keys at two spaces, appended after the taskset).
fn config(taskset: &str, rest: &str) -> String {
    format!(
        "project: p
name: n
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: grpo
  repeat_times: 2
model:
  model_path: {}
  max_model_len: 40
  max_response_tokens: 6
buffer:
  batch_size: 2
  explorer_input:
    taskset:
{taskset}{rest}",
        tiny_model_dir().display()
    )
}

const JSONL_TASKSET: &str = "      path: tasks.jsonl\n";

fn experience_buffer(storage: &str, extra: &str) -> String {
    format!("  trainer_input:\n    experience_buffer:\n      name: exp\n      storage_type: {storage}\n{extra}")
}

/// Configs that use `name` of `registry` in each of its places, for the names `plugins list` does not show.
fn configs_naming(registry: &str, name: &str) -> Vec<String> {
    match registry {
        "workflows" => vec![config(&format!("{JSONL_TASKSET}      default_workflow_type: {name}\n"), "")],
        "monitor" => vec![config(JSONL_TASKSET, &format!("monitor:\n  monitor_type: {name}\n"))],
        "selectors" => {
            vec![config(&format!("{JSONL_TASKSET}      task_selector:\n        selector_type: {name}\n"), "")]
        }
        "priority_fn" => {
            let replay = format!("      replay_buffer:\n        enable: true\n        priority_fn: {name}\n");
            vec![config(JSONL_TASKSET, &experience_buffer("queue", &replay))]
        }
        // A reader reads tasksets and experience buffers of its storage type.
        "reader" => match name {
            "file" => vec![config(JSONL_TASKSET, "")],
            "queue" => vec![config(JSONL_TASKSET, &experience_buffer("queue", ""))],
            "sql" => vec![
                config(JSONL_TASKSET, &experience_buffer("sql", "      path: sqlite:///exp.db\n")),
                config("      storage_type: sql\n      path: sqlite:///tasks.db\n", ""),
            ],
            _ => Vec::new(),
        },
        "experience_operators" => {
            vec![config(
                JSONL_TASKSET,
                &format!("data_processor:\n  experience_pipeline:\n    operators:\n      - name: {name}\n"),
            )]
        }
        _ => Vec::new(),
    }
}

/// `Ok` when every config naming it passes `--dry-run`, else the first error line.
fn dry_runs(registry: &str, name: &str) -> Result<(), String> {
    let configs = configs_naming(registry, name);
    if configs.is_empty() {
        return Err(format!("no config names a {registry} `{name}`, and trinity does not list it"));
    }
    for text in configs {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tasks.jsonl"), "{\"prompt\": \"1+1\", \"response\": \"2\"}\n").unwrap();
        std::fs::write(dir.path().join("config.yaml"), text).unwrap();
        let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--dry-run"]);
        if !output.status.success() {
            let err = String::from_utf8_lossy(&output.stderr).into_owned();
            let line = err.lines().find(|l| l.starts_with("error: ")).unwrap_or(err.trim()).to_owned();
            return Err(line);
        }
    }
    Ok(())
}

#[test]
fn every_name_trinity_rft_0_6_0_registers_runs_or_is_refused_with_what_brings_it() {
    // Python workflow names are resolved in that venv, so it must import Trinity-RFT.
    trinity_rft_python();
    let names = registry_names();
    assert_eq!(names.len(), 136);
    for (registry, name, _, _) in REFUSED {
        assert!(names.iter().any(|(r, n)| r == registry && n == name), "{registry} `{name}` is not a 0.6.0 name");
    }
    let listed = listed();
    // The names no list shows are checked by dry runs, two at a time (each Python workflow imports Trinity-RFT).
    let unlisted: Vec<&(String, String)> = names
        .iter()
        .filter(|(r, n)| !listed_kind(r).is_some_and(|kind| listed.contains(&(kind.to_owned(), n.clone()))))
        .collect();
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let halves: Vec<_> = unlisted
            .chunks(unlisted.len().div_ceil(2).max(1))
            .map(|chunk| scope.spawn(move || chunk.iter().map(|(r, n)| dry_runs(r, n)).collect::<Vec<_>>()))
            .collect();
        halves.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut refused = 0;
    let mut wrong = Vec::new();
    for (registry, name) in names.iter().filter(|n| !unlisted.contains(n)) {
        if REFUSED.iter().any(|(r, n, _, _)| r == registry && n == name) {
            println!("{registry} `{name}` runs now; remove it from REFUSED");
        }
    }
    for ((registry, name), result) in unlisted.iter().zip(results) {
        let expected = REFUSED.iter().find(|(r, n, _, _)| r == registry && n == name);
        match (result, expected) {
            (Ok(()), None) => {}
            (Ok(()), Some(_)) => println!("{registry} `{name}` runs now; remove it from REFUSED"),
            (Err(error), Some((_, _, brings, text))) if error.contains(text) => {
                refused += 1;
                println!("refused: {registry} `{name}` ({brings}): {error}");
            }
            (Err(error), Some((_, _, brings, text))) => {
                wrong.push(format!("{registry} `{name}` ({brings}) is refused without `{text}`: {error}"))
            }
            (Err(error), None) => wrong.push(format!("{registry} `{name}` is refused and not in REFUSED: {error}")),
        }
    }
    let runs = names.len() - refused - wrong.len();
    println!("trinity-rft 0.6.0 registry names: {runs} of {} run, {refused} are refused", names.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
