"""Writes a GGUF model with the architecture of Qwen2.5-0.5B or Qwen2.5-1.5B and random weights, in F32 and BF16,
for the speed benchmarks (`cargo xtask bench generate --shape ...`, `cargo xtask bench train --shape ...`).

    .deps/reference-venv/bin/python runtime/model/bench/shape_gguf.py --shape qwen2.5-0.5b \
        --tokenizer-from SmolLM2-135M-Instruct.BF16.gguf --out-dir DIR

Why random weights: speed and memory depend on the shapes, not on what the weights learned, and the trained
Qwen2.5 checkpoints cannot be downloaded here (only package registries are reachable). The shapes are the
`config.json` values Qwen publishes (architecture only; `bench_lora_memory.rs` uses the same table), including
Qwen2's q/k/v biases, 2 KV heads, tied embeddings and the 151,936-row embedding.

Why GGUF: every side of the benchmarks reads it. llama.cpp only reads GGUF; transformers dequantizes it
(`from_pretrained(dir, gguf_file=...)`); trinity loads it directly. Both files hold the same model: the weights are
drawn once in fp32, rounded to bf16, and the F32 file stores those bf16 values exactly.

The tokenizer is SmolLM2's (copied from --tokenizer-from), its 49,152 tokens padded to the model's 151,936 rows
with unused `[PADn]` entries as llama.cpp's own converter pads a vocabulary shorter than the embedding. Prompts
are cut to an exact token count either way, so the tokenizer changes which text is read, not how much work it is.

Weights: matrices and embeddings normal with standard deviation 0.02 (transformers' `initializer_range`), biases
normal with 0.02, norms 1. Seeded, so a rebuild writes the same files.
"""

import argparse
from pathlib import Path

import gguf
import numpy as np

# Qwen's published config.json values (architecture only).
SHAPES = {
    "qwen2.5-0.5b": dict(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, context=32768),
    "qwen2.5-1.5b": dict(hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2, context=131072),
}
VOCAB = 151936
ROPE_THETA = 1000000.0
RMS_EPS = 1e-6
UNUSED = 5  # llama.cpp's token type for padding entries (gguf.TokenType.UNUSED)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, rounded to nearest even (the rounding torch uses)."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def copy_tokenizer(writer: gguf.GGUFWriter, source: Path) -> None:
    reader = gguf.GGUFReader(source)

    def field(name):
        f = reader.fields.get(name)
        if f is None:
            raise SystemExit(f"{source}: no {name}")
        return f.contents()

    tokens = list(field("tokenizer.ggml.tokens"))
    types = list(field("tokenizer.ggml.token_type"))
    if len(tokens) > VOCAB:
        raise SystemExit(f"{source}: {len(tokens)} tokens do not fit the {VOCAB}-row embedding")
    tokens += [f"[PAD{i}]" for i in range(len(tokens), VOCAB)]
    types += [UNUSED] * (VOCAB - len(types))
    writer.add_tokenizer_model(field("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(field("tokenizer.ggml.merges")))
    writer.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
    writer.add_pad_token_id(field("tokenizer.ggml.padding_token_id"))
    writer.add_add_bos_token(bool(field("tokenizer.ggml.add_bos_token")))
    writer.add_chat_template(field("tokenizer.chat_template"))


def tensors(shape: dict, seed: int):
    """(GGUF name, fp32 array in GGUF's [rows, cols] order, whether it is 1-D) for every weight, drawn in a fixed
    order."""
    rng = np.random.default_rng(seed)
    h, f, d = shape["hidden"], shape["intermediate"], shape["hidden"] // shape["heads"]
    kv = shape["kv_heads"] * d

    def normal(*dims):
        return rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)

    yield "token_embd.weight", normal(VOCAB, h), False
    for i in range(shape["layers"]):
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", np.ones(h, np.float32), True
        yield f"{b}.attn_q.weight", normal(h, h), False
        yield f"{b}.attn_q.bias", normal(h), True
        yield f"{b}.attn_k.weight", normal(kv, h), False
        yield f"{b}.attn_k.bias", normal(kv), True
        yield f"{b}.attn_v.weight", normal(kv, h), False
        yield f"{b}.attn_v.bias", normal(kv), True
        yield f"{b}.attn_output.weight", normal(h, h), False
        yield f"{b}.ffn_norm.weight", np.ones(h, np.float32), True
        yield f"{b}.ffn_gate.weight", normal(f, h), False
        yield f"{b}.ffn_up.weight", normal(f, h), False
        yield f"{b}.ffn_down.weight", normal(h, f), False
    yield "output_norm.weight", np.ones(h, np.float32), True


def write(name: str, shape: dict, dtype: str, tokenizer: Path, path: Path, seed: int) -> None:
    tmp = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(tmp, "qwen2")
    writer.add_name(f"{name} shape, random weights")
    writer.add_context_length(shape["context"])
    writer.add_embedding_length(shape["hidden"])
    writer.add_feed_forward_length(shape["intermediate"])
    writer.add_block_count(shape["layers"])
    writer.add_head_count(shape["heads"])
    writer.add_head_count_kv(shape["kv_heads"])
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_BF16)
    copy_tokenizer(writer, tokenizer)
    for tensor_name, values, one_d in tensors(shape, seed):
        if one_d:
            # Norms and biases stay fp32 in both files, as llama.cpp's converter keeps 1-D tensors.
            writer.add_tensor(tensor_name, values)
        elif dtype == "f32":
            writer.add_tensor(tensor_name, bf16_to_f32(bf16_bits(values)))
        else:
            writer.add_tensor(tensor_name, bf16_bits(values), raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--tokenizer-from", type=Path, required=True, help="a GGUF file whose tokenizer to copy")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for dtype, suffix in (("f32", "F32"), ("bf16", "BF16")):
        path = args.out_dir / f"{args.shape}-random.{suffix}.gguf"
        write(args.shape, SHAPES[args.shape], dtype, args.tokenizer_from, path, args.seed)
        print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB)", flush=True)


if __name__ == "__main__":
    main()
