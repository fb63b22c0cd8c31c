//! The CUDA stand-in (kernels/cuda-standin) built once per test binary, and C
//! fixtures linked against it as a vendor links against the CUDA toolkit.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

/// The stand-in's directory (`libcuda.so.1`, `libcudart.so.12`, …).
pub fn standin() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = cclkit_tests::cplugin::workspace().join("kernels/cuda-standin/build.sh");
        let out = Command::new(&script)
            .arg(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "building the stand-in failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
    .path()
}

/// A fixture of tests/fixtures/cuda linked against the stand-in's `lib` (`cuda`
/// or `cudart`).
pub fn fixture(p: &super::Plugins, src: &str, lib: &str, defines: &[&str]) -> String {
    let mut args = vec![
        format!("-I{}", super::abi_include().display()),
        "-std=gnu11".to_owned(),
        format!("-L{}", standin().display()),
        format!("-l{lib}"),
    ];
    args.extend(defines.iter().map(|d| format!("-D{d}")));
    let name = format!("lib{}{}.so", src.trim_end_matches(".c"), defines.concat());
    super::s(&p.cc(&name, &[super::fixture(&format!("cuda/{src}"))], &args))
}
