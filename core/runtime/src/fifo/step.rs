//! A send step's profiler event while a FIFO slot holds its data.

use std::sync::Arc;

use cclkit_host::profiler::callback::StepHandle;
use cclkit_host::profiler::{EventHandle, ProfilerContext};

/// A send step event handed to the FIFO slot holding its data: the net plugin nests
/// the request's events under it (the handle stays at its address in the slot until
/// the request completes), and the slot stops it when the send completes, as NCCL's
/// send step ends.
pub(crate) struct SlotStep {
    handle: StepHandle,
    ctx: Arc<ProfilerContext>,
    /// The step's ProxyOp when this is its last step (NULL otherwise): it ends
    /// right after the step, so no op ends before its steps.
    op: EventHandle,
}

impl SlotStep {
    /// Step `step` of `ctx`, now owned by the slot, with its ProxyOp `op` when the
    /// step is the op's last (else NULL).
    pub(crate) fn new(ctx: Arc<ProfilerContext>, step: EventHandle, op: EventHandle) -> Self {
        Self {
            handle: StepHandle::new(&ctx, step),
            ctx,
            op,
        }
    }

    /// The step's handle as the plugin's `phandle` (stays valid while the slot
    /// holds this step).
    pub(super) fn phandle(&mut self) -> *mut std::ffi::c_void {
        self.handle.as_phandle()
    }

    pub(super) fn end(&self) {
        self.ctx.stop(self.handle.step());
        self.ctx.stop(self.op);
    }
}
