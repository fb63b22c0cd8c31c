//! Choosing algorithm × protocol × channels × chunk for each collective, exactly the
//! way NCCL calls tuners.
//!
//! 1. The built-in cost model fills a flat `float[7][3]` table with predicted times in
//!    µs for the combinations this runtime supports for the call (others stay -1).
//! 2. `NCCL_ALGO` / `NCCL_PROTO` remove combinations (set them to -1).
//! 3. A tuner plugin's `getCollInfo` may lower or ignore entries and set `nChannels`.
//! 4. The cheapest non-negative entry wins (ties: first in algo-major order), then the
//!    chunk size is computed and offered to the tuner's `getChunkSize` (v6).
//!
//! A tuner that fails or leaves nothing usable gets the built-in choice for that call,
//! counted and reported at WARN (`CCLKIT_STRICT=1` makes it an error). Every decision
//! is recorded so "was my choice honoured?" has an answer (`CCLKIT_TUNER_REPORT=1`).

use std::sync::Mutex;

use cclkit_abi::raw::common::{
    Algorithm, Func, NCCL_ALGO_PROTO_IGNORE, NCCL_NUM_PROTOCOLS, Protocol,
};

mod model;
pub mod report;

pub use model::{ModelInputs, cheapest, default_channels};
pub use report::ReportEntry;

use super::error::{Error, Result};
use super::protocol::ProtoParams;
use cclkit_host::tuner::{COST_TABLE_LEN, CostTable, TunerConstants, TunerContext};

/// Largest AllReduce for which two ranks on host memory prefer `PAT`'s
/// halving-doubling to every other entry of the built-in table. With two ranks it is
/// the ring's own exchange (the same bytes, the same two steps) run as two whole
/// halves streamed slice after slice, where the ring goes through chunk loops; the
/// model credits the ring's second channel with twice the bandwidth, which on host
/// memory only pays from a few MiB. Measured on 2 ranks over loopback, alternated,
/// best of 6 (docs/PERFORMANCE.md): 1 MiB 218 against 296 µs, 2 MiB 428 against
/// 561 µs; 4 MiB 1293 against 1199 µs (the ring's 2 channels win from there).
pub const HOST_PAIR_PAT_MAX: usize = 2 << 20;

/// Index of `(algo, proto)` in the flat table.
pub fn idx(a: Algorithm, p: Protocol) -> usize {
    a.0 as usize * NCCL_NUM_PROTOCOLS + p.0 as usize
}

/// NCCL 2.30's default model constants (latencies in µs, bandwidths in GB/s), the
/// values a v5/v6 tuner's `init` receives and may rewrite: `cclkit-abi`'s
/// `NCCL_DEFAULT_CONSTANTS`, the one home of these numbers.
pub fn default_constants() -> TunerConstants {
    cclkit_abi::tuner::NCCL_DEFAULT_CONSTANTS
}

/// Which part of the decision came from where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// The built-in cost model.
    Model,
    /// The tuner plugin.
    Tuner,
    /// The tuner failed or chose nothing usable: built-in choice for this call.
    Fallback,
}

/// What a collective actually ran with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Algorithm.
    pub algo: Algorithm,
    /// Protocol.
    pub proto: Protocol,
    /// Channels used.
    pub channels: usize,
    /// Chunk bytes.
    pub chunk: usize,
    /// Who chose.
    pub source: Source,
}

/// Makes entry `i` of `t` the cheapest when it is offered (not removed by
/// `NCCL_ALGO` / `NCCL_PROTO`): just below the cheapest other entry.
fn prefer(t: &mut CostTable, i: usize) {
    if t[i] < 0.0 {
        return;
    }
    let others = t
        .iter()
        .enumerate()
        .filter(|&(j, &c)| j != i && c >= 0.0)
        .map(|(_, &c)| c)
        .fold(f32::INFINITY, f32::min);
    if others <= t[i] {
        t[i] = others * (1.0 - 1e-4);
    }
}

/// Whether `name` is allowed for `func` by an `NCCL_ALGO` / `NCCL_PROTO` value:
/// `a,b`, `^a,b`, or per collective `allreduce:tree,ring;broadcast:ring` (NCCL 2.24+;
/// collectives not listed are unrestricted). `None` when the variable is unset.
fn allowed_for(value: Option<&str>, func: Func, name: &str) -> Option<bool> {
    let v = value?;
    if !v.contains(':') {
        return allowed(Some(v), name);
    }
    let fname = match func {
        Func::ALL_REDUCE => "allreduce",
        Func::BROADCAST => "broadcast",
        Func::REDUCE => "reduce",
        Func::ALL_GATHER => "allgather",
        Func::REDUCE_SCATTER => "reducescatter",
        _ => "",
    };
    for part in v.split(';') {
        if let Some((f, list)) = part.split_once(':')
            && f.trim().eq_ignore_ascii_case(fname)
        {
            return allowed(Some(list), name);
        }
    }
    None
}

/// A name list as NCCL parses `NCCL_ALGO` / `NCCL_PROTO` (`a,b` or `^a,b`).
fn allowed(value: Option<&str>, name: &str) -> Option<bool> {
    let v = value?.trim().to_ascii_lowercase();
    let (neg, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest.to_string()),
        None => (false, v),
    };
    let hit = list
        .split(',')
        .any(|x| x.trim() == name.to_ascii_lowercase());
    Some(hit != neg)
}

/// The runtime's tuning state for one communicator.
pub struct Tuning {
    tuner: Option<Mutex<TunerContext>>,
    constants: TunerConstants,
    model: ModelInputs,
    algo_env: Option<String>,
    proto_env: Option<String>,
    strict: bool,
    /// The report, and the last decision made without a tuner plugin: one lock
    /// per call decides a repeated collective and counts it.
    decided: Mutex<Decided>,
    fallbacks: Mutex<u64>,
    /// The communicator's buffers are in host memory (smaller Simple chunks).
    host_memory: bool,
    /// The last cost table computed, with its (collective, bytes, channels).
    last_table: Mutex<Option<(Func, usize, usize, CostTable)>>,
}

/// What [`Tuning::decide`] keeps between calls.
#[derive(Default)]
struct Decided {
    records: report::Records,
    /// Without a tuner plugin: the last decision, with its (collective, bytes,
    /// channel limit). The model and the protocol sizes are fixed for a
    /// communicator, so a repeated call decides the same.
    last: Option<(Func, usize, usize, Decision)>,
}

impl Tuning {
    /// Tuning with an optional tuner plugin (already initialised with `constants`).
    pub fn new(
        tuner: Option<TunerContext>,
        constants: TunerConstants,
        model: ModelInputs,
        strict: bool,
    ) -> Self {
        Self {
            tuner: tuner.map(Mutex::new),
            constants,
            model,
            algo_env: None,
            proto_env: None,
            strict,
            decided: Mutex::new(Decided::default()),
            fallbacks: Mutex::new(0),
            host_memory: true,
            last_table: Mutex::new(None),
        }
    }

    /// Whether the communicator's buffers are in host memory (the default): its
    /// Simple chunks are then capped (see [`ProtoParams::chunk_on`]).
    pub fn buffers_on_host(&mut self, host: bool) {
        self.host_memory = host;
        self.decided_mut().last = None;
    }

    /// Overrides `NCCL_ALGO` / `NCCL_PROTO` (tests and tools).
    pub fn force(&mut self, algo: Option<String>, proto: Option<String>) {
        self.algo_env = algo;
        self.proto_env = proto;
        *self.last_table.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        self.decided_mut().last = None;
    }

    /// [`table`](Self::table), computed again only when (collective, bytes,
    /// channels) differ from the last call's: the model is a pure function of them
    /// and the forced lists, and training loops and benchmarks repeat their sizes.
    /// A repeat then costs a comparison instead of nine model evaluations and the
    /// `NCCL_ALGO`/`NCCL_PROTO` list parsing (measured: ~4 % of the CPU of an
    /// 8-byte AllReduce on 2 ranks). The tuner is still asked on every call.
    fn table_for(&self, func: Func, bytes: usize, channels: usize) -> CostTable {
        let mut last = self.last_table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((f, b, c, t)) = *last
            && (f, b, c) == (func, bytes, channels)
        {
            return t;
        }
        let t = self.table(func, bytes, channels);
        *last = Some((func, bytes, channels, t));
        t
    }

    /// Name of the tuner plugin in use, if any.
    pub fn tuner_name(&self) -> Option<String> {
        self.tuner.as_ref().and_then(|t| {
            t.lock()
                .ok()
                .map(|t| format!("{} v{}", t.plugin().name(), t.plugin().version()))
        })
    }

    /// The built-in model's time in µs for `(algo, proto)`.
    pub fn model_time(
        &self,
        func: Func,
        bytes: usize,
        a: Algorithm,
        p: Protocol,
        channels: usize,
    ) -> f32 {
        let m = &self.model;
        let n = m.n_ranks.max(1) as f64;
        let nodes = m.n_nodes.max(1) as f64;
        // PAT (recursive doubling here) has no constants of its own in NCCL's table
        // for AllReduce; each of its steps costs what a ring step costs.
        let ai = if a == Algorithm::PAT {
            Algorithm::RING.0
        } else {
            a.0
        } as usize;
        // LL and LL128 beat Simple on GPUs because the receiver polls flags in the
        // data instead of waiting for a completion. On host memory every protocol
        // waits for the same network completion, so a step costs Simple's latency
        // and LL/LL128 only add their wire overhead (measured: never faster here).
        let pi = Protocol::SIMPLE.0 as usize;
        let lat = self.constants.baseLatencies[ai][pi]
            + self.constants.hwLatencies[2][ai][pi]
            + m.net_lat_us;
        let eff = match p {
            Protocol::LL => 0.5,
            Protocol::LL128 => 120.0 / 128.0,
            _ => 1.0,
        };
        // Bytes each rank must move through its link, and latency-bound steps.
        let (steps, moved) = match (func, a) {
            (Func::ALL_REDUCE, Algorithm::TREE) => (
                2.0 * (nodes + 1.0).log2().ceil() + 2.0 * (n / nodes - 1.0),
                3.0,
            ),
            (Func::ALL_REDUCE, Algorithm::PAT) => {
                let ((s, v), _) = self.pat_shape(bytes, p);
                (s, v)
            }
            (Func::ALL_REDUCE, _) => (2.0 * (n - 1.0), 2.0 * (n - 1.0) / n),
            (Func::ALL_GATHER | Func::REDUCE_SCATTER, _) => (n - 1.0, (n - 1.0) / n),
            _ => (n - 1.0, 1.0),
        };
        // PAT runs on channel 0's point-to-point links whatever others could add.
        let channels = if a == Algorithm::PAT {
            1
        } else {
            channels.max(1)
        };
        let bw_bytes_per_us = m.net_gbps * 1e3 * channels as f64 * eff;
        (lat * steps + bytes as f64 * moved / bw_bytes_per_us) as f32
    }

    /// How AllReduce `PAT` runs `bytes` with `p`: `(steps, bytes moved per byte)` of
    /// the cheaper of its two forms, and which one that is.
    ///
    /// Both take log2 p steps among the largest power of two p ≤ n ranks (plus one
    /// step in and one out for the ranks beyond it). Recursive doubling exchanges the
    /// whole message at every step (latency-bound sizes; it sends a step before
    /// receiving one, so it is used below one slice). Recursive halving then
    /// doubling (Rabenseifner) halves it at every reduce step and doubles it back,
    /// moving what a ring moves in 2·log2 p steps instead of the ring's 2(n−1).
    fn pat_shape(&self, bytes: usize, p: Protocol) -> ((f64, f64), PatKind) {
        let n = self.model.n_ranks.max(1) as f64;
        let p2 = (n.log2().floor()).exp2();
        let (rounds, extra) = (p2.log2(), if p2 < n { 2.0 } else { 0.0 });
        let halving = (2.0 * rounds + extra, 2.0 * (p2 - 1.0) / p2 + extra);
        let doubling = (rounds + extra, rounds + extra);
        // Doubling sends a whole round before it receives one; past one slice the
        // forms that pipeline slices win (measured on 2 ranks: doubling is 15 %
        // faster at 512 KiB, 25 % slower at 1 MiB with 1 MiB slices).
        if bytes >= pat_slice(p) {
            return (halving, PatKind::HalvingDoubling);
        }
        // Per-step latency against per-byte cost, as in `model_time`.
        let (lat, bw) = (self.step_latency(), self.model.net_gbps.max(1e-9) * 1e3);
        let cost = |(s, v): (f64, f64)| lat * s + bytes as f64 * v / bw;
        if cost(doubling) <= cost(halving) {
            (doubling, PatKind::Doubling)
        } else {
            (halving, PatKind::HalvingDoubling)
        }
    }

    /// Which form of AllReduce `PAT` runs `bytes` with protocol `p`.
    pub fn pat_kind(&self, bytes: usize, p: Protocol) -> PatKind {
        self.pat_shape(bytes, p).1
    }

    /// One step's latency in µs (Simple's ring constants; see `model_time`).
    fn step_latency(&self) -> f64 {
        let (ai, pi) = (Algorithm::RING.0 as usize, Protocol::SIMPLE.0 as usize);
        self.constants.baseLatencies[ai][pi]
            + self.constants.hwLatencies[2][ai][pi]
            + self.model.net_lat_us
    }

    /// The table NCCL would hand the tuner for this call.
    pub fn table(&self, func: Func, bytes: usize, channels: usize) -> CostTable {
        let mut t: CostTable = [NCCL_ALGO_PROTO_IGNORE; COST_TABLE_LEN];
        if self.model.n_ranks <= 1 {
            t[idx(Algorithm::RING, Protocol::SIMPLE)] = 0.0;
            return t;
        }
        let algos: &[Algorithm] = if func == Func::ALL_REDUCE {
            &[Algorithm::TREE, Algorithm::RING, Algorithm::PAT]
        } else {
            &[Algorithm::RING]
        };
        for &a in algos {
            for p in [Protocol::LL, Protocol::LL128, Protocol::SIMPLE] {
                let ok = allowed_for(self.algo_env.as_deref(), func, a.name().unwrap_or(""))
                    .unwrap_or(true)
                    && allowed_for(self.proto_env.as_deref(), func, proto_env_name(p))
                        .unwrap_or(true);
                if ok {
                    t[idx(a, p)] = self.model_time(func, bytes, a, p, channels);
                }
            }
        }
        if self.host_memory
            && func == Func::ALL_REDUCE
            && self.model.n_ranks == 2
            && bytes <= HOST_PAIR_PAT_MAX
        {
            prefer(&mut t, idx(Algorithm::PAT, Protocol::SIMPLE));
        }
        t
    }

    /// Decides how to run `func` on `bytes` (the size NCCL would report to tuners).
    /// `params` gives the communicator's protocol sizes and must be the same on
    /// every call to one `Tuning`: without a tuner plugin a repeated call returns
    /// the last decision.
    pub fn decide(
        &self,
        func: Func,
        bytes: usize,
        max_channels: usize,
        params: &dyn Fn(Protocol) -> ProtoParams,
    ) -> Result<Decision> {
        if self.tuner.is_none() {
            let mut decided = self.decided();
            if let Some((f, b, c, d)) = decided.last
                && (f, b, c) == (func, bytes, max_channels)
            {
                decided.records.record(func, bytes, d);
                return Ok(d);
            }
        }
        let default_ch =
            default_channels(bytes, max_channels, params(Protocol::SIMPLE).slice_data());
        let base = self.table_for(func, bytes, default_ch);
        let Some(model_pick) = cheapest(&base) else {
            return Err(Error::invalid_usage(format!(
                "no algorithm/protocol available for {func:?} of {bytes} bytes (NCCL_ALGO={:?}, NCCL_PROTO={:?})",
                self.algo_env, self.proto_env
            )));
        };
        let mut source = Source::Model;
        let (mut pick, mut nch) = (model_pick, 0i32);
        if let Some(tuner) = &self.tuner {
            let mut t = tuner.lock().unwrap_or_else(|p| p.into_inner());
            let mut table = base;
            let outcome = t.get_coll_info(func, bytes, 1, false, &mut table, &mut nch);
            match outcome.map(|()| cheapest(&table)) {
                Ok(Some(p)) => {
                    pick = p;
                    source = if p != model_pick || table != base || nch != 0 {
                        Source::Tuner
                    } else {
                        Source::Model
                    };
                }
                Ok(None) => {
                    source = self.fallback(format!(
                        "tuner left no usable entry for {func:?} of {bytes} bytes"
                    ))?
                }
                Err(e) => {
                    nch = 0;
                    source = self.fallback(format!("{e}"))?;
                }
            }
        }
        let channels = if pick.0 == Algorithm::PAT {
            // Recursive doubling runs on channel 0's point-to-point links.
            1
        } else if nch > 0 {
            (nch as usize).min(max_channels.max(1))
        } else {
            default_ch
        };
        let p = params(pick.1);
        let default_chunk = p.chunk_on(self.host_memory);
        let mut chunk = default_chunk;
        if let Some(tuner) = &self.tuner
            && source != Source::Fallback
        {
            let mut t = tuner.lock().unwrap_or_else(|p| p.into_inner());
            let mut c = chunk;
            match t.get_chunk_size(func, bytes, pick.0, pick.1, channels as i32, &mut c) {
                Ok(true) => {
                    // NCCL clamps to the buffer, then rounds down to the protocol grain.
                    let max = p.step_data() * (p.slots() * p.slice_steps);
                    chunk = (c.clamp(p.grain(), max) / p.grain()) * p.grain();
                    if chunk != default_chunk {
                        source = Source::Tuner;
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    self.fallback(format!("{e}"))?;
                }
            }
        }
        let d = Decision {
            algo: pick.0,
            proto: pick.1,
            channels,
            chunk,
            source,
        };
        let mut decided = self.decided();
        if self.tuner.is_none() {
            decided.last = Some((func, bytes, max_channels, d));
        }
        decided.records.record(func, bytes, d);
        Ok(d)
    }

    fn decided(&self) -> std::sync::MutexGuard<'_, Decided> {
        self.decided.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn decided_mut(&mut self) -> &mut Decided {
        self.decided.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    fn fallback(&self, why: String) -> Result<Source> {
        if self.strict {
            return Err(Error::invalid_usage(format!("{why} (CCLKIT_STRICT=1)")));
        }
        *self.fallbacks.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        tracing::warn!(target: "cclkit::tune", "{why}; using the built-in choice for this call");
        Ok(Source::Fallback)
    }

    /// Calls that fell back to the built-in choice.
    pub fn fallbacks(&self) -> u64 {
        *self.fallbacks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every distinct decision with its call count and exact size range (see
    /// [`report`]).
    pub fn entries(&self) -> Vec<ReportEntry> {
        self.decided().records.entries()
    }

    /// [`entries`](Self::entries) as `(collective, smallest size, decision, calls)`.
    pub fn report(&self) -> Vec<(Func, usize, Decision, u64)> {
        self.entries()
            .into_iter()
            .map(|e| (e.func, e.min_bytes, e.decision, e.calls))
            .collect()
    }

    /// The report as text (`CCLKIT_TUNER_REPORT=1`), one line per entry.
    pub fn report_text(&self) -> String {
        let tuner = self
            .tuner_name()
            .unwrap_or_else(|| "built-in cost model".into());
        let fallbacks = self.fallbacks();
        report::text(&tuner, fallbacks, &mut self.decided().records)
    }
}

/// The two forms of AllReduce `PAT` (see `Tuning::pat_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatKind {
    /// Recursive doubling: the whole message at every step.
    Doubling,
    /// Recursive halving (reduce-scatter), then recursive doubling (all-gather).
    HalvingDoubling,
}

/// Data bytes of one slice with protocol `p` (the environment as the FIFOs read it).
fn pat_slice(p: Protocol) -> usize {
    static SLICES: std::sync::LazyLock<[usize; 3]> = std::sync::LazyLock::new(|| {
        // As the FIFOs read them: through the env plugin (config::with_nccl_env).
        let env = |k: &str| cclkit_host::env::process_env().get(k);
        [Protocol::LL, Protocol::LL128, Protocol::SIMPLE]
            .map(|p| ProtoParams::new(p, &env).map_or(0, |pp| pp.slice_data()))
    });
    SLICES[super::fifo::proto_index(p)]
}

/// Bytes a connection's FIFO holds with protocol `p`, with the buffer sizes
/// communicators use (read as the FIFOs read them): the largest message recursive
/// doubling takes, and the most a PAT step sends before it receives.
pub fn pat_limit(p: Protocol) -> usize {
    static LIMITS: std::sync::LazyLock<[usize; 3]> = std::sync::LazyLock::new(|| {
        // As the FIFOs read them: through the env plugin (config::with_nccl_env).
        let env = |k: &str| cclkit_host::env::process_env().get(k);
        [Protocol::LL, Protocol::LL128, Protocol::SIMPLE]
            .map(|p| ProtoParams::new(p, &env).map_or(0, |pp| pp.slice_data() * pp.slots()))
    });
    LIMITS[super::fifo::proto_index(p)]
}

fn proto_env_name(p: Protocol) -> &'static str {
    match p {
        Protocol::LL => "ll",
        Protocol::LL128 => "ll128",
        _ => "simple",
    }
}

#[cfg(test)]
mod tests;
