//! The collectives `cclkit perf` measures, with nccl-tests' buffer layouts and
//! bandwidth factors (NCCL_ABI.md §6), and how one aggregated iteration runs.

use cclkit_abi::raw::common::{DataType, RedOp};

use cclkit_runtime::Comm;
use cclkit_runtime::device::UserBuffer;
use cclkit_runtime::error::Result;
use cclkit_runtime::tune::Decision;

/// A measured collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Coll {
    /// `all_reduce_perf`.
    AllReduce,
    /// `all_gather_perf`.
    AllGather,
    /// `broadcast_perf`.
    Broadcast,
    /// `reduce_perf`.
    Reduce,
    /// `reduce_scatter_perf`.
    ReduceScatter,
    /// `alltoall_perf`.
    AllToAll,
    /// `gather_perf`.
    Gather,
    /// `scatter_perf`.
    Scatter,
    /// `sendrecv_perf`: every rank sends to the next and receives from the previous.
    SendRecv,
}

/// Every collective, in the order `--coll all` runs them.
pub const ALL: [Coll; 9] = [
    Coll::AllReduce,
    Coll::AllGather,
    Coll::Broadcast,
    Coll::Reduce,
    Coll::ReduceScatter,
    Coll::AllToAll,
    Coll::Gather,
    Coll::Scatter,
    Coll::SendRecv,
];

/// Buffer sizes of one measurement, in bytes (nccl-tests' `getCollByteCount` × the
/// element size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Send buffer bytes.
    pub send: usize,
    /// Receive buffer bytes (what is checked).
    pub recv: usize,
    /// The count passed to the collective (`count` column), in elements.
    pub count: usize,
    /// In place, the input starts at `send_off × rank` of the receive buffer.
    pub send_off: usize,
    /// In place, the output starts at `recv_off × rank` of the receive buffer.
    pub recv_off: usize,
}

impl Coll {
    /// The nccl-tests binary name.
    pub fn perf_name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce_perf",
            Coll::AllGather => "all_gather_perf",
            Coll::Broadcast => "broadcast_perf",
            Coll::Reduce => "reduce_perf",
            Coll::ReduceScatter => "reduce_scatter_perf",
            Coll::AllToAll => "alltoall_perf",
            Coll::Gather => "gather_perf",
            Coll::Scatter => "scatter_perf",
            Coll::SendRecv => "sendrecv_perf",
        }
    }

    /// The short name (`--coll` value).
    pub fn name(self) -> &'static str {
        self.perf_name().trim_end_matches("_perf")
    }

    /// Parses `all_reduce`, `allreduce`, `all_reduce_perf`, `AllReduce`, ….
    pub fn parse(s: &str) -> Option<Coll> {
        let k: String = s
            .trim()
            .trim_start_matches("./")
            .to_ascii_lowercase()
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect();
        let k = k.strip_suffix("perf").unwrap_or(&k);
        ALL.into_iter().find(|c| c.name().replace('_', "") == k)
    }

    /// Whether the collective reduces (has a meaningful type/op pair).
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }

    /// Whether a root applies (`-r`).
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }

    /// nccl-tests' layout for a requested size of `bytes` with `elem`-byte elements on
    /// `n` ranks: per-rank parts are `count / n` rounded down to 16 bytes of elements.
    pub fn layout(self, bytes: usize, elem: usize, n: usize) -> Layout {
        let count = bytes / elem;
        let n = n.max(1);
        let align = (16 / elem).max(1);
        let base = (count / n) / align * align;
        let (send, recv, param, so, ro) = match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => {
                (count, count, count, 0, 0)
            }
            Coll::AllGather | Coll::Gather => (base, base * n, base, base, 0),
            Coll::ReduceScatter | Coll::Scatter => (base * n, base, base, 0, base),
            Coll::AllToAll => (base * n, base * n, base, 0, 0),
        };
        Layout {
            send: send * elem,
            recv: recv * elem,
            count: param,
            send_off: so * elem,
            recv_off: ro * elem,
        }
    }

    /// `(algbw, busbw)` in GB/s for `count` elements of `elem` bytes done in `secs`
    /// on `n` ranks (nccl-tests' `getBw`).
    pub fn bandwidth(self, count: usize, elem: usize, secs: f64, n: usize) -> (f64, f64) {
        if secs <= 0.0 {
            return (0.0, 0.0);
        }
        let nf = n.max(1) as f64;
        let per_rank = (count * elem) as f64;
        let (bytes, factor) = match self {
            Coll::AllReduce => (per_rank, 2.0 * (nf - 1.0) / nf),
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => (per_rank, 1.0),
            Coll::AllGather
            | Coll::ReduceScatter
            | Coll::AllToAll
            | Coll::Gather
            | Coll::Scatter => (per_rank * nf, (nf - 1.0) / nf),
        };
        let alg = bytes / 1e9 / secs;
        (alg, alg * factor)
    }
}

/// One measurement's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The collective.
    pub coll: Coll,
    /// Buffer layout.
    pub layout: Layout,
    /// Data type.
    pub dtype: DataType,
    /// Reduction op.
    pub op: RedOp,
    /// Root rank.
    pub root: usize,
    /// In place.
    pub in_place: bool,
}

/// One aggregation slot's buffers (each op of a group gets its own, so their
/// borrows are disjoint).
pub struct Slot {
    /// Send buffer.
    pub send: UserBuffer,
    /// Receive buffer (also the in-place buffer).
    pub recv: UserBuffer,
}

/// Runs one iteration: `slots.len()` operations of `case` as one group; returns the
/// decision the first one ran with (`None` for point-to-point ones).
pub fn run_group(comm: &Comm, case: &Case, slots: &mut [Slot]) -> Result<Option<Decision>> {
    let l = case.layout;
    let (dt, op, root) = (case.dtype, case.op, case.root);
    let p2p = matches!(case.coll, Coll::SendRecv)
        || (case.in_place && matches!(case.coll, Coll::Gather | Coll::Scatter));
    if p2p {
        run_p2p(comm, case, slots)?;
        return Ok(None);
    }
    if case.in_place && case.coll == Coll::AllToAll {
        // An alltoall cannot read and write one buffer at once: stage the input in the
        // (unused) send buffer, as MPI implementations do for MPI_IN_PLACE.
        for s in slots.iter_mut() {
            s.send[..l.send].copy_from_slice(&s.recv[..l.send]);
        }
    }
    let mut g = comm.collectives();
    for s in slots.iter_mut() {
        let (sb, rb) = (&s.send[..], &mut s.recv[..]);
        match (case.coll, case.in_place) {
            (Coll::AllReduce, false) => {
                g.all_reduce(&sb[..l.send], &mut rb[..l.recv], dt, op);
            }
            (Coll::AllReduce, true) => {
                g.all_reduce_in_place(&mut rb[..l.recv], dt, op);
            }
            (Coll::Broadcast, false) => {
                g.broadcast(&sb[..l.send], &mut rb[..l.recv], root);
            }
            (Coll::Broadcast, true) => {
                g.broadcast_in_place(&mut rb[..l.recv], root);
            }
            (Coll::Reduce, false) => {
                g.reduce(&sb[..l.send], &mut rb[..l.recv], dt, op, root);
            }
            (Coll::Reduce, true) => {
                g.reduce_in_place(&mut rb[..l.recv], dt, op, root);
            }
            (Coll::AllGather, false) => {
                g.all_gather(&sb[..l.send], &mut rb[..l.recv]);
            }
            (Coll::AllGather, true) => {
                g.all_gather_in_place(&mut rb[..l.recv]);
            }
            (Coll::ReduceScatter, false) => {
                g.reduce_scatter(&sb[..l.send], &mut rb[..l.recv], dt, op);
            }
            (Coll::ReduceScatter, true) => {
                g.reduce_scatter_in_place(&mut rb[..l.send], dt, op);
            }
            (Coll::AllToAll, _) => {
                g.all_to_all(&sb[..l.send], &mut rb[..l.recv]);
            }
            (Coll::Gather, _) => {
                g.gather(&sb[..l.send], &mut rb[..l.recv], root);
            }
            (Coll::Scatter, _) => {
                g.scatter(&sb[..l.send], &mut rb[..l.recv], root);
            }
            // Handled by `run_p2p` above.
            (Coll::SendRecv, _) => {}
        }
    }
    Ok(g.run()?.into_iter().next())
}

/// Point-to-point measurements: SendRecv, and Gather/Scatter in place (the root's
/// own part stays where it is; only the other parts move).
fn run_p2p(comm: &Comm, case: &Case, slots: &mut [Slot]) -> Result<()> {
    let (me, n) = (comm.rank(), comm.nranks());
    let l = case.layout;
    let part = l.count * case.dtype.size().unwrap_or(1);
    if case.coll == Coll::SendRecv && case.in_place {
        // Sending from and receiving into one buffer at once is a data race: the input
        // is staged in the send buffer first (the copy is part of the measured time).
        for s in slots.iter_mut() {
            s.send[..l.send].copy_from_slice(&s.recv[..l.send]);
        }
    }
    let mut g = comm.group();
    for s in slots.iter_mut() {
        match case.coll {
            Coll::SendRecv => {
                let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                g.send(&s.send[..l.send], next);
                g.recv(&mut s.recv[..l.recv], prev);
            }
            Coll::Gather if me == case.root => {
                for (p, chunk) in s.recv[..n * part].chunks_mut(part.max(1)).enumerate() {
                    if p != me && part > 0 {
                        g.recv(chunk, p);
                    }
                }
            }
            Coll::Gather => {
                g.send(&s.recv[me * part..(me + 1) * part], case.root);
            }
            Coll::Scatter if me == case.root => {
                for (p, chunk) in s.recv[..n * part].chunks(part.max(1)).enumerate() {
                    if p != me && part > 0 {
                        g.send(chunk, p);
                    }
                }
            }
            _ => {
                g.recv(&mut s.recv[me * part..(me + 1) * part], case.root);
            }
        }
    }
    g.run()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases() {
        for c in ALL {
            assert_eq!(Coll::parse(c.name()), Some(c));
            assert_eq!(Coll::parse(c.perf_name()), Some(c));
        }
        assert_eq!(Coll::parse("allreduce"), Some(Coll::AllReduce));
        assert_eq!(Coll::parse("AllReduce"), Some(Coll::AllReduce));
        assert_eq!(Coll::parse("./all_gather_perf"), Some(Coll::AllGather));
        assert_eq!(Coll::parse("all-to-all"), Some(Coll::AllToAll));
        assert_eq!(Coll::parse("hypercube"), None);
    }

    #[test]
    fn layouts_follow_nccl_tests() {
        // 1000 floats on 3 ranks: 333 per rank, rounded down to 4 elements (16 B).
        let ag = Coll::AllGather.layout(4000, 4, 3);
        assert_eq!(
            ag,
            Layout {
                send: 332 * 4,
                recv: 3 * 332 * 4,
                count: 332,
                send_off: 332 * 4,
                recv_off: 0
            }
        );
        let rs = Coll::ReduceScatter.layout(4000, 4, 3);
        assert_eq!(
            (rs.send, rs.recv, rs.recv_off),
            (3 * 332 * 4, 332 * 4, 332 * 4)
        );
        let a2a = Coll::AllToAll.layout(4000, 4, 3);
        assert_eq!(
            (a2a.send, a2a.recv, a2a.count),
            (3 * 332 * 4, 3 * 332 * 4, 332)
        );
        let ar = Coll::AllReduce.layout(4001, 4, 3);
        assert_eq!((ar.send, ar.recv, ar.count), (4000, 4000, 1000));
        // Tiny sizes divide to nothing, as in nccl-tests.
        assert_eq!(Coll::AllGather.layout(8, 4, 4).count, 0);
        assert_eq!(Coll::Scatter.layout(1 << 20, 1, 4).count, 1 << 18);
    }

    #[test]
    fn bandwidth_factors() {
        let (alg, bus) = Coll::AllReduce.bandwidth(250_000_000, 4, 1.0, 4);
        assert!((alg - 1.0).abs() < 1e-12 && (bus - 1.5).abs() < 1e-12);
        let (alg, bus) = Coll::AllGather.bandwidth(250_000_000, 4, 1.0, 4);
        assert!((alg - 4.0).abs() < 1e-12 && (bus - 3.0).abs() < 1e-12);
        let (alg, bus) = Coll::Broadcast.bandwidth(1_000_000_000, 1, 2.0, 8);
        assert!((alg - 0.5).abs() < 1e-12 && (bus - 0.5).abs() < 1e-12);
        assert_eq!(Coll::SendRecv.bandwidth(1, 1, 0.0, 2), (0.0, 0.0));
    }
}
