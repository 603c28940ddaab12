//! Finds uPlot (the charting library the page draws curves with), which `cargo xtask setup` installs from npm into
//! the dependencies folder, and tells the crate where it is so `assets.rs` embeds it: the binary then serves the
//! whole page by itself.

use std::path::PathBuf;

/// The files of the `uplot` npm package the page loads.
const UPLOT_FILES: [&str; 2] = ["uPlot.iife.min.js", "uPlot.min.css"];

fn main() {
    println!("cargo:rerun-if-env-changed=TRINITY_DEPS_DIR");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let deps = std::env::var_os("TRINITY_DEPS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("..").join("..").join(".deps"));
    let dist = deps.join("npm").join("node_modules").join("uplot").join("dist");
    for file in UPLOT_FILES {
        let path = dist.join(file);
        println!("cargo:rerun-if-changed={}", path.display());
        if !path.is_file() {
            panic!(
                "trinity-studio embeds uPlot from npm, but {} is missing: run `cargo xtask setup` (it installs the \
                 studio's npm packages into {})",
                path.display(),
                deps.join("npm").display()
            );
        }
    }
    println!("cargo:rustc-env=TRINITY_STUDIO_UPLOT_DIR={}", dist.display());
}
