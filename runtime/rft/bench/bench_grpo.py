"""GRPO end to end, whole processes: trinity (`trinity run`, mode both) against TRL's GRPOTrainer doing the same
work, at bf16 mixed precision (both sides' default) and in fp32.

    .deps/trl-venv/bin/python runtime/rft/bench/bench_grpo.py --trinity target/release/trinity \
        [--gguf .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf] [--work-dir .deps/bench-grpo] [--steps 6] \
        [--threads 2] [--precision fp32 bf16] [--reward accuracy|equation]

`cargo xtask bench grpo` builds trinity, installs the TRL environment and runs this.

The work, identical on both sides:
- Model: SmolLM2-135M-Instruct. The GGUF file is converted once with `trinity convert` into a Hugging Face
  directory (fp32 safetensors, tokenizer, chat template) under --work-dir, and both sides load that directory.
- Tasks: the first 2 × --steps questions of examples/quickstart/train.jsonl (two-digit additions), so each step
  sees 2 new prompts, rendered with the model's chat template (user turn, no system prompt).
- Per step: 2 prompts × 4 samples = 8 completions of exactly 64 new tokens (sampling at temperature 1.0; EOS is
  held off until token 64), a reward (--reward, below), group-normalised advantages, one forward + backward over
  the 8 sequences and one AdamW step at lr 1e-6, constant schedule. No reference model and no KL term, one policy
  update per generation, no evaluation, no checkpoints.
- --reward accuracy (the default, the quickstart's reward): 1 when the expected answer appears in the completion.
  SmolLM2 rarely writes it in 64 sampled tokens, so most groups score all 0 and their advantages are all 0. The
  update is the same either way, but trinity runs such rows forward only (their gradient is 0) while TRL
  backpropagates them, so this reading is the end-to-end time of this work, not of a train step.
- --reward equation: +0.1 when the completion's first line contains "=", else -0.1 (trinity's built-in
  format_reward with reward_fn_args.pattern `^[^\n]*=`; Python's re.match with DOTALL | MULTILINE on TRL's side).
  About half of SmolLM2's completions do, so nearly every group has mixed rewards, every row of such a group has a
  non-zero advantage, and both sides backpropagate all of them: this reading times the train step as well.
- Threads: OMP_NUM_THREADS / MKL_NUM_THREADS = --threads for both processes, and torch.set_num_threads in TRL's.
- Timing: wall time of each whole process (interpreter or binary start-up, imports, model loading, all steps,
  exit), measured here with perf_counter around the subprocess. Per-step time: TRL's from a TrainerCallback
  (on_step_begin → on_step_end, which includes generation, since GRPOTrainer generates inside its training step);
  trinity's from metrics.jsonl (time/explore_s + time/train_s + time/sync_s of each step). Both are means over all
  steps; the difference between wall time and steps × per-step time is start-up and shutdown. CPU time (user +
  system of the whole process) is printed too: on a shared machine it is the figure other work disturbs least.

TRL (trl==1.16.0, transformers 5, torch 2.11 CPU build) as GRPOConfig:
    use_cpu=True, per_device_train_batch_size=8, num_generations=4, gradient_accumulation_steps=1,
    max_completion_length=64, generation_kwargs={"min_new_tokens": 64}, temperature=1.0, learning_rate=1e-6,
    lr_scheduler_type="constant", beta=0.0 (TRL's default: no reference model is loaded), num_iterations=1,
    loss_type="dapo" (TRL's default; token-mean aggregation like trinity's loss_agg_mode token-mean),
    max_steps=--steps, save_strategy="no", eval_strategy="no", report_to="none", logging_steps=1,
    gradient_checkpointing=False, seed=42;
    bf16 mixed precision: bf16=True. That is TRL's default on CPU too (base_config: `bf16 = not fp16` when unset)
    and, since GRPOTrainer loads the model in float32 unless model_init_kwargs says otherwise, it is autocast
    mixed precision: fp32 master weights and AdamW state, bf16 compute.
    fp32: bf16=False.
    gradient_checkpointing is TRL's default (True) turned off: trinity's own default
    (enable_gradient_checkpointing true) recomputes activations only when they would not fit in memory, which
    they do here, and recomputation would cost TRL about 20% of its backward for memory this model does not need.

trinity, a temporary YAML run with `trinity run --config`:
    mode both, algorithm_type grpo, repeat_times 4, buffer.batch_size 2, total_steps --steps, optimizer.lr 1e-6,
    kl_loss_fn none, rollout_args {temperature 1.0, max_tokens 64, min_tokens 64}, simple_workflow +
    accuracy_reward (or format_reward with reward_fn_args.pattern), model.max_response_tokens 64,
    max_model_len 128, eval_on_startup false and no eval tasksets,
    sync_method memory, sync_interval 1, trainer.save_interval 1000 (> total_steps) and save_hf_checkpoint never
    (trinity always writes its final checkpoint — optimizer state and metadata — which cannot be disabled),
    trainer.max_token_len_per_gpu 1024 (all 8 sequences in one micro-batch, as TRL's batch of 8), monitor jsonl.
    bf16 mixed precision: trainer.dtype auto (bf16 compute with fp32 master weights on CPUs with AVX512-BF16 or
    AMX, fp32 elsewhere) and explorer.rollout_model.dtype bfloat16 — both trinity's defaults.
    fp32: trainer.dtype float32 and explorer.rollout_model.dtype float32.
    A trinity build that does not know `trainer.dtype` yet runs without it (its trainer's built-in precision) and
    says so in the output.
"""

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DEFAULT_GGUF = Path(os.environ.get("TRINITY_SMOLLM2_GGUF", ROOT / ".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
TASKS = ROOT / "examples/quickstart/train.jsonl"

PROMPTS_PER_STEP = 2
SAMPLES_PER_PROMPT = 4
NEW_TOKENS = 64
LEARNING_RATE = 1e-6
# (label, TRL's bf16 flag, trinity's trainer.dtype, trinity's explorer.rollout_model.dtype)
PRECISIONS = {
    "bf16": ("bf16 mixed", True, "auto", "bfloat16"),
    "fp32": ("fp32", False, "float32", "float32"),
}
# What issue 20 asks of trinity: TRL wall time / trinity wall time at least this much.
TARGETS = {"bf16": 5.0, "fp32": 3.0}
# --reward equation: the first line of the completion contains "=". Rust's `regex` (trinity's format_reward,
# which anchors the match at the start) and Python's re.match read this pattern the same way.
EQUATION_PATTERN = r"^[^\n]*="
# --reward: (trinity's default_reward_fn_type, its reward_fn_args as YAML lines, what the header says)
REWARDS = {
    "accuracy": ("accuracy_reward", "", "1 when the answer appears"),
    "equation": ("format_reward", f"      reward_fn_args:\n        pattern: '{EQUATION_PATTERN}'\n",
                 "+0.1 when the first line contains '=', else -0.1"),
}


def thread_env(threads: int) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def timed(cmd: list, log: Path, env: dict) -> tuple:
    """Runs one whole process with its output in `log`; returns its wall time and CPU time (user + system, its
    children included), or exits with the log's tail.

    CPU time is printed beside wall time because the machines this runs on are often shared: other work stretches
    wall time, much less the CPU seconds a process itself burns."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("w") as out:
        start = time.perf_counter()
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise SystemExit(f"{cmd[0]} exited with {code}; the end of {log}:\n{tail}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def convert_model(trinity: Path, gguf: Path, work: Path) -> Path:
    """The GGUF as a Hugging Face directory, converted once; a half-written directory is never reused."""
    hf = work / f"{gguf.stem}-hf"
    marker = hf / ".converted"
    if marker.exists() and marker.read_text() == str(gguf.resolve()):
        return hf
    if hf.exists():
        shutil.rmtree(hf)
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(trinity), "convert", "--gguf", str(gguf), "--output", str(hf)], check=True,
                   stdout=subprocess.DEVNULL)
    marker.write_text(str(gguf.resolve()))
    return hf


def write_tasks(path: Path, steps: int) -> list:
    tasks = [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()][: steps * PROMPTS_PER_STEP]
    if len(tasks) < steps * PROMPTS_PER_STEP:
        raise SystemExit(f"{TASKS} has {len(tasks)} tasks; {steps} steps need {steps * PROMPTS_PER_STEP}")
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return tasks


# ---------------------------------------------------------------------------------------------------------------
# TRL side: this same file, run as `bench_grpo.py trl-worker ...` in its own process so its wall time is whole.


def trl_worker(args) -> None:
    start = time.perf_counter()
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tasks = [json.loads(line) for line in Path(args.tasks).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": t["question"]}], "answer": t["answer"]} for t in tasks]
    )

    def accuracy_reward(completions, answer, **_):
        return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]

    def equation_reward(completions, **_):
        flags = re.DOTALL | re.MULTILINE
        return [0.1 if re.match(EQUATION_PATTERN, c[0]["content"], flags) else -0.1 for c in completions]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin = 0.0
            self.steps = []
            self.lengths = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append(time.perf_counter() - self.begin)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(logs["completions/mean_length"])

    config = GRPOConfig(
        output_dir=args.output_dir,
        use_cpu=True,
        bf16=args.bf16,
        per_device_train_batch_size=PROMPTS_PER_STEP * SAMPLES_PER_PROMPT,
        num_generations=SAMPLES_PER_PROMPT,
        gradient_accumulation_steps=1,
        max_completion_length=NEW_TOKENS,
        generation_kwargs={"min_new_tokens": NEW_TOKENS},
        temperature=1.0,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        beta=0.0,
        num_iterations=1,
        max_steps=args.steps,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        logging_steps=1,
        gradient_checkpointing=False,
        seed=42,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=args.model, reward_funcs={"accuracy": accuracy_reward, "equation": equation_reward}[args.reward],
        args=config, train_dataset=dataset, callbacks=[timer]
    )
    trainer.train()
    result = {
        "steps": timer.steps,
        "mean_completion_length": timer.lengths,
        "bf16": config.bf16,
        "model_dtype": str(trainer.model.dtype),
        "in_process_s": time.perf_counter() - start,
    }
    Path(args.result).write_text(json.dumps(result))


def run_trl(model: Path, tasks: Path, run_dir: Path, steps: int, threads: int, bf16: bool, reward: str) -> dict:
    result = run_dir / "result.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "trl-worker", "--model", str(model), "--tasks", str(tasks),
           "--output-dir", str(run_dir / "out"), "--steps", str(steps), "--threads", str(threads),
           "--result", str(result), "--reward", reward] + (["--bf16"] if bf16 else [])
    wall, cpu = timed(cmd, run_dir / "trl.log", thread_env(threads))
    report = json.loads(result.read_text())
    report["wall"], report["cpu"] = wall, cpu
    return report


# ---------------------------------------------------------------------------------------------------------------
# trinity side.

TRINITY_CONFIG = """\
# Written by runtime/rft/bench/bench_grpo.py; see its docstring.
project: bench-grpo
name: {name}
checkpoint_root_dir: {checkpoints}
continue_from_checkpoint: false
mode: both
algorithm:
  algorithm_type: grpo
  repeat_times: {samples}
  optimizer:
    lr: {lr}
  kl_loss_fn: none
model:
  model_path: {model}
  max_response_tokens: {new_tokens}
  max_model_len: 128
buffer:
  batch_size: {prompts}
  total_steps: {steps}
  explorer_input:
    taskset:
      name: addition
      path: {tasks}
      format:
        prompt_key: question
        response_key: answer
      rollout_args:
        temperature: 1.0
        max_tokens: {new_tokens}
        min_tokens: {new_tokens}
{reward_fn_args}    default_workflow_type: simple_workflow
    default_reward_fn_type: {reward_fn}
explorer:
  eval_on_startup: false
  rollout_model:
    dtype: {rollout_dtype}
synchronizer:
  sync_method: memory
  sync_interval: 1
trainer:
  save_interval: 1000
  save_hf_checkpoint: never
  max_token_len_per_gpu: 1024
{trainer_dtype}monitor:
  monitor_type: jsonl
"""


def trinity_config(run_dir: Path, model: Path, tasks: Path, steps: int, name: str, rollout_dtype: str,
                   trainer_dtype, reward: str) -> str:
    reward_fn, reward_fn_args, _ = REWARDS[reward]
    return TRINITY_CONFIG.format(
        reward_fn=reward_fn, reward_fn_args=reward_fn_args,
        name=name, checkpoints=run_dir / "checkpoints", samples=SAMPLES_PER_PROMPT, lr=LEARNING_RATE, model=model,
        new_tokens=NEW_TOKENS, prompts=PROMPTS_PER_STEP, steps=steps, tasks=tasks, rollout_dtype=rollout_dtype,
        trainer_dtype=f"  dtype: {trainer_dtype}\n" if trainer_dtype else "",
    )


def trinity_knows_trainer_dtype(trinity: Path, config: Path) -> bool:
    """Whether this trinity build accepts `trainer.dtype` (checked with --dry-run, which loads nothing)."""
    check = subprocess.run([str(trinity), "run", "--config", str(config), "--dry-run"], capture_output=True, text=True)
    if check.returncode == 0:
        return True
    if "unknown key `trainer.dtype`" in check.stderr:
        return False
    raise SystemExit(f"trinity rejects the bench config {config}:\n{check.stderr}")


def run_trinity(trinity: Path, model: Path, tasks: Path, run_dir: Path, steps: int, threads: int, precision: str,
                reward: str):
    _, _, trainer_dtype, rollout_dtype = PRECISIONS[precision]
    name = f"trinity-{precision}"
    config = run_dir / "trinity.yaml"
    config.write_text(trinity_config(run_dir, model, tasks, steps, name, rollout_dtype, trainer_dtype, reward))
    note = ""
    if not trinity_knows_trainer_dtype(trinity, config):
        config.write_text(trinity_config(run_dir, model, tasks, steps, name, rollout_dtype, None, reward))
        note = f"this trinity build does not accept trainer.dtype yet: trainer at its built-in precision, " \
               f"rollout engine {rollout_dtype}"
    wall, cpu = timed([str(trinity), "run", "--config", str(config)], run_dir / "trinity.log", thread_env(threads))
    # The run directory is `<project>/<name>` on a fresh checkpoint root; take whichever run wrote metrics.
    found = sorted((run_dir / "checkpoints" / "bench-grpo").glob("*/monitor/metrics.jsonl"))
    if not found:
        raise SystemExit(f"trinity wrote no metrics under {run_dir / 'checkpoints'}; see {run_dir / 'trinity.log'}")
    metrics = found[-1]
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if "time/train_s" in row]
    return {
        "wall": wall,
        "cpu": cpu,
        "steps": [row.get("time/explore_s", 0) + row["time/train_s"] + row.get("time/sync_s", 0) for row in rows],
        "train": [row["time/train_s"] for row in rows],
        "mean_completion_length": [row.get("rollout/response_length_mean") for row in rows],
        # Rows whose advantages were all 0 (a group with equal rewards) run forward only: their gradient is 0.
        "forward_only_rows": sum(row.get("train/perf/forward_only_rows", 0) for row in rows),
        "rows": sum(row.get("train/perf/rows", 0) for row in rows),
        "note": note,
    }


# ---------------------------------------------------------------------------------------------------------------


def fmt_lengths(lengths) -> str:
    known = [x for x in lengths if x is not None]
    return f"{min(known):.0f}-{max(known):.0f}" if known else "?"


def bench(args) -> None:
    work = args.work_dir.resolve()
    model = convert_model(args.trinity, args.gguf, work)
    runs = work / "runs"
    if runs.exists():
        shutil.rmtree(runs)
    runs.mkdir(parents=True)
    tasks = runs / "tasks.jsonl"
    write_tasks(tasks, args.steps)
    print(f"bench grpo: SmolLM2-135M-Instruct, {args.steps} steps of {PROMPTS_PER_STEP} prompts x "
          f"{SAMPLES_PER_PROMPT} samples x {NEW_TOKENS} forced tokens, lr {LEARNING_RATE}, no reference model, "
          f"{args.threads} threads, whole processes; reward: {REWARDS[args.reward][2]}", flush=True)
    summary = []
    for precision in args.precision:
        label, bf16, _, _ = PRECISIONS[precision]
        trl_dir, trinity_dir = runs / f"trl-{precision}", runs / f"trinity-{precision}"
        trl_dir.mkdir()
        trinity_dir.mkdir()
        trl = run_trl(model, tasks, trl_dir, args.steps, args.threads, bf16, args.reward)
        trl_step = sum(trl["steps"]) / len(trl["steps"])
        print(f"  {label:<10}  TRL      wall {trl['wall']:7.1f} s   per step {trl_step:6.2f} s   cpu {trl['cpu']:7.1f} s   "
              f"(completion lengths {fmt_lengths(trl['mean_completion_length'])}, bf16={trl['bf16']}, "
              f"weights {trl['model_dtype']})", flush=True)
        ours = run_trinity(args.trinity, model, tasks, trinity_dir, args.steps, args.threads, precision, args.reward)
        our_step = sum(ours["steps"]) / len(ours["steps"])
        our_train = sum(ours["train"]) / len(ours["train"])
        print(f"  {label:<10}  trinity  wall {ours['wall']:7.1f} s   per step {our_step:6.2f} s   cpu {ours['cpu']:7.1f} s   "
              f"(train {our_train:.2f} s a step; completion lengths {fmt_lengths(ours['mean_completion_length'])}; "
              f"{ours['forward_only_rows']:.0f} of {ours['rows']:.0f} rows had all-zero advantages and ran forward only, "
              f"which TRL backpropagates)", flush=True)
        if ours["note"]:
            print(f"  {'':<10}  note: {ours['note']}", flush=True)
        ratio, step_ratio, cpu_ratio = trl["wall"] / ours["wall"], trl_step / our_step, trl["cpu"] / ours["cpu"]
        target = TARGETS[precision]
        verdict = "meets" if ratio >= target else "MISSES"
        print(f"  {label:<10}  TRL / trinity: wall {ratio:.2f}x, per step {step_ratio:.2f}x, cpu {cpu_ratio:.2f}x "
              f"({verdict} the >= {target}x wall-time target)", flush=True)
        summary.append((label, trl["wall"], trl_step, ours["wall"], our_step, ratio, cpu_ratio))
    print("\nprecision   TRL wall  TRL/step  trinity wall  trinity/step  wall ratio  step ratio  cpu ratio")
    for label, trl_wall, trl_step, our_wall, our_step, ratio, cpu_ratio in summary:
        print(f"{label:<10}  {trl_wall:7.1f}s  {trl_step:7.2f}s  {our_wall:11.1f}s  {our_step:11.2f}s  {ratio:9.2f}x  "
              f"{trl_step / our_step:9.2f}x  {cpu_ratio:8.2f}x")
    print(f"logs and configs: {runs}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    worker = sub.add_parser("trl-worker", help="internal: one TRL GRPOTrainer run")
    worker.add_argument("--model", required=True)
    worker.add_argument("--tasks", required=True)
    worker.add_argument("--output-dir", required=True)
    worker.add_argument("--result", required=True)
    worker.add_argument("--steps", type=int, required=True)
    worker.add_argument("--threads", type=int, required=True)
    worker.add_argument("--bf16", action="store_true")
    worker.add_argument("--reward", choices=sorted(REWARDS), required=True)
    p.add_argument("--trinity", type=Path, default=ROOT / "target/release/trinity")
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    p.add_argument("--work-dir", type=Path, default=ROOT / ".deps/bench-grpo",
                   help="where the converted model is kept and each run's logs, configs and metrics are written")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", nargs="+", choices=sorted(PRECISIONS), default=["fp32", "bf16"],
                   help="precisions, run in this order; fp32 comes first by default because on CPUs without "
                        "native bf16 TRL's bf16 autocast is emulated and can take ten times as long, and a run cut "
                        "short should still leave the fp32 figure")
    p.add_argument("--reward", choices=sorted(REWARDS), default="accuracy",
                   help="accuracy: the quickstart's reward, under which most rows have zero advantages; equation: "
                        "a format reward under which nearly every row trains on both sides (see the docstring)")
    args = p.parse_args()
    if args.command == "trl-worker":
        trl_worker(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
