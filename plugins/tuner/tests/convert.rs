//! Writing rules back out (CSV and TOML), round trips, large files, and the
//! semantic diff.

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};
use cclkit_tuner::config::{self, CollSet, Format, Interval, Query, Rule, RuleSet};

/// A deterministic generator (no extra dependency).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const COLLS: [&str; 5] = [
    "broadcast",
    "reduce",
    "allgather",
    "reducescatter",
    "allreduce",
];
const ALGOS: [&str; 7] = [
    "tree",
    "ring",
    "collnet_direct",
    "collnet_chain",
    "nvls",
    "nvls_tree",
    "pat",
];
const PROTOS: [&str; 3] = ["ll", "ll128", "simple"];

fn random_csv(rng: &mut Rng, lines: usize) -> String {
    let mut s = String::from("# generated\n");
    for i in 0..lines {
        if i % 97 == 0 {
            s.push_str("# section\n\n");
        }
        let lo = rng.below(1 << 30);
        let hi = if rng.below(10) == 0 {
            u64::MAX
        } else {
            lo + rng.below(1 << 30)
        };
        let hi_s = if hi == u64::MAX {
            "-1".to_owned()
        } else {
            hi.to_string()
        };
        let opt = |rng: &mut Rng, max: u64| -> String {
            if rng.below(2) == 0 {
                "-1".into()
            } else {
                (1 + rng.below(max)).to_string()
            }
        };
        let channels = opt(rng, 32);
        let nodes = opt(rng, 8);
        let ranks = opt(rng, 64);
        let tail = match rng.below(3) {
            0 => String::new(),
            1 => format!(",{}", opt(rng, 4)),
            _ => format!(
                ",{},{}",
                opt(rng, 4),
                ["-1", "0", "1"][rng.below(3) as usize]
            ),
        };
        s.push_str(&format!(
            "{}, {},{} ,{},{},{channels},{nodes},{ranks}{tail}\n",
            COLLS[rng.below(5) as usize],
            lo,
            hi_s,
            ALGOS[rng.below(7) as usize],
            PROTOS[rng.below(3) as usize],
        ));
    }
    s
}

fn strip_lines(mut set: RuleSet) -> RuleSet {
    for r in &mut set.rules {
        r.line = 0;
    }
    set
}

#[test]
fn csv_round_trips_through_csv_and_toml() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let text = random_csv(&mut rng, 500);
    let a = config::parse(&text, "a.conf", Format::Csv);
    assert!(a.is_ok(), "{:?}", a.diagnostics.first());
    assert_eq!(a.rules.rules.len(), 500);

    let (csv, notes) = a.rules.to_csv();
    assert!(notes.is_empty(), "{notes:?}");
    let b = config::parse(&csv, "b.conf", Format::Csv);
    assert!(
        b.is_ok() && b.diagnostics.is_empty(),
        "{:?}",
        b.diagnostics.first()
    );
    assert_eq!(strip_lines(b.rules), strip_lines(a.rules.clone()));

    let toml = a.rules.to_toml();
    let c = config::parse(&toml, "c.toml", Format::Toml);
    assert!(
        c.is_ok() && c.diagnostics.is_empty(),
        "{:?}",
        c.diagnostics.first()
    );
    assert_eq!(
        config::detect_format(std::path::Path::new("x"), &toml),
        Format::Toml
    );
    assert_eq!(strip_lines(c.rules), strip_lines(a.rules));
}

const RICH: &str = r#"
[model]
net_bw = 50.0
arch = "ampere"

[[rule]]
collective = ["allreduce", "reduce"]
size = "0..64K"
nodes = "2..=3"
algorithm = "tree"
protocol = "ll"
channels = 4
chunk_size = "64K"

[[rule]]
size = "1M.."
ranks = "8..1000"
protocol = "simple"

[[rule]]
collective = "allgather"
channels = 2

[defaults.broadcast]
algorithm = "ring"
protocol = "ll128"

[defaults]
algorithm = "ring"
protocol = "simple"
"#;

#[test]
fn toml_round_trips_and_csv_notes_losses() {
    let a = config::parse(RICH, "rich.toml", Format::Toml);
    assert!(a.is_ok(), "{:?}", a.diagnostics);
    let toml = a.rules.to_toml();
    let b = config::parse(&toml, "b.toml", Format::Toml);
    assert!(b.is_ok(), "{:?}\n{toml}", b.diagnostics);
    assert_eq!(strip_lines(b.rules), strip_lines(a.rules.clone()));

    let (csv, notes) = a.rules.to_csv();
    assert_eq!(
        notes,
        vec![
            "rule from line 6: chunk_size dropped (CSV has no such field)",
            "rule from line 15 left out: CSV needs both an algorithm and a protocol",
            "rule from line 20 left out: CSV needs both an algorithm and a protocol",
            "[model] settings dropped (CSV has no such section)",
        ]
    );
    let body: Vec<&str> = csv.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        body,
        vec![
            "reduce,0,65535,tree,ll,4,2,-1",
            "reduce,0,65535,tree,ll,4,3,-1",
            "allreduce,0,65535,tree,ll,4,2,-1",
            "allreduce,0,65535,tree,ll,4,3,-1",
            "broadcast,0,-1,ring,ll128,-1,-1,-1",
            "broadcast,0,-1,ring,simple,-1,-1,-1",
            "reduce,0,-1,ring,simple,-1,-1,-1",
            "allgather,0,-1,ring,simple,-1,-1,-1",
            "reducescatter,0,-1,ring,simple,-1,-1,-1",
            "allreduce,0,-1,ring,simple,-1,-1,-1",
        ]
    );
}

#[test]
fn first_match_follows_file_order() {
    let p = config::parse(RICH, "rich.toml", Format::Toml);
    let q = |func, n, nodes, ranks| Query {
        func,
        n_bytes: n,
        n_nodes: nodes,
        n_ranks: ranks,
        num_pipe_ops: 1,
        reg_buff: Some(false),
    };
    let line = |q: Query| p.rules.first_match(&q).map(|(_, r)| r.line);
    assert_eq!(line(q(Func::ALL_REDUCE, 100, 2, 16)), Some(6));
    assert_eq!(line(q(Func::ALL_REDUCE, 100, 4, 16)), Some(28));
    assert_eq!(line(q(Func::ALL_REDUCE, 1 << 20, 4, 16)), Some(15));
    assert_eq!(line(q(Func::ALL_GATHER, 100, 1, 4)), Some(20));
    assert_eq!(line(q(Func::BROADCAST, 100, 1, 4)), Some(24));
}

#[test]
fn large_file_parses_and_matches_like_a_linear_scan() {
    let mut rng = Rng(42);
    let text = random_csv(&mut rng, 10_000);
    let t0 = std::time::Instant::now();
    let p = config::parse(&text, "big.conf", Format::Csv);
    let parse_time = t0.elapsed();
    assert!(p.is_ok());
    assert_eq!(p.rules.rules.len(), 10_000);
    // Not a performance claim, only a guard against accidental quadratic parsing.
    assert!(parse_time.as_secs() < 20, "{parse_time:?}");

    // The compiled engine must pick exactly the rule a linear first-match scan picks.
    use cclkit_abi::tuner::{CollInfo, CostTable};
    use cclkit_tuner::engine::{Decision, Engine, Mode};
    for (n_ranks, n_nodes) in [(16, 2), (8, 1), (64, 8)] {
        let e = Engine::new(&p.rules, n_ranks, n_nodes, Mode::Rules, None);
        for _ in 0..3000 {
            let func = Func(rng.below(5) as i32);
            let n = rng.below(1 << 31) as usize;
            let pipe = 1 + rng.below(4) as i32;
            let reg = rng.below(2) == 1;
            let mut costs = [1.0f32; 21];
            let mut table = CostTable::new(&mut costs, 7, 3).unwrap();
            let mut ch = 0;
            let info = CollInfo {
                func,
                n_bytes: n,
                num_pipe_ops: pipe,
                reg_buff: Some(reg),
            };
            let got = e.decide(&info, &mut table, &mut ch);
            let want = p.rules.first_match(&Query {
                func,
                n_bytes: n as u64,
                n_nodes: n_nodes as u64,
                n_ranks: n_ranks as u64,
                num_pipe_ops: pipe,
                reg_buff: Some(reg),
            });
            match want {
                Some((_, r)) => {
                    assert_eq!(got, Decision::Rule { line: r.line });
                    assert_eq!(ch, r.channels.map_or(0, |c| c as i32));
                    let (a, pr) = (
                        r.algorithm.unwrap().0 as usize,
                        r.protocol.unwrap().0 as usize,
                    );
                    assert_eq!(costs[a * 3 + pr], 0.0);
                }
                None => assert_eq!(got, Decision::Unchanged),
            }
        }
    }
}

#[test]
fn diff_reports_changed_regions_only() {
    let a = config::parse(
        "allreduce,0,65535,tree,ll,-1,-1,-1\n\
         allreduce,65536,-1,ring,simple,-1,-1,-1\n\
         allgather,0,-1,ring,ll,-1,-1,-1\n",
        "a.conf",
        Format::Csv,
    );
    let b = config::parse(
        r#"
[[rule]]
collective = "allreduce"
size = "0..32K"
algorithm = "tree"
protocol = "ll"

[[rule]]
collective = "allreduce"
size = "32K.."
nodes = 2
algorithm = "ring"
protocol = "ll128"

[[rule]]
collective = "allreduce"
size = "32K.."
algorithm = "ring"
protocol = "simple"

[[rule]]
collective = "allgather"
algorithm = "ring"
protocol = "ll"
"#,
        "b.toml",
        Format::Toml,
    );
    assert!(a.is_ok() && b.is_ok());
    assert!(config::diff(&a.rules, &a.rules).is_empty());
    let d: Vec<String> = config::diff(&a.rules, &b.rules)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        d,
        vec![
            "allreduce size 32K..64K nodes 1 ranks *: tree/ll (line 1) -> ring/simple (line 15)",
            "allreduce size 32K..64K nodes 2 ranks *: tree/ll (line 1) -> ring/ll128 (line 8)",
            "allreduce size 64K.. nodes 2 ranks *: ring/simple (line 2) -> ring/ll128 (line 8)",
            "allreduce size 32K..64K nodes 3.. ranks *: tree/ll (line 1) -> ring/simple (line 15)",
        ]
    );
    let d: Vec<String> = config::diff(&b.rules, &RuleSet::default())
        .iter()
        .map(ToString::to_string)
        .collect();
    // Cut only where a decision changes: below 32K every node count decides alike.
    assert_eq!(
        d,
        vec![
            "allgather size * nodes * ranks *: ring/ll (line 21) -> no rule",
            "allreduce size 0..32K nodes * ranks *: tree/ll (line 2) -> no rule",
            "allreduce size 32K.. nodes 1 ranks *: ring/simple (line 15) -> no rule",
            "allreduce size 32K.. nodes 2 ranks *: ring/ll128 (line 8) -> no rule",
            "allreduce size 32K.. nodes 3.. ranks *: ring/simple (line 15) -> no rule",
        ]
    );
}

#[test]
fn rule_built_in_code() {
    let set = RuleSet {
        rules: vec![Rule {
            collectives: CollSet::single(Func::ALL_GATHER).unwrap(),
            bytes: Interval::new(0, 4095),
            algorithm: Some(Algorithm::PAT),
            protocol: Some(Protocol::SIMPLE),
            ..Rule::any()
        }],
        ..RuleSet::default()
    };
    let (csv, notes) = set.to_csv();
    assert!(notes.is_empty());
    assert!(
        csv.ends_with("allgather,0,4095,pat,simple,-1,-1,-1\n"),
        "{csv}"
    );
    assert!(set.to_toml().contains("size = \"0..4K\""));
}

#[test]
fn nested_ranges_fall_back_to_a_linear_index_with_the_same_decisions() {
    use cclkit_abi::tuner::{CollInfo, CostTable};
    use cclkit_tuner::engine::{Decision, Engine, Mode};
    // 1500 nested size ranges: a segment index would need ~1.1M entries.
    let mut text = String::new();
    for i in 0..1500u64 {
        text.push_str(&format!(
            "allreduce,{},{},{},simple,-1,-1,-1,{}\n",
            i * 1000,
            u64::MAX / 2 - i * 1000,
            ["tree", "ring"][(i % 2) as usize],
            (i % 3) + 1
        ));
    }
    let p = config::parse(&text, "nested.conf", Format::Csv);
    assert!(p.is_ok());
    let e = Engine::new(&p.rules, 8, 1, Mode::Rules, None);
    assert_eq!(e.index_entries(), 1500, "expected the linear fallback");
    let mut rng = Rng(7);
    for _ in 0..2000 {
        let n = rng.below(2_000_000) as usize;
        let pipe = 1 + rng.below(3) as i32;
        let mut costs = [1.0f32; 21];
        let mut table = CostTable::new(&mut costs, 7, 3).unwrap();
        let mut ch = 0;
        let info = CollInfo {
            func: Func::ALL_REDUCE,
            n_bytes: n,
            num_pipe_ops: pipe,
            reg_buff: None,
        };
        let got = e.decide(&info, &mut table, &mut ch);
        let want = p.rules.first_match(&Query {
            func: Func::ALL_REDUCE,
            n_bytes: n as u64,
            n_nodes: 1,
            n_ranks: 8,
            num_pipe_ops: pipe,
            reg_buff: None,
        });
        assert_eq!(
            got,
            want.map_or(Decision::Unchanged, |(_, r)| Decision::Rule {
                line: r.line
            })
        );
    }
}

/// The examples in README.md parse cleanly.
#[test]
fn readme_examples_parse() {
    let readme = include_str!("../README.md");
    let block = |fence: &str, after: &str| -> String {
        let start = readme.find(after).unwrap();
        let rest = &readme[start..];
        let open = rest.find(fence).unwrap() + fence.len();
        let close = rest[open..].find("```").unwrap();
        rest[open..open + close].to_owned()
    };
    let csv = block("```\n", "## NCCL CSV");
    let p = config::parse(&csv, "README.csv", Format::Csv);
    assert!(p.is_ok() && p.diagnostics.is_empty(), "{:?}", p.diagnostics);
    assert_eq!(p.rules.rules.len(), 5);
    let toml = block("```toml\n", "## cclkit TOML");
    let p = config::parse(&toml, "README.toml", Format::Toml);
    assert!(p.is_ok() && p.diagnostics.is_empty(), "{:?}", p.diagnostics);
    assert_eq!(p.rules.rules.len(), 5);
}
