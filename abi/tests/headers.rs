//! The committed C header `abi/include/cclkit_abi.h` must match what is generated
//! from the Rust definitions: cbindgen for structs, tables and constants, plus the
//! C enums written here from the `C_NAMES` of each i32 newtype (cbindgen does not
//! expand the macro that defines them). `make headers` (CCLKIT_BLESS=1) rewrites it.

use std::fmt::Write;
use std::path::PathBuf;

use cclkit_abi::raw::common::{Algorithm, DataType, Func, LogLevel, NcclResult, Protocol, RedOp};
use cclkit_abi::raw::net::NetDeviceType;
use cclkit_abi::raw::profiler::ProfilerEventState;

fn enums() -> String {
    let mut s = String::from(
        "\n/* C enums of the ABI, as int32_t so their size is exact (generated from C_NAMES). */\n",
    );
    for (ctype, values) in [
        ("ncclResult_t", NcclResult::C_NAMES),
        ("ncclDebugLogLevel", LogLevel::C_NAMES),
        ("ncclDataType_t", DataType::C_NAMES),
        ("ncclRedOp_t", RedOp::C_NAMES),
        ("ncclFunc_t", Func::C_NAMES),
        ("ncclNetDeviceType", NetDeviceType::C_NAMES),
        ("ncclProfilerEventState_t", ProfilerEventState::C_NAMES),
        ("ncclAlgorithm_t", Algorithm::C_NAMES),
        ("ncclProtocol_t", Protocol::C_NAMES),
    ] {
        let _ = writeln!(s, "\ntypedef int32_t {ctype};");
        for (name, value) in values {
            let _ = writeln!(s, "#define {name} {value}");
        }
    }
    let _ = writeln!(s, "\n/* Profiler event-type bits (ncclProfile*). */");
    for (name, value) in cclkit_abi::raw::profiler::event::C_NAMES {
        let _ = writeln!(s, "#define {name} {value}");
    }
    s
}

fn generate() -> String {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("abi/cbindgen.toml");
    config.after_includes = Some(enums());
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen failed")
        .write(&mut out);
    String::from_utf8(out).expect("header is UTF-8")
}

#[test]
fn committed_header_is_fresh() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include/cclkit_abi.h");
    let generated = generate();
    if std::env::var_os("CCLKIT_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write header");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "abi/include/cclkit_abi.h is stale: run `make headers` and commit the result"
    );
}
