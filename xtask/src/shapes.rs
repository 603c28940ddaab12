//! The models the speed benchmarks run: SmolLM2-135M (trained weights, the default) or a model at the shape of
//! Qwen2.5-0.5B or Qwen2.5-1.5B with random weights, which Trinity-RFT users train and the 135M model says little
//! about (a 151,936-row head, 2 KV heads, q/k/v biases, 0.5–1.5 billion weights).
//!
//! The Qwen-shaped files are written on first use by `runtime/model/bench/shape_gguf.py` with the reference
//! environment's `gguf` package, into `<deps>/models/shapes/`, F32 and BF16 with the same values (its docstring
//! says why random weights and why GGUF). A marker written last makes the second run instant and an interrupted
//! one start over.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use clap::ValueEnum;

use crate::setup::Deps;
use crate::{run, step};

/// Which model a benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Shape {
    /// SmolLM2-135M-Instruct, the trained model every test uses.
    #[value(name = "smollm2-135m")]
    Smollm2,
    /// Qwen2.5-0.5B's architecture (494M weights), random weights.
    #[value(name = "qwen2.5-0.5b")]
    Qwen05,
    /// Qwen2.5-1.5B's architecture (1.54B weights), random weights.
    #[value(name = "qwen2.5-1.5b")]
    Qwen15,
}

impl Shape {
    /// The name `shape_gguf.py` takes and the files carry; None for SmolLM2, whose files come from elsewhere.
    fn qwen_name(self) -> Option<&'static str> {
        match self {
            Shape::Smollm2 => None,
            Shape::Qwen05 => Some("qwen2.5-0.5b"),
            Shape::Qwen15 => Some("qwen2.5-1.5b"),
        }
    }
}

/// The `ty` GGUF file (`F32` or `BF16`, as llama.cpp spells it) of a Qwen shape, with both written first unless
/// the marker says they were; `None` for SmolLM2, whose files the caller picks (`Deps::smollm2_gguf`,
/// `LlamaCpp::model`).
pub(crate) fn qwen_gguf(
    root: &Path,
    deps: &Deps,
    reference_python: &Path,
    shape: Shape,
    ty: &str,
) -> Result<Option<PathBuf>> {
    let Some(name) = shape.qwen_name() else {
        return Ok(None);
    };
    let dir = deps.dir().join("models").join("shapes");
    let marker = dir.join(format!(".written-{name}"));
    if !marker.exists() {
        step(&format!("setup: {name}-shaped model with random weights (F32 and BF16 GGUF)"), || {
            run(Command::new(reference_python)
                .arg(root.join("runtime/model/bench/shape_gguf.py"))
                .args(["--shape", name, "--tokenizer-from"])
                .arg(deps.smollm2_gguf())
                .arg("--out-dir")
                .arg(&dir))?;
            std::fs::write(&marker, name)?;
            Ok(())
        })?;
    }
    Ok(Some(dir.join(format!("{name}-random.{ty}.gguf"))))
}
