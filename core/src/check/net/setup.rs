//! What the net checks share: loading the version under test, initialising it,
//! connecting a send/receive pair, and a small engine that posts and polls requests
//! the way NCCL's proxy does (retry on a NULL request, test in order, never block).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::ptr;
use cclkit_abi::raw::net::NetDeviceType;

use super::super::child::{Env, step, within};
use super::super::{Stop, fail, load};
use crate::plugin::net::{
    Mr, NetContext, NetPlugin, Properties, RecvBuffer, RecvComm, Request, SendComm,
};

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
            send = within(CALL_LIMIT, blocked("connect"), || connecting.poll())?;
        }
        if recv.is_none()
            && let Some(l) = listen.as_mut()
        {
            accepts += 1;
            recv = within(CALL_LIMIT, blocked("accept"), || l.accept())?;
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

/// Registers `buf` (from [`buffer`]) on a receive comm.
pub(crate) fn reg_recv(comm: &mut RecvComm, buf: &mut [u8]) -> Result<Mr, Stop> {
    // SAFETY: as above.
    unsafe { comm.reg_mr(buf.as_mut_ptr(), buf.len(), ptr::HOST) }.map_err(Stop::from)
}

/// How a request ended: the sizes `test` reported, or its error.
pub(crate) type Done = Result<Vec<usize>, String>;

/// One connection and its in-flight requests.
pub(crate) struct Flow {
    pub send: SendComm,
    pub recv: RecvComm,
    sends: VecDeque<(usize, Request)>,
    recvs: VecDeque<(usize, Request)>,
    done: HashMap<usize, Done>,
    next: usize,
    /// `NULL` requests returned by isend / irecv so far.
    pub null_sends: u64,
    /// See `null_sends`.
    pub null_recvs: u64,
}

impl Flow {
    /// Wraps a connected pair.
    pub fn new((send, recv): (SendComm, RecvComm)) -> Self {
        Self {
            send,
            recv,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            done: HashMap::new(),
            next: 0,
            null_sends: 0,
            null_recvs: 0,
        }
    }

    /// Sends and receives posted and not yet seen complete.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.sends.len(), self.recvs.len())
    }

    /// One `isend` attempt: `Ok(None)` when the plugin returned a NULL request.
    pub fn try_isend(
        &mut self,
        data: &[u8],
        tag: i32,
        mr: Option<&Mr>,
    ) -> Result<Option<usize>, Stop> {
        // SAFETY: `data` points into a buffer that lives for the process (`buffer`),
        // left untouched until the request completes.
        let r = unsafe { self.send.isend(data.as_ptr(), data.len(), tag, mr) }?;
        Ok(match r {
            Some(req) => {
                let t = self.token();
                self.sends.push_back((t, req));
                Some(t)
            }
            None => {
                self.null_sends += 1;
                None
            }
        })
    }

    /// Posts `data` with `tag`, retrying a NULL request (and testing what is in
    /// flight meanwhile) until `limit`. Returns the request's token.
    pub fn isend(
        &mut self,
        data: &[u8],
        tag: i32,
        mr: Option<&Mr>,
        limit: Duration,
    ) -> Result<usize, Stop> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(t) = self.try_isend(data, tag, mr)? {
                return Ok(t);
            }
            if Instant::now() > deadline {
                let (s, r) = self.in_flight();
                return fail!(
                    "isend returned a NULL request (\"not now\") for {} s with {s} sends and \
                     {r} receives in flight",
                    limit.as_secs()
                );
            }
            self.progress()?;
            std::thread::yield_now();
        }
    }

    /// Posts a (grouped) receive, like [`isend`](Self::isend).
    pub fn irecv(
        &mut self,
        bufs: &[RecvBuffer<'_>],
        optional: bool,
        limit: Duration,
    ) -> Result<usize, Stop> {
        let deadline = Instant::now() + limit;
        loop {
            // SAFETY: every buffer lives for the process (`buffer`) and is only read
            // by the check after its request completes.
            let r = unsafe { self.recv.irecv(bufs, optional) }?;
            if let Some(req) = r {
                let t = self.token();
                self.recvs.push_back((t, req));
                return Ok(t);
            }
            self.null_recvs += 1;
            if Instant::now() > deadline {
                let (s, r) = self.in_flight();
                return fail!(
                    "irecv returned a NULL request (\"not now\") for {} s with {r} receives \
                     and {s} sends in flight",
                    limit.as_secs()
                );
            }
            self.progress()?;
            std::thread::yield_now();
        }
    }

    fn token(&mut self) -> usize {
        self.next += 1;
        self.next
    }

    /// Tests every request in flight once, in posting order.
    pub fn progress(&mut self) -> Result<(), Stop> {
        let mut left = VecDeque::new();
        while let Some((t, mut req)) = self.sends.pop_front() {
            match self.send.test(&mut req) {
                Ok(Some(sizes)) => {
                    self.done.insert(t, Ok(sizes.as_slice().to_vec()));
                }
                Ok(None) => left.push_back((t, req)),
                Err(e) => {
                    self.done.insert(t, Err(e.to_string()));
                }
            }
        }
        self.sends = left;
        let mut left = VecDeque::new();
        while let Some((t, mut req)) = self.recvs.pop_front() {
            match self.recv.test(&mut req) {
                Ok(Some(sizes)) => {
                    self.done.insert(t, Ok(sizes.as_slice().to_vec()));
                }
                Ok(None) => left.push_back((t, req)),
                Err(e) => {
                    self.done.insert(t, Err(e.to_string()));
                }
            }
        }
        self.recvs = left;
        Ok(())
    }

    /// How request `token` ended, if it has.
    pub fn take(&mut self, token: usize) -> Option<Done> {
        self.done.remove(&token)
    }

    /// Waits for every token in `tokens` until `limit`; returns their endings in order.
    pub fn wait(&mut self, tokens: &[usize], limit: Duration) -> Result<Vec<Done>, Stop> {
        let deadline = Instant::now() + limit;
        loop {
            self.progress()?;
            if tokens.iter().all(|t| self.done.contains_key(t)) {
                return Ok(tokens.iter().filter_map(|t| self.done.remove(t)).collect());
            }
            if Instant::now() > deadline {
                let (s, r) = self.in_flight();
                return fail!(
                    "{} of {} requests did not complete within {} s ({s} sends and {r} \
                     receives still in flight)",
                    tokens.iter().filter(|t| !self.done.contains_key(t)).count(),
                    tokens.len(),
                    limit.as_secs()
                );
            }
            std::thread::yield_now();
        }
    }

    /// Waits for `tokens`, failing on the first request that ended in an error.
    pub fn wait_ok(&mut self, tokens: &[usize], limit: Duration) -> Result<Vec<Vec<usize>>, Stop> {
        self.wait(tokens, limit)?
            .into_iter()
            .map(|d| d.map_err(Stop::Fail))
            .collect()
    }

    /// Closes both comms (each call guarded), then returns any error.
    pub fn close(self) -> Result<(), Stop> {
        let Flow { send, recv, .. } = self;
        within(CALL_LIMIT, blocked("closeSend"), || send.close())?;
        within(CALL_LIMIT, blocked("closeRecv"), || recv.close())?;
        Ok(())
    }
}

/// One send of `data` into a receive of `recv_len` bytes with tag `tag`; returns the
/// received bytes and the sizes both sides reported.
pub(crate) fn transfer(
    flow: &mut Flow,
    data: &[u8],
    recv_len: usize,
    tag: i32,
    optional: bool,
) -> Result<(Vec<u8>, usize, usize), Stop> {
    let sbuf = buffer(data.len());
    sbuf.copy_from_slice(data);
    let rbuf = buffer(recv_len);
    rbuf.fill(0xA5);
    let smr = reg_send(&mut flow.send, sbuf)?;
    let rmr = reg_recv(&mut flow.recv, rbuf)?;
    let rt = flow.irecv(
        &[RecvBuffer {
            data: rbuf.as_mut_ptr(),
            size: recv_len,
            tag,
            mr: Some(&rmr),
        }],
        optional,
        OP_LIMIT,
    )?;
    let st = flow.isend(sbuf, tag, Some(&smr), OP_LIMIT)?;
    let done = flow.wait_ok(&[st, rt], OP_LIMIT)?;
    let sent = done[0].first().copied().unwrap_or(0);
    let got = done[1].first().copied().unwrap_or(0);
    flow.send.dereg_mr(smr)?;
    flow.recv.dereg_mr(rmr)?;
    Ok((rbuf.to_vec(), sent, got))
}
