//! Trinity-RFT 0.6.0's own environment workflows (its Sudoku and FrozenLake classes, by dotted path), workflows
//! named through Trinity-RFT's `WORKFLOWS` registry (a plugin in `TRINITY_PLUGIN_DIRS`, an environment workflow
//! whose package is not installed) and `examples/python_workflow/`, run by the Python workflow host on the tiny
//! model in the venv `cargo xtask setup` makes.
//!
//! A reward check replays each run through the same Trinity-RFT class: the replies trinity's model gave (decoded
//! from the run's `experiences.jsonl`) are fed back to the class by a stand-in model, and the rewards it computes
//! must be the rewards trinity recorded.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::{agentscope_python, grpo_run_config, stderr, tiny_model_dir, trinity_rft_python, workspace_root};
use crate::tool_model::write_tool_model;

/// Replays the runs of `experiences.jsonl` through a Trinity-RFT workflow class: `replay.py CLASS MODEL_DIR
/// TASKS EXPERIENCES WORKFLOW_ARGS_JSON` prints one JSON line per run with the rewards trinity recorded and those
/// the class computes from the same replies. A reply is a maximal span of `action_mask` (every response token
/// for a single-turn experience), decoded with the model's tokenizer.
const REPLAY: &str = r#"
import asyncio, importlib, importlib.abc, importlib.machinery, json, sys, types
from unittest import mock

# Trinity-RFT's modules import ray and vllm at module level; like the worker, the replay stands in for them.
class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return mock.MagicMock(name=f"{self.__name__}.{name}")

class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in ("ray", "vllm"):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    def create_module(self, spec):
        return _StandIn(spec.name)
    def exec_module(self, module):
        module.__path__ = []

sys.meta_path.append(_StandIns())
import torch
from tokenizers import Tokenizer
from trinity.common.config import GenerationConfig
from trinity.common.experience import Experience
from trinity.common.workflows.workflow import Task

path, model_dir, tasks_file, exps_file, workflow_args = sys.argv[1:6]
module, name = path.rsplit(".", 1)
cls = getattr(importlib.import_module(module), name)
tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
rows = [json.loads(line) for line in open(tasks_file)]

def replies(exp):
    response = exp["tokens"][exp["prompt_length"]:]
    mask = exp.get("action_mask") or [True] * len(response)
    spans, current = [], []
    for token, on in zip(response, mask):
        if on:
            current.append(token)
        elif current:
            spans.append(current); current = []
    if current:
        spans.append(current)
    return [tokenizer.decode(span, skip_special_tokens=True) for span in spans]

class ReplayModel:
    def __init__(self, texts):
        self.texts = list(texts)
        self.calls = 0
    def chat(self, messages, **kwargs):
        self.calls += 1
        text = self.texts.pop(0) if self.texts else ""
        return [Experience(tokens=torch.tensor([0, 1]), prompt_length=1, logprobs=torch.tensor([0.0]), response_text=text)]
    async def chat_async(self, messages, **kwargs):
        return self.chat(messages, **kwargs)
    async def get_message_token_len(self, messages):
        return 0
    async def convert_messages_to_experience_async(self, messages, tools=None, temperature=None):
        return Experience(tokens=torch.tensor([0, 1]), prompt_length=1, logprobs=torch.tensor([0.0]))
    def convert_messages_to_experience(self, messages, tools=None, temperature=None):
        return Experience(tokens=torch.tensor([0, 1]), prompt_length=1, logprobs=torch.tensor([0.0]))

runs = {}
for line in open(exps_file):
    exp = json.loads(line)
    key = (exp["eid"]["batch"], exp["eid"]["task"], exp["eid"]["run"])
    runs.setdefault(key, []).append(exp)
for key, exps in sorted(runs.items()):
    exps.sort(key=lambda e: e["eid"]["step"])
    row = rows[exps[0]["info"]["task_index"]["index"]]
    texts = [text for exp in exps for text in replies(exp)]
    model = ReplayModel(texts)
    task = Task(workflow=cls, repeat_times=1, workflow_args=json.loads(workflow_args), raw_task=row, rollout_args=GenerationConfig())
    workflow = cls(task=task, model=model)
    out = asyncio.run(workflow.run_async()) if cls.is_async else workflow.run()
    truncated = any(e.get("truncate_status") == "response_truncated" for e in exps)
    print(json.dumps({"run": list(key), "recorded": [e["reward"] for e in exps], "replayed": [float(e.reward) for e in out],
                      "replies": len(texts), "calls": model.calls, "truncated": truncated}))
"#;

fn trinity(dir: &Path, python: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trinity"));
    command.current_dir(dir).args(args).env_remove("RUST_LOG").env_remove("TRINITY_PLUGIN_DIRS");
    command.env("TRINITY_PYTHON", python).envs(envs.iter().copied());
    command.output().expect("the trinity binary runs")
}

/// A GRPO run directory on the tiny model: `rows` as the taskset, `workflow` as its workflow, `extra` appended
/// to the config (inside the taskset, six spaces, or top-level sections).
fn run_dir(rows: &[Value], workflow: &str, max_model_len: u32, extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let tasks: String = rows.iter().map(|row| format!("{row}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), tasks).unwrap();
    let config = format!(
        "{}      default_workflow_type: {workflow}\n{extra}",
        grpo_run_config(&tiny_model_dir(), max_model_len)
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

/// The run's steps from its metrics file.
fn steps(dir: &Path) -> Vec<Value> {
    let metrics = std::fs::read_to_string(dir.join("ckpt/p/n/monitor/metrics.jsonl")).unwrap();
    metrics.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// The run's experiences from its `experiences.jsonl`.
fn experiences(dir: &Path) -> Vec<Value> {
    let experiences = std::fs::read_to_string(dir.join("ckpt/p/n/experiences.jsonl")).unwrap();
    experiences.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// Replays the run in `dir` through `class` and asserts the class's rewards are the recorded ones and that it
/// asked the model once per recorded reply (a conversation cut at `max_model_len`, `response_truncated`, may have
/// lost its last replies: then at most as often); the replayed runs, for more checks.
fn assert_rewards_replay(dir: &Path, python: &Path, class: &str, workflow_args: &str) -> Vec<Value> {
    let output = Command::new(python)
        .current_dir(dir)
        .args(["-c", REPLAY, class])
        .arg(tiny_model_dir())
        .args(["tasks.jsonl", "ckpt/p/n/experiences.jsonl", workflow_args])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let runs: Vec<Value> =
        String::from_utf8_lossy(&output.stdout).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert!(!runs.is_empty(), "no run was replayed");
    for run in &runs {
        assert_eq!(run["recorded"], run["replayed"], "the class computes other rewards from the same replies: {run}");
        let (replies, calls) = (run["replies"].as_u64().unwrap(), run["calls"].as_u64().unwrap());
        match run["truncated"].as_bool().unwrap() {
            false => assert_eq!(replies, calls, "the class asked the model as often as in the run: {run}"),
            true => assert!(replies <= calls, "more replies than calls: {run}"),
        }
    }
    runs
}

/// A solved 9×9 grid (each row the one before shifted), and a puzzle from it with `blanks` cells emptied.
fn sudoku_row(blanks: &[(usize, usize)]) -> Value {
    let solution: Vec<Vec<u8>> =
        (0..9).map(|r| (0..9).map(|c| ((r * 3 + r / 3 + c) % 9 + 1) as u8).collect()).collect();
    let mut puzzle = solution.clone();
    for &(r, c) in blanks {
        puzzle[r][c] = 0;
    }
    serde_json::json!({"puzzle": puzzle, "solution": solution})
}

#[test]
fn trinity_rfts_sudoku_class_by_dotted_path_trains_grpo_steps_with_the_rewards_it_computes() {
    let python = trinity_rft_python();
    let rows: Vec<Value> = (0..4).map(|i| sudoku_row(&[(i, i), (4, 5), (8, 8 - i)])).collect();
    let class = "trinity.common.workflows.envs.sudoku.sudoku_workflow.SudokuWorkflow";
    let dir = run_dir(&rows, class, 560, "");
    let output = trinity(dir.path(), &python, &["run", "--config", "config.yaml"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let steps = steps(dir.path());
    assert_eq!(steps.len(), 2, "two GRPO steps: {steps:?}");
    for step in &steps {
        assert_eq!(step["rollout/failed_tasks"], 0.0, "{step}");
        assert!(step["train/pg_loss"].is_number(), "{step}");
    }
    let runs = assert_rewards_replay(dir.path(), &python, class, "{}");
    assert_eq!(runs.len(), 8, "4 tasks × 2 runs: {runs:?}");
}

#[test]
fn trinity_rfts_frozen_lake_class_by_dotted_path_trains_grpo_steps_with_the_rewards_it_computes() {
    let python = trinity_rft_python();
    let rows: Vec<Value> = (0..4).map(|seed| serde_json::json!({"size": 3, "p": 0.8, "seed": seed})).collect();
    let class = "trinity.common.workflows.envs.frozen_lake.workflow.FrozenLakeWorkflow";
    let args = r#"{"agent_max_steps": 3, "env_max_steps": 4}"#;
    // fp32 rollout weights: convert_messages_to_experience's logprob pass over a bf16 copy of the tiny model
    // fails in the packed CPU linear today (reported with the host's model API work).
    let extra = format!("      workflow_args: {args}\nexplorer:\n  rollout_model:\n    dtype: float32\n");
    let dir = run_dir(&rows, class, 2048, &extra);
    let output = trinity(dir.path(), &python, &["run", "--config", "config.yaml"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let steps = steps(dir.path());
    assert_eq!(steps.len(), 2, "two GRPO steps: {steps:?}");
    for step in &steps {
        assert_eq!(step["rollout/failed_tasks"], 0.0, "{step}");
        assert!(step["rollout/env_steps/mean"].is_number(), "the class's info reaches the metrics: {step}");
    }
    let runs = assert_rewards_replay(dir.path(), &python, class, args);
    assert_eq!(runs.len(), 8, "4 tasks × 2 runs: {runs:?}");
    // Each run is one experience over the whole game: a reply per turn, at most agent_max_steps.
    assert!(runs.iter().all(|run| (1..=3).contains(&run["replies"].as_u64().unwrap())), "{runs:?}");
    // The class asks each turn for what is left of its 10240-token budget, which trinity's engine honours up to
    // `max_model_len` as vLLM does; `max_response_tokens` (6) is only the default of a call that names none.
    let longest = experiences(dir.path())
        .iter()
        .map(|e| e["tokens"].as_array().unwrap().len() - e["prompt_length"].as_u64().unwrap() as usize)
        .max()
        .unwrap();
    assert!(longest > 3 * 6, "the replies were cut at max_response_tokens: {longest} response tokens");
}

/// A Trinity-RFT plugin module, as a user puts it in a `TRINITY_PLUGIN_DIRS` directory: it registers a workflow
/// by name in Trinity-RFT's registry.
const PLUGIN: &str = r#"
from trinity.common.workflows import WORKFLOWS
from trinity.common.workflows.workflow import Workflow


@WORKFLOWS.register_module("echo_length_workflow")
class EchoLengthWorkflow(Workflow):
    def run(self):
        messages = [{"role": "user", "content": self.task.raw_task["prompt"]}]
        exp = self.model.chat(messages, max_tokens=6)[0]
        exp.reward = float(len(exp.response_text) >= 3)
        return [exp]
"#;

#[test]
fn a_name_a_plugin_dir_registers_in_trinity_rfts_registry_runs_as_a_python_workflow() {
    let python = trinity_rft_python();
    let rows = [serde_json::json!({"prompt": "ab"}), serde_json::json!({"prompt": "cd"})];
    let dir = run_dir(&rows, "echo_length_workflow", 40, "");
    let plugins = dir.path().join("my_plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::write(plugins.join("echo_length.py"), PLUGIN).unwrap();
    let plugin_dirs = plugins.to_str().unwrap();

    // Without the plugin dir, the name is unknown to trinity and to Python's registry, and the error says both.
    let unknown = trinity(dir.path(), &python, &["run", "--config", "config.yaml", "--dry-run"], &[]);
    let err = stderr(&unknown);
    assert_eq!(unknown.status.code(), Some(1), "{err}");
    for piece in ["unknown workflow `echo_length_workflow`", "WORKFLOWS registry", "TRINITY_PLUGIN_DIRS is not set"] {
        assert!(err.contains(piece), "stderr lacks {piece:?}:\n{err}");
    }

    let envs = [("TRINITY_PLUGIN_DIRS", plugin_dirs)];
    let output = trinity(dir.path(), &python, &["run", "--config", "config.yaml"], &envs);
    assert!(output.status.success(), "{}", stderr(&output));
    let steps = steps(dir.path());
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["rollout/failed_tasks"], 0.0, "{}", steps[0]);
    assert!(steps[0]["rollout/reward_mean"].is_number(), "{}", steps[0]);
    let log = std::fs::read_to_string(dir.path().join("ckpt/p/n/log/trinity.log")).unwrap();
    assert!(log.contains("loaded plugin module `trinity.plugins.echo_length`"), "{log}");
    // Unlike Trinity-RFT's loader, the host does not copy the plugin into the installed package.
    let installed = Command::new(&python)
        .args(["-c", "import trinity.plugins; print(trinity.plugins.__path__[0])"])
        .output()
        .unwrap();
    let installed = PathBuf::from(String::from_utf8_lossy(&installed.stdout).trim());
    assert!(installed.is_dir() && !installed.join("echo_length.py").exists(), "{}", installed.display());
}

#[test]
fn a_registered_environment_workflow_without_its_package_is_a_dry_run_error_with_the_pip_line() {
    let python = trinity_rft_python();
    let dir = run_dir(&[serde_json::json!({"game_file": "g.z8"})], "alfworld_workflow", 40, "");
    let output = trinity(dir.path(), &python, &["run", "--config", "config.yaml", "--dry-run"], &[]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    for piece in ["workflow `alfworld_workflow` cannot be imported", "`alfworld`", "pip install alfworld textworld"] {
        assert!(err.contains(piece), "stderr lacks {piece:?}:\n{err}");
    }
    // A built-in name is never sent to Python, even where Trinity-RFT's registry has it too.
    let native = run_dir(&[serde_json::json!({"question": "1+1", "answer": "2"})], "math_workflow", 40, "");
    let missing_python = Path::new("/nonexistent/python");
    let output = trinity(native.path(), missing_python, &["run", "--config", "config.yaml", "--dry-run"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn the_python_workflow_example_passes_dry_run_and_trains_a_step_on_the_tiny_model() {
    let python = trinity_rft_python();
    let root = workspace_root();
    let config = "examples/python_workflow/python_workflow.yaml";
    // From the repository root, as the README says: the class's dotted path and the taskset are found from there.
    let dry = trinity(&root, &python, &["run", "--config", config, "--dry-run"], &[]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    let dir = tempfile::tempdir().unwrap();
    let overrides = [
        format!("model.model_path={}", tiny_model_dir().display()),
        format!("checkpoint_root_dir={}", dir.path().display()),
        "buffer.total_steps=1".to_owned(),
        "model.max_model_len=200".to_owned(),
        "model.max_response_tokens=6".to_owned(),
    ];
    let mut args = vec!["run", "--config", config];
    for value in &overrides {
        args.extend(["--set", value.as_str()]);
    }
    let output = trinity(&root, &python, &args, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let metrics = walk_find(dir.path(), "metrics.jsonl").expect("the run wrote its metrics");
    let metrics = std::fs::read_to_string(metrics).unwrap();
    let step: Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert_eq!(step["rollout/failed_tasks"], 0.0, "{step}");
    assert!(step["rollout/format_reward/mean"].is_number(), "the example's metric reaches the step: {step}");
    assert!(step["train/pg_loss"].is_number(), "{step}");
}

fn walk_find(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()? {
        let path = entry.ok()?.path();
        if path.is_dir() {
            if let Some(found) = walk_find(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

/// A Trinity-RFT workflow as an AgentScope user writes one: AgentScope's ReAct agent, its chat model being the
/// workflow's OpenAI async client (`get_openai_async_client`), and the experiences the client's history
/// recorded (`extract_experience_from_history`), as 0.6.0's own AgentScope workflows build theirs.
const AGENTSCOPE_WORKFLOW: &str = r#"
from trinity.common.workflows.workflow import Workflow


class AgentScopeAgentWorkflow(Workflow):
    is_async = True

    def __init__(self, *, task, model, auxiliary_models=None):
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        from agentscope.agent import ReActAgent
        from agentscope.formatter import OpenAIChatFormatter
        from agentscope.memory import InMemoryMemory
        from agentscope.model import OpenAIChatModel
        from agentscope.tool import Toolkit

        client = model.get_openai_async_client()
        chat_model = OpenAIChatModel(
            api_key="EMPTY",
            model_name=client.model_path,
            stream=False,
            generate_kwargs={"temperature": task.rollout_args.temperature, "max_tokens": task.rollout_args.max_tokens},
        )
        chat_model.client = client
        self.agent = ReActAgent(
            name="adder",
            sys_prompt="Add the numbers.",
            model=chat_model,
            formatter=OpenAIChatFormatter(),
            toolkit=Toolkit(),
            memory=InMemoryMemory(),
            max_iters=2,
        )

    async def run_async(self):
        from agentscope.message import Msg

        reply = await self.agent.reply(Msg("user", self.task.raw_task["question"], role="user"))
        text = reply.get_text_content() or ""
        memory = len(await self.agent.memory.get_memory())
        experiences = self.model.extract_experience_from_history()
        for exp in experiences:
            exp.reward = float(self.task.raw_task["answer"] in text)
            exp.metrics = {"agent_memory": float(memory)}
        return experiences
"#;

#[test]
fn an_agentscope_react_agent_calls_trinitys_model_through_the_workflows_openai_client_and_trains_a_step() {
    let python = agentscope_python();
    let rows =
        [serde_json::json!({"question": "2+3", "answer": "5"}), serde_json::json!({"question": "4+4", "answer": "8"})];
    let extra = "      rollout_args:\n        temperature: 1.0\nexplorer:\n  max_retry_times: 0\n  rollout_model:\n    \
                 dtype: float32\n    enable_openai_api: true\n    enable_history: true\n";
    let dir = run_dir(&rows, "as_agent.AgentScopeAgentWorkflow", 600, extra);
    std::fs::write(dir.path().join("as_agent.py"), AGENTSCOPE_WORKFLOW).unwrap();
    let output = trinity(dir.path(), &python, &["run", "--config", "config.yaml"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let steps = steps(dir.path());
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["rollout/failed_tasks"], 0.0, "{}", steps[0]);
    assert_eq!(steps[0]["rollout/agent_memory/mean"], 2.0, "the agent kept the question and its reply: {}", steps[0]);
    assert!(steps[0]["train/pg_loss"].is_number(), "{}", steps[0]);
    // Each agent reply is an experience recorded by the OpenAI endpoint: the prompt AgentScope's formatter built
    // (its system prompt, then the question) through the model's chat template.
    let experiences = experiences(dir.path());
    assert!(experiences.len() >= 4, "2 tasks × 2 runs, at least one reply each: {}", experiences.len());
    for exp in &experiences {
        let prompt = exp["prompt_text"].as_str().unwrap_or_default();
        assert!(prompt.contains("the numbers.") && prompt.contains("<|im_start|>user"), "{prompt:?}");
        assert!(exp["logprobs"].as_array().is_some_and(|l| !l.is_empty()), "{exp}");
    }
}

#[test]
fn trinity_rfts_agentscope_workflows_import_in_the_agentscope_venv_and_name_the_pinned_pip_line_without_it() {
    let rows = [serde_json::json!({"question": "1+1", "answer": "#### 2"})];
    let extra = "      format:\n        prompt_key: question\n        response_key: answer\nexplorer:\n  rollout_model:\n    \
                 enable_openai_api: true\n    enable_history: true\n";
    for workflow in ["agentscope_react_workflow"] {
        let dir = run_dir(&rows, workflow, 600, extra);
        let dry = ["run", "--config", "config.yaml", "--dry-run"];
        let output = trinity(dir.path(), &agentscope_python(), &dry, &[]);
        assert!(output.status.success(), "{workflow}: {}", stderr(&output));
        let output = trinity(dir.path(), &trinity_rft_python(), &dry, &[]);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{err}");
        for piece in [
            format!("workflow `{workflow}` cannot be imported"),
            "`agentscope`".to_owned(),
            "pip install 'agentscope>=1.0.19,<2' 'mcp<2' greenlet".to_owned(),
        ] {
            assert!(err.contains(&piece), "{workflow}: stderr lacks {piece:?}:\n{err}");
        }
    }
}

/// Trinity-RFT 0.6.0's own `agentscope_react_workflow`, as its `examples/agentscope_react/gsm8k.yaml` configures
/// it (OpenAI API with history, hermes auto tool choice), unchanged: AgentScope's ReAct agent asks for its
/// structured answer with `tool_choice: "required"` (then `"none"` for the text reply), which trinity samples
/// under the tools' schema. On the tiny tool model the answers are noise, but every run must finish, its replies
/// be recorded and a GRPO step be trained on them.
#[test]
fn trinity_rfts_agentscope_react_workflow_runs_unchanged_and_trains_a_step() {
    let python = agentscope_python();
    let rows = [
        serde_json::json!({"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}),
        serde_json::json!({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}),
    ];
    let extra = "      format:\n        prompt_key: question\n        response_key: answer\n      rollout_args:\n        \
                 temperature: 1.0\n        max_tokens: 256\nexplorer:\n  max_retry_times: 0\n  rollout_model:\n    \
                 dtype: float32\n    enable_openai_api: true\n    enable_history: true\n    \
                 enable_auto_tool_choice: true\n    tool_call_parser: hermes\n";
    let dir = run_dir(&rows, "agentscope_react_workflow", 16384, extra);
    // The tool model's byte-level vocabulary can write any JSON the schema asks for (the tiny model's 48 tokens
    // have no `{`), and replies get room for a whole structured answer (the shared config caps them at 6 tokens).
    let model = dir.path().join("model");
    write_tool_model(&model);
    let config = std::fs::read_to_string(dir.path().join("config.yaml")).unwrap();
    let config = config
        .replace(&tiny_model_dir().display().to_string(), &model.display().to_string())
        .replace("max_response_tokens: 6\n", "max_response_tokens: 256\n");
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = trinity(dir.path(), &python, &["run", "--config", "config.yaml"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let steps = steps(dir.path());
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["rollout/failed_tasks"], 0.0, "{}", steps[0]);
    // The workflow's own metric: the agent's memory holds at least the question and a reply.
    let memory = steps[0]["rollout/react_memory_length/mean"].as_f64().unwrap_or_default();
    assert!(memory >= 2.0, "{}", steps[0]);
    assert!(steps[0]["train/pg_loss"].is_number(), "{}", steps[0]);
    let experiences = experiences(dir.path());
    assert!(experiences.len() >= 4, "2 tasks × 2 runs, at least one reply each: {}", experiences.len());
    for exp in &experiences {
        // AgentScope's ReAct prompt renders the GSM8K template's system prompt and its `generate_response` tool.
        let prompt = exp["prompt_text"].as_str().unwrap_or_default();
        assert!(prompt.contains("specialized in solving math problems"), "{prompt:?}");
        assert!(prompt.contains("generate_response"), "{prompt:?}");
    }
}
