//! Byte sizes with binary suffixes (`64K`, `1MiB`, `2G`) and inclusive intervals.

use std::fmt;

/// An inclusive range of unsigned values; [`Interval::ANY`] matches everything.
///
/// Byte sizes, node, rank and pipelined-op counts all use it: NCCL's CSV `-1`
/// wildcard is `ANY`, a single value is `exact`. `lo > hi` is an empty interval
/// that matches nothing (a CSV rule with `min_bytes > max_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Interval {
    /// Smallest value included.
    pub lo: u64,
    /// Largest value included.
    pub hi: u64,
}

impl Interval {
    /// Every value.
    pub const ANY: Self = Self {
        lo: 0,
        hi: u64::MAX,
    };

    /// `[lo, hi]`, both included.
    pub const fn new(lo: u64, hi: u64) -> Self {
        Self { lo, hi }
    }

    /// Exactly `v`.
    pub const fn exact(v: u64) -> Self {
        Self { lo: v, hi: v }
    }

    /// Whether `v` lies inside.
    #[inline]
    pub const fn contains(&self, v: u64) -> bool {
        self.lo <= v && v <= self.hi
    }

    /// Whether this is [`Interval::ANY`].
    pub const fn is_any(&self) -> bool {
        self.lo == 0 && self.hi == u64::MAX
    }

    /// Whether nothing lies inside.
    pub const fn is_empty(&self) -> bool {
        self.lo > self.hi
    }

    /// The single value inside, if there is exactly one.
    pub const fn exact_value(&self) -> Option<u64> {
        if self.lo == self.hi {
            Some(self.lo)
        } else {
            None
        }
    }

    /// The overlap of two intervals (possibly empty).
    pub fn intersect(&self, other: &Self) -> Self {
        Self::new(self.lo.max(other.lo), self.hi.min(other.hi))
    }

    /// Writes the interval in the TOML range syntax (`*`, `4`, `2..=8`, `64K..1M`,
    /// `1M..`); `sizes` picks byte-size suffixes.
    pub fn display(&self, sizes: bool) -> IntervalDisplay {
        IntervalDisplay { iv: *self, sizes }
    }
}

/// [`Interval::display`]'s result.
pub struct IntervalDisplay {
    iv: Interval,
    sizes: bool,
}

impl fmt::Display for IntervalDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Interval { lo, hi } = self.iv;
        let num = |v: u64| {
            if self.sizes {
                format_size(v)
            } else {
                v.to_string()
            }
        };
        if self.iv.is_any() {
            f.write_str("*")
        } else if lo == hi {
            f.write_str(&num(lo))
        } else if hi == u64::MAX {
            write!(f, "{}..", num(lo))
        } else if self.sizes && format_size(hi + 1) != (hi + 1).to_string() {
            // A round exclusive end reads better: 0..64K rather than 0..=65535.
            write!(f, "{}..{}", num(lo), format_size(hi + 1))
        } else {
            write!(f, "{}..={}", num(lo), num(hi))
        }
    }
}

const SUFFIXES: [(&str, u32); 4] = [("K", 10), ("M", 20), ("G", 30), ("T", 40)];

/// Parses `4096`, `64K`, `64k`, `64KiB`, `1M`, `2G`, `1T` (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (num, suffix) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!(
            "\"{s}\" is not a size (expected e.g. 4096, 64K, 1M, 2G)"
        ));
    }
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        u => SUFFIXES
            .iter()
            .find(|(k, _)| u == *k || u == format!("{k}IB") || u == format!("{k}B"))
            .map(|(_, sh)| *sh)
            .ok_or_else(|| {
                format!("\"{s}\" has an unknown size suffix \"{suffix}\" (expected K, M, G or T)")
            })?,
    };
    let v: u64 = num.parse().map_err(|_| format!("\"{s}\" is too large"))?;
    v.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("\"{s}\" is too large"))
}

/// The shortest exact spelling of a byte size: `65536` → `64K`, `1000` → `1000`.
pub fn format_size(v: u64) -> String {
    for (k, sh) in SUFFIXES.iter().rev() {
        let unit = 1u64 << sh;
        if v >= unit && v % unit == 0 {
            return format!("{}{k}", v / unit);
        }
    }
    v.to_string()
}

/// Parses the TOML range syntax: `*`/`any`, `N`, `A..B` (B excluded), `A..=B`,
/// `A..`, `..B`, `..=B`. `sizes` allows size suffixes.
pub fn parse_interval(s: &str, sizes: bool) -> Result<Interval, String> {
    let t = s.trim();
    if t == "*" || t.eq_ignore_ascii_case("any") {
        return Ok(Interval::ANY);
    }
    let num = |x: &str| -> Result<u64, String> {
        if sizes {
            parse_size(x)
        } else {
            let x = x.trim();
            x.parse::<u64>()
                .map_err(|_| format!("\"{x}\" is not a non-negative integer"))
        }
    };
    let Some((a, b)) = t.split_once("..") else {
        return num(t).map(Interval::exact);
    };
    let lo = if a.trim().is_empty() { 0 } else { num(a)? };
    let iv = if let Some(b) = b.strip_prefix('=') {
        Interval::new(lo, num(b)?)
    } else if b.trim().is_empty() {
        Interval::new(lo, u64::MAX)
    } else {
        let end = num(b)?;
        if end == 0 {
            return Err(format!("range \"{t}\" is empty"));
        }
        Interval::new(lo, end - 1)
    };
    if iv.is_empty() {
        return Err(format!("range \"{t}\" is empty"));
    }
    Ok(iv)
}
