//! cclkit TOML parsing: every key and value form, defaults, [model], each error.

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};
use cclkit_tuner::config::{self, CollSet, Format, Interval, Rule};
use cclkit_tuner::model::{Arch, IntraLink};

fn parse(text: &str) -> config::Parsed {
    config::parse(text, "t.toml", Format::Toml)
}

fn ok(text: &str) -> Vec<Rule> {
    let p = parse(text);
    assert!(p.is_ok(), "{:?}", p.diagnostics);
    assert!(p.diagnostics.is_empty(), "{:?}", p.diagnostics);
    p.rules.rules
}

fn errors(text: &str) -> Vec<String> {
    let p = parse(text);
    p.errors().map(ToString::to_string).collect()
}

const K: u64 = 1024;
const M: u64 = 1024 * 1024;

#[test]
fn every_field_form() {
    let rules = ok(r#"
# comment
[[rule]]
collective = "allreduce"
size = "0..64K"
nodes = 2
ranks = "16..=64"
pipe_ops = "2.."
reg_buff = true
algorithm = "tree"
protocol = "ll"
channels = 8

[[rule]]
collective = ["AllGather", "reduce_scatter"]
size = "64KiB..=1M"
nodes = "..4"
algorithm = "Ring"
chunk_size = "512K"

[[rule]]
collective = "*"
size = 4096
ranks = "*"
protocol = "simple"

[[rule]]
size = "1G.."
reg_buff = 0
channels = 32

[[rule]]
collective = "broadcast"
size = "..=1T"
chunk_size = 131072
"#);
    assert_eq!(rules.len(), 5);
    let r = &rules[0];
    assert_eq!(r.line, 3);
    assert_eq!(r.collectives, CollSet::single(Func::ALL_REDUCE).unwrap());
    assert_eq!(r.bytes, Interval::new(0, 64 * K - 1));
    assert_eq!(r.nodes, Interval::exact(2));
    assert_eq!(r.ranks, Interval::new(16, 64));
    assert_eq!(r.pipe_ops, Interval::new(2, u64::MAX));
    assert_eq!(r.reg_buff, Some(true));
    assert_eq!(
        (r.algorithm, r.protocol, r.channels, r.chunk_size),
        (Some(Algorithm::TREE), Some(Protocol::LL), Some(8), None)
    );
    let r = &rules[1];
    assert_eq!(r.line, 14);
    let mut both = CollSet::EMPTY;
    both.insert(Func::ALL_GATHER);
    both.insert(Func::REDUCE_SCATTER);
    assert_eq!(r.collectives, both);
    assert_eq!(r.bytes, Interval::new(64 * K, M));
    assert_eq!(r.nodes, Interval::new(0, 3));
    assert_eq!((r.algorithm, r.protocol), (Some(Algorithm::RING), None));
    assert_eq!(r.chunk_size, Some(512 * K));
    let r = &rules[2];
    assert_eq!(r.collectives, CollSet::ALL);
    assert_eq!(r.bytes, Interval::exact(4096));
    assert_eq!(r.ranks, Interval::ANY);
    assert_eq!((r.algorithm, r.protocol), (None, Some(Protocol::SIMPLE)));
    let r = &rules[3];
    assert_eq!(r.collectives, CollSet::ALL);
    assert_eq!(r.bytes, Interval::new(1 << 30, u64::MAX));
    assert_eq!(r.reg_buff, Some(false));
    assert_eq!(r.channels, Some(32));
    let r = &rules[4];
    assert_eq!(r.bytes, Interval::new(0, 1 << 40));
    assert_eq!(r.chunk_size, Some(131072));
    assert!(!r.acts_on_coll_info());
}

#[test]
fn defaults_follow_rules_and_model_settings() {
    let p = parse(
        r#"
[model]
intra_bw = 300
net_bw = 48.5
net_lat = 1.5
intra_link = "PCI"
arch = "blackwell"
channels = 24

[defaults]
protocol = "simple"

[defaults.allreduce]
algorithm = "ring"
protocol = "ll128"
chunk_size = "1M"

[defaults.broadcast]
channels = 4

[[rule]]
collective = "allreduce"
size = "..1K"
algorithm = "tree"
protocol = "ll"
"#,
    );
    assert!(p.is_ok(), "{:?}", p.diagnostics);
    let m = p.rules.model;
    assert_eq!(m.intra_bw, Some(300.0));
    assert_eq!(m.net_bw, Some(48.5));
    assert_eq!(m.net_lat, Some(1.5));
    assert_eq!(m.intra_link, Some(IntraLink::Pci));
    assert_eq!(m.arch, Some(Arch::Blackwell));
    assert_eq!(m.channels, Some(24));
    let r = &p.rules.rules;
    assert_eq!(r.len(), 4);
    assert!(!r[0].is_default);
    assert_eq!(r[0].algorithm, Some(Algorithm::TREE));
    // Per-collective defaults (sorted by name), then the all-collective one.
    assert!(r[1..].iter().all(|r| r.is_default));
    assert_eq!(r[1].collectives, CollSet::single(Func::ALL_REDUCE).unwrap());
    assert_eq!(r[1].chunk_size, Some(M));
    assert_eq!(r[1].line, 13);
    assert_eq!(r[2].collectives, CollSet::single(Func::BROADCAST).unwrap());
    assert_eq!(r[2].channels, Some(4));
    assert_eq!(r[3].collectives, CollSet::ALL);
    assert_eq!(r[3].protocol, Some(Protocol::SIMPLE));
    assert!(r[1..].iter().all(|r| r.bytes.is_any() && r.nodes.is_any()));
}

#[test]
fn each_error_message() {
    let cases: [(&str, &str); 27] = [
        (
            "[[rule]]\nalgo = \"ring\"\n",
            "t.toml:2: unknown key `algo` in [[rule]] (expected collective, size, nodes, ranks, pipe_ops, reg_buff, algorithm, protocol, channels, chunk_size)",
        ),
        (
            "[[rule]]\nsize = \"0..1K\"\n",
            "t.toml:1: [[rule]] sets nothing: give algorithm, protocol, channels or chunk_size",
        ),
        (
            "[[rule]]\nalgorithm = \"rng\"\n",
            "t.toml:2: unknown algorithm \"rng\" (expected tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree or pat)",
        ),
        (
            "[[rule]]\nprotocol = \"fast\"\n",
            "t.toml:2: unknown protocol \"fast\" (expected ll, ll128 or simple)",
        ),
        (
            "[[rule]]\ncollective = \"alltoall\"\nchannels = 2\n",
            "t.toml:2: unknown collective \"alltoall\" (expected broadcast, reduce, allgather, reducescatter or allreduce)",
        ),
        (
            "[[rule]]\ncollective = []\nchannels = 2\n",
            "t.toml:2: `collective` must not be an empty list",
        ),
        (
            "[[rule]]\nalgorithm = 1\n",
            "t.toml:2: `algorithm` must be a string",
        ),
        (
            "[[rule]]\nsize = \"64Q\"\nchannels = 2\n",
            "t.toml:2: `size`: \"64Q\" has an unknown size suffix \"Q\" (expected K, M, G or T)",
        ),
        (
            "[[rule]]\nsize = \"1M..1K\"\nchannels = 2\n",
            "t.toml:2: `size`: range \"1M..1K\" is empty",
        ),
        (
            "[[rule]]\nsize = \"..0\"\nchannels = 2\n",
            "t.toml:2: `size`: range \"..0\" is empty",
        ),
        (
            "[[rule]]\nsize = -4\nchannels = 2\n",
            "t.toml:2: `size` must not be negative, got -4 (omit the key to match any)",
        ),
        (
            "[[rule]]\nnodes = \"two\"\nchannels = 2\n",
            "t.toml:2: `nodes`: \"two\" is not a non-negative integer",
        ),
        (
            "[[rule]]\nranks = 1.5\nchannels = 2\n",
            "t.toml:2: `ranks` must be an integer or a range string like \"2..8\", not float",
        ),
        (
            "[[rule]]\nreg_buff = \"yes\"\nchannels = 2\n",
            "t.toml:2: `reg_buff` must be true or false",
        ),
        (
            "[[rule]]\nchannels = 0\n",
            "t.toml:2: `channels` must be at least 1, got 0",
        ),
        (
            "[[rule]]\nchannels = \"8\"\n",
            "t.toml:2: `channels` must be an integer, not string",
        ),
        (
            "[[rule]]\nchunk_size = 0\n",
            "t.toml:2: `chunk_size` must be greater than 0",
        ),
        (
            "[[rule]]\nchunk_size = \"big\"\n",
            "t.toml:2: `chunk_size`: \"big\" is not a size (expected e.g. 4096, 64K, 1M, 2G)",
        ),
        (
            "[[rule]]\nchunk_size = \"1M\"\npipe_ops = 2\n",
            "t.toml:1: chunk_size cannot be combined with pipe_ops or reg_buff (NCCL does not pass them to getChunkSize)",
        ),
        (
            "[rule]\nchannels = 2\n",
            "t.toml:1: `rule` must be written as [[rule]] tables",
        ),
        (
            "rules = 1\n",
            "t.toml:1: unknown top-level key `rules` (expected [[rule]], [defaults] or [model])",
        ),
        (
            "[defaults.alltoall]\nchannels = 2\n",
            "t.toml:1: unknown key `alltoall` in [defaults] (expected algorithm, protocol, channels, chunk_size, or a collective: broadcast, reduce, allgather, reducescatter or allreduce)",
        ),
        (
            "[defaults.allreduce]\nsize = \"1K\"\n",
            "t.toml:2: unknown key `size` in [defaults.allreduce] (expected algorithm, protocol, channels, chunk_size)",
        ),
        (
            "[model]\nnet_bw = 0\n",
            "t.toml:2: `net_bw` must be a positive number",
        ),
        (
            "[model]\nnet_lat = -1.0\n",
            "t.toml:2: `net_lat` must be a number ≥ 0",
        ),
        (
            "[model]\narch = \"kepler\"\n",
            "t.toml:2: `arch`: unknown architecture \"kepler\" (expected volta, ampere, hopper or blackwell)",
        ),
        (
            "[model]\nbandwidth = 1\n",
            "t.toml:2: unknown key `bandwidth` in [model] (expected intra_bw, net_bw, net_lat, intra_link, arch, channels)",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(errors(text), vec![want.to_owned()], "{text}");
    }
}

#[test]
fn invalid_toml_names_its_line() {
    let e = errors("[[rule]]\nalgorithm = \"ring\"\nprotocol = \n");
    assert_eq!(e.len(), 1);
    assert!(e[0].starts_with("t.toml:3: invalid TOML: "), "{e:?}");
}

#[test]
fn several_bad_rules_all_reported() {
    let e = errors(
        "[[rule]]\nalgorithm = \"x\"\n\n[[rule]]\nalgorithm = \"ring\"\n\n[[rule]]\nprotocol = \"y\"\nchannels = -1\n",
    );
    assert_eq!(
        e,
        vec![
            "t.toml:2: unknown algorithm \"x\" (expected tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree or pat)",
            "t.toml:8: unknown protocol \"y\" (expected ll, ll128 or simple)",
            "t.toml:9: `channels` must be at least 1, got -1",
        ]
    );
}
