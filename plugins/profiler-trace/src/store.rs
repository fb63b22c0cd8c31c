//! The bounded record of one communicator's events, kept until finalize.
//!
//! Each started event becomes a [`Span`] (up to `max_events`; later ones are
//! counted as dropped, never stored). A span keeps its parent's index, its state
//! transitions and, for summaries, the latest stop time among its descendants: NCCL
//! stops a collective when it is enqueued, its proxy work ends later.

use std::time::{SystemTime, UNIX_EPOCH};

use cclkit_abi::profiler::{Event, EventKind, NetDetail};
use cclkit_abi::raw::profiler::event as bit;

/// Wall-clock nanoseconds since the Unix epoch (shared by every rank's file, so
/// traces of several ranks line up in one viewer).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// An argument value shown in the trace viewer.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Signed integer.
    Int(i64),
    /// Unsigned integer (printed as a JSON number).
    UInt(u64),
    /// Text.
    Str(String),
    /// Flag.
    Bool(bool),
}

/// One recorded event.
#[derive(Debug, Clone)]
pub struct Span {
    /// `ncclProfile*` bit.
    pub type_bit: u64,
    /// Display name (function for Coll/P2p, else the type name).
    pub name: String,
    /// Start and stop (0 = not stopped), ns since the epoch.
    pub start: u64,
    /// Stop time, 0 while open.
    pub end: u64,
    /// Latest stop among this span and its descendants.
    pub tree_end: u64,
    /// Index of the parent span.
    pub parent: Option<u32>,
    /// Channel (proxy and kernel events), inherited by children.
    pub channel: Option<u8>,
    /// Send (true) or receive side, for proxy and network events.
    pub send: Option<bool>,
    /// Payload bytes (collective size, step bytes, network bytes).
    pub bytes: u64,
    /// Arguments shown in the viewer.
    pub args: Args,
    /// State transitions: (NCCL state value, time).
    pub states: Vec<(i32, u64)>,
}

/// Spans of one communicator plus drop accounting.
#[derive(Debug)]
pub struct Store {
    max: usize,
    /// Every recorded span, in start order.
    pub spans: Vec<Span>,
    /// Events not recorded because the cap was reached.
    pub dropped: u64,
    /// State transitions not recorded for the same reason.
    pub dropped_states: u64,
    /// States kept, counted against the same cap as spans.
    states_kept: usize,
}

/// What a span shows: name, channel, send side, bytes, arguments.
type Described = (String, Option<u8>, Option<bool>, u64, Args);
/// Arguments shown in the viewer.
pub type Args = Vec<(&'static str, Value)>;

fn describe(event: &Event<'_>) -> Described {
    let s = |v: Option<&str>| Value::Str(v.unwrap_or("?").to_owned());
    match &event.kind {
        EventKind::Coll(c) => (
            c.func.unwrap_or("Coll").to_owned(),
            None,
            None,
            c.bytes() as u64,
            vec![
                ("seq", Value::UInt(c.seq_number)),
                ("count", Value::UInt(c.count as u64)),
                ("datatype", s(c.datatype)),
                ("algo", s(c.algo)),
                ("proto", s(c.proto)),
                ("nChannels", Value::UInt(u64::from(c.n_channels))),
                ("root", Value::Int(i64::from(c.root))),
            ],
        ),
        EventKind::P2p(p) => (
            p.func.unwrap_or("P2p").to_owned(),
            None,
            None,
            p.bytes() as u64,
            vec![
                ("peer", Value::Int(i64::from(p.peer))),
                ("count", Value::UInt(p.count as u64)),
                ("datatype", s(p.datatype)),
            ],
        ),
        EventKind::CollApi(a) => (
            format!("{} (API)", a.func.unwrap_or("?")),
            None,
            None,
            0,
            vec![
                ("count", Value::UInt(a.count as u64)),
                ("datatype", s(a.datatype)),
            ],
        ),
        EventKind::P2pApi(a) => (
            format!("{} (API)", a.func.unwrap_or("?")),
            None,
            None,
            0,
            vec![
                ("count", Value::UInt(a.count as u64)),
                ("datatype", s(a.datatype)),
            ],
        ),
        EventKind::ProxyOp(p) => (
            format!(
                "ProxyOp {} peer {}",
                if p.is_send { "send" } else { "recv" },
                p.peer
            ),
            Some(p.channel_id),
            Some(p.is_send),
            0,
            vec![
                ("peer", Value::Int(i64::from(p.peer))),
                ("channel", Value::UInt(u64::from(p.channel_id))),
                ("nSteps", Value::Int(i64::from(p.n_steps))),
                ("chunkSize", Value::Int(i64::from(p.chunk_size))),
            ],
        ),
        EventKind::ProxyStep { step } => (
            format!("step {step}"),
            None,
            None,
            0,
            vec![("step", Value::Int(i64::from(*step)))],
        ),
        EventKind::NetPlugin(n) => {
            let mut args = vec![("pluginId", Value::Int(n.id))];
            let (send, bytes) = match n.detail {
                Some(NetDetail::Socket { fd, op, length }) => {
                    args.push(("fd", Value::Int(i64::from(fd))));
                    (Some(op == 0), length as u64)
                }
                Some(NetDetail::IbQp {
                    qp_num,
                    opcode,
                    length,
                    ..
                }) => {
                    args.push(("qp", Value::Int(i64::from(qp_num))));
                    args.push(("opcode", Value::Int(i64::from(opcode))));
                    (None, length as u64)
                }
                None => (None, 0),
            };
            // The bytes go out as the span's own (updates replace them).
            ("net".to_owned(), None, send, bytes, args)
        }
        EventKind::KernelCh { channel_id, .. } => (
            format!("kernel ch {channel_id}"),
            Some(*channel_id),
            None,
            0,
            Vec::new(),
        ),
        EventKind::GroupApi(g) => (
            "Group (API)".to_owned(),
            None,
            None,
            0,
            vec![
                ("depth", Value::Int(i64::from(g.group_depth))),
                ("graphCaptured", Value::Bool(g.graph_captured)),
            ],
        ),
        other => (other.name().to_owned(), None, None, 0, Vec::new()),
    }
}

impl Store {
    /// An empty store keeping at most `max` records (spans plus states).
    pub fn new(max: usize) -> Self {
        Self {
            max,
            spans: Vec::new(),
            dropped: 0,
            dropped_states: 0,
            states_kept: 0,
        }
    }

    fn full(&self) -> bool {
        self.spans.len() + self.states_kept >= self.max
    }

    /// Records a started event; `None` when the cap is reached.
    pub fn start(&mut self, event: &Event<'_>, parent: Option<u32>, at: u64) -> Option<u32> {
        if self.full() {
            self.dropped += 1;
            return None;
        }
        let (name, channel, send, bytes, args) = describe(event);
        let inherited = parent.and_then(|p| self.spans.get(p as usize));
        let span = Span {
            type_bit: event.kind.type_bit(),
            name,
            start: at,
            end: 0,
            tree_end: 0,
            parent,
            channel: channel.or_else(|| inherited.and_then(|p| p.channel)),
            send: send.or_else(|| inherited.and_then(|p| p.send)),
            bytes,
            args,
            states: Vec::new(),
        };
        let index = u32::try_from(self.spans.len()).ok()?;
        self.spans.push(span);
        Some(index)
    }

    /// Records a state transition (and the bytes a ProxyStep state reports).
    pub fn state(&mut self, index: u32, state: i32, bytes: Option<u64>, at: u64) {
        if self.full() {
            self.dropped_states += 1;
            return;
        }
        if let Some(s) = self.spans.get_mut(index as usize) {
            s.states.push((state, at));
            self.states_kept += 1;
            if let Some(b) = bytes {
                s.bytes = s.bytes.max(b);
            }
        }
    }

    /// Replaces a span's bytes (a net plugin's update reports what moved, after the
    /// posted size it started with).
    pub fn set_bytes(&mut self, index: u32, bytes: u64) {
        if let Some(s) = self.spans.get_mut(index as usize) {
            s.bytes = bytes;
        }
    }

    /// Records a stop and extends the descendant-stop time of every ancestor.
    pub fn stop(&mut self, index: u32, at: u64) {
        let Some(s) = self.spans.get_mut(index as usize) else {
            return;
        };
        s.end = at;
        s.tree_end = s.tree_end.max(at);
        let mut next = s.parent;
        // Parents always have smaller indices, so this walk ends.
        while let Some(p) = next.filter(|p| *p < index) {
            let Some(ps) = self.spans.get_mut(p as usize) else {
                break;
            };
            ps.tree_end = ps.tree_end.max(at);
            next = ps.parent;
        }
    }

    /// Whether a span is a proxy or network event (drawn on per-channel tracks).
    pub fn is_proxy_side(type_bit: u64) -> bool {
        type_bit & (bit::PROXY_OP | bit::PROXY_STEP | bit::NET_PLUGIN) != 0
    }
}
