//! The TOML env file: exact values, the precedence rule, and every refusal with
//! its `file:line`.

mod common;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;

use cclkit_env_toml::file::{EnvFile, MAX_FILE_BYTES, MAX_VALUE_BYTES, Section};
use cclkit_env_toml::{Source, TomlEnv};
use common::{Rng, quoted, random_value, temp_path};

fn parse(text: &str) -> Result<EnvFile, String> {
    EnvFile::parse(Path::new("/etc/fleet.toml"), text).map_err(|e| e.to_string())
}

#[test]
fn random_files_parse_to_exact_values_and_lines() {
    let mut rng = Rng::new();
    for _ in 0..50 {
        let mut text = String::from("# fleet settings\n");
        let mut want = BTreeMap::new();
        let mut line = 1;
        for section in [Section::Env, Section::Pinned] {
            text.push_str(&format!("\n{}\n", section.header()));
            line += 2;
            for i in 0..rng.below(12) {
                let name = format!("NCCL_{}_{i}_{}", section.header().len(), rng.below(1 << 30));
                let (toml, value) = random_value(&mut rng);
                text.push_str(&format!("{name} = {toml}\n"));
                line += 1;
                want.insert(name, (value, line, section));
            }
        }
        let file = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(file.len(), want.len());
        for (name, (value, line, section)) in &want {
            let e = file.get(name).expect("entry");
            assert_eq!(
                (&e.value, e.line, e.section),
                (value, *line, *section),
                "{name}"
            );
        }
    }
}

#[test]
fn precedence_pinned_then_process_then_file() {
    let file =
        parse("[env]\nNCCL_A = \"file-a\"\nNCCL_B = \"file-b\"\n[pinned]\nNCCL_C = \"pin-c\"\n")
            .expect("valid");
    let env = TomlEnv::new(Some(file));
    let proc = |s: &str| Some(Cow::Owned(OsString::from(s)));
    let got = |name: &str, p: Option<Cow<'static, OsStr>>| {
        env.resolve(name, p)
            .map(|(v, s)| (v.to_string_lossy().into_owned(), s))
    };
    // [env]: the process environment wins; the file fills in when it is unset.
    assert_eq!(
        got("NCCL_A", proc("p")),
        Some(("p".into(), Source::Process))
    );
    assert_eq!(got("NCCL_A", None), Some(("file-a".into(), Source::File)));
    // An empty process value is still "set" (NCCL's getenv semantics).
    assert_eq!(got("NCCL_B", proc("")), Some(("".into(), Source::Process)));
    // [pinned]: the file wins.
    assert_eq!(
        got("NCCL_C", proc("p")),
        Some(("pin-c".into(), Source::Pinned))
    );
    assert_eq!(got("NCCL_C", None), Some(("pin-c".into(), Source::Pinned)));
    // Not in the file: the process environment, or unset.
    assert_eq!(
        got("NCCL_D", proc("x")),
        Some(("x".into(), Source::Process))
    );
    assert_eq!(got("NCCL_D", None), None);
    // Without a file the plugin is NCCL's default: the process environment.
    let bare = TomlEnv::new(None);
    assert_eq!(bare.resolve("NCCL_A", None), None);
    assert_eq!(
        bare.resolve("NCCL_A", proc("v")).map(|(_, s)| s),
        Some(Source::Process)
    );
}

#[test]
fn malformed_files_name_file_and_line() {
    let cases: [(&str, &str); 12] = [
        ("[env]\nNCCL_A = \"x\n", "/etc/fleet.toml:2: invalid TOML"),
        (
            "[env]\nNCCL_A = 1.5\n",
            "/etc/fleet.toml:2: NCCL_A: a value must be a string, integer or boolean, not float",
        ),
        (
            "[env]\n\nNCCL_A = [1]\n",
            "/etc/fleet.toml:3: NCCL_A: a value must be",
        ),
        (
            "[env]\nCUDA_VISIBLE_DEVICES = \"0\"\n",
            "/etc/fleet.toml:2: `CUDA_VISIBLE_DEVICES` is not an NCCL variable",
        ),
        (
            "[env]\nnccl_debug = \"INFO\"\n",
            "/etc/fleet.toml:2: `nccl_debug` is not an NCCL variable",
        ),
        (
            "[env]\nNCCL_debug = \"INFO\"\n",
            "/etc/fleet.toml:2: `NCCL_debug` is not an NCCL variable name",
        ),
        (
            "NCCL_A = 1\n",
            "/etc/fleet.toml:1: NCCL_A is outside a table",
        ),
        (
            "[nccl]\nNCCL_A = 1\n",
            "/etc/fleet.toml:1: unknown top-level key `nccl`",
        ),
        ("env = 3\n", "/etc/fleet.toml:1: `[env]` must be a table"),
        (
            "[pinned]\nNCCL_ENV_PLUGIN = \"x\"\n",
            "/etc/fleet.toml:2: NCCL_ENV_PLUGIN is read from the process environment",
        ),
        (
            "[env]\nNCCL_A = 1\n[pinned]\nNCCL_A = 2\n",
            "/etc/fleet.toml:4: NCCL_A is set in both [env] (line 2) and [pinned]",
        ),
        (
            "[env]\nNCCL_A = \"a\\u0000b\"\n",
            "/etc/fleet.toml:2: NCCL_A: the value contains the control character '\\0'",
        ),
    ];
    for (text, want) in cases {
        let err = parse(text).expect_err(text);
        assert!(err.starts_with(want), "{text:?}\n got: {err}\nwant: {want}");
    }
    let huge = 99_999_999_999_999_999_999_i128;
    let err = parse(&format!("[env]\nNCCL_A = {huge}\n")).expect_err("overflow");
    assert!(
        err.starts_with("/etc/fleet.toml:2: NCCL_A: the integer does not fit"),
        "{err}"
    );
}

#[test]
fn every_problem_is_reported_and_long_values_are_cut() {
    let long = "v".repeat(MAX_VALUE_BYTES + 1);
    let text = format!(
        "[env]\nNCCL_A = 1.0\nNCCL_B = {}\nbad = 1\nNCCL_C = \"fine\"\n",
        quoted(&long)
    );
    let err = parse(&text).expect_err("three problems");
    let parts: Vec<&str> = err.split("; ").collect();
    assert_eq!(parts.len(), 3, "{err}");
    assert!(parts[0].starts_with("/etc/fleet.toml:2: NCCL_A"), "{err}");
    assert!(
        parts[1].starts_with("/etc/fleet.toml:3: NCCL_B: the value is 4097 bytes"),
        "{err}"
    );
    assert!(parts[2].starts_with("/etc/fleet.toml:4: `bad`"), "{err}");
    // The echoed value is cut to 80 characters.
    assert!(
        parts[1].contains(&format!("`{}…`", "v".repeat(80))),
        "{err}"
    );
    assert!(!err.contains(&"v".repeat(81)), "{err}");

    // More than 8 problems: the rest are counted, not listed.
    let many: String = (0..13).map(|i| format!("x{i} = 1\n")).collect();
    let err = parse(&many).expect_err("13 problems");
    assert_eq!(err.matches("unknown top-level key").count(), 8, "{err}");
    assert!(err.ends_with("; and 5 more problems"), "{err}");
}

#[test]
fn files_over_the_limit_are_refused_without_reading_them() {
    let path = temp_path("big");
    let head = "[env]\nNCCL_A = 1\n#";
    let pad = MAX_FILE_BYTES as usize - head.len() - 1;
    let at_limit = format!("{head}{}\n", "x".repeat(pad));
    assert_eq!(at_limit.len() as u64, MAX_FILE_BYTES);
    std::fs::write(&path, &at_limit).expect("write");
    let ok = EnvFile::load(&path).expect("exactly at the limit is accepted");
    assert_eq!(ok.get("NCCL_A").map(|e| e.value.as_str()), Some("1"));

    std::fs::write(&path, format!("{at_limit}#")).expect("write");
    let err = EnvFile::load(&path).expect_err("one byte over").to_string();
    assert_eq!(
        err,
        format!(
            "{}: the file is {} bytes; the limit is {MAX_FILE_BYTES} bytes (1 MiB), so it was not read",
            path.display(),
            MAX_FILE_BYTES + 1
        )
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn unreadable_and_odd_files_are_refused_clearly() {
    let missing = temp_path("missing");
    let err = EnvFile::load(&missing).expect_err("missing").to_string();
    assert!(
        err.starts_with(&format!("{}: cannot open:", missing.display())),
        "{err}"
    );

    let dir = std::env::temp_dir();
    let err = EnvFile::load(&dir).expect_err("directory").to_string();
    assert_eq!(err, format!("{}: not a regular file", dir.display()));

    // A FIFO must not block (nobody ever writes to this one).
    let fifo = temp_path("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let err = EnvFile::load(&fifo).expect_err("fifo").to_string();
    assert_eq!(err, format!("{}: not a regular file", fifo.display()));
    let _ = std::fs::remove_file(&fifo);

    let bad = temp_path("utf8");
    std::fs::write(&bad, b"[env]\nNCCL_A = 1\nNCCL_B = \"\xff\"\n").expect("write");
    let err = EnvFile::load(&bad).expect_err("not UTF-8").to_string();
    assert_eq!(err, format!("{}:3: not valid UTF-8", bad.display()));
    let _ = std::fs::remove_file(&bad);
}
