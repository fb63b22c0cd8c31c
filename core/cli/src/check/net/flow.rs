//! The request engine of the net checks: posts and polls requests the way NCCL's
//! proxy does (NCCL_ABI.md §2.11b). Only the oldest request of each comm is tested; a
//! NULL request ("not now") is retried later while the other side keeps progressing;
//! at most the version's request limit is in flight per comm; receives are tried
//! before sends in every round; every call is timed (see `timing`).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::setup::{CALL_LIMIT, OP_LIMIT, blocked, buffer, reg_recv, reg_send, request_limit};
use super::timing::timed;
use crate::check::child::within;
use crate::check::{Stop, fail};
use cclkit_host::error::NetError;
use cclkit_host::net::{Mr, RecvBuffer, RecvComm, Request, SendComm, Sizes};

/// How a request ended: the sizes `test` reported, or its error.
pub(crate) type Done = Result<Vec<usize>, String>;

/// One send to post.
pub(crate) struct SendPost<'a> {
    /// The bytes (in a buffer that outlives the request, see `buffer`).
    pub data: &'a [u8],
    /// The tag.
    pub tag: i32,
    /// Its registration (contract checks always pass one).
    pub mr: Option<&'a Mr>,
}

/// One (grouped) receive to post.
pub(crate) struct RecvPost<'a> {
    /// Its buffers, each with its registration.
    pub bufs: Vec<RecvBuffer<'a>>,
    /// Post with `*request` = NCCL_NET_OPTIONAL_RECV_COMPLETION.
    pub optional: bool,
}

/// Buffers carved out of one registered region, as NCCL carves its slots out of one
/// registered buffer.
pub(crate) struct Region {
    rest: &'static mut [u8],
}

impl Region {
    /// A region registered on a send comm.
    pub fn on_send(comm: &mut SendComm, total: usize) -> Result<(Self, Mr), Stop> {
        let r = Self {
            rest: buffer(total),
        };
        let mr = reg_send(comm, &mut *r.rest)?;
        Ok((r, mr))
    }

    /// A region registered on a receive comm.
    pub fn on_recv(comm: &mut RecvComm, total: usize) -> Result<(Self, Mr), Stop> {
        let r = Self {
            rest: buffer(total),
        };
        let mr = reg_recv(comm, &mut *r.rest)?;
        Ok((r, mr))
    }

    /// The next `len` bytes (empty when the region is used up).
    pub fn take(&mut self, len: usize) -> &'static mut [u8] {
        let rest = std::mem::take(&mut self.rest);
        let (a, b) = rest.split_at_mut(len.min(rest.len()));
        self.rest = b;
        a
    }
}

/// One connection and its in-flight requests.
pub(crate) struct Flow {
    pub send: SendComm,
    pub recv: RecvComm,
    sends: VecDeque<(usize, Request)>,
    recvs: VecDeque<(usize, Request)>,
    done: HashMap<usize, Done>,
    next: usize,
    limit: usize,
    /// `NULL` requests returned by isend so far.
    pub null_sends: u64,
    /// `NULL` requests returned by irecv so far.
    pub null_recvs: u64,
}

/// The ending of one `test` call, if the request ended.
fn ended(r: Result<Option<Sizes>, NetError>) -> Option<Done> {
    match r {
        Ok(Some(sizes)) => Some(Ok(sizes.as_slice().to_vec())),
        Ok(None) => None,
        Err(e) => Some(Err(e.to_string())),
    }
}

impl Flow {
    /// Wraps a connected pair of a plugin of net `version`.
    pub fn new((send, recv): (SendComm, RecvComm), version: u32) -> Self {
        Self {
            send,
            recv,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            done: HashMap::new(),
            next: 0,
            limit: request_limit(version),
            null_sends: 0,
            null_recvs: 0,
        }
    }

    /// Requests NCCL may have in flight on one comm of this version.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Sends and receives posted and not yet seen complete.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.sends.len(), self.recvs.len())
    }

    fn token(&mut self) -> usize {
        self.next += 1;
        self.next
    }

    /// One `isend` attempt: `Ok(None)` when the plugin returned a NULL request, or when
    /// the send comm already has the version's limit in flight (not called then).
    pub fn try_isend(
        &mut self,
        data: &[u8],
        tag: i32,
        mr: Option<&Mr>,
    ) -> Result<Option<usize>, Stop> {
        if self.sends.len() >= self.limit {
            return Ok(None);
        }
        // SAFETY: `data` points into a buffer that lives for the process (`buffer`),
        // left untouched until the request completes.
        let r = timed("isend", || unsafe {
            self.send.isend(data.as_ptr(), data.len(), tag, mr)
        })??;
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

    /// One `irecv` attempt, like [`try_isend`](Self::try_isend).
    pub fn try_irecv(
        &mut self,
        bufs: &[RecvBuffer<'_>],
        optional: bool,
    ) -> Result<Option<usize>, Stop> {
        if self.recvs.len() >= self.limit {
            return Ok(None);
        }
        // SAFETY: every buffer lives for the process (`buffer`) and is only read by
        // the check after its request completes.
        let r = timed("irecv", || unsafe { self.recv.irecv(bufs, optional) })??;
        Ok(match r {
            Some(req) => {
                let t = self.token();
                self.recvs.push_back((t, req));
                Some(t)
            }
            None => {
                self.null_recvs += 1;
                None
            }
        })
    }

    /// Posts one send, retrying a NULL request (and progressing) until `limit`.
    pub fn isend(
        &mut self,
        data: &[u8],
        tag: i32,
        mr: Option<&Mr>,
        limit: Duration,
    ) -> Result<usize, Stop> {
        let sends = [SendPost { data, tag, mr }];
        Ok(self.post(&[], &sends, limit)?[0])
    }

    /// Posts one (grouped) receive, like [`isend`](Self::isend).
    pub fn irecv(
        &mut self,
        bufs: &[RecvBuffer<'_>],
        optional: bool,
        limit: Duration,
    ) -> Result<usize, Stop> {
        let recvs = [RecvPost {
            bufs: bufs.to_vec(),
            optional,
        }];
        Ok(self.post(&recvs, &[], limit)?[0])
    }

    /// Posts every receive and send, in order on each side, as NCCL's two proxies do:
    /// receives go first (NCCL posts them as soon as the connection exists); a send is
    /// tried whenever no receive can be posted right now (all posted, the limit
    /// reached, or a NULL request). A NULL request is retried in a later round while
    /// the other side moves on and the oldest requests are tested: no step waits for
    /// a receive to be accepted before posting the matching send. Returns the
    /// receives' tokens, then the sends'.
    pub fn post(
        &mut self,
        recvs: &[RecvPost<'_>],
        sends: &[SendPost<'_>],
        limit: Duration,
    ) -> Result<Vec<usize>, Stop> {
        let (mut rt, mut st) = (Vec::new(), Vec::new());
        // The limit runs from the last post that went through.
        let mut deadline = Instant::now() + limit;
        while rt.len() < recvs.len() || st.len() < sends.len() {
            if let Some(r) = recvs.get(rt.len())
                && let Some(t) = self.try_irecv(&r.bufs, r.optional)?
            {
                rt.push(t);
                deadline = Instant::now() + limit;
                continue;
            }
            if let Some(s) = sends.get(st.len())
                && let Some(t) = self.try_isend(s.data, s.tag, s.mr)?
            {
                st.push(t);
                deadline = Instant::now() + limit;
                continue;
            }
            if Instant::now() > deadline {
                let (s, r) = self.in_flight();
                // A send is only tried once no receive can be posted: name the receive.
                let call = if rt.len() < recvs.len() {
                    "irecv"
                } else {
                    "isend"
                };
                return fail!(
                    "{call} returned a NULL request (\"not now\") for {} s with {s} sends and {r} \
                     receives in flight, the oldest tested all along (posted {} of {} receives, \
                     {} of {} sends)",
                    limit.as_secs(),
                    rt.len(),
                    recvs.len(),
                    st.len(),
                    sends.len()
                );
            }
            self.progress()?;
            std::thread::yield_now();
        }
        rt.extend(st);
        Ok(rt)
    }

    /// Tests the oldest send and the oldest receive, moving on to the next oldest as
    /// each completes (NCCL's proxy never tests a younger request first).
    pub fn progress(&mut self) -> Result<(), Stop> {
        loop {
            let mut moved = false;
            if let Some((t, req)) = self.sends.front_mut() {
                let t = *t;
                if let Some(d) = ended(timed("test (send)", || self.send.test(req))?) {
                    self.sends.pop_front();
                    self.done.insert(t, d);
                    moved = true;
                }
            }
            if let Some((t, req)) = self.recvs.front_mut() {
                let t = *t;
                if let Some(d) = ended(timed("test (receive)", || self.recv.test(req))?) {
                    self.recvs.pop_front();
                    self.done.insert(t, d);
                    moved = true;
                }
            }
            if !moved {
                return Ok(());
            }
        }
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
                     receives still in flight, the oldest tested all along)",
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

/// One send of `data` into a receive of `recv_len` bytes with tag `tag`, both from
/// registered buffers; returns the received bytes and the sizes both sides reported.
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
    let recvs = [RecvPost {
        bufs: vec![RecvBuffer {
            data: rbuf.as_mut_ptr(),
            size: recv_len,
            tag,
            mr: Some(&rmr),
        }],
        optional,
    }];
    let sends = [SendPost {
        data: sbuf,
        tag,
        mr: Some(&smr),
    }];
    let tokens = flow.post(&recvs, &sends, OP_LIMIT)?;
    let done = flow.wait_ok(&tokens, OP_LIMIT)?;
    let got = done[0].first().copied().unwrap_or(0);
    let sent = done[1].first().copied().unwrap_or(0);
    flow.send.dereg_mr(smr)?;
    flow.recv.dereg_mr(rmr)?;
    Ok((rbuf.to_vec(), sent, got))
}
