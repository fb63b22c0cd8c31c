//! Writes a [`Store`] as Chrome trace-event JSON (opened by Perfetto and
//! `chrome://tracing`).
//!
//! Every span is a complete event (`"ph":"X"`) with `args.id` and `args.parent`
//! (the span index of its parent, so the tree survives any viewer), and is placed
//! on a thread track where it nests properly: the viewers require slices on one
//! track to be either disjoint or contained, while proxy steps of one channel
//! overlap (pipelining). Tracks are grouped (host calls, proxy channel N send or
//! recv, proxy thread, kernel) and split into as many lanes as overlaps need.

use std::collections::BTreeMap;
use std::fmt::Write;

use cclkit_abi::raw::profiler::{ProfilerEventState, event as bit};

use crate::store::{Span, Store, Value};

/// What the file header says about the communicator.
pub struct Meta<'a> {
    /// This rank (the process id in the viewer).
    pub rank: i32,
    /// Ranks in the communicator, if known.
    pub n_ranks: Option<i32>,
    /// Communicator name, if set.
    pub comm_name: Option<&'a str>,
    /// Communicator id or hash, if known.
    pub comm_id: Option<u64>,
    /// Profiler ABI version NCCL used.
    pub host_abi: u32,
    /// Finalize time: end of spans never stopped.
    pub finalized_at: u64,
}

/// Appends `s` as a JSON string literal.
pub fn push_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Nanoseconds as microseconds with three exact decimals.
fn push_us(out: &mut String, ns: u64) {
    let _ = write!(out, "{}.{:03}", ns / 1000, ns % 1000);
}

fn push_value(out: &mut String, v: &Value) {
    match v {
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::UInt(u) => {
            let _ = write!(out, "{u}");
        }
        Value::Str(s) => push_str(out, s),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
    }
}

/// The track group a span belongs to, with its display name.
fn group_of(span: &Span) -> (u32, String) {
    if span.type_bit & (bit::PROXY_OP | bit::PROXY_STEP | bit::NET_PLUGIN) != 0 {
        let ch = span.channel.map_or(255, u32::from);
        let send = span.send.unwrap_or(true);
        let name = match span.channel {
            Some(c) => format!("proxy ch{c} {}", if send { "send" } else { "recv" }),
            None => format!("proxy {}", if send { "send" } else { "recv" }),
        };
        (100 + ch * 2 + u32::from(!send), name)
    } else if span.type_bit == bit::PROXY_CTRL {
        (2, "proxy thread".to_owned())
    } else if span.type_bit & (bit::KERNEL_CH | bit::KERNEL_PHASE) != 0 {
        (
            1000 + span.channel.map_or(255, u32::from),
            format!("kernel ch{}", span.channel.unwrap_or(255)),
        )
    } else {
        (1, "host".to_owned())
    }
}

/// Assigns every span a thread id where it nests properly; returns the ids and
/// the (tid, name) list for metadata.
fn lanes(spans: &[Span], finalized_at: u64) -> (Vec<u32>, Vec<(u32, String)>) {
    let end = |s: &Span| {
        if s.end == 0 {
            finalized_at.max(s.start)
        } else {
            s.end.max(s.start)
        }
    };
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| (spans[i].start, std::cmp::Reverse(end(&spans[i])), i));
    // Per group: the lanes, each a stack of open (end) times.
    let mut groups: BTreeMap<u32, (String, Vec<Vec<u64>>)> = BTreeMap::new();
    let mut lane_of = vec![(0u32, 0usize); spans.len()];
    for i in order {
        let (g, name) = group_of(&spans[i]);
        let (start, stop) = (spans[i].start, end(&spans[i]));
        let lanes = &mut groups.entry(g).or_insert_with(|| (name, Vec::new())).1;
        let mut chosen = None;
        for (li, stack) in lanes.iter_mut().enumerate() {
            while stack.last().is_some_and(|&e| e <= start) {
                stack.pop();
            }
            if stack.last().is_none_or(|&e| e >= stop) {
                stack.push(stop);
                chosen = Some(li);
                break;
            }
        }
        let li = chosen.unwrap_or_else(|| {
            lanes.push(vec![stop]);
            lanes.len() - 1
        });
        lane_of[i] = (g, li);
    }
    // Number the (group, lane) pairs densely, in group order.
    let mut tids = BTreeMap::new();
    let mut names = Vec::new();
    for (g, (name, lanes)) in &groups {
        for li in 0..lanes.len() {
            let tid = names.len() as u32 + 1;
            tids.insert((*g, li), tid);
            let label = if li == 0 {
                name.clone()
            } else {
                format!("{name} #{li}")
            };
            names.push((tid, label));
        }
    }
    let ids = lane_of
        .iter()
        .map(|k| tids.get(k).copied().unwrap_or(0))
        .collect();
    (ids, names)
}

/// Renders the whole file.
pub fn render(store: &Store, meta: &Meta<'_>) -> String {
    let mut out = String::with_capacity(256 + store.spans.len() * 220);
    let pid = meta.rank;
    out.push_str(
        "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"tool\":\"cclkit-profiler-trace\",\"rank\":",
    );
    let _ = write!(out, "{}", meta.rank);
    if let Some(n) = meta.n_ranks {
        let _ = write!(out, ",\"nRanks\":{n}");
    }
    if let Some(name) = meta.comm_name {
        out.push_str(",\"commName\":");
        push_str(&mut out, name);
    }
    if let Some(id) = meta.comm_id {
        let _ = write!(out, ",\"commId\":\"{id:#018x}\"");
    }
    let _ = write!(
        out,
        ",\"ncclProfilerAbi\":{},\"events\":{},\"droppedEvents\":{},\"droppedStates\":{}}},\"traceEvents\":[",
        meta.host_abi,
        store.spans.len(),
        store.dropped,
        store.dropped_states
    );
    let _ = write!(
        out,
        "\n{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":\"rank {pid}\"}}}}"
    );
    let (tids, names) = lanes(&store.spans, meta.finalized_at);
    for (tid, name) in names {
        let _ = write!(
            out,
            ",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":"
        );
        push_str(&mut out, &name);
        out.push_str("}}");
        let _ = write!(
            out,
            ",\n{{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"sort_index\":{tid}}}}}"
        );
    }
    for (i, s) in store.spans.iter().enumerate() {
        let unfinished = s.end == 0;
        let end = if unfinished {
            meta.finalized_at.max(s.start)
        } else {
            s.end.max(s.start)
        };
        out.push_str(",\n{\"ph\":\"X\",\"name\":");
        push_str(&mut out, &s.name);
        out.push_str(",\"cat\":");
        push_str(&mut out, bit::name(s.type_bit).unwrap_or("Unknown"));
        let _ = write!(out, ",\"pid\":{pid},\"tid\":{},\"ts\":", tids[i]);
        push_us(&mut out, s.start);
        out.push_str(",\"dur\":");
        push_us(&mut out, end - s.start);
        let _ = write!(out, ",\"args\":{{\"id\":{i}");
        if let Some(p) = s.parent {
            let _ = write!(out, ",\"parent\":{p}");
        }
        if s.bytes > 0 {
            let _ = write!(out, ",\"bytes\":{}", s.bytes);
        }
        for (k, v) in &s.args {
            out.push_str(",\"");
            out.push_str(k);
            out.push_str("\":");
            push_value(&mut out, v);
        }
        if unfinished {
            out.push_str(",\"unfinished\":true");
        }
        if !s.states.is_empty() {
            out.push_str(",\"states\":[");
            for (j, (st, at)) in s.states.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                out.push_str("{\"state\":");
                let name = ProfilerEventState(*st)
                    .name()
                    .map_or_else(|| format!("state {st}"), str::to_owned);
                push_str(&mut out, &name);
                out.push_str(",\"atUs\":");
                push_us(&mut out, at.saturating_sub(s.start));
                out.push('}');
            }
            out.push(']');
        }
        out.push_str("}}");
    }
    out.push_str("\n]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_with_quotes_and_control_bytes_stay_valid_json() {
        let nasty = "comm \"a\"\\b\n\t\u{1}\u{1f}é✓";
        let mut out = String::new();
        push_str(&mut out, nasty);
        let back: String = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
        assert_eq!(back, nasty);
    }

    #[test]
    fn microseconds_keep_three_exact_decimals() {
        for (ns, text) in [
            (0u64, "0.000"),
            (999, "0.999"),
            (1_000, "1.000"),
            (1_234_567_891_011, "1234567891.011"),
        ] {
            let mut out = String::new();
            push_us(&mut out, ns);
            assert_eq!(out, text);
        }
    }
}
