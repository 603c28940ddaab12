//! Integration tests of the generation engine: tiny random models built here and SmolLM2-135M-Instruct, which
//! `cargo xtask setup` installs (its tests fail, saying so, when the file is missing).

mod batching;
mod constraint;
mod helpers;
mod limits;
mod logprobs;
mod routing;
mod seeds;
mod smollm2;
mod streaming;
