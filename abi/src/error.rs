//! The one error type of the SDK and its mapping onto `ncclResult_t`.

use std::borrow::Cow;
use std::fmt;

use crate::raw::common::NcclResult;

/// An error from a plugin method: an `ncclResult_t` code plus a message for the log.
///
/// The export adapters turn it into its code at the C edge and log the message
/// through NCCL's logger at WARN, so every failure is explained once, where it happens.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    code: NcclResult,
    message: Cow<'static, str>,
}

/// `Result` with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with an explicit code.
    pub fn new(code: NcclResult, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `ncclInternalError`: the plugin hit a state it cannot handle.
    pub fn internal(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(NcclResult::INTERNAL_ERROR, message)
    }

    /// `ncclSystemError`: a system call failed.
    pub fn system(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(NcclResult::SYSTEM_ERROR, message)
    }

    /// `ncclSystemError` from an `io::Error`, naming the call that failed.
    pub fn io(call: &str, err: std::io::Error) -> Self {
        Self::system(format!("{call}: {err}"))
    }

    /// `ncclSystemError`, `ncclTimeout` or `ncclRemoteError` from an `io::Error`, by
    /// its kind: a timeout is `ncclTimeout`, a reset, aborted, broken or ended
    /// connection means the peer went away (`ncclRemoteError`), anything else is a
    /// system error. `what` names what was being done.
    pub fn from_io(what: impl fmt::Display, err: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match err.kind() {
            K::TimedOut | K::WouldBlock => Self::timeout(format!("{what}: {err}")),
            K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
                Self::remote(format!("{what}: peer went away ({err})"))
            }
            _ => Self::system(format!("{what}: {err}")),
        }
    }

    /// `ncclTimeout`: a deadline passed.
    pub fn timeout(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(NcclResult::TIMEOUT, message)
    }

    /// `ncclInvalidArgument`: a bad argument (NULL pointer, unknown device, bad handle).
    pub fn invalid_argument(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(NcclResult::INVALID_ARGUMENT, message)
    }

    /// `ncclInvalidUsage`: a valid call at the wrong time or with mismatched sizes.
    pub fn invalid_usage(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(NcclResult::INVALID_USAGE, message)
    }

    /// `ncclRemoteError`: the peer failed or went away.
    pub fn remote(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(NcclResult::REMOTE_ERROR, message)
    }

    /// `ncclInternalError` for an operation this plugin does not implement.
    pub fn unsupported(what: &str) -> Self {
        Self::internal(format!("{what} is not supported by this plugin"))
    }

    /// The `ncclResult_t` code.
    pub fn code(&self) -> NcclResult {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefixes the message with context (`"connect to 10.0.0.2: " + message`).
    pub fn context(mut self, ctx: impl fmt::Display) -> Self {
        self.message = Cow::Owned(format!("{ctx}: {}", self.message));
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

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        Self::system(err.to_string())
    }
}
