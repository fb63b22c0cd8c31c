//! cclkit: the plugin loader and (soon) the GPU-free reference runtime for NCCL/RCCL
//! plugins, plus the `cclkit` command-line tool.
//!
//! * [`plugin`]: loading net and tuner plugins exactly as NCCL/RCCL do, host adapters
//!   over every ABI version, and loud fallback.
//! * [`check`]: `cclkit check`, the GPU-free conformance suite for plugins.
//! * [`cli`]: `cclkit doctor`, `cclkit info`, `cclkit check`, …
//! * [`elf`]: reading plugin files without loading them (symbols, dependencies).
//! * [`log`]: NCCL-style logging (`NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`).

pub mod check;
pub mod cli;
pub mod elf;
pub mod log;
pub mod plugin;
pub mod runtime;
