//! The data path: `isend`/`irecv` post tagged operations on the device endpoint;
//! `test` drives progress and, while a request waits, the peer liveness check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cclkit_abi::net::{Buf, RecvBuf, Sizes};
use cclkit_abi::{Error, Result};

use crate::comm::{RecvComm, SendComm};
use crate::config::MAX_RECVS_LIMIT;
use crate::device::Device;
use crate::engine::{Engine, OpId, Poll, count_bundle_hold, count_offer_wait};
use crate::fabric::MemIface;
use crate::mr::MrRef;

/// Requests one comm may have in flight: NCCL's 32 × the largest grouped receive.
pub const MAX_REQUESTS: usize = 32 * MAX_RECVS_LIMIT;

/// A memory registration handed to NCCL (`mhandle`).
pub struct OfiMr {
    pub(crate) dev: Arc<Device>,
    pub(crate) r: MrRef,
}

impl Drop for OfiMr {
    fn drop(&mut self) {
        self.dev.lock().mrs.release(self.r.id);
    }
}

/// An in-flight send or (grouped) receive.
pub struct Request {
    dev: Arc<Device>,
    conn: u64,
    n: usize,
    ops: [OpId; MAX_RECVS_LIMIT],
    /// Registrations made for buffers NCCL passed without a usable mhandle.
    temp_mrs: [u64; MAX_RECVS_LIMIT],
    /// Posted size of a send (a send completion carries no length).
    send_len: Option<usize>,
    done: bool,
    /// The request's profiler event (net v10+ hosts with a profiler).
    pub(crate) prof: crate::prof::ReqEvent,
}

impl Drop for Request {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let dev = Arc::clone(&self.dev);
        let mut e = dev.lock();
        self.release(&mut e);
    }
}

impl Request {
    /// Whether a post of the request still waits in the engine's backlog.
    pub(crate) fn backlogged(&self, e: &Engine) -> bool {
        self.ops[..self.n].iter().any(|o| e.backlogged(*o))
    }

    /// [`backlogged`](Self::backlogged), taking the device lock.
    pub(crate) fn waits_in_backlog(&self) -> bool {
        let e = self.dev.lock();
        self.backlogged(&e)
    }

    /// The connection the request travels on.
    pub(crate) fn conn(&self) -> u64 {
        self.conn
    }

    fn release(&mut self, e: &mut Engine) {
        release(e, self.conn, &self.ops[..self.n], &self.temp_mrs[..self.n]);
        self.done = true;
    }
}

/// Frees a request's operations and temporary registrations and its slot in the
/// comm's request count.
fn release(e: &mut Engine, conn: u64, ops: &[OpId], temp_mrs: &[u64]) {
    for (op, mr) in ops.iter().zip(temp_mrs) {
        e.finish(*op);
        e.mrs.release(*mr);
    }
    if let Some(c) = e.conn_any(conn) {
        c.requests = c.requests.saturating_sub(1);
    }
}

/// The descriptor for one buffer: NCCL's registration when it belongs to this
/// device, else (providers with `FI_MR_LOCAL`) a temporary one from the cache.
fn desc_for(e: &mut Engine, dev: &Device, mr: Option<&OfiMr>, buf: &Buf) -> Result<(usize, u64)> {
    if buf.is_empty() {
        return Ok((0, 0));
    }
    match mr {
        Some(m) if std::ptr::eq(&*m.dev, dev) => Ok((m.r.desc, 0)),
        _ if e.mrs.host_needs_mr() => {
            let eng = &mut *e;
            // SAFETY: NCCL keeps the buffer allocated until the request completes;
            // the request releases this registration then (or when dropped).
            let r = unsafe {
                eng.mrs.acquire(
                    &eng.domain,
                    &eng.ep,
                    buf.as_ptr() as usize,
                    buf.len(),
                    MemIface::System,
                )?
            };
            Ok((r.desc, r.id))
        }
        _ => Ok((0, 0)),
    }
}

/// Fails fast on a broken connection; `false` when the comm is at its request cap.
fn admit(e: &mut Engine, conn: u64) -> Result<bool> {
    let c = e.conn(conn)?;
    if let Some(f) = &c.failed {
        return Err(Error::remote(format!(
            "NET/OFI: connection failed earlier: {f}"
        )));
    }
    Ok(c.requests < MAX_REQUESTS)
}

/// How long a send of `len` bytes waits for an offer that is on its way (see
/// [`await_offer`]) before it goes without: `CCLKIT_OFI_OFFER_WAIT_US` when set,
/// else 16 us plus the send's time at 2 GB/s. A stream's sender, paced by its
/// receiver's offers, waited 5-9 us on average at 24-64 KiB (loopback,
/// libfabric 1.17 and 2.6); one whose wait runs out goes as a tagged send or
/// into a bundle slot.
fn offer_wait(dev: &Device, len: usize) -> Duration {
    match dev.offer_wait_us {
        Some(us) => Duration::from_micros(us),
        None => Duration::from_nanos(16_000 + len as u64 / 2),
    }
}

/// Sends a connection posts without waiting for offers once its waits have
/// been slow (see [`slow_wait`]).
const OFFER_BACKOFF: u32 = 64;

/// Average wait for offers past which a connection stops waiting for
/// [`OFFER_BACKOFF`] sends: half the longest wait ([`offer_wait`]; by default 8
/// us plus the send's time at 4 GB/s, 24 KiB: 14 us). A stream's sender, paced
/// by its receiver's offers, waited 5-9 us on average at 24-64 KiB; a receiver
/// that is not running when its offer is due (ranks sharing cores) keeps it
/// waiting 25-45 us at 24 KiB (2-3 ranks on 2 CPUs), where without waiting the
/// send completes alone (a bundle slot) and the wait only delays the operation
/// (3 ranks, 24 KiB `sendrecv`: 53 us an operation without waiting, 97 with).
fn slow_wait(dev: &Device, len: usize) -> Duration {
    offer_wait(dev, len) / 2
}

/// Whether `isend` should give NCCL no request yet, to be called again when the
/// send's offer has come: a send in the write range whose offer is missing,
/// whose receiver offered one of the sends just before it
/// ([`Engine::offer_expected`]): a stream's sender runs ahead of its receiver,
/// which offers each receive as it posts it. For at most [`offer_wait`], and
/// not for [`OFFER_BACKOFF`] sends once waits have been slow on average
/// ([`slow_wait`]). Written, the send lands in NCCL's buffer in one message,
/// where the tagged send `ofi_rxm` makes of it is segmented through bounce
/// buffers or a rendezvous (streams of 32-128 KiB on libfabric 2.6: 1.2-2.4x
/// raw libfabric instead of 0.7-0.9x; docs/PERFORMANCE.md).
fn await_offer(e: &mut Engine, comm: &mut SendComm, tag: i32, len: usize) -> Result<bool> {
    let seq = comm.seqs.peek(tag);
    if !comm.writes || !e.offer_missing(comm.conn, tag, seq, len) {
        return Ok(false);
    }
    // Its offer may be in the completion queue already.
    e.progress();
    let most = offer_wait(&comm.dev, len);
    if most.is_zero() || comm.no_wait > 0 || !e.offer_expected(comm.conn, tag, seq, len) {
        return Ok(false);
    }
    let now = Instant::now();
    let (since, _) = hold(&mut comm.held, (tag, seq), now);
    Ok(now.duration_since(since) < most)
}

/// When the send `(tag, seq)` began to be held in `slot` (now, if it was not
/// the send held there), and whether that is now.
fn hold(
    slot: &mut Option<(i32, u32, Instant)>,
    (tag, seq): (i32, u32),
    now: Instant,
) -> (Instant, bool) {
    match *slot {
        Some((t, s, since)) if (t, s) == (tag, seq) => (since, false),
        _ => (slot.insert((tag, seq, now)).2, true),
    }
}

/// Longest `isend` holds a send for the full open bundle it would join: the
/// open bundle's own longest wait (`bundle/tx.rs`), after which the bundle
/// has gone.
const BUNDLE_HOLD: Duration = Duration::from_micros(200);

/// Whether `isend` should give NCCL no request yet because the send would
/// join the open bundle, which is full and cannot go yet
/// ([`Engine::bundle_full`]); not a send that will be written. Held, the send
/// opens the next bundle once this one has gone, where going alone it would
/// be a tagged message that `ofi_rxm` segments. At most [`BUNDLE_HOLD`].
fn await_bundle(e: &mut Engine, comm: &mut SendComm, tag: i32, len: usize) -> bool {
    let full = e.bundle_full(comm.conn, len) && {
        // The bundle may go on this progress pass.
        e.progress();
        e.bundle_full(comm.conn, len)
    };
    if !full {
        comm.held_for_bundle = None;
        return false;
    }
    let seq = comm.seqs.peek(tag);
    if e.offer_in_hand(comm.conn, tag, seq, len) {
        return false;
    }
    let now = Instant::now();
    let (since, new) = hold(&mut comm.held_for_bundle, (tag, seq), now);
    if new {
        count_bundle_hold();
    }
    now.duration_since(since) < BUNDLE_HOLD
}

/// `isend`: one tagged send to the comm's peer.
pub fn isend(
    comm: &mut SendComm,
    buf: Buf,
    tag: i32,
    mr: Option<&OfiMr>,
) -> Result<Option<Box<Request>>> {
    let dev = Arc::clone(&comm.dev);
    let mut e = dev.lock();
    if !admit(&mut e, comm.conn)? {
        return Ok(None);
    }
    if await_bundle(&mut e, comm, tag, buf.len()) || await_offer(&mut e, comm, tag, buf.len())? {
        return Ok(None);
    }
    match comm.held.take() {
        Some((t, s, since)) if (t, s) == (tag, comm.seqs.peek(tag)) => {
            count_offer_wait(!e.offer_missing(comm.conn, tag, s, buf.len()));
            // Average wait, the newest weighing 1/8.
            let waited = since.elapsed().as_nanos().min(u128::from(u32::MAX)) as u64;
            comm.wait_avg_ns = (comm.wait_avg_ns * 7 + waited) / 8;
            if u128::from(comm.wait_avg_ns) > slow_wait(&dev, buf.len()).as_nanos() {
                comm.wait_avg_ns = 0;
                comm.no_wait = OFFER_BACKOFF;
            }
        }
        _ => comm.no_wait = comm.no_wait.saturating_sub(1),
    }
    let (desc, temp) = desc_for(&mut e, &dev, mr, &buf)?;
    // Taken only once the send will be posted (or fail for good): a number
    // skipped here would pair every later send with the wrong receive.
    let seq = comm.seqs.next(tag);
    let tag64 = e.layout().data(comm.comm_id, seq, tag);
    // SAFETY: NCCL keeps `buf` valid until the request completes; `desc` covers it.
    let posted = unsafe {
        let written = if comm.writes {
            e.write_data(comm.conn, tag, seq, buf.as_ptr(), buf.len(), desc)
        } else {
            Ok(None)
        };
        match written {
            Ok(Some(op)) => Ok(op),
            Ok(None) => e.send_data(comm.conn, buf.as_ptr(), buf.len(), desc, tag64),
            Err(err) => Err(err),
        }
    };
    let op = match posted {
        Ok(op) => op,
        Err(err) => {
            e.mrs.release(temp);
            return Err(err.context(format!(
                "NET/OFI isend of {} bytes on {}",
                buf.len(),
                dev.name
            )));
        }
    };
    e.conn(comm.conn)?.requests += 1;
    drop(e);
    let mut r = Box::new(Request {
        dev,
        conn: comm.conn,
        n: 1,
        ops: [OpId::default(); MAX_RECVS_LIMIT],
        temp_mrs: [0; MAX_RECVS_LIMIT],
        send_len: Some(buf.len()),
        done: false,
        prof: Default::default(),
    });
    r.ops[0] = op;
    r.temp_mrs[0] = temp;
    Ok(Some(r))
}

/// `irecv`: one tagged receive per buffer, all completing as one request.
pub fn irecv(comm: &mut RecvComm, bufs: &[RecvBuf<'_, OfiMr>]) -> Result<Option<Box<Request>>> {
    let dev = Arc::clone(&comm.dev);
    if bufs.is_empty() || bufs.len() > dev.max_recvs {
        return Err(Error::invalid_argument(format!(
            "NET/OFI irecv: {} buffers, this device takes 1..={} (maxRecvs)",
            bufs.len(),
            dev.max_recvs
        )));
    }
    let mut e = dev.lock();
    if !admit(&mut e, comm.conn)? {
        return Ok(None);
    }
    e.conn(comm.conn)?.requests += 1;
    let mut r = Box::new(Request {
        dev: Arc::clone(&dev),
        conn: comm.conn,
        n: 0,
        ops: [OpId::default(); MAX_RECVS_LIMIT],
        temp_mrs: [0; MAX_RECVS_LIMIT],
        send_len: None,
        done: false,
        prof: Default::default(),
    });
    for (i, b) in bufs.iter().enumerate() {
        let posted = desc_for(&mut e, &dev, b.mr, &b.buf).and_then(|(desc, temp)| {
            r.temp_mrs[i] = temp;
            let seq = comm.seqs.next(b.tag);
            let tag64 = e.layout().data(comm.comm_id, seq, b.tag);
            let (addr, len) = (b.buf.as_ptr() as usize, b.buf.len());
            // SAFETY: NCCL keeps each buffer valid until the request completes.
            let op = unsafe { e.recv_data(comm.conn, addr as *mut u8, len, desc, tag64) }?;
            // A write target only in NCCL's own registration on this device.
            let rma =
                b.mr.filter(|m| std::ptr::eq(&*m.dev, &*dev))
                    .and_then(|m| m.r.rma);
            if let Err(err) = e.offer_write(comm.conn, op, (b.tag, seq), addr, len, rma) {
                e.finish(op);
                return Err(err);
            }
            Ok(op)
        });
        match posted {
            Ok(op) => {
                r.ops[i] = op;
                r.n = i + 1;
            }
            Err(err) => {
                e.mrs.release(r.temp_mrs[i]);
                r.release(&mut e);
                return Err(err.context(format!("NET/OFI irecv on {}", dev.name)));
            }
        }
    }
    drop(e);
    Ok(Some(r))
}

/// `test`: drives progress; reports sizes once every operation is complete.
pub fn test(r: &mut Request, sizes: &mut Sizes<'_>) -> Result<bool> {
    // Hot path (NCCL polls it in a loop): no allocation, no refcount traffic;
    // the guard borrows `r.dev` while other fields of `r` are updated.
    let dev = &r.dev;
    let mut e = dev.lock();
    let mut got = [0usize; MAX_RECVS_LIMIT];
    // NCCL tests one request per call, oldest first, so a completion read from
    // the CQ for a later request is usually waiting here already: only a request
    // still pending pays for a progress pass (a CQ read, which for IP providers
    // is a poll(2) system call).
    let mut pending = collect(r, &e, &mut got)?;
    if pending {
        e.progress();
        pending = collect(r, &e, &mut got)?;
    }
    if r.prof.waits_in_backlog() && !r.backlogged(&e) {
        r.prof.posted();
    }
    if pending {
        e.check_peer(r.conn)?;
        return Ok(false);
    }
    release(&mut e, r.conn, &r.ops[..r.n], &r.temp_mrs[..r.n]);
    r.done = true;
    drop(e);
    r.prof.end(got[..r.n].iter().sum());
    for (i, len) in got.iter().enumerate().take(r.n) {
        sizes.set(i, *len)?;
    }
    Ok(true)
}

/// Reads the state of a request's operations into `got`; `Ok(true)` while any
/// is still pending, an error naming the first failed one.
fn collect(r: &Request, e: &Engine, got: &mut [usize; MAX_RECVS_LIMIT]) -> Result<bool> {
    let mut pending = false;
    for (op, out) in r.ops.iter().zip(got.iter_mut()).take(r.n) {
        match e.poll(*op) {
            Poll::Done(len) => *out = r.send_len.unwrap_or(len),
            Poll::Pending => pending = true,
            Poll::Failed(m) => {
                let what = if r.send_len.is_some() {
                    "send"
                } else {
                    "receive"
                };
                return Err(Error::remote(format!(
                    "NET/OFI {what} on {}: {m}",
                    r.dev.name
                )));
            }
        }
    }
    Ok(pending)
}
