//! Embeds libtorch's library folder as a run path so test binaries start without LD_LIBRARY_PATH, and compiles
//! the packed small-batch matmul (csrc/packed_gemm.cpp), the fused decode step built on it
//! (csrc/decode_step.cpp) and the fused training ops (csrc/train_ops.cpp) against libtorch's headers on x86-64,
//! and on every architecture the autograd access tch lacks (csrc/grad.cpp) and activation recomputation
//! (csrc/checkpoint.cpp).
//!
//! No `-m`/`-march` flag: the AVX-512 and AVX2 kernels carry their instruction sets in per-function target
//! attributes and `#pragma GCC target` regions, so the rest of the object (and every inline function it shares
//! with other objects, such as std::vector's) stays baseline x86-64 and one binary runs on any CPU; the Rust side
//! picks the set at runtime (`packed::Isa`).
//!
//! `at::parallel_for` is an inline template whose OpenMP build is a bare `#pragma omp parallel`: compiled
//! without `-fopenmp` the pragma is dropped and the kernel silently runs on one thread (measured: the engine's
//! OpenMP worker got 21% of the decode samples). With it, the outlined region calls `GOMP_parallel`, which must
//! resolve to the one OpenMP runtime libtorch already loaded: PyPI's torch ships its own `libgomp.so.1` beside
//! `libtorch_cpu.so`, and linking the compiler's `libgomp.so` records the same soname, so the run path picks
//! libtorch's copy and the process keeps a single thread pool.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    for file in [
        "csrc/packed_gemm.cpp",
        "csrc/packed_gemm.h",
        "csrc/decode_step.cpp",
        "csrc/decode_kernels.inc",
        "csrc/grad.cpp",
        "csrc/checkpoint.cpp",
        "csrc/train_ops.cpp",
        "csrc/error_message.h",
        "csrc/simd_avx512.inc",
        "csrc/simd_avx2.inc",
        "csrc/train_kernels.inc",
    ] {
        println!("cargo:rerun-if-changed={file}");
    }
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{libtorch}/lib");
    cc::Build::new()
        .cpp(true)
        .file("csrc/grad.cpp")
        .file("csrc/checkpoint.cpp")
        .include(format!("{libtorch}/include"))
        // checkpoint.cpp's autograd function needs the C++ API's headers.
        .include(format!("{libtorch}/include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-O2")
        .warnings(false)
        .compile("trinity_grad");
    println!("cargo:rustc-cfg=torch_shim");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        cc::Build::new()
            .cpp(true)
            .file("csrc/packed_gemm.cpp")
            .file("csrc/decode_step.cpp")
            .include(format!("{libtorch}/include"))
            .flag("-std=c++17")
            // PyPI's torch 2.x is built with the C++11 ABI, as torch-sys assumes.
            .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
            .flag("-O3")
            .flag("-fopenmp")
            .warnings(false)
            .compile("trinity_packed_gemm");
        // The fused training ops: autograd functions, so they also need the C++ API's headers.
        cc::Build::new()
            .cpp(true)
            .file("csrc/train_ops.cpp")
            .include(format!("{libtorch}/include"))
            .include(format!("{libtorch}/include/torch/csrc/api/include"))
            .flag("-std=c++17")
            .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
            .flag("-O3")
            .flag("-fopenmp")
            .warnings(false)
            .compile("trinity_train_ops");
        println!("cargo:rustc-link-lib=dylib=gomp");
        println!("cargo:rustc-cfg=packed_gemm");
        println!("cargo:rustc-cfg=train_ops");
    }
    println!("cargo::rustc-check-cfg=cfg(packed_gemm)");
    println!("cargo::rustc-check-cfg=cfg(torch_shim)");
    println!("cargo::rustc-check-cfg=cfg(train_ops)");
}
