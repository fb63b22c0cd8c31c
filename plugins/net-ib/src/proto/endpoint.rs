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
use super::ooo::{Ooo, check_size};
use super::plan::SendOpts;
use super::recv::{Flush, Receiver, RecvOpts};
use super::send::Sender;
use super::{
    DATA_QP_CAPS, FLUSH_QP_CAPS, MAX_CONN_QPS, MAX_DEVS, Registered, RemoteBuf, cq_depth,
    recv_qp_caps,
};
use crate::nic::{Completion, Ece, Link, Nic, PortAddr, QpCaps};
use crate::route::LINK_ETHERNET;
use cclkit_abi::raw::common::subsys;

/// What one side tells the other at connection setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnMeta {
    /// How to reach each physical device of the side's (virtual) device (1 …
    /// [`MAX_DEVS`]); QP `i` of the side lives on device `i mod ports.len()`.
    pub ports: Vec<PortAddr>,
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
    /// Sender: it has out-of-order receive queues ([`super::ooo`]); receiver: the
    /// connection uses them.
    pub ooo: bool,
}

/// QPs and CQs of one side, striped over the physical devices of its virtual
/// device as NCCL's `ncclIbSenderQpsCreate` does: QP `i` on device `i mod ndevs`,
/// completing on that device's CQ.
pub(super) struct Endpoint<N: Nic> {
    // QPs before the CQs they complete on.
    pub qps: Vec<N::Qp>,
    pub cqs: Vec<N::Cq>,
    pub nics: Vec<Arc<N>>,
    /// Devices of the peer's virtual device: QP `i` reaches the peer's device
    /// `i mod remote_devs` (NCCL's `remDevIdx`). Set at connect.
    pub remote_devs: usize,
    /// Reused by [`poll`](Self::poll), so polling does not allocate.
    scratch: Vec<Completion>,
}

impl<N: Nic> Endpoint<N> {
    fn new(nics: Vec<Arc<N>>, nqps: usize, caps: QpCaps) -> Result<Self> {
        let ndevs = nics.len();
        if !(1..=MAX_DEVS).contains(&ndevs) {
            return Err(Error::invalid_argument(format!(
                "{ndevs} devices in a virtual device; expected 1..={MAX_DEVS}"
            )));
        }
        if !(1..=MAX_CONN_QPS).contains(&nqps) {
            return Err(Error::invalid_argument(format!(
                "{nqps} QPs per connection; expected 1..={MAX_CONN_QPS}"
            )));
        }
        let per_dev = nqps.div_ceil(ndevs);
        let cqs = nics
            .iter()
            .map(|nic| nic.create_cq(cq_depth(per_dev)))
            .collect::<Result<Vec<_>>>()?;
        let qps = (0..nqps)
            .map(|i| nics[i % ndevs].create_qp(&cqs[i % ndevs], caps))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            qps,
            cqs,
            nics,
            remote_devs: 1,
            scratch: Vec::new(),
        })
    }

    fn qpns(&self) -> Vec<u32> {
        self.qps.iter().map(N::qp_num).collect()
    }

    /// Devices of this side.
    pub fn ndevs(&self) -> usize {
        self.nics.len()
    }

    /// The device QP `q` lives on.
    pub fn dev_of(&self, q: usize) -> usize {
        q % self.nics.len()
    }

    /// The NIC QP `q` lives on.
    pub fn nic_of(&self, q: usize) -> &N {
        &self.nics[q % self.nics.len()]
    }

    /// The peer's device QP `q` reaches.
    pub fn remote_dev_of(&self, q: usize) -> usize {
        q % self.remote_devs.max(1)
    }

    /// Index of the QP numbered `qpn` on device `dev` (QP numbers are unique only
    /// within a device).
    pub fn qp_index(&self, dev: usize, qpn: u32) -> Option<usize> {
        (dev..self.qps.len())
            .step_by(self.nics.len())
            .find(|&i| N::qp_num(&self.qps[i]) == qpn)
    }

    /// The first fatal asynchronous error of any device or CQ of this side.
    pub fn check_fatal(&self) -> Result<()> {
        self.nics
            .iter()
            .zip(&self.cqs)
            .try_for_each(|(nic, cq)| nic.check_fatal(cq))
    }

    /// Polls every device's CQ into `out` (tagged with the device index).
    pub fn poll(&mut self, out: &mut Vec<(usize, Completion)>, max: usize) -> Result<()> {
        for (d, (nic, cq)) in self.nics.iter().zip(self.cqs.iter_mut()).enumerate() {
            self.scratch.clear();
            nic.poll_cq(cq, &mut self.scratch, max)?;
            out.extend(self.scratch.iter().map(|c| (d, *c)));
        }
        Ok(())
    }

    fn check_peer(&self, remote: &ConnMeta) -> Result<()> {
        if remote.qpns.len() != self.qps.len() || remote.ece.len() != self.qps.len() {
            return Err(Error::remote(format!(
                "peer has {} QPs for this connection, we have {}",
                remote.qpns.len(),
                self.qps.len()
            )));
        }
        if !(1..=MAX_DEVS).contains(&remote.ports.len()) {
            return Err(Error::remote(format!(
                "peer announces {} devices (1..={MAX_DEVS})",
                remote.ports.len()
            )));
        }
        let ll = self.nics[0].port_addr().link_layer;
        if let Some(p) = remote.ports.iter().find(|p| p.link_layer != ll) {
            return Err(Error::remote(format!(
                "NET/cclkit-ib: cannot connect link layer {ll} to link layer {} (select NICs of \
                 one link type with NCCL_IB_HCA)",
                p.link_layer
            )));
        }
        Ok(())
    }

    /// Connects QP `i` to the peer's QP `i` on the peer device it reaches.
    fn connect_all(
        &mut self,
        remote: &ConnMeta,
        link: Link,
        mut before_rtr: impl FnMut(&N, usize, &mut N::Qp) -> Result<()>,
    ) -> Result<()> {
        self.remote_devs = remote.ports.len();
        for i in 0..self.qps.len() {
            let nic = Arc::clone(&self.nics[i % self.nics.len()]);
            let port = remote.ports[i % self.remote_devs];
            before_rtr(&nic, i, &mut self.qps[i])?;
            nic.connect_qp(&mut self.qps[i], &port, remote.qpns[i], link)?;
        }
        Ok(())
    }
}

/// What the sender needs from its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOpts {
    /// QPs per connection on each device (`NCCL_IB_QPS_PER_CONNECTION`; NCCL's
    /// `nQpsPerDev`): a virtual device of `n` NICs opens `n ×` this many.
    pub nqps: usize,
    /// Traffic class and SL, already resolved as NCCL's `ncclIbConnect` does.
    pub link: Link,
    /// `NCCL_IB_ECE_ENABLE`.
    pub ece: bool,
    /// `NCCL_IB_OOO_RQ`.
    pub ooo_rq: bool,
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
    ooo: Ooo,
}

impl<N: Nic> SenderHalf<N> {
    /// QPs striped over `nics`, CQs, the FIFO the receiver writes into and the
    /// staging of size records. A peer of `remote_devs` ports: NCCL opens
    /// `opts.nqps × max(local, remote)` QPs, so every port of both sides gets some.
    pub fn new(nics: Vec<Arc<N>>, remote_devs: usize, opts: ConnectOpts) -> Result<Self> {
        let fifo = Registered::new(&nics, FIFO_BYTES)?;
        let sizes_out = Registered::new(&nics, SIZES_BYTES)?;
        let nqps = opts.nqps * nics.len().max(remote_devs);
        let ooo = Ooo::local(opts.ooo_rq, &nics)?;
        // A forced but unsupported side cannot connect to anyone (NCCL fails at QP
        // creation); say so before opening anything.
        if let Ooo::Forced { supported: false } = ooo {
            ooo.with_peer(false)?;
        }
        let caps = QpCaps {
            ooo_rq: ooo.announce(),
            ..DATA_QP_CAPS
        };
        let ep = Endpoint::new(nics, nqps, caps)?;
        let ece = ep
            .qps
            .iter()
            .enumerate()
            .map(|(i, qp)| {
                if opts.ece {
                    ep.nic_of(i).query_ece(qp)
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
            ooo,
        })
    }

    /// What the receiver needs.
    pub fn meta(&self) -> ConnMeta {
        ConnMeta {
            ports: self.ep.nics.iter().map(|n| n.port_addr()).collect(),
            qpns: self.ep.qpns(),
            ece: self.ece.clone(),
            buf: self.fifo.remote(),
            tc: self.opts.link.traffic_class,
            sl: self.opts.link.sl,
            split: self.opts.send.split,
            ooo: self.ooo.announce(),
        }
    }

    /// Connects to the receiver described by `remote` (NCCL's `ncclIbSenderQpsToRts`).
    pub fn connect(mut self, remote: &ConnMeta) -> Result<Sender<N>> {
        self.ep.check_peer(remote)?;
        let ooo = self.ooo.with_peer(remote.ooo)?;
        let link = Link {
            traffic_class: if remote.ports[0].link_layer == LINK_ETHERNET {
                remote.tc
            } else {
                0
            },
            sl: remote.sl,
        };
        let ece = &self.ece;
        self.ep.connect_all(remote, link, |nic, i, qp| {
            if let (Some(_), Some(reduced)) = (ece[i], remote.ece[i]) {
                nic.set_ece(qp, &reduced)?;
            }
            Ok(())
        })?;
        // Adaptive routing as the first device has it (NCCL: `comm->ar` is the
        // merged device's, which its first device sets).
        let send = SendOpts {
            ar: self.ep.nics[0].adaptive_routing(),
            ooo,
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
    /// `NCCL_IB_OOO_RQ`.
    pub ooo_rq: bool,
}

/// Creates and connects the receiving side for the sender described by `remote`
/// (NCCL's `ncclIbReceiverQpsCreateToRts`) on the physical devices `nics` of the
/// listening (virtual) device; returns it and the metadata to answer. It opens as
/// many QPs as the sender, QP `i` on device `i mod nics.len()`.
pub fn accept<N: Nic>(
    nics: Vec<Arc<N>>,
    remote: &ConnMeta,
    opts: AcceptOpts,
) -> Result<(Receiver<N>, ConnMeta)> {
    let ooo = Ooo::local(opts.ooo_rq, &nics)?.with_peer(remote.ooo)?;
    let caps = QpCaps {
        ooo_rq: ooo,
        ..recv_qp_caps(opts.inline)
    };
    if ooo {
        check_size(&nics, caps.max_recv_wr)?;
    }
    let mut ep = Endpoint::new(nics, remote.qpns.len(), caps)?;
    ep.check_peer(remote)?;
    let cts = Registered::new(&ep.nics, FIFO_BYTES)?;
    let sizes = Registered::new(&ep.nics, SIZES_BYTES)?;
    let roce = remote.ports[0].link_layer == LINK_ETHERNET;
    let link = Link {
        traffic_class: match (roce, opts.fifo_tc) {
            (true, Some(tc)) => tc,
            _ => remote.tc,
        },
        sl: remote.sl,
    };
    let mut supported = vec![false; ep.qps.len()];
    ep.connect_all(remote, link, |nic, i, qp| {
        supported[i] = match &remote.ece[i] {
            Some(e) => nic.set_ece(qp, e)?,
            None => false,
        };
        Ok(())
    })?;
    let ece = (0..ep.qps.len())
        .map(|i| {
            if supported[i] {
                ep.nic_of(i).query_ece(&ep.qps[i])
            } else {
                Ok(None)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    nccl_info!(
        subsys::NET,
        "NET/cclkit-ib: accepted {} QP(s) {:?} on {} device(s) (peer: {}), tc {} sl {}, ECE {}, \
         oooRq={}",
        ep.qps.len(),
        ep.qpns(),
        ep.ndevs(),
        remote.ports.len(),
        link.traffic_class,
        link.sl,
        if ece.iter().all(Option::is_some) {
            "negotiated"
        } else {
            "off"
        },
        u8::from(ooo)
    );
    let flush = if opts.flush {
        // One loopback QP per device: data may have come through any of them, and
        // only a read through the same device orders after its writes (NCCL flushes
        // on every device of the merged device).
        let flush_link = Link {
            traffic_class: if roce { remote.tc } else { 0 },
            sl: remote.sl,
        };
        let mut qps = Vec::with_capacity(ep.ndevs());
        for (nic, cq) in ep.nics.iter().zip(&ep.cqs) {
            let mut qp = nic.create_qp(cq, FLUSH_QP_CAPS)?;
            let own = N::qp_num(&qp);
            nic.connect_qp(&mut qp, &nic.port_addr(), own, flush_link)?;
            qps.push(qp);
        }
        Some(Flush::new(qps, Registered::new(&ep.nics, 64)?))
    } else {
        None
    };
    let meta = ConnMeta {
        ports: ep.nics.iter().map(|n| n.port_addr()).collect(),
        qpns: ep.qpns(),
        ece,
        buf: sizes.remote(),
        tc: remote.tc,
        sl: remote.sl,
        split: remote.split,
        ooo,
    };
    let recv = RecvOpts {
        split: remote.split,
        inline: opts.inline,
        ooo,
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
