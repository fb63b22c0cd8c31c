//! Collectives: AllReduce (ring or tree), Broadcast, Reduce, AllGather, ReduceScatter,
//! AllToAll, Gather, Scatter and Barrier, in-place and out-of-place, alone or
//! aggregated in a group.
//!
//! Sizes follow NCCL: `count` elements per rank for AllReduce, Broadcast and Reduce;
//! AllGather takes `count` per rank and fills `n × count`; ReduceScatter reduces
//! `n × count` into `count`; AllToAll, Gather and Scatter move `count` per peer.
//! In-place layouts are NCCL's: AllGather's input is its own slot of the output,
//! ReduceScatter's output is its own slot of the input.

use cclkit_abi::raw::common::{DataType, Func, RedOp};

use super::comm::Comm;
use super::error::{Error, Result};
use super::op::UserBufs;
use super::tune::Decision;
use few::Few;
pub use few::{Decisions, DecisionsIter};

/// Bytes the runtime copied while running primitives, by copy site (process-wide):
/// snapshot [`copy_counts`] before and after an operation and subtract
/// ([`CopyCounts::since`]) to see what it copied and what took a direct path.
pub use super::schedule::copies::{CopyCounts, copy_counts};

/// Slices the engine ran one step ahead on a channel while the step before them
/// waited for data (process-wide; see `proxy/engine/ahead.rs`).
pub use super::proxy::ahead_slices;

/// Passes of progress and the connections they drove (process-wide; see
/// `proxy/engine/busy.rs`).
pub use super::proxy::pass_visits;

/// User-buffer registrations of the direct paths alive now (process-wide; 0
/// between operations).
pub use super::fifo::user_registrations;

/// One collective of a group.
#[derive(Clone, Copy, Debug)]
struct Desc {
    func: Func,
    bufs: UserBufs,
    /// Bytes per rank (see the module docs).
    bytes: usize,
    dtype: DataType,
    op: RedOp,
    root: usize,
}

/// A group of collectives run together (`ncclGroupStart` … `ncclGroupEnd`).
pub struct CollGroup<'c, 'b> {
    comm: &'c Comm,
    ops: Few<Desc>,
    _bufs: std::marker::PhantomData<&'b mut [u8]>,
    error: Option<Error>,
}

fn elem(dtype: DataType) -> Result<usize> {
    dtype
        .size()
        .ok_or_else(|| Error::invalid_argument(format!("unknown data type {dtype:?}")))
}

impl<'c, 'b> CollGroup<'c, 'b> {
    pub(crate) fn new(comm: &'c Comm) -> Self {
        Self {
            comm,
            ops: Few::default(),
            _bufs: std::marker::PhantomData,
            error: None,
        }
    }

    fn push(
        &mut self,
        func: Func,
        bufs: UserBufs,
        bytes: usize,
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> &mut Self {
        let n = self.comm.nranks();
        let check = || -> Result<()> {
            let e = elem(dtype)?;
            if bytes % e != 0 {
                return Err(Error::invalid_argument(format!(
                    "{func:?}: {bytes} bytes is not a whole number of {dtype:?}"
                )));
            }
            if root >= n {
                return Err(Error::invalid_argument(format!(
                    "{func:?}: root {root} is not a rank (nranks {n})"
                )));
            }
            let me = self.comm.rank();
            let (need_send, need_recv) = match func {
                Func::ALL_REDUCE => (bytes, bytes),
                Func::BROADCAST => (if me == root { bytes } else { 0 }, bytes),
                Func::REDUCE => (bytes, if me == root { bytes } else { 0 }),
                Func::ALL_GATHER => (bytes, n * bytes),
                Func::REDUCE_SCATTER => (n * bytes, bytes),
                Func::ALL_TO_ALL => (n * bytes, n * bytes),
                Func::GATHER => (bytes, if me == root { n * bytes } else { 0 }),
                Func::SCATTER => (if me == root { n * bytes } else { 0 }, bytes),
                f => {
                    return Err(Error::invalid_argument(format!(
                        "{f:?} is not a collective"
                    )));
                }
            };
            if bufs.send_len < need_send || bufs.recv_len < need_recv {
                return Err(Error::invalid_argument(format!(
                    "{func:?} of {bytes} bytes per rank on {n} ranks needs a {need_send}-byte send and a {need_recv}-byte \
                     receive buffer, got {} and {}",
                    bufs.send_len, bufs.recv_len
                )));
            }
            Ok(())
        };
        match check() {
            Ok(()) => self.ops.push(Desc {
                func,
                bufs,
                bytes,
                dtype,
                op,
                root,
            }),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    /// AllReduce of `send` into `recv` (same length).
    pub fn all_reduce(
        &mut self,
        send: &'b [u8],
        recv: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> &mut Self {
        let bytes = recv.len();
        self.push(
            Func::ALL_REDUCE,
            Comm::bufs(send, recv),
            bytes,
            dtype,
            op,
            0,
        )
    }

    /// AllReduce in place.
    pub fn all_reduce_in_place(
        &mut self,
        buf: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> &mut Self {
        let bytes = buf.len();
        self.push(Func::ALL_REDUCE, in_place(buf), bytes, dtype, op, 0)
    }

    /// Broadcast of the root's `send` into every `recv`.
    pub fn broadcast(&mut self, send: &'b [u8], recv: &'b mut [u8], root: usize) -> &mut Self {
        let bytes = recv.len();
        self.push(
            Func::BROADCAST,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            root,
        )
    }

    /// Broadcast in place.
    pub fn broadcast_in_place(&mut self, buf: &'b mut [u8], root: usize) -> &mut Self {
        let bytes = buf.len();
        self.push(
            Func::BROADCAST,
            in_place(buf),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            root,
        )
    }

    /// Reduce of every `send` into the root's `recv`.
    pub fn reduce(
        &mut self,
        send: &'b [u8],
        recv: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> &mut Self {
        let bytes = send.len();
        self.push(Func::REDUCE, Comm::bufs(send, recv), bytes, dtype, op, root)
    }

    /// Reduce in place (the root's buffer receives the result).
    pub fn reduce_in_place(
        &mut self,
        buf: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> &mut Self {
        let bytes = buf.len();
        self.push(Func::REDUCE, in_place(buf), bytes, dtype, op, root)
    }

    /// AllGather: every rank's `send` lands at `rank × len` of every `recv`.
    pub fn all_gather(&mut self, send: &'b [u8], recv: &'b mut [u8]) -> &mut Self {
        let bytes = send.len();
        self.push(
            Func::ALL_GATHER,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            0,
        )
    }

    /// AllGather in place: this rank's input is already at `rank × len/n` of `buf`.
    pub fn all_gather_in_place(&mut self, buf: &'b mut [u8]) -> &mut Self {
        let n = self.comm.nranks();
        let bytes = buf.len() / n;
        let mut b = in_place(buf);
        // SAFETY: `rank × bytes` is inside `buf` (bytes = len / n).
        b.send = unsafe { b.send.add(self.comm.rank() * bytes) };
        b.send_len = bytes;
        self.push(Func::ALL_GATHER, b, bytes, DataType::UINT8, RedOp::SUM, 0)
    }

    /// ReduceScatter: block r of every `send` reduces into rank r's `recv`.
    pub fn reduce_scatter(
        &mut self,
        send: &'b [u8],
        recv: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> &mut Self {
        let bytes = recv.len();
        self.push(
            Func::REDUCE_SCATTER,
            Comm::bufs(send, recv),
            bytes,
            dtype,
            op,
            0,
        )
    }

    /// ReduceScatter in place: the result lands at `rank × len/n` of `buf`.
    pub fn reduce_scatter_in_place(
        &mut self,
        buf: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> &mut Self {
        let n = self.comm.nranks();
        let bytes = buf.len() / n;
        let mut b = in_place(buf);
        // SAFETY: `rank × bytes` is inside `buf`.
        b.recv = unsafe { b.recv.add(self.comm.rank() * bytes) };
        b.recv_len = bytes;
        self.push(Func::REDUCE_SCATTER, b, bytes, dtype, op, 0)
    }

    /// AllToAll: block p of `send` goes to rank p, block p of `recv` comes from it.
    pub fn all_to_all(&mut self, send: &'b [u8], recv: &'b mut [u8]) -> &mut Self {
        let bytes = send.len() / self.comm.nranks();
        self.push(
            Func::ALL_TO_ALL,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            0,
        )
    }

    /// Gather: every `send` lands at `rank × len` of the root's `recv`.
    pub fn gather(&mut self, send: &'b [u8], recv: &'b mut [u8], root: usize) -> &mut Self {
        let bytes = send.len();
        self.push(
            Func::GATHER,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            root,
        )
    }

    /// Scatter: block r of the root's `send` lands in rank r's `recv`.
    pub fn scatter(&mut self, send: &'b [u8], recv: &'b mut [u8], root: usize) -> &mut Self {
        let bytes = recv.len();
        self.push(
            Func::SCATTER,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            root,
        )
    }
}

fn in_place(buf: &mut [u8]) -> UserBufs {
    UserBufs {
        send: buf.as_ptr(),
        send_len: buf.len(),
        recv: buf.as_mut_ptr(),
        recv_len: buf.len(),
    }
}

impl Comm {
    /// Starts a group of collectives.
    pub fn collectives<'c, 'b>(&'c self) -> CollGroup<'c, 'b> {
        CollGroup::new(self)
    }

    /// AllReduce (see [`CollGroup::all_reduce`]).
    pub fn all_reduce(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<Decision> {
        let mut g = self.collectives();
        g.all_reduce(send, recv, dtype, op);
        one(g.run())
    }

    /// AllReduce in place.
    pub fn all_reduce_in_place(
        &self,
        buf: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<Decision> {
        let mut g = self.collectives();
        g.all_reduce_in_place(buf, dtype, op);
        one(g.run())
    }

    /// Broadcast from `root`.
    pub fn broadcast(&self, send: &[u8], recv: &mut [u8], root: usize) -> Result<Decision> {
        let mut g = self.collectives();
        g.broadcast(send, recv, root);
        one(g.run())
    }

    /// Reduce to `root`.
    pub fn reduce(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> Result<Decision> {
        let mut g = self.collectives();
        g.reduce(send, recv, dtype, op, root);
        one(g.run())
    }

    /// AllGather.
    pub fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<Decision> {
        let mut g = self.collectives();
        g.all_gather(send, recv);
        one(g.run())
    }

    /// ReduceScatter.
    pub fn reduce_scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<Decision> {
        let mut g = self.collectives();
        g.reduce_scatter(send, recv, dtype, op);
        one(g.run())
    }

    /// AllToAll.
    pub fn all_to_all(&self, send: &[u8], recv: &mut [u8]) -> Result<Decision> {
        let mut g = self.collectives();
        g.all_to_all(send, recv);
        one(g.run())
    }

    /// Gather to `root`.
    pub fn gather(&self, send: &[u8], recv: &mut [u8], root: usize) -> Result<Decision> {
        let mut g = self.collectives();
        g.gather(send, recv, root);
        one(g.run())
    }

    /// Scatter from `root`.
    pub fn scatter(&self, send: &[u8], recv: &mut [u8], root: usize) -> Result<Decision> {
        let mut g = self.collectives();
        g.scatter(send, recv, root);
        one(g.run())
    }

    /// Barrier: a one-element AllReduce every rank must join.
    pub fn barrier(&self) -> Result<()> {
        let mut b = [0u8; 4];
        self.all_reduce_in_place(&mut b, DataType::INT32, RedOp::SUM)
            .map(|_| ())
    }
}

mod few;
mod pat;
mod run;

pub use run::step_reuses;

fn one(r: Result<Decisions>) -> Result<Decision> {
    r?.into_iter()
        .next()
        .ok_or_else(|| Error::internal("empty group"))
}
