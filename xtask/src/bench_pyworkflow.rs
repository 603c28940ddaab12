//! `cargo xtask bench pyworkflow`: what running a workflow in Python costs against the same workflow built in,
//! on the same engine in the same process.
//!
//! One `trinity run` in mode `bench` evaluates the base model on eval tasksets that all read the same addition
//! rows:
//! `native_i` through the built-in `simple_workflow` and `python_i` through `benchwf.SingleTurn`, a Trinity-RFT
//! `Workflow` class written as a user writes one, in a module in the run's directory (by dotted path). Both build
//! `[system?, user]` messages from the taskset's format, sample the group with one call of `n = repeat_times`
//! and score each answer; both sample with the taskset's `rollout_args` (seed 42, `min_tokens = max_tokens`, so
//! every answer has exactly `max_tokens` tokens on both sides and the engine does the same work). Index 0 of
//! each is a warm-up (the Python side starts its workers and imports torch and Trinity-RFT there) and is left
//! out; the tasksets alternate, so a drift in the machine's load reaches both sides alike. The figures are the
//! medians of `time/eval_<taskset>_s` over the timed runs: rollouts per second, and the per-call overhead
//! `(python − native) / calls`, a call being one task's `chat` (one engine request).
//!
//! A last taskset, `ipc`, runs `benchwf.RoundTrips`: before its `chat`, each task times `ROUND_TRIPS` calls of
//! `self.model.model_version`, which trinity answers without the engine, so its mean is the worker's pipe round
//! trip alone (JSON both ways, the protocol loop, the Python wrapper).
//!
//! The bench is a command, not a test: it prints figures and fails only when a run fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

use crate::setup::Deps;
use crate::{step, target_dir};

/// No-op model calls each task of the `ipc` taskset times.
const ROUND_TRIPS: usize = 200;

/// The user's module: a single-turn workflow doing `simple_workflow`'s work, and the same after timed no-op calls.
const MODULE: &str = r#"
import time

from trinity.common.workflows.workflow import Workflow

ROUND_TRIPS = __ROUND_TRIPS__


class SingleTurn(Workflow):
    """simple_workflow's work in Python: [system?, user] messages from the taskset's format, the group from one
    chat call of n samples, a reward of 1 for an answer equal to the row's."""

    can_repeat = True

    def set_repeat_times(self, repeat_times, run_id_base):
        self.repeat_times = repeat_times
        self.run_id_base = run_id_base

    def run(self):
        fmt = self.task.format_args
        row = self.task.raw_task
        messages = []
        if fmt.system_prompt:
            messages.append({"role": "system", "content": fmt.system_prompt})
        messages.append({"role": "user", "content": row[fmt.prompt_key]})
        experiences = self.model.chat(messages, n=self.repeat_times)
        truth = str(row[fmt.response_key]).strip()
        for i, exp in enumerate(experiences):
            exp.reward = float(exp.response_text.strip() == truth)
            exp.eid.run = self.run_id_base + i
        return experiences


class RoundTrips(SingleTurn):
    """SingleTurn after ROUND_TRIPS calls of model_version, which trinity answers without the engine: the mean
    is one round trip of the worker's pipe."""

    def run(self):
        started = time.perf_counter()
        for _ in range(ROUND_TRIPS):
            self.model.model_version
        round_trip = (time.perf_counter() - started) / ROUND_TRIPS
        experiences = super().run()
        for exp in experiences:
            exp.metrics = {"round_trip_us": round_trip * 1e6}
        return experiences
"#;

/// What the bench runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Options {
    /// `model.model_path`: a checkpoint directory or a GGUF file.
    pub(crate) model: PathBuf,
    /// Rows each taskset holds.
    pub(crate) tasks: usize,
    pub(crate) repeat_times: u32,
    /// Tokens of every answer (`max_tokens` and `min_tokens`).
    pub(crate) max_tokens: u32,
    /// Timed runs of each side (after the warm-up).
    pub(crate) runs: usize,
    /// `explorer.runner_per_model`: tasks in flight at once (and Python workers).
    pub(crate) runners: u32,
    /// `model.max_model_len`.
    pub(crate) max_model_len: u32,
}

pub(crate) fn bench(root: &Path, deps: &Deps, trinity: &Path, options: &Options) -> Result<()> {
    if options.tasks == 0 || options.runs == 0 || options.repeat_times == 0 {
        bail!("--tasks, --runs and --repeat-times must be at least 1");
    }
    let python = deps.trinity_rft_python();
    if !python.exists() {
        bail!("{} is missing: run `cargo xtask setup`", python.display());
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let dir = target_dir(root).join("bench-pyworkflow").join(stamp.to_string());
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("tasks.jsonl"), rows(options.tasks))?;
    std::fs::write(dir.join("benchwf.py"), MODULE.replace("__ROUND_TRIPS__", &ROUND_TRIPS.to_string()))?;
    std::fs::write(dir.join("config.yaml"), config(options))?;
    let tasks = options.tasks;
    step("bench pyworkflow: simple_workflow and benchwf.SingleTurn, one process", || {
        let status = Command::new(trinity)
            .current_dir(&dir)
            .env("TRINITY_PYTHON", &python)
            .args(["run", "--config", "config.yaml"])
            .status()
            .context("cannot start trinity")?;
        if !status.success() {
            bail!("trinity run exited with {status}; the run is in {}", dir.display());
        }
        Ok(())
    })?;
    let metrics = dir.join("ckpt/bench/pyworkflow/monitor/bench/metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).with_context(|| format!("cannot read {}", metrics.display()))?;
    let row: Map<String, Value> = serde_json::from_str(text.lines().last().unwrap_or("{}"))?;
    let report = Report::from_metrics(&row, options.runs, tasks, options.repeat_times)?;
    println!(
        "\n{tasks} tasks × {} rollouts of {} tokens, {} runner(s), model {}; medians of {} timed runs each",
        options.repeat_times,
        options.max_tokens,
        options.runners,
        options.model.display(),
        options.runs
    );
    print!("{}", report.table());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// `tasks` addition questions (`question`, `answer`), short enough for the tiny model's 64 positions with 32
/// answer tokens; the same every run.
fn rows(tasks: usize) -> String {
    (0..tasks)
        .map(|i| {
            let (a, b) = (10 + (i * 37) % 90, 10 + (i * 53 + 17) % 90);
            format!("{{\"question\": \"What is {a} + {b}?\", \"answer\": \"{}\"}}\n", a + b)
        })
        .collect()
}

/// The run's config: mode bench over the alternating tasksets, then `ipc`.
fn config(options: &Options) -> String {
    let mut tasksets = String::new();
    let mut taskset = |name: &str, workflow: &str| {
        tasksets.push_str(&format!(
            "      - name: {name}\n        path: tasks.jsonl\n        repeat_times: {}\n        \
             default_workflow_type: {workflow}\n        default_reward_fn_type: accuracy_reward\n        format:\n          \
             prompt_key: question\n          response_key: answer\n        rollout_args:\n          temperature: 1.0\n          \
             seed: 42\n          max_tokens: {t}\n          min_tokens: {t}\n",
            options.repeat_times,
            t = options.max_tokens
        ));
    };
    for run in 0..=options.runs {
        taskset(&format!("native_{run}"), "simple_workflow");
        taskset(&format!("python_{run}"), "benchwf.SingleTurn");
    }
    taskset("ipc", "benchwf.RoundTrips");
    format!(
        "mode: bench\nproject: bench\nname: pyworkflow\ncheckpoint_root_dir: ./ckpt\nmodel:\n  model_path: {}\n  \
         max_model_len: {}\n  max_response_tokens: {}\nbuffer:\n  explorer_input:\n    eval_tasksets:\n{tasksets}\
         explorer:\n  max_retry_times: 0\n  runner_per_model: {}\nmonitor:\n  monitor_type: jsonl\n",
        options.model.display(),
        options.max_model_len,
        options.max_tokens,
        options.runners
    )
}

/// The figures of one bench run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Report {
    /// Median seconds of a taskset through the built-in workflow and through the Python class.
    native_s: f64,
    python_s: f64,
    /// Every timed run's seconds, in order.
    native_runs: Vec<f64>,
    python_runs: Vec<f64>,
    /// Rollouts and model calls of one taskset.
    rollouts: usize,
    calls: usize,
    /// Mean response tokens of the native and the Python side (equal when `min_tokens` held).
    native_tokens: f64,
    python_tokens: f64,
    /// One no-op model call's round trip through the worker, in microseconds.
    round_trip_us: Option<f64>,
}

impl Report {
    /// Reads the bench step's metrics: `time/eval_<taskset>_s`, `bench/<taskset>/...`. A taskset with a failed
    /// task makes the figures meaningless and is an error naming it.
    pub(crate) fn from_metrics(
        row: &Map<String, Value>,
        runs: usize,
        tasks: usize,
        repeat_times: u32,
    ) -> Result<Report> {
        let get = |key: &str| row.get(key).and_then(Value::as_f64).with_context(|| format!("the bench has no `{key}`"));
        for name in (0..=runs).flat_map(|r| [format!("native_{r}"), format!("python_{r}")]).chain(["ipc".to_owned()]) {
            let failed = get(&format!("bench/{name}/failed_tasks"))?;
            if failed > 0.0 {
                bail!("{failed} tasks of taskset {name} failed: see the run's failed_tasks.jsonl");
            }
        }
        let times =
            |side: &str| (1..=runs).map(|r| get(&format!("time/eval_{side}_{r}_s"))).collect::<Result<Vec<_>>>();
        let tokens = |side: &str| get(&format!("bench/{side}_1/response_length_mean"));
        let (native_runs, python_runs) = (times("native")?, times("python")?);
        Ok(Report {
            native_s: median(&native_runs),
            python_s: median(&python_runs),
            native_runs,
            python_runs,
            rollouts: tasks * repeat_times as usize,
            calls: tasks,
            native_tokens: tokens("native")?,
            python_tokens: tokens("python")?,
            round_trip_us: get("bench/ipc/round_trip_us/mean").ok(),
        })
    }

    /// Seconds each model call of the Python workflow costs beyond the built-in one's.
    pub(crate) fn overhead_per_call_s(&self) -> f64 {
        (self.python_s - self.native_s) / self.calls.max(1) as f64
    }

    pub(crate) fn table(&self) -> String {
        let runs = |runs: &[f64]| runs.iter().map(|s| format!("{s:.3}")).collect::<Vec<_>>().join(" ");
        let mut out = format!(
            "{:<34} {:>9} {:>11} {:>7} {:>11}  runs (s)\n",
            "", "median s", "rollouts/s", "calls", "tokens/ans"
        );
        for (name, s, all, tokens) in [
            ("simple_workflow (built in)", self.native_s, &self.native_runs, self.native_tokens),
            ("benchwf.SingleTurn (Python)", self.python_s, &self.python_runs, self.python_tokens),
        ] {
            out.push_str(&format!(
                "{name:<34} {s:>9.3} {:>11.1} {:>7} {tokens:>11.1}  {}\n",
                self.rollouts as f64 / s.max(1e-9),
                self.calls,
                runs(all)
            ));
        }
        out.push_str(&format!(
            "per-call overhead of the Python workflow: {:.2} ms ((python − native) / {} calls); python / native wall: {:.2}\n",
            self.overhead_per_call_s() * 1e3,
            self.calls,
            self.python_s / self.native_s.max(1e-9)
        ));
        if let Some(us) = self.round_trip_us {
            out.push_str(&format!("no-op model call round trip through the worker: {us:.0} µs\n"));
        }
        out
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            model: PathBuf::from("/m"),
            tasks: 4,
            repeat_times: 2,
            max_tokens: 8,
            runs: 3,
            runners: 2,
            max_model_len: 96,
        }
    }

    #[test]
    fn the_config_alternates_the_sides_after_their_warm_ups_and_forces_the_answer_length() {
        let config = config(&options());
        let names: Vec<&str> = config.lines().filter_map(|l| l.trim().strip_prefix("- name: ")).collect();
        assert_eq!(
            names,
            ["native_0", "python_0", "native_1", "python_1", "native_2", "python_2", "native_3", "python_3", "ipc"]
        );
        assert_eq!(config.matches("default_workflow_type: simple_workflow").count(), 4);
        assert_eq!(config.matches("default_workflow_type: benchwf.SingleTurn").count(), 4);
        assert_eq!(config.matches("min_tokens: 8").count(), 9);
        assert!(config.contains("mode: bench") && config.contains("runner_per_model: 2"), "{config}");
        assert_eq!(config.matches("        repeat_times: 2\n").count(), 9, "{config}");
        let rows = rows(3);
        assert_eq!(rows.lines().count(), 3);
        let first: Value = serde_json::from_str(rows.lines().next().unwrap()).unwrap();
        assert_eq!((first["question"].as_str(), first["answer"].as_str()), (Some("What is 10 + 27?"), Some("37")));
    }

    #[test]
    fn the_report_takes_medians_of_the_timed_runs_and_the_overhead_per_call() {
        let mut row = Map::new();
        for run in 0..=3 {
            row.insert(format!("time/eval_native_{run}_s"), (1.0 + run as f64).into());
            row.insert(format!("time/eval_python_{run}_s"), (10.0 + [50.0, 2.0, 1.0, 3.0][run]).into());
            for side in ["native", "python"] {
                row.insert(format!("bench/{side}_{run}/failed_tasks"), 0.0.into());
                row.insert(format!("bench/{side}_{run}/response_length_mean"), 8.0.into());
            }
        }
        row.insert("bench/ipc/failed_tasks".into(), 0.0.into());
        row.insert("bench/ipc/round_trip_us/mean".into(), 123.0.into());
        let report = Report::from_metrics(&row, 3, 4, 2).unwrap();
        // The warm-ups (1 s and 60 s) are left out.
        assert_eq!((report.native_s, report.python_s), (3.0, 12.0));
        assert_eq!(report.overhead_per_call_s(), 9.0 / 4.0);
        let table = report.table();
        assert!(table.contains("2250.00 ms") && table.contains("123 µs"), "{table}");
        assert!(table.contains("2.7") && table.contains("0.7"), "rollouts per second: {table}");

        row.insert("bench/python_2/failed_tasks".into(), 1.0.into());
        let failed = Report::from_metrics(&row, 3, 4, 2).unwrap_err().to_string();
        assert!(failed.contains("python_2"), "{failed}");
        row.remove("time/eval_native_2_s");
        assert!(Report::from_metrics(&row, 3, 4, 2).is_err());
    }
}
