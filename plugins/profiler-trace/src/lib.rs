//! `libnccl-profiler-cclkit.so`: an NCCL profiler plugin (ABI v1–v7) that writes one
//! Chrome-trace / Perfetto JSON file per rank and communicator, prints a
//! one-screen summary at finalize, and can forward every event to other profilers
//! (`CCLKIT_PROFILERS=a,b`). It uses only the C ABI, so it runs under real NCCL as
//! well as under cclkit's reference runtime. Settings: see [`config`]; usage and
//! what to look at: `docs/profiler-trace.md`.
//!
//! Memory is bounded: at most `CCLKIT_PROFILE_MAX_EVENTS` records (spans plus state
//! transitions) per communicator are kept; later ones are counted as dropped and the
//! summary says so. Forwarding keeps one handle per forwarded profiler per event.

use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::Mutex;

use cclkit_abi::profiler::{
    Event, EventKind, EventMask, EventState, Profiler, ProfilerInit, StateArgs,
};
use cclkit_abi::raw::common::subsys;
use cclkit_abi::{Error, Result, export_profiler, nccl_info, nccl_warn};

pub mod config;
mod fanout;
pub mod json;
mod net;
pub mod store;
pub mod summary;

use config::Config;
use fanout::{Fanout, Handles};
use store::{Store, now_ns};

/// One communicator's trace.
pub struct TraceProfiler {
    config: Config,
    store: Mutex<Store>,
    fanout: Fanout,
    rank: i32,
    n_ranks: Option<i32>,
    comm_name: Option<String>,
    comm_id: Option<u64>,
    host_abi: u32,
    file: PathBuf,
}

/// This profiler's record of one event.
pub struct TraceEvent {
    /// Index of the span in the store (`None` once the cap was reached).
    span: Option<u32>,
    /// The forwarded profilers' handles.
    forwarded: Handles,
    /// A NetPlugin event's plugin id (its updates' descriptor layout).
    net: Option<i64>,
}

/// Trace files of one process are numbered when NCCL gives no rank (v1–v3).
static SEQUENCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn file_name(args: &ProfilerInit<'_>) -> String {
    let pid = std::process::id();
    match (args.rank, args.comm_id) {
        (Some(rank), Some(id)) => format!("cclkit-trace-{id:016x}-rank{rank}.json"),
        _ => format!(
            "cclkit-trace-pid{pid}-{}.json",
            SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ),
    }
}

impl Profiler for TraceProfiler {
    const NAME: &'static CStr = c"cclkit-trace";
    type Event = TraceEvent;

    fn init(args: &ProfilerInit<'_>) -> Result<(Self, EventMask)> {
        let config = Config::from_env(|k| std::env::var(k).ok())?;
        std::fs::create_dir_all(&config.dir).map_err(|e| {
            Error::io(
                &format!("create profile directory {}", config.dir.display()),
                e,
            )
        })?;
        let fanout = Fanout::init(&config.forward, args);
        let file = config.dir.join(file_name(args));
        nccl_info!(
            subsys::PROFILE,
            "cclkit profiler (ABI v{}): tracing to {} (mask {:#x}, {} forwarded)",
            args.host_abi,
            file.display(),
            config.mask,
            config.forward.len()
        );
        let mask = EventMask(config.mask | fanout.mask());
        let me = Self {
            store: Mutex::new(Store::new(config.max_events)),
            fanout,
            rank: args.rank.unwrap_or(-1),
            n_ranks: args.n_ranks,
            comm_name: args.comm_name.map(str::to_owned),
            comm_id: args.comm_id,
            host_abi: args.host_abi,
            file,
            config,
        };
        Ok((me, mask))
    }

    fn start_event(
        &self,
        event: &Event<'_>,
        parent: Option<&TraceEvent>,
    ) -> Result<Option<TraceEvent>> {
        let at = now_ns();
        let forwarded = if self.fanout.is_empty() {
            Handles::default()
        } else {
            self.fanout.start(event, parent.map(|p| &p.forwarded))
        };
        // Record only what was asked for here (the mask NCCL sees also holds what
        // forwarded profilers want).
        let span = if self.config.mask & event.kind.type_bit() != 0 {
            self.store
                .lock()
                .map_err(|_| Error::internal("trace store poisoned"))?
                .start(event, parent.and_then(|p| p.span), at)
        } else {
            None
        };
        // Nothing recorded here nor forwarded: decline (NULL handle), which NCCL and
        // every child event tolerate.
        if span.is_none() && forwarded.iter().all(|h| *h == 0) {
            return Ok(None);
        }
        let net = match event.kind {
            EventKind::NetPlugin(n) => Some(n.id),
            _ => None,
        };
        Ok(Some(TraceEvent {
            span,
            forwarded,
            net,
        }))
    }

    fn record_state(&self, event: &TraceEvent, state: &EventState) -> Result<()> {
        if let Some(i) = event.span {
            let bytes = match state.args {
                StateArgs::ProxyStep { trans_size } | StateArgs::ProxyOp { trans_size, .. } => {
                    Some(trans_size as u64)
                }
                _ => None,
            };
            let mut store = self
                .store
                .lock()
                .map_err(|_| Error::internal("trace store poisoned"))?;
            store.state(i, state.state.0, bytes, now_ns());
            if let (Some(id), StateArgs::NetPlugin { data }) = (event.net, state.args) {
                // SAFETY: NCCL passes the net plugin's live descriptor of this id.
                if let Some(b) = unsafe { net::updated_length(id, data) } {
                    store.set_bytes(i, b);
                }
            }
        }
        if !event.forwarded.is_empty() {
            self.fanout.record(&event.forwarded, state);
        }
        Ok(())
    }

    fn stop_event(&self, event: &TraceEvent) -> Result<()> {
        if let Some(i) = event.span {
            self.store
                .lock()
                .map_err(|_| Error::internal("trace store poisoned"))?
                .stop(i, now_ns());
        }
        if !event.forwarded.is_empty() {
            self.fanout.stop(&event.forwarded);
        }
        Ok(())
    }

    fn finalize(&self) -> Result<()> {
        self.fanout.finalize();
        let store = self
            .store
            .lock()
            .map_err(|_| Error::internal("trace store poisoned"))?;
        let meta = json::Meta {
            rank: self.rank,
            n_ranks: self.n_ranks,
            comm_name: self.comm_name.as_deref(),
            comm_id: self.comm_id,
            host_abi: self.host_abi,
            finalized_at: now_ns(),
        };
        let text = json::render(&store, &meta);
        std::fs::write(&self.file, text)
            .map_err(|e| Error::io(&format!("write trace {}", self.file.display()), e))?;
        let summary = summary::render(&store, &meta, &self.file.display().to_string());
        let txt = self.file.with_extension("txt");
        if let Err(e) = std::fs::write(&txt, &summary) {
            nccl_warn!("cclkit profiler: write summary {}: {e}", txt.display());
        }
        if self.config.print_summary {
            eprint!("{summary}");
        }
        Ok(())
    }
}

export_profiler!(TraceProfiler);
