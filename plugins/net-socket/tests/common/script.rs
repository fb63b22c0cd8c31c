//! A symmetric exchange both ends run: each sends a list of messages and posts the
//! matching (possibly grouped) receives, keeping up to 32 of each in flight, testing
//! every request round-robin as NCCL's proxy does, and checking every byte.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use super::{Plugin, Ptr, pattern};

/// One grouped receive: the messages it takes, in buffer order, and the order the
/// sender posts them in (tags pick the buffer).
#[derive(Debug, Clone)]
pub struct Group {
    /// `(len, tag)` per buffer.
    pub msgs: Vec<(usize, c_int)>,
    /// Send order (a permutation of buffer indices).
    pub order: Vec<usize>,
}

/// Plain receives of `sizes`, one message each (tag 0).
pub fn singles(sizes: &[usize]) -> Vec<Group> {
    sizes
        .iter()
        .map(|&len| Group {
            msgs: vec![(len, 0)],
            order: vec![0],
        })
        .collect()
}

/// `count` grouped receives of `n` buffers with tags 0..n, sent in a rotated,
/// reversed order so each message must find its buffer by tag.
pub fn grouped(count: usize, n: usize, seed: u64) -> Vec<Group> {
    (0..count)
        .map(|g| {
            let msgs = (0..n)
                .map(|i| {
                    let len = match (seed as usize + g * 7 + i * 3) % 4 {
                        0 => 0,
                        1 => 13 + i,
                        2 => 70_000 + 4097 * i,
                        _ => 1 << 20,
                    };
                    (len, (i * 10) as c_int)
                })
                .collect();
            let mut order: Vec<usize> = (0..n).rev().collect();
            order.rotate_left(g % n);
            Group { msgs, order }
        })
        .collect()
}

struct RecvOp {
    req: Ptr,
    group: usize,
    bufs: Vec<Vec<u8>>,
    mhs: Vec<Ptr>,
}

struct SendOp {
    req: Ptr,
    len: usize,
    _buf: Vec<u8>,
}

/// Slack after each receive buffer, filled with a canary the plugin must not touch.
const SLACK: usize = 13;
const CANARY: u8 = 0xEE;

/// Runs the exchange: sends `plan` to the peer and receives the peer's `plan`.
/// Pattern ids: `(side << 32) + group * 8 + buffer`.
#[allow(clippy::too_many_arguments)]
pub fn exchange(
    p: &Plugin,
    send: Ptr,
    recv: Ptr,
    plan: &[Group],
    seed: u64,
    me: u64,
    peer: u64,
    window: usize,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    let sends: Vec<(usize, usize)> = plan
        .iter()
        .enumerate()
        .flat_map(|(g, grp)| grp.order.iter().map(move |&i| (g, i)))
        .collect();
    let (mut next_recv, mut next_send) = (0, 0);
    let mut recvs: Vec<RecvOp> = Vec::new();
    let mut sent: Vec<SendOp> = Vec::new();
    let mut done_recv = 0;
    while done_recv < plan.len() || next_send < sends.len() || !sent.is_empty() {
        assert!(
            Instant::now() < deadline,
            "exchange stuck: {done_recv}/{} receives, {next_send}/{} sends posted, {} sends pending",
            plan.len(),
            sends.len(),
            sent.len()
        );
        while next_recv < plan.len() && recvs.len() < window {
            let grp = &plan[next_recv];
            let mut bufs: Vec<Vec<u8>> = grp
                .msgs
                .iter()
                .map(|&(len, _)| vec![CANARY; len + SLACK])
                .collect();
            let spec: Vec<(*mut u8, usize)> =
                bufs.iter_mut().map(|b| (b.as_mut_ptr(), b.len())).collect();
            let tags: Vec<c_int> = grp.msgs.iter().map(|m| m.1).collect();
            let mhs: Vec<Ptr> = bufs
                .iter_mut()
                .map(|b| {
                    p.reg_mr(recv, b.as_mut_ptr(), b.len(), super::PTR_HOST)
                        .expect("regMr")
                })
                .collect();
            // SAFETY: the buffers live in `recvs` until the request completes.
            let req = unsafe { p.irecv(recv, &spec, &tags, &mhs) }.expect("irecv");
            if req.is_null() {
                for mh in mhs {
                    p.dereg_mr(recv, mh);
                }
                break;
            }
            recvs.push(RecvOp {
                req,
                group: next_recv,
                bufs,
                mhs,
            });
            next_recv += 1;
        }
        while next_send < sends.len() && sent.len() < window {
            let (g, i) = sends[next_send];
            let (len, tag) = plan[g].msgs[i];
            let mut buf = pattern(seed, (me << 32) + (g * 8 + i) as u64, len);
            // SAFETY: the buffer lives in `sent` until the request completes.
            let req = unsafe { p.isend(send, buf.as_mut_ptr(), len, tag, std::ptr::null_mut()) }
                .expect("isend");
            if req.is_null() {
                break; // grouped mode: the peer's receive is not posted yet
            }
            sent.push(SendOp {
                req,
                len,
                _buf: buf,
            });
            next_send += 1;
        }
        sent.retain(|s| {
            let mut size = [0 as c_int; 1];
            match p.test(s.req, &mut size) {
                Ok(true) => {
                    assert_eq!(size[0] as usize, s.len, "send size");
                    false
                }
                Ok(false) => true,
                Err(e) => panic!("send of {} bytes failed: {e:?}", s.len),
            }
        });
        recvs.retain(|r| {
            let mut sizes = [0 as c_int; 64];
            match p.test(r.req, &mut sizes) {
                Ok(true) => {
                    for (i, &(len, _)) in plan[r.group].msgs.iter().enumerate() {
                        assert_eq!(
                            sizes[i] as usize, len,
                            "size of group {} buffer {i}",
                            r.group
                        );
                        let want = pattern(seed, (peer << 32) + (r.group * 8 + i) as u64, len);
                        let got = &r.bufs[i];
                        assert!(
                            got[..len] == want[..],
                            "data of group {} buffer {i} ({len} bytes) differs",
                            r.group
                        );
                        assert!(
                            got[len..].iter().all(|&b| b == CANARY),
                            "bytes past the message were written"
                        );
                    }
                    for &mh in &r.mhs {
                        p.dereg_mr(recv, mh);
                    }
                    done_recv += 1;
                    false
                }
                Ok(false) => true,
                Err(e) => panic!("receive of group {} failed: {e:?}", r.group),
            }
        });
    }
}
