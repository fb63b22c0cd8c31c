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
use super::{RemoteBuf, SendBuf};
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
}

impl Default for SendOpts {
    fn default() -> Self {
        Self {
            split: false,
            ar: false,
            ar_threshold: 8192,
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

/// Where the size records of this slot are, locally (staging) and at the peer.
#[derive(Debug, Clone, Copy)]
pub struct Records {
    /// Our staging SGE (`8 × n` bytes).
    pub local: Sge,
    /// The receiver's record slot.
    pub remote: RemoteBuf,
}

/// The work requests of message `idx`, per QP index.
pub fn plan(
    idx: u64,
    sends: &[SendBuf],
    elems: &[FifoElem],
    records: Records,
    nqps: usize,
    opts: SendOpts,
) -> Vec<(usize, Vec<SendWr>)> {
    let per = if opts.split { nqps.max(1) } else { 1 };
    let records_mode = uses_records(sends);
    let imm = if records_mode {
        Imm::multi(idx)
    } else {
        Imm::single(sends[0].len).unwrap_or(Imm::multi(idx))
    }
    .encode();
    let separate_imm = records_mode || (opts.ar && sends[0].len as u64 > opts.ar_threshold);
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
            let mut wrs = Vec::new();
            for (b, e) in sends.iter().zip(elems) {
                let c = chunk(b.len, per, i);
                let mut off = c.start;
                while off < c.end {
                    let n = (c.end - off).min(MAX_WR_BYTES);
                    let sge = Sge {
                        addr: b.addr + off as u64,
                        len: n as u32,
                        lkey: b.lkey,
                    };
                    wrs.push(write(
                        Some(sge),
                        e.addr + off as u64,
                        e.rkey,
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
                    Some(records.local),
                    records.remote.addr,
                    records.remote.rkey,
                    Op::WriteImm(imm),
                    true,
                )),
                _ => wrs.push(write(
                    None,
                    elems[0].addr,
                    elems[0].rkey,
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
                lkey: 7,
            })
            .collect();
        let elems = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| FifoElem {
                addr: 0x90_0000 * (i as u64 + 1),
                size: len as u64,
                rkey: 9,
                tag: i as i32,
                nreqs: lens.len() as u32,
                idx: 1,
            })
            .collect();
        (sends, elems)
    }

    const REC: Records = Records {
        local: Sge {
            addr: 0x5000,
            len: 8,
            lkey: 3,
        },
        remote: RemoteBuf {
            addr: 0x6000,
            rkey: 4,
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
        let rec = Records {
            local: Sge {
                len: 24,
                ..REC.local
            },
            ..REC
        };
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
}
