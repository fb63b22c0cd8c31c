//! The `cclkit` command line: `perf` (nccl-tests on the reference runtime), `check`
//! (GPU-free conformance, each check in a child process), `doctor`, `info` and `tune`.
//!
//! | module | job |
//! | --- | --- |
//! | [`commands`] | argument parsing and one module per subcommand |
//! | [`check`] | the conformance suite behind `cclkit check` |
//! | [`elf`] | reading plugin files without loading them (symbols, dependencies) |
//! | [`standin`] | `--cuda-standin`: the host-memory CUDA stand-in on the library path |
//!
//! The plugin loader lives in `cclkit-host` and the reference runtime in
//! `cclkit-runtime`; this crate only drives them.

pub mod check;
pub mod commands;
pub mod elf;
pub mod standin;
