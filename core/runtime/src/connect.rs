//! Establishing net connections between ranks, as NCCL's transport setup does: the
//! receiver listens and ships the 128-byte handle through the bootstrap, the sender
//! connects with it; both sides then poll the non-blocking `connect`/`accept`.
//!
//! All receivers publish their handles before any sender waits for one, so any set
//! of links connects without deadlock; every wait has the bootstrap deadline.

use std::time::Instant;

use super::bootstrap::Bootstrap;
use super::device::Placement;
use super::error::net_err;
use super::error::{Error, Result};
use super::fifo::{RecvConn, SendConn};
use super::schedule::{Link, LinkClass};
use super::topo::{NetDevice, select_nic};
use cclkit_host::net::{Connecting, ListenComm, NetContext};

/// Bootstrap tag of the handle for `link` as seen from the *sending* rank.
fn tag(link_from_sender: &Link) -> u64 {
    let class = match link_from_sender.class {
        LinkClass::Ring => 1u64,
        LinkClass::Tree => 2,
        LinkClass::P2p => 3,
    };
    (1 << 61) | (class << 32) | link_from_sender.channel as u64
}

fn label(rank: usize, l: &Link, dir: &str) -> String {
    format!(
        "rank {rank} {dir} rank {} ({:?} channel {})",
        l.peer, l.class, l.channel
    )
}

/// Connections made by [`connect_placed`]: send and receive sides with their links.
pub type Connected = (Vec<(Link, SendConn)>, Vec<(Link, RecvConn)>);

/// Where a device communicator's connections keep their FIFO slots: the GPU's
/// PCI path (NICs are chosen closest to it) and, per NIC, the (send, receive)
/// placements ([`super::device`]).
pub type Placed<'a> = (Option<&'a str>, &'a [(Placement, Placement)]);

/// Connects `sends` (this rank sends to `link.peer`) and `recvs` (receives from it);
/// `placed` is `None` on the host, and for a device communicator see [`Placed`].
pub fn connect_placed(
    boot: &Bootstrap,
    net: &NetContext,
    devices: &[NetDevice],
    placed: Option<Placed<'_>>,
    local_rank: usize,
    sends: &[Link],
    recvs: &[Link],
) -> Result<Connected> {
    let rank = boot.rank();
    let gpu = placed.and_then(|(g, _)| g);
    let dev = |l: &Link| select_nic(devices, gpu, local_rank, l.channel).unwrap_or(0);
    let place = |l: &Link| placed.and_then(|(_, p)| p.get(dev(l))).cloned();
    // 1. Listen for every receive and publish the handles.
    let mut listening: Vec<(Link, ListenComm)> = Vec::with_capacity(recvs.len());
    for l in recvs {
        let (handle, lc) = net
            .listen(dev(l))
            .map_err(|e| net_err(e, &format!("{}: listen", label(rank, l, "from"))))?;
        let theirs = Link { peer: rank, ..*l };
        boot.send(l.peer, tag(&theirs), &handle)?;
        listening.push((*l, lc));
    }
    // 2. Collect the peers' handles and start connecting.
    let mut connecting: Vec<(Link, Connecting)> = Vec::with_capacity(sends.len());
    for l in sends {
        let handle = boot.recv(l.peer, tag(l))?;
        let handle: [u8; 128] = handle.try_into().map_err(|_| {
            Error::internal(format!("{}: handle is not 128 bytes", label(rank, l, "to")))
        })?;
        connecting.push((*l, net.connect(dev(l), &handle)));
    }
    // 3. Drive both sides until every comm exists.
    let deadline = Instant::now() + boot.timeout();
    let mut sent = Vec::with_capacity(sends.len());
    let mut recvd = Vec::with_capacity(recvs.len());
    while !connecting.is_empty() || !listening.is_empty() {
        let mut moved = false;
        let mut i = 0;
        while i < connecting.len() {
            let (l, c) = &mut connecting[i];
            match c
                .poll()
                .map_err(|e| net_err(e, &format!("{}: connect", label(rank, l, "to"))))?
            {
                Some(comm) => {
                    let l = *l;
                    connecting.swap_remove(i);
                    let mut c = SendConn::new(comm, label(rank, &l, "to"), rank as i32);
                    if let Some((p, _)) = place(&l) {
                        c = c.placed(p);
                    }
                    sent.push((l, c));
                    moved = true;
                }
                None => i += 1,
            }
        }
        let mut i = 0;
        while i < listening.len() {
            let (l, lc) = &mut listening[i];
            match lc
                .accept()
                .map_err(|e| net_err(e, &format!("{}: accept", label(rank, l, "from"))))?
            {
                Some(comm) => {
                    let l = *l;
                    // NCCL closes the listen comm as soon as accept returns a comm.
                    drop(listening.swap_remove(i));
                    let mut c = RecvConn::new(comm, label(rank, &l, "from"), l.peer as i32);
                    if let Some((_, p)) = place(&l) {
                        c = c.placed(p);
                    }
                    recvd.push((l, c));
                    moved = true;
                }
                None => i += 1,
            }
        }
        if Instant::now() > deadline {
            let pending: Vec<String> = connecting
                .iter()
                .map(|(l, _)| label(rank, l, "to"))
                .chain(listening.iter().map(|(l, _)| label(rank, l, "from")))
                .collect();
            return Err(Error::timeout(format!(
                "connection setup did not finish within {:?} (CCLKIT_BOOTSTRAP_TIMEOUT): {}",
                boot.timeout(),
                pending.join(", ")
            )));
        }
        if !moved {
            std::thread::yield_now();
        }
    }
    Ok((sent, recvd))
}
