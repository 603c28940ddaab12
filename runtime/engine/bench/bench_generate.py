"""Generation throughput: `trinity generate` against llama.cpp's `llama-batched-bench` and transformers
`generate()`, side by side in one run, on the same weights, prompts, batch sizes and forced length.

    .deps/reference-venv/bin/python runtime/engine/bench/bench_generate.py --trinity target/release/trinity \
        --gguf-f32 SmolLM2.F32.gguf --gguf-bf16 SmolLM2.BF16.gguf [--llama-batched-bench PATH] \
        [--batch-sizes 1,4,16,64] [--prompt-tokens 48] [--new-tokens 128] [--threads 2] [--repeat 3] \
        [--no-transformers]

The work, for every batch size B and dtype (f32, bf16): B prompts of exactly --prompt-tokens tokens each (not
shared, no padding), each continued by exactly --new-tokens tokens (greedy, end-of-sequence ignored), on
--threads CPU threads. Each side reads the same GGUF file for a dtype. `cargo xtask bench generate` makes SmolLM2's
with llama.cpp's `llama-quantize` from the Q4_1 SmolLM2, so the values are the Q4_1 ones on both sides; with
`--shape qwen2.5-0.5b` or `qwen2.5-1.5b` it runs Qwen2.5's architecture with random weights instead
(runtime/model/bench/shape_gguf.py writes them, with SmolLM2's tokenizer).

- llama.cpp: `llama-batched-bench -npp P -ntg N -npl B... -t T -tb T`, one process per dtype, its defaults
  otherwise (it feeds token 0 as every prompt and every next token and samples nothing). Prompt tok/s is its
  S_PP (B*P / prefill time), decode tok/s its S_TG (B*N / the time of N decode steps of B sequences).
- trinity: one `trinity generate --batch-size B` process per point, the same B prompts; prompt and decode tok/s
  as the engine reports them (prefill tokens / prefill time; decode tokens / decode-step time, where the first
  new token comes out of the prefill, so N-1 decode steps). The decode steps include greedy sampling and the
  log-softmax of each chosen token, which llama-batched-bench does not do.
- transformers (f32 only; its bf16 matmuls are emulated on CPUs without native bf16 and would take most of the
  run): `generate()` of the same B prompts as one batch; prompt tok/s from a timed forward pass of the prompts,
  decode tok/s = B*(N-1) / (generate() time - that forward's time).

Every point runs --repeat times, in rounds that take llama.cpp and trinity in turn (transformers runs after the
rounds); the table shows medians, and the ratio trinity / llama.cpp of decode tok/s.
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
PROMPTS = HERE / "prompts.jsonl"
DTYPES = ("f32", "bf16")


def exact_prompts(tok, count: int, length: int) -> list[str]:
    """`count` different prompt texts of exactly `length` tokens each (checked by encoding them again).

    Prompt i strings prompts.jsonl's questions together, from question i mod 16 in steps of 1 + i div 16 (so
    no two prompts are the same), until it has enough tokens; it is cut at a token boundary, decoded, and kept
    only if it encodes back to `length` tokens, else a token is dropped or added until it does.
    """
    questions = [json.loads(l)["messages"][0]["content"] for l in PROMPTS.read_text().splitlines() if l.strip()]
    prompts = []
    for i in range(count):
        text = ""
        j, stride = i % len(questions), 1 + i // len(questions)
        while len(tok.encode(text, add_special_tokens=True)) < length + 8:
            text += questions[j % len(questions)] + " "
            j += stride
        ids = tok.encode(text, add_special_tokens=False)
        specials = len(tok.encode("", add_special_tokens=True))
        for take in range(length - specials, length - specials + 8):
            candidate = tok.decode(ids[:take])
            if len(tok.encode(candidate, add_special_tokens=True)) == length:
                prompts.append(candidate)
                break
        else:
            raise SystemExit(f"cannot cut prompt {i} to exactly {length} tokens")
    if len(set(prompts)) != len(prompts):
        raise SystemExit("two benchmark prompts are the same")
    return prompts


def bench_llama(binary: Path, gguf: Path, batches: list[int], prompt_tokens: int, new_tokens: int,
                threads: int) -> dict[int, tuple[float, float]]:
    """One llama-batched-bench process over every batch size: {B: (prompt tok/s, decode tok/s)}."""
    context = max(batches) * (prompt_tokens + new_tokens)
    cmd = [str(binary), "-m", str(gguf), "-c", str(context), "-npp", str(prompt_tokens), "-ntg", str(new_tokens),
           "-npl", ",".join(map(str, batches)), "-t", str(threads), "-tb", str(threads),
           "--output-format", "jsonl"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"llama-batched-bench failed ({' '.join(cmd)}):\n{run.stderr[-4000:]}")
    points = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            points[row["pl"]] = (row["speed_pp"], row["speed_tg"])
    missing = [b for b in batches if b not in points]
    if missing:
        raise SystemExit(f"llama-batched-bench printed no row for batch {missing}:\n{run.stdout}\n{run.stderr[-2000:]}")
    return points


def bench_trinity(binary: Path, gguf: Path, dtype: str, prompts: list[str], prompt_tokens: int, new_tokens: int,
                  threads: int) -> tuple[float, float, str]:
    """One `trinity generate` process: (prompt tok/s, decode tok/s, its decode-step summary)."""
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "prompts.jsonl"
        inputs.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        cmd = [
            str(binary), "generate", "--model", str(gguf), "--input", str(inputs), "--output", str(Path(tmp) / "out"),
            "--temperature", "0", "--max-tokens", str(new_tokens), "--ignore-eos", "--batch-size", str(len(prompts)),
            "--threads", str(threads), "--dtype", dtype, "--device", "cpu",
        ]
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"trinity failed ({' '.join(cmd)}):\n{run.stderr[-4000:]}")
    counts = re.search(r"generate: \d+ prompts \((\d+) tokens\), \d+ completions, (\d+) generated tokens", run.stderr)
    rates = re.search(r"prefill ([0-9.]+) tok/s \(([0-9.]+) s\), decode ([0-9.]+) tok/s \((([0-9.]+) s[^)]*)\)",
                      run.stderr)
    if counts is None or rates is None:
        raise SystemExit(f"trinity printed no throughput summary:\n{run.stderr[-4000:]}")
    b = len(prompts)
    if int(counts.group(1)) != b * prompt_tokens or int(counts.group(2)) != b * new_tokens:
        raise SystemExit(f"trinity did different work: {counts.group(0)}, expected {b} prompts of "
                         f"{prompt_tokens} tokens and {new_tokens} new tokens each")
    prefill = precise(float(rates.group(1)), b * prompt_tokens, float(rates.group(2)))
    decode = precise(float(rates.group(3)), b * (new_tokens - 1), float(rates.group(5)))
    return prefill, decode, rates.group(4)


def precise(rate: float, tokens: int, seconds: float) -> float:
    """trinity prints rates to 1 tok/s and times to 10 ms: whichever of the two says more."""
    if seconds > 0 and 0.005 / seconds < 0.5 / max(rate, 1e-9):
        return tokens / seconds
    return rate


def bench_transformers(model, tok, prompts: list[str], new_tokens: int) -> tuple[float, float]:
    """One `generate()` of the batch: (prompt tok/s, decode tok/s)."""
    import torch

    batch = tok(prompts, return_tensors="pt", add_special_tokens=True)
    with torch.inference_mode():
        start = time.perf_counter()
        model(**batch)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(**batch, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=tok.eos_token_id)
        total = time.perf_counter() - start
    rows, generated = out.shape[0], out.shape[1] - batch["input_ids"].shape[1]
    assert generated == new_tokens, f"transformers generated {generated} tokens, not {new_tokens}"
    return batch["input_ids"].numel() / prefill, rows * (generated - 1) / max(total - prefill, 1e-9)


def median_of(runs: list[tuple]) -> tuple:
    return tuple(statistics.median(r[i] for r in runs) for i in range(2))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trinity", type=Path, required=True)
    p.add_argument("--gguf-f32", type=Path, required=True, help="the model in F32 (both sides read it)")
    p.add_argument("--gguf-bf16", type=Path, required=True, help="the model in BF16 (both sides read it)")
    p.add_argument("--llama-batched-bench", type=Path, help="llama.cpp's llama-batched-bench; omit to skip llama.cpp")
    p.add_argument("--batch-sizes", default="1,4,16,64")
    p.add_argument("--prompt-tokens", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="runs per point; medians are reported")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers column")
    args = p.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    ggufs = {"f32": args.gguf_f32, "bf16": args.gguf_bf16}

    # transformers dequantizes a GGUF file behind a progress bar that would fill the log line by line.
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    torch.set_num_threads(args.threads)
    transformers_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(args.gguf_f32.parent, gguf_file=args.gguf_f32.name)
    prompts = exact_prompts(tok, max(batches), args.prompt_tokens)
    print(f"model: {args.gguf_f32.name} and {args.gguf_bf16.name}", flush=True)
    print(f"work: {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, batch {batches}, "
          f"{args.threads} threads, {args.repeat} run(s) per point", flush=True)

    # The engines take turns: each round runs llama.cpp (one process per dtype, every batch size) and then trinity
    # at every point, so a change of the machine's speed during the run weighs on both sides alike. Running every
    # llama.cpp repeat first had put them minutes apart: on a 2-core VM whose memory bandwidth drifts by 30% over
    # minutes, that alone moved the batch-1 bf16 ratio from 0.92x in one run to 1.02-1.12x run in turns.
    llama_runs = {(b, dtype): [] for dtype in DTYPES for b in batches}
    trinity_runs = {(b, dtype): [] for dtype in DTYPES for b in batches}
    for round_ in range(1, args.repeat + 1):
        for dtype in DTYPES:
            if args.llama_batched_bench:
                points = bench_llama(args.llama_batched_bench, ggufs[dtype], batches, args.prompt_tokens,
                                     args.new_tokens, args.threads)
                for b in batches:
                    llama_runs[b, dtype].append(points[b])
                    print(f"round {round_}: llama.cpp {dtype} batch {b}: prompt {points[b][0]:.1f} tok/s, "
                          f"decode {points[b][1]:.1f} tok/s", flush=True)
            for b in batches:
                run = bench_trinity(args.trinity, ggufs[dtype], dtype, prompts[:b], args.prompt_tokens,
                                    args.new_tokens, args.threads)
                trinity_runs[b, dtype].append(run)
                print(f"round {round_}: trinity {dtype} batch {b}: prompt {run[0]:.1f} tok/s, decode "
                      f"{run[1]:.1f} tok/s [{run[2]}]", flush=True)
    llama = {key: median_of(runs) for key, runs in llama_runs.items() if runs}
    trinity = {key: median_of(runs) for key, runs in trinity_runs.items()}
    transformers = {}
    if not args.no_transformers:
        model = AutoModelForCausalLM.from_pretrained(args.gguf_f32.parent, gguf_file=args.gguf_f32.name,
                                                     dtype=torch.float32).eval()
        for b in batches:
            runs = [bench_transformers(model, tok, prompts[:b], args.new_tokens) for _ in range(args.repeat)]
            transformers[b, "f32"] = median_of(runs)
            print(f"transformers f32 batch {b}: prompt {transformers[b, 'f32'][0]:.1f} tok/s, decode "
                  f"{transformers[b, 'f32'][1]:.1f} tok/s", flush=True)

    def cell(table, key, i):
        return f"{table[key][i]:.1f}" if key in table else "-"

    print()
    print("| batch | dtype | llama.cpp prompt tok/s | trinity prompt tok/s | llama.cpp decode tok/s "
          "| trinity decode tok/s | trinity / llama.cpp decode | transformers prompt tok/s "
          "| transformers decode tok/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dtype in DTYPES:
        for b in batches:
            key = (b, dtype)
            ratio = f"{trinity[key][1] / llama[key][1]:.2f}x" if key in llama else "-"
            print(f"| {b} | {dtype} | {cell(llama, key, 0)} | {cell(trinity, key, 0)} | {cell(llama, key, 1)} "
                  f"| {cell(trinity, key, 1)} | {ratio} | {cell(transformers, key, 0)} "
                  f"| {cell(transformers, key, 1)} |")


if __name__ == "__main__":
    main()
