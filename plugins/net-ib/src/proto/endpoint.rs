//! Creating both halves of a connection: QPs, CQ and registered control memory, the
//! metadata each side sends the other, and the QP connection once it arrives.
//!
//! Order (the side channel in [`crate::conn`] carries the metadata), as NCCL's
//! `ncclIbConnect` / `ncclIbAccept`:
//! 1. the sender creates its QPs (INIT), reads each QP's ECE and sends
//!    [`ConnMeta`]: QPs + ECE, port, FIFO, its traffic class and SL, its split mode;
//! 2. the receiver creates as many QPs, sets the sender's ECE on each, connects them
//!    (RTR with the **sender's** TC/SL, or `NCCL_IB_FIFO_TC` on RoCE; RTS), reads the
//!    reduced ECE back and answers with its own metadata, echoing TC/SL;
//! 3. the sender sets the reduced ECE, connects its QPs with the echoed TC/SL and
//!    sends "ready": only then may the receiver write CTS entries, because the
//!    sender's QPs have reached RTR.

use std::sync::Arc;

use cclkit_abi::{Error, Result, nccl_info};

use super::fifo::{FIFO_BYTES, SIZES_BYTES};
use super::plan::SendOpts;
use super::recv::{Flush, Receiver, RecvOpts};
use super::send::Sender;
use super::{DATA_QP_CAPS, FLUSH_QP_CAPS, MAX_QPS, Registered, RemoteBuf, cq_depth, recv_qp_caps};
use crate::nic::{Ece, Link, Nic, PortAddr, QpCaps};
use crate::route::LINK_ETHERNET;
use cclkit_abi::raw::common::subsys;

/// What one side tells the other at connection setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnMeta {
    /// How to reach the side's port.
    pub port: PortAddr,
    /// Its QP numbers, in connection order.
    pub qpns: Vec<u32>,
    /// Per QP: its ECE (sender: initial; receiver: reduced), `None` = unsupported.
    pub ece: Vec<Option<Ece>>,
    /// Sender: its CTS FIFO. Receiver: its size records.
    pub buf: RemoteBuf,
    /// The sender's traffic class (the receiver echoes it).
    pub tc: u8,
    /// The sender's service level (the receiver echoes it).
    pub sl: u8,
    /// The sender's `NCCL_IB_SPLIT_DATA_ON_QPS` (the receiver echoes it).
    pub split: bool,
}

/// QPs and CQ of one side.
pub(super) struct Endpoint<N: Nic> {
    // QPs before the CQ they complete on.
    pub qps: Vec<N::Qp>,
    pub cq: N::Cq,
    pub nic: Arc<N>,
}

impl<N: Nic> Endpoint<N> {
    fn new(nic: Arc<N>, nqps: usize, caps: QpCaps) -> Result<Self> {
        if !(1..=MAX_QPS).contains(&nqps) {
            return Err(Error::invalid_argument(format!(
                "{nqps} QPs per connection; expected 1..={MAX_QPS}"
            )));
        }
        let cq = nic.create_cq(cq_depth(nqps))?;
        let qps = (0..nqps)
            .map(|_| nic.create_qp(&cq, caps))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { qps, cq, nic })
    }

    fn qpns(&self) -> Vec<u32> {
        self.qps.iter().map(N::qp_num).collect()
    }

    /// Index of the QP numbered `qpn`.
    pub fn qp_index(&self, qpn: u32) -> Option<usize> {
        self.qps.iter().position(|q| N::qp_num(q) == qpn)
    }

    fn check_peer(&self, remote: &ConnMeta) -> Result<()> {
        if remote.qpns.len() != self.qps.len() || remote.ece.len() != self.qps.len() {
            return Err(Error::remote(format!(
                "peer has {} QPs for this connection, we have {}",
                remote.qpns.len(),
                self.qps.len()
            )));
        }
        if remote.port.link_layer != self.nic.port_addr().link_layer {
            return Err(Error::remote(format!(
                "NET/cclkit-ib: cannot connect link layer {} to link layer {} (select NICs of \
                 one link type with NCCL_IB_HCA)",
                self.nic.port_addr().link_layer,
                remote.port.link_layer
            )));
        }
        Ok(())
    }
}

/// What the sender needs from its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOpts {
    /// QPs per connection.
    pub nqps: usize,
    /// Traffic class and SL, already resolved as NCCL's `ncclIbConnect` does.
    pub link: Link,
    /// `NCCL_IB_ECE_ENABLE`.
    pub ece: bool,
    /// Data-path shape.
    pub send: SendOpts,
}

/// The traffic class and SL a sender announces (NCCL's `ncclIbConnect`):
/// `NCCL_IB_TC` wins over the communicator's trafficClass, which wins over 0; SL is
/// `NCCL_IB_SL`, else the communicator's trafficClass, else 0.
pub fn sender_link(env_tc: Option<u8>, env_sl: Option<u8>, comm_tc: Option<u8>) -> Link {
    Link {
        traffic_class: env_tc.or(comm_tc).unwrap_or(0),
        sl: env_sl.or(comm_tc).unwrap_or(0),
    }
}

/// The sending side before its QPs are connected.
pub struct SenderHalf<N: Nic> {
    ep: Endpoint<N>,
    fifo: Registered<N>,
    sizes_out: Registered<N>,
    ece: Vec<Option<Ece>>,
    opts: ConnectOpts,
}

impl<N: Nic> SenderHalf<N> {
    /// QPs, CQ, the FIFO the receiver writes into and the staging of size records.
    pub fn new(nic: Arc<N>, opts: ConnectOpts) -> Result<Self> {
        let fifo = Registered::new(&*nic, FIFO_BYTES)?;
        let sizes_out = Registered::new(&*nic, SIZES_BYTES)?;
        let ep = Endpoint::new(nic, opts.nqps, DATA_QP_CAPS)?;
        let ece = ep
            .qps
            .iter()
            .map(|qp| {
                if opts.ece {
                    ep.nic.query_ece(qp)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            ep,
            fifo,
            sizes_out,
            ece,
            opts,
        })
    }

    /// What the receiver needs.
    pub fn meta(&self) -> ConnMeta {
        ConnMeta {
            port: self.ep.nic.port_addr(),
            qpns: self.ep.qpns(),
            ece: self.ece.clone(),
            buf: self.fifo.remote(),
            tc: self.opts.link.traffic_class,
            sl: self.opts.link.sl,
            split: self.opts.send.split,
        }
    }

    /// Connects to the receiver described by `remote` (NCCL's `ncclIbSenderQpsToRts`).
    pub fn connect(mut self, remote: &ConnMeta) -> Result<Sender<N>> {
        self.ep.check_peer(remote)?;
        let link = Link {
            traffic_class: if remote.port.link_layer == LINK_ETHERNET {
                remote.tc
            } else {
                0
            },
            sl: remote.sl,
        };
        let nic = Arc::clone(&self.ep.nic);
        for (i, qp) in self.ep.qps.iter_mut().enumerate() {
            if let (Some(_), Some(reduced)) = (self.ece[i], remote.ece[i]) {
                nic.set_ece(qp, &reduced)?;
            }
            nic.connect_qp(qp, &remote.port, remote.qpns[i], link)?;
        }
        let send = SendOpts {
            ar: nic.adaptive_routing(),
            ..self.opts.send
        };
        Ok(Sender::new(
            self.ep,
            self.fifo,
            self.sizes_out,
            remote.buf,
            send,
        ))
    }
}

/// What the receiver needs from its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AcceptOpts {
    /// Create a loopback QP to flush GPU receives.
    pub flush: bool,
    /// `NCCL_IB_FIFO_TC`.
    pub fifo_tc: Option<u8>,
    /// `NCCL_IB_USE_INLINE`.
    pub inline: bool,
}

/// Creates and connects the receiving side for the sender described by `remote`
/// (NCCL's `ncclIbReceiverQpsCreateToRts`); returns it and the metadata to answer.
pub fn accept<N: Nic>(
    nic: Arc<N>,
    remote: &ConnMeta,
    opts: AcceptOpts,
) -> Result<(Receiver<N>, ConnMeta)> {
    let mut ep = Endpoint::new(
        Arc::clone(&nic),
        remote.qpns.len(),
        recv_qp_caps(opts.inline),
    )?;
    ep.check_peer(remote)?;
    let cts = Registered::new(&*nic, FIFO_BYTES)?;
    let sizes = Registered::new(&*nic, SIZES_BYTES)?;
    let roce = remote.port.link_layer == LINK_ETHERNET;
    let link = Link {
        traffic_class: match (roce, opts.fifo_tc) {
            (true, Some(tc)) => tc,
            _ => remote.tc,
        },
        sl: remote.sl,
    };
    let mut ece = Vec::with_capacity(ep.qps.len());
    for (i, qp) in ep.qps.iter_mut().enumerate() {
        let supported = match &remote.ece[i] {
            Some(e) => nic.set_ece(qp, e)?,
            None => false,
        };
        nic.connect_qp(qp, &remote.port, remote.qpns[i], link)?;
        ece.push(if supported { nic.query_ece(qp)? } else { None });
    }
    nccl_info!(
        subsys::NET,
        "NET/cclkit-ib: accepted {} QP(s), tc {} sl {}, ECE {}",
        ep.qps.len(),
        link.traffic_class,
        link.sl,
        if ece.iter().all(Option::is_some) {
            "negotiated"
        } else {
            "off"
        }
    );
    let flush = if opts.flush {
        let mut qp = nic.create_qp(&ep.cq, FLUSH_QP_CAPS)?;
        let own = N::qp_num(&qp);
        // NCCL configures the loopback QP with the sender's TC/SL as well.
        let flush_link = Link {
            traffic_class: if roce { remote.tc } else { 0 },
            sl: remote.sl,
        };
        nic.connect_qp(&mut qp, &nic.port_addr(), own, flush_link)?;
        Some(Flush::new(qp, Registered::new(&*nic, 64)?))
    } else {
        None
    };
    let meta = ConnMeta {
        port: nic.port_addr(),
        qpns: ep.qpns(),
        ece,
        buf: sizes.remote(),
        tc: remote.tc,
        sl: remote.sl,
        split: remote.split,
    };
    let recv = RecvOpts {
        split: remote.split,
        inline: opts.inline,
    };
    Ok((Receiver::new(ep, cts, sizes, flush, remote.buf, recv), meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_ib_tc_wins_over_the_comm_config_and_sl_falls_back_to_it() {
        let l = sender_link(Some(106), None, Some(40));
        assert_eq!((l.traffic_class, l.sl), (106, 40));
        let l = sender_link(None, Some(3), Some(40));
        assert_eq!((l.traffic_class, l.sl), (40, 3));
        let l = sender_link(None, None, None);
        assert_eq!((l.traffic_class, l.sl), (0, 0));
    }
}
