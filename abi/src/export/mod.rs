//! The plugin side of the C edge: export macros and per-version adapters.
//!
//! Every `extern "C"` fn a plugin publishes lives under this module and runs its
//! body through [`guard::guard`], so a panic or error becomes an `ncclResult_t`.

pub mod env;
pub mod guard;
pub mod net;
pub mod profiler;
pub mod tuner;

/// Refuses to build a plugin with `panic = "abort"` (expanded by every `export_*!`).
///
/// The guard of [`guard`] turns a panic into an `ncclResult_t` and logs its message
/// and location through NCCL's logger; with `panic = "abort"` nothing unwinds, so a
/// panic in a plugin call kills the whole job with no message. `cfg(panic)` is read
/// in the crate that expands the macro, i.e. the plugin's build. To accept that
/// deliberately, enable this crate's `allow-panic-abort` feature (features unify: one
/// crate enabling it turns the check off for the whole build).
#[doc(hidden)]
#[macro_export]
#[cfg(not(feature = "allow-panic-abort"))]
macro_rules! __cclkit_refuse_panic_abort {
    () => {
        #[cfg(panic = "abort")]
        ::core::compile_error!(
            "cclkit-abi: this plugin is built with `panic = \"abort\"`, which removes the \
             panic containment of export_net!/export_tuner!: a panic in a plugin call would \
             kill the whole NCCL job instead of returning an error with its message and \
             location in NCCL's log. Remove `panic = \"abort\"` from the [profile.*] \
             sections of Cargo.toml (and from RUSTFLAGS), or accept it deliberately with \
             `cclkit-abi = { version = \"0.1\", features = [\"allow-panic-abort\"] }`."
        );
    };
}

/// `allow-panic-abort` is on: the build-time check is off (see the other definition).
#[doc(hidden)]
#[macro_export]
#[cfg(feature = "allow-panic-abort")]
macro_rules! __cclkit_refuse_panic_abort {
    () => {};
}
