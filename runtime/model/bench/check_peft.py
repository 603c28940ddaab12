"""Loads a trinity LoRA adapter with Python's peft and checks it against trinity's own merge.

`cargo xtask bench lora` runs it with: --base, an HF directory trinity wrote (`trinity convert --gguf`); --adapter,
a LoRA run's `global_step_N/lora_adapter`; --merged, `trinity convert --adapter` of that adapter onto --base.

It loads the base with transformers, attaches the adapter with `PeftModel.from_pretrained` (PEFT's own names and
config, nothing renamed), and compares logits on random token ids: peft's adapted model against trinity's merged
directory (they must agree), and against the base with the adapter disabled (they must differ, or the adapter was
all zeros and the check proves nothing). Exit status 1 when peft loads fewer adapters than the file holds or the
logits disagree.
"""

import argparse
import json
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True)
    p.add_argument("--adapter", required=True)
    p.add_argument("--merged", required=True)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    config = json.load(open(f"{args.adapter}/adapter_config.json"))
    tensors = load_file(f"{args.adapter}/adapter_model.safetensors")
    in_file = sum(1 for name in tensors if name.endswith("lora_A.weight"))

    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, args.adapter)
    model.eval()
    loaded = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A]
    # Every tensor in the file must have landed in a module, with the file's values.
    state = model.state_dict()
    mismatched = 0
    for name, value in tensors.items():
        key = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        if key not in state or not torch.equal(state[key].to(value.dtype), value):
            mismatched += 1

    ids = torch.randint(0, base.config.vocab_size, (2, 32))
    with torch.no_grad():
        peft_logits = model(ids).logits
        with model.disable_adapter():
            base_logits = model(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(args.merged, dtype=torch.float32)
        trinity_logits = merged(ids).logits
    diff = (peft_logits - trinity_logits).abs().max().item()
    effect = (peft_logits - base_logits).abs().max().item()

    print(f"peft {__import__('peft').__version__}: adapter r={config['r']} lora_alpha={config['lora_alpha']} "
          f"target_modules={config['target_modules']}")
    print(f"  LoRA modules: {in_file} in the file, {len(loaded)} loaded by PeftModel.from_pretrained, "
          f"{mismatched} tensors missing or different")
    print(f"  logits, peft adapted vs trinity merged: max |diff| {diff:.2e}")
    print(f"  logits, peft adapted vs base (adapter's effect): max |diff| {effect:.2e}")
    ok = in_file > 0 and len(loaded) == in_file and mismatched == 0 and diff < 1e-3 and effect > 10 * diff
    print("  PASS" if ok else "  FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
