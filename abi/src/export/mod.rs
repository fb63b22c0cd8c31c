//! The plugin side of the C edge: export macros and per-version adapters.
//!
//! Every `extern "C"` fn a plugin publishes lives under this module and runs its
//! body through [`guard::guard`], so a panic or error becomes an `ncclResult_t`.

pub mod guard;
pub mod net;
pub mod tuner;
