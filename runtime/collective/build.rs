//! Compiles the C++ shim (csrc/collective.cpp) against the headers of the libtorch that torch-sys links, and
//! embeds libtorch's library folder as a run path.
//!
//! Flags a CMake user would get from Caffe2Targets.cmake: C++17, the C++11 string ABI (PyPI's torch; ABI 0 fails
//! to link `createDeviceForHostname`), `USE_DISTRIBUTED` and `USE_C10D_GLOO` so the c10d headers declare the
//! Gloo process group, and both `include/` and `include/torch/csrc/api/include`. The gloo headers are not in the
//! wheel: Debian's `libgloo-dev` puts them in /usr/include (`cargo xtask setup` installs it); `GLOO_INCLUDE_DIR`
//! points elsewhere.
//!
//! Feature `nccl` adds `TRINITY_NCCL`, `USE_C10D_NCCL` and `USE_CUDA`, links `torch_cuda c10_cuda`, and needs the
//! CUDA runtime and NCCL headers in `CUDA_INCLUDE_DIRS` (colon-separated; `cargo xtask setup --cuda` prints it).
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/collective.cpp");
    for var in ["LIBTORCH", "GLOO_INCLUDE_DIR", "CUDA_INCLUDE_DIRS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    // torch-sys prints `cargo:libtorch_lib=…` (links = "tch"); LIBTORCH is the fallback for unusual setups.
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("LIBTORCH").map(|l| PathBuf::from(l).join("lib")))
        .expect("neither DEP_TCH_LIBTORCH_LIB (from torch-sys) nor LIBTORCH is set; run `cargo xtask setup`");
    let include = lib.join("..").join("include");
    let gloo = std::env::var("GLOO_INCLUDE_DIR").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from("/usr/include"));
    if !gloo.join("gloo").join("algorithm.h").exists() {
        panic!(
            "the gloo headers are missing ({}/gloo/algorithm.h); run `cargo xtask setup`, which installs Debian's \
             libgloo-dev, or point GLOO_INCLUDE_DIR at a folder holding gloo/",
            gloo.display()
        );
    }
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/collective.cpp")
        .include(&include)
        .include(include.join("torch").join("csrc").join("api").join("include"))
        .include(&gloo)
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("USE_DISTRIBUTED", None)
        .define("USE_C10D_GLOO", None)
        .flag("-O2")
        .warnings(false);
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() {
        build.define("TRINITY_NCCL", None).define("USE_C10D_NCCL", None).define("USE_CUDA", None);
        let dirs = std::env::var("CUDA_INCLUDE_DIRS")
            .expect("feature `nccl` needs CUDA_INCLUDE_DIRS (CUDA runtime and NCCL headers); see build.rs");
        for dir in std::env::split_paths(&dirs) {
            build.include(dir);
        }
    }
    build.compile("trinity_collective_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() {
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
