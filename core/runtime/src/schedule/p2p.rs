//! Point-to-point schedules: a group's sends and receives, and the collectives NCCL
//! runs as point-to-point exchanges (all-to-all style), as per-channel prims.

use cclkit_abi::raw::common::Func;

use super::*;
use crate::error::{Error, Result};

/// One point-to-point transfer of a group, from this rank's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum P2pOp {
    /// Send `len` bytes at `offset` of the send buffer to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// Byte offset in the send buffer.
        offset: usize,
        /// Bytes.
        len: usize,
    },
    /// Receive `len` bytes from `peer` into `offset` of the receive buffer.
    Recv {
        /// Source rank.
        peer: usize,
        /// Byte offset in the receive buffer.
        offset: usize,
        /// Bytes.
        len: usize,
    },
}

/// Point-to-point operations on channel `channel` (p2p connections). A send to self
/// is a local copy matched with the receive from self.
pub fn p2p(s: &Shape, ops: &[P2pOp], channel: usize) -> Result<Vec<Prim>> {
    let mut out = Vec::new();
    let self_sends: Vec<&P2pOp> = ops
        .iter()
        .filter(|o| matches!(o, P2pOp::Send { peer, .. } if *peer == s.rank))
        .collect();
    let self_recvs: Vec<&P2pOp> = ops
        .iter()
        .filter(|o| matches!(o, P2pOp::Recv { peer, .. } if *peer == s.rank))
        .collect();
    if self_sends.len() != self_recvs.len() {
        return Err(Error::invalid_usage(format!(
            "rank {}: {} send(s) to self but {} receive(s) from self in one group",
            s.rank,
            self_sends.len(),
            self_recvs.len()
        )));
    }
    for (a, b) in self_sends.iter().zip(&self_recvs) {
        if let (
            P2pOp::Send {
                offset: so,
                len: sl,
                ..
            },
            P2pOp::Recv {
                offset: ro,
                len: rl,
                ..
            },
        ) = (a, b)
        {
            if sl > rl {
                return Err(Error::invalid_usage(format!(
                    "rank {}: send to self of {sl} bytes into a {rl}-byte receive",
                    s.rank
                )));
            }
            out.push(Prim::new(*sl).src(Buffer::Send, *so).dst(Buffer::Recv, *ro));
        }
    }
    for op in ops {
        match *op {
            P2pOp::Send { peer, offset, len } if peer != s.rank => {
                check_peer(s, peer)?;
                out.push(Prim::new(len).src(Buffer::Send, offset).send([link(
                    peer,
                    channel,
                    LinkClass::P2p,
                )]));
            }
            P2pOp::Recv { peer, offset, len } if peer != s.rank => {
                check_peer(s, peer)?;
                out.push(
                    Prim::new(len)
                        .recv([link(peer, channel, LinkClass::P2p)])
                        .dst(Buffer::Recv, offset),
                );
            }
            _ => {}
        }
    }
    Ok(out.into_iter().filter(|p| p.len > 0).collect())
}

fn check_peer(s: &Shape, peer: usize) -> Result<()> {
    if peer >= s.nranks {
        return Err(Error::invalid_argument(format!(
            "peer {peer} is not a rank (nranks {})",
            s.nranks
        )));
    }
    Ok(())
}

/// AllToAll, Gather and Scatter as grouped point-to-point operations (as NCCL does).
pub fn p2p_collective(s: &Shape, func: Func, bytes: usize, root: usize) -> Result<Vec<P2pOp>> {
    let n = s.nranks;
    let mut ops = Vec::new();
    match func {
        Func::ALL_TO_ALL => {
            for peer in 0..n {
                ops.push(P2pOp::Send {
                    peer,
                    offset: peer * bytes,
                    len: bytes,
                });
                ops.push(P2pOp::Recv {
                    peer,
                    offset: peer * bytes,
                    len: bytes,
                });
            }
        }
        Func::GATHER => {
            check_peer(s, root)?;
            ops.push(P2pOp::Send {
                peer: root,
                offset: 0,
                len: bytes,
            });
            if s.rank == root {
                ops.extend((0..n).map(|peer| P2pOp::Recv {
                    peer,
                    offset: peer * bytes,
                    len: bytes,
                }));
            }
        }
        Func::SCATTER => {
            check_peer(s, root)?;
            if s.rank == root {
                ops.extend((0..n).map(|peer| P2pOp::Send {
                    peer,
                    offset: peer * bytes,
                    len: bytes,
                }));
            }
            ops.push(P2pOp::Recv {
                peer: root,
                offset: 0,
                len: bytes,
            });
        }
        f => {
            return Err(Error::invalid_argument(format!(
                "{f:?} is not a point-to-point collective"
            )));
        }
    }
    Ok(ops)
}
