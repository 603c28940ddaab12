//! Integration tests of trinity-model against transformers-made fixtures (see `../fixtures/make_fixtures.py`).

mod crafted;
mod errors;
mod families;
mod fuzz_regressions;
mod gguf_files;
mod helpers;
mod hf_dirs;
mod moe;
mod qwen2_5_vl;
mod smollm2;
