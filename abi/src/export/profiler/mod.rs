//! Profiler export: `ncclProfiler_v1` … `_v7` from one [`Profiler`].
//!
//! Contexts and event handles handed to NCCL are tokens resolved through a
//! per-type registry ([`ProfilerState`]); `slab.rs` explains why they are not pointers.

use std::sync::{Arc, Mutex, RwLock};

use crate::profiler::Profiler;

mod ops;
mod slab;
pub mod tables;

/// Connects a `Profiler` type to its process-wide registry; implemented by `export_profiler!`.
pub trait ProfilerExport: Profiler {
    /// The registry of this type's live contexts.
    fn state() -> &'static ProfilerState<Self>;
}

/// One communicator's profiler and its events.
struct Context<P: Profiler> {
    profiler: P,
    host_abi: u32,
    events: Mutex<slab::Slab<P::Event>>,
}

/// The live contexts of one profiler type, indexed by the token's context field.
pub struct ProfilerState<P: Profiler> {
    contexts: RwLock<Vec<Option<Arc<Context<P>>>>>,
}

impl<P: Profiler> ProfilerState<P> {
    /// Empty registry (const, for a `static`).
    pub const fn new() -> Self {
        Self {
            contexts: RwLock::new(Vec::new()),
        }
    }

    /// Drops every context; run when the library is unloaded.
    pub fn unload(&self) {
        if let Ok(mut g) = self.contexts.write() {
            g.clear();
        }
    }

    /// Contexts alive now (for tests and diagnostics).
    pub fn live_contexts(&self) -> usize {
        self.contexts
            .read()
            .map(|g| g.iter().filter(|c| c.is_some()).count())
            .unwrap_or(0)
    }
}

impl<P: Profiler> Default for ProfilerState<P> {
    fn default() -> Self {
        Self::new()
    }
}

/// Publishes `ncclProfiler_v1` … `ncclProfiler_v7` for a [`Profiler`](crate::profiler::Profiler) type.
///
/// ```ignore
/// cclkit_abi::export_profiler!(MyProfiler);
/// ```
#[macro_export]
macro_rules! export_profiler {
    ($ty:ty) => {
        $crate::__cclkit_refuse_panic_abort!();
        impl $crate::export::profiler::ProfilerExport for $ty {
            fn state() -> &'static $crate::export::profiler::ProfilerState<Self> {
                static STATE: $crate::export::profiler::ProfilerState<$ty> =
                    $crate::export::profiler::ProfilerState::new();
                &STATE
            }
        }

        /// `ncclProfiler_v7` (NCCL 2.31).
        #[unsafe(no_mangle)]
        pub static ncclProfiler_v7: $crate::raw::profiler::v7::ncclProfiler_v7_t =
            $crate::export::profiler::tables::v7::<$ty>();
        /// `ncclProfiler_v6` (NCCL 2.29–2.30).
        #[unsafe(no_mangle)]
        pub static ncclProfiler_v6: $crate::raw::profiler::v6::ncclProfiler_v6_t =
            $crate::export::profiler::tables::v6::<$ty>();
        /// `ncclProfiler_v5` (NCCL 2.28).
        #[unsafe(no_mangle)]
        pub static ncclProfiler_v5: $crate::raw::profiler::v5::ncclProfiler_v5_t =
            $crate::export::profiler::tables::v5::<$ty>();
        /// `ncclProfiler_v4` (NCCL 2.27).
        #[unsafe(no_mangle)]
        pub static ncclProfiler_v4: $crate::raw::profiler::v4::ncclProfiler_v4_t =
            $crate::export::profiler::tables::v4::<$ty>();
        /// `ncclProfiler_v3` (NCCL 2.26).
        #[unsafe(no_mangle)]
        pub static ncclProfiler_v3: $crate::raw::profiler::v3::ncclProfiler_v3_t =
            $crate::export::profiler::tables::v3::<$ty>();
        /// `ncclProfiler_v2` (NCCL 2.24–2.25).
        #[unsafe(no_mangle)]
        pub static ncclProfiler_v2: $crate::raw::profiler::v2::ncclProfiler_v2_t =
            $crate::export::profiler::tables::v2::<$ty>();
        /// `ncclProfiler_v1` (NCCL 2.23).
        #[unsafe(no_mangle)]
        pub static ncclProfiler_v1: $crate::raw::profiler::v1::ncclProfiler_v1_t =
            $crate::export::profiler::tables::v1::<$ty>();

        const _: () = {
            extern "C" fn cclkit_profiler_unload() {
                <$ty as $crate::export::profiler::ProfilerExport>::state().unload();
                $crate::export::guard::uninstall_hook();
            }
            #[used]
            #[unsafe(link_section = ".fini_array")]
            static CCLKIT_PROFILER_FINI: extern "C" fn() = cclkit_profiler_unload;
        };
    };
}
