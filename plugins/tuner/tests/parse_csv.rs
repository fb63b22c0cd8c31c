//! NCCL CSV parsing: every field form NCCL accepts, and every error message.

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};
use cclkit_tuner::config::{self, CollSet, Format, Interval, Rule, Severity};

fn parse(text: &str) -> config::Parsed {
    config::parse(text, "t.conf", Format::Csv)
}

fn messages(text: &str) -> Vec<String> {
    parse(text)
        .diagnostics
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn only_rule(text: &str) -> Rule {
    let p = parse(text);
    assert!(p.is_ok(), "{:?}", p.diagnostics);
    assert_eq!(p.rules.rules.len(), 1, "{:?}", p.rules.rules);
    p.rules.rules[0].clone()
}

#[test]
fn eight_fields_with_wildcards() {
    let r = only_rule("allreduce,0,65536,tree,ll,-1,-1,-1\n");
    assert_eq!(r.collectives, CollSet::single(Func::ALL_REDUCE).unwrap());
    assert_eq!(r.bytes, Interval::new(0, 65536));
    assert_eq!(r.algorithm, Some(Algorithm::TREE));
    assert_eq!(r.protocol, Some(Protocol::LL));
    assert_eq!(r.channels, None);
    assert_eq!(r.nodes, Interval::ANY);
    assert_eq!(r.ranks, Interval::ANY);
    assert_eq!(r.pipe_ops, Interval::ANY);
    assert_eq!(r.reg_buff, None);
    assert_eq!(r.line, 1);
}

#[test]
fn nine_and_ten_fields() {
    let r = only_rule("broadcast,100,200,ring,simple,4,2,16,3\n");
    assert_eq!(r.collectives, CollSet::single(Func::BROADCAST).unwrap());
    assert_eq!(r.channels, Some(4));
    assert_eq!(r.nodes, Interval::exact(2));
    assert_eq!(r.ranks, Interval::exact(16));
    assert_eq!(r.pipe_ops, Interval::exact(3));
    assert_eq!(r.reg_buff, None);

    let r = only_rule("reducescatter,1,2,pat,simple,-1,-1,-1,-1,1");
    assert_eq!(r.algorithm, Some(Algorithm::PAT));
    assert_eq!(r.pipe_ops, Interval::ANY);
    assert_eq!(r.reg_buff, Some(true));
    let r = only_rule("allgather,1,2,nvls_tree,ll128,-1,-1,-1,-1,0");
    assert_eq!(r.algorithm, Some(Algorithm::NVLS_TREE));
    assert_eq!(r.protocol, Some(Protocol::LL128));
    assert_eq!(r.reg_buff, Some(false));
}

#[test]
fn every_name_nccl_knows() {
    let colls = [
        ("broadcast", Func::BROADCAST),
        ("reduce", Func::REDUCE),
        ("allgather", Func::ALL_GATHER),
        ("reducescatter", Func::REDUCE_SCATTER),
        ("allreduce", Func::ALL_REDUCE),
    ];
    let algos = [
        ("tree", 0),
        ("ring", 1),
        ("collnet_direct", 2),
        ("collnet_chain", 3),
        ("nvls", 4),
        ("nvls_tree", 5),
        ("pat", 6),
    ];
    for (i, (c, f)) in colls.iter().enumerate() {
        for (a, ai) in algos {
            for (pi, p) in ["ll", "ll128", "simple"].iter().enumerate() {
                let r = only_rule(&format!("{c},{i},{},{a},{p},-1,-1,-1", i + 10));
                assert_eq!(r.collectives, CollSet::single(*f).unwrap());
                assert_eq!(r.algorithm, Some(Algorithm(ai)));
                assert_eq!(r.protocol, Some(Protocol(pi as i32)));
            }
        }
    }
}

#[test]
fn comments_blank_lines_spaces_crlf_trailing_comma() {
    let text = "# header comment\n\
                \n\
                \t  \n\
                  # indented comment\n\
                allreduce , 0 ,\t1024, tree ,ll , 2 , 1 , 8\r\n\
                \r\n\
                allgather,1025,2048,ring,simple,-1,-1,-1,\n\
                +5,6,7,ring,simple,-1,-1,-1\n";
    let p = parse(text);
    let lines: Vec<u32> = p.rules.rules.iter().map(|r| r.line).collect();
    assert_eq!(lines, vec![5, 7, 8]);
    let r = &p.rules.rules[0];
    assert_eq!(r.bytes, Interval::new(0, 1024));
    assert_eq!(r.channels, Some(2));
    assert_eq!(r.nodes, Interval::exact(1));
    assert_eq!(r.ranks, Interval::exact(8));
    assert_eq!(p.rules.rules[1].pipe_ops, Interval::ANY);
    // "+5" is an unknown collective: allreduce, as NCCL reads it.
    assert_eq!(
        p.rules.rules[2].collectives,
        CollSet::single(Func::ALL_REDUCE).unwrap()
    );
}

#[test]
fn max_bytes_minus_one_is_the_largest_size() {
    let r = only_rule("allreduce,4096,-1,ring,simple,-1,-1,-1");
    assert_eq!(r.bytes, Interval::new(4096, u64::MAX));
    let r = only_rule("allreduce,+1,18446744073709551615,ring,simple,0,-1,-1");
    assert_eq!(r.bytes, Interval::new(1, u64::MAX));
    // channels 0 is what NCCL's "keep default" value means too.
    assert_eq!(r.channels, None);
}

#[test]
fn unknown_names_are_read_as_nccl_reads_them_with_warnings() {
    let p = parse(
        "AllGather,0,10,Tree,LL,-1,-1,-1\n\
         bcast,0,10,rng,fast,-1,-1,-1\n",
    );
    assert!(p.is_ok());
    let r = &p.rules.rules[0];
    assert_eq!(r.collectives, CollSet::single(Func::ALL_REDUCE).unwrap());
    assert_eq!(r.algorithm, Some(Algorithm::RING));
    assert_eq!(r.protocol, Some(Protocol::SIMPLE));
    let m: Vec<String> = p.diagnostics.iter().map(ToString::to_string).collect();
    assert_eq!(
        m,
        vec![
            "t.conf:1: warning: unknown collective \"AllGather\": read as allreduce, as NCCL does (names are lower-case)",
            "t.conf:1: warning: unknown algorithm \"Tree\": read as ring, as NCCL does (names are lower-case)",
            "t.conf:1: warning: unknown protocol \"LL\": read as simple, as NCCL does (names are lower-case)",
            "t.conf:2: warning: unknown collective \"bcast\": read as allreduce, as NCCL does (expected broadcast, reduce, allgather, reducescatter or allreduce)",
            "t.conf:2: warning: unknown algorithm \"rng\": read as ring, as NCCL does (expected tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree or pat)",
            "t.conf:2: warning: unknown protocol \"fast\": read as simple, as NCCL does (expected ll, ll128 or simple)",
        ]
    );
}

#[test]
fn suspicious_values_are_warnings() {
    assert_eq!(
        messages("allreduce,100,10,ring,simple,-1,-1,-1\nallreduce,-1,10,ring,simple,-1,0,0\n"),
        vec![
            "t.conf:1: warning: min_bytes 100 is greater than max_bytes 10: the rule never matches",
            "t.conf:2: warning: min_bytes -1 is read as 18446744073709551615, as NCCL's strtoull does: the rule never matches",
            "t.conf:2: warning: min_bytes 18446744073709551615 is greater than max_bytes 10: the rule never matches",
            "t.conf:2: warning: nNodes 0 never matches",
            "t.conf:2: warning: nRanks 0 never matches",
        ]
    );
}

#[test]
fn each_bad_line_error() {
    let cases: [(&str, &str); 14] = [
        (
            "allreduce,0,10,ring,simple,-1,-1",
            "expected 8 to 10 comma-separated fields (collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]), found 7",
        ),
        (
            "allreduce,0,10,ring,simple,-1,-1,-1,-1,-1,7",
            "expected 8 to 10 comma-separated fields (collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]), found 11",
        ),
        (
            "allreduce size 0 to 10 ring",
            "expected 8 to 10 comma-separated fields (collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]), found 1",
        ),
        (
            "allreduce,0,,ring,simple,-1,-1,-1",
            "field 3 (max_bytes) is empty",
        ),
        (
            "allreduce,0,64K,ring,simple,-1,-1,-1",
            "max_bytes \"64K\" is not a number (NCCL would read it as 64; size suffixes are only allowed in TOML)",
        ),
        (
            "allreduce,abc,10,ring,simple,-1,-1,-1",
            "min_bytes \"abc\" is not a number",
        ),
        (
            "allreduce,-5,10,ring,simple,-1,-1,-1",
            "min_bytes -5 is negative",
        ),
        (
            "allreduce,0,99999999999999999999,ring,simple,-1,-1,-1",
            "max_bytes 99999999999999999999 is out of range",
        ),
        (
            "allreduce,0,10,ring,simple,eight,-1,-1",
            "channels \"eight\" is not an integer",
        ),
        (
            "allreduce,0,10,ring,simple,-2,-1,-1",
            "channels must be -1 (keep NCCL's) or a channel count, got -2",
        ),
        (
            "allreduce,0,10,ring,simple,-1,-3,-1",
            "nNodes must be -1 (any) or a count, got -3",
        ),
        (
            "allreduce,0,10,ring,simple,-1,-1,8 # note",
            "nRanks \"8 # note\" is not an integer",
        ),
        (
            "allreduce,0,10,ring,simple,-1,-1,4294967296",
            "nRanks 4294967296 is out of range",
        ),
        (
            "allreduce,0,10,ring,simple,-1,-1,-1,1,2",
            "regBuff must be -1, 0 or 1, got 2",
        ),
    ];
    for (line, want) in cases {
        let text = format!("# comment\n{line}\n");
        let p = parse(&text);
        assert!(!p.is_ok(), "{line}");
        assert!(p.rules.rules.is_empty(), "{line}");
        let errs: Vec<String> = p.errors().map(ToString::to_string).collect();
        assert_eq!(errs, vec![format!("t.conf:2: {want}")], "{line}");
    }
}

#[test]
fn numpipeops_error_and_several_errors_on_one_line() {
    let p = parse("allreduce,x,10,ring,simple,-1,-1,-1,-7\n");
    let errs: Vec<String> = p.errors().map(ToString::to_string).collect();
    assert_eq!(
        errs,
        vec![
            "t.conf:1: min_bytes \"x\" is not a number",
            "t.conf:1: numPipeOps must be -1 (any) or a count, got -7",
        ]
    );
}

#[test]
fn good_lines_survive_bad_ones_but_the_file_is_not_ok() {
    let p = parse(
        "allreduce,0,10,ring,simple,-1,-1,-1\n\
         allreduce,0,10\n\
         allgather,0,10,tree,ll,-1,-1,-1\n\
         allgather,0,10,tree,ll,-1,-1\n",
    );
    assert!(!p.is_ok());
    assert_eq!(p.rules.rules.len(), 2);
    let lines: Vec<u32> = p.errors().map(|d| d.line).collect();
    assert_eq!(lines, vec![2, 4]);
    assert!(
        p.errors()
            .all(|d| d.severity == Severity::Error && d.file == "t.conf")
    );
}

#[test]
fn detect_format_by_name_and_content() {
    use std::path::Path;
    let csv = "# c\nallreduce,0,10,ring,simple,-1,-1,-1\n";
    let toml = "# c\n\n[[rule]]\nalgorithm = \"ring\"\n";
    assert_eq!(config::detect_format(Path::new("a.conf"), csv), Format::Csv);
    assert_eq!(
        config::detect_format(Path::new("a.conf"), toml),
        Format::Toml
    );
    assert_eq!(
        config::detect_format(Path::new("a.TOML"), csv),
        Format::Toml
    );
    assert_eq!(
        config::detect_format(Path::new("x"), "mode = \"x\"\n"),
        Format::Toml
    );
    assert_eq!(config::detect_format(Path::new("x"), ""), Format::Csv);
}
