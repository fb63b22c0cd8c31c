//! Generates the libfabric bindings (bindgen over `src/sys/wrapper.h`, with the
//! header's `static inline` calls wrapped into a C file) and compiles that file
//! plus `src/sys/shim.c`; links `-lfabric`.
//!
//! Needs libclang at build time (`libclang1-14 libclang-common-14-dev`) and the
//! libfabric headers (`libfabric-dev`); see DEPENDENCIES.md §4 for why no crate.

use std::env;
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let header = "src/sys/wrapper.h";
    let static_fns = out.join("fi_static_fns");
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-changed=src/sys/shim.c");

    let bindings = bindgen::Builder::default()
        // A real file: `header_contents` breaks the generated C (unknown uint32_t).
        .header(header)
        .allowlist_function("fi_.*")
        .allowlist_function("cclkit_ofi_.*")
        .allowlist_type("fi_.*")
        .allowlist_var("FI_.*")
        .wrap_static_fns(true)
        .wrap_static_fns_path(&static_fns)
        .rust_edition(bindgen::RustEdition::Edition2024)
        .size_t_is_usize(true)
        .derive_default(true)
        .prepend_enum_name(false)
        .layout_tests(true)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("bindgen over the libfabric headers failed (is libfabric-dev installed?)");
    bindings
        .write_to_file(out.join("fi_bindings.rs"))
        .expect("write fi_bindings.rs");

    cc::Build::new()
        .file(static_fns.with_extension("c"))
        .file("src/sys/shim.c")
        .include(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .include("src/sys")
        .warnings(false)
        .compile("cclkit_ofi_shim");
    println!("cargo:rustc-link-lib=fabric");
}
