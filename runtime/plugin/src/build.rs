//! Building plugin crates into `.wasm` components with cargo, for tests and tools that need real plugins.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `packages` (workspace members) with `cargo build --target wasm32-wasip2 --release` into
/// `target_dir`, and returns each package's `.wasm` path in order.
///
/// A separate target directory keeps this nested cargo from waiting on the lock of the build that runs it.
pub fn build_plugins(workspace: &Path, packages: &[&str], target_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(workspace).args(["build", "--quiet", "--release", "--target", "wasm32-wasip2", "--target-dir"]);
    command.arg(target_dir);
    for package in packages {
        command.args(["-p", package]);
    }
    // Flags meant for the outer (host) build must not leak into the guests'.
    command.env_remove("RUSTFLAGS").env_remove("CARGO_ENCODED_RUSTFLAGS").env_remove("CARGO_BUILD_TARGET");
    let output = command.output().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "building {} for wasm32-wasip2 failed (is the target installed? `rustup target add wasm32-wasip2`):\n{}",
            packages.join(", "),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(packages
        .iter()
        .map(|package| target_dir.join("wasm32-wasip2/release").join(format!("{package}.wasm")))
        .collect())
}
