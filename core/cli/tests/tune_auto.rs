//! `cclkit tune auto|verify|diff` end to end, through the built binary: rule files
//! written from measurements round-trip and are honoured, `verify` catches a tuner
//! that does not follow its file, and `diff` lists the regions that differ.
//!
//! Needs the packaged Rust tuners (`make package`) and a C compiler; every run of the
//! binary is bounded (see `common::tune`).

mod common;

use std::path::Path;

use cclkit_abi::raw::common::Func;
use cclkit_tuner::config::{self, Format, Query};
use common::tune::{RANKS, RULES, Run, SHORT, cclkit};
use common::{rust_plugin, s};

/// Every rule line as NVIDIA's example reads it: 8 to 10 fields, known names in
/// lower case, plain decimal integers, `-1` only as a wildcard or the largest size.
fn assert_nvidia_csv(text: &str) {
    let mut rules = 0;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        rules += 1;
        let f: Vec<&str> = line.split(',').collect();
        assert!((8..=10).contains(&f.len()), "field count: {line}");
        assert!(
            [
                "broadcast",
                "reduce",
                "allgather",
                "reducescatter",
                "allreduce"
            ]
            .contains(&f[0]),
            "{line}"
        );
        assert!(f[1].parse::<u64>().is_ok(), "{line}");
        assert!(f[2] == "-1" || f[2].parse::<u64>().is_ok(), "{line}");
        assert!(["tree", "ring", "pat"].contains(&f[3]), "{line}");
        assert!(["ll", "ll128", "simple"].contains(&f[4]), "{line}");
        assert!(
            f[5].parse::<u32>().is_ok_and(|c| c >= 1),
            "channels: {line}"
        );
        assert_eq!((f[6], f[7]), ("1", "2"), "one node, two ranks: {line}");
    }
    assert!(rules >= 2, "{text}");
}

/// Parses `text`, writes it in the other format, parses that: same decisions.
fn assert_round_trip(text: &str, format: Format) {
    let a = config::parse(text, "auto", format);
    assert!(a.is_ok(), "{:?}", a.diagnostics);
    let (other, fmt2) = match format {
        Format::Csv => (a.rules.to_toml(), Format::Toml),
        Format::Toml => {
            let (csv, notes) = a.rules.to_csv();
            assert!(notes.is_empty(), "{notes:?}");
            assert_nvidia_csv(&csv);
            (csv, Format::Csv)
        }
    };
    let b = config::parse(&other, "converted", fmt2);
    assert!(b.is_ok(), "{:?}\n{other}", b.diagnostics);
    assert!(
        config::diff(&a.rules, &b.rules).is_empty(),
        "{text}\n->\n{other}"
    );
    let back = match fmt2 {
        Format::Csv => b.rules.to_toml(),
        Format::Toml => b.rules.to_csv().0,
    };
    let c = config::parse(&back, "back", format);
    assert!(
        config::diff(&a.rules, &c.rules).is_empty(),
        "{text}\n->\n{back}"
    );
    // Every measured collective is decided at every size, for this shape only.
    for func in [Func::ALL_REDUCE, Func::ALL_GATHER] {
        for n_bytes in [0, 1, 511, 512, 8191, 8192, 131_072, u64::MAX] {
            let q = |n_ranks| Query {
                func,
                n_bytes,
                n_nodes: 1,
                n_ranks,
                num_pipe_ops: 1,
                reg_buff: Some(false),
            };
            let (_, ra) = a.rules.first_match(&q(2)).expect("a rule at every size");
            let (_, rb) = b.rules.first_match(&q(2)).expect("converted");
            assert_eq!(
                (ra.algorithm, ra.protocol, ra.channels),
                (rb.algorithm, rb.protocol, rb.channels)
            );
            assert!(
                a.rules.first_match(&q(3)).is_none(),
                "measured on 2 ranks only"
            );
        }
    }
}

fn verify(file: &Path, tuner: &str) -> Run {
    let f = s(file);
    cclkit(
        &[
            "tune", "auto", "--np", "2", "-b", "512", "-e", "128K", "-f", "16", "--verify", &f,
            "--tuner", tuner,
        ],
        &[],
        RANKS,
    )
}

#[test]
fn auto_writes_csv_and_toml_that_round_trip_and_a_second_run_honours() {
    let dir = tempfile::tempdir().expect("tmp");
    let cclkit_tuner = s(&rust_plugin("libnccl-tuner-cclkit.so"));
    for (name, format) in [("rules.conf", Format::Csv), ("rules.toml", Format::Toml)] {
        let out = dir.path().join(name);
        let out_s = s(&out);
        // 512 B, 8 KiB, 128 KiB: the last runs on two channels when allowed two.
        let r = cclkit(
            &[
                "tune",
                "auto",
                "--np",
                "2",
                "-b",
                "512",
                "-e",
                "128K",
                "-f",
                "16",
                "--colls",
                "allreduce,allgather",
                "--iters",
                "2",
                "--out",
                &out_s,
            ],
            &[],
            RANKS,
        );
        assert_eq!(r.code, Some(0), "{r}");
        assert!(r.stdout.contains("2 rank(s) on 1 node(s)"), "{r}");
        // allreduce: tree and ring x 3 protocols; allgather: ring only.
        assert!(r.stdout.contains("9 algorithm/protocol pair(s)"), "{r}");
        let points: Vec<&str> = r
            .stdout
            .lines()
            .filter(|l| l.starts_with("  all"))
            .collect();
        assert_eq!(points.len(), 6, "{r}");
        let text = std::fs::read_to_string(&out).expect("rules written");
        if format == Format::Csv {
            assert_nvidia_csv(&text);
        } else {
            assert!(text.contains("[[rule]]"), "{text}");
        }
        assert_round_trip(&text, format);
        let v = verify(&out, &cclkit_tuner);
        assert_eq!(v.code, Some(0), "{v}");
        assert!(
            v.stdout
                .contains("every decision followed the rules (6 checked)"),
            "{v}"
        );
        assert!(!v.stdout.contains("MISMATCH"), "{v}");
    }
}

#[test]
fn verify_fails_when_the_tuner_does_not_follow_the_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("ring.conf");
    std::fs::write(&file, "allreduce,0,-1,ring,ll128,1,-1,-1\n").expect("write");
    // The template tuner ignores rule files: tree/LL below 64 KiB, ring/Simple above.
    let v = verify(&file, &s(&rust_plugin("libnccl-tuner-template.so")));
    assert_eq!(v.code, Some(1), "{v}");
    assert!(v.stdout.contains("MISMATCH"), "{v}");
    assert!(
        v.stdout
            .contains("3 of 3 decision(s) did not follow the rules"),
        "{v}"
    );
    // The cclkit tuner does.
    let cclkit_tuner = s(&rust_plugin("libnccl-tuner-cclkit.so"));
    let v = verify(&file, &cclkit_tuner);
    assert_eq!(v.code, Some(0), "{v}");
    assert!(v.stdout.contains("(3 checked)"), "{v}");
    // Rules for another communicator verify nothing: that is a failure, not a pass.
    let other = dir.path().join("three.conf");
    std::fs::write(&other, "allreduce,0,-1,ring,ll128,1,1,3\n").expect("write");
    let v = verify(&other, &cclkit_tuner);
    assert_eq!(v.code, Some(1), "{v}");
    assert!(
        v.stdout
            .contains("nothing checked: no rule of the file holds for 2 rank(s)"),
        "{v}"
    );
}

#[test]
fn diff_of_rule_files_lists_the_regions_that_differ() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = dir.path().join("a.conf");
    let b = dir.path().join("b.toml");
    std::fs::write(&a, RULES).expect("write");
    std::fs::write(
        &b,
        r#"
[[rule]]
collective = "allreduce"
size = "0..8K"
algorithm = "ring"
protocol = "ll"
channels = 1

[[rule]]
collective = "allreduce"
size = "8K..1M"
algorithm = "tree"
protocol = "simple"
channels = 2

[[rule]]
collective = "allreduce"
size = "1M.."
algorithm = "ring"
protocol = "simple"
"#,
    )
    .expect("write");
    let (sa, sb) = (s(&a), s(&b));
    let r = cclkit(&["tune", "diff", &sa, &sb], &[], SHORT);
    assert_eq!(r.code, Some(1), "{r}");
    let regions: Vec<&str> = r.stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        regions,
        [
            "allgather size * nodes * ranks 8: ring/ll128 channels=2 (line 4) -> no rule",
            "allreduce size 1M.. nodes * ranks *: tree/simple channels=2 (line 3) -> ring/simple (line 16)",
        ],
        "{r}"
    );
    // Restricted to a communicator the allgather rule does not hold for.
    let r = cclkit(&["tune", "diff", &sa, &sb, "--nranks", "4"], &[], SHORT);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        r.stdout.lines().filter(|l| !l.starts_with('#')).count(),
        1,
        "{r}"
    );
    let r = cclkit(&["tune", "diff", &sa, &sa], &[], SHORT);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(
        r.stdout.contains("the rules decide the same everywhere"),
        "{r}"
    );
    // A bad file is trouble (2), with its line.
    let bad = dir.path().join("bad.conf");
    std::fs::write(&bad, "allreduce,0,64K,ring,ll,1,-1,-1\n").expect("write");
    let r = cclkit(&["tune", "diff", &sa, &s(&bad)], &[], SHORT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("bad.conf:1:"), "{r}");
    let gone = dir.path().join("gone.conf");
    let r = cclkit(&["tune", "diff", &sa, &s(&gone)], &[], SHORT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("gone.conf: No such file"), "{r}");
}

#[test]
fn diff_of_a_tuner_and_rules_that_mimic_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let lib = s(&rust_plugin("libnccl-tuner-template.so"));
    let env = [
        ("CCLKIT_TEMPLATE_THRESHOLD", "4096"),
        ("CCLKIT_TUNER_MODE", "rules"),
    ];
    let mimic = |threshold: u64| {
        let p = dir.path().join(format!("t{threshold}.conf"));
        let mut text = format!("allreduce,0,{},tree,ll,-1,-1,-1\n", threshold - 1);
        for c in [
            "broadcast",
            "reduce",
            "allgather",
            "reducescatter",
            "allreduce",
        ] {
            text.push_str(&format!("{c},{threshold},-1,ring,simple,-1,-1,-1\n"));
        }
        std::fs::write(&p, text).expect("write");
        s(&p)
    };
    let sweep = ["-b", "1K", "-e", "16K", "-f", "2"];
    let same = mimic(4096);
    let mut args = vec!["tune", "diff", &lib, &same];
    args.extend(sweep);
    let r = cclkit(&args, &env, SHORT);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(
        r.stdout
            .contains("the same decision for every collective and size"),
        "{r}"
    );
    let later = mimic(8192);
    let mut args = vec!["tune", "diff", &lib, &later];
    args.extend(sweep);
    let r = cclkit(&args, &env, SHORT);
    assert_eq!(r.code, Some(1), "{r}");
    let regions: Vec<&str> = r.stdout.lines().filter(|l| !l.starts_with('#')).collect();
    // Below the rules' threshold the other collectives fall to the built-in choice,
    // which at 4K is ring/simple like the template's: only AllReduce differs.
    assert_eq!(regions.len(), 1, "only allreduce differs at 4K: {r}");
    let ar = regions
        .iter()
        .find(|l| l.starts_with("allreduce size 4K: "))
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        ar.contains("ring/simple/1") && ar.contains("-> tree/ll/1"),
        "{r}"
    );
}
