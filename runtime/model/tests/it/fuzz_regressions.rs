//! Every input that failed a fuzz target's checks, kept under `fuzz/regressions/<target>/`, replayed through the very
//! function the target runs (`fuzz/src/lib.rs`, included below). The unit test next to each fix asserts the
//! error its input now gets. Targets with no kept input (gguf, safetensors_header, chat_template) have not
//! crashed yet; when one does, its input goes under `fuzz/regressions/<target>/` and a replay test here.

use std::path::{Path, PathBuf};

// The functions of the targets that have not failed yet have no replay test.
#[allow(dead_code)]
#[path = "../../../../fuzz/src/lib.rs"]
mod exercise;

fn regressions(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions").join(target)
}

/// The kept inputs of one target, sorted.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = regressions(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    assert!(!paths.is_empty(), "{} holds no input", dir.display());
    paths.sort();
    paths.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

/// Replays every kept input of `target`, naming the one that fails.
fn replay(target: &str, run: fn(&[u8])) {
    for (path, bytes) in inputs(target) {
        let outcome = std::panic::catch_unwind(|| run(&bytes));
        assert!(outcome.is_ok(), "{} fails again", path.display());
    }
}

#[test]
fn hf_config_inputs_that_failed_are_read_cleanly() {
    replay("hf_config", exercise::hf_config);
}

#[test]
fn tokenizer_inputs_that_crashed_are_refused_cleanly() {
    replay("tokenizer", exercise::tokenizer);
}
