//! Compiles the C logger shim handed to plugins (`ncclDebugLogger_t` is C-variadic,
//! which stable Rust cannot define).

fn main() {
    println!("cargo:rerun-if-changed=src/logger.c");
    cc::Build::new()
        .file("src/logger.c")
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-Wformat=2")
        .compile("cclkit_logger");
}
