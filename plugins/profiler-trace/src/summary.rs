//! The one-screen summary printed at finalize: time per collective and size
//! (from the call to the end of its last proxy/network descendant), proxy steps
//! with the time spent in each step state, and network time.

use std::collections::BTreeMap;
use std::fmt::Write;

use cclkit_abi::raw::profiler::{ProfilerEventState, event as bit};

use crate::json::Meta;
use crate::store::{Span, Store};

#[derive(Default)]
struct Stat {
    calls: u64,
    total: u64,
    min: u64,
    max: u64,
}

impl Stat {
    fn add(&mut self, ns: u64) {
        self.min = if self.calls == 0 {
            ns
        } else {
            self.min.min(ns)
        };
        self.max = self.max.max(ns);
        self.calls += 1;
        self.total += ns;
    }
    fn mean_us(&self) -> f64 {
        self.total as f64 / self.calls.max(1) as f64 / 1e3
    }
}

fn end_of(s: &Span, finalized_at: u64) -> u64 {
    let own = if s.end == 0 { finalized_at } else { s.end };
    own.max(s.tree_end).max(s.start)
}

/// Renders the summary (about 10 + one line per collective/size).
pub fn render(store: &Store, meta: &Meta<'_>, trace_path: &str) -> String {
    let mut colls: BTreeMap<(String, u64), Stat> = BTreeMap::new();
    let (mut steps, mut step_bytes) = (Stat::default(), 0u64);
    // Direction comes from the parent ProxyOp; a step without one counts in neither.
    let (mut step_sends, mut step_recvs) = (0u64, 0u64);
    let mut in_state: BTreeMap<i32, u64> = BTreeMap::new();
    let (mut net, mut net_bytes) = (Stat::default(), 0u64);
    let (mut first, mut last) = (u64::MAX, 0u64);
    for s in &store.spans {
        let end = end_of(s, meta.finalized_at);
        first = first.min(s.start);
        last = last.max(end);
        match s.type_bit {
            t if t == bit::COLL || t == bit::P2P => {
                colls
                    .entry((s.name.clone(), s.bytes))
                    .or_default()
                    .add(end - s.start);
            }
            bit::PROXY_STEP => {
                steps.add(end - s.start);
                step_bytes += s.bytes;
                step_sends += u64::from(s.send == Some(true));
                step_recvs += u64::from(s.send == Some(false));
                for (k, (st, at)) in s.states.iter().enumerate() {
                    let until = s.states.get(k + 1).map_or(end, |n| n.1);
                    *in_state.entry(*st).or_default() += until.saturating_sub(*at);
                }
            }
            bit::NET_PLUGIN => {
                net.add(end - s.start);
                net_bytes += s.bytes;
            }
            _ => {}
        }
    }
    let mut out = String::new();
    let span_s = if last > first {
        (last - first) as f64 / 1e9
    } else {
        0.0
    };
    let _ = writeln!(
        out,
        "cclkit profiler: rank {}{} comm {}{}: {} events over {span_s:.3} s{}",
        meta.rank,
        meta.n_ranks.map_or(String::new(), |n| format!("/{n}")),
        meta.comm_name
            .map_or_else(|| "-".to_owned(), |n| format!("\"{n}\"")),
        meta.comm_id
            .map_or(String::new(), |id| format!(" ({id:#x})")),
        store.spans.len(),
        if store.dropped + store.dropped_states > 0 {
            format!(
                ", {} events and {} states DROPPED (raise CCLKIT_PROFILE_MAX_EVENTS)",
                store.dropped, store.dropped_states
            )
        } else {
            String::new()
        }
    );
    if colls.is_empty() {
        out.push_str(
            "  no collective or p2p events (check NCCL_PROFILE_EVENT_MASK / CCLKIT_PROFILE_MASK)\n",
        );
    } else {
        let _ = writeln!(
            out,
            "  {:<16} {:>14} {:>7} {:>11} {:>10} {:>10} {:>10}",
            "operation", "bytes", "calls", "total ms", "mean us", "min us", "max us"
        );
        for ((name, bytes), st) in &colls {
            let _ = writeln!(
                out,
                "  {:<16} {:>14} {:>7} {:>11.3} {:>10.1} {:>10.1} {:>10.1}",
                name,
                bytes,
                st.calls,
                st.total as f64 / 1e6,
                st.mean_us(),
                st.min as f64 / 1e3,
                st.max as f64 / 1e3
            );
        }
    }
    if steps.calls > 0 {
        let _ = writeln!(
            out,
            "  proxy steps: {} ({} send, {} recv), {} bytes, mean {:.1} us",
            steps.calls,
            step_sends,
            step_recvs,
            step_bytes,
            steps.mean_us()
        );
        let total: u64 = in_state.values().sum();
        if total > 0 {
            out.push_str("  time in step state:");
            for (st, ns) in &in_state {
                let name = ProfilerEventState(*st).name().unwrap_or("?");
                let _ = write!(
                    out,
                    " {} {:.0}%",
                    name.trim_start_matches("ProxyStep"),
                    *ns as f64 * 100.0 / total as f64
                );
            }
            out.push('\n');
        }
    }
    if net.calls > 0 {
        let _ = writeln!(
            out,
            "  network: {} events, {} bytes, busy {:.3} ms (mean {:.1} us)",
            net.calls,
            net_bytes,
            net.total as f64 / 1e6,
            net.mean_us()
        );
    }
    let _ = writeln!(out, "  trace: {trace_path}");
    out
}
