//! Test helpers: C plugins built at test time and packaged Rust plugins, from
//! `cclkit_tests` (shared with the host's and the runtime's tests).
#![allow(dead_code, unused_imports)]

pub use cclkit_tests::cplugin::{Plugins, abi_include, fixture, s};
pub use cclkit_tests::plugin as rust_plugin;
pub mod tune;
