//! Shared by the env-toml tests: a replayable RNG and TOML writing helpers.
#![allow(dead_code)]

use std::path::PathBuf;

/// splitmix64, seeded from `CCLKIT_TEST_SEED` or the clock (printed for replay).
pub struct Rng(pub u64);

impl Rng {
    pub fn new() -> Self {
        let seed = std::env::var("CCLKIT_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(11, |d| d.as_nanos() as u64)
            });
        eprintln!("seed {seed} (CCLKIT_TEST_SEED to replay)");
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A string value with quotes, backslashes, tabs and multi-byte characters.
    pub fn text(&mut self) -> String {
        const PARTS: [&str; 10] = ["a", "Z", "7", "\"", "\\", "\t", " ", ",", "é", "日"];
        let len = self.below(61) as usize;
        (0..len)
            .map(|_| PARTS[self.below(PARTS.len() as u64) as usize])
            .collect()
    }
}

/// `s` as a TOML basic string.
pub fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A random value in TOML syntax and what NCCL must read for it.
pub fn random_value(rng: &mut Rng) -> (String, String) {
    match rng.below(4) {
        0 => {
            let n = rng.next() as i64;
            (n.to_string(), n.to_string())
        }
        1 => {
            let b = rng.below(2) == 1;
            (b.to_string(), if b { "1" } else { "0" }.to_owned())
        }
        2 => {
            let n = rng.below(1 << 20);
            (format!("0x{n:x}"), n.to_string())
        }
        _ => {
            let t = rng.text();
            (quoted(&t), t)
        }
    }
}

/// A fresh path under the target's temp dir (removed by the caller if created).
pub fn temp_path(tag: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "cclkit-env-toml-{}-{tag}-{n}.toml",
        std::process::id()
    ))
}
