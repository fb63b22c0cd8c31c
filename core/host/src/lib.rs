//! The plugin loader: NCCL/RCCL name resolution, `dlopen` with refcounted reload, host
//! adapters for every net and tuner ABI version, the logger handed to plugins, and the
//! per-process selection walk with loud fallback.
//!
//! | module | job |
//! | --- | --- |
//! | [`config`] | [`LoaderConfig`]: every environment variable, read in one place |
//! | [`resolve`] | which names `dlopen` is tried with (NCCL 2.30 rules) |
//! | [`library`] | `dlopen(RTLD_NOW \| RTLD_LOCAL)`, shared handles, reload |
//! | [`symbols`] | versioned symbols a library exports; what each NCCL release picks |
//! | [`net`] | [`net::NetPlugin`] → [`net::NetContext`] → comms and requests |
//! | [`tuner`] | [`tuner::TunerPlugin`] → [`tuner::TunerContext`] |
//! | [`mod@env`] | `NCCL_ENV_PLUGIN`: [`env::EnvPlugin`] `init` / `getEnv` / `finalize` |
//! | [`select`] | the walk NCCL does per communicator, keeping every attempt |
//! | [`logger`] | the C-variadic `ncclDebugLogger_t` → `tracing` |
//!
//! Every `extern "C"` function on the host side lives under this module.
//!
//! # Quick start
//!
//! ```no_run
//! use cclkit_host::net::CommConfig;
//! use cclkit_host::select::NetRegistry;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // NCCL_NET_PLUGIN, NCCL_NET, CCLKIT_STRICT, … read once; each failed plugin is
//! // reported at WARN with its reason before the walk moves on.
//! let sel = NetRegistry::global().select(0x1234, CommConfig::default())?;
//! let ctx = sel.context; // finalized when it and its comms are dropped
//! let (handle, mut listen) = ctx.listen(0)?; // ship `handle` to the peer
//! let mut connecting = ctx.connect(0, &handle); // the peer's handle, in real use
//! let (mut send, mut recv) = (None, None);
//! while send.is_none() || recv.is_none() {
//!     if send.is_none() {
//!         send = connecting.poll()?; // non-blocking: None = call again
//!     }
//!     if recv.is_none() {
//!         recv = listen.accept()?;
//!     }
//! }
//! # let _ = (send, recv);
//! # Ok(())
//! # }
//! ```
//!
//! Then `SendComm::isend` / `RecvComm::irecv` return `Option<Request>` (`None` =
//! post again later) and `comm.test(&mut request)` returns `Some(sizes)` when done.
//! Every error is a [`CallError`] naming the call, the plugin, its version, the raw
//! `ncclResult_t` and the plugin's own last WARN message.

// `LoadError` carries the whole attempt history by design (doctor prints it); it is
// only built on cold paths, so its size in `Result` does not matter.
#![allow(clippy::result_large_err)]

pub mod config;
pub mod env;
pub mod error;
pub mod guard;
pub mod kinds;
pub mod library;
pub mod log;
pub mod logger;
pub mod net;
pub mod open;
pub mod profiler;
pub mod releases;
pub mod resolve;
pub mod select;
pub mod symbols;

pub mod tuner;

pub use config::{Flavor, LoaderConfig, PluginKind};
pub use error::{CallError, Cause, LoadError, NetError, OpenAttempt, OpenOutcome, TunerError};
pub use library::Library;

/// The function type inside one of the ABI crate's `Option<fn>` slot aliases.
pub(crate) trait Slot {
    /// The non-NULL function pointer type.
    type Fn: Copy;
}
impl<F: Copy> Slot for Option<F> {
    type Fn = F;
}
/// `FnOf<fns::InitV6>`: the `unsafe extern "C" fn` type of that slot.
pub(crate) type FnOf<T> = <T as Slot>::Fn;
