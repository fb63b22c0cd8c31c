//! Errors of the reference runtime: `cclkit-abi`'s [`Error`], an `ncclResult_t` code
//! and a message naming the rank, the peer and the step that failed. One error type
//! from the plugin SDK to the runtime: a plugin's error reaches a runtime caller with
//! its code intact.

pub use cclkit_abi::error::{Error, Result};

/// A plugin call error as a runtime error naming the link.
pub(crate) fn net_err(e: cclkit_host::NetError, what: &str) -> Error {
    let code = e.code;
    Error::new(
        if code == cclkit_abi::raw::common::NcclResult::SUCCESS {
            cclkit_abi::raw::common::NcclResult::INTERNAL_ERROR
        } else {
            code
        },
        format!("{what}: {e}"),
    )
}
