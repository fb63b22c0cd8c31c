//! Connections as the engine tracks them: comm ids, peers, closing, and the
//! liveness check of a waiting comm.

use std::time::Instant;

use cclkit_abi::{Error, Result};

use super::{Engine, OpId, Owner, State};
use crate::liveness::ProcId;
use crate::tags::Ctrl;

/// Liveness intervals a ping may stay incomplete before the peer counts as gone.
const PING_PATIENCE: u32 = 10;
/// Pending tests per clock reading in [`Engine::check_peer`].
const CLOCK_EVERY: u32 = 16;

/// One side of a connection, as the engine tracks it.
#[derive(Debug)]
pub struct Conn {
    /// Peer's address in the AV.
    pub peer: u64,
    /// Peer's process identity.
    pub peer_proc: ProcId,
    /// Data comm id to return to the pool when retired (receive side).
    pub(super) data_id: Option<u16>,
    /// First fatal error seen on this connection.
    pub failed: Option<String>,
    /// Receives still posted (the comm id stays reserved until they are gone).
    pub(super) recvs: usize,
    /// Requests in flight (capped per comm).
    pub requests: usize,
    pub(super) closing: bool,
    pub(super) ping: Option<OpId>,
    pub(super) ping_sent: Instant,
    pub(super) last_progress: Instant,
    /// Something completed since `last_progress` was last set (set per
    /// completion instead of reading the clock: see [`Engine::check_peer`]).
    pub(super) progressed: bool,
    /// Pending tests since the clock was last read.
    pub(super) polls: u32,
    pub(super) next_check: Instant,
    /// Sending side's bundles (`bundle.rs`), when the receiver takes them.
    pub(super) tx: Option<super::bundle::Tx>,
    /// Receiving side's bundles, when this receive comm takes them.
    pub(super) rx: Option<super::bundle::Rx>,
    /// Sending side's writes (`write.rs`), when the receiver offers targets.
    pub(super) wtx: Option<super::write::WriteTx>,
    /// Receiving side's write targets, when the sender writes.
    pub(super) wrx: Option<super::write::WriteRx>,
}

/// A pool of 16-bit ids handed out round-robin, so a freed id is reused last.
#[derive(Default)]
pub(super) struct Ids {
    used: std::collections::HashSet<u16>,
    next: u16,
}

impl Ids {
    pub(super) fn alloc(&mut self, what: &str) -> Result<u16> {
        for _ in 0..=u16::MAX as u32 {
            let id = self.next;
            self.next = self.next.wrapping_add(1);
            if self.used.insert(id) {
                return Ok(id);
            }
        }
        Err(Error::internal(format!(
            "NET/OFI: all 65536 {what} ids of this endpoint are in use"
        )))
    }

    pub(super) fn free(&mut self, id: u16) {
        self.used.remove(&id);
    }
}

impl Engine {
    /// The AV address of a peer endpoint, inserting it on first use.
    pub fn peer(&mut self, addr: &[u8]) -> Result<u64> {
        if let Some(a) = self.peers.get(addr) {
            return Ok(*a);
        }
        let a = self.av.insert(addr)?;
        self.peers.insert(addr.to_vec(), a);
        Ok(a)
    }

    /// A control id (listen and connect replies).
    pub fn alloc_ctrl_id(&mut self) -> Result<u16> {
        self.ctrl_ids.alloc("control")
    }

    /// Returns a control id.
    pub fn free_ctrl_id(&mut self, id: u16) {
        self.ctrl_ids.free(id);
    }

    /// A receive comm id (data tag space).
    pub fn alloc_data_id(&mut self) -> Result<u16> {
        self.data_ids.alloc("receive comm")
    }

    /// Registers a connection; `data_id` is returned to the pool when it retires.
    pub fn add_conn(&mut self, peer: u64, peer_proc: ProcId, data_id: Option<u16>) -> u64 {
        let key = self.next_conn;
        self.next_conn += 1;
        let now = Instant::now();
        self.conns.insert(
            key,
            Conn {
                peer,
                peer_proc,
                data_id,
                failed: None,
                recvs: 0,
                requests: 0,
                closing: false,
                ping: None,
                ping_sent: now,
                last_progress: now,
                progressed: false,
                polls: 0,
                next_check: now,
                tx: None,
                rx: None,
                wtx: None,
                wrx: None,
            },
        );
        key
    }

    /// A connection, closed or not (requests may outlive their comm).
    pub fn conn_any(&mut self, key: u64) -> Option<&mut Conn> {
        self.conns.get_mut(&key)
    }

    /// A live connection.
    pub fn conn(&mut self, key: u64) -> Result<&mut Conn> {
        self.conns
            .get_mut(&key)
            .filter(|c| !c.closing)
            .ok_or_else(|| Error::invalid_usage("NET/OFI: comm already closed"))
    }

    /// Closes a connection: pending receives are cancelled and its comm id is
    /// reused only once they are gone.
    pub fn close_conn(&mut self, key: u64) {
        self.drop_bundle(key);
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        c.closing = true;
        let posted: Vec<OpId> = self
            .slots
            .iter()
            .filter(|s| {
                s.recv
                    && s.conn == Some(key)
                    && matches!(s.state, State::Posted | State::Backlogged)
            })
            .map(|s| OpId {
                idx: s.idx,
                generation: s.generation,
            })
            .collect();
        for op in posted {
            self.finish(op);
        }
        if self.conns.get(&key).is_some_and(|c| c.recvs == 0) {
            self.retire(key);
        }
    }

    pub(super) fn retire(&mut self, key: u64) {
        if let Some(c) = self.conns.remove(&key) {
            self.write_retired(&c);
            if let Some(id) = c.data_id {
                self.data_ids.free(id);
            }
            self.bundle_rx_retired(c.rx);
        }
    }

    /// Liveness check of a connection whose request is still waiting: fails the
    /// connection when the peer process is known dead, else pings it (a failed
    /// ping fails the connection on completion). Cheap when not yet due.
    pub fn check_peer(&mut self, key: u64) -> Result<()> {
        let me = self.me;
        let liveness = self.liveness;
        let proc_check = self.liveness_proc;
        let c = self.conn(key)?;
        if let Some(f) = &c.failed {
            return Err(Error::remote(format!("NET/OFI: {f}")));
        }
        let Some(interval) = liveness else {
            return Ok(());
        };
        // NCCL tests a pending request in a tight loop: the clock is read on
        // every 16th test only (the interval is a second; the reads were 1 % of
        // a stream's CPU on native `tcp`).
        c.polls = c.polls.wrapping_add(1);
        if c.polls % CLOCK_EVERY != 0 {
            return Ok(());
        }
        let now = Instant::now();
        if std::mem::take(&mut c.progressed) {
            c.last_progress = now;
        }
        if now < c.next_check || now.duration_since(c.last_progress) < interval {
            return Ok(());
        }
        c.next_check = now + interval;
        if proc_check && me.is_local(&c.peer_proc) {
            if let Some(reason) = c.peer_proc.exit_reason() {
                c.failed = Some(reason.clone());
                return Err(Error::remote(format!("NET/OFI: {reason}")));
            }
        }
        if c.ping.is_some() && now.duration_since(c.ping_sent) >= interval * PING_PATIENCE {
            // A ping completes locally once the provider has handed it to the
            // network (tcp: the socket; EFA: the device's acknowledgement), which
            // needs no work from the peer's application. `tcp;ofi_rxm` retries a
            // refused reconnect forever instead of failing the ping, so silence
            // this long means the connection is gone.
            let reason = format!(
                "peer unreachable: liveness ping not completed after {:?}",
                now.duration_since(c.ping_sent)
            );
            c.failed = Some(reason.clone());
            return Err(Error::remote(format!("NET/OFI: {reason}")));
        }
        if c.ping.is_none() {
            c.ping_sent = now;
            let dest = c.peer;
            let tag = self.layout.ctrl(Ctrl::Ping, 0);
            let op = self.send_owned(dest, tag, Box::new([]), Owner::Ping, Some(key))?;
            if let Some(c) = self.conns.get_mut(&key) {
                c.ping = Some(op);
            }
        }
        Ok(())
    }
}
