//! Errors of the safe libfabric layer: the `fi_` call that failed plus
//! `fi_strerror` text, so every message names its cause.

use std::ffi::CStr;
use std::fmt;

use crate::sys;

/// A failed libfabric call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiError {
    /// The libfabric function that failed (`"fi_tsend"`).
    pub call: &'static str,
    /// Positive `FI_E*`/errno value (libfabric returns it negated).
    pub code: i32,
    /// Extra text (provider error string from `fi_cq_strerror`, an argument, …).
    pub detail: Option<String>,
}

/// `Result` of the safe layer.
pub type FiResult<T> = Result<T, FiError>;

impl FiError {
    /// An error of `call` with the (positive or negative) libfabric code `code`.
    pub fn new(call: &'static str, code: i64) -> Self {
        Self {
            call,
            code: i32::try_from(code.unsigned_abs()).unwrap_or(i32::MAX),
            detail: None,
        }
    }

    /// Adds detail text.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// True for `-FI_EAGAIN`: retry after driving progress.
    pub fn is_again(&self) -> bool {
        self.code == sys::FI_EAGAIN as i32
    }

    /// True for `-FI_ENODATA` (`fi_getinfo` found nothing matching the hints).
    pub fn is_no_data(&self) -> bool {
        self.code == sys::FI_ENODATA as i32
    }
}

impl fmt::Display for FiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (-{})", self.call, strerror(self.code), self.code)?;
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for FiError {}

impl From<FiError> for cclkit_abi::Error {
    fn from(e: FiError) -> Self {
        cclkit_abi::Error::system(e.to_string())
    }
}

/// `fi_strerror` text for a positive libfabric/errno code.
pub fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror accepts any value and returns a static NUL-terminated
    // string (or NULL, handled below).
    let ptr = unsafe { sys::fi_strerror(code) };
    if ptr.is_null() {
        return format!("unknown error {code}");
    }
    // SAFETY: non-NULL, NUL-terminated, static (owned by libfabric).
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// Turns a libfabric return value (0 or positive = success, negative = `-FI_E*`)
/// into a `Result` naming `call`.
pub fn check(call: &'static str, ret: i64) -> FiResult<i64> {
    if ret < 0 {
        Err(FiError::new(call, ret))
    } else {
        Ok(ret)
    }
}
