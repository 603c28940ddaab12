//! Trinity-RFT's own example configs, run as shipped on the tiny model: only environment variables and `--set`
//! change them (model and data paths, the tiny model's lengths, two tasks per step, two steps), so a key that one
//! of them sets and trinity ignores or mishandles shows up here as a failed or different run.

use std::path::Path;

use crate::support::{fixture, stderr, tiny_model_dir};

/// GSM8K-like rows (`question` / `answer` with the `#### n` final line).
fn gsm8k_rows(dir: &Path) -> String {
    let path = dir.join("gsm8k.jsonl");
    let rows: String = (0..6)
        .map(|i| {
            // `question` for the GSM8K configs, `problem` for mix_math's MATH-style rows.
            let (question, answer) = (format!("ab{i} + {i}?"), format!("so\n#### {}", 2 * i));
            // The offline pass rates BOTS's `difficulty_based` selector starts from.
            let row = serde_json::json!({
                "question": question, "problem": question, "prompt": question, "answer": answer,
                "reward_model.ground_truth": format!("{}", 2 * i),
                // The bare answer under the entropy examples' and grpo_math's response keys.
                "ground_truth": format!("{}", 2 * i), "gt_answer": format!("{}", 2 * i),
                "qwen2.5_7b_pass_rate": 0.1 * i as f64, "qwen3_30b_pass_rate": 0.5,
            });
            format!("{row}\n")
        })
        .collect();
    std::fs::write(&path, rows).unwrap();
    path.display().to_string()
}

/// Countdown rows: the answer is the JSON target and numbers `countdown_reward` reads.
fn countdown_rows(dir: &Path) -> String {
    let path = dir.join("countdown.jsonl");
    let rows: String = (0..6)
        .map(|i| {
            let truth = serde_json::json!({"target": 10 + i, "numbers": [i, 10]}).to_string();
            format!(
                "{}\n",
                serde_json::json!({"question": format!("make {} from {i} and 10", 10 + i), "answer": truth})
            )
        })
        .collect();
    std::fs::write(&path, rows).unwrap();
    path.display().to_string()
}

/// SFT chats for `mix_math`'s auxiliary buffer.
fn sft_rows(dir: &Path) -> String {
    let path = dir.join("sft.jsonl");
    let rows: String = (0..8)
        .map(|i| {
            let messages = serde_json::json!([
                {"role": "user", "content": format!("ab{i}")},
                {"role": "assistant", "content": format!("{i}")},
            ]);
            format!("{}\n", serde_json::json!({ "messages": messages }))
        })
        .collect();
    std::fs::write(&path, rows).unwrap();
    path.display().to_string()
}

/// Runs `config` (a path under the fixtures' `trinity-rft-0.5.2/examples/`) for two steps and returns the
/// metrics lines of the run.
fn run_example(config: &str, extra: &[String]) -> Vec<serde_json::Value> {
    run_example_with_meta(config, extra).0
}

/// [`run_example`], also returning the last checkpoint's `meta.json`.
fn run_example_with_meta(config: &str, extra: &[String]) -> (Vec<serde_json::Value>, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let tasks = if config.contains("countdown") { countdown_rows(dir.path()) } else { gsm8k_rows(dir.path()) };
    let sft = sft_rows(dir.path());
    let path = fixture(&format!("trinity-rft-0.5.2/examples/{config}"));
    let mut args: Vec<String> = ["run", "--config", path.to_str().unwrap()].map(str::to_owned).to_vec();
    let mut set = |s: String| args.extend(["--set".to_owned(), s]);
    // The tiny model's positions (with a system prompt short enough for them), two tasks per explore step, two
    // steps.
    set("model.max_model_len=64".into());
    set("buffer.explorer_input.taskset.format.system_prompt=Be brief.".into());
    set("model.max_response_tokens=8".into());
    set("buffer.batch_size=2".into());
    set("buffer.total_steps=2".into());
    set(format!("buffer.explorer_input.taskset.path={tasks}"));
    // An example's hosted monitor (mix_math's wandb) would need its service; these tests read metrics.jsonl.
    set("monitor.monitor_type=jsonl".into());
    // `TASKS` in an extra override stands for the written taskset's path.
    for e in extra {
        set(e.replace("TASKS", &tasks));
    }
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir.path())
        .args(&args)
        .env_remove("RUST_LOG")
        .env("TRINITY_MODEL_PATH", tiny_model_dir())
        .env("TRINITY_TASKSET_PATH", &tasks)
        .env("TRINITY_SFT_DATASET_PATH", &sft)
        .env("TRINITY_CHECKPOINT_ROOT_DIR", dir.path().join("ckpt"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{config} failed:\n{}", stderr(&output));
    let metrics = walk_for(&dir.path().join("ckpt"), "metrics.jsonl").unwrap_or_else(|| panic!("{config}: no metrics"));
    let text = std::fs::read_to_string(metrics).unwrap();
    let lines = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let meta = walk_for(&dir.path().join("ckpt"), "meta.json").unwrap_or_else(|| panic!("{config}: no checkpoint"));
    (lines, serde_json::from_str(&std::fs::read_to_string(meta).unwrap()).unwrap())
}

fn walk_for(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = walk_for(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

/// The metrics line of train step `step`.
fn step(lines: &[serde_json::Value], step: u64) -> &serde_json::Value {
    lines.iter().find(|l| l["step"].as_u64() == Some(step) && l.get("train/loss").is_some()).unwrap_or_else(|| {
        panic!("no train metrics at step {step}: {lines:?}");
    })
}

#[test]
fn group_algorithms_run_their_gsm8k_examples() {
    for (config, loss_key) in [
        ("grpo_gsm8k/gsm8k.yaml", "train/pg_clipfrac"),
        ("asymre_gsm8k/gsm8k.yaml", "train/loss"),
        ("opmd_gsm8k/opmd_gsm8k.yaml", "train/loss"),
        ("cispo_gsm8k/gsm8k.yaml", "train/loss"),
        ("topr_gsm8k/gsm8k.yaml", "train/loss"),
        ("sppo_gsm8k/gsm8k.yaml", "train/loss"),
        ("rec_gsm8k/gsm8k.yaml", "train/loss"),
    ] {
        let lines = run_example(config, &[]);
        for s in [1, 2] {
            let line = step(&lines, s);
            assert!(line[loss_key].as_f64().is_some_and(f64::is_finite), "{config} step {s}: {line}");
            assert_eq!(line["train/perf/rows"], 16.0, "{config} step {s}: two tasks × eight rollouts");
        }
    }
}

#[test]
fn ppo_countdown_trains_its_critic_and_replays_experiences() {
    for config in ["ppo_countdown/countdown.yaml", "ppo_countdown_exp_replay/countdown.yaml"] {
        let lines = run_example(config, &[]);
        let line = step(&lines, 2);
        assert!(line["train/critic/vf_loss"].as_f64().is_some_and(f64::is_finite), "{config}: {line}");
        assert!(line["rollout/reward_mean"].as_f64().is_some(), "{config}: {line}");
        if config.contains("replay") {
            assert!(line["replay/queued_items"].is_number(), "{config}: no replay metrics: {line}");
        }
    }
}

#[test]
fn mix_math_trains_expert_rows_from_its_sft_dataset() {
    // Two tasks × eight rollouts are the usual rows; ceil(0.2 · 20) = 4 expert rows per step.
    let lines = run_example("mix_math/mix_math.yaml", &["buffer.train_batch_size=20".into()]);
    let line = step(&lines, 1);
    assert!(line["train/expert/sft_loss"].as_f64().is_some_and(|l| l > 0.0), "{line}");
    assert_eq!(line["train/perf/rows"], 20.0, "{line}");
}

#[test]
fn bots_selects_tasks_by_difficulty_from_measured_pass_rates() {
    // BOTS: `pass_rate_calculator` measures each task's pass rate and the `difficulty_based` selector, seeded
    // from the rows' two offline pass-rate columns, draws the next tasks from its updated beliefs. Its workflow is
    // a Python class of Trinity-RFT's examples (a boxed-answer math workflow), so the built-in one stands in.
    let extra = [
        "model.max_prompt_tokens=56".to_owned(),
        "buffer.explorer_input.default_workflow_type=math_boxed_workflow".to_owned(),
        "buffer.explorer_input.eval_tasksets[0].path=TASKS".to_owned(),
    ];
    let (lines, meta) = run_example_with_meta("bots/bots.yaml", &extra);
    let line = step(&lines, 2);
    // The checkpoint keeps the selector's beliefs, so a resumed run selects as the uninterrupted one.
    assert!(meta["beliefs"][0].is_object(), "no difficulty beliefs in the checkpoint: {meta}");
    assert_eq!(line["pipeline/pass_rate_calculator/errors"], 0.0, "{line}");
    assert_eq!(line["train/perf/rows"], 32.0, "two tasks × sixteen rollouts: {line}");
}

#[test]
fn entropy_examples_train_on_the_tokens_their_clipping_keeps() {
    // examples/entropy: grpo_verl with the Clip_B / Clip_V advantage, top-20 logprobs asked for (noted: only the
    // sampled token's is kept, as in Trinity-RFT), old logprobs recomputed (`bypass_mode: false`), four eval
    // tasksets (here the local file, once per task).
    let mut extra = vec!["model.max_prompt_tokens=56".to_owned()];
    for i in 0..4 {
        extra.push(format!("buffer.explorer_input.eval_tasksets[{i}].path=TASKS"));
        extra.push(format!("buffer.explorer_input.eval_tasksets[{i}].repeat_times=1"));
    }
    for (config, rows, signal) in
        [("entropy/clipb.yaml", 32.0, "train/advantage/ES"), ("entropy/clipv.yaml", 16.0, "train/advantage/stdD")]
    {
        let lines = run_example(config, &extra);
        for s in [1, 2] {
            let line = step(&lines, s);
            assert_eq!(line["train/perf/rows"], rows, "{config} step {s}: two tasks × repeat_times: {line}");
            let clipped = line["train/advantage/frac_clipped"].as_f64();
            assert!(clipped.is_some_and(|f| (0.0..=1.0).contains(&f)), "{config} step {s}: {line}");
            assert!(line[signal].as_f64().is_some_and(f64::is_finite), "{config} step {s}: {line}");
            assert!(line["train/loss"].as_f64().is_some_and(f64::is_finite), "{config} step {s}: {line}");
        }
    }
}

#[test]
fn grpo_math_scores_with_rm_gallery_s_math_verify_reward() {
    // `rm_gallery_reward` with `reward_name: math_verify_reward` is RM-Gallery's rule-based answer check, scored
    // under its dimension name `math_verify`.
    let lines = run_example("grpo_math/math.yaml", &[]);
    let line = step(&lines, 2);
    assert_eq!(line["train/perf/rows"], 16.0, "{line}");
    let component = line.as_object().unwrap().keys().find(|k| k.contains("math_verify")).cloned();
    assert!(component.is_some(), "no math_verify reward component in {line}");
}

#[test]
fn a_bad_replay_priority_function_fails_the_dry_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture("trinity-rft-0.5.2/examples/ppo_countdown_exp_replay/countdown.yaml");
    let set = "buffer.trainer_input.experience_buffer.replay_buffer.priority_fn=linear_decy";
    let output =
        crate::support::trinity(dir.path(), &["run", "--config", path.to_str().unwrap(), "--dry-run", "--set", set]);
    crate::support::assert_clean_failure(&output, &["replay_buffer.priority_fn", "linear_decy"]);
}
