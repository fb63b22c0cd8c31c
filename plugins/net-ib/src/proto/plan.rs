//! Which work requests carry one matched message, on which QPs: NCCL's
//! `ncclIbMultiSend` with `ncclIbCommBaseGetQpForRequest`.
//!
//! * **QPs** (`NCCL_IB_SPLIT_DATA_ON_QPS`): by default (0) a message uses one QP,
//!   chosen round-robin by its sequence number (`(id × 1 + 0) mod nqps`); with 1 it is
//!   split over every QP in 128-byte-aligned chunks ([`super::split`]).
//! * **Immediate**: every QP used ends with one WRITE_WITH_IMM, signaled:
//!   - grouped receive (2…8 buffers), or a single message too large for the 31-bit
//!     size immediate: the data goes as plain writes and the WRITE_WITH_IMM writes
//!     the per-buffer sizes into the receiver's size records (immediate = sequence
//!     number);
//!   - adaptive routing (`NCCL_IB_ADAPTIVE_ROUTING`) and a single message larger than
//!     `NCCL_IB_AR_THRESHOLD`: the data goes as plain RDMA writes (which AR may spray
//!     over paths) and a separate zero-length WRITE_WITH_IMM follows;
//!   - otherwise the last data write carries the immediate itself (one WR less).
//! * A chunk longer than [`MAX_WR_BYTES`] is posted as several writes (an SGE length
//!   is 32 bits, and ports take at most 2 GiB per message).

use super::fifo::FifoElem;
use super::imm::Imm;
use super::split::chunk;
use super::{Keys, RemoteBuf, SendBuf};
use crate::nic::{Op, SendWr, Sge};

/// Largest single RDMA write (2 GiB − 128: a port's usual `max_msg_sz` is 2^31).
pub const MAX_WR_BYTES: usize = (1 << 31) - 128;

/// How the sender shapes its work requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendOpts {
    /// `NCCL_IB_SPLIT_DATA_ON_QPS`.
    pub split: bool,
    /// Adaptive routing on this device.
    pub ar: bool,
    /// `NCCL_IB_AR_THRESHOLD`.
    pub ar_threshold: u64,
    /// Both sides use out-of-order receive queues: every message is matched by id
    /// (immediate = sequence number, sizes in the records; [`super::ooo`]).
    pub ooo: bool,
}

impl Default for SendOpts {
    fn default() -> Self {
        Self {
            split: false,
            ar: false,
            ar_threshold: 8192,
            ooo: false,
        }
    }
}

/// QPs a message of sequence number `idx` (≥ 1) uses, in order.
pub fn qps_for(idx: u64, nqps: usize, split: bool) -> impl Iterator<Item = usize> {
    let nqps = nqps.max(1);
    let per = if split { nqps } else { 1 };
    let id = idx.wrapping_sub(1);
    (0..per).map(move |i| ((id.wrapping_mul(per as u64) + i as u64) % nqps as u64) as usize)
}

/// Whether a message must report sizes through the size records.
pub fn uses_records(sends: &[SendBuf]) -> bool {
    sends.len() > 1 || Imm::single(sends.first().map_or(0, |s| s.len)).is_err()
}

/// Whether the immediate rides on the message's own (last) data write, rather than
/// on a write of its own (size records, or adaptive routing above the threshold).
pub fn imm_on_data(sends: &[SendBuf], opts: SendOpts) -> bool {
    let records_mode = opts.ooo || uses_records(sends);
    let ar_separate = opts.ar && sends.first().map_or(0, |s| s.len) as u64 > opts.ar_threshold;
    !(records_mode || ar_separate)
}

/// Where the size records of this slot are, locally (staging) and at the peer.
#[derive(Debug, Clone, Copy)]
pub struct Records {
    /// Our staging address.
    pub addr: u64,
    /// Bytes (`8 × n`).
    pub len: u32,
    /// Our staging keys, per local device.
    pub lkeys: Keys,
    /// The receiver's record slot.
    pub remote: RemoteBuf,
}

/// How a connection's QPs lie on the devices of both sides: QP `q` is on local
/// device `q mod local_devs` and reaches remote device `q mod remote_devs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpLayout {
    /// QPs of the connection.
    pub nqps: usize,
    /// Physical devices of our virtual device.
    pub local_devs: usize,
    /// Physical devices of the peer's.
    pub remote_devs: usize,
}

impl QpLayout {
    /// `nqps` QPs between two plain (one-NIC) devices.
    pub fn single(nqps: usize) -> Self {
        Self {
            nqps,
            local_devs: 1,
            remote_devs: 1,
        }
    }
}

/// The work requests of message `idx` between plain devices, per QP index.
#[cfg(test)]
pub fn plan(
    idx: u64,
    sends: &[SendBuf],
    elems: &[FifoElem],
    records: Records,
    nqps: usize,
    opts: SendOpts,
) -> Vec<(usize, Vec<SendWr>)> {
    plan_on(idx, sends, elems, records, QpLayout::single(nqps), opts)
}

/// The work requests of message `idx`, per QP index: each QP's writes use the
/// local key of the device it lives on and the remote key of the device it reaches
/// (NCCL's `lkeys[devIndex]` / `rkeys[remDevIdx]`).
pub fn plan_on(
    idx: u64,
    sends: &[SendBuf],
    elems: &[FifoElem],
    records: Records,
    layout: QpLayout,
    opts: SendOpts,
) -> Vec<(usize, Vec<SendWr>)> {
    let nqps = layout.nqps;
    let per = if opts.split { nqps.max(1) } else { 1 };
    let records_mode = opts.ooo || uses_records(sends);
    let imm = if records_mode {
        Imm::multi(idx)
    } else {
        Imm::single(sends[0].len).unwrap_or(Imm::multi(idx))
    }
    .encode();
    let separate_imm = !imm_on_data(sends, opts);
    let write = |local: Option<Sge>, remote_addr: u64, rkey: u32, op: Op, signaled: bool| SendWr {
        wr_id: idx,
        op,
        local,
        remote_addr,
        rkey,
        signaled,
        inline: false,
    };
    qps_for(idx, nqps, opts.split)
        .enumerate()
        .map(|(i, q)| {
            let ld = q % layout.local_devs.max(1);
            let rd = q % layout.remote_devs.max(1);
            let mut wrs = Vec::new();
            for (b, e) in sends.iter().zip(elems) {
                let c = chunk(b.len, per, i);
                let mut off = c.start;
                while off < c.end {
                    let n = (c.end - off).min(MAX_WR_BYTES);
                    let sge = Sge {
                        addr: b.addr + off as u64,
                        len: n as u32,
                        lkey: b.lkeys[ld],
                    };
                    wrs.push(write(
                        Some(sge),
                        e.addr + off as u64,
                        e.rkeys[rd],
                        Op::Write,
                        false,
                    ));
                    off += n;
                }
            }
            match wrs.last_mut() {
                Some(last) if !separate_imm => {
                    last.op = Op::WriteImm(imm);
                    last.signaled = true;
                }
                _ if records_mode => wrs.push(write(
                    Some(Sge {
                        addr: records.addr,
                        len: records.len,
                        lkey: records.lkeys[ld],
                    }),
                    records.remote.addr,
                    records.remote.rkeys[rd],
                    Op::WriteImm(imm),
                    true,
                )),
                _ => wrs.push(write(
                    None,
                    elems[0].addr,
                    elems[0].rkeys[rd],
                    Op::WriteImm(imm),
                    true,
                )),
            }
            (q, wrs)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bufs(lens: &[usize]) -> (Vec<SendBuf>, Vec<FifoElem>) {
        let sends = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| SendBuf {
                addr: 0x10_0000 * (i as u64 + 1),
                len,
                lkeys: [7, 17, 0, 0, 0, 0, 0, 0],
            })
            .collect();
        let elems = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| FifoElem {
                addr: 0x90_0000 * (i as u64 + 1),
                size: len as u64,
                rkeys: [9, 19, 29, 0, 0, 0, 0, 0],
                tag: i as i32,
                nreqs: lens.len() as u32,
                idx: 1,
            })
            .collect();
        (sends, elems)
    }

    const REC: Records = Records {
        addr: 0x5000,
        len: 8,
        lkeys: [3, 13, 0, 0, 0, 0, 0, 0],
        remote: RemoteBuf {
            addr: 0x6000,
            rkeys: [4, 14, 24, 0, 0, 0, 0, 0],
        },
    };

    fn ops(wrs: &[SendWr]) -> Vec<(Op, u32, bool)> {
        wrs.iter()
            .map(|w| (w.op, w.local.map_or(0, |s| s.len), w.signaled))
            .collect()
    }

    #[test]
    fn default_is_one_qp_per_message_round_robin() {
        let (s, e) = bufs(&[100_000]);
        let opts = SendOpts::default();
        for idx in 1..=9u64 {
            let p = plan(idx, &s, &e, REC, 4, opts);
            assert_eq!(p.len(), 1, "one QP per message");
            assert_eq!(p[0].0, ((idx - 1) % 4) as usize, "round-robin");
            assert_eq!(ops(&p[0].1), vec![(Op::WriteImm(100_000), 100_000, true)]);
        }
        let split = SendOpts {
            split: true,
            ..opts
        };
        let p = plan(3, &s, &e, REC, 4, split);
        assert_eq!(p.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(p[1].1[0].local.unwrap().len, 25_088);
        assert_eq!(p[1].1[0].remote_addr, 0x90_0000 + 25_088);
    }

    #[test]
    fn adaptive_routing_sends_the_immediate_separately_above_the_threshold() {
        let ar = SendOpts {
            ar: true,
            ..SendOpts::default()
        };
        let (s, e) = bufs(&[8193]);
        let p = plan(1, &s, &e, REC, 1, ar);
        assert_eq!(
            ops(&p[0].1),
            vec![(Op::Write, 8193, false), (Op::WriteImm(8193), 0, true)]
        );
        let (s, e) = bufs(&[8192]);
        let p = plan(1, &s, &e, REC, 1, ar);
        assert_eq!(
            ops(&p[0].1),
            vec![(Op::WriteImm(8192), 8192, true)],
            "at threshold"
        );
        let (s, e) = bufs(&[1 << 20]);
        let off = plan(1, &s, &e, REC, 1, SendOpts::default());
        assert_eq!(ops(&off[0].1), vec![(Op::WriteImm(1 << 20), 1 << 20, true)]);
    }

    #[test]
    fn grouped_and_huge_messages_write_size_records_with_the_immediate() {
        let (s, e) = bufs(&[10, 0, 300]);
        let rec = Records { len: 24, ..REC };
        let p = plan(5, &s, &e, rec, 2, SendOpts::default());
        assert_eq!(p[0].0, 0, "(5-1) mod 2");
        let imm = Imm::multi(5).encode();
        assert_eq!(
            ops(&p[0].1),
            vec![
                (Op::Write, 10, false),
                (Op::Write, 300, false),
                (Op::WriteImm(imm), 24, true)
            ]
        );
        assert_eq!(p[0].1[2].remote_addr, 0x6000);
        let huge = 3usize << 31;
        let (s, e) = bufs(&[huge]);
        let p = plan(1, &s, &e, REC, 1, SendOpts::default());
        let w = ops(&p[0].1);
        assert_eq!(w.len(), 5, "4 pieces of ≤ 2 GiB + the record write: {w:?}");
        let total: u64 = w[..4].iter().map(|x| u64::from(x.1)).sum();
        assert_eq!(total, huge as u64);
        assert_eq!(w[4].0, Op::WriteImm(Imm::multi(1).encode()));
    }

    #[test]
    fn each_qp_uses_the_keys_of_its_own_device_and_of_the_device_it_reaches() {
        // Two local devices, three remote ones, six QPs split: QP q is on local
        // device q mod 2 and reaches remote device q mod 3.
        let layout = QpLayout {
            nqps: 6,
            local_devs: 2,
            remote_devs: 3,
        };
        let split = SendOpts {
            split: true,
            ..SendOpts::default()
        };
        let (s, e) = bufs(&[6 * 4096]);
        let p = plan_on(1, &s, &e, REC, layout, split);
        assert_eq!(p.len(), 6);
        for (q, wrs) in &p {
            let w = wrs[0];
            assert_eq!(w.local.unwrap().lkey, [7, 17][q % 2], "QP {q} lkey");
            assert_eq!(w.rkey, [9, 19, 29][q % 3], "QP {q} rkey");
        }
        let (s, e) = bufs(&[5, 6]);
        for idx in 1..=6u64 {
            let p = plan_on(idx, &s, &e, REC, layout, SendOpts::default());
            let (q, wrs) = &p[0];
            let rec = wrs.last().unwrap();
            assert_eq!(rec.local.unwrap().lkey, [3, 13][q % 2]);
            assert_eq!(
                rec.rkey,
                [4, 14, 24][q % 3],
                "records written with the peer's key"
            );
        }
    }
}
