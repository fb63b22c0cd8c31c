//! The tuner report: every distinct decision a communicator ran with, its call count
//! and the exact sizes it covered (`CCLKIT_TUNER_REPORT=1`, `cclkit perf --json`).
//!
//! Calls are recorded per collective and exact size (the `nBytes` tuners see), so a
//! size class never hides a second decision. Consecutive recorded sizes with the same
//! decision merge into one entry; a decision that stops and starts again gets one
//! entry per stretch, so an entry's range holds only sizes that ran with it.

use std::collections::BTreeMap;

use cclkit_abi::raw::common::Func;

use super::{Decision, Source};

/// Distinct sizes kept per communicator; calls at further sizes are counted only.
pub const MAX_SIZES: usize = 4096;

/// One entry of the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportEntry {
    /// The collective.
    pub func: Func,
    /// What it ran with.
    pub decision: Decision,
    /// Calls made with this decision over the range.
    pub calls: u64,
    /// Smallest size (bytes, as tuners see them) that ran with it.
    pub min_bytes: usize,
    /// Largest size that ran with it; every recorded size in between did too.
    pub max_bytes: usize,
}

/// Calls recorded per (collective, size), then per decision.
#[derive(Debug, Default)]
pub(super) struct Records {
    by_size: BTreeMap<(i32, usize), Vec<(Decision, u64)>>,
    /// Calls at sizes beyond [`MAX_SIZES`].
    unitemised: u64,
    /// The last call recorded, and whether it was itemised: a run of identical
    /// calls (a benchmark or a training loop) is counted in `repeats` instead of
    /// looking its size up again on every call.
    last: Option<(i32, usize, Decision, bool)>,
    /// Calls identical to `last` made since it was recorded.
    repeats: u64,
}

impl Records {
    /// Counts one call.
    pub(super) fn record(&mut self, func: Func, bytes: usize, d: Decision) {
        if let Some((f, b, x, _)) = self.last
            && (f, b, x) == (func.0, bytes, d)
        {
            self.repeats += 1;
            return;
        }
        self.settle();
        let itemised = self.itemise(func.0, bytes, d, 1);
        self.last = Some((func.0, bytes, d, itemised));
    }

    /// Adds `n` calls to (collective, size, decision); false when the size found
    /// no room (counted in `unitemised` instead).
    fn itemise(&mut self, f: i32, bytes: usize, d: Decision, n: u64) -> bool {
        let full = self.by_size.len() >= MAX_SIZES;
        let slot = match self.by_size.get_mut(&(f, bytes)) {
            Some(s) => s,
            None if full => {
                self.unitemised += n;
                return false;
            }
            None => self.by_size.entry((f, bytes)).or_default(),
        };
        match slot.iter_mut().find(|(x, _)| *x == d) {
            Some((_, c)) => *c += n,
            None => slot.push((d, n)),
        }
        true
    }

    /// Moves the repeats of the last call into the tables.
    fn settle(&mut self) {
        let n = std::mem::take(&mut self.repeats);
        match self.last {
            Some((f, bytes, d, true)) if n > 0 => {
                self.itemise(f, bytes, d, n);
            }
            Some((_, _, _, false)) => self.unitemised += n,
            _ => {}
        }
    }

    /// Calls at sizes beyond [`MAX_SIZES`].
    pub(super) fn unitemised(&mut self) -> u64 {
        self.settle();
        self.unitemised
    }

    /// The entries, by collective then smallest size.
    pub(super) fn entries(&mut self) -> Vec<ReportEntry> {
        self.settle();
        let mut out: Vec<ReportEntry> = Vec::new();
        // Entries that reached the previous recorded size of the same collective.
        let mut open: Vec<usize> = Vec::new();
        let mut prev: Option<i32> = None;
        for (&(f, bytes), decisions) in &self.by_size {
            if prev != Some(f) {
                open.clear();
                prev = Some(f);
            }
            let mut touched = Vec::with_capacity(decisions.len());
            for &(d, n) in decisions {
                match open.iter().find(|&&i| out[i].decision == d) {
                    Some(&i) => {
                        out[i].max_bytes = bytes;
                        out[i].calls += n;
                        touched.push(i);
                    }
                    None => {
                        touched.push(out.len());
                        out.push(ReportEntry {
                            func: Func(f),
                            decision: d,
                            calls: n,
                            min_bytes: bytes,
                            max_bytes: bytes,
                        });
                    }
                }
            }
            open = touched;
        }
        out.sort_by_key(|e| (e.func.0, e.min_bytes, e.max_bytes));
        out
    }
}

/// The report as text: one line per entry.
pub(super) fn text(tuner: &str, fallbacks: u64, records: &mut Records) -> String {
    let mut s = format!(
        "# tuner report ({tuner}; {fallbacks} fallback(s))\n#  {:>13} {:>25} {:>6} {:>7} {:>4} {:>9} {:>8} {:>8}\n",
        "collective", "bytes", "algo", "proto", "nch", "chunk", "source", "calls"
    );
    for e in records.entries() {
        let d = e.decision;
        let range = if e.min_bytes == e.max_bytes {
            e.min_bytes.to_string()
        } else {
            format!("{}-{}", e.min_bytes, e.max_bytes)
        };
        s.push_str(&format!(
            "#  {:>13} {:>25} {:>6} {:>7} {:>4} {:>9} {:>8} {:>8}\n",
            format!("{:?}", e.func),
            range,
            d.algo.name().unwrap_or("?"),
            d.proto.name().unwrap_or("?"),
            d.channels,
            d.chunk,
            source_name(d.source),
            e.calls
        ));
    }
    let unitemised = records.unitemised();
    if unitemised > 0 {
        s.push_str(&format!(
            "#  {unitemised} call(s) at sizes beyond the first {MAX_SIZES} distinct ones are not itemised\n"
        ));
    }
    s
}

/// `Model`, `Tuner` or `Fallback`.
pub fn source_name(s: Source) -> &'static str {
    match s {
        Source::Model => "Model",
        Source::Tuner => "Tuner",
        Source::Fallback => "Fallback",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cclkit_abi::raw::common::{Algorithm, Protocol};

    fn d(algo: Algorithm, proto: Protocol) -> Decision {
        Decision {
            algo,
            proto,
            channels: 1,
            chunk: 4096,
            source: Source::Tuner,
        }
    }

    #[test]
    fn each_decision_keeps_its_exact_range() {
        let tree = d(Algorithm::TREE, Protocol::LL);
        let ring = d(Algorithm::RING, Protocol::SIMPLE);
        let mut r = Records::default();
        // The case: threshold 66000 inside the 64 KiB–128 KiB power-of-two class.
        for (bytes, calls) in [
            (40_000, 3),
            (65_536, 44),
            (65_999, 2),
            (66_000, 5),
            (88_000, 39),
        ] {
            let pick = if bytes < 66_000 { tree } else { ring };
            for _ in 0..calls {
                r.record(Func::ALL_REDUCE, bytes, pick);
            }
        }
        // A fallback in the middle of the ring range splits it into two stretches.
        r.record(Func::ALL_REDUCE, 70_000, tree);
        for _ in 0..2 {
            r.record(Func::ALL_REDUCE, 90_000, ring);
        }
        r.record(Func::BROADCAST, 88_000, ring);
        let got: Vec<(i32, i32, u64, usize, usize)> = r
            .entries()
            .iter()
            .map(|e| {
                (
                    e.func.0,
                    e.decision.algo.0,
                    e.calls,
                    e.min_bytes,
                    e.max_bytes,
                )
            })
            .collect();
        let (t, g) = (Algorithm::TREE.0, Algorithm::RING.0);
        let (ar, bc) = (Func::ALL_REDUCE.0, Func::BROADCAST.0);
        let mut want = vec![
            (ar, t, 49, 40_000, 65_999),
            (ar, g, 5, 66_000, 66_000),
            (ar, t, 1, 70_000, 70_000),
            (ar, g, 41, 88_000, 90_000),
            (bc, g, 1, 88_000, 88_000),
        ];
        want.sort_by_key(|w| (w.0, w.3, w.4));
        assert_eq!(got, want);
        let text = text("x", 0, &mut r);
        assert!(text.contains("88000-90000"), "{text}");
        assert!(text.contains("40000-65999"), "{text}");
    }

    #[test]
    fn sizes_beyond_the_cap_are_counted_not_itemised() {
        let ring = d(Algorithm::RING, Protocol::SIMPLE);
        let mut r = Records::default();
        for b in 0..MAX_SIZES + 3 {
            r.record(Func::ALL_GATHER, b * 7 + 1, ring);
        }
        r.record(Func::ALL_GATHER, 1, ring);
        assert_eq!(r.unitemised(), 3);
        // Repeats of a call count where the call did, read at any time.
        let beyond = (MAX_SIZES + 2) * 7 + 1;
        for _ in 0..4 {
            r.record(Func::ALL_GATHER, beyond, ring);
        }
        assert_eq!(r.unitemised(), 7);
        for _ in 0..5 {
            r.record(Func::ALL_GATHER, 1, ring);
        }
        let e = r.entries();
        assert_eq!(e.len(), 1);
        assert_eq!(
            (e[0].calls, e[0].min_bytes, e[0].max_bytes),
            (MAX_SIZES as u64 + 6, 1, (MAX_SIZES - 1) * 7 + 1)
        );
        assert_eq!(r.unitemised(), 7);
    }
}
