"""PyTorch eager reference for examples/bench_train.rs: the same computation with transformers.

Forward + backward + log-softmax gather over every next-token position of SmolLM2-135M (or the Qwen2.5-shaped
model `cargo xtask bench train --shape` writes), 8 x 164 random tokens, loss = -mean(logprob), no optimizer step;
fp32 and bf16 autocast (torch.autocast("cpu", torch.bfloat16)).

    python runtime/trainer/bench/bench_train.py [--model FILE.gguf] [--dtype f32|bf16|both]
        [--batch 8] [--seq 164] [--iters 3] [--threads 2] [--recompute]

--recompute turns on transformers' gradient checkpointing (each decoder layer recomputed in the backward), the
counterpart of bench_train.rs's --recompute.

The model defaults to $TRINITY_SMOLLM2_GGUF; transformers dequantizes the GGUF file to fp32.
"""

import argparse
import os
import time

# transformers dequantizes a GGUF file behind a progress bar that would fill the log line by line.
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def run(model, dtype, batch, seq, iters):
    torch.manual_seed(0)
    ids = torch.randint(model.config.vocab_size, (batch, seq))
    times = []
    cpu_start = 0.0
    for i in range(iters + 1):
        if i == 1:
            cpu_start = time.process_time()
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(input_ids=ids).logits
        logp = logits[:, :-1].float().log_softmax(-1)
        picked = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        loss = -picked.mean()
        loss.backward()
        secs = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        del logits, logp, picked
        if i > 0:
            times.append(secs)
        else:
            print(f"warm-up {secs:.2f} s (loss {loss.item():.4f})", flush=True)
    cpu = (time.process_time() - cpu_start) / iters
    best, mean = min(times), sum(times) / len(times)
    tokens = batch * seq
    name = "fp32" if dtype == "f32" else "bf16 autocast"
    if model.is_gradient_checkpointing:
        name += " [layers recomputed]"
    print(
        f"pytorch {name} {batch}x{seq} tokens: best {best:.2f} s, mean {mean:.2f} s -> "
        f"{tokens / best:.0f} tokens/s (best), {tokens / mean:.0f} tokens/s (mean); cpu {cpu:.2f} s/iter",
        flush=True,
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=os.environ.get("TRINITY_SMOLLM2_GGUF", ""))
    p.add_argument("--dtype", default="both", choices=["f32", "bf16", "both"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=164)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--recompute", action="store_true")
    a = p.parse_args()
    if not a.model:
        raise SystemExit("no model: pass --model FILE or set TRINITY_SMOLLM2_GGUF")
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(a.model) or ".", gguf_file=os.path.basename(a.model), dtype=torch.float32
    )
    model.train()
    if a.recompute:
        model.gradient_checkpointing_enable()
    for dtype in ["f32", "bf16"] if a.dtype == "both" else [a.dtype]:
        run(model, dtype, a.batch, a.seq, a.iters)


if __name__ == "__main__":
    main()
