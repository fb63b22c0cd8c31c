//! A small but real profiler: counts events per type, sums proxy-step and network
//! bytes, and reports per communicator at finalize.
//!
//! Copy this crate to start a profiler. `CCLKIT_TEMPLATE_PROFILE_MASK` (decimal or
//! 0x hex) chooses the events (default Coll, P2p, ProxyOp, ProxyStep, NetPlugin);
//! the report goes to NCCL's log at INFO and, if `CCLKIT_TEMPLATE_PROFILE_OUT`
//! names a file, is appended there as one line. `export_profiler!` publishes it as
//! `ncclProfiler_v1` … `_v7`. Nothing here allocates per event: a vendor profiler
//! that NCCL calls per proxy step must stay cheap.

use std::ffi::CStr;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use cclkit_abi::profiler::{
    Event, EventKind, EventMask, EventState, Profiler, ProfilerInit, StateArgs,
};
use cclkit_abi::raw::common::subsys;
use cclkit_abi::raw::profiler::event as bit;
use cclkit_abi::{Error, Result, export_profiler, nccl_info};

/// Event-type bits counted (0–15).
const TYPES: usize = 16;

/// One communicator's counters.
pub struct CountingProfiler {
    rank: Option<i32>,
    started: [AtomicU64; TYPES],
    stopped: [AtomicU64; TYPES],
    step_bytes: AtomicU64,
    net_bytes: AtomicU64,
}

/// What the profiler keeps per event: its type index (for the stop count).
pub struct Counted(usize);

fn type_index(bit: u64) -> Option<usize> {
    (bit.is_power_of_two() && bit < 1 << TYPES).then(|| bit.trailing_zeros() as usize)
}

fn mask_from_env() -> Result<u64> {
    let default = bit::COLL | bit::P2P | bit::PROXY_OP | bit::PROXY_STEP | bit::NET_PLUGIN;
    let Ok(v) = std::env::var("CCLKIT_TEMPLATE_PROFILE_MASK") else {
        return Ok(default);
    };
    let t = v.trim();
    let parsed = match t.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    };
    parsed.ok().filter(|m| *m < 1 << TYPES).ok_or_else(|| {
        Error::invalid_argument(format!(
            "CCLKIT_TEMPLATE_PROFILE_MASK={v} is not a mask below 2^16"
        ))
    })
}

impl Profiler for CountingProfiler {
    const NAME: &'static CStr = c"TemplateProfiler";
    type Event = Counted;

    fn init(args: &ProfilerInit<'_>) -> Result<(Self, EventMask)> {
        let mask = mask_from_env()?;
        nccl_info!(
            subsys::PROFILE,
            "template profiler: rank {:?}, mask {mask:#x}",
            args.rank
        );
        let me = Self {
            rank: args.rank,
            started: Default::default(),
            stopped: Default::default(),
            step_bytes: AtomicU64::new(0),
            net_bytes: AtomicU64::new(0),
        };
        Ok((me, EventMask(mask)))
    }

    fn start_event(&self, event: &Event<'_>, _parent: Option<&Counted>) -> Result<Option<Counted>> {
        // Unknown types are declined: NCCL gets a NULL handle and carries on.
        let Some(i) = type_index(event.kind.type_bit()) else {
            return Ok(None);
        };
        self.started[i].fetch_add(1, Ordering::Relaxed);
        if let EventKind::NetPlugin(n) = &event.kind {
            let bytes = n.detail.map_or(0, |d| d.length());
            self.net_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        Ok(Some(Counted(i)))
    }

    fn record_state(&self, _event: &Counted, state: &EventState) -> Result<()> {
        if let StateArgs::ProxyStep { trans_size } = state.args {
            self.step_bytes
                .fetch_add(trans_size as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn stop_event(&self, event: &Counted) -> Result<()> {
        self.stopped[event.0].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn finalize(&self) -> Result<()> {
        let mut line = format!("rank={}", self.rank.unwrap_or(-1));
        for i in 0..TYPES {
            let (s, e) = (
                self.started[i].load(Ordering::Relaxed),
                self.stopped[i].load(Ordering::Relaxed),
            );
            if s > 0 {
                let name = bit::name(1 << i).unwrap_or("?");
                line.push_str(&format!(" {name}={s}/{e}"));
            }
        }
        line.push_str(&format!(
            " stepBytes={} netBytes={}",
            self.step_bytes.load(Ordering::Relaxed),
            self.net_bytes.load(Ordering::Relaxed)
        ));
        nccl_info!(subsys::PROFILE, "template profiler: {line}");
        if let Ok(path) = std::env::var("CCLKIT_TEMPLATE_PROFILE_OUT") {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| Error::io(&format!("open {path}"), e))?;
            writeln!(f, "{line}").map_err(|e| Error::io(&format!("write {path}"), e))?;
        }
        Ok(())
    }
}

export_profiler!(CountingProfiler);
