//! Typed [`Event`]s → the raw descriptor of the profiler's ABI version.
//!
//! Every descriptor starts zeroed, so fields an event does not carry are 0/NULL, as
//! NCCL's `{0}`-initialised descriptors are. Strings are handed over as C strings
//! that stay valid for the rest of the process ([`Scratch::c`]): NCCL passes static
//! enum names (`ncclFuncToString`, `ncclDatatypeToString`, …) and its communicator's
//! name, and profilers keep those pointers (NCCL's example profiler prints them at
//! `finalize`). v1 has numbers where later versions have names: they
//! are looked up in NCCL's enums. An event kind a version cannot express is not
//! encoded (`None`), so it never reaches that profiler.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::ptr::null;
use std::sync::{Mutex, OnceLock};

use cclkit_abi::profiler::{Event, EventKind};
use cclkit_abi::raw::common::{Algorithm, DataType, Func, Protocol};
use cclkit_abi::raw::profiler::{self as raw, v1, v2, v3, v4};

/// Most distinct strings kept for the process's life. The runtime's names come from
/// small sets (NCCL's enum names, phase names, communicator names); past this, or
/// for a string longer than `INTERN_MAX_LEN`, a copy lives only as long as the
/// descriptor's [`Scratch`].
const INTERN_MAX: usize = 4096;
/// Longest string kept for the process's life, in bytes.
const INTERN_MAX_LEN: usize = 256;

/// The C copy of `s` kept for the process's life: the same pointer for the same
/// string every time. `None` once 4096 strings are kept, or for one over 256 bytes.
pub fn interned(s: &str) -> Option<*const c_char> {
    static KEPT: OnceLock<Mutex<HashMap<Box<str>, CString>>> = OnceLock::new();
    if s.len() > INTERN_MAX_LEN {
        return None;
    }
    let mut kept = KEPT
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(c) = kept.get(s) {
        return Some(c.as_ptr());
    }
    if kept.len() >= INTERN_MAX {
        return None;
    }
    let c = CString::new(s.replace('\0', "")).unwrap_or_default();
    // The map may move the CString when it grows, never its heap buffer, and
    // entries are never removed: the pointer stays valid until the process exits.
    let p = c.as_ptr();
    kept.insert(s.into(), c);
    Some(p)
}

/// Owner of the C strings of one descriptor that could not be kept ([`interned`]).
#[derive(Default)]
pub struct Scratch(Vec<CString>);

impl Scratch {
    /// A C copy of `s` (NULL for `None`): kept for the process's life where it can
    /// be ([`interned`]), else valid while `self` lives.
    pub fn c(&mut self, s: Option<&str>) -> *const c_char {
        let Some(s) = s else { return null() };
        if let Some(p) = interned(s) {
            return p;
        }
        let c = CString::new(s.replace('\0', "")).unwrap_or_default();
        let p = c.as_ptr();
        // Moving a CString does not move its heap buffer, so `p` stays valid.
        self.0.push(c);
        p
    }
}

/// A zeroed descriptor.
pub fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for the raw descriptor structs: plain C data for which all
    // zero bytes (NULL pointers, 0 integers) is a valid value.
    unsafe { std::mem::zeroed() }
}

/// The parents NCCL names in a descriptor.
#[derive(Debug, Clone, Copy, Default)]
pub struct Parents {
    /// `parentObj`.
    pub parent: usize,
    /// `coll.parentGroup` / `p2p.parentGroup` (v5+): the Group event.
    pub group: usize,
}

/// NCCL's number for a name of one of its enums (`Func(4).name() == "AllReduce"`).
fn number(name: Option<&str>, of: impl Fn(i32) -> Option<&'static str>) -> u8 {
    let Some(name) = name else { return 0 };
    (0..32)
        .find(|&i| of(i) == Some(name))
        .map_or(0, |i| i as u8)
}

fn func_no(s: Option<&str>) -> u8 {
    number(s, |i| Func(i).name())
}

fn dtype_no(s: Option<&str>) -> u8 {
    number(s, |i| DataType(i).name())
}

fn algo_no(s: Option<&str>) -> u8 {
    number(s, |i| Algorithm(i).name())
}

fn proto_no(s: Option<&str>) -> u8 {
    number(s, |i| Protocol(i).name())
}

/// The proxy members every version shares; `None` for other kinds.
macro_rules! proxy_members {
    ($u:expr, $kind:expr) => {
        match $kind {
            EventKind::ProxyOp(p) => {
                $u.proxyOp = raw::ncclProfilerProxyOpDescr_v1_t {
                    pid: p.pid,
                    channelId: p.channel_id,
                    peer: p.peer,
                    nSteps: p.n_steps,
                    chunkSize: p.chunk_size,
                    isSend: i32::from(p.is_send),
                };
                Some(())
            }
            EventKind::ProxyStep { step } => {
                $u.proxyStep = raw::ncclProfilerProxyStepDescr_v1_t { step: *step };
                Some(())
            }
            EventKind::Group | EventKind::ProxyCtrl => Some(()),
            _ => None,
        }
    };
}
pub(super) use proxy_members;

/// The type byte of a pre-v5 descriptor (bits 0–7 only).
fn byte(ev: &Event<'_>) -> Option<u8> {
    u8::try_from(ev.kind.type_bit()).ok()
}

/// v1: numeric function, datatype, algorithm and protocol.
pub fn v1(ev: &Event<'_>, p: Parents, sc: &mut Scratch) -> Option<v1::ncclProfilerEventDescr_v1_t> {
    let mut d: v1::ncclProfilerEventDescr_v1_t = zeroed();
    d.type_ = byte(ev)?;
    d.parentObj = p.parent as *mut c_void;
    d.rank = ev.rank;
    match &ev.kind {
        EventKind::Coll(c) => {
            d.u.coll = v1::ncclProfilerCollDescr_v1_t {
                name: sc.c(c.comm_name),
                commHash: c.comm_hash.unwrap_or(0),
                seqNumber: c.seq_number,
                func: func_no(c.func),
                sendBuff: c.send_buff as *const c_void,
                recvBuff: c.recv_buff as *mut c_void,
                count: c.count,
                root: c.root,
                datatype: dtype_no(c.datatype),
                op: c.red_op.unwrap_or(0),
                trafficBytes: c.traffic_bytes.unwrap_or(0),
                nMaxChannels: c.n_channels,
                nWarps: c.n_warps,
                algo: algo_no(c.algo),
                proto: proto_no(c.proto),
                isCollnet: 0,
                isNvls: 0,
            }
        }
        EventKind::P2p(x) => {
            d.u.p2p = v1::ncclProfilerP2pDescr_v1_t {
                name: sc.c(x.comm_name),
                commHash: x.comm_hash.unwrap_or(0),
                func: func_no(x.func),
                buff: x.buff as *mut c_void,
                datatype: dtype_no(x.datatype),
                count: x.count,
                peer: x.peer,
            }
        }
        k => proxy_members!(d.u, k)?,
    }
    Some(d)
}

/// v2: names as strings, still the communicator name and hash per event.
pub fn v2(ev: &Event<'_>, p: Parents, sc: &mut Scratch) -> Option<v2::ncclProfilerEventDescr_v2_t> {
    let mut d: v2::ncclProfilerEventDescr_v2_t = zeroed();
    d.type_ = byte(ev)?;
    d.parentObj = p.parent as *mut c_void;
    d.rank = ev.rank;
    match &ev.kind {
        EventKind::Coll(c) => {
            d.u.coll = v2::ncclProfilerCollDescr_v2_t {
                name: sc.c(c.comm_name),
                commHash: c.comm_hash.unwrap_or(0),
                seqNumber: c.seq_number,
                func: sc.c(c.func),
                sendBuff: c.send_buff as *const c_void,
                recvBuff: c.recv_buff as *mut c_void,
                count: c.count,
                root: c.root,
                datatype: sc.c(c.datatype),
                trafficBytes: c.traffic_bytes.unwrap_or(0),
                nMaxChannels: c.n_channels,
                nWarps: c.n_warps,
                algo: sc.c(c.algo),
                proto: sc.c(c.proto),
            }
        }
        EventKind::P2p(x) => d.u.p2p = p2p_v2(x, sc),
        k => proxy_members!(d.u, k)?,
    }
    Some(d)
}

fn p2p_v2(x: &cclkit_abi::profiler::P2p<'_>, sc: &mut Scratch) -> v2::ncclProfilerP2pDescr_v2_t {
    v2::ncclProfilerP2pDescr_v2_t {
        name: sc.c(x.comm_name),
        commHash: x.comm_hash.unwrap_or(0),
        func: sc.c(x.func),
        buff: x.buff as *mut c_void,
        datatype: sc.c(x.datatype),
        count: x.count,
        peer: x.peer,
    }
}

/// v3: no traffic bytes; KernelCh and NetPlugin events.
pub fn v3(ev: &Event<'_>, p: Parents, sc: &mut Scratch) -> Option<v3::ncclProfilerEventDescr_v3_t> {
    let mut d: v3::ncclProfilerEventDescr_v3_t = zeroed();
    d.type_ = byte(ev)?;
    d.parentObj = p.parent as *mut c_void;
    d.rank = ev.rank;
    match &ev.kind {
        EventKind::Coll(c) => {
            d.u.coll = v3::ncclProfilerCollDescr_v3_t {
                name: sc.c(c.comm_name),
                commHash: c.comm_hash.unwrap_or(0),
                seqNumber: c.seq_number,
                func: sc.c(c.func),
                sendBuff: c.send_buff as *const c_void,
                recvBuff: c.recv_buff as *mut c_void,
                count: c.count,
                root: c.root,
                datatype: sc.c(c.datatype),
                nMaxChannels: c.n_channels,
                nWarps: c.n_warps,
                algo: sc.c(c.algo),
                proto: sc.c(c.proto),
            }
        }
        EventKind::P2p(x) => d.u.p2p = p2p_v2(x, sc),
        EventKind::KernelCh { channel_id, .. } => d.u.kernelCh.channelId = *channel_id,
        k => proxy_members!(d.u, k)?,
    }
    Some(d)
}

/// v4: the communicator moved to `init`; channels per operation.
pub fn v4(ev: &Event<'_>, p: Parents, sc: &mut Scratch) -> Option<v4::ncclProfilerEventDescr_v4_t> {
    let mut d: v4::ncclProfilerEventDescr_v4_t = zeroed();
    d.type_ = byte(ev)?;
    d.parentObj = p.parent as *mut c_void;
    d.rank = ev.rank;
    match &ev.kind {
        EventKind::Coll(c) => {
            d.u.coll = v4::ncclProfilerCollDescr_v4_t {
                seqNumber: c.seq_number,
                func: sc.c(c.func),
                sendBuff: c.send_buff as *const c_void,
                recvBuff: c.recv_buff as *mut c_void,
                count: c.count,
                root: c.root,
                datatype: sc.c(c.datatype),
                nChannels: c.n_channels,
                nWarps: c.n_warps,
                algo: sc.c(c.algo),
                proto: sc.c(c.proto),
            }
        }
        EventKind::P2p(x) => {
            d.u.p2p = v4::ncclProfilerP2pDescr_v4_t {
                func: sc.c(x.func),
                buff: x.buff as *mut c_void,
                datatype: sc.c(x.datatype),
                count: x.count,
                peer: x.peer,
                nChannels: x.n_channels.unwrap_or(0),
            }
        }
        EventKind::KernelCh { channel_id, ptimer } => {
            d.u.kernelCh = raw::ncclProfilerKernelChDescr_v4_t {
                channelId: *channel_id,
                pTimer: ptimer.unwrap_or(0),
            }
        }
        k => proxy_members!(d.u, k)?,
    }
    Some(d)
}
