//! Builds the CUDA kernels' host emulator (`cuda/emulator.cpp`, the same
//! kernel source compiled for the CPU) when the `cuda` feature is on. Nothing
//! is built otherwise. Needs a C++17 compiler (g++ or clang++), no CUDA.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    for f in [
        "cuda/emulator.cpp",
        "cuda/cclkit_loops.h",
        "cuda/cclkit_elem.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    cc::Build::new()
        .cpp(true)
        .cpp_link_stdlib(None)
        .file("cuda/emulator.cpp")
        .include("cuda")
        .flag_if_supported("-std=c++17")
        // Exact IEEE adds and multiplies, as the device's add.rn/mul.rn.
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-exceptions")
        .flag_if_supported("-fno-rtti")
        .opt_level(2)
        .warnings(true)
        .compile("cclkit_cuda_emul");
}
