//! Mode `both` end to end on a tiny real model (two-layer Llama with tokenizer and chat template).

use std::path::{Path, PathBuf};

use trinity_algorithm::BuiltinCatalog;
use trinity_config::{Config, LoadOptions};

fn tiny_model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied")
}

fn config(dir: &Path, overrides: &[String]) -> Config {
    let rows: String = (0..10).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.join("train.jsonl"), &rows).unwrap();
    let eval: String = rows.lines().take(2).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("eval.jsonl"), eval).unwrap();
    let text = format!(
        "project: t
name: run
checkpoint_root_dir: {root}
algorithm:
  algorithm_type: grpo
  repeat_times: 4
  optimizer:
    lr: 1e-3
model:
  model_path: {model}
  max_model_len: 48
  max_response_tokens: 8
buffer:
  batch_size: 2
  explorer_input:
    taskset:
      name: toy
      path: {root}/train.jsonl
    eval_tasksets:
      - name: toy-eval
        path: {root}/eval.jsonl
    default_workflow_type: simple_workflow
    default_reward_fn_type: math_reward
explorer:
  eval_interval: 2
  runner_per_model: 4
trainer:
  save_interval: 2
synchronizer:
  sync_method: memory
monitor:
  monitor_type: csv
",
        root = dir.display(),
        model = tiny_model_dir().display()
    );
    let env = |_: &str| None;
    let options = LoadOptions { overrides, env: &env, catalog: &BuiltinCatalog, cwd: dir };
    trinity_config::load_str(&text, &dir.join("config.yaml"), options).unwrap().config
}

fn metrics(job: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn trains_checkpoints_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let first = config(dir.path(), &["buffer.total_steps=2".to_owned()]);
    let summary = trinity_rft::run(&first, &trinity_rft::job_dir(&first)).unwrap();
    assert_eq!(summary.train_steps, 2);
    assert_eq!(summary.resumed_from, None);
    let job = summary.job_dir;
    let lines = metrics(&job);
    let steps: Vec<u64> = lines.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![0, 1, 2], "eval at step 0, then one line per step");
    for key in [
        "rollout/reward_mean",
        "rollout/reward_std",
        "rollout/response_length_mean",
        "train/pg_loss",
        "train/grad_norm",
        "train/lr",
        "perf/rollout_tokens_per_s",
        "perf/train_tokens_per_s",
        "time/explore_s",
        "time/train_s",
        "time/sync_s",
    ] {
        assert!(lines[1].get(key).is_some_and(|v| v.is_number()), "step 1 lacks {key}: {}", lines[1]);
    }
    assert!(lines[0]["eval/toy-eval/accuracy"].is_number());
    assert!(lines[2]["eval/toy-eval/reward_mean"].is_number(), "eval every 2 steps");
    assert!(job.join("monitor/metrics.csv").exists());
    let checkpoint = job.join("global_step_2");
    assert!(checkpoint.join("meta.json").exists());
    assert!(checkpoint.join("hf/model.safetensors").exists());
    assert!(checkpoint.join("hf/tokenizer.json").exists());
    let experiences = std::fs::read_to_string(job.join("experiences.jsonl")).unwrap();
    assert_eq!(experiences.lines().count(), 2 * 2 * 4, "2 steps × 2 tasks × 4 rollouts");

    // The saved policy differs from the starting weights: training changed them.
    let start = trinity_model::load_model(&tiny_model_dir(), tch::Kind::Float, tch::Device::Cpu).unwrap();
    let trained = trinity_model::load_model(&checkpoint.join("hf"), tch::Kind::Float, tch::Device::Cpu).unwrap();
    let (a, b) = (start.decoder.named_parameters().unwrap(), trained.decoder.named_parameters().unwrap());
    let moved: f64 =
        a.iter().zip(&b).map(|((_, x), (_, y))| (x - y).abs().sum(tch::Kind::Double).double_value(&[])).sum();
    assert!(moved > 0.0, "weights did not change");

    // Same command with more steps: resumes from step 2 and continues at step 3.
    let second = config(dir.path(), &["buffer.total_steps=3".to_owned()]);
    let summary = trinity_rft::run(&second, &trinity_rft::job_dir(&second)).unwrap();
    assert_eq!(summary.resumed_from, Some(2));
    assert_eq!(summary.train_steps, 3);
    let steps: Vec<u64> = metrics(&job).iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![0, 1, 2, 3], "no step-0 eval on resume; step numbers continue");
    assert!(job.join("global_step_3/meta.json").exists());
}

#[test]
fn interval_two_offset_one_runs_off_policy() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = ["synchronizer.sync_interval=2", "synchronizer.sync_offset=1", "explorer.eval_on_startup=false"];
    let config = config(dir.path(), &overrides.map(str::to_owned));
    let summary = trinity_rft::run(&config, &trinity_rft::job_dir(&config)).unwrap();
    assert_eq!(summary.train_steps, 5);
    let experiences = std::fs::read_to_string(summary.job_dir.join("experiences.jsonl")).unwrap();
    let versions: Vec<(u64, u64)> = experiences
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|e| (e["eid"]["batch"].as_u64().unwrap(), e["model_version"].as_u64().unwrap()))
        .collect();
    // E1 E2 E3 T1 T2 sync E4 E5 T3 T4 sync T5: steps 1-3 use the initial weights, 4-5 those after train step 2.
    for (batch, version) in versions {
        let expected = if batch <= 3 { 0 } else { 2 };
        assert_eq!(version, expected, "explore step {batch}");
    }
}

#[test]
fn a_fresh_start_never_mixes_with_an_old_run() {
    let dir = tempfile::tempdir().unwrap();
    let first = config(dir.path(), &["buffer.total_steps=1".to_owned()]);
    let old = trinity_rft::run(&first, &trinity_rft::job_dir(&first)).unwrap().job_dir;
    let fresh = config(dir.path(), &["buffer.total_steps=1".to_owned(), "continue_from_checkpoint=false".to_owned()]);
    let new = trinity_rft::job_dir(&fresh);
    assert_ne!(new, old);
    assert!(new.file_name().unwrap().to_string_lossy().starts_with("run_"), "{}", new.display());
    let summary = trinity_rft::run(&fresh, &new).unwrap();
    assert_eq!(summary.resumed_from, None);
    assert!(new.join("global_step_1/meta.json").exists());
}

#[test]
fn a_resumed_run_measures_kl_against_the_base_model() {
    // fp32 throughout, so that the interrupted and the uninterrupted run compute the same numbers.
    let set = |steps: u64| {
        ["trainer.dtype=float32", "explorer.rollout_model.dtype=float32", "explorer.eval_on_startup=false"]
            .into_iter()
            .map(str::to_owned)
            .chain([format!("buffer.total_steps={steps}")])
            .collect::<Vec<_>>()
    };
    let kl_at = |job: &Path, step: u64| {
        let line = metrics(job).into_iter().find(|l| l["step"].as_u64() == Some(step)).unwrap();
        line["train/kl_loss"].as_f64().unwrap_or_else(|| panic!("no train/kl_loss at step {step}: {line}"))
    };

    let whole = tempfile::tempdir().unwrap();
    let config = config(whole.path(), &set(3));
    let uninterrupted = trinity_rft::run(&config, &trinity_rft::job_dir(&config)).unwrap().job_dir;

    let split = tempfile::tempdir().unwrap();
    let first = self::config(split.path(), &set(2));
    trinity_rft::run(&first, &trinity_rft::job_dir(&first)).unwrap();
    let second = self::config(split.path(), &set(3));
    let summary = trinity_rft::run(&second, &trinity_rft::job_dir(&second)).unwrap();
    assert_eq!(summary.resumed_from, Some(2));

    // After two steps at lr 1e-3 the policy has left the base model, so step 3's KL is clearly positive; a
    // reference rebuilt from the step-2 checkpoint would be the policy itself and give 0.
    let expected = kl_at(&uninterrupted, 3);
    let resumed = kl_at(&summary.job_dir, 3);
    assert!(expected > 1e-6, "the uninterrupted run's step-3 KL is {expected}");
    assert!((resumed - expected).abs() <= 1e-3 * expected, "resumed KL {resumed}, uninterrupted {expected}");
}

/// Writes `rows` chat rows (`{"messages": [user, assistant]}`) to `dir/sft.jsonl`.
fn sft_dataset(dir: &Path, rows: usize) -> PathBuf {
    let path = dir.join("sft.jsonl");
    let text: String = (0..rows)
        .map(|i| {
            let messages = serde_json::json!([
                {"role": "user", "content": format!("ab{i}")},
                {"role": "assistant", "content": format!("{i}")},
            ]);
            format!("{}\n", serde_json::json!({ "messages": messages }))
        })
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn mix_trains_expert_rows_beside_the_rollouts() {
    let dir = tempfile::tempdir().unwrap();
    let sft = sft_dataset(dir.path(), 3);
    // 2 tasks × 4 rollouts are the usual rows; ceil(0.2 · 10) = 2 expert rows per step, so three SFT rows over
    // two passes feed three steps and the run stops there although the taskset has five.
    let overrides = [
        "algorithm.algorithm_type=mix".to_owned(),
        "algorithm.sample_strategy_args.expert_data_ratio=0.2".to_owned(),
        "buffer.train_batch_size=10".to_owned(),
        "buffer.trainer_input.auxiliary_buffers.sft_dataset.storage_type=file".to_owned(),
        format!("buffer.trainer_input.auxiliary_buffers.sft_dataset.path={}", sft.display()),
        "buffer.trainer_input.auxiliary_buffers.sft_dataset.total_epochs=2".to_owned(),
        "buffer.trainer_input.auxiliary_buffers.sft_dataset.format.messages_key=messages".to_owned(),
        "explorer.eval_on_startup=false".to_owned(),
    ];
    let config = config(dir.path(), &overrides);
    let summary = trinity_rft::run(&config, &trinity_rft::job_dir(&config)).unwrap();
    assert_eq!(summary.train_steps, 3, "the expert rows run out after three steps");
    let lines = metrics(&summary.job_dir);
    let step = lines.iter().find(|l| l["step"] == 1).unwrap();
    let sft_loss = step["train/expert/sft_loss"].as_f64().unwrap_or_else(|| panic!("no expert SFT loss: {step}"));
    assert!(sft_loss > 0.0, "the expert rows' SFT loss is {sft_loss}");
    assert!(step["train/usual/pg_loss"].is_number(), "no usual PPO loss: {step}");
    assert_eq!(step["train/perf/rows"], 10.0, "8 rollouts and 2 expert rows: {step}");
}

#[test]
fn replay_draws_earlier_steps_again_by_priority() {
    let dir = tempfile::tempdir().unwrap();
    // Cooldown 0 brings every read step back at once; noise far larger than the version gap lets earlier steps
    // outrank the fresh one (seeded, so the run repeats).
    let replay = "buffer.trainer_input.experience_buffer.replay_buffer";
    let overrides = [
        format!("{replay}.enable=true"),
        format!("{replay}.priority_fn=decay_limit_randomization"),
        format!("{replay}.reuse_cooldown_time=0"),
        format!("{replay}.priority_fn_args.sigma=50"),
        "explorer.eval_on_startup=false".to_owned(),
    ];
    let config = config(dir.path(), &overrides);
    let summary = trinity_rft::run(&config, &trinity_rft::job_dir(&config)).unwrap();
    assert_eq!(summary.train_steps, 5);
    let lines: Vec<_> = metrics(&summary.job_dir).into_iter().filter(|l| l["step"].as_u64() > Some(0)).collect();
    let reused: f64 = lines.iter().map(|l| l["replay/reused_experiences"].as_f64().unwrap()).sum();
    assert!(reused > 0.0, "no step trained on an earlier step's experiences: {lines:?}");
    assert!(lines.iter().all(|l| l["train/perf/rows"] == 8.0), "every step trains a full batch: {lines:?}");
}

#[test]
fn prompts_over_the_limit_become_masked_placeholders_or_without_truncation_are_sampled_whole() {
    let dir = tempfile::tempdir().unwrap();
    // Prompts of the toy taskset render to about 20 tokens; a limit of 6 puts every one over it.
    let set = |truncate: bool| {
        ["model.max_prompt_tokens=6", "explorer.eval_on_startup=false", "buffer.total_steps=1"]
            .into_iter()
            .map(str::to_owned)
            .chain([format!("model.enable_prompt_truncation={truncate}")])
            .collect::<Vec<_>>()
    };
    let config = config(dir.path(), &set(true));
    let summary = trinity_rft::run(&config, &trinity_rft::job_dir(&config)).unwrap();
    let experiences = std::fs::read_to_string(summary.job_dir.join("experiences.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = experiences.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 8, "two tasks × four placeholders");
    for row in &rows {
        assert_eq!(row["truncate_status"], "prompt_truncated", "{row}");
        assert_eq!(row["reward"], 0.0, "{row}");
        assert_eq!(row["action_mask"], serde_json::json!([false]), "{row}");
        assert!(row["tokens"].as_array().unwrap().len() <= 6, "{row}");
    }

    // Without truncation Trinity-RFT hands vLLM the whole prompt, which runs while it fits in max_model_len.
    let whole = tempfile::tempdir().unwrap();
    let config = self::config(whole.path(), &set(false));
    let summary = trinity_rft::run(&config, &trinity_rft::job_dir(&config)).unwrap();
    let experiences = std::fs::read_to_string(summary.job_dir.join("experiences.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = experiences.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 8, "two tasks × four samples");
    for row in &rows {
        assert!(row["truncate_status"] != "prompt_truncated", "{row}");
        assert!(row["prompt_length"].as_u64().unwrap() > 6, "the whole prompt was sampled: {row}");
    }
}

#[test]
fn staleness_control_drops_experiences_older_than_max_staleness() {
    let dir = tempfile::tempdir().unwrap();
    // Interval 2, offset 1: explore steps 1-3 sample with version 0 and 4-5 with version 2 (see the test above).
    // Train step s keeps versions ≥ s − 2: steps 3 and 5 find only older experiences and train nothing.
    let overrides = [
        "synchronizer.sync_interval=2",
        "synchronizer.sync_offset=1",
        "explorer.eval_on_startup=false",
        "algorithm.sample_strategy=staleness_control",
        "algorithm.sample_strategy_args.max_staleness=2",
    ];
    let config = config(dir.path(), &overrides.map(str::to_owned));
    let summary = trinity_rft::run(&config, &trinity_rft::job_dir(&config)).unwrap();
    let lines = metrics(&summary.job_dir);
    let dropped: Vec<f64> = lines.iter().map(|l| l["buffer/stale_dropped"].as_f64().unwrap()).collect();
    assert_eq!(dropped, vec![0.0, 0.0, 8.0, 0.0, 8.0]);
    let trained: Vec<bool> = lines.iter().map(|l| l.get("train/loss").is_some()).collect();
    assert_eq!(trained, vec![true, true, false, true, false]);
}

/// Logprobs of an experience's response tokens under `model` (temperature 1, the rollouts' default).
fn response_logprobs(model: &trinity_model::Decoder, row: &serde_json::Value) -> Vec<f32> {
    let tokens: Vec<i64> = row["tokens"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect();
    let prompt = row["prompt_length"].as_u64().unwrap() as i64;
    let n = tokens.len() as i64;
    let ids = tch::Tensor::from_slice(&tokens).view([1, n]);
    let lp = tch::no_grad(|| {
        let h = model.forward_hidden(&ids, None).unwrap();
        model.token_logprobs(&h.narrow(1, 0, n - 1), &ids.narrow(1, 1, n - 1), 1.0, 256).unwrap()
    });
    Vec::<f32>::try_from(lp.view([-1]).narrow(0, prompt - 1, n - prompt)).unwrap()
}

#[test]
fn lora_trains_adapters_the_engine_generates_with_them_merged_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let lora = |steps: u32| {
        config(
            dir.path(),
            &[
                format!("buffer.total_steps={steps}"),
                "trainer.save_interval=1".to_owned(),
                "model.lora_configs=[{lora_rank: 4, lora_alpha: 8, target_modules: all-linear}]".to_owned(),
                // fp32 on every CPU: where the CPU has AVX512-BF16 the defaults train and sample in bf16, and the
                // frozen base is then held (and merged into hf/) in bf16, which the exact checks below would not
                // allow.
                "trainer.dtype=float32".to_owned(),
                "explorer.rollout_model.dtype=float32".to_owned(),
            ],
        )
    };
    let first = lora(3);
    let summary = trinity_rft::run(&first, &trinity_rft::job_dir(&first)).unwrap();
    assert_eq!(summary.train_steps, 3);
    let job = summary.job_dir;
    let adapter = |step: u32| job.join(format!("global_step_{step}/lora_adapter"));
    for step in [1, 2, 3] {
        assert!(adapter(step).join("adapter_config.json").exists());
        assert!(adapter(step).join("adapter_model.safetensors").exists());
    }
    // The optimizer holds state for the adapters alone: the base weights were frozen.
    let state =
        trinity_model::SafetensorsWeights::open_files(&[job.join("global_step_3/trainer/optimizer.safetensors")])
            .unwrap();
    let names = state.names();
    assert!(names.iter().any(|n| n.contains("lora_A")), "{names:?}");
    assert!(names.iter().all(|n| n.contains(".lora_") || n == "step"), "{names:?}");

    let load = |path: &Path| trinity_model::load_model(path, tch::Kind::Float, tch::Device::Cpu).unwrap().decoder;
    let base = load(&tiny_model_dir());
    let mut adapted = load(&tiny_model_dir());
    adapted.load_lora(&adapter(2)).unwrap();
    let b_moved: f64 = adapted
        .lora_parameters()
        .iter()
        .filter(|(n, _)| n.contains("lora_B"))
        .map(|(_, t)| t.abs().sum(tch::Kind::Double).double_value(&[]))
        .sum();
    assert!(b_moved > 0.0, "training left every lora_B at zero");
    // `hf/` is the base with the adapter merged in: the base itself did not move.
    let merged = load(&job.join("global_step_2/hf"));
    let (want, got) = (adapted.merged_parameters().unwrap(), merged.named_parameters().unwrap());
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        let diff = (w - g).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{name}: hf/ differs from base + adapter by {diff}");
    }

    // Step 3 explored with the weights train step 2 published (memory sync): its logprobs are the base + step-2
    // adapter's, not the base model's.
    let text = std::fs::read_to_string(job.join("experiences.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let step_three: Vec<&serde_json::Value> = rows.iter().filter(|r| r["model_version"] == 2).collect();
    assert!(!step_three.is_empty());
    let (mut with_adapter, mut without) = (0f64, 0f64);
    for row in step_three {
        let recorded: Vec<f32> =
            row["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let diff = |model: &trinity_model::Decoder| {
            let lp = response_logprobs(model, row);
            lp.iter().zip(&recorded).map(|(a, b)| f64::from((a - b).abs())).fold(0.0, f64::max)
        };
        with_adapter = with_adapter.max(diff(&adapted));
        without = without.max(diff(&base));
    }
    assert!(with_adapter < 1e-3, "the engine did not sample with the merged weights (max diff {with_adapter})");
    assert!(without > 10.0 * with_adapter.max(1e-5), "the adapter did not change the sampling model ({without})");

    // Resuming continues from the checkpoint's adapter.
    let second = lora(4);
    let summary = trinity_rft::run(&second, &trinity_rft::job_dir(&second)).unwrap();
    assert_eq!(summary.resumed_from, Some(3));
    assert!(adapter(4).join("adapter_model.safetensors").exists());
}
