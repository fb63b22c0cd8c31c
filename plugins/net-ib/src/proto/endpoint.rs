//! Creating both halves of a connection: QPs, CQ and registered control memory, the
//! metadata each side sends the other, and the QP connection once it arrives.
//!
//! Order (the side channel in [`crate::conn`] carries the metadata):
//! sender → receiver: [`ConnMeta`] of a [`SenderHalf`] (QPs, port, FIFO);
//! the receiver connects its QPs and answers with its own (QPs, port, size records);
//! the sender connects its QPs and sends "ready": only then may the receiver write
//! CTS entries, because the sender's QPs have reached RTR.

use std::sync::Arc;

use cclkit_abi::{Error, Result};

use super::fifo::{FIFO_BYTES, SIZES_BYTES};
use super::recv::Receiver;
use super::send::Sender;
use super::{DATA_QP_CAPS, FLUSH_QP_CAPS, MAX_QPS, Registered, RemoteBuf, cq_depth};
use crate::nic::{Link, Nic, PortAddr};

/// What one side tells the other at connection setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnMeta {
    /// How to reach the side's port.
    pub port: PortAddr,
    /// Its QP numbers, in connection order.
    pub qpns: Vec<u32>,
    /// Sender: its CTS FIFO. Receiver: its size records.
    pub buf: RemoteBuf,
}

/// QPs and CQ of one side.
pub(super) struct Endpoint<N: Nic> {
    // QPs before the CQ they complete on.
    pub qps: Vec<N::Qp>,
    pub cq: N::Cq,
    pub nic: Arc<N>,
}

impl<N: Nic> Endpoint<N> {
    fn new(nic: Arc<N>, nqps: usize) -> Result<Self> {
        if !(1..=MAX_QPS).contains(&nqps) {
            return Err(Error::invalid_argument(format!(
                "{nqps} QPs per connection; expected 1..={MAX_QPS}"
            )));
        }
        let cq = nic.create_cq(cq_depth(nqps))?;
        let qps = (0..nqps)
            .map(|_| nic.create_qp(&cq, DATA_QP_CAPS))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { qps, cq, nic })
    }

    fn qpns(&self) -> Vec<u32> {
        self.qps.iter().map(N::qp_num).collect()
    }

    fn connect(&mut self, remote: &ConnMeta, link: Link) -> Result<()> {
        if remote.qpns.len() != self.qps.len() {
            return Err(Error::remote(format!(
                "peer has {} QPs for this connection, we have {}",
                remote.qpns.len(),
                self.qps.len()
            )));
        }
        for (qp, &qpn) in self.qps.iter_mut().zip(&remote.qpns) {
            self.nic.connect_qp(qp, &remote.port, qpn, link)?;
        }
        Ok(())
    }
}

/// The sending side before its QPs are connected.
pub struct SenderHalf<N: Nic> {
    ep: Endpoint<N>,
    fifo: Registered<N>,
    sizes_out: Registered<N>,
}

impl<N: Nic> SenderHalf<N> {
    /// QPs, CQ, the FIFO the receiver writes into and the staging of size records.
    pub fn new(nic: Arc<N>, nqps: usize) -> Result<Self> {
        let fifo = Registered::new(&*nic, FIFO_BYTES)?;
        let sizes_out = Registered::new(&*nic, SIZES_BYTES)?;
        Ok(Self {
            ep: Endpoint::new(nic, nqps)?,
            fifo,
            sizes_out,
        })
    }

    /// What the receiver needs.
    pub fn meta(&self) -> ConnMeta {
        ConnMeta {
            port: self.ep.nic.port_addr(),
            qpns: self.ep.qpns(),
            buf: self.fifo.remote(),
        }
    }

    /// Connects to the receiver described by `remote`.
    pub fn connect(mut self, remote: &ConnMeta, link: Link) -> Result<Sender<N>> {
        self.ep.connect(remote, link)?;
        Ok(Sender::new(self.ep, self.fifo, self.sizes_out, remote.buf))
    }
}

/// The receiving side, created once the sender's metadata arrived.
pub struct ReceiverHalf<N: Nic> {
    ep: Endpoint<N>,
    cts: Registered<N>,
    sizes: Registered<N>,
    flush: Option<super::recv::Flush<N>>,
}

impl<N: Nic> ReceiverHalf<N> {
    /// QPs (as many as the sender has), CQ, the CTS staging and size records, and a
    /// loopback flush QP when GPU receives need flushing.
    pub fn new(nic: Arc<N>, nqps: usize, with_flush: bool, link: Link) -> Result<Self> {
        let ep = Endpoint::new(Arc::clone(&nic), nqps)?;
        let cts = Registered::new(&*nic, FIFO_BYTES)?;
        let sizes = Registered::new(&*nic, SIZES_BYTES)?;
        let flush = if with_flush {
            let mut qp = nic.create_qp(&ep.cq, FLUSH_QP_CAPS)?;
            let own = N::qp_num(&qp);
            nic.connect_qp(&mut qp, &nic.port_addr(), own, link)?;
            Some(super::recv::Flush::new(qp, Registered::new(&*nic, 64)?))
        } else {
            None
        };
        Ok(Self {
            ep,
            cts,
            sizes,
            flush,
        })
    }

    /// Connects to the sender described by `remote` and returns the receiver plus
    /// the metadata to send back.
    pub fn connect(mut self, remote: &ConnMeta, link: Link) -> Result<(Receiver<N>, ConnMeta)> {
        self.ep.connect(remote, link)?;
        let meta = ConnMeta {
            port: self.ep.nic.port_addr(),
            qpns: self.ep.qpns(),
            buf: self.sizes.remote(),
        };
        Ok((
            Receiver::new(self.ep, self.cts, self.sizes, self.flush, remote.buf),
            meta,
        ))
    }
}
