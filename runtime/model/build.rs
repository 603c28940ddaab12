//! Embeds libtorch's library folder as a run path so test binaries start without LD_LIBRARY_PATH, and compiles
//! the packed small-batch matmul (csrc/packed_gemm.cpp) against libtorch's headers on x86-64.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=csrc/packed_gemm.cpp");
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{libtorch}/lib");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        cc::Build::new()
            .cpp(true)
            .file("csrc/packed_gemm.cpp")
            .include(format!("{libtorch}/include"))
            .flag("-std=c++17")
            // PyPI's torch 2.x is built with the C++11 ABI, as torch-sys assumes.
            .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
            .flag("-O3")
            .warnings(false)
            .compile("trinity_packed_gemm");
        println!("cargo:rustc-cfg=packed_gemm");
    }
    println!("cargo::rustc-check-cfg=cfg(packed_gemm)");
}
