//! Control messages (connect requests and replies, liveness pings): small
//! buffers owned by their operation slot, registered when the provider needs it.

use cclkit_abi::Result;

use super::{Engine, OpId, Owner, Post};
use crate::tags::{Ctrl, TagLayout};

const PING_SINK_LEN: usize = 8;

impl Engine {
    /// Sends a control message (the engine owns `bytes`) whose completion the
    /// caller polls.
    pub fn send_ctrl(&mut self, dest: u64, kind: Ctrl, id: u16, bytes: Vec<u8>) -> Result<OpId> {
        self.send_owned(
            dest,
            self.layout.ctrl(kind, id),
            bytes.into_boxed_slice(),
            Owner::Caller,
            None,
        )
    }

    /// Sends a control message nobody waits for (released on completion).
    pub fn send_ctrl_detached(
        &mut self,
        dest: u64,
        kind: Ctrl,
        id: u16,
        bytes: Vec<u8>,
    ) -> Result<()> {
        self.send_owned(
            dest,
            self.layout.ctrl(kind, id),
            bytes.into_boxed_slice(),
            Owner::Orphan,
            None,
        )
        .map(drop)
    }

    pub(super) fn send_owned(
        &mut self,
        dest: u64,
        tag: u64,
        bytes: Box<[u8]>,
        owner: Owner,
        conn: Option<u64>,
    ) -> Result<OpId> {
        let (buf, len) = (bytes.as_ptr() as usize, bytes.len());
        let op = self.alloc(owner, false, conn, Some(bytes));
        let desc = self.ctrl_desc(op, buf, len)?;
        self.submit(
            op,
            Post::Send {
                buf,
                len,
                desc,
                dest,
                tag,
            },
        )
    }

    /// Posts a receive for a control message of `kind` to `id` into an owned buffer.
    pub fn recv_ctrl(&mut self, kind: Ctrl, id: u16, len: usize) -> Result<OpId> {
        let tag = self.layout.ctrl(kind, id);
        let bytes = vec![0u8; len].into_boxed_slice();
        self.recv_owned(Owner::Caller, None, bytes, tag, 0)
    }

    /// Posts a receive into `bytes`, which the slot owns until it is released;
    /// the counterpart of [`Engine::send_owned`].
    pub(super) fn recv_owned(
        &mut self,
        owner: Owner,
        conn: Option<u64>,
        bytes: Box<[u8]>,
        tag: u64,
        ignore: u64,
    ) -> Result<OpId> {
        let (buf, len) = (bytes.as_ptr() as usize, bytes.len());
        let op = self.alloc(owner, true, conn, Some(bytes));
        let desc = self.ctrl_desc(op, buf, len)?;
        self.submit(
            op,
            Post::Recv {
                buf,
                len,
                desc,
                tag,
                ignore,
            },
        )
    }

    /// Takes the connection and buffer of completed owned receive `idx` and frees
    /// its slot; `None` when it had either no connection or no buffer.
    pub(super) fn take_owned(&mut self, idx: u32) -> Option<(u64, Box<[u8]>)> {
        let s = &mut self.slots[idx as usize];
        let (conn, buf) = (s.conn, s.buf.take());
        self.release(idx);
        conn.zip(buf)
    }

    /// Descriptor for a control buffer owned by slot `op` (FI_MR_LOCAL providers
    /// need one); the registration is released with the slot.
    pub(super) fn ctrl_desc(&mut self, op: OpId, buf: usize, len: usize) -> Result<usize> {
        if len == 0 || !self.mrs.host_needs_mr() {
            return Ok(0);
        }
        // SAFETY: the buffer is owned by the slot, which releases this
        // registration before dropping the buffer.
        let r = unsafe {
            self.mrs.acquire(
                &self.domain,
                &self.ep,
                buf,
                len,
                crate::fabric::MemIface::System,
            )
        };
        match r {
            Ok(r) => {
                self.slots[op.idx as usize].mr = r.id;
                Ok(r.desc)
            }
            Err(e) => {
                self.release(op.idx);
                Err(e)
            }
        }
    }

    pub(super) fn post_ping_sink(&mut self) -> Result<()> {
        let bytes = vec![0u8; PING_SINK_LEN].into_boxed_slice();
        let tag = self.layout.ctrl(Ctrl::Ping, 0);
        self.recv_owned(Owner::PingSink, None, bytes, tag, TagLayout::any_id())
            .map(drop)
    }
}
