//! Building the plugins the tests load.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const PACKAGES: [&str; 4] = ["gsm8k_reward", "frozen_lake", "zero_variance_filter", "hostile_reward"];

/// The `.wasm` file of one of [`PACKAGES`], built (once per test binary) into this target's tmp directory.
pub fn wasm(package: &str) -> PathBuf {
    static BUILT: OnceLock<Result<Vec<PathBuf>, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-plugins");
        trinity_plugin::build::build_plugins(&workspace, &PACKAGES, &target)
    });
    let paths = built.as_ref().unwrap_or_else(|error| panic!("{error}"));
    let index = PACKAGES.iter().position(|p| *p == package).unwrap_or_else(|| panic!("unknown fixture {package}"));
    paths[index].clone()
}
