//! Data-path checks on one connection: registration, transfers at many sizes, size
//! rules, grouped receives, the optional-completion sentinel, NULL-request retries.

use std::time::{Duration, Instant};

use super::flow::{RecvPost, Region, SendPost};
use super::setup::{self, Flow, OP_LIMIT, Ready, buffer, reg_recv, reg_send};
use crate::check::child::{Env, step};
use crate::check::rng::Rng;
use crate::check::{Checked, Stop, fail};
use cclkit_host::net::RecvBuffer;

/// A connected pair on a ready plugin.
fn open(env: &Env) -> Result<(Ready, Flow), Stop> {
    let r = Ready::for_data(env)?;
    let flow = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    Ok((r, flow))
}

/// regMr/deregMr on both comms: many sizes, unaligned starts, the same range twice,
/// release in another order than registration; registered buffers carry data.
pub(crate) fn regmr(env: &Env) -> Checked {
    let (_r, mut flow) = open(env)?;
    let mut rng = Rng::new(env.seed, 10);
    let sizes = [1usize, 7, 4096, 65_539, 1 << 20];
    let mut send_mrs = Vec::new();
    let mut recv_mrs = Vec::new();
    step("regMr of 1 B … 1 MiB at unaligned addresses on both comms");
    for &n in &sizes {
        let b = &mut buffer(n + 3)[3..];
        send_mrs.push(reg_send(&mut flow.send, b)?);
        let b = &mut buffer(n + 5)[5..];
        recv_mrs.push(reg_recv(&mut flow.recv, b)?);
    }
    step("regMr of one range twice");
    let twice = buffer(8192);
    send_mrs.push(reg_send(&mut flow.send, twice)?);
    send_mrs.push(reg_send(&mut flow.send, twice)?);
    let count = send_mrs.len() + recv_mrs.len();
    step("deregMr in shuffled order");
    while !send_mrs.is_empty() {
        let i = rng.range(0, send_mrs.len() - 1);
        flow.send.dereg_mr(send_mrs.swap_remove(i))?;
    }
    while let Some(m) = recv_mrs.pop() {
        flow.recv.dereg_mr(m)?;
    }
    step("transfer through fresh registrations");
    let data = rng.bytes(65_539);
    let (got, _, n) = setup::transfer(&mut flow, &data, data.len(), 0, false)?;
    if n != data.len() || got != data {
        return fail!("data sent from registered buffers arrived wrong ({n} bytes reported)");
    }
    flow.close()?;
    Ok(format!(
        "{count} registrations (1 B … 1 MiB, unaligned, one range twice) each released once; \
         registered buffers carried data"
    ))
}

/// The sizes `sendrecv` sends, capped by the device's maxP2pBytes.
fn size_list(max: usize) -> Vec<usize> {
    [
        0,
        1,
        2,
        3,
        7,
        8,
        63,
        64,
        127,
        128,
        129,
        1000,
        4095,
        4096,
        4097,
        8191,
        65_535,
        65_536,
        65_537,
        262_143,
        (1 << 20) + 13,
        (4 << 20) + 1,
    ]
    .into_iter()
    .filter(|&s| s <= max)
    .collect()
}

/// Random data at many sizes, one at a time (receive or send posted first), then
/// eight at once; contents and the sizes `test` reports must be exact.
pub(crate) fn sendrecv(env: &Env) -> Checked {
    let (r, mut flow) = open(env)?;
    let list = size_list(r.props.max_p2p_bytes);
    for (i, &len) in list.iter().enumerate() {
        step(format!("isend/irecv {len} B"));
        let data = Rng::new(env.seed, 100 + i as u64).bytes(len);
        let (got, sent, n) = if i % 2 == 0 {
            setup::transfer(&mut flow, &data, len, 1, false)?
        } else {
            send_first(&mut flow, &data)?
        };
        check_arrival(&data, &got, sent, n).map_err(|e| e.context(&format!("{len} B")))?;
    }
    step("8 transfers in flight at once, from one registered region per side");
    let mut rng = Rng::new(env.seed, 200);
    let lens: Vec<usize> = (0..8).map(|_| rng.range(0, 70_000)).collect();
    let total: usize = lens.iter().sum();
    let (mut sreg, smr) = Region::on_send(&mut flow.send, total)?;
    let (mut rreg, rmr) = Region::on_recv(&mut flow.recv, total)?;
    let mut datas = Vec::new();
    let (mut sends, mut recvs, mut rbufs) = (Vec::new(), Vec::new(), Vec::new());
    for &len in &lens {
        let data = rng.bytes(len);
        let sbuf = sreg.take(len);
        sbuf.copy_from_slice(&data);
        let rbuf = rreg.take(len);
        let rp = rbuf.as_mut_ptr();
        let rbuf: &'static [u8] = rbuf;
        recvs.push(RecvPost {
            bufs: vec![RecvBuffer {
                data: rp,
                size: len,
                tag: 1,
                mr: Some(&rmr),
            }],
            optional: false,
        });
        sends.push(SendPost {
            data: sbuf,
            tag: 1,
            mr: Some(&smr),
        });
        rbufs.push(rbuf);
        datas.push(data);
    }
    let tokens = flow.post(&recvs, &sends, OP_LIMIT)?;
    let done = flow.wait_ok(&tokens, OP_LIMIT)?;
    for (k, data) in datas.iter().enumerate() {
        let n = done[k].first().copied().unwrap_or(0);
        let sent = done[8 + k].first().copied().unwrap_or(0);
        check_arrival(data, rbufs[k], sent, n)
            .map_err(|e| e.context(&format!("transfer {k} of 8 in flight ({} B)", data.len())))?;
    }
    drop((recvs, sends));
    flow.send.dereg_mr(smr)?;
    flow.recv.dereg_mr(rmr)?;
    for (len, room) in [(1000usize, 4096usize), (0, 64), (65_537, 1 << 20)] {
        step(format!("{len} B into a {room}-byte receive"));
        let data = rng.bytes(len);
        let (got, _, n) = setup::transfer(&mut flow, &data, room, 2, false)?;
        if n != len {
            return fail!(
                "a {len}-byte send into a {room}-byte receive reported {n} bytes ({SIZE_USE})"
            );
        }
        if got[..len] != data[..] {
            return fail!("a {len}-byte send into a {room}-byte receive arrived corrupted");
        }
    }
    flow.close()?;
    Ok(format!(
        "{} sizes from 0 B to {} B, then 8 in flight at once, then 3 into larger receives: \
         contents and reported sizes exact",
        list.len(),
        list.last().copied().unwrap_or(0)
    ))
}

/// Posts the send before the receive.
fn send_first(flow: &mut Flow, data: &[u8]) -> Result<(Vec<u8>, usize, usize), Stop> {
    let sbuf = buffer(data.len());
    sbuf.copy_from_slice(data);
    let rbuf = buffer(data.len());
    rbuf.fill(0x5A);
    let smr = reg_send(&mut flow.send, sbuf)?;
    let rmr = reg_recv(&mut flow.recv, rbuf)?;
    let st = flow.isend(sbuf, 1, Some(&smr), OP_LIMIT)?;
    let rt = flow.irecv(
        &[RecvBuffer {
            data: rbuf.as_mut_ptr(),
            size: rbuf.len(),
            tag: 1,
            mr: Some(&rmr),
        }],
        false,
        OP_LIMIT,
    )?;
    let done = flow.wait_ok(&[st, rt], OP_LIMIT)?;
    flow.send.dereg_mr(smr)?;
    flow.recv.dereg_mr(rmr)?;
    let sent = done[0].first().copied().unwrap_or(0);
    let n = done[1].first().copied().unwrap_or(0);
    Ok((rbuf.to_vec(), sent, n))
}

/// What NCCL does with the size a receive's `test()` reports (`src/transport/net.cc`
/// receive proxy), said with every wrong size.
const SIZE_USE: &str = "NCCL uses the received size only for profiler events and to decide \
     whether a GPU receive needs iflush: a wrong size misreports the profile or skips the \
     flush on GPU memory; cclkit perf warns once per connection and CCLKIT_STRICT=1 fails";

/// Checks contents and sizes of one arrival (a send may leave its size unwritten: 0).
fn check_arrival(data: &[u8], got: &[u8], sent: usize, n: usize) -> Result<(), Stop> {
    if n != data.len() {
        return fail!(
            "test() reported {n} bytes received for a {}-byte send ({SIZE_USE})",
            data.len()
        );
    }
    if sent != data.len() && sent != 0 {
        return fail!(
            "test() reported {sent} bytes sent for a {}-byte send",
            data.len()
        );
    }
    if let Some(i) = data.iter().zip(got).position(|(a, b)| a != b) {
        return fail!(
            "received bytes differ from the sent ones from offset {i} (sent {:#04x}, got {:#04x})",
            data[i],
            got[i]
        );
    }
    Ok(())
}

/// Probe: a receive smaller than the send must fail (NCCL: "message truncated"),
/// never succeed or hang. NCCL never posts one, so this only warns.
pub(crate) fn sizes(env: &Env) -> Checked {
    let (_r, mut flow) = open(env)?;
    let mut rng = Rng::new(env.seed, 300);
    let (len, room) = (4096usize, 1024usize);
    step(format!("{len} B into a {room}-byte receive (must fail)"));
    let sbuf = buffer(len);
    sbuf.copy_from_slice(&rng.bytes(len));
    let rbuf = buffer(room);
    let smr = reg_send(&mut flow.send, sbuf)?;
    let rmr = reg_recv(&mut flow.recv, rbuf)?;
    let recvs = [RecvPost {
        bufs: vec![RecvBuffer {
            data: rbuf.as_mut_ptr(),
            size: room,
            tag: 2,
            mr: Some(&rmr),
        }],
        optional: false,
    }];
    let sends = [SendPost {
        data: sbuf,
        tag: 2,
        mr: Some(&smr),
    }];
    let (rt, st) = match flow.post(&recvs, &sends, OP_LIMIT) {
        Ok(t) => (t[0], t[1]),
        Err(Stop::Fail(e)) => {
            return Ok(format!("the smaller receive or its send was refused: {e}"));
        }
        Err(s) => return Err(s),
    };
    let deadline = Instant::now() + OP_LIMIT;
    let (mut recv_end, mut send_end) = (None, None);
    loop {
        flow.progress()?;
        recv_end = recv_end.or_else(|| flow.take(rt));
        send_end = send_end.or_else(|| flow.take(st));
        let err = recv_end
            .as_ref()
            .and_then(|d| d.as_ref().err())
            .or_else(|| send_end.as_ref().and_then(|d| d.as_ref().err()));
        if let Some(e) = err {
            let _ = flow.close();
            return Ok(format!("{len} B into a {room}-byte receive failed: {e}"));
        }
        if let (Some(Ok(rs)), Some(Ok(_))) = (&recv_end, &send_end) {
            return fail!(
                "a {len}-byte send into a {room}-byte receive completed without error (the \
                 receive reported {} bytes): the plugin must fail the receive (NCCL: \"message \
                 truncated\"), not cut the data silently",
                rs.first().copied().unwrap_or(0)
            );
        }
        if Instant::now() > deadline {
            return fail!(
                "a {len}-byte send into a {room}-byte receive neither failed nor completed within \
                 {} s (receive {}, send {})",
                OP_LIMIT.as_secs(),
                if recv_end.is_some() {
                    "completed"
                } else {
                    "pending"
                },
                if send_end.is_some() {
                    "completed"
                } else {
                    "pending"
                }
            );
        }
        std::thread::yield_now();
    }
}

/// Grouped receives of maxRecvs buffers; sends in shuffled tag order must land in
/// the buffer with their tag, with per-buffer sizes.
pub(crate) fn grouped(env: &Env) -> Checked {
    let r = Ready::for_data(env)?;
    let n = r.max_recvs();
    if n < 2 {
        return Err(Stop::Skip(format!(
            "maxRecvs = {}: the plugin takes one buffer per irecv",
            r.props.max_recvs
        )));
    }
    let mut flow = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    let mut rng = Rng::new(env.seed, 400);
    let (mut sreg, smr) = Region::on_send(&mut flow.send, 3 * n * 40_000)?;
    let (mut rreg, rmr) = Region::on_recv(&mut flow.recv, 3 * n * 40_000)?;
    let rounds = [n, 2, n];
    for (round, &k) in rounds.iter().enumerate() {
        step(format!("grouped receive of {k} buffers (round {round})"));
        let tags: Vec<i32> = (0..k).map(|i| 100 + 3 * i as i32).collect();
        let rooms: Vec<usize> = (0..k).map(|_| rng.range(1, 40_000)).collect();
        let rbufs: Vec<&'static mut [u8]> = rooms.iter().map(|&s| rreg.take(s)).collect();
        let mut descs = Vec::new();
        for (i, b) in rbufs.iter().enumerate() {
            descs.push(RecvBuffer {
                data: b.as_ptr().cast_mut(),
                size: b.len(),
                tag: tags[i],
                mr: Some(&rmr),
            });
        }
        // Sends in a shuffled tag order are an order NCCL produces. A grouped receive
        // exists only with maxRecvs > 1 and NCCL_NET_SHARED_COMMS (net.cc
        // `recvProxyConnect` shares one recvComm per remote proxy rank;
        // `recvProxyProgress` groups the subs on it, tag = each sub's tpRemoteRank).
        // The sends arrive over one shared sendComm (`sendProxyConnect` shares it per
        // remote rank) from different local ranks' queues, and `sendProxyProgress`
        // posts each `isend` (tag = its tpRank) as soon as that rank's GPU data is
        // ready, so any tag order within a group can occur; NCCL's IB transport
        // matches each send against every entry of the group by tag (`ncclIbIsend`).
        let order = rng.permutation(k);
        let mut sent = vec![Vec::new(); k];
        let mut posts = Vec::new();
        for &i in &order {
            let len = rng.range(0, rooms[i]);
            let data = rng.bytes(len);
            let sbuf = sreg.take(len);
            sbuf.copy_from_slice(&data);
            posts.push(SendPost {
                data: sbuf,
                tag: tags[i],
                mr: Some(&smr),
            });
            sent[i] = data;
        }
        let group = [RecvPost {
            bufs: descs,
            optional: false,
        }];
        let tokens = flow.post(&group, &posts, OP_LIMIT)?;
        let done = flow.wait_ok(&tokens, OP_LIMIT)?;
        let sizes = &done[0];
        if sizes.len() != k {
            return fail!(
                "test() of a {k}-buffer receive reported {} sizes",
                sizes.len()
            );
        }
        for i in 0..k {
            if sizes[i] != sent[i].len() {
                return fail!(
                    "round {round}: buffer {i} (tag {}) reported {} bytes, its send had {} \
                     (sends were posted in tag order {:?})",
                    tags[i],
                    sizes[i],
                    sent[i].len(),
                    order.iter().map(|&j| tags[j]).collect::<Vec<_>>()
                );
            }
            if rbufs[i][..sent[i].len()] != sent[i][..] {
                return fail!(
                    "round {round}: buffer {i} (tag {}) does not hold the data of the send with \
                     its tag",
                    tags[i]
                );
            }
        }
    }
    flow.send.dereg_mr(smr)?;
    flow.recv.dereg_mr(rmr)?;
    flow.close()?;
    Ok(format!(
        "receives of {n}, 2 and {n} buffers; sends in shuffled tag order each landed in the \
         buffer with its tag, with its own size"
    ))
}

/// v9+: receives posted with `*request` = NCCL_NET_OPTIONAL_RECV_COMPLETION get a
/// real request (the adapter refuses a sentinel left in place).
pub(crate) fn optional_completion(env: &Env) -> Checked {
    if env.version < 9 {
        return Err(Stop::Skip(format!(
            "net v{} never sees the sentinel (NCCL's v6-v8 shims clear it)",
            env.version
        )));
    }
    let (_r, mut flow) = open(env)?;
    let mut rng = Rng::new(env.seed, 500);
    for i in 0..8 {
        let len = [8usize, 64, 128, 1024, 4096, 1, 0, 129][i];
        step(format!("irecv with the sentinel in *request ({len} B)"));
        let data = rng.bytes(len);
        let (got, _, n) = setup::transfer(&mut flow, &data, len, 3, true)?;
        check_arrival(&data, &got, 0, n).map_err(|e| e.context(&format!("{len} B")))?;
    }
    flow.close()?;
    Ok(
        "8 receives posted with *request = NCCL_NET_OPTIONAL_RECV_COMPLETION each got a real \
        request and their data"
            .into(),
    )
}

/// A send posted before its receive may return NULL ("not now"); retried, it must
/// arrive exactly once and in order.
pub(crate) fn null_retry(env: &Env) -> Checked {
    let (_r, mut flow) = open(env)?;
    let mut rng = Rng::new(env.seed, 600);
    let m1 = rng.bytes(3000);
    let m2 = rng.bytes(5000);
    let (s1buf, s2buf) = (buffer(m1.len()), buffer(m2.len()));
    s1buf.copy_from_slice(&m1);
    s2buf.copy_from_slice(&m2);
    let (r1, r2) = (buffer(8192), buffer(8192));
    let (sm1, sm2) = (
        reg_send(&mut flow.send, s1buf)?,
        reg_send(&mut flow.send, s2buf)?,
    );
    let (rm1, rm2) = (reg_recv(&mut flow.recv, r1)?, reg_recv(&mut flow.recv, r2)?);
    step("isend before any receive is posted");
    let mut s1 = None;
    let t0 = Instant::now();
    while s1.is_none() && t0.elapsed() < Duration::from_millis(500) {
        s1 = flow.try_isend(s1buf, 4, Some(&sm1))?;
        std::thread::yield_now();
    }
    let early_nulls = flow.null_sends;
    let desc = |b: &mut [u8], mr| RecvBuffer {
        data: b.as_mut_ptr(),
        size: b.len(),
        tag: 4,
        mr: Some(mr),
    };
    step("irecv, and retry the first isend until posted");
    let d1 = [RecvPost {
        bufs: vec![desc(r1, &rm1)],
        optional: false,
    }];
    let retry = [SendPost {
        data: s1buf,
        tag: 4,
        mr: Some(&sm1),
    }];
    let posted = flow.post(&d1, &retry[..usize::from(s1.is_none())], OP_LIMIT)?;
    let rt1 = posted[0];
    let st1 = match s1 {
        Some(t) => t,
        None => posted[1],
    };
    step("second message");
    let d2 = [RecvPost {
        bufs: vec![desc(r2, &rm2)],
        optional: false,
    }];
    let second = [SendPost {
        data: s2buf,
        tag: 4,
        mr: Some(&sm2),
    }];
    let posted = flow.post(&d2, &second, OP_LIMIT)?;
    let (rt2, st2) = (posted[0], posted[1]);
    let done = flow.wait_ok(&[st1, rt1, st2, rt2], OP_LIMIT)?;
    let (n1, n2) = (
        done[1].first().copied().unwrap_or(0),
        done[3].first().copied().unwrap_or(0),
    );
    if n2 == m1.len() && r2[..m1.len()] == m1[..] {
        return fail!(
            "the second receive got the first message again: an isend that returned a NULL \
             request must not have sent anything (NCCL posts it again)"
        );
    }
    if n1 != m1.len() || r1[..m1.len()] != m1[..] {
        return fail!("the first message arrived wrong ({n1} bytes reported)");
    }
    if n2 != m2.len() || r2[..m2.len()] != m2[..] {
        return fail!("the second message arrived wrong ({n2} bytes reported)");
    }
    let all_nulls = flow.null_sends;
    drop((d1, d2));
    flow.send.dereg_mr(sm1)?;
    flow.send.dereg_mr(sm2)?;
    flow.recv.dereg_mr(rm1)?;
    flow.recv.dereg_mr(rm2)?;
    flow.close()?;
    Ok(format!(
        "a send posted before its receive ({early_nulls} NULL returns before the receive, \
         {all_nulls} in all) arrived once, then the next in order"
    ))
}
