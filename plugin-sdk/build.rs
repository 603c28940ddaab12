//! Build facts the SDK embeds.
//!
//! `algorithm` feature: the version of the libtorch that torch-sys compiled tch's C++ glue against
//! (`TRINITY_LIBTORCH_VERSION`), so a host can refuse a library whose tensor glue was built for another libtorch;
//! and libtorch's `lib/` as a run path for the SDK's own tests.
use std::path::Path;

fn main() {
    if std::env::var_os("CARGO_FEATURE_ALGORITHM").is_some() {
        algorithm();
    }
}

fn algorithm() {
    // torch-sys declares `links = "tch"` and prints `cargo:libtorch_lib=DIR`, which reaches us as this variable.
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let version = match std::env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(lib) => {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
            libtorch_version(Path::new(&lib).parent().unwrap_or(Path::new(&lib)))
        }
        Err(_) => None,
    };
    // "unknown" never equals a real version, so a library built this way is refused rather than trusted.
    println!("cargo:rustc-env=TRINITY_LIBTORCH_VERSION={}", version.as_deref().unwrap_or("unknown"));
}

/// The libtorch release under `root`: the `build-version` file of libtorch archives, the `__version__` of a
/// PyPI wheel's `version.py`, or the numbers of `torch/headeronly/version.h`.
fn libtorch_version(root: &Path) -> Option<String> {
    let build_version = root.join("build-version");
    let version_py = root.join("version.py");
    let header = root.join("include/torch/headeronly/version.h");
    // Only files that exist are watched: cargo counts a watched path that is missing as changed, so naming all
    // three (a libtorch has one or two of them) reran this script, and rebuilt every crate above the SDK, on every
    // build. A libtorch swapped for another at a new path arrives through DEP_TCH_LIBTORCH_LIB instead.
    for file in [&build_version, &version_py, &header] {
        if file.exists() {
            println!("cargo:rerun-if-changed={}", file.display());
        }
    }
    if let Ok(text) = std::fs::read_to_string(&build_version) {
        return text.lines().next().map(|l| l.trim().to_owned()).filter(|l| !l.is_empty());
    }
    if let Ok(text) = std::fs::read_to_string(&version_py) {
        let line = text.lines().find(|l| l.starts_with("__version__"))?;
        return line.split(['\'', '"']).nth(1).map(str::to_owned);
    }
    let text = std::fs::read_to_string(&header).ok()?;
    let number = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(&format!("#define {name} ")).map(|v| v.trim().to_owned()))
    };
    Some(format!(
        "{}.{}.{}",
        number("TORCH_VERSION_MAJOR")?,
        number("TORCH_VERSION_MINOR")?,
        number("TORCH_VERSION_PATCH")?
    ))
}
