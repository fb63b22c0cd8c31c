//! Point-to-point `send`/`recv` and group semantics (`ncclGroupStart`/`End`).
//!
//! A [`Group`] collects operations that may complete only together (a send and a
//! receive to each other, an all-to-all): `run` connects any peer not yet connected,
//! then runs every transfer as one batch. Transfers are cut into slices no larger
//! than the plugin's `maxP2pBytes`.

use cclkit_abi::raw::common::{DataType, Protocol, RedOp};

use super::comm::Comm;
use super::error::Result;
use super::op::{OpRef, UserBufs};
use super::schedule::{self, P2pOp};

enum Item<'a> {
    Send(&'a [u8], usize),
    Recv(&'a mut [u8], usize),
}

/// A group of point-to-point operations; nothing moves until [`run`](Self::run).
pub struct Group<'a> {
    comm: &'a Comm,
    items: Vec<Item<'a>>,
}

impl<'a> Group<'a> {
    pub(crate) fn new(comm: &'a Comm) -> Self {
        Self {
            comm,
            items: Vec::new(),
        }
    }

    /// Adds a send of `buf` to `peer`.
    pub fn send(&mut self, buf: &'a [u8], peer: usize) -> &mut Self {
        self.items.push(Item::Send(buf, peer));
        self
    }

    /// Adds a receive into `buf` from `peer`.
    pub fn recv(&mut self, buf: &'a mut [u8], peer: usize) -> &mut Self {
        self.items.push(Item::Recv(buf, peer));
        self
    }

    /// `ncclGroupEnd`: runs every operation and waits for all of them.
    pub fn run(self) -> Result<()> {
        let comm = self.comm;
        let me = comm.rank();
        let shape = comm.shape().clone();
        let red = comm.reduction(DataType::UINT8, RedOp::SUM)?;
        let peers_send: Vec<usize> = self
            .items
            .iter()
            .filter_map(|i| {
                if let Item::Send(_, p) = i {
                    Some(*p)
                } else {
                    None
                }
            })
            .collect();
        let peers_recv: Vec<usize> = self
            .items
            .iter()
            .filter_map(|i| {
                if let Item::Recv(_, p) = i {
                    Some(*p)
                } else {
                    None
                }
            })
            .collect();
        for &p in peers_send.iter().chain(&peers_recv) {
            if p >= comm.nranks() {
                return Err(super::error::Error::invalid_argument(format!(
                    "peer {p} is not a rank (nranks {})",
                    comm.nranks()
                )));
            }
        }
        comm.ensure_p2p(&peers_send, &peers_recv)?;
        let (prof, tasks) = self.profile_events();
        // Sends to self pair with receives from self, in order, as one local copy.
        let mut plans = Vec::new();
        let mut self_sends: Vec<&[u8]> = Vec::new();
        let mut self_recvs: Vec<&mut [u8]> = Vec::new();
        let mut others = Vec::new();
        for item in self.items {
            match item {
                Item::Send(b, p) if p == me => self_sends.push(b),
                Item::Recv(b, p) if p == me => self_recvs.push(b),
                other => others.push(other),
            }
        }
        // NCCL would hang on an unmatched one; say so instead.
        if self_sends.len() != self_recvs.len() {
            return Err(super::error::Error::invalid_usage(format!(
                "rank {me}: {} send(s) to self but {} receive(s) from self in one group",
                self_sends.len(),
                self_recvs.len()
            )));
        }
        for (s, r) in self_sends.into_iter().zip(self_recvs) {
            let ops = [
                P2pOp::Send {
                    peer: me,
                    offset: 0,
                    len: s.len(),
                },
                P2pOp::Recv {
                    peer: me,
                    offset: 0,
                    len: r.len(),
                },
            ];
            let bufs = Comm::bufs(s, r);
            plans.push((vec![schedule::p2p(&shape, &ops, 0)?], OpRef { bufs, red }));
        }
        for item in others {
            let (ops, bufs) = match item {
                Item::Send(b, peer) => (
                    vec![P2pOp::Send {
                        peer,
                        offset: 0,
                        len: b.len(),
                    }],
                    UserBufs {
                        send: b.as_ptr(),
                        send_len: b.len(),
                        recv: std::ptr::null_mut(),
                        recv_len: 0,
                    },
                ),
                Item::Recv(b, peer) => (
                    vec![P2pOp::Recv {
                        peer,
                        offset: 0,
                        len: b.len(),
                    }],
                    UserBufs {
                        send: std::ptr::null(),
                        send_len: 0,
                        recv: b.as_mut_ptr(),
                        recv_len: b.len(),
                    },
                ),
            };
            plans.push((vec![schedule::p2p(&shape, &ops, 0)?], OpRef { bufs, red }));
        }
        if let Some(g) = &prof {
            g.launch();
        }
        let done = comm
            .run_profiled(plans, Protocol::SIMPLE, true, &tasks)
            .map(drop);
        drop(prof);
        done
    }

    /// The profiler's group and per-plan P2p events (none without a profiler).
    fn profile_events(
        &self,
    ) -> (
        Option<crate::profile::GroupEvents<'a>>,
        Vec<cclkit_host::profiler::EventHandle>,
    ) {
        let Some(c) = self.comm.profile().ctx() else {
            return (None, Vec::new());
        };
        let items: Vec<_> = self
            .items
            .iter()
            .map(|i| match i {
                Item::Send(b, p) => (true, *p, b.len(), b.as_ptr() as usize),
                Item::Recv(b, p) => (false, *p, b.len(), b.as_ptr() as usize),
            })
            .collect();
        let (g, t) = crate::profile::p2p_events(c, self.comm.rank(), &items);
        (Some(g), t)
    }
}
