//! Hostile rule files (issue 16): seeded random mutations of valid CSV and TOML
//! files never panic the parsers, every diagnostic names a line of the file and
//! stays short (echoed values are cut), a file above the size limit is refused
//! before it is read, and the semantic diff of mutated files agrees with itself.

use cclkit_tuner::config::{self, Format, MAX_FILE_BYTES};

const CSV: &str = "\
# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff
allreduce,0,65536,tree,ll,4,1,-1,-1,-1
allreduce,65537,-1,ring,simple,-1,-1,-1,1,0
broadcast,0,4096,ring,ll128,2,2,8,-1,1
allgather,1024,1048576,ring,simple,-1,-1,-1
";

const TOML: &str = r#"
[model]
net_bw = 50.0

[[rule]]
collective = ["allreduce", "reducescatter"]
size = "0..64K"
nodes = "2.."
algorithm = "tree"
protocol = "ll"
channels = 8

[[rule]]
collective = "broadcast"
size = "4K..=1M"
algorithm = "ring"

[defaults.allreduce]
algorithm = "ring"
protocol = "simple"
chunk_size = "512K"
"#;

/// A seeded xorshift (no extra dependency; failures are reproducible by seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Pieces a mutation may insert: separators, numbers at the edges, names, junk.
const PIECES: &[&str] = &[
    ",",
    "\n",
    "=",
    "\"",
    "[",
    "]",
    "..",
    "..=",
    "-1",
    "0",
    "18446744073709551616",
    "99999999999999999999999",
    "1e309",
    "K",
    "G",
    "ring",
    "tree",
    "ll",
    "ll128",
    "nvls",
    "allreduce",
    "bogus",
    "#",
    "\u{0}",
    "é",
    " ",
    "[[rule]]",
    "size",
    "nodes",
    "ranks",
];

fn mutate(base: &str, rng: &mut Rng) -> String {
    let mut s: Vec<char> = base.chars().collect();
    for _ in 0..1 + rng.below(6) {
        let at = rng.below(s.len() + 1);
        match rng.below(4) {
            0 if !s.is_empty() => {
                let end = (at + rng.below(12)).min(s.len());
                s.drain(at.min(end)..end);
            }
            1 => {
                let p = PIECES[rng.below(PIECES.len())];
                s.splice(at..at, p.chars());
            }
            2 => {
                // A very long field: the message must not echo it whole.
                let long: String = "7".repeat(1000 + rng.below(3000));
                s.splice(at..at, long.chars());
            }
            _ => {
                let c = char::from_u32(rng.next() as u32 % 0x250).unwrap_or('x');
                s.insert(at, c);
            }
        }
    }
    s.into_iter().collect()
}

#[test]
fn mutated_files_never_panic_and_every_diagnostic_names_a_line() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for (base, format) in [(CSV, Format::Csv), (TOML, Format::Toml)] {
        for _ in 0..1200 {
            let text = mutate(base, &mut rng);
            let lines = text.lines().count().max(1) as u32 + 1;
            let p = config::parse(&text, "m.conf", format);
            for d in &p.diagnostics {
                assert!(d.line <= lines, "line {} of {lines}: {d}\n{text}", d.line);
                let shown = d.to_string();
                assert!(
                    shown.chars().count() <= 600,
                    "{} chars echoed: {}…",
                    shown.len(),
                    &shown[..shown
                        .char_indices()
                        .nth(200)
                        .map_or(shown.len(), |(i, _)| i)]
                );
            }
            if p.is_ok() {
                // A readable file agrees with itself everywhere.
                assert!(config::diff(&p.rules, &p.rules).is_empty());
            }
        }
    }
}

#[test]
fn a_file_above_the_limit_is_refused_before_it_is_read() {
    let dir = std::env::temp_dir().join(format!("cclkit-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.toml");
    let f = std::fs::File::create(&path).unwrap();
    // Sparse: costs no disk, but its size is over the limit.
    f.set_len(MAX_FILE_BYTES + 1).unwrap();
    let t = std::time::Instant::now();
    let e = config::load(&path).unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    std::fs::remove_dir_all(&dir).unwrap();
}
