//! Env export: `ncclEnvPlugin_v1` and `_v2` from one [`Env`] implementation.
//!
//! The two versions differ only in `init` (v2 also passes NCCL's logger), so both
//! tables drive the same process-wide [`EnvState`]. NCCL loads one env plugin per
//! process and calls `init` once, which is why the state is a singleton rather than a
//! context pointer as for tuners.

use crate::env::Env;

mod state;
pub mod tables;

pub use state::EnvState;

/// Connects an `Env` type to its process-wide state; implemented by `export_env!`.
pub trait EnvExport: Env {
    /// The one instance NCCL talks to, with the strings it was handed.
    fn state() -> &'static EnvState<Self>;
}

/// Publishes `ncclEnvPlugin_v2` and `ncclEnvPlugin_v1` for an [`Env`](crate::env::Env) type.
///
/// ```ignore
/// cclkit_abi::export_env!(MyEnv);
/// ```
#[macro_export]
macro_rules! export_env {
    ($ty:ty) => {
        $crate::__cclkit_refuse_panic_abort!();
        impl $crate::export::env::EnvExport for $ty {
            fn state() -> &'static $crate::export::env::EnvState<Self> {
                static STATE: $crate::export::env::EnvState<$ty> =
                    $crate::export::env::EnvState::new();
                &STATE
            }
        }

        /// `ncclEnvPlugin_v2` (NCCL 2.30.7 and later).
        #[unsafe(no_mangle)]
        pub static ncclEnvPlugin_v2: $crate::raw::env::ncclEnv_v2_t =
            $crate::export::env::tables::v2::<$ty>();
        /// `ncclEnvPlugin_v1` (NCCL 2.28.7 and later; the only one before 2.30.7).
        #[unsafe(no_mangle)]
        pub static ncclEnvPlugin_v1: $crate::raw::env::ncclEnv_v1_t =
            $crate::export::env::tables::v1::<$ty>();

        const _: () = {
            extern "C" fn cclkit_env_unload() {
                <$ty as $crate::export::env::EnvExport>::state().unload();
                $crate::export::guard::uninstall_hook();
            }
            #[used]
            #[unsafe(link_section = ".fini_array")]
            static CCLKIT_ENV_FINI: extern "C" fn() = cclkit_env_unload;
        };
    };
}
