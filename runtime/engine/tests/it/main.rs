//! Integration tests of the generation engine: tiny random models built here (fast, always run) and
//! SmolLM2-135M-Instruct when its GGUF file is present (skipped with a printed reason otherwise).

mod batching;
mod helpers;
mod limits;
mod logprobs;
mod seeds;
mod smollm2;
mod streaming;
