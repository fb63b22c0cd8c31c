//! `cclkit check` judges plugins by NCCL's calling discipline (NCCL_ABI.md §2.11b):
//! C plugins that rely on exactly one NCCL guarantee (tests/fixtures/faithful/) pass
//! the contract checks and show that reliance as one probe WARN (out-of-order test,
//! NULL mhandle, test after close, stray connections), which fails under
//! `--strict`; a plugin that answers "not now" until the peer sends (UCX-style) passes
//! cleanly; and plugins breaking one of the newer contract rules (fixtures/broken/
//! cnet.c with a BUG_* define) fail exactly that check.

mod common;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// Compiles `dir/file` against the committed ABI header with extra compiler args.
fn build(p: &common::Plugins, out: &str, file: &str, args: &[&str]) -> String {
    let mut all = vec![
        format!("-I{}", common::abi_include().display()),
        "-std=gnu11".to_owned(),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    common::s(&p.cc(out, &[common::fixture(file)], &all))
}

/// `cclkit check LIB --json ARGS` with a fixed seed: exit code and report.
fn check(lib: &str, args: &[&str]) -> (i32, Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(["check", lib, "--json", "--jobs", "2", "--seed", "4242"])
        .args(args)
        .env_remove("NCCL_DEBUG");
    let out = common::run_bounded(cmd, Duration::from_secs(180));
    let text = String::from_utf8_lossy(&out.stdout);
    let r = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (out.status.code().unwrap_or(-1), r)
}

/// `(check, status, class, message)` of every row that did not pass or skip.
fn not_passed(r: &Value) -> Vec<(String, String, String, String)> {
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|x| x["status"] != "PASS" && x["status"] != "SKIP")
        .map(|x| {
            let f = |k: &str| x[k].as_str().unwrap_or("").to_owned();
            (f("check"), f("status"), f("class"), f("message"))
        })
        .collect()
}

#[test]
fn plugins_relying_on_one_nccl_guarantee_pass_with_its_probe_warning() {
    let p = common::Plugins::new();
    for (file, probe, needle) in [
        (
            "ordered_stream",
            "out-of-order",
            "tested newest first, receive 0 reported 7013 bytes for a 3001-byte message",
        ),
        (
            "deref_mhandle",
            "null-mhandle",
            "killed by SIGSEGV (signal 11) during: isend/irecv of 0 B with a NULL mhandle",
        ),
        (
            "oldest_only",
            "out-of-order",
            "the newest receive did not complete within 3 s while only it was tested",
        ),
        (
            "freed_requests",
            "test-after-close",
            "killed by SIGSEGV (signal 11) during: test 4 receives and",
        ),
        (
            "trusting_accept",
            "stray-connections",
            "after 3 stray TCP connections, a 0-byte message over the real connection",
        ),
    ] {
        let lib = build(
            &p,
            &format!("lib{file}.so"),
            &format!("faithful/{file}.c"),
            &[],
        );
        let (code, r) = check(&lib, &[]);
        let rows = not_passed(&r);
        assert_eq!(code, 0, "{file}: {rows:#?}");
        assert_eq!(r["verdict"], "passed", "{file}");
        assert_eq!(rows.len(), 1, "{file}: {rows:#?}");
        let (name, status, class, msg) = &rows[0];
        assert_eq!(
            (name.as_str(), status.as_str(), class.as_str()),
            (probe, "WARN", "probe")
        );
        assert!(msg.contains(needle), "{file}: {msg}");
        assert_eq!(r["warned"], 1, "{file}");
        // The data-path contract checks ran and passed (two-process included).
        for c in [
            "sendrecv",
            "inflight",
            "request-reuse",
            "grouped",
            "null-retry",
            "close-inflight",
            "reload",
            "two-process",
        ] {
            let x = r["results"]
                .as_array()
                .expect("results")
                .iter()
                .find(|x| x["check"] == c)
                .unwrap_or_else(|| panic!("{file}: no {c}"));
            assert_eq!(x["status"], "PASS", "{file}: {x}");
        }
        let (code, r) = check(&lib, &["--strict", "--only", &format!("sendrecv,{probe}")]);
        assert_eq!(code, 1, "{file} --strict: {r:#}");
        assert_eq!(r["verdict"], "failed");
        let rows = not_passed(&r);
        assert_eq!(rows.len(), 1, "{file}: {rows:#?}");
        assert_eq!((rows[0].0.as_str(), rows[0].1.as_str()), (probe, "FAIL"));
    }
}

#[test]
fn a_plugin_whose_irecv_waits_for_the_peers_send_passes_without_warnings() {
    let p = common::Plugins::new();
    let lib = build(&p, "libucx_recv.so", "faithful/ucx_recv.c", &[]);
    let (code, r) = check(&lib, &[]);
    assert_eq!(code, 0, "{:#?}", not_passed(&r));
    assert_eq!(r["warned"], 0, "{:#?}", not_passed(&r));
    for c in [
        "sendrecv",
        "inflight",
        "request-reuse",
        "grouped",
        "two-process",
    ] {
        let row = r["results"]
            .as_array()
            .expect("results")
            .iter()
            .find(|x| x["check"] == c)
            .unwrap_or_else(|| panic!("no {c}"));
        assert_eq!(row["status"], "PASS", "{row}");
    }
}

#[test]
fn breaking_a_newer_contract_rule_fails_exactly_its_check() {
    let p = common::Plugins::new();
    for (out, args, check_name, needles) in [
        (
            "libff12.so",
            vec!["-DBUG_UNWRITTEN_FORCEFLUSH"],
            "props-written",
            vec![
                "getProperties left forceFlush unwritten",
                "ncclNetProperties_v12_t",
            ],
        ),
        (
            "libff11.so",
            vec!["-DBUG_UNWRITTEN_FORCEFLUSH", "-DNET_VERSION=11"],
            "props-written",
            vec![
                "getProperties left forceFlush unwritten",
                "ncclNetProperties_v11_t",
            ],
        ),
        (
            "libblockaccept.so",
            vec!["-DBUG_BLOCKING_ACCEPT"],
            "accept-first",
            vec!["accept before any connect blocked for", "(limit 100 ms)"],
        ),
        (
            "libnoreload.so",
            vec!["-DBUG_NOT_RELOADABLE"],
            "reload",
            vec![
                "not reloadable: init failed after finalize and dlclose (round 2",
                "the process-wide name is taken",
            ],
        ),
    ] {
        let lib = build(&p, out, "broken/cnet.c", &args);
        let (code, r) = check(&lib, &[]);
        let rows = not_passed(&r);
        assert_eq!(code, 1, "{out}: {rows:#?}");
        assert_eq!(rows.len(), 1, "{out}: {rows:#?}");
        let (name, status, class, msg) = &rows[0];
        assert_eq!(
            (name.as_str(), status.as_str(), class.as_str()),
            (check_name, "FAIL", "contract"),
            "{out}"
        );
        for n in needles {
            assert!(msg.contains(n), "{out}: missing {n:?} in {msg}");
        }
    }
}

#[test]
fn a_library_without_section_headers_is_checked_as_the_loader_loads_it() {
    let p = common::Plugins::new();
    let lib = build(&p, "libcnet-full.so", "broken/cnet.c", &[]);
    let mut data = std::fs::read(&lib).expect("read");
    // e_shoff = 0, e_shnum = 0, e_shstrndx = 0 (64-bit little-endian header), as
    // sstrip leaves a library: ld.so reads only the program headers.
    data[0x28..0x30].fill(0);
    data[0x3c..0x40].fill(0);
    let stripped = p.path("libcnet-nosections.so");
    std::fs::write(&stripped, &data).expect("write");
    let (code, r) = check(&common::s(&stripped), &["--only", "symbol,init,sendrecv"]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["exports"]["net"], serde_json::json!([12]));
    assert_eq!(r["passed"], 3, "{r:#}");
}

#[test]
fn fifos_devices_and_directories_are_refused_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("libfifo.so");
    let c = std::ffi::CString::new(fifo.display().to_string()).expect("path");
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let zero = dir.path().join("libzero.so");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    for (path, needle) in [
        (fifo.as_path(), "a FIFO (named pipe), not a regular file"),
        (zero.as_path(), "a character device, not a regular file"),
        (dir.path(), "a directory, not a regular file"),
    ] {
        let start = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_cclkit"))
            .args(["check", &path.display().to_string(), "--timeout", "5"])
            .output()
            .expect("run cclkit");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{path:?} took long"
        );
        assert_eq!(out.status.code(), Some(2), "{path:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{path:?}: {err}");
    }
}
