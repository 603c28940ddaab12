//! `trinity run --dry-run`: Trinity-RFT configs load, and malformed ones fail with a named error.

use std::path::Path;
use std::process::Command;

use crate::support::{assert_clean_failure, fixture, stderr, stdout, trinity, trinity_rft_python};

/// A small valid config; the malformed cases below each break one thing in it.
const BASE: &str = "\
project: p
name: n
algorithm:
  algorithm_type: grpo
  repeat_times: 4
  optimizer:
    lr: 1e-6
model:
  model_path: /models/tiny
  max_model_len: 256
  max_response_tokens: 64
buffer:
  batch_size: 2
  explorer_input:
    taskset:
      name: train
      path: /data/train.jsonl
    eval_tasksets:
      - name: eval
        path: /data/eval.jsonl
";

fn write(dir: &Path, text: &str) -> String {
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn dry_run(text: &str, extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), text);
    let mut args = vec!["run", "--config", path.as_str(), "--dry-run"];
    args.extend_from_slice(extra);
    trinity(dir.path(), &args)
}

#[test]
fn trinity_quickstart_config_loads_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture("configs/gsm8k.yaml");
    let output = trinity(dir.path(), &["run", "--config", path.to_str().unwrap(), "--dry-run"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let resolved = stdout(&output);
    for expected in [
        "algorithm_type: grpo",
        "repeat_times: 8",
        "train_batch_size: 1024",
        "max_prompt_tokens: 1024",
        "default_workflow_type: math_workflow",
        "model_path: Qwen/Qwen2.5-1.5B-Instruct",
        "name: gsm8k-eval",
    ] {
        assert!(resolved.contains(expected), "missing {expected:?} in:\n{resolved}");
    }
    let root = dir.path().join("checkpoints").canonicalize().unwrap_or(dir.path().join("checkpoints"));
    assert!(
        resolved.contains(&format!("checkpoint_root_dir: {}", dir.path().join("checkpoints").display()))
            || resolved.contains(&format!("checkpoint_root_dir: {}", root.display())),
        "checkpoint root not made absolute:\n{resolved}"
    );
    assert!(stderr(&output).contains("nccl"), "the nccl → memory mapping is reported");
}

#[test]
fn resolved_output_is_a_valid_config_itself() {
    let first = dry_run(BASE, &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let second = dry_run(&stdout(&first), &[]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(stdout(&first), stdout(&second), "resolution is idempotent");
}

#[test]
fn environment_interpolation_and_overrides_apply() {
    let dir = tempfile::tempdir().unwrap();
    let text = BASE.replace("/models/tiny", "${oc.env:TRINITY_TEST_MODEL,/fallback}");
    let path = write(dir.path(), &text);
    let output = Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir.path())
        .args(["run", "--config", &path, "--dry-run"])
        .args(["--set", "algorithm.optimizer.lr=3e-5", "--set", "buffer.batch_size=3"])
        .env("TRINITY_TEST_MODEL", "/from/env")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let resolved = stdout(&output);
    assert!(resolved.contains("model_path: /from/env"), "{resolved}");
    assert!(resolved.contains("lr: 3e-5"), "{resolved}");
    assert!(resolved.contains("train_batch_size: 12"), "3 tasks × 4 repeats:\n{resolved}");

    let output = dry_run(&text, &[]);
    assert!(stdout(&output).contains("model_path: /fallback"), "{}", stdout(&output));
}

#[test]
fn malformed_configs_fail_with_named_errors() {
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "typo at the top",
            BASE.replace("algorithm:", "algoritm:"),
            vec!["config.yaml:3:1", "unknown key `algoritm`", "did you mean `algorithm`"],
        ),
        (
            "nested typo",
            BASE.replace("    lr: 1e-6", "    lr: 1e-6\n    weight_decy: 0.1"),
            vec!["`algorithm.optimizer.weight_decy`", "did you mean `weight_decay`"],
        ),
        (
            "typo in a list item",
            BASE.replace("        path: /data/eval.jsonl", "        pth: /data/eval.jsonl"),
            vec!["`buffer.explorer_input.eval_tasksets[0].pth`", "did you mean `path`"],
        ),
        ("wrong type", BASE.replace("batch_size: 2", "batch_size: two"), vec!["`buffer.batch_size`", "invalid type"]),
        ("negative count", BASE.replace("repeat_times: 4", "repeat_times: -4"), vec!["`algorithm.repeat_times`", "-4"]),
        (
            "negative learning rate",
            BASE.replace("lr: 1e-6", "lr: -1e-6"),
            vec!["config.yaml:7:5", "`algorithm.optimizer.lr`", "must be a positive number"],
        ),
        ("zero batch size", BASE.replace("batch_size: 2", "batch_size: 0"), vec!["`buffer.batch_size`", "at least 1"]),
        (
            "unset environment variable",
            BASE.replace("/models/tiny", "${oc.env:TRINITY_TEST_SURELY_UNSET}"),
            vec!["`model.model_path`", "`TRINITY_TEST_SURELY_UNSET`"],
        ),
        (
            "unsupported interpolation",
            BASE.replace("/models/tiny", "${oc.select:project}"),
            vec!["`model.model_path`", "unsupported interpolation"],
        ),
        ("YAML syntax error", BASE.replace("name: n", "name: [n"), vec!["invalid YAML"]),
        ("duplicate key", format!("{BASE}project: q\n"), vec!["duplicate key `project`"]),
        ("empty file", String::new(), vec!["the config is empty"]),
        ("not a mapping", "- a\n- b\n".to_owned(), vec!["must be a mapping", "a list"]),
        (
            "unsupported Trinity key",
            BASE.replace("  model_path: /models/tiny", "  model_path: /models/tiny\n  tinker:\n    enable: true"),
            vec!["`model.tinker`", "Tinker"],
        ),
        (
            "two LoRA adapters",
            BASE.replace(
                "  model_path: /models/tiny",
                "  model_path: /models/tiny\n  lora_configs:\n  - lora_rank: 8\n  - lora_rank: 16",
            ),
            vec!["`model.lora_configs`", "exactly one LoRA adapter"],
        ),
        (
            "LoRA target that is no pattern",
            BASE.replace(
                "  model_path: /models/tiny",
                "  model_path: /models/tiny\n  lora_configs:\n  - target_modules: \"(q_proj\"",
            ),
            vec!["`model.lora_configs[0].target_modules`", "regular expression"],
        ),
        (
            "unknown enum value",
            format!("{BASE}synchronizer:\n  sync_method: gloo\n"),
            vec!["`synchronizer.sync_method`", "gloo"],
        ),
        (
            "sync method not allowed in mode",
            format!(
                "{BASE}  trainer_input:\n    experience_buffer:\n      path: sqlite:///x.db\nmode: explore\nsynchronizer:\n  sync_method: memory\n"
            ),
            vec!["`synchronizer.sync_method`", "mode `explore`"],
        ),
        (
            "lengths that do not add up",
            BASE.replace("max_response_tokens: 64", "max_response_tokens: 64\n  max_prompt_tokens: 250"),
            vec!["`model.max_model_len`", "exceed"],
        ),
        (
            "top_p out of range",
            BASE.replace(
                "      path: /data/train.jsonl",
                "      path: /data/train.jsonl\n      rollout_args:\n        top_p: 1.5",
            ),
            vec!["`buffer.explorer_input.taskset.rollout_args.top_p`", "1.5"],
        ),
        (
            "max_tokens above the model limit",
            BASE.replace(
                "      path: /data/train.jsonl",
                "      path: /data/train.jsonl\n      rollout_args:\n        max_tokens: 65",
            ),
            vec!["rollout_args.max_tokens`", "65"],
        ),
        (
            "taskset without a path",
            BASE.replace("      path: /data/train.jsonl\n", ""),
            vec!["`buffer.explorer_input.taskset.path`", "needs a `path`"],
        ),
        (
            "no taskset at all",
            BASE.replace("    taskset:\n      name: train\n      path: /data/train.jsonl\n", ""),
            vec!["`buffer.explorer_input.taskset`", "none are configured"],
        ),
        (
            "explore without a shared buffer",
            format!("{BASE}mode: explore\nsynchronizer:\n  sync_method: checkpoint\n"),
            vec!["`buffer.trainer_input.experience_buffer.path`", "sqlite:///", "postgresql://"],
        ),
        (
            "model lengths missing",
            BASE.replace("  max_model_len: 256\n", "").replace("  max_response_tokens: 64\n", ""),
            vec!["`model.max_model_len`", "set max_model_len"],
        ),
        (
            "unknown selector",
            BASE.replace(
                "      name: train\n",
                "      name: train\n      task_selector:\n        selector_type: shufle\n",
            ),
            vec!["selector_type`", "did you mean `shuffle`"],
        ),
        (
            "unknown workflow",
            BASE.replace("  explorer_input:\n", "  explorer_input:\n    default_workflow_type: math_workflw\n"),
            vec![
                "`buffer.explorer_input.taskset.default_workflow_type`",
                "unknown workflow `math_workflw`",
                "did you mean `math_workflow`",
            ],
        ),
        (
            "unknown reward function",
            BASE.replace("  explorer_input:\n", "  explorer_input:\n    default_reward_fn_type: math_rewrd\n"),
            vec!["unknown reward function `math_rewrd`", "did you mean `math_reward`"],
        ),
        (
            "unknown algorithm type",
            BASE.replace("algorithm_type: grpo", "algorithm_type: grpoo"),
            vec!["`algorithm.algorithm_type`", "unknown algorithm type `grpoo`", "did you mean `grpo`"],
        ),
        (
            "duplicate eval taskset names",
            format!("{BASE}      - name: eval\n        path: /data/eval2.jsonl\n"),
            vec!["`buffer.explorer_input.eval_tasksets`", "two tasksets are named `eval`"],
        ),
    ];
    assert!(cases.len() >= 15);
    for (what, text, expected) in cases {
        let output = dry_run(&text, &[]);
        let err = stderr(&output);
        assert!(!output.status.success(), "{what}: accepted:\n{text}");
        assert!(!err.contains("panicked"), "{what}: panicked:\n{err}");
        for piece in &expected {
            assert!(err.contains(piece), "{what}: stderr lacks {piece:?}:\n{err}");
        }
    }
}

#[test]
fn dry_run_lists_every_independent_error_at_its_line() {
    let text =
        BASE.replace("    lr: 1e-6", "    lr: 1e-6\n    weight_decy: 0.1").replace("batch_size: 2", "batch_size: two")
            + "synchronizer:\n  sync_timeout: 0\n";
    let output = dry_run(&text, &[]);
    assert_clean_failure(&output, &[]);
    let err = stderr(&output);
    let lines: Vec<&str> = err.lines().filter(|line| line.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 3, "one line per error:\n{err}");
    for (line, expected) in lines.iter().zip([
        ["config.yaml:8:5: ", "unknown key `algorithm.optimizer.weight_decy`", "did you mean `weight_decay`"],
        ["config.yaml:14:3: ", "`buffer.batch_size`", "invalid type"],
        ["config.yaml:23:3: ", "`synchronizer.sync_timeout`", "at least 1 second"],
    ]) {
        for piece in expected {
            assert!(line.contains(piece), "{line:?} lacks {piece:?}:\n{err}");
        }
    }
}

#[test]
fn malformed_overrides_and_missing_files_fail_with_named_errors() {
    assert_clean_failure(
        &dry_run(BASE, &["--set", "buffer.batch_size"]),
        &["--set buffer.batch_size", "KEY.PATH=VALUE"],
    );
    assert_clean_failure(
        &dry_run(BASE, &["--set", "buffer.batch_size=many"]),
        &["--set buffer.batch_size=many", "`buffer.batch_size`"],
    );
    assert_clean_failure(
        &dry_run(BASE, &["--set", "buffer.batchsize=1"]),
        &["--set buffer.batchsize=1", "did you mean `batch_size`"],
    );
    let dir = tempfile::tempdir().unwrap();
    let output = trinity(dir.path(), &["run", "--config", "nowhere.yaml", "--dry-run"]);
    assert_clean_failure(&output, &["cannot read config file nowhere.yaml"]);
}

#[test]
fn a_real_run_names_a_missing_model() {
    let output = {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), BASE);
        trinity(dir.path(), &["run", "--config", &path])
    };
    assert_clean_failure(&output, &["/models/tiny"]);
}

#[test]
fn serve_without_a_buffer_a_trainer_can_read_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &format!("{BASE}mode: serve\n"));
    let output = trinity(dir.path(), &["run", "--config", &path]);
    assert_clean_failure(&output, &["`buffer.trainer_input.experience_buffer.path`", "a `mode: train` trainer"]);
}

#[test]
fn separate_modes_and_stages_pass_the_dry_run() {
    let shared = "  trainer_input:\n    experience_buffer:\n      path: sqlite:///x.db\n";
    let explore = format!("{BASE}{shared}mode: explore\n");
    let train = format!("{BASE}  train_batch_size: 8\n{shared}mode: train\n");
    let bench = format!("{BASE}mode: bench\nexplorer:\n  bench_on_latest_checkpoint: true\n");
    for text in [explore, train, bench] {
        let output = dry_run(&text, &[]);
        assert!(output.status.success(), "{text}\n{}", stderr(&output));
    }
    // With stages the dry run prints what each stage runs with, one YAML document per stage.
    let staged = format!(
        "{BASE}stages:\n  - stage_name: warmup\n    mode: train\n    algorithm:\n      algorithm_type: sft\n    \
         buffer:\n      train_batch_size: 4\n      trainer_input:\n        experience_buffer:\n          \
         storage_type: file\n          path: /data/sft.jsonl\n  - stage_name: rl\n"
    );
    let output = dry_run(&staged, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = stdout(&output);
    assert!(printed.contains("# stages[0]: warmup\n") && printed.contains("\n---\n# stages[1]: rl\n"), "{printed}");
    assert!(printed.contains("name: n/warmup") && printed.contains("name: n/rl"), "{printed}");
}

#[test]
fn every_example_config_validates() {
    let root = crate::support::workspace_root();
    let examples = root.join("examples");
    let python = trinity_rft_python();
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        for file in std::fs::read_dir(entry.unwrap().path()).into_iter().flatten() {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let dir = tempfile::tempdir().unwrap();
                // In the environment the examples' READMEs ask for: Trinity-RFT 0.6.0 in the Python that runs
                // workflow classes, and the repository root on its path (`examples.python_workflow...`).
                let output = Command::new(env!("CARGO_BIN_EXE_trinity"))
                    .current_dir(dir.path())
                    .args(["run", "--config", path.to_str().unwrap(), "--dry-run"])
                    .env_remove("RUST_LOG")
                    .env_remove("TRINITY_CHECKPOINT_ROOT_DIR")
                    .env_remove("TRINITY_MODEL_PATH")
                    .env_remove("TRINITY_TASKSET_PATH")
                    .env("TRINITY_PYTHON", &python)
                    .env("PYTHONPATH", &root)
                    .output()
                    .unwrap();
                assert!(output.status.success(), "{}: {}", path.display(), stderr(&output));
                checked += 1;
            }
        }
    }
    assert!(checked >= 1, "no example configs found in {}", examples.display());
}
