//! cclkit: the plugin loader and (soon) the GPU-free reference runtime for NCCL/RCCL
//! plugins, plus the `cclkit` command-line tool.
//!
//! * [`plugin`]: loading net and tuner plugins exactly as NCCL/RCCL do, host adapters
//!   over every ABI version, and loud fallback.
//! * [`cli`]: `cclkit doctor`, `cclkit info`.
//! * [`elf`]: reading plugin files without loading them (symbols, dependencies).
//! * [`log`]: NCCL-style logging (`NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`).

pub mod cli;
pub mod elf;
pub mod log;
pub mod plugin;
pub mod runtime;
