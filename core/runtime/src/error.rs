//! Errors of the reference runtime: an `ncclResult_t` code and a message naming
//! the rank, the peer and the step that failed.

use std::fmt;

use cclkit_abi::raw::common::NcclResult;

/// A runtime failure, as NCCL would report it.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    code: NcclResult,
    message: String,
}

/// `Result` with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with an explicit code.
    pub fn new(code: NcclResult, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
    /// `ncclSystemError`: a system call or socket failed.
    pub fn system(message: impl Into<String>) -> Self {
        Self::new(NcclResult::SYSTEM_ERROR, message)
    }
    /// `ncclInternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(NcclResult::INTERNAL_ERROR, message)
    }
    /// `ncclInvalidArgument`: a bad argument from the caller.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(NcclResult::INVALID_ARGUMENT, message)
    }
    /// `ncclInvalidUsage`: a valid call in the wrong state or with mismatched peers.
    pub fn invalid_usage(message: impl Into<String>) -> Self {
        Self::new(NcclResult::INVALID_USAGE, message)
    }
    /// `ncclRemoteError`: a peer failed or went away.
    pub fn remote(message: impl Into<String>) -> Self {
        Self::new(NcclResult::REMOTE_ERROR, message)
    }
    /// `ncclTimeout`.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(NcclResult::TIMEOUT, message)
    }
    /// `ncclSystemError` from an I/O error, naming what was being done.
    pub fn io(what: impl fmt::Display, err: std::io::Error) -> Self {
        match err.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                Self::timeout(format!("{what}: {err}"))
            }
            std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof => {
                Self::remote(format!("{what}: peer went away ({err})"))
            }
            _ => Self::system(format!("{what}: {err}")),
        }
    }
    /// The `ncclResult_t` code.
    pub fn code(&self) -> NcclResult {
        self.code
    }
    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// Prefixes context: `err.context("rank 3")`.
    pub fn context(mut self, ctx: impl fmt::Display) -> Self {
        self.message = format!("{ctx}: {}", self.message);
        self
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.message, self.code)
    }
}

impl std::error::Error for Error {}

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
