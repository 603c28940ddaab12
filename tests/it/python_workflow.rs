//! Trinity-RFT users' Python workflow classes, named by dotted path, run by the Python workflow host on the tiny
//! model, in the venv `cargo xtask setup` makes with `trinity-rft==0.6.0`.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::{grpo_run_config, stderr, tiny_model_dir, trinity_rft_python};

/// The user's module: a single-turn workflow that samples the group with one `chat` call (`n`) and raises, hangs
/// or kills its own process on the rows named so; then the workflows of the other tests.
const USER_MODULE: &str = r#"
import asyncio
import os
import signal
import time

import torch
from tokenizers import Tokenizer

from trinity.common.workflows.workflow import MultiTurnWorkflow

from trinity.common.workflows.workflow import Workflow


class LengthWorkflow(Workflow):
    can_repeat = True

    def set_repeat_times(self, repeat_times, run_id_base):
        self.repeat_times = repeat_times
        self.run_id_base = run_id_base

    def run(self):
        row = self.task.raw_task
        if row["prompt"] == "boom":
            raise ValueError("the user's workflow refused row boom")
        if row["prompt"] == "hang":
            time.sleep(600)
        if row["prompt"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        messages = [{"role": "user", "content": row["prompt"]}]
        experiences = self.model.chat(messages, n=self.repeat_times, temperature=1.0, max_tokens=6, logprobs=0)
        assert isinstance(self.model.model_version, int)
        print("sampled", len(experiences), "for", row["prompt"])
        for run, exp in enumerate(experiences):
            exp.reward = float(len(exp.response_text) % 3)
            exp.metrics = {"length_reward": exp.reward}
            exp.eid.run = self.run_id_base + run
        return experiences


class TalkWorkflow(MultiTurnWorkflow):
    """Two sampled turns, trained as one experience through convert_messages_to_experience; reused across
    tasks (can_reset)."""

    can_reset = True
    built = 0

    def __init__(self, *, task, model, auxiliary_models=None):
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        TalkWorkflow.built += 1
        self.resets = 0
        self.task = task

    def reset(self, task):
        self.task = task
        self.resets += 1

    def run(self):
        try:
            self.model.get_openai_client()
            raise AssertionError("an OpenAI client without enable_openai_api")
        except ValueError as error:
            assert "explorer.rollout_model.enable_openai_api" in str(error), error
        messages = [{"role": "user", "content": self.task.raw_task["prompt"]}]
        first = None
        for follow_up in ["b", None]:
            reply = self.model.chat(messages, n=1, max_tokens=3)[0]
            if first is None:
                first = reply
            messages.append({"role": "assistant", "content": reply.response_text})
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
        exp = self.process_messages_to_experience(messages, reward=float(len(messages[1]["content"])), info={"reused": float(self.resets > 0)})
        tokenizer = Tokenizer.from_file(os.path.join(self.model.model_path, "tokenizer.json"))
        tokens = exp.tokens.tolist()
        assert tokens[: exp.prompt_length] == first.tokens[: first.prompt_length].tolist(), "the prompt is the first turn's"
        mask = exp.action_mask.tolist()
        assert len(mask) == len(tokens) - exp.prompt_length
        runs, context, current, masked = [], [], [], None
        for token, action in zip(tokens[exp.prompt_length :], mask):
            if action != masked and current:
                (runs if masked else context).append(current)
                current = []
            masked = action
            current.append(token)
        (runs if masked else context).append(current)
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        expected = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        assert [decode(run) for run in runs] == expected, ([decode(run) for run in runs], expected)
        assert [decode(c) for c in context] == ["<|im_start|>userb<|im_end|><|im_start|>assistant"], [decode(c) for c in context]
        scored = self.model.logprobs(tokens)
        assert scored.shape[0] == len(tokens) - 1 and torch.all(scored <= 0)
        return [exp]


class AgentWorkflow(Workflow):
    """An async agent: two concurrent requests through the OpenAI async client, trained on the recorded history."""

    is_async = True

    async def run_async(self):
        client = self.model.get_openai_async_client()
        prompt = self.task.raw_task["prompt"]
        replies = await asyncio.gather(
            *[
                client.chat.completions.create(
                    model=client.model_path, messages=[{"role": "user", "content": prompt + s}], max_tokens=4
                )
                for s in "ab"
            ]
        )
        experiences = self.model.extract_experience_from_history(clear_history=True)
        assert len(experiences) == 2, f"this run's two replies, not another run's: {len(experiences)}"
        assert self.model.extract_experience_from_history() == []
        texts = sorted(r.choices[0].message.content for r in replies)
        assert sorted(e.response_text for e in experiences) == texts, (texts, [e.response_text for e in experiences])
        for exp in experiences:
            scored = await self.model.logprobs_async(exp.tokens.tolist())
            drift = (scored[exp.prompt_length - 1 :] - exp.logprobs).abs().max().item()
            assert drift < 1e-2, f"the engine's logprobs of the recorded reply differ by {drift}"
            exp.reward = float(len(exp.response_text) % 2)
            exp.metrics = {"agent_calls": 2.0}
        # Calls in flight together are answered together: the instant one does not wait for the generation.
        order = []

        async def tagged(name, call):
            result = await call
            order.append(name)
            return result

        chat = self.model.chat_async([{"role": "user", "content": prompt}], max_tokens=6)
        await asyncio.gather(tagged("chat", chat), tagged("version", self.model.model_version_async))
        assert order == ["version", "chat"], order
        return experiences


class JudgedWorkflow(Workflow):
    """A policy answer judged by the auxiliary model, through its wrapper and through its OpenAI client."""

    def run(self):
        judge, client = self.auxiliary_model_wrappers[0], self.auxiliary_models[0]
        assert judge.config.name == "judge" and client.model_path == "judge", (judge.config.name, client.model_path)
        assert judge.generate_kwargs["max_tokens"] == 3, judge.generate_kwargs
        answer = self.model.chat([{"role": "user", "content": self.task.raw_task["prompt"]}], n=1, max_tokens=4)[0]
        verdict = judge.chat([{"role": "user", "content": "judge " + answer.response_text}], max_tokens=3)[0]
        reply = client.chat.completions.create(
            model=client.model_path, messages=[{"role": "user", "content": "judge"}], max_tokens=3
        )
        teacher = judge.logprobs(answer.tokens.tolist())
        assert teacher.shape[0] == len(answer.tokens) - 1
        answer.reward = float(len(verdict.response_text) % 2)
        answer.metrics = {"judge_reply": float(len(reply.choices[0].message.content) >= 0)}
        return [answer]


class BudgetWorkflow(Workflow):
    """Runs once per repeat (can_repeat is False), asking the model until the task's budget refuses: row `fits`
    stays within it, `loop` lets the refusal raise, `swallow` catches it (and sees the next call refused too) and
    returns what it has, `wide` asks for more samples than the token budget holds."""

    def run(self):
        row = self.task.raw_task["prompt"]
        messages = [{"role": "user", "content": row}]
        if row == "wide":
            return self.model.chat(messages, n=30, max_tokens=1)
        experiences = []
        for _ in range(3 if row == "fits" else 10):
            try:
                experiences += self.model.chat(messages, n=1, max_tokens=2)
            except RuntimeError as error:
                assert type(error).__name__ == "ModelBudgetExceeded", repr(error)
                if row != "swallow":
                    raise
                try:
                    self.model.chat(messages, n=1, max_tokens=2)
                    raise AssertionError("a call after the refusal was answered")
                except RuntimeError as again:
                    assert type(again).__name__ == "ModelBudgetExceeded", repr(again)
                break
        for exp in experiences:
            exp.reward = 1.0
        return experiences


class OpenAiBudgetWorkflow(Workflow):
    """Runs once per repeat (can_repeat is False), spending the task's budget through the OpenAI client as well:
    row `fits` mixes a `chat` call with two requests and stays within it, `loop` asks until the refusal raises,
    `swallow` catches it and finds `self.model` refused too, `wide` asks for more choices than the token budget
    holds, `tokens` generates 6 tokens a request until the generated tokens are spent."""

    def run(self):
        import openai

        row = self.task.raw_task["prompt"]
        client = self.model.get_openai_client()
        messages = [{"role": "user", "content": row}]

        def ask(**kwargs):
            return client.chat.completions.create(model=client.model_path, messages=messages, **kwargs)

        if row == "wide":
            ask(n=30, max_tokens=1)
            raise AssertionError("30 choices were answered within a budget of 20 tokens")
        if row == "fits":
            self.model.chat(messages, n=1, max_tokens=2)
            ask(max_tokens=2)
            ask(max_tokens=2)
            experiences = self.model.extract_experience_from_history()
            assert len(experiences) == 3, len(experiences)
            for exp in experiences:
                exp.reward = 1.0
            return experiences
        for _ in range(10):
            try:
                if row == "tokens":
                    ask(max_tokens=6, extra_body={"ignore_eos": True})
                else:
                    ask(max_tokens=1)
            except openai.RateLimitError as error:
                assert error.status_code == 429, error.status_code
                # What tells the client not to retry: the refusal is final for the task.
                assert error.response.headers.get("x-should-retry") == "false", dict(error.response.headers)
                assert "explorer.python_workflows.max_model_" in error.message, error.message
                if row != "swallow":
                    raise
                try:
                    self.model.chat(messages, n=1, max_tokens=1)
                    raise AssertionError("a call after the refusal was answered")
                except RuntimeError as again:
                    assert type(again).__name__ == "ModelBudgetExceeded", repr(again)
                return self.model.extract_experience_from_history()
        raise AssertionError("ten requests were answered")


class FlakyWorkflow(Workflow):
    """Runs once per repeat (can_repeat is False); the second run of each task raises, and every run of row
    `boom`."""

    runs = {}

    def run(self):
        row = self.task.raw_task["prompt"]
        FlakyWorkflow.runs[row] = FlakyWorkflow.runs.get(row, 0) + 1
        if row == "boom" or FlakyWorkflow.runs[row] == 2:
            raise ValueError(f"run {FlakyWorkflow.runs[row]} of row {row} failed")
        exp = self.model.chat([{"role": "user", "content": row}], n=1, max_tokens=3)[0]
        exp.reward = float(FlakyWorkflow.runs[row])
        exp.info = {"call": float(FlakyWorkflow.runs[row])}
        return [exp]
"#;

/// A GRPO run dir whose workflow is `userwf.LengthWorkflow` from a module in the run's directory; `rows` are
/// prompts.
fn run_dir(rows: &[&str], extra: &str) -> tempfile::TempDir {
    workflow_dir("LengthWorkflow", rows, 40, extra)
}

/// The same with the workflow `userwf.<class>` and that `max_model_len`.
fn workflow_dir(class: &str, rows: &[&str], max_model_len: u32, extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("userwf.py"), USER_MODULE).unwrap();
    let tasks: String = rows.iter().map(|p| format!("{{\"prompt\": \"{p}\", \"response\": \"1\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), tasks).unwrap();
    let config = format!(
        "{}    default_workflow_type: userwf.{class}\n{extra}",
        grpo_run_config(&tiny_model_dir(), max_model_len)
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

fn run(dir: &Path, python: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir)
        .args(args)
        .env_remove("RUST_LOG")
        .env("TRINITY_PYTHON", python)
        .output()
        .expect("the trinity binary runs")
}

#[test]
fn a_user_class_by_dotted_path_samples_its_group_and_trains_a_grpo_step() {
    let python = trinity_rft_python();
    let dir = run_dir(&["ab1", "ab2"], "");
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 1, "one step:\n{metrics}");
    let step: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert!(step["train/pg_loss"].is_number(), "{step}");
    assert_eq!(step["rollout/failed_tasks"], 0.0, "{step}");
    assert!(step["rollout/length_reward/mean"].is_number(), "the workflow's metrics reach the step: {step}");
    let log = std::fs::read_to_string(job.join("log/trinity.log")).unwrap();
    assert!(log.contains("sampled 2 for ab1"), "the worker's output is in the log, attributed:\n{log}");
    assert!(log.contains("provided a stand-in module `ray`"), "{log}");
}

#[test]
fn a_workflow_that_raises_or_hangs_costs_only_its_task() {
    let python = trinity_rft_python();
    // The timeout leaves the other tasks room for starting a worker (importing torch and Trinity-RFT) while the
    // rest of the suite loads the machine.
    let dir = run_dir(&["ab1", "boom", "hang", "ab2"], "explorer:\n  max_timeout: 45\n  max_retry_times: 0\n");
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let failed = std::fs::read_to_string(job.join("failed_tasks.jsonl")).unwrap();
    let failed: Vec<serde_json::Value> = failed.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    let text = serde_json::to_string(&failed).unwrap();
    assert!(text.contains("Traceback") && text.contains("the user's workflow refused row boom"), "{text}");
    assert!(text.contains("45"), "the hung task timed out: {text}");
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "both steps ran:\n{metrics}");
}

#[test]
fn a_missing_trinity_package_is_a_dry_run_error_with_the_pip_line() {
    let dir = run_dir(&["ab1"], "");
    let output = run(dir.path(), Path::new("python3"), &["run", "--config", "config.yaml", "--dry-run"]);
    let err = stderr(&output);
    let has_trinity =
        Command::new("python3").args(["-c", "import trinity.common"]).output().is_ok_and(|o| o.status.success());
    if has_trinity {
        println!("skipped: the system python3 has Trinity-RFT installed");
        return;
    }
    assert_eq!(output.status.code(), Some(1), "{err}");
    for piece in ["userwf.LengthWorkflow", "`trinity`", "pip install trinity-rft==0.6.0"] {
        assert!(err.contains(piece), "stderr lacks {piece:?}:\n{err}");
    }
    let missing = run(dir.path(), Path::new("/nonexistent/python"), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(stderr(&missing).contains("/nonexistent/python"), "{}", stderr(&missing));
}

/// An `explorer:` section without retries whose rollout model runs in fp32 (scoring a sequence on a bf16 model
/// on the CPU is refused by the packed decode path).
const FLOAT32_EXPLORER: &str = "explorer:\n  max_retry_times: 0\n  rollout_model:\n    dtype: float32\n";

/// The experiences a run wrote, and its steps' metrics.
fn outputs(job: &Path) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let read = |name: &str| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(job.join(name)).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
    };
    (read("experiences.jsonl"), read("monitor/metrics.jsonl"))
}

#[test]
fn a_multi_turn_workflow_trains_on_its_converted_conversation_with_only_the_assistant_turns_masked_in() {
    let python = trinity_rft_python();
    let dir = workflow_dir("TalkWorkflow", &["ab", "ba"], 64, FLOAT32_EXPLORER);
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let (experiences, metrics) = outputs(&job);
    assert_eq!(metrics.len(), 1, "{metrics:?}");
    let step = &metrics[0];
    assert_eq!(step["rollout/failed_tasks"], 0.0, "the workflow's own mask checks held: {step}");
    assert!(step["train/pg_loss"].is_number(), "{step}");
    assert_eq!(experiences.len(), 4, "2 tasks x 2 runs, one experience each");
    for e in &experiences {
        let mask: Vec<bool> = e["action_mask"].as_array().unwrap().iter().map(|m| m.as_bool().unwrap()).collect();
        let response = e["tokens"].as_array().unwrap().len() - e["prompt_length"].as_u64().unwrap() as usize;
        assert_eq!(mask.len(), response, "{e}");
        let switches = mask.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!((mask[0], switches, mask[mask.len() - 1]), (true, 2, true), "answer, user turn, answer: {mask:?}");
        let logprobs = e["logprobs"].as_array().unwrap();
        for (l, m) in logprobs.iter().zip(&mask) {
            assert_eq!(l.as_f64().unwrap() == 0.0, !m, "scored exactly where masked in: {e}");
        }
    }
    let reused: Vec<f64> = experiences.iter().map(|e| e["info"]["reused"].as_f64().unwrap()).collect();
    assert_eq!(reused.iter().sum::<f64>(), 2.0, "each task's second run reset the can_reset instance: {reused:?}");
}

#[test]
fn an_async_agent_trains_on_the_replies_its_openai_client_recorded() {
    let python = trinity_rft_python();
    // One runner: its worker runs the second task with the OpenAI async client the first one made.
    let extra = "explorer:\n  max_retry_times: 0\n  runner_per_model: 1\n  concurrent_mode: asynchronous\n  rollout_model:\n    dtype: float32\n    enable_openai_api: true\n    enable_history: true\n";
    let dir = workflow_dir("AgentWorkflow", &["ab", "ba"], 64, extra);
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let (experiences, metrics) = outputs(&dir.path().join("ckpt/p/n"));
    assert_eq!(metrics.len(), 1, "{metrics:?}");
    // A failure under CI's load once left only the metrics; the task's own error says why.
    let failed = std::fs::read_to_string(dir.path().join("ckpt/p/n/failed_tasks.jsonl")).unwrap_or_default();
    assert_eq!(metrics[0]["rollout/failed_tasks"], 0.0, "{}\nfailed tasks: {failed}\n{}", metrics[0], stderr(&output));
    assert!(metrics[0]["rollout/agent_calls/mean"].is_number(), "{}", metrics[0]);
    assert_eq!(experiences.len(), 8, "2 tasks x 2 concurrent runs x 2 recorded replies");
}

#[test]
fn a_workflow_calls_its_auxiliary_model_through_the_wrapper_and_the_openai_client() {
    let python = trinity_rft_python();
    let extra = format!(
        "explorer:\n  max_retry_times: 0\n  rollout_model:\n    enable_openai_api: true\n  auxiliary_models:\n    - model_path: {}\n      name: judge\n      dtype: float32\n      max_model_len: 64\n      max_response_tokens: 3\n",
        tiny_model_dir().display()
    );
    let dir = workflow_dir("JudgedWorkflow", &["ab", "ba"], 64, &extra);
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let (experiences, metrics) = outputs(&dir.path().join("ckpt/p/n"));
    assert_eq!(metrics[0]["rollout/failed_tasks"], 0.0, "{}", metrics[0]);
    assert_eq!(metrics[0]["rollout/judge_reply/mean"], 1.0, "{}", metrics[0]);
    assert_eq!(experiences.len(), 4);
}

#[test]
fn a_workflow_that_kills_its_own_process_costs_only_its_task() {
    let python = trinity_rft_python();
    let dir = run_dir(&["ab1", "kill", "ab2", "ab3"], "explorer:\n  max_retry_times: 0\n");
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let failed = std::fs::read_to_string(job.join("failed_tasks.jsonl")).unwrap();
    assert_eq!(failed.lines().count(), 1, "{failed}");
    assert!(failed.contains("\"kill\"") && failed.contains("exited during the task"), "{failed}");
    let (experiences, metrics) = outputs(&job);
    assert_eq!(metrics.len(), 2, "both steps trained: {metrics:?}");
    assert_eq!(experiences.len(), 6, "the three other tasks' groups");
}

#[test]
fn a_call_past_the_model_budget_raises_in_the_workflow_and_fails_its_task() {
    let python = trinity_rft_python();
    let limits =
        "explorer:\n  max_retry_times: 0\n  python_workflows:\n    max_model_calls: 8\n    max_model_tokens: 20\n";
    let rows = ["fits", "loop", "wide", "fits", "swallow", "fits"];
    let dir = workflow_dir("BudgetWorkflow", &rows, 40, limits);
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let failed = std::fs::read_to_string(job.join("failed_tasks.jsonl")).unwrap();
    let failed: Vec<serde_json::Value> = failed.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let by_row = |row: &str| {
        let found = failed.iter().find(|f| f["row"]["prompt"] == row);
        found.unwrap_or_else(|| panic!("row {row} did not fail: {failed:?}")).to_string()
    };
    assert_eq!(failed.len(), 3, "{failed:?}");
    // Two runs of three calls fit in eight; the ninth call is refused, whether the workflow raises or not.
    for row in ["loop", "swallow"] {
        let text = by_row(row);
        assert!(text.contains("model call 9 is past the limit of 8") && text.contains("max_model_calls"), "{text}");
    }
    let wide = by_row("wide");
    assert!(wide.contains("max_model_tokens") && wide.contains("n = 30 cannot fit"), "{wide}");
    let (experiences, metrics) = outputs(&job);
    assert_eq!(metrics.len(), 3, "every step trained on its `fits` task: {metrics:?}");
    assert_eq!(experiences.len(), 3 * 6, "three calls in each of two runs of the three `fits` tasks");

    let dir = workflow_dir("BudgetWorkflow", &["fits"], 40, "explorer:\n  python_workflows:\n    max_model_calls: 0\n");
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml", "--dry-run"]);
    let err = stderr(&output);
    assert!(!output.status.success() && err.contains("explorer.python_workflows.max_model_calls"), "{err}");
}

#[test]
fn requests_through_the_openai_client_spend_the_same_budget_and_the_one_past_it_raises() {
    let python = trinity_rft_python();
    let extra = "explorer:\n  max_retry_times: 0\n  rollout_model:\n    enable_openai_api: true\n    enable_history: true\n  python_workflows:\n    max_model_calls: 8\n    max_model_tokens: 20\n";
    let rows = ["fits", "loop", "wide", "fits", "swallow", "fits", "tokens", "fits"];
    let dir = workflow_dir("OpenAiBudgetWorkflow", &rows, 40, extra);
    let started = std::time::Instant::now();
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let failed = std::fs::read_to_string(job.join("failed_tasks.jsonl")).unwrap();
    let failed: Vec<serde_json::Value> = failed.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let by_row = |row: &str| {
        let found = failed.iter().find(|f| f["row"]["prompt"] == row);
        found.unwrap_or_else(|| panic!("row {row} did not fail: {failed:?}")).to_string()
    };
    assert_eq!(failed.len(), 4, "{failed:?}");
    // Eight requests fit; the ninth gets the 429, whether the workflow raises it or not, and fails the task as a
    // refused `self.model` call does.
    for row in ["loop", "swallow"] {
        let text = by_row(row);
        assert!(text.contains("went past its model budget"), "{text}");
        assert!(text.contains("model call 9 is past the limit of 8") && text.contains("max_model_calls"), "{text}");
    }
    let wide = by_row("wide");
    assert!(wide.contains("max_model_tokens") && wide.contains("n = 30 cannot fit"), "{wide}");
    // Four requests of six tokens spend 24 of the 20: the server counts what each request generated.
    let tokens = by_row("tokens");
    assert!(tokens.contains("24 tokens generated of the 20 allowed"), "{tokens}");
    let (experiences, metrics) = outputs(&job);
    assert_eq!(metrics.len(), 4, "every step trained on its `fits` task: {metrics:?}");
    assert_eq!(experiences.len(), 4 * 2 * 3, "a chat call and two recorded requests in each of two runs");
    println!("{:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn a_failed_run_of_a_repeated_task_costs_only_that_run() {
    let python = trinity_rft_python();
    let config = ["run", "--config", "config.yaml", "--set", "algorithm.repeat_times=4"];
    // Trinity-RFT's default (`return_partial_tasks: false`): the runs after the failed one are skipped, the run
    // before it is kept.
    let dir = workflow_dir("FlakyWorkflow", &["ab1", "ab2", "boom", "ab3"], 40, "explorer:\n  max_retry_times: 0\n");
    let output = run(dir.path(), &python, &config);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let (experiences, metrics) = outputs(&job);
    assert_eq!(metrics.len(), 2, "{metrics:?}");
    let runs = |experiences: &[serde_json::Value]| -> Vec<(String, u64)> {
        let mut runs: Vec<(String, u64)> = experiences
            .iter()
            .map(|e| (e["eid"]["task"].to_string(), e["info"]["call"].as_f64().unwrap() as u64))
            .collect();
        runs.sort();
        runs
    };
    assert_eq!(runs(&experiences).iter().map(|r| r.1).collect::<Vec<_>>(), [1, 1, 1], "{experiences:?}");
    let failed = std::fs::read_to_string(job.join("failed_tasks.jsonl")).unwrap();
    assert_eq!(failed.lines().count(), 1, "only the task none of whose runs completed: {failed}");
    assert!(failed.contains("run 1 of row boom failed"), "{failed}");
    let log = std::fs::read_to_string(job.join("log/trinity.log")).unwrap();
    assert!(
        log.contains("1 of 4 runs completed and are kept, 1 raised, 2 skipped")
            && log.contains("run 2 of row ab1 failed"),
        "{log}"
    );

    // With `return_partial_tasks: true` the other runs go on: runs 1, 3 and 4 of each task are kept.
    let partial = "explorer:\n  max_retry_times: 0\n  over_rollout:\n    return_partial_tasks: true\nsynchronizer:\n  sync_style: explorer_driven\n";
    let dir = workflow_dir("FlakyWorkflow", &["ab1", "ab2"], 40, partial);
    let output = run(dir.path(), &python, &config);
    assert!(output.status.success(), "{}", stderr(&output));
    let (experiences, _) = outputs(&dir.path().join("ckpt/p/n"));
    let calls: Vec<u64> = runs(&experiences).iter().map(|r| r.1).collect();
    assert_eq!(calls, [1, 3, 4, 1, 3, 4], "{experiences:?}");
}

#[test]
fn a_bench_evaluates_the_model_with_a_python_workflow() {
    let python = trinity_rft_python();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("userwf.py"), USER_MODULE).unwrap();
    std::fs::write(
        dir.path().join("eval.jsonl"),
        "{\"prompt\": \"ab1\"}\n{\"prompt\": \"ab2\"}\n{\"prompt\": \"ab3\"}\n",
    )
    .unwrap();
    let config = format!(
        "mode: bench\nproject: p\nname: n\ncheckpoint_root_dir: ./ckpt\nmodel:\n  model_path: {}\n  max_model_len: 40\n  \
         max_response_tokens: 6\nbuffer:\n  explorer_input:\n    eval_tasksets:\n      - name: lengths\n        path: \
         eval.jsonl\n        repeat_times: 2\n    default_eval_workflow_type: userwf.LengthWorkflow\nexplorer:\n  \
         max_retry_times: 0\nmonitor:\n  monitor_type: jsonl\n",
        tiny_model_dir().display()
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let lines = std::fs::read_to_string(job.join("monitor/bench/metrics.jsonl")).unwrap();
    let step: serde_json::Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert_eq!(step["step"], 0, "{step}");
    assert_eq!(step["bench/lengths/failed_tasks"], 0.0, "{step}");
    assert!(step["bench/lengths/reward_mean"].is_number(), "{step}");
    let out = stderr(&output);
    assert!(out.contains("sampled 2 for ab3"), "the workflow ran in Python:\n{out}");
}

/// With `enable_prompt_truncation` (Trinity-RFT's default), a `chat` whose prompt is over `max_prompt_tokens` gets
/// Trinity-RFT's masked placeholders, not an exception: the workflow goes on, and the experiences are marked
/// `prompt_truncated`. Row 1 renders to 56 tokens, over the 34 that `max_model_len` 40 leaves.
#[test]
fn a_chat_prompt_over_the_limit_gets_trinitys_masked_placeholders() {
    let python = trinity_rft_python();
    let long = "ab".repeat(20);
    let dir = run_dir(&["ab1", &long], "explorer:\n  max_retry_times: 0\n");
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let (experiences, metrics) = outputs(&dir.path().join("ckpt/p/n"));
    assert_eq!(metrics[0]["rollout/failed_tasks"], 0.0, "{}", metrics[0]);
    assert_eq!(experiences.len(), 4, "2 tasks × 2 runs");
    let masked: Vec<_> = experiences.iter().filter(|e| e["truncate_status"] == "prompt_truncated").collect();
    assert_eq!(masked.len(), 2, "{experiences:?}");
    for e in masked {
        assert_eq!((e["prompt_length"].as_u64(), e["tokens"].as_array().map(Vec::len)), (Some(34), Some(35)), "{e}");
    }
}
