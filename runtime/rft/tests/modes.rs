//! Modes `train` (SFT, DPO, and RL from a buffer an explorer fills), `explore` and `bench` on the tiny model.
//! The two-process runs of modes `explore` + `train`, with kill -9, are in the CLI's integration tests; here the
//! pair runs on two threads, which checks the protocol between them without process start-up costs.

use std::path::{Path, PathBuf};

use trinity_algorithm::BuiltinCatalog;
use trinity_config::{Config, LoadOptions};

fn tiny_model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied")
}

fn load(dir: &Path, text: &str) -> Config {
    let env = |_: &str| None;
    let options = LoadOptions { overrides: &[], env: &env, catalog: &BuiltinCatalog, cwd: dir };
    trinity_config::load_str(text, &dir.join("config.yaml"), options).unwrap_or_else(|e| panic!("{e}")).config
}

fn metrics(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn value(row: &serde_json::Value, key: &str) -> f64 {
    row[key].as_f64().unwrap_or_else(|| panic!("no {key} in {row}"))
}

/// A mode-train config over `data.jsonl` for `algorithm`, `steps` steps of `batch` rows.
fn dataset_config(dir: &Path, algorithm: &str, format: &str, batch: u32, steps: u32) -> Config {
    let lr = if algorithm == "sft" { "1e-2" } else { "2e-3" };
    load(
        dir,
        &format!(
            "project: t
name: {algorithm}
mode: train
checkpoint_root_dir: {root}
algorithm:
  algorithm_type: {algorithm}
  optimizer:
    lr: {lr}
model:
  model_path: {model}
  max_model_len: 48
buffer:
  train_batch_size: {batch}
  trainer_input:
    experience_buffer:
      name: data
      storage_type: file
      path: {root}/data.jsonl
      format:
{format}
trainer:
  total_steps: {steps}
  save_interval: 3
monitor:
  monitor_type: jsonl
",
            root = dir.display(),
            model = tiny_model_dir().display()
        ),
    )
}

#[test]
fn sft_loss_falls_on_a_small_dataset_and_a_resumed_run_continues_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..4)
        .map(|i| {
            format!(
                "{{\"messages\": [{{\"role\": \"user\", \"content\": \"ab{i}\"}}, {{\"role\": \"assistant\", \"content\": \"{i}{i}\"}}]}}\n"
            )
        })
        .collect();
    std::fs::write(dir.path().join("data.jsonl"), rows).unwrap();
    let format = "        prompt_type: messages\n        messages_key: messages";
    let config = dataset_config(dir.path(), "sft", format, 4, 6);
    let summary = trinity_rft::run(&config, &trinity_rft::job_dir(&config)).unwrap();
    assert_eq!(summary.train_steps, 6);
    let job = summary.job_dir;
    let lines = metrics(&job.join("monitor/trainer/metrics.jsonl"));
    assert_eq!(lines.len(), 6);
    let (first, last) = (value(&lines[0], "train/loss"), value(&lines[5], "train/loss"));
    assert!(last < 0.7 * first, "SFT loss {first} → {last}");
    assert!(job.join("global_step_6/hf/model.safetensors").exists());
    // Six steps of four rows over a four-row dataset: 24 rows served, saved with the checkpoint.
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(job.join("global_step_6/meta.json")).unwrap()).unwrap();
    assert_eq!(meta["dataset_rows"], 24);

    // Two more steps: the same command with a higher total resumes from step 6.
    let more = dataset_config(dir.path(), "sft", format, 4, 8);
    let summary = trinity_rft::run(&more, &job).unwrap();
    assert_eq!((summary.resumed_from, summary.train_steps), (Some(6), 8));
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(job.join("global_step_8/meta.json")).unwrap()).unwrap();
    assert_eq!(meta["dataset_rows"], 32);
}

#[test]
fn dpo_loss_starts_at_ln2_and_falls() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String =
        (0..4).map(|i| format!("{{\"prompt\": \"ab{i}\", \"chosen\": \"{i}\", \"rejected\": \"ba\"}}\n")).collect();
    std::fs::write(dir.path().join("data.jsonl"), rows).unwrap();
    let format = "        prompt_type: plaintext\n        prompt_key: prompt\n        chosen_key: chosen\n        rejected_key: rejected";
    let config = dataset_config(dir.path(), "dpo", format, 2, 6);
    let summary = trinity_rft::run(&config, &trinity_rft::job_dir(&config)).unwrap();
    let lines = metrics(&summary.job_dir.join("monitor/trainer/metrics.jsonl"));
    assert_eq!(lines.len(), 6);
    // The policy starts as its own reference: every pair's margin is 0, so the loss is ln 2.
    let first = value(&lines[0], "train/dpo_loss");
    assert!((first - std::f64::consts::LN_2).abs() < 1e-3, "first DPO loss {first}");
    let last = value(&lines[5], "train/dpo_loss");
    assert!(last < first - 0.05, "DPO loss {first} → {last}");
    assert!(value(&lines[5], "train/accuracy_mean") > 0.5, "{}", lines[5]);
}

/// A GRPO config over ten addition tasks for modes `both`, `explore`, `train` and `bench`.
fn rl_config(dir: &Path, mode: &str, extra: &str) -> Config {
    let rows: String = (0..10).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.join("train.jsonl"), &rows).unwrap();
    let eval: String = rows.lines().take(2).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("eval.jsonl"), eval).unwrap();
    load(
        dir,
        &format!(
            "project: t
name: rl
mode: {mode}
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
  train_batch_size: 8
  explorer_input:
    taskset:
      name: toy
      path: {root}/train.jsonl
    eval_tasksets:
      - name: toy-eval
        path: {root}/eval.jsonl
    default_workflow_type: simple_workflow
    default_reward_fn_type: math_reward
  trainer_input:
    experience_buffer:
      name: exp
      storage_type: queue
      path: sqlite:///exp.db
explorer:
  eval_interval: 100
  eval_on_startup: false
  runner_per_model: 4
monitor:
  monitor_type: jsonl
{extra}",
            root = dir.display(),
            model = tiny_model_dir().display()
        ),
    )
}

#[test]
fn an_explorer_and_a_trainer_on_two_threads_share_the_buffer_and_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    // Five explore steps of 8 experiences, sync every 2 steps, one step of offset: the explorer runs ahead.
    let sync = "synchronizer:\n  sync_method: checkpoint\n  sync_interval: 2\n  sync_offset: 1\n  sync_timeout: 120\n";
    let trainer = rl_config(dir.path(), "train", &format!("{sync}trainer:\n  save_interval: 2\n"));
    let explorer = rl_config(dir.path(), "explore", sync);
    let job = trinity_rft::job_dir(&trainer);
    let trainer_job = job.clone();
    let trained = std::thread::spawn(move || trinity_rft::run(&trainer, &trainer_job));
    trinity_rft::run(&explorer, &job).unwrap();
    let summary = trained.join().unwrap().unwrap();
    assert_eq!(summary.train_steps, 5, "every explored experience is trained: 5 steps of 8");

    let db = rusqlite::Connection::open(job.join("buffer/exp.db")).unwrap();
    let count = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM explore_steps WHERE producer = 'explorer'"), 5);
    assert_eq!(count("SELECT COUNT(*) FROM experiences WHERE consumed = 1"), 40);
    assert_eq!(count("SELECT COUNT(DISTINCT train_step) FROM experiences"), 5);
    // The explorer sampled step 4 and later with the trainer's weights of step 2 (sync after step 2, offset 1).
    let versions: Vec<(i64, i64)> = {
        let mut q = db
            .prepare("SELECT s.step, MIN(e.model_version) FROM explore_steps s JOIN experiences e ON e.uid LIKE s.step || '/%' GROUP BY s.step ORDER BY s.step")
            .unwrap();
        q.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
    };
    assert_eq!(versions[0], (1, 0));
    assert!(versions[3].1 >= 2, "explore step 4 after the sync of train step 2: {versions:?}");
    let explorer_metrics = metrics(&job.join("monitor/explorer/metrics.jsonl"));
    assert_eq!(explorer_metrics.len(), 5);
    let trainer_metrics = metrics(&job.join("monitor/trainer/metrics.jsonl"));
    assert_eq!(trainer_metrics.iter().map(|l| l["step"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    assert!(job.join("sync/trainer_finished.json").exists());
    assert!(job.join("global_step_5/hf/model.safetensors").exists());
}

#[test]
fn bench_evaluates_the_base_model_and_three_checkpoints_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let mut both = rl_config(dir.path(), "both", "");
    both.buffer.total_steps = Some(3);
    both.trainer.save_interval = 1;
    let job = trinity_rft::job_dir(&both);
    trinity_rft::run(&both, &job).unwrap();

    let mut bench = rl_config(dir.path(), "bench", "");
    bench.explorer.eval_on_startup = true;
    trinity_rft::run(&bench, &job).unwrap();
    let lines = metrics(&job.join("monitor/bench/metrics.jsonl"));
    assert_eq!(lines.iter().map(|l| l["step"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(lines.iter().all(|l| l["bench/toy-eval/accuracy"].is_number()), "{lines:?}");

    // Again: nothing new. With one step forgotten (a bench killed before it), only that one.
    trinity_rft::run(&bench, &job).unwrap();
    assert_eq!(metrics(&job.join("monitor/bench/metrics.jsonl")).len(), 4);
    std::fs::write(job.join("bench_meta.json"), r#"{"evaluated": [0, 1, 3]}"#).unwrap();
    trinity_rft::run(&bench, &job).unwrap();
    let lines = metrics(&job.join("monitor/bench/metrics.jsonl"));
    assert_eq!(lines.last().unwrap()["step"], 2);
    assert_eq!(lines.len(), 5);

    // Only the latest, on a fresh record.
    std::fs::remove_file(job.join("bench_meta.json")).unwrap();
    bench.explorer.eval_on_startup = false;
    bench.explorer.bench_on_latest_checkpoint = true;
    trinity_rft::run(&bench, &job).unwrap();
    let lines = metrics(&job.join("monitor/bench/metrics.jsonl"));
    assert_eq!(lines.len(), 6);
    assert_eq!(lines.last().unwrap()["step"], 3);
}

#[test]
fn stages_run_in_order_from_the_previous_stage_and_resume_in_the_interrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let sft: String = (0..4)
        .map(|i| {
            format!(
                "{{\"messages\": [{{\"role\": \"user\", \"content\": \"ab{i}\"}}, {{\"role\": \"assistant\", \"content\": \"{i}\"}}]}}\n"
            )
        })
        .collect();
    std::fs::write(root.join("sft.jsonl"), sft).unwrap();
    let tasks: String = (0..10).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(root.join("train.jsonl"), tasks).unwrap();
    let text = format!(
        "project: t
name: staged
checkpoint_root_dir: {root}
algorithm:
  algorithm_type: grpo
  repeat_times: 2
model:
  model_path: {model}
  max_model_len: 48
  max_response_tokens: 6
buffer:
  batch_size: 2
  total_steps: 2
  explorer_input:
    taskset:
      path: {root}/train.jsonl
    default_workflow_type: simple_workflow
    default_reward_fn_type: math_reward
trainer:
  save_interval: 1
monitor:
  monitor_type: jsonl
stages:
  - stage_name: sft_warmup
    mode: train
    algorithm:
      algorithm_type: sft
      optimizer:
        lr: 1e-2
    buffer:
      train_batch_size: 4
      total_steps: 2
      trainer_input:
        experience_buffer:
          name: sft
          storage_type: file
          path: {root}/sft.jsonl
          format:
            prompt_type: messages
            messages_key: messages
  - stage_name: rft
",
        root = root.display(),
        model = tiny_model_dir().display()
    );
    let env = |_: &str| None;
    let options = LoadOptions { overrides: &[], env: &env, catalog: &BuiltinCatalog, cwd: root };
    let loaded = trinity_config::load_str(&text, &root.join("config.yaml"), options).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.stages.len(), 2);
    let job = trinity_rft::job_dir(&loaded.config);
    let summaries = trinity_rft::run_stages(&loaded, &job, &BuiltinCatalog).unwrap();
    assert_eq!(summaries.iter().map(|s| s.train_steps).collect::<Vec<_>>(), [2, 2]);
    assert_eq!(std::fs::read_to_string(job.join("stage_meta.json")).unwrap(), r#"{"latest_stage":2}"#);
    assert_eq!(metrics(&job.join("sft_warmup/monitor/trainer/metrics.jsonl")).len(), 2);
    assert!(job.join("rft/global_step_2/hf/model.safetensors").exists());
    // The SFT stage's lr is its own (a stage's section replaces the top level's whole).
    assert_eq!(loaded.stages[0].config.algorithm.optimizer.lr, 1e-2);
    assert_eq!(loaded.stages[1].config.algorithm.optimizer.lr, loaded.config.algorithm.optimizer.lr);

    // Interrupted in the second stage after its first checkpoint: the same command resumes there.
    std::fs::write(job.join("stage_meta.json"), r#"{"latest_stage":1}"#).unwrap();
    std::fs::remove_dir_all(job.join("rft/global_step_2")).unwrap();
    let summaries = trinity_rft::run_stages(&loaded, &job, &BuiltinCatalog).unwrap();
    assert_eq!(summaries.len(), 1, "the SFT stage is not run again");
    assert_eq!((summaries[0].resumed_from, summaries[0].train_steps), (Some(1), 2));
    assert_eq!(metrics(&job.join("sft_warmup/monitor/trainer/metrics.jsonl")).len(), 2);
    // Everything done: nothing runs.
    assert!(trinity_rft::run_stages(&loaded, &job, &BuiltinCatalog).unwrap().is_empty());
}

#[test]
fn a_trainer_behind_the_explorer_skips_experiences_older_than_max_staleness() {
    let dir = tempfile::tempdir().unwrap();
    // The explorer runs alone first (trainer-driven sync never waits): five steps, all sampled with version 0.
    let sync = "synchronizer:\n  sync_method: checkpoint\n  sync_style: trainer_driven\n";
    let explorer = rl_config(dir.path(), "explore", sync);
    let job = trinity_rft::job_dir(&explorer);
    trinity_rft::run(&explorer, &job).unwrap();
    // Then a trainer that accepts experiences at most one version old: step 1 takes 8 of version 0; from step 2
    // on version 0 is too old, so the 32 left are skipped and, every explorer having finished, training ends.
    let mut trainer = rl_config(dir.path(), "train", sync);
    // What `sample_strategy: staleness_control` with `max_staleness: 1` resolves to (the run reads the typed view).
    trainer.algorithm.resolved.sample_strategy =
        trinity_config::algorithm::SampleStrategy::StalenessControl { max_staleness: Some(1) };
    let summary = trinity_rft::run(&trainer, &job).unwrap();
    assert_eq!(summary.train_steps, 1);
    let db = rusqlite::Connection::open(job.join("buffer/exp.db")).unwrap();
    let count = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM experiences WHERE train_step = 1 AND consumed = 1"), 8);
    assert_eq!(count("SELECT COUNT(*) FROM experiences WHERE consumed = 0"), 0, "nothing waits: the rest is stale");
    assert_eq!(count("SELECT COUNT(*) FROM experiences"), 40);
}

/// Checkpoint sync hands the explorer's engine the weights of the published file, not some other copy: the file
/// holds the tiny model with its final norm zeroed, which makes every logit 0, so every token the explorer then
/// samples has log-probability exactly −ln(vocab); the base model's tokens do not.
#[test]
fn the_explorer_generates_with_the_weights_of_the_published_file() {
    let dir = tempfile::tempdir().unwrap();
    let sync = "synchronizer:\n  sync_method: checkpoint\n  sync_style: trainer_driven\n";
    let explorer = rl_config(dir.path(), "explore", sync);
    let job = trinity_rft::job_dir(&explorer);
    let base = trinity_model::load_model(&tiny_model_dir(), tch::Kind::Float, tch::Device::Cpu).unwrap();
    let vocab = base.decoder.config().vocab_size;
    let mut weights = base.decoder.named_parameters().unwrap();
    let ids = tch::Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
    let logits = tch::no_grad(|| base.decoder.forward(&ids, None)).unwrap();
    let spread = logits.max().double_value(&[]) - logits.min().double_value(&[]);
    assert!(spread > 1e-3, "the base model's logits differ from token to token, so its logprobs are not uniform");
    let norm = weights.iter_mut().find(|(name, _)| name == "model.norm.weight").unwrap();
    norm.1 = norm.1.zeros_like();
    std::fs::create_dir_all(job.join("sync")).unwrap();
    trinity_model::write_safetensors(&job.join("sync/weights_1.safetensors"), &weights).unwrap();
    std::fs::write(job.join("sync/latest.json"), r#"{"version": 1, "file": "weights_1.safetensors"}"#).unwrap();

    trinity_rft::run(&explorer, &job).unwrap();
    let store = trinity_buffer::SqliteStore::open(&job.join("buffer/exp.db")).unwrap();
    let experiences: Vec<_> = store.waiting().unwrap().into_iter().map(|(_, e)| e).collect();
    assert_eq!(experiences.len(), 40);
    let uniform = -(vocab as f32).ln();
    let published: Vec<_> = experiences.iter().filter(|e| e.model_version == 1).collect();
    assert!(published.len() >= 32, "{} of 40 experiences sampled with the published version", published.len());
    for experience in published {
        assert!(!experience.logprobs.is_empty());
        for &logprob in &experience.logprobs {
            assert!((logprob - uniform).abs() < 1e-4, "logprob {logprob}, uniform {uniform}: not the file's weights");
        }
    }
}
