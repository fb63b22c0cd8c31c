//! Connection setup over the shared endpoint (no extra sockets):
//!
//! 1. `listen` takes a control id L, posts a receive for connect requests to L
//!    and publishes {endpoint address, L, nonce} in the handle;
//! 2. `connect` inserts the listener's address, takes a control id S, posts a
//!    receive for the reply to S and sends {nonce, S, its address, process id}
//!    to L; its state waits in the handle (`NetHandle::set_pending`);
//! 3. `accept` reads the request, checks the nonce, takes a receive comm id R
//!    and replies {nonce, R, process id} to S;
//! 4. `connect` sees the reply: data to this peer is tagged with R.
//!
//! Every call only posts and polls, so none of them blocks.

use std::sync::Arc;

use cclkit_abi::net::NetHandle;
use cclkit_abi::{Error, Result, nccl_warn};

use crate::device::Device;
use crate::engine::{OpId, Poll};
use crate::proto::{ACCEPT_LEN, AcceptMsg, BUNDLE_UNIT, CONNECT_LEN, ConnectMsg, ListenHandle};
use crate::tags::{Ctrl, Seqs};

/// A listening comm: the posted receive for connect requests.
pub struct Listen {
    dev: Arc<Device>,
    id: u16,
    nonce: u64,
    op: OpId,
}

/// The sending side of a connection.
pub struct SendComm {
    /// The device.
    pub dev: Arc<Device>,
    /// Connection key in the engine.
    pub conn: u64,
    /// The receiver's comm id (data tag space).
    pub comm_id: u16,
    /// Per-tag sequence numbers.
    pub seqs: Seqs,
    /// The receiver offers write targets (`engine/write.rs`): only then does a
    /// send look for an offer.
    pub writes: bool,
    /// The send (NCCL tag, sequence number) waiting for its offer, since when.
    pub held: Option<(i32, u32, std::time::Instant)>,
    /// Sends still to post without waiting for offers (waits were slow).
    pub no_wait: u32,
    /// Average wait for offers, ns (`data::isend`).
    pub wait_avg_ns: u64,
    /// The send (NCCL tag, sequence number) held for a full open bundle, since
    /// when (`data::isend`).
    pub held_for_bundle: Option<(i32, u32, std::time::Instant)>,
}

/// The receiving side of a connection.
pub struct RecvComm {
    /// The device.
    pub dev: Arc<Device>,
    /// Connection key in the engine.
    pub conn: u64,
    /// This comm's id (data tag space).
    pub comm_id: u16,
    /// Per-tag sequence numbers.
    pub seqs: Seqs,
}

impl Drop for SendComm {
    fn drop(&mut self) {
        self.dev.lock().close_conn(self.conn);
    }
}

impl Drop for RecvComm {
    fn drop(&mut self) {
        self.dev.lock().close_conn(self.conn);
    }
}

impl Drop for Listen {
    fn drop(&mut self) {
        let mut e = self.dev.lock();
        e.finish(self.op);
        e.free_ctrl_id(self.id);
    }
}

/// Starts listening on `dev` and fills `handle`.
pub fn listen(dev: &Arc<Device>, handle: &mut NetHandle) -> Result<Listen> {
    let nonce = cclkit_abi::sock::random_u64().map_err(|e| Error::io("getrandom", e))?;
    let mut e = dev.lock();
    let id = e.alloc_ctrl_id()?;
    let op = match e.recv_ctrl(Ctrl::Connect, id, CONNECT_LEN) {
        Ok(op) => op,
        Err(err) => {
            e.free_ctrl_id(id);
            return Err(err);
        }
    };
    drop(e);
    let l = Listen {
        dev: Arc::clone(dev),
        id,
        nonce,
        op,
    };
    ListenHandle {
        provider: dev.fingerprint,
        listen_id: id,
        nonce,
        addr: dev.addr.clone(),
    }
    .write(handle)?;
    Ok(l)
}

/// Polls for the next connect request; `Ok(None)` until one arrives.
pub fn accept(l: &mut Listen) -> Result<Option<RecvComm>> {
    let mut e = l.dev.lock();
    e.progress();
    let n = match e.poll(l.op) {
        Poll::Pending => return Ok(None),
        Poll::Done(n) => n,
        Poll::Failed(m) => {
            // A malformed or oversized request must not kill the listener.
            nccl_warn!(
                "NET/OFI: dropped a bad connect request on {}: {m}",
                l.dev.name
            );
            e.finish(l.op);
            l.op = e.recv_ctrl(Ctrl::Connect, l.id, CONNECT_LEN)?;
            return Ok(None);
        }
    };
    let buf = e.take_buf(l.op).unwrap_or_default();
    e.finish(l.op);
    l.op = e.recv_ctrl(Ctrl::Connect, l.id, CONNECT_LEN)?;
    let msg = match ConnectMsg::decode(&buf[..n.min(buf.len())]) {
        Some(m) if m.nonce == l.nonce => m,
        _ => {
            nccl_warn!(
                "NET/OFI: ignored a connect request on {} that does not match this listen handle",
                l.dev.name
            );
            return Ok(None);
        }
    };
    let peer = e.peer(&msg.addr)?;
    let comm_id = e.alloc_data_id()?;
    let conn = e.add_conn(peer, msg.proc_id, Some(comm_id));
    let mut bundle_bytes = l.dev.bundle_bytes / BUNDLE_UNIT * BUNDLE_UNIT;
    if bundle_bytes > 0 {
        match e.enable_bundle_rx(conn, comm_id, bundle_bytes) {
            Ok(true) => {}
            Ok(false) => bundle_bytes = 0,
            Err(err) => {
                e.close_conn(conn);
                return Err(err.context("NET/OFI accept: posting bundle receives"));
            }
        }
    }
    // Writes when the sender offers them and this device takes them.
    let writes = match l.dev.writes {
        Some((_, max)) if msg.write_min > 0 && msg.write_min as usize <= max => {
            let sizes = (msg.write_min as usize, max);
            if let Err(err) = e.enable_write_rx(conn, comm_id, msg.reply_id, sizes) {
                e.close_conn(conn);
                return Err(err.context("NET/OFI accept: taking writes"));
            }
            true
        }
        _ => false,
    };
    let reply = AcceptMsg {
        nonce: l.nonce,
        comm_id,
        proc_id: e.me(),
        bundle_bytes,
        writes,
    };
    if let Err(err) = e.send_ctrl_detached(peer, Ctrl::Accept, msg.reply_id, reply.encode()) {
        e.close_conn(conn);
        return Err(err.context("NET/OFI accept: reply to the connecting peer"));
    }
    // Bundle slots (`engine/slots.rs`) for a sender that bundles and writes; the
    // connection works without them.
    if msg.slots && writes && bundle_bytes > 0 && l.dev.slots {
        if let Err(err) = e.enable_slots_rx(conn) {
            nccl_warn!("NET/OFI accept: no bundle slots for this connection: {err}");
        }
    }
    drop(e);
    Ok(Some(RecvComm {
        dev: Arc::clone(&l.dev),
        conn,
        comm_id,
        seqs: Seqs::default(),
    }))
}

/// A connect waiting for its reply; lives in the handle between calls.
struct PendingConnect {
    dev: Arc<Device>,
    reply_id: u16,
    /// The request offered writes (then a reply taking them keeps `reply_id`
    /// for the connection's clear-to-write messages).
    write_offered: bool,
    /// `reply_id` now belongs to the connection.
    id_kept: bool,
    reply: OpId,
    request: OpId,
    peer: u64,
    nonce: u64,
}

impl Drop for PendingConnect {
    fn drop(&mut self) {
        let mut e = self.dev.lock();
        e.finish(self.reply);
        e.finish(self.request);
        if !self.id_kept {
            e.free_ctrl_id(self.reply_id);
        }
    }
}

/// Connects to the listener in `handle`; `Ok(None)` until it has accepted.
pub fn connect(dev: &Arc<Device>, handle: &mut NetHandle) -> Result<Option<SendComm>> {
    let pending = match handle.take_pending::<PendingConnect>() {
        Some(p) if Arc::ptr_eq(&p.dev, dev) => p,
        Some(_) => {
            return Err(Error::invalid_usage(
                "NET/OFI connect: called again with this handle on another device",
            ));
        }
        None => start(dev, handle)?,
    };
    let mut e = dev.lock();
    e.progress();
    if let Poll::Failed(m) = e.poll(pending.request) {
        return Err(Error::remote(format!(
            "NET/OFI connect: sending the connect request on {} failed: {m}",
            dev.name
        )));
    }
    let n = match e.poll(pending.reply) {
        Poll::Pending => {
            drop(e);
            handle.set_pending(pending);
            return Ok(None);
        }
        Poll::Failed(m) => {
            return Err(Error::remote(format!(
                "NET/OFI connect: waiting for the reply failed: {m}"
            )));
        }
        Poll::Done(n) => n,
    };
    let buf = e.take_buf(pending.reply).unwrap_or_default();
    let reply = AcceptMsg::decode(&buf[..n.min(buf.len())])
        .filter(|r| r.nonce == pending.nonce)
        .ok_or_else(|| Error::remote("NET/OFI connect: malformed reply from the listener"))?;
    let conn = e.add_conn(pending.peer, reply.proc_id, None);
    e.enable_bundle_tx(
        conn,
        reply.comm_id,
        dev.bundle_bytes.min(reply.bundle_bytes),
    );
    let mut pending = pending;
    let writes = dev.writes.filter(|_| reply.writes && pending.write_offered);
    if let Some(range) = writes {
        // The connection owns the id from here (freed when it retires).
        pending.id_kept = true;
        if let Err(err) = e.enable_write_tx(conn, pending.reply_id, reply.comm_id, range) {
            e.close_conn(conn);
            return Err(err.context("NET/OFI connect: posting clear-to-write receives"));
        }
        // Slot bundles take sends of up to half a slot: those in the write
        // range too, when their receive's offer has not come (else they are
        // written straight into it).
        if dev.slots {
            e.enable_slot_tx(conn);
        }
    }
    drop(e);
    // `pending` drops here, returning its control id unless the connection
    // kept it; the connection stands alone.
    drop(pending);
    Ok(Some(SendComm {
        dev: Arc::clone(dev),
        conn,
        comm_id: reply.comm_id,
        seqs: Seqs::default(),
        writes: writes.is_some(),
        held: None,
        no_wait: 0,
        wait_avg_ns: 0,
        held_for_bundle: None,
    }))
}

/// First `connect` call: posts the reply receive and sends the request.
fn start(dev: &Arc<Device>, handle: &NetHandle) -> Result<Box<PendingConnect>> {
    let h = ListenHandle::read(handle)?;
    if h.provider != dev.fingerprint {
        return Err(Error::invalid_usage(format!(
            "NET/OFI connect: the peer listens with another libfabric provider than this \
             process (device {}); set the same CCLKIT_OFI_PROVIDER/FI_PROVIDER on every rank",
            dev.name
        )));
    }
    let mut e = dev.lock();
    let peer = e
        .peer(&h.addr)
        .map_err(|err| err.context("NET/OFI connect: inserting the listener's address"))?;
    let reply_id = e.alloc_ctrl_id()?;
    let reply = match e.recv_ctrl(Ctrl::Accept, reply_id, ACCEPT_LEN) {
        Ok(op) => op,
        Err(err) => {
            e.free_ctrl_id(reply_id);
            return Err(err);
        }
    };
    let write_min = dev
        .writes
        .filter(|_| e.write_offers_fit())
        .map_or(0, |(lo, _)| lo as u32);
    let msg = ConnectMsg {
        nonce: h.nonce,
        reply_id,
        proc_id: e.me(),
        addr: dev.addr.clone(),
        write_min,
        // A sender that bundles fills the receiver's bundle slots too.
        slots: write_min > 0 && dev.slots,
    };
    let request = msg
        .encode()
        .and_then(|bytes| e.send_ctrl(peer, Ctrl::Connect, h.listen_id, bytes));
    let request = match request {
        Ok(op) => op,
        Err(err) => {
            e.finish(reply);
            e.free_ctrl_id(reply_id);
            return Err(err);
        }
    };
    drop(e);
    Ok(Box::new(PendingConnect {
        dev: Arc::clone(dev),
        reply_id,
        write_offered: write_min > 0,
        id_kept: false,
        reply,
        request,
        peer,
        nonce: h.nonce,
    }))
}
