//! What the net checks share: loading the version under test, initialising it,
//! connecting a send/receive pair, buffers and registrations. The request engine is
//! in `flow`.

use std::time::{Duration, Instant};

use cclkit_abi::raw::common::ptr;
use cclkit_abi::raw::net::NetDeviceType;

use super::super::child::{Env, step, within};
use super::super::{Stop, fail, load};
use super::timing::timed;
use cclkit_host::net::{Mr, NetContext, NetPlugin, Properties, RecvComm, SendComm};

pub(crate) use super::flow::{Flow, transfer};

/// Longest a single non-blocking call (connect, accept, close) may take.
pub(crate) const CALL_LIMIT: Duration = Duration::from_secs(5);
/// Longest a transfer, a connection or a retried post may take.
pub(crate) const OP_LIMIT: Duration = Duration::from_secs(8);

/// The outcome when the plugin has nothing to run on: SKIP, or FAIL with
/// `--require-devices`.
pub(crate) fn no_device(env: &Env, msg: String) -> Stop {
    if env.require_devices {
        Stop::Fail(format!("{msg} (--require-devices)"))
    } else {
        Stop::Skip(format!(
            "{msg}; a legitimate outcome on a machine without this plugin's hardware \
             (--require-devices makes it a failure)"
        ))
    }
}

/// Loads the version under test.
pub(crate) fn load_plugin(env: &Env) -> Result<NetPlugin, Stop> {
    step("dlopen and read the table");
    let lib = load::open(&env.library).map_err(Stop::Fail)?;
    load::net(&lib, env.version).map_err(Stop::Fail)
}

/// `init` for one communicator; a failure means "no usable device here".
pub(crate) fn init(env: &Env, plugin: &NetPlugin, comm_id: u64) -> Result<NetContext, Stop> {
    step(format!("init (commId {comm_id:#x})"));
    plugin
        .init(comm_id, Default::default())
        .map_err(|e| no_device(env, format!("init failed: {e}")))
}

/// A plugin initialised for one communicator, with at least one device.
pub(crate) struct Ready {
    pub plugin: NetPlugin,
    pub ctx: NetContext,
    pub ndev: usize,
    /// Device 0's properties (the device every data check uses).
    pub props: Properties,
}

impl Ready {
    /// Loads, initialises, counts devices and reads device 0 (NCCL's own sequence).
    pub fn new(env: &Env) -> Result<Self, Stop> {
        let plugin = load_plugin(env)?;
        let ctx = init(env, &plugin, 0xC0FFEE)?;
        step("devices");
        let ndev = ctx.devices()?;
        if ndev == 0 {
            return Err(no_device(env, "devices() reported 0 devices".into()));
        }
        step("getProperties(0)");
        let props = ctx.properties(0)?;
        Ok(Self {
            plugin,
            ctx,
            ndev,
            props,
        })
    }

    /// Like [`new`](Self::new), and SKIP if device 0 cannot move host memory.
    pub fn for_data(env: &Env) -> Result<Self, Stop> {
        let r = Self::new(env)?;
        if r.props.device_type != NetDeviceType::HOST {
            return Err(Stop::Skip(format!(
                "device 0 is of type {:?} (GPU offload): host-memory transfers do not apply",
                r.props.device_type
            )));
        }
        if r.props.ptr_support & ptr::HOST == 0 {
            return Err(Stop::Skip(
                "device 0 does not support host memory (ptrSupport lacks NCCL_PTR_HOST)".into(),
            ));
        }
        Ok(r)
    }

    /// Largest grouped receive to use (maxRecvs, at most 8).
    pub fn max_recvs(&self) -> usize {
        usize::try_from(self.props.max_recvs)
            .unwrap_or(1)
            .clamp(1, 8)
    }
}

/// Connects a send comm on `send_ctx` to a receive comm on `recv_ctx` (device `dev`),
/// polling `connect` and `accept` alternately as NCCL's proxy threads do; the listen
/// comm is closed as soon as `accept` returns, as NCCL does.
pub(crate) fn pair(
    send_ctx: &NetContext,
    recv_ctx: &NetContext,
    dev: usize,
) -> Result<(SendComm, RecvComm), Stop> {
    step(format!("listen on device {dev}"));
    let (handle, listen) = recv_ctx.listen(dev)?;
    let mut listen = Some(listen);
    let mut connecting = send_ctx.connect(dev, &handle);
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + OP_LIMIT;
    let (mut connects, mut accepts) = (0u32, 0u32);
    step("connect/accept");
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            connects += 1;
            send = within(CALL_LIMIT, blocked("connect"), || {
                timed("connect", || connecting.poll())
            })??;
        }
        if recv.is_none()
            && let Some(l) = listen.as_mut()
        {
            accepts += 1;
            recv = within(CALL_LIMIT, blocked("accept"), || {
                timed("accept", || l.accept())
            })??;
            if recv.is_some()
                && let Some(l) = listen.take()
            {
                within(CALL_LIMIT, blocked("closeListen"), || l.close())?;
            }
        }
        if Instant::now() > deadline {
            return fail!(
                "connect/accept did not complete within {} s (connect called {connects} times, \
                 accept {accepts} times; {} done)",
                OP_LIMIT.as_secs(),
                match (send.is_some(), recv.is_some()) {
                    (true, false) => "connect",
                    (false, true) => "accept",
                    _ => "neither",
                }
            );
        }
        std::thread::yield_now();
    }
    match (send, recv) {
        (Some(s), Some(r)) => Ok((s, r)),
        _ => fail!("connect/accept ended without both comms"),
    }
}

/// The message for a call that did not return within [`CALL_LIMIT`].
pub(crate) fn blocked(call: &'static str) -> impl FnOnce() -> String {
    move || {
        format!(
            "{call} did not return within {} s: {call} must never block (return ncclSuccess \
             with a NULL comm and let NCCL call again with the same handle)",
            CALL_LIMIT.as_secs()
        )
    }
}

/// A buffer that lives until the process ends: a plugin may still touch buffers of
/// requests abandoned by a failing check, so they are never freed.
pub(crate) fn buffer(len: usize) -> &'static mut [u8] {
    let b: &'static mut [u8] = Box::leak(vec![0u8; len.max(1)].into_boxed_slice());
    &mut b[..len]
}

/// Registers `buf` (from [`buffer`]) on a send comm.
pub(crate) fn reg_send(comm: &mut SendComm, buf: &mut [u8]) -> Result<Mr, Stop> {
    // SAFETY: every check buffer comes from `buffer`, which never frees it.
    unsafe { comm.reg_mr(buf.as_mut_ptr(), buf.len(), ptr::HOST) }.map_err(Stop::from)
}

/// The version's limit of requests in flight per comm: NCCL_NET_MAX_REQUESTS, which
/// was 8 for v6 plugins and 32 from v7 (§2.11b "Sizes and counts").
pub(crate) fn request_limit(version: u32) -> usize {
    if version <= 6 {
        8
    } else {
        cclkit_abi::raw::net::NCCL_NET_MAX_REQUESTS
    }
}

/// Registers `buf` (from [`buffer`]) on a receive comm.
pub(crate) fn reg_recv(comm: &mut RecvComm, buf: &mut [u8]) -> Result<Mr, Stop> {
    // SAFETY: as above.
    unsafe { comm.reg_mr(buf.as_mut_ptr(), buf.len(), ptr::HOST) }.map_err(Stop::from)
}
