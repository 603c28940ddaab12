"""Generation throughput: transformers `generate()` and `trinity generate`, side by side, same model file,
prompts, batch, dtype and forced length.

    .deps/reference-venv/bin/python runtime/engine/bench/bench_generate.py \
        [--trinity target/release/trinity] [--gguf PATH] [--new-tokens 128] [--threads 2] [--repeat 3]

transformers: SmolLM2-135M-Instruct from the GGUF file, fp32, the 16 chat prompts of prompts.jsonl as one
left-padded batch of 16, greedy, exactly --new-tokens new tokens (min_new_tokens = max_new_tokens),
torch.set_num_threads(--threads). Reported: tokens/s of the `generate()` call (model loading excluded), the
median of --repeat calls on the loaded model.

trinity (when --trinity is given): `trinity generate` with the same prompts, batch size, greedy decoding, forced
length (--ignore-eos) and thread count, in fp32 and bf16, --repeat processes each. Reported, as medians:
- generation: tokens / the time from the first request to the last completion, as trinity prints it (the
  counterpart of transformers' `generate()` call: model loading excluded);
- whole process: tokens / process wall time, start-up and model loading included;
and both ratios to transformers' fp32 figure.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DEFAULT_GGUF = Path(os.environ.get("TRINITY_SMOLLM2_GGUF", ROOT / ".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
PROMPTS = HERE / "prompts.jsonl"


def bench_transformers(gguf: Path, new_tokens: int, threads: int, repeat: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    messages = [json.loads(line)["messages"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    rates = []
    for _ in range(repeat):
        with torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(
                **batch,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tok.pad_token_id,
            )
            elapsed = time.perf_counter() - start
        generated = (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]
        rates.append(generated / elapsed)
        print(f"transformers fp32: {generated} tokens in {elapsed:.2f} s = {rates[-1]:.1f} tok/s (generate() only)")
    rate = statistics.median(rates)
    print(f"transformers fp32 median: {rate:.1f} tok/s")
    return rate


def bench_trinity(binary: Path, gguf: Path, new_tokens: int, threads: int, dtype: str) -> tuple[float, float]:
    """One `trinity generate` process: (generation tok/s, whole-process tok/s)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.jsonl"
        cmd = [
            str(binary), "generate", "--model", str(gguf), "--input", str(PROMPTS), "--chat",
            "--temperature", "0", "--max-tokens", str(new_tokens), "--ignore-eos", "--batch-size", "16",
            "--threads", str(threads), "--dtype", dtype, "--device", "cpu", "--output", str(out),
        ]
        start = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if run.returncode != 0:
            raise SystemExit(f"trinity failed:\n{run.stderr}")
        generated = sum(len(c["tokens"]) for line in out.read_text().splitlines() for c in json.loads(line)["completions"])
    found = re.search(r"generation ([0-9.]+) s from the first request", run.stderr)
    if found is None:
        raise SystemExit(f"trinity printed no generation time:\n{run.stderr}")
    generation = generated / float(found.group(1))
    whole = generated / elapsed
    summary = " | ".join(l.strip() for l in run.stderr.splitlines() if l.startswith(("generate:", "  ")))
    print(f"trinity {dtype}: {generated} tokens, process {elapsed:.2f} s = {whole:.1f} tok/s whole process, "
          f"{generation:.1f} tok/s generation  [{summary}]")
    return generation, whole


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trinity", type=Path, help="the trinity binary; omit to run transformers only")
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration; medians are reported")
    args = p.parse_args()
    reference = bench_transformers(args.gguf, args.new_tokens, args.threads, args.repeat)
    if args.trinity:
        for dtype in ("f32", "bf16"):
            runs = [bench_trinity(args.trinity, args.gguf, args.new_tokens, args.threads, dtype) for _ in range(args.repeat)]
            generation = statistics.median(r[0] for r in runs)
            whole = statistics.median(r[1] for r in runs)
            print(f"  trinity {dtype} median: generation {generation:.1f} tok/s = {generation / reference:.2f}x, "
                  f"whole process {whole:.1f} tok/s = {whole / reference:.2f}x transformers fp32 generate()")


if __name__ == "__main__":
    main()
