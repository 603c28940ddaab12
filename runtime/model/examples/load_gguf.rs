//! Measures how long loading a GGUF model takes and how much memory it needs, next to the fp32 model size.
//!
//! `cargo run --release -p trinity-model --example load_gguf -- [FILE.gguf]` (default: SmolLM2 under `.deps/`).
//! Run it under `/usr/bin/time -v` for the peak resident set size.

use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args_os().nth(1).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    let start = Instant::now();
    let model = trinity_model::load_model(&path, tch::Kind::Float, tch::Device::Cpu)?;
    let load_s = start.elapsed().as_secs_f64();
    let params: i64 = model.decoder.named_parameters()?.iter().map(|(_, t)| t.numel() as i64).sum();
    let fp32_mb = params as f64 * 4.0 / 1e6;
    println!("loaded {} in {load_s:.3} s (reference: 2 s budget)", path.display());
    println!("parameters: {params} ({fp32_mb:.1} MB as fp32; peak RSS budget 2x = {:.1} MB)", 2.0 * fp32_mb);
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        for line in status.lines().filter(|l| l.starts_with("VmHWM") || l.starts_with("VmRSS")) {
            println!("{line}");
        }
    }
    let start = Instant::now();
    let ids = model.tokenizer.encode("The capital of France is", false)?;
    let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();
    let input = tch::Tensor::from_slice(&ids).view([1, -1]);
    let logits = tch::no_grad(|| model.decoder.forward(&input, None))?;
    println!(
        "first forward ({} tokens): {:.3} s, logits {:?}",
        ids.len(),
        start.elapsed().as_secs_f64(),
        logits.size()
    );
    Ok(())
}
