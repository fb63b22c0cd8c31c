//! Tuner export: `ncclTunerPlugin_v1` … `_v7` from one [`Tuner`] implementation.
//!
//! The adapters do what NCCL's shims do in reverse: v2–v4 `init` takes the context
//! out-pointer last and v5–v7 first; the constants reach the tuner as a
//! [`view::Constants`] over exactly the struct the host allocated (NCCL 1152 bytes,
//! v7 1272, RCCL 1488/1632; [`host`] says how the layout is chosen); v1/v2 return an
//! algorithm/protocol instead of editing a table, so they get a synthesised table
//! (see `ops::choose_legacy`).

use std::sync::Mutex;

use crate::tuner::Tuner;

pub mod host;
mod ops;
pub mod tables;
pub mod view;

/// Connects a `Tuner` type to its process-wide state; implemented by `export_tuner!`.
pub trait TunerExport: Tuner {
    /// State for the context-less v1 ABI.
    fn state() -> &'static TunerState<Self>;
}

/// The single tuner v1 hosts talk to (v1 has no context).
pub struct TunerState<T> {
    global: Mutex<Option<T>>,
}

impl<T> TunerState<T> {
    /// Empty state (const, for a `static`).
    pub const fn new() -> Self {
        Self {
            global: Mutex::new(None),
        }
    }

    /// Drops the v1 instance; run when the library is unloaded.
    pub fn unload(&self) {
        if let Ok(mut g) = self.global.lock() {
            *g = None;
        }
    }
}

impl<T> Default for TunerState<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Publishes `ncclTunerPlugin_v1` … `ncclTunerPlugin_v7` for a [`Tuner`](crate::tuner::Tuner) type.
///
/// ```ignore
/// cclkit_abi::export_tuner!(MyTuner);
/// ```
#[macro_export]
macro_rules! export_tuner {
    ($ty:ty) => {
        $crate::__cclkit_refuse_panic_abort!();
        impl $crate::export::tuner::TunerExport for $ty {
            fn state() -> &'static $crate::export::tuner::TunerState<Self> {
                static STATE: $crate::export::tuner::TunerState<$ty> =
                    $crate::export::tuner::TunerState::new();
                &STATE
            }
        }

        /// `ncclTunerPlugin_v7` (NCCL source after 2.31: five GPU-generation rows).
        #[unsafe(no_mangle)]
        pub static ncclTunerPlugin_v7: $crate::raw::tuner::ncclTuner_v7_t =
            $crate::export::tuner::tables::v7::<$ty>();
        /// `ncclTunerPlugin_v6` (NCCL 2.30).
        #[unsafe(no_mangle)]
        pub static ncclTunerPlugin_v6: $crate::raw::tuner::ncclTuner_v6_t =
            $crate::export::tuner::tables::v6::<$ty>();
        /// `ncclTunerPlugin_v5` (NCCL 2.28–2.29).
        #[unsafe(no_mangle)]
        pub static ncclTunerPlugin_v5: $crate::raw::tuner::ncclTuner_v5_t =
            $crate::export::tuner::tables::v5::<$ty>();
        /// `ncclTunerPlugin_v4` (NCCL 2.24–2.27).
        #[unsafe(no_mangle)]
        pub static ncclTunerPlugin_v4: $crate::raw::tuner::ncclTuner_v4_t =
            $crate::export::tuner::tables::v4::<$ty>();
        /// `ncclTunerPlugin_v3` (NCCL 2.22–2.23).
        #[unsafe(no_mangle)]
        pub static ncclTunerPlugin_v3: $crate::raw::tuner::ncclTuner_v3_t =
            $crate::export::tuner::tables::v3::<$ty>();
        /// `ncclTunerPlugin_v2` (NCCL 2.21).
        #[unsafe(no_mangle)]
        pub static ncclTunerPlugin_v2: $crate::raw::tuner::ncclTuner_v2_t =
            $crate::export::tuner::tables::v2::<$ty>();
        /// `ncclTunerPlugin_v1` (NCCL 2.19–2.20).
        #[unsafe(no_mangle)]
        pub static ncclTunerPlugin_v1: $crate::raw::tuner::ncclTuner_v1_t =
            $crate::export::tuner::tables::v1::<$ty>();

        const _: () = {
            extern "C" fn cclkit_tuner_unload() {
                <$ty as $crate::export::tuner::TunerExport>::state().unload();
                $crate::export::guard::uninstall_hook();
            }
            #[used]
            #[unsafe(link_section = ".fini_array")]
            static CCLKIT_TUNER_FINI: extern "C" fn() = cclkit_tuner_unload;
        };
    };
}
