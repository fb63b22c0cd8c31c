//! AllReduce `PAT`: log-step schedules on channel 0's point-to-point links, for the
//! sizes where a ring's 2(n−1) sequential steps cost more than the data does.
//!
//! * [`doubling`]: recursive doubling, log2 p rounds exchanging the whole partial
//!   result (latency-bound sizes, below one slice: it must fit a FIFO).
//! * [`halving_doubling`]: recursive halving (reduce-scatter) then recursive
//!   doubling (all-gather), Rabenseifner's algorithm: a ring's volume in 2·log2 p
//!   steps; transfers are cut into pieces of at most half a FIFO.
//!
//! p is the largest power of two ≤ n; rank `p + i` first hands its input to rank
//! `i` and gets the result back at the end. Each returns the primitives that read
//! this rank's own input (run with the op's reduction: pre-op applied), those that
//! only combine partial results (run without it), and the peers.
//!
//! Every rank ends with the same bits, as with a ring: in doubling, a round computes
//! `mine ⊕ theirs` on one side and `theirs ⊕ mine` on the other, equal for every
//! (commutative) op; in halving-doubling each element is reduced by one rank only
//! and copied to the others.

use crate::schedule::{Buffer, Combine, Link, LinkClass, Prim, Span};

/// Primitives with the op's reduction, primitives without the pre-op, and peers.
pub type Parts = (Vec<Prim>, Vec<Prim>, Vec<usize>);

fn link(peer: usize) -> Link {
    Link {
        peer,
        channel: 0,
        class: LinkClass::P2p,
    }
}

/// `len` bytes at byte `off`: from `src`, and/or received from `recv`, combined,
/// written to `dst` and/or sent to `send`.
fn prim(
    len: usize,
    recv: Option<usize>,
    send: Option<usize>,
    src: Option<(Buffer, usize)>,
    dst: Option<(Buffer, usize)>,
    combine: Combine,
) -> Prim {
    Prim {
        len,
        recv: recv.map(link).into_iter().collect(),
        send: send.map(link).into_iter().collect(),
        src: src.map(|(buf, offset)| Span { buf, offset }),
        dst: dst.map(|(buf, offset)| Span { buf, offset }),
        combine,
        direct: false,
    }
}

/// `p` on NCCL's direct paths (see [`Prim::direct`]).
fn direct(mut p: Prim) -> Prim {
    p.direct = true;
    p
}

/// Largest power of two ≤ `n` (`n` ≥ 1).
fn pow2_floor(n: usize) -> usize {
    1usize << (usize::BITS - 1 - n.max(1).leading_zeros())
}

/// The ranks beyond p: send the input to rank `me - p`, receive the result.
fn extra_rank(me: usize, p: usize, bytes: usize) -> Parts {
    let q = me - p;
    let first = vec![prim(
        bytes,
        None,
        Some(q),
        Some((Buffer::Send, 0)),
        None,
        Combine::Copy { pre: true },
    )];
    let rest = vec![prim(
        bytes,
        Some(q),
        None,
        None,
        Some((Buffer::Recv, 0)),
        Combine::Copy { pre: false },
    )];
    (first, rest, vec![q])
}

/// Rank `me < n - p` folds in rank `me + p`'s input (into the receive buffer).
fn fold_extra(me: usize, p: usize, bytes: usize) -> Prim {
    prim(
        bytes,
        Some(me + p),
        None,
        Some((Buffer::Send, 0)),
        Some((Buffer::Recv, 0)),
        Combine::Reduce { finish: false },
    )
}

/// Recursive doubling (see the module docs); `bytes` must fit a FIFO.
pub fn doubling(me: usize, n: usize, bytes: usize) -> Parts {
    let (mut first, mut rest, mut peers) = (Vec::new(), Vec::new(), Vec::new());
    if bytes == 0 || n < 2 {
        return (first, rest, peers);
    }
    let p = pow2_floor(n);
    let rem = n - p;
    if me >= p {
        return extra_rank(me, p, bytes);
    }
    // Until its first fold, this rank's partial result is its input (send buffer);
    // afterwards it lives in the receive buffer.
    let mut folded = false;
    if me < rem {
        first.push(fold_extra(me, p, bytes));
        peers.push(me + p);
        folded = true;
    }
    let rounds = p.trailing_zeros();
    for k in 0..rounds {
        let q = me ^ (1 << k);
        peers.push(q);
        let (part, acc) = if folded {
            (&mut rest, Buffer::Recv)
        } else {
            (&mut first, Buffer::Send)
        };
        part.push(prim(
            bytes,
            None,
            Some(q),
            Some((acc, 0)),
            None,
            Combine::Copy { pre: !folded },
        ));
        part.push(prim(
            bytes,
            Some(q),
            None,
            Some((acc, 0)),
            Some((Buffer::Recv, 0)),
            Combine::Reduce {
                finish: k + 1 == rounds,
            },
        ));
        folded = true;
    }
    if me < rem {
        rest.push(prim(
            bytes,
            None,
            Some(me + p),
            Some((Buffer::Recv, 0)),
            None,
            Combine::Copy { pre: false },
        ));
    }
    (first, rest, peers)
}

/// Splits `[at, at + len)` into pieces of at most `piece` bytes.
fn pieces(at: usize, len: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len.div_ceil(piece.max(1))).map(move |i| {
        let off = i * piece;
        (at + off, piece.min(len - off))
    })
}

/// Recursive halving then doubling (see the module docs): `elem`-byte elements,
/// transfers of at most `piece` bytes (a multiple of `elem`).
pub fn halving_doubling(me: usize, n: usize, bytes: usize, elem: usize, piece: usize) -> Parts {
    let (mut first, mut rest, mut peers) = (Vec::new(), Vec::new(), Vec::new());
    if bytes == 0 || n < 2 {
        return (first, rest, peers);
    }
    let p = pow2_floor(n);
    let rem = n - p;
    if me >= p {
        return extra_rank(me, p, bytes);
    }
    let mut folded = false;
    if me < rem {
        first.push(fold_extra(me, p, bytes));
        peers.push(me + p);
        folded = true;
    }
    let count = bytes / elem;
    let rounds = p.trailing_zeros();
    // Reduce-scatter: halve the window [lo, hi) (elements) at every step; the
    // partner (same window) keeps the other half. Both sides cut at the same mid.
    let (mut lo, mut hi) = (0usize, count);
    let mut steps = Vec::with_capacity(rounds as usize);
    for k in 0..rounds {
        let d = p >> (k + 1);
        let q = me ^ d;
        peers.push(q);
        let mid = lo + (hi - lo) / 2;
        let lower = me & d == 0;
        let (keep, give) = if lower {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let (part, acc) = if folded {
            (&mut rest, Buffer::Recv)
        } else {
            (&mut first, Buffer::Send)
        };
        let last = k + 1 == rounds;
        // Equal halves, or the lower one is shorter: pair the i-th piece of what we
        // give with the i-th piece of what we keep (the partner does the mirror), so
        // each side sends one piece, then receives one.
        let give_pieces: Vec<_> = pieces(give.0 * elem, (give.1 - give.0) * elem, piece).collect();
        let keep_pieces: Vec<_> = pieces(keep.0 * elem, (keep.1 - keep.0) * elem, piece).collect();
        for i in 0..give_pieces.len().max(keep_pieces.len()) {
            if let Some(&(off, len)) = give_pieces.get(i) {
                part.push(prim(
                    len,
                    None,
                    Some(q),
                    Some((acc, off)),
                    None,
                    Combine::Copy { pre: !folded },
                ));
            }
            if let Some(&(off, len)) = keep_pieces.get(i) {
                part.push(prim(
                    len,
                    Some(q),
                    None,
                    Some((acc, off)),
                    Some((Buffer::Recv, off)),
                    Combine::Reduce { finish: last },
                ));
            }
        }
        steps.push((q, keep, give));
        (lo, hi) = keep;
        folded = true;
    }
    // All-gather: undo the halving, sending what this rank holds and receiving the
    // partner's half of the same window. Direct: what a round sends is final and
    // never written again, and what it receives is written once, by the partner's
    // result, which can only come after the partner got this rank's share of it.
    for &(q, have, want) in steps.iter().rev() {
        let send: Vec<_> = pieces(have.0 * elem, (have.1 - have.0) * elem, piece).collect();
        let recv: Vec<_> = pieces(want.0 * elem, (want.1 - want.0) * elem, piece).collect();
        for i in 0..send.len().max(recv.len()) {
            if let Some(&(off, len)) = send.get(i) {
                rest.push(direct(prim(
                    len,
                    None,
                    Some(q),
                    Some((Buffer::Recv, off)),
                    None,
                    Combine::Copy { pre: false },
                )));
            }
            if let Some(&(off, len)) = recv.get(i) {
                rest.push(direct(prim(
                    len,
                    Some(q),
                    None,
                    None,
                    Some((Buffer::Recv, off)),
                    Combine::Copy { pre: false },
                )));
            }
        }
    }
    if me < rem {
        rest.push(prim(
            bytes,
            None,
            Some(me + p),
            Some((Buffer::Recv, 0)),
            None,
            Combine::Copy { pre: false },
        ));
    }
    first.retain(|x| x.len > 0);
    rest.retain(|x| x.len > 0);
    (first, rest, peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes each rank sends to each peer equal what that peer receives from it, in
    /// the same order and sizes (what the engine needs to match slices).
    fn check_matching(n: usize, bytes: usize, elem: usize, piece: usize) {
        let plans: Vec<Vec<Prim>> = (0..n)
            .map(|me| {
                let (a, b, _) = halving_doubling(me, n, bytes, elem, piece);
                a.into_iter().chain(b).collect()
            })
            .collect();
        for a in 0..n {
            for b in 0..n {
                let sent: Vec<usize> = plans[a]
                    .iter()
                    .filter(|x| x.send.iter().any(|l| l.peer == b))
                    .map(|x| x.len)
                    .collect();
                let got: Vec<usize> = plans[b]
                    .iter()
                    .filter(|x| x.recv.iter().any(|l| l.peer == a))
                    .map(|x| x.len)
                    .collect();
                assert_eq!(sent, got, "n {n} bytes {bytes}: {a} -> {b}");
                if a < pow2_floor(n) && b < pow2_floor(n) {
                    assert!(sent.iter().all(|&l| l <= piece), "n {n}: pieces {sent:?}");
                }
            }
        }
    }

    #[test]
    fn halving_doubling_transfers_match_pairwise() {
        for n in [2, 3, 4, 5, 7, 8] {
            for bytes in [4, 12, 100, 4096, 1 << 20] {
                check_matching(n, bytes, 4, 64 << 10);
                check_matching(n, bytes, 4, 16);
            }
        }
    }

    #[test]
    fn halving_doubling_direct_bytes_are_not_written_later() {
        // `first` and `rest` run in this order on channel 0; in place the input is
        // the output.
        let mut checked = 0;
        for n in 2..=8 {
            for me in 0..n {
                let (a, b, _) = halving_doubling(me, n, 4 * 37, 4, 12);
                let plan = vec![a.into_iter().chain(b).collect::<Vec<_>>()];
                checked += crate::schedule::tests::check_direct(&plan, None);
                checked += crate::schedule::tests::check_direct(&plan, Some(0));
            }
        }
        assert!(checked > 100, "only {checked} direct primitives checked");
    }

    #[test]
    fn halving_doubling_covers_every_byte_once_per_phase() {
        // After the reduce-scatter each byte is owned (finished) by exactly one of
        // the p ranks; the all-gather then writes every byte not owned.
        for n in [2, 4, 8] {
            let bytes = 4 * 37;
            let mut owned = vec![0u32; bytes];
            for me in 0..n {
                let (a, b, _) = halving_doubling(me, n, bytes, 4, 12);
                let mut written = vec![false; bytes];
                for x in a.iter().chain(&b) {
                    if let (Combine::Reduce { finish: true }, Some(d)) = (x.combine, x.dst) {
                        owned[d.offset..d.offset + x.len]
                            .iter_mut()
                            .for_each(|o| *o += 1);
                        written[d.offset..d.offset + x.len]
                            .iter_mut()
                            .for_each(|w| *w = true);
                    }
                    if let (Combine::Copy { .. }, Some(d), false) =
                        (x.combine, x.dst, x.recv.is_empty())
                    {
                        written[d.offset..d.offset + x.len]
                            .iter_mut()
                            .for_each(|w| *w = true);
                    }
                }
                assert!(written.iter().all(|&w| w), "n {n} rank {me}");
            }
            assert!(owned.iter().all(|&o| o == 1), "n {n}: {owned:?}");
        }
    }
}
