//! The collective cases a rank runs and checks: every collective × every type × every
//! op (reductions), counts 0, 1, primes and a large one, roots and in-place variants
//! rotating, some cases aggregated in one group. Every rank regenerates every input
//! from the seed, so each checks its own outputs against a serial reference.

use std::collections::BTreeMap;

use cclkit_abi::raw::common::{Algorithm, DataType, Func, Protocol, RedOp};
use cclkit_runtime::Comm;
use cclkit_runtime::coll::CollGroup;
use cclkit_runtime::tune::Decision;

use super::data::{
    OPS, Rng, TYPES, assert_bytes, assert_same_everywhere, check_reduction, digest, input, size,
};

/// Every collective the runtime offers.
pub const FUNCS: [Func; 8] = [
    Func::ALL_REDUCE,
    Func::REDUCE,
    Func::REDUCE_SCATTER,
    Func::BROADCAST,
    Func::ALL_GATHER,
    Func::ALL_TO_ALL,
    Func::GATHER,
    Func::SCATTER,
];

/// Unoptimised builds check every element too, at smaller sizes (the reference
/// checks dominate and run ~10× slower there).
pub const DEBUG: bool = cfg!(debug_assertions);

/// The count between the small primes and the large count.
const MID: usize = if DEBUG { 16_411 } else { 65_537 };

/// Collectives that run on ring/tree connections (the others are grouped p2p).
pub fn tuned(f: Func) -> bool {
    !matches!(f, Func::ALL_TO_ALL | Func::GATHER | Func::SCATTER)
}

fn reduces(f: Func) -> bool {
    matches!(f, Func::ALL_REDUCE | Func::REDUCE | Func::REDUCE_SCATTER)
}

fn has_in_place(f: Func) -> bool {
    tuned(f)
}

/// One collective call.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Index (seeds the inputs).
    pub idx: usize,
    /// The collective.
    pub func: Func,
    /// Data type.
    pub dtype: DataType,
    /// Reduction op (sum for data movement).
    pub op: RedOp,
    /// Elements per rank (see the runtime's size conventions).
    pub count: usize,
    /// Root rank (rooted collectives).
    pub root: usize,
    /// In place.
    pub in_place: bool,
}

/// Every case for `n` ranks. `big_bytes` sizes the largest count; `only_tuned` drops
/// the p2p-based collectives (for launches that force an algorithm or protocol).
pub fn cases(n: usize, seed: u64, big_bytes: usize, only_tuned: bool) -> Vec<Case> {
    let mut out = Vec::new();
    for (fi, &func) in FUNCS.iter().enumerate() {
        if only_tuned && !tuned(func) {
            continue;
        }
        let ops: &[RedOp] = if reduces(func) { &OPS } else { &[RedOp::SUM] };
        let mut k = fi + seed as usize;
        for &dtype in &TYPES {
            for &op in ops {
                k += 1;
                let counts = [
                    0,
                    1,
                    2,
                    7,
                    13,
                    61,
                    1021,
                    4099,
                    MID,
                    (big_bytes / size(dtype)) | 1,
                ];
                out.push(Case {
                    idx: out.len(),
                    func,
                    dtype,
                    op,
                    count: counts[k % counts.len()],
                    root: (k / 3) % n,
                    in_place: has_in_place(func) && k % 2 == 1,
                });
            }
        }
    }
    out
}

/// A case's buffers on this rank: `send` (unused in place) and `recv`.
pub struct Bufs {
    send: Vec<u8>,
    recv: Vec<u8>,
}

/// Filler of output bytes no collective may write.
const UNTOUCHED: u8 = 0xa5;

impl Case {
    fn e(&self) -> usize {
        size(self.dtype)
    }

    /// Input elements of `rank`.
    fn input_len(&self, rank: usize, n: usize) -> usize {
        match self.func {
            Func::REDUCE_SCATTER | Func::ALL_TO_ALL => n * self.count,
            Func::SCATTER if rank == self.root => n * self.count,
            Func::SCATTER => 0,
            Func::BROADCAST if rank != self.root && !self.in_place => 0,
            _ => self.count,
        }
    }

    /// The input of `rank` (any rank can compute any rank's).
    pub fn input(&self, seed: u64, rank: usize, n: usize) -> Vec<u8> {
        let mut rng = Rng::new(&[seed, self.idx as u64, rank as u64]);
        input(self.dtype, self.op, self.input_len(rank, n), &mut rng)
    }

    /// Output bytes of this rank (out of place).
    fn output_len(&self, me: usize, n: usize) -> usize {
        let b = self.count * self.e();
        match self.func {
            Func::ALL_GATHER | Func::ALL_TO_ALL => n * b,
            Func::GATHER if me == self.root => n * b,
            Func::GATHER => 0,
            _ => b,
        }
    }

    /// This rank's buffers, filled as the collective expects them.
    pub fn buffers(&self, seed: u64, me: usize, n: usize) -> Bufs {
        let mine = self.input(seed, me, n);
        if !self.in_place {
            let recv = vec![UNTOUCHED; self.output_len(me, n)];
            return Bufs { send: mine, recv };
        }
        let recv = match self.func {
            Func::ALL_GATHER => {
                let b = self.count * self.e();
                let mut buf = vec![UNTOUCHED; n * b];
                buf[me * b..(me + 1) * b].copy_from_slice(&mine);
                buf
            }
            _ => mine,
        };
        Bufs {
            send: Vec::new(),
            recv,
        }
    }

    /// Adds this case to a group.
    pub fn add<'b>(&self, g: &mut CollGroup<'_, 'b>, b: &'b mut Bufs) {
        let (s, r, root) = (&b.send[..], &mut b.recv[..], self.root);
        let (dt, op) = (self.dtype, self.op);
        match (self.func, self.in_place) {
            (Func::ALL_REDUCE, false) => g.all_reduce(s, r, dt, op),
            (Func::ALL_REDUCE, true) => g.all_reduce_in_place(r, dt, op),
            (Func::REDUCE, false) => g.reduce(s, r, dt, op, root),
            (Func::REDUCE, true) => g.reduce_in_place(r, dt, op, root),
            (Func::REDUCE_SCATTER, false) => g.reduce_scatter(s, r, dt, op),
            (Func::REDUCE_SCATTER, true) => g.reduce_scatter_in_place(r, dt, op),
            (Func::BROADCAST, false) => g.broadcast(s, r, root),
            (Func::BROADCAST, true) => g.broadcast_in_place(r, root),
            (Func::ALL_GATHER, false) => g.all_gather(s, r),
            (Func::ALL_GATHER, true) => g.all_gather_in_place(r),
            (Func::ALL_TO_ALL, _) => g.all_to_all(s, r),
            (Func::GATHER, _) => g.gather(s, r, root),
            (Func::SCATTER, _) => g.scatter(s, r, root),
            (f, _) => panic!("{f:?} is not a collective"),
        };
    }

    /// Checks this rank's result; returns the digest of an AllReduce result (which
    /// every rank must hold identically; see [`Tally::agree`]), else 0.
    pub fn verify(&self, comm: &Comm, seed: u64, b: &Bufs) -> u64 {
        let (me, n) = (comm.rank(), comm.nranks());
        let what = format!("rank {me}/{n} case {self:?}");
        let eb = self.count * self.e();
        let all = || -> Vec<Vec<u8>> { (0..n).map(|r| self.input(seed, r, n)).collect() };
        let out = &b.recv;
        match self.func {
            Func::ALL_REDUCE => {
                let xs = all();
                let refs: Vec<&[u8]> = xs.iter().map(Vec::as_slice).collect();
                check_reduction(self.dtype, self.op, &refs, 0, out)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                return digest(out);
            }
            Func::REDUCE if me == self.root => {
                let xs = all();
                let refs: Vec<&[u8]> = xs.iter().map(Vec::as_slice).collect();
                check_reduction(self.dtype, self.op, &refs, 0, out)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            Func::REDUCE => {
                // A non-root's receive buffer is never written.
                let before = self.buffers(seed, me, n);
                assert_bytes(out, &before.recv, &format!("{what}: non-root buffer"));
            }
            Func::REDUCE_SCATTER => {
                let xs = all();
                let refs: Vec<&[u8]> = xs.iter().map(Vec::as_slice).collect();
                let (at, mine) = if self.in_place {
                    (me * eb, &out[me * eb..(me + 1) * eb])
                } else {
                    (0, &out[..])
                };
                check_reduction(self.dtype, self.op, &refs, me * self.count, mine)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                if self.in_place {
                    // The rest of the buffer is input: left as it was.
                    let x = &xs[me];
                    assert_bytes(&out[..at], &x[..at], &format!("{what}: before own block"));
                    assert_bytes(
                        &out[at + eb..],
                        &x[at + eb..],
                        &format!("{what}: after own block"),
                    );
                }
            }
            Func::BROADCAST => {
                assert_bytes(out, &self.input(seed, self.root, n), &what);
            }
            Func::ALL_GATHER => {
                let want: Vec<u8> = all().concat();
                assert_bytes(out, &want, &what);
            }
            Func::ALL_TO_ALL => {
                let want: Vec<u8> = (0..n)
                    .flat_map(|p| self.input(seed, p, n)[me * eb..(me + 1) * eb].to_vec())
                    .collect();
                assert_bytes(out, &want, &what);
            }
            Func::GATHER if me == self.root => {
                assert_bytes(out, &all().concat(), &what);
            }
            Func::GATHER => assert!(out.is_empty(), "{what}"),
            Func::SCATTER => {
                let src = self.input(seed, self.root, n);
                assert_bytes(out, &src[me * eb..(me + 1) * eb], &what);
            }
            f => panic!("{f:?} is not a collective"),
        }
        0
    }
}

/// What the cases ran with, for the parent.
#[derive(Default)]
pub struct Tally {
    /// Calls per "Func algo proto".
    pub runs: BTreeMap<String, u64>,
    /// Collectives that needed more than one chunk loop at least once.
    pub multi_chunk: BTreeMap<String, u64>,
    /// Digest of every AllReduce result so far.
    pub allreduce: u64,
}

impl Tally {
    /// Adds an AllReduce result digest.
    pub fn add_digest(&mut self, d: u64) {
        self.allreduce = self.allreduce.rotate_left(5) ^ d;
    }

    /// Asserts every rank computed bit-identical AllReduce results (NCCL's guarantee:
    /// the final value is computed once and forwarded).
    pub fn agree(&self, comm: &Comm) {
        assert_same_everywhere(comm, self.allreduce, "AllReduce results");
    }
}

/// Checks a decision against a forced `(algo, proto)` and tallies it.
pub fn note(t: &mut Tally, c: &Case, n: usize, d: &Decision, forced: Option<(&str, &str)>) {
    let name = format!("{:?}", c.func);
    let key = format!(
        "{name} {} {}",
        d.algo.name().unwrap_or("?"),
        d.proto.name().unwrap_or("?")
    );
    *t.runs.entry(key).or_default() += 1;
    if !tuned(c.func) || n == 1 {
        return;
    }
    assert!(d.channels >= 1 && d.chunk >= 1, "{c:?}: {d:?}");
    let parts = if c.func == Func::ALL_REDUCE && d.algo == Algorithm::RING {
        n
    } else {
        1
    };
    if c.count * size(c.dtype) > d.channels * parts * d.chunk {
        *t.multi_chunk.entry(name).or_default() += 1;
    }
    if let Some((algo, proto)) = forced {
        let want_algo = if c.func == Func::ALL_REDUCE && algo.contains("tree") {
            Algorithm::TREE
        } else {
            Algorithm::RING
        };
        let want_proto = match proto {
            "LL" => Protocol::LL,
            "LL128" => Protocol::LL128,
            _ => Protocol::SIMPLE,
        };
        assert_eq!(
            (d.algo, d.proto),
            (want_algo, want_proto),
            "{c:?} ran with {d:?} under NCCL_ALGO={algo} NCCL_PROTO={proto}"
        );
    }
}
