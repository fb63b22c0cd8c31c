//! Typed state transitions (`recordEventState`).

use crate::raw::profiler::{
    ProfilerEventState, ncclProfilerEventStateArgs_v1_t, ncclProfilerEventStateArgs_v4_t,
};

/// One `recordEventState` call: the new state and its decoded arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventState {
    /// The state (raw `i32`: any value NCCL sends is representable).
    pub state: ProfilerEventState,
    /// The arguments that belong to this state, if NCCL passed any.
    pub args: StateArgs,
}

/// The member of the state-argument union that `state` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateArgs {
    /// No arguments (NULL, or a state without any).
    None,
    /// v1–v3 ProxyOp states: bytes and steps so far.
    ProxyOp {
        /// Bytes transferred.
        trans_size: usize,
        /// Steps done.
        steps: i32,
    },
    /// v4+ ProxyStep states: the step's bytes.
    ProxyStep {
        /// Bytes of the step.
        trans_size: usize,
    },
    /// `ProxyCtrlAppendEnd`.
    ProxyCtrl {
        /// Proxy operations appended.
        appended_proxy_ops: i32,
    },
    /// `NetPluginUpdate`: the net plugin's updated descriptor (address).
    NetPlugin {
        /// Address of the net plugin's descriptor.
        data: usize,
    },
    /// `KernelChStop` / `KernelPhaseStop`: GPU stop timestamp.
    Timer {
        /// GPU global timer (ns).
        ptimer: u64,
    },
}

impl EventState {
    /// Decodes a v1–v3 call.
    ///
    /// # Safety
    /// `args` must be NULL or point to a readable v1 state-argument union.
    pub unsafe fn from_v1(
        state: ProfilerEventState,
        args: *const ncclProfilerEventStateArgs_v1_t,
    ) -> Self {
        // SAFETY: caller's contract.
        let args = match unsafe { args.as_ref() } {
            None => StateArgs::None,
            Some(a) => match state.0 {
                // SAFETY: states 0–7 carry the proxyOp member; 18 the proxyCtrl one.
                0..=7 => unsafe {
                    StateArgs::ProxyOp {
                        trans_size: a.proxyOp.transSize,
                        steps: a.proxyOp.steps,
                    }
                },
                18 => {
                    // SAFETY: state 18 (ProxyCtrlAppendEnd) carries the proxyCtrl member.
                    let appended_proxy_ops = unsafe { a.proxyCtrl.appendedProxyOps };
                    StateArgs::ProxyCtrl { appended_proxy_ops }
                }
                _ => StateArgs::None,
            },
        };
        Self { state, args }
    }

    /// Decodes a v4–v7 call.
    ///
    /// # Safety
    /// `args` must be NULL or point to a readable v4 state-argument union.
    pub unsafe fn from_v4(
        state: ProfilerEventState,
        args: *const ncclProfilerEventStateArgs_v4_t,
    ) -> Self {
        // SAFETY: caller's contract.
        let args = match unsafe { args.as_ref() } {
            None => StateArgs::None,
            // SAFETY: the state selects the member NCCL wrote (its header's pairing).
            Some(a) => unsafe {
                match state.0 {
                    8..=12 | 20 => StateArgs::ProxyStep {
                        trans_size: a.proxyStep.transSize,
                    },
                    18 => StateArgs::ProxyCtrl {
                        appended_proxy_ops: a.proxyCtrl.appendedProxyOps,
                    },
                    21 => StateArgs::NetPlugin {
                        data: a.netPlugin.data as usize,
                    },
                    22 | 31 => StateArgs::Timer {
                        ptimer: a.kernelCh.pTimer,
                    },
                    _ => StateArgs::None,
                }
            },
        };
        Self { state, args }
    }
}
