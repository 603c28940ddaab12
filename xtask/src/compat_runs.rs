//! `cargo xtask compat-runs`: Trinity-RFT's own example configs (the copies under
//! `tests/fixtures/trinity-rft-0.5.2/examples/`), each run for a few steps on SmolLM2-135M-Instruct with the release
//! binary, and a table of what every run did: wall time, rollout reward per step, the last train loss, rows trained
//! a step and the last held-out accuracy.
//!
//! The configs are used as shipped. Only `--set` and their own `${oc.env:...}` variables change them: the model
//! path (SmolLM2 for the policy and for every teacher or judge), the data paths (local JSONL files this command
//! writes, with the fields each config names), the step count, and, because this is a CPU command, the batch:
//! `--batch` tasks a step instead of Trinity's 32–96 and `--max-response-tokens` instead of 1024–10240. A shipped
//! step is 96 tasks × 8 rollouts × up to 1024 tokens, hours of CPU time a step on two cores; the groups
//! (`repeat_times`), algorithms, losses, rewards, workflows and every other key stay as shipped. Configs whose
//! `train_batch_size` is tied to the batch (`mix_math`, `rubric`, the trainable RULER) get the value that keeps the
//! shipped ratio.
//! `--max-response-tokens` caps the judges' replies too (RULER ships 12288, the rubric judge 1024): a 135M judge
//! rarely writes the score list it is asked for and then generates to its cap, so an uncapped judge turns one step
//! into hours on two cores. It is the same CPU concession as the policy's cap; the judge's prompt limits stay.
//!
//! The integration tests (`tests/it/compat_runs.rs`) run most of these on a tiny random model in seconds; this
//! command is the same with a real model, to see the configs learn, fail or slow down on real text.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::setup::Deps;
use crate::{cargo, target_dir};

/// The data a config's taskset reads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Data {
    /// GSM8K-style word problems: `question` / `problem` and an `answer` ending in `#### n`.
    Gsm8k,
    /// Countdown: `question` and the JSON `answer` with `target` and `numbers`.
    Countdown,
}

/// One shipped config and what it needs beyond the common overrides.
struct Example {
    path: &'static str,
    data: Data,
    /// Extra `--set` overrides; `MODEL` stands for the SmolLM2 file, `TASKS` for the taskset file, `TOKENS` for
    /// `--max-response-tokens`, `MIX`, `GROUPED` and `JUDGED` for train batch sizes derived from `--batch`.
    extra: &'static [&'static str],
}

/// The configs issues 14, 16 and 47 name: the group algorithms on GSM8K, PPO with its critic and replay on
/// Countdown, mix with its SFT set, on-policy distillation from a teacher, judged rewards (RULER, rubrics),
/// RM-Gallery's math check and the entropy-clipping advantages.
const EXAMPLES: &[Example] = &[
    Example { path: "grpo_gsm8k/gsm8k.yaml", data: Data::Gsm8k, extra: &[] },
    Example { path: "ppo_countdown/countdown.yaml", data: Data::Countdown, extra: &[] },
    Example { path: "ppo_countdown_exp_replay/countdown.yaml", data: Data::Countdown, extra: &[] },
    Example { path: "asymre_gsm8k/gsm8k.yaml", data: Data::Gsm8k, extra: &[] },
    Example { path: "cispo_gsm8k/gsm8k.yaml", data: Data::Gsm8k, extra: &[] },
    Example { path: "topr_gsm8k/gsm8k.yaml", data: Data::Gsm8k, extra: &[] },
    Example { path: "sppo_gsm8k/gsm8k.yaml", data: Data::Gsm8k, extra: &[] },
    Example { path: "rec_gsm8k/gsm8k.yaml", data: Data::Gsm8k, extra: &[] },
    Example { path: "opmd_gsm8k/opmd_gsm8k.yaml", data: Data::Gsm8k, extra: &[] },
    // Shipped: 32 tasks × 8 rollouts usual + 64 expert rows = 320 a train step, expert ratio 0.2.
    Example { path: "mix_math/mix_math.yaml", data: Data::Gsm8k, extra: &["buffer.train_batch_size=MIX"] },
    Example { path: "opd_gsm8k/opd_gsm8k.yaml", data: Data::Gsm8k, extra: &[] },
    Example { path: "opd_gsm8k/opd_gsm8k_jsd.yaml", data: Data::Gsm8k, extra: &[] },
    Example {
        path: "grpo_gsm8k_ruler/gsm8k_ruler.yaml",
        data: Data::Gsm8k,
        extra: &[
            "explorer.auxiliary_models[0].model_path=MODEL",
            "explorer.auxiliary_models[0].max_response_tokens=TOKENS",
        ],
    },
    // The policy judges its own group (issue 47). Shipped: 96 tasks × 8 rollouts = 768 a step and 960 a train step,
    // the judgements of a fifth of the groups on top, read in arrival order; the same 5:4 ratio to the batch here.
    // It ships max_model_len 16000, and a CPU's KV-cache budget (a quarter of the free memory) holds fewer than the
    // 8 sequences of a group at that length; 4096 holds the judge's prompt of 8 short answers.
    Example {
        path: "grpo_gsm8k_trainable_ruler/gsm8k_ruler.yaml",
        data: Data::Gsm8k,
        extra: &["buffer.train_batch_size=JUDGED", "model.max_model_len=4096", "model.max_prompt_tokens=3072"],
    },
    // RM-Gallery's rule-based math_verify_reward through math_rm_workflow (the answer is `gt_answer`).
    Example { path: "grpo_math/math.yaml", data: Data::Gsm8k, extra: &[] },
    // Clip_B / Clip_V (issue 47): the four eval tasksets (Hugging Face ids and a placeholder path as shipped) read the
    // local file, once per task instead of 32 times.
    Example { path: "entropy/clipb.yaml", data: Data::Gsm8k, extra: ENTROPY_EVALS },
    Example { path: "entropy/clipv.yaml", data: Data::Gsm8k, extra: ENTROPY_EVALS },
    Example {
        path: "grpo_rubric_as_reward/rubric.yaml",
        data: Data::Gsm8k,
        extra: &[
            "explorer.auxiliary_models[0].model_path=MODEL",
            "explorer.auxiliary_models[0].max_response_tokens=TOKENS",
            "buffer.train_batch_size=GROUPED",
        ],
    },
];

/// The entropy examples' eval tasksets on the local data (`TASKS`), one rollout a task.
const ENTROPY_EVALS: &[&str] = &[
    "buffer.explorer_input.eval_tasksets[0].path=TASKS",
    "buffer.explorer_input.eval_tasksets[0].repeat_times=1",
    "buffer.explorer_input.eval_tasksets[1].path=TASKS",
    "buffer.explorer_input.eval_tasksets[1].repeat_times=1",
    "buffer.explorer_input.eval_tasksets[2].path=TASKS",
    "buffer.explorer_input.eval_tasksets[2].repeat_times=1",
    "buffer.explorer_input.eval_tasksets[3].path=TASKS",
    "buffer.explorer_input.eval_tasksets[3].repeat_times=1",
];

pub(crate) struct Options {
    pub(crate) steps: usize,
    pub(crate) batch: usize,
    pub(crate) max_response_tokens: usize,
    /// Substrings of config paths to run (all when empty).
    pub(crate) only: Vec<String>,
}

pub(crate) fn run(root: &Path, deps: &Deps, options: &Options) -> Result<()> {
    cargo(root, deps, "release build", &["build", "--release", "--locked", "--bin", "trinity"])?;
    let trinity = target_dir(root).join("release").join("trinity");
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let work = target_dir(root).join("compat-runs").join(stamp.to_string());
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    // The configs read their train and eval tasksets from the same variable and evaluate at the start and at the
    // last step: few rows keep each evaluation short, while every explore step still gets fresh tasks.
    let rows = (options.steps * options.batch).max(16) as u32;
    let data = DataFiles::write(&work, rows)?;
    let chosen: Vec<&Example> = EXAMPLES
        .iter()
        .filter(|e| options.only.is_empty() || options.only.iter().any(|o| e.path.contains(o.as_str())))
        .collect();
    if chosen.is_empty() {
        bail!("--only matches none of: {}", EXAMPLES.iter().map(|e| e.path).collect::<Vec<_>>().join(", "));
    }
    let mut outcomes = Vec::new();
    for example in chosen {
        eprintln!("xtask: compat-runs: {}", example.path);
        let outcome = run_one(root, &trinity, deps, &work, &data, example, options)?;
        if let Some(error) = &outcome.error {
            eprintln!("xtask: compat-runs: {} failed: {error}", example.path);
        }
        outcomes.push(outcome);
    }
    print_table(&outcomes, options);
    println!("runs (metrics and logs; checkpoints removed): {}", work.display());
    let failed: Vec<&str> = outcomes.iter().filter(|o| o.error.is_some()).map(|o| o.path).collect();
    if !failed.is_empty() {
        bail!("{} of {} configs failed: {}", failed.len(), outcomes.len(), failed.join(", "));
    }
    Ok(())
}

/// The local datasets every run reads.
struct DataFiles {
    gsm8k: PathBuf,
    countdown: PathBuf,
    sft: PathBuf,
}

impl DataFiles {
    fn write(dir: &Path, rows: u32) -> Result<DataFiles> {
        let files = DataFiles {
            gsm8k: dir.join("gsm8k.jsonl"),
            countdown: dir.join("countdown.jsonl"),
            sft: dir.join("sft.jsonl"),
        };
        std::fs::write(
            &files.gsm8k,
            jsonl(word_problems(rows).map(|(question, working, answer)| {
                let solution = format!("{working} = {answer}\n#### {answer}");
                serde_json::json!({
                    "question": question, "problem": question, "answer": solution,
                    // The entropy examples' `ground_truth` and grpo_math's `gt_answer`: the bare answer.
                    "ground_truth": answer.to_string(), "gt_answer": answer.to_string(),
                    "reference_answer": format!("{working} = {answer}, so the answer is {answer}."),
                    "rubric": [
                        {"description": format!("The final answer is {answer}."), "weight": 3},
                        {"description": "The working is shown step by step.", "weight": 1},
                    ],
                })
            })),
        )?;
        std::fs::write(&files.sft, jsonl(word_problems(rows).map(|(question, working, answer)| {
            serde_json::json!({"messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": format!("{working} = {answer}. The answer is \\boxed{{{answer}}}.")},
            ]})
        })))?;
        std::fs::write(&files.countdown, jsonl((0..rows).map(|i| {
            let numbers = [2 + i % 7, 3 + i % 5, 10 + i % 11];
            let target = numbers[0] * numbers[1] + numbers[2];
            let question = format!(
                "Using the numbers {numbers:?}, create an equation that equals {target}. You can use basic arithmetic \
                 operations (+, -, *, /) and each number can only be used once."
            );
            let answer = serde_json::json!({"target": target, "numbers": numbers}).to_string();
            serde_json::json!({"question": question, "answer": answer})
        })))?;
        Ok(files)
    }
}

/// `rows` one- or two-step word problems: the question, its working and the answer.
fn word_problems(rows: u32) -> impl Iterator<Item = (String, String, u32)> {
    const NAMES: [&str; 8] = ["Ava", "Ben", "Chloe", "Dan", "Ella", "Finn", "Grace", "Hugo"];
    (0..rows).map(move |i| {
        let name = NAMES[i as usize % NAMES.len()];
        let (a, b) = (12 + (i * 7) % 40, 2 + (i * 3) % 9);
        match i % 4 {
            0 => (
                format!("{name} has {a} apples and buys {b} more. How many apples does {name} have now?"),
                format!("{a} + {b}"),
                a + b,
            ),
            1 => (
                format!("{name} had {a} marbles and gave {b} to a friend. How many marbles are left?"),
                format!("{a} - {b}"),
                a - b,
            ),
            2 => (format!("A box holds {b} pencils. How many pencils are in {a} boxes?"), format!("{a} * {b}"), a * b),
            _ => (
                format!("{name} reads {b} pages a day for {a} days, then {b} more pages. How many pages in all?"),
                format!("{a} * {b} + {b}"),
                a * b + b,
            ),
        }
    })
}

fn jsonl(rows: impl Iterator<Item = serde_json::Value>) -> String {
    rows.map(|row| format!("{row}\n")).collect()
}

/// What one run did.
struct Outcome {
    path: &'static str,
    wall_s: f64,
    rewards: Vec<Option<f64>>,
    last_loss: Option<f64>,
    rows: Option<f64>,
    last_accuracy: Option<f64>,
    error: Option<String>,
}

fn run_one(
    root: &Path,
    trinity: &Path,
    deps: &Deps,
    work: &Path,
    data: &DataFiles,
    example: &Example,
    options: &Options,
) -> Result<Outcome> {
    let name = example.path.trim_end_matches(".yaml").replace('/', "-");
    let dir = work.join(&name);
    std::fs::create_dir_all(&dir)?;
    let config = root.join("tests/fixtures/trinity-rft-0.5.2/examples").join(example.path);
    let tasks = if example.data == Data::Countdown { &data.countdown } else { &data.gsm8k };
    let model = deps.smollm2_gguf();
    let batch = options.batch;
    let mut sets = vec![
        format!("buffer.total_steps={}", options.steps),
        format!("buffer.batch_size={batch}"),
        format!("model.max_response_tokens={}", options.max_response_tokens),
        format!("buffer.explorer_input.taskset.path={}", tasks.display()),
    ];
    let repeat = repeat_times(&config)?;
    for extra in example.extra {
        sets.push(
            extra
                .replace("MODEL", &model.display().to_string())
                .replace("TASKS", &tasks.display().to_string())
                .replace("TOKENS", &options.max_response_tokens.to_string())
                // mix: the usual rows plus expert rows at the shipped ratio, 64 / 320 = 0.2 of the train batch.
                .replace("MIX", &((batch * repeat) as f64 / 0.8).ceil().to_string())
                .replace("GROUPED", &(batch * repeat).to_string())
                // trainable RULER: 960 / 768 of the rollouts, as shipped.
                .replace("JUDGED", &(batch * repeat * 5).div_ceil(4).to_string()),
        );
    }
    let log = std::fs::File::create(dir.join("stderr.log"))?;
    let started = Instant::now();
    let status = Command::new(trinity)
        .current_dir(&dir)
        .env("TRINITY_MODEL_PATH", &model)
        .env("TRINITY_TASKSET_PATH", tasks)
        .env("TRINITY_SFT_DATASET_PATH", &data.sft)
        .env("TRINITY_CHECKPOINT_ROOT_DIR", dir.join("checkpoints"))
        .args(["run", "--config"])
        .arg(&config)
        .args(sets.iter().flat_map(|s| ["--set", s.as_str()]))
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .context("cannot start trinity")?;
    let wall_s = started.elapsed().as_secs_f64();
    let mut outcome = Outcome {
        path: example.path,
        wall_s,
        rewards: Vec::new(),
        last_loss: None,
        rows: None,
        last_accuracy: None,
        error: None,
    };
    if !status.success() {
        let text = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
        let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_owned();
        outcome.error = Some(format!("exited with {status}: {last}"));
    }
    match find(&dir.join("checkpoints"), "metrics.jsonl") {
        Some(metrics) => read_metrics(&metrics, &mut outcome)?,
        None if outcome.error.is_none() => outcome.error = Some("no monitor/metrics.jsonl".into()),
        None => {}
    }
    if outcome.error.is_none() && outcome.rewards.len() < options.steps {
        outcome.error = Some(format!("{} explore steps of {}", outcome.rewards.len(), options.steps));
    }
    remove_checkpoints(&dir.join("checkpoints"))?;
    Ok(outcome)
}

/// The config's `algorithm.repeat_times` (the group size), which ties some configs' train batch to the batch. The
/// shipped configs set it once, under `algorithm:`.
fn repeat_times(config: &Path) -> Result<usize> {
    let text = std::fs::read_to_string(config).with_context(|| format!("cannot read {}", config.display()))?;
    let value = text.lines().find_map(|line| line.trim().strip_prefix("repeat_times:")).map(str::trim);
    match value {
        Some(v) => v.parse().with_context(|| format!("{}: repeat_times `{v}`", config.display())),
        None => Ok(1),
    }
}

fn read_metrics(path: &Path, outcome: &mut Outcome) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    for line in text.lines() {
        let row: serde_json::Value = serde_json::from_str(line).with_context(|| format!("{}", path.display()))?;
        let get = |key: &str| row.get(key).and_then(serde_json::Value::as_f64);
        if row.get("rollout/reward_mean").is_some() || row.get("time/explore_s").is_some() {
            outcome.rewards.push(get("rollout/reward_mean"));
        }
        if let Some(loss) = get("train/loss") {
            outcome.last_loss = Some(loss);
            outcome.rows = get("train/perf/rows");
        }
        let accuracy = row.as_object().and_then(|o| {
            o.iter().find(|(k, _)| k.starts_with("eval/") && k.ends_with("/accuracy")).and_then(|(_, v)| v.as_f64())
        });
        if accuracy.is_some() {
            outcome.last_accuracy = accuracy;
        }
    }
    Ok(())
}

fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

/// Checkpoints of SmolLM2 are half a gigabyte each with the optimizer's state; the table needs only the metrics.
fn remove_checkpoints(dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("global_step_")) {
            std::fs::remove_dir_all(&path).with_context(|| format!("cannot remove {}", path.display()))?;
        } else {
            remove_checkpoints(&path)?;
        }
    }
    Ok(())
}

fn print_table(outcomes: &[Outcome], options: &Options) {
    println!(
        "\nTrinity-RFT 0.5.2 example configs on SmolLM2-135M-Instruct: {} steps, {} tasks a step, {} response tokens at \
         most; everything else as shipped",
        options.steps, options.batch, options.max_response_tokens
    );
    let cell = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    println!(
        "{:<42} {:>7} {:<26} {:>10} {:>6} {:>9}  result",
        "config", "wall s", "reward per step", "last loss", "rows", "eval acc"
    );
    for o in outcomes {
        let rewards = o.rewards.iter().map(|r| cell(*r)).collect::<Vec<_>>().join(" ");
        println!(
            "{:<42} {:>7.1} {:<26} {:>10} {:>6} {:>9}  {}",
            o.path,
            o.wall_s,
            rewards,
            cell(o.last_loss),
            o.rows.map_or_else(|| "-".to_owned(), |r| format!("{r}")),
            cell(o.last_accuracy),
            o.error.as_deref().unwrap_or("ok")
        );
    }
}
