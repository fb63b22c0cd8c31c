//! What one operation hands the engine: its user buffers and its reduction. A leaf
//! module, so that the engine, the device path and the collectives share it without
//! importing each other.

use cclkit_kernels::Reduction;

/// One operation's user buffers. The submitting thread blocks until the batch is
/// finished, so the pointers stay valid for as long as the engine uses them.
#[derive(Clone, Copy, Debug)]
pub struct UserBufs {
    /// Send buffer start.
    pub send: *const u8,
    /// Send buffer bytes.
    pub send_len: usize,
    /// Receive buffer start.
    pub recv: *mut u8,
    /// Receive buffer bytes.
    pub recv_len: usize,
}

// SAFETY: the buffers are only touched by the engine thread while the submitting
// thread waits for the batch (see `Proxy::run`).
unsafe impl Send for UserBufs {}

/// An operation's buffers and reduction.
#[derive(Clone, Copy, Debug)]
pub struct OpRef {
    /// User buffers.
    pub bufs: UserBufs,
    /// The reduction (data type, op, ranks).
    pub red: Reduction,
}
