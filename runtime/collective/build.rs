//! Compiles the C++ shim (csrc/collective.cpp) against the headers of the libtorch that torch-sys links, and
//! embeds libtorch's library folder as a run path.
//!
//! Flags a CMake user would get from Caffe2Targets.cmake: C++17, the C++11 string ABI (PyPI's torch; ABI 0 fails
//! to link `createDeviceForHostname`), `USE_DISTRIBUTED` and `USE_C10D_GLOO` so the c10d headers declare the
//! Gloo process group, and both `include/` and `include/torch/csrc/api/include`. The gloo headers are not in the
//! wheel: Debian's `libgloo-dev` puts them in /usr/include (`cargo xtask setup` installs it); `GLOO_INCLUDE_DIR`
//! points elsewhere.
//!
//! Feature `nccl` adds `TRINITY_NCCL`, `USE_C10D_NCCL` and `USE_CUDA`, links `torch_cuda c10_cuda`, and compiles
//! against the CUDA runtime, cuBLAS/cuSPARSE/cuSOLVER (`ATen/cuda/CUDAContext.h`) and NCCL headers. Those are in
//! the `include/` folders of the CUDA wheels `cargo xtask setup --cuda` installs next to `torch/`
//! (`<libtorch>/../nvidia/*/include`), where this script finds them, so that step is the only one;
//! `CUDA_INCLUDE_DIRS` (colon-separated) replaces that search for a system CUDA toolkit. The same wheels'
//! `lib/` folders are passed to the linker as `-rpath-link` so it can check `libtorch_cuda.so`'s own dependencies;
//! at run time `libtorch_cuda.so` finds them through its RPATH (`$ORIGIN/../../nvidia/<package>/lib`).
use std::path::{Path, PathBuf};

/// The headers `ProcessGroupNCCL.hpp` reaches: a folder list without one of them cannot build the shim.
const CUDA_HEADERS: [&str; 7] =
    ["cuda_runtime_api.h", "crt/host_config.h", "nv/target", "cublas_v2.h", "cusparse.h", "cusolverDn.h", "nccl.h"];

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
        for dir in cuda_include_dirs(&lib) {
            build.include(dir);
        }
    }
    build.compile("trinity_collective_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() {
        for dir in wheel_dirs(&lib, "lib") {
            println!("cargo:rustc-link-arg=-Wl,-rpath-link,{}", dir.display());
        }
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}

/// `<libtorch>/../nvidia/*/<sub>`: the folders of the CUDA wheels installed next to `torch/` (`cu13` for the
/// toolkit, `nccl`, `cudnn`, ...), sorted so the build does not depend on directory order.
fn wheel_dirs(lib: &Path, sub: &str) -> Vec<PathBuf> {
    let nvidia = lib.join("..").join("..").join("nvidia");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&nvidia)
        .map(|entries| entries.flatten().map(|e| e.path().join(sub)).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// `CUDA_INCLUDE_DIRS` when set, else the CUDA wheels' include folders; either way every header of
/// [`CUDA_HEADERS`] must be in one of them, or the build stops saying which is missing and how to install it.
fn cuda_include_dirs(lib: &Path) -> Vec<PathBuf> {
    let (dirs, origin) = match std::env::var_os("CUDA_INCLUDE_DIRS") {
        Some(dirs) => (std::env::split_paths(&dirs).collect::<Vec<_>>(), "CUDA_INCLUDE_DIRS".to_owned()),
        None => {
            let nvidia = lib.join("..").join("..").join("nvidia");
            println!("cargo:rerun-if-changed={}", nvidia.display());
            (wheel_dirs(lib, "include"), format!("{}/*/include", nvidia.display()))
        }
    };
    let missing: Vec<&str> =
        CUDA_HEADERS.iter().copied().filter(|h| !dirs.iter().any(|d| d.join(h).is_file())).collect();
    if !missing.is_empty() {
        panic!(
            "feature `nccl` needs the CUDA and NCCL headers, and {origin} lacks {}; run `cargo xtask setup --cuda` \
             (it installs the CUDA wheels libtorch_cuda was built against next to libtorch) or point \
             CUDA_INCLUDE_DIRS at a CUDA toolkit's and NCCL's include folders",
            missing.join(", ")
        );
    }
    dirs
}
