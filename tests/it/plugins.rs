//! `trinity run --plugin` and `trinity plugins list` with real plugins (built for wasm32-wasip2 once per test
//! run) on the tiny model the repository ships.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

use crate::support::{assert_clean_failure, grpo_run_config, stderr, stdout, tiny_model_dir, trinity, workspace_root};

const PACKAGES: [&str; 6] =
    ["gsm8k_reward", "frozen_lake", "zero_variance_filter", "hostile_reward", "judged_workflow", "wit_0_1_0_workflow"];

/// The `.wasm` file of one plugin package, built once per test binary.
fn plugin(package: &str) -> PathBuf {
    static BUILT: OnceLock<Result<Vec<PathBuf>, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-plugins");
        trinity_plugin::build::build_plugins(&workspace_root(), &PACKAGES, &target)
    });
    let paths = built.as_ref().unwrap_or_else(|error| panic!("{error}"));
    paths[PACKAGES.iter().position(|p| *p == package).expect("a known plugin package")].clone()
}

/// The tiny model with a longer context (multi-turn prompts do not fit its 64 positions).
fn tiny_model(dir: &Path) -> PathBuf {
    let source = tiny_model_dir();
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    std::fs::write(
        model.join("config.json"),
        config.replace("\"max_position_embeddings\": 64", "\"max_position_embeddings\": 512"),
    )
    .unwrap();
    model
}

fn config(model: &Path, max_model_len: u32, taskset: &str, extra: &str) -> String {
    format!("{}{taskset}{extra}", grpo_run_config(model, max_model_len))
}

fn experiences(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("ckpt/p/n/experiences.jsonl")).unwrap();
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

#[test]
fn a_run_trains_with_a_plugin_reward() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..4).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"#### {i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let model = tiny_model_dir();
    let taskset = "    default_workflow_type: simple_workflow\n    default_reward_fn_type: gsm8k_reward\n";
    std::fs::write(dir.path().join("config.yaml"), config(&model, 40, taskset, "")).unwrap();
    let wasm = plugin("gsm8k_reward");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--plugin", wasm.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let metrics = std::fs::read_to_string(dir.path().join("ckpt/p/n/monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "two train steps:\n{metrics}");
    let rows = experiences(dir.path());
    assert_eq!(rows.len(), 8, "2 steps x 2 tasks x 2 rollouts");
    for row in &rows {
        assert!(row["metrics"]["accuracy"].is_number(), "the plugin's component: {row}");
    }
    let log = std::fs::read_to_string(dir.path().join("ckpt/p/n/log/trinity.log")).unwrap();
    assert!(log.contains("finished after 2 train steps"), "{log}");
}

#[test]
fn frozen_lake_runs_multi_turn_episodes_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..4).map(|i| format!("{{\"seed\": {i}, \"size\": 3}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let model = tiny_model(dir.path());
    let taskset = "      workflow_args:\n        max_steps: 3\n        system_prompt: walk\n    default_workflow_type: frozen_lake\n";
    let plugins = format!("plugins:\n  - {}\n", plugin("frozen_lake").display());
    std::fs::write(dir.path().join("config.yaml"), config(&model, 400, taskset, &plugins)).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let rows = experiences(dir.path());
    assert_eq!(rows.len(), 8, "2 steps x 2 tasks x 2 episodes");
    let multi_turn = rows.iter().filter(|row| row["metrics"]["steps"].as_f64().unwrap_or(0.0) >= 2.0).count();
    assert!(multi_turn > 0, "some episode lasts several turns: {rows:?}");
    for row in &rows {
        let mask: Vec<bool> = row["action_mask"].as_array().unwrap().iter().map(|m| m.as_bool().unwrap()).collect();
        let steps = row["metrics"]["steps"].as_f64().unwrap();
        assert!(mask[0], "the response starts with the model's first move");
        if steps >= 2.0 {
            assert!(mask.contains(&false), "environment replies between moves are context: {mask:?}");
            assert!(mask.iter().rev().any(|m| *m), "{mask:?}");
        }
        assert_eq!(row["info"]["workflow"], "frozen_lake");
        assert!(row["reward"] == 0.0 || row["reward"] == 1.0, "{row}");
    }
}

#[test]
fn hostile_rewards_cost_their_task_and_the_run_completes() {
    let dir = tempfile::tempdir().unwrap();
    let behaviors = ["ok", "loop", "ok", "trap", "ok", "nan", "ok", "alloc"];
    let rows: String = behaviors
        .iter()
        .map(|behavior| format!("{{\"prompt\": \"ab\", \"response\": \"1\", \"behavior\": \"{behavior}\"}}\n"))
        .collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let model = tiny_model_dir();
    let taskset = "    default_workflow_type: simple_workflow\n    default_reward_fn_type: hostile_reward\n";
    let plugins = format!(
        "explorer:\n  max_retry_times: 0\nplugins:\n  - path: {}\n    timeout_s: 1\n    max_memory_mib: 64\n",
        plugin("hostile_reward").display()
    );
    std::fs::write(dir.path().join("config.yaml"), config(&model, 40, taskset, &plugins)).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let rows = experiences(dir.path());
    assert_eq!(rows.len(), 8, "the four well-behaved tasks, two rollouts each");
    assert!(rows.iter().all(|row| row["reward"] == 1.0), "{rows:?}");
    let metrics = std::fs::read_to_string(dir.path().join("ckpt/p/n/monitor/metrics.jsonl")).unwrap();
    let failed: f64 = metrics
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["rollout/failed_tasks"].as_f64().unwrap())
        .sum();
    assert_eq!(failed, 4.0, "{metrics}");
    let log = std::fs::read_to_string(dir.path().join("ckpt/p/n/log/trinity.log")).unwrap();
    for expected in ["deadline", "trapped", "is NaN", "memory limit of 64 MiB"] {
        assert!(log.contains(expected) && log.contains("hostile_reward"), "log lacks {expected:?}:\n{log}");
    }
}

#[test]
fn plugins_list_shows_built_ins_and_plugins_with_origin_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = plugin("gsm8k_reward");
    let op = plugin("zero_variance_filter");
    let args = ["plugins", "list", "--plugin", wasm.to_str().unwrap(), "--plugin", op.to_str().unwrap()];
    let output = trinity(dir.path(), &args);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let line = |name: &str| text.lines().find(|l| l.split_whitespace().any(|w| w == name)).map(str::to_owned);
    let reward = line("gsm8k_reward").unwrap_or_else(|| panic!("{text}"));
    assert!(reward.starts_with("reward") && reward.contains("0.1.0") && reward.contains("gsm8k_reward.wasm"));
    let operator = line("zero_variance_filter").unwrap_or_else(|| panic!("{text}"));
    assert!(operator.starts_with("operator"), "{operator}");
    let builtin = line("math_workflow").unwrap_or_else(|| panic!("{text}"));
    assert!(builtin.starts_with("workflow") && builtin.ends_with("built-in"), "{builtin}");
    assert!(line("grpo").is_some(), "algorithm presets are listed too:\n{text}");
}

#[test]
fn a_plugin_loaded_twice_or_not_a_component_is_a_clean_error() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = plugin("gsm8k_reward");
    let path = wasm.to_str().unwrap();
    let output = trinity(dir.path(), &["plugins", "list", "--plugin", path, "--plugin", path]);
    assert_clean_failure(&output, &["gsm8k_reward", "already registered"]);

    std::fs::write(dir.path().join("core.wasm"), b"\0asm\x01\0\0\0").unwrap();
    let output = trinity(dir.path(), &["plugins", "list", "--plugin", "core.wasm"]);
    assert_clean_failure(&output, &["core.wasm", "core WebAssembly module"]);

    let output = trinity(dir.path(), &["plugins", "list", "--plugin", "libalgo.so"]);
    assert_clean_failure(&output, &["libalgo.so"]);
}

#[test]
fn a_plugin_workflow_calls_an_auxiliary_model_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tasks.jsonl"), "{\"prompt\": \"ab1\"}\n{\"prompt\": \"ab2\"}\n").unwrap();
    let model = tiny_model_dir();
    let taskset = "      workflow_args:\n        judge: critic\n    default_workflow_type: judged_workflow\n";
    let extra = format!(
        "  total_steps: 1\nexplorer:\n  rollout_model:\n    dtype: float32\n  auxiliary_models:\n    - model_path: {}\n      name: critic\n      dtype: float32\nplugins:\n  - {}\n",
        model.display(),
        plugin("judged_workflow").display()
    );
    std::fs::write(dir.path().join("config.yaml"), config(&model, 40, taskset, &extra)).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let rows = experiences(dir.path());
    assert_eq!(rows.len(), 4, "2 tasks x 2 rollouts");
    for row in &rows {
        let info = &row["info"];
        assert_eq!(info["auxiliary_models"], serde_json::json!(["critic"]), "{row}");
        assert!(info["verdict_tokens"].as_u64().unwrap() > 0, "the judge answered: {row}");
        let verdict = info["verdict"].as_str().unwrap();
        assert_eq!(row["reward"].as_f64().unwrap(), f64::from(u8::from(verdict.chars().count() % 2 == 0)));
        let unknown = info["unknown_judge"].as_str().unwrap();
        assert!(unknown.contains("no_such_judge") && unknown.contains("critic"), "{unknown}");
        // The judge is the same tiny model in fp32: its logprobs of the reply's tokens after the first equal the
        // policy's sampling logprobs of them only with the prompt in front, so here only the shape is checked.
        let reply = info["reply_logprobs"].as_array().unwrap().len();
        assert_eq!(info["teacher_logprobs"].as_array().unwrap().len(), reply.saturating_sub(1), "{row}");
    }
}

#[test]
fn a_plugin_built_against_wit_0_1_0_still_loads_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tasks.jsonl"), "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n").unwrap();
    let model = tiny_model_dir();
    let wasm = plugin("wit_0_1_0_workflow");
    let listed = trinity(dir.path(), &["plugins", "list", "--plugin", wasm.to_str().unwrap()]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("wit_0_1_0_workflow"), "{}", stdout(&listed));
    let taskset = "    default_workflow_type: wit_0_1_0_workflow\n";
    let extra = format!("  total_steps: 1\nplugins:\n  - {}\n", wasm.display());
    std::fs::write(dir.path().join("config.yaml"), config(&model, 40, taskset, &extra)).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let rows = experiences(dir.path());
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|row| row["reward"].as_f64() == Some(0.5)), "{rows:?}");
}
