//! The scenarios the tests and the benchmark run.

use std::time::{Duration, Instant};

use cclkit_abi::net::{InitArgs, Net as _};
use cclkit_host::net::{RecvBuffer, Request};
use cclkit_net_ofi::OfiNet;

use crate::flows::{
    self, Link, Msg, check_deadline, fin, join, link, recv_all, say, send_all, wait,
};
use crate::net::{Abi, Net, R, Side, err};
use crate::pattern::{Rng, shuffle};
use crate::stream::PluginStream;

/// Sizes every transfer covers: empty, tiny, odd, page-1, 64 KiB + 3, 4 MiB + 5.
const SIZES: [usize; 6] = [0, 1, 7, 4095, 65536 + 3, 4 * 1024 * 1024 + 5];
/// NCCL_NET_MAX_REQUESTS.
const WINDOW: usize = 32;

fn messages(seed: u64, rounds: usize) -> Vec<Msg> {
    let mut sizes: Vec<usize> = (0..rounds).flat_map(|_| SIZES).collect();
    shuffle(&mut sizes, &mut Rng::new(seed));
    sizes
        .into_iter()
        .enumerate()
        .map(|(i, size)| Msg {
            id: i as u64,
            size,
            tag: (i % 5) as i32 - 1,
        })
        .collect()
}

/// Grouped receives: distinct tags sent in another order than the buffers, and
/// repeated tags (the k-th send with a tag fills the k-th buffer with that tag).
fn groups(seed: u64) -> (Vec<Vec<Msg>>, Vec<Msg>) {
    let mut rng = Rng::new(seed ^ 0x6e0c);
    let mut recv = Vec::new();
    let mut send = Vec::new();
    for g in 0..8u64 {
        let buf: Vec<Msg> = (0..4u64)
            .map(|j| Msg {
                id: 10_000 + g * 4 + j,
                size: SIZES[rng.below(SIZES.len() - 1)] + j as usize,
                tag: 100 + (g * 4 + j) as i32,
            })
            .collect();
        let mut order = buf.clone();
        shuffle(&mut order, &mut rng);
        send.extend(order);
        recv.push(buf);
    }
    for g in 0..4u64 {
        let buf: Vec<Msg> = (0..4u64)
            .map(|j| Msg {
                id: 20_000 + g * 4 + j,
                size: 1000 * (j as usize + 1) + g as usize,
                tag: 7,
            })
            .collect();
        send.extend(buf.iter().copied());
        recv.push(buf);
    }
    (recv, send)
}

/// Two-process transfer: random data at every size, 32 in flight, then grouped
/// receives when the device offers them; the receiver's `fin` ends it.
pub fn transfer(abi: Abi, sender: bool, seed: u64, rounds: usize) -> R<()> {
    let net = Net::init(abi)?;
    if net.devices()? < 1 {
        return Err("no devices".into());
    }
    let props = net.props(0)?;
    let mut link = link(net)?;
    let msgs = messages(seed, rounds);
    if sender {
        send_all(&mut link.send, seed, &msgs, WINDOW)?;
    } else {
        let single: Vec<Vec<Msg>> = msgs.iter().map(|m| vec![*m]).collect();
        recv_all(&mut link.recv, seed, &single, WINDOW)?;
    }
    if props.max_recvs >= 4 {
        let (recv, send) = groups(seed);
        if sender {
            send_all(&mut link.send, seed, &send, WINDOW)?;
        } else {
            recv_all(&mut link.recv, seed, &recv, WINDOW)?;
        }
    }
    fin(&mut link, !sender)?;
    say(&format!(
        "DEVICE {} maxRecvs {} speed {} ptrSupport {}",
        props.name, props.max_recvs, props.speed, props.ptr_support
    ));
    let b = cclkit_net_ofi::bundle_counts();
    say(&format!(
        "BUNDLED {} sends in {} bundles, {} early",
        b.records, b.bundles, b.early
    ));
    say(&format!(
        "SLOTS {} {} (bundles written into slots, sends alone for want of a slot)",
        b.written, b.singles
    ));
    let w = cclkit_net_ofi::write_counts();
    say(&format!(
        "WRITES {} {} {} {} (written, landed, offered, in range but not offered yet)",
        w.writes, w.landed, w.offers, w.missed
    ));
    flows::close(link)
}

/// One process connected to itself: both directions at once, a truncated
/// receive, MR re-registration, bundles (`bundles.rs`), writes (`writes.rs`),
/// and closing comms with requests in flight.
pub fn loopback(
    abi: Abi,
    seed: u64,
    truncate: bool,
    bundles: bool,
    writes: bool,
    large: bool,
) -> R<()> {
    // Buffers a request may still use when the comms close live past `flows::close`.
    let (mut big, mut small) = (vec![7u8; 10_000], vec![0u8; 100]);
    let mut pending = vec![0u8; 4096];
    let mut l = self_link(abi)?;
    let msgs = messages(seed, 1);
    let single: Vec<Vec<Msg>> = msgs.iter().map(|m| vec![*m]).collect();
    interleave(&mut l, seed, &single, &msgs)?;
    crate::quiet::completed_tests_stay_quiet(&mut l, seed)?;
    many_comms(abi, seed)?;

    // The same buffer registered twice (MR cache) and freed twice.
    let mut buf = vec![0u8; 1 << 20];
    let half = buf.len() / 2;
    // SAFETY: `buf` outlives both registrations, released right below.
    let a = unsafe { Side::Send(&mut l.send).reg_mr(&mut buf) }?;
    // SAFETY: as above.
    let b = unsafe { Side::Recv(&mut l.recv).reg_mr(&mut buf[..half]) }?;
    l.send.dereg_mr(a).map_err(err)?;
    l.recv.dereg_mr(b).map_err(err)?;

    // Before the truncation, which breaks a tcp connection for good.
    if bundles {
        crate::bundles::check(&mut l, abi, seed)?;
    }
    // Bundles larger than a tagged one go into the receiver's slots, which
    // need both.
    if bundles && writes {
        crate::slots::check(&mut l, seed)?;
    }
    if writes {
        crate::writes::check(&mut l, abi, seed, large)?;
    }
    if truncate {
        truncation(&mut l, &mut big, &mut small)?;
    }

    // Requests left in flight when the comms close: closing must not hang or crash.
    let one = RecvBuffer {
        data: pending.as_mut_ptr(),
        size: pending.len(),
        tag: 42,
        mr: None,
    };
    // SAFETY: `pending` outlives the comms (closed below).
    let _never = unsafe { l.recv.irecv(&[one], false) }.map_err(err)?;
    flows::close(l)
}

/// A send larger than the posted receive must fail the receive, not hang.
/// (libfabric 1.17's shm provider spins forever inside `fi_cq_read` on a
/// truncated CMA transfer, so the tests run this on tcp only.)
/// `big` and `small` must outlive the link's comms (a send may still be in flight).
fn truncation(l: &mut Link, big: &mut [u8], small: &mut [u8]) -> R<()> {
    let one = RecvBuffer {
        data: small.as_mut_ptr(),
        size: small.len(),
        tag: 1,
        mr: None,
    };
    // SAFETY: both buffers outlive the comms (see above).
    let (r, mut send) = unsafe {
        (
            l.recv.irecv(&[one], false).map_err(err)?,
            l.send
                .isend(big.as_ptr(), big.len(), 1, None)
                .map_err(err)?,
        )
    };
    let mut r = r.ok_or("truncation: receive not accepted")?;
    let deadline = Instant::now() + flows::WAIT;
    let msg = loop {
        match l.recv.test(&mut r) {
            Err(e) => break e.to_string(),
            Ok(Some(sz)) => return Err(format!("truncated receive reported success ({sz:?})")),
            Ok(None) => {}
        }
        // The send may complete or fail (providers differ); either ends it.
        if let Some(q) = &mut send
            && !matches!(l.send.test(q), Ok(None))
        {
            send = None;
        }
        check_deadline(deadline, "truncation error")?;
    };
    say(&format!("TRUNCATED {msg}"));
    // A send still in flight stays with the endpoint until it closes.
    Ok(())
}

/// A connection pair from this process to itself (a communicator of its own on v12).
pub fn self_link(abi: Abi) -> R<Link> {
    let net = Net::init(abi)?;
    let (handle, listen) = net.listen(0)?;
    join(net, listen, handle)
}

/// Four comm pairs on the one endpoint, all busy at once with the same NCCL
/// tags: each comm's data must land only in that comm (per-comm tag space).
fn many_comms(abi: Abi, seed: u64) -> R<()> {
    let mut links = (0..4).map(|_| self_link(abi)).collect::<R<Vec<_>>>()?;
    let plans: Vec<(Vec<Vec<Msg>>, Vec<Msg>)> = (0..links.len() as u64)
        .map(|c| {
            let send: Vec<Msg> = (0..24u64)
                .map(|i| Msg {
                    id: 50_000 + c * 1000 + i,
                    size: [1, 4095, 65536 + 3][(i % 3) as usize],
                    tag: (i % 2) as i32,
                })
                .collect();
            (send.iter().map(|m| vec![*m]).collect(), send)
        })
        .collect();
    std::thread::scope(|s| {
        let runs: Vec<_> = links
            .iter_mut()
            .zip(&plans)
            .map(|(l, (recv, send))| s.spawn(move || interleave(l, seed, recv, send)))
            .collect();
        runs.into_iter()
            .map(|h| h.join().map_err(|_| "comm thread panicked".to_string())?)
            .collect::<R<Vec<()>>>()
    })?;
    links.into_iter().try_for_each(flows::close)
}

/// Posts `groups` receives and `msgs` sends on one link at the same time.
fn interleave(l: &mut Link, seed: u64, groups: &[Vec<Msg>], msgs: &[Msg]) -> R<()> {
    let Link { send, recv, .. } = l;
    std::thread::scope(|s| {
        // Separate comms on one endpoint: a second thread drives the send side, as
        // NCCL may call different comms from different threads.
        let sender = s.spawn(|| send_all(send, seed, msgs, WINDOW));
        let r = recv_all(recv, seed, groups, WINDOW);
        let t = sender
            .join()
            .map_err(|_| "send thread panicked".to_string())?;
        r.and(t)
    })
}

/// Peer death: the victim waits to be killed; the survivor must see its pending
/// receive and send fail soon after.
pub fn death(abi: Abi, victim: bool) -> R<()> {
    // Declared before the link: requests may use them until its comms are gone.
    let mut rbuf = vec![0u8; 1 << 20];
    let sbuf = vec![1u8; 8 << 20];
    let mut link = link(Net::init(abi)?)?;
    if victim {
        say("READY");
        // Block until killed (the parent closes stdin only if it gives up).
        let _ = flows::hear();
        return Err("victim was not killed".into());
    }
    let one = RecvBuffer {
        data: rbuf.as_mut_ptr(),
        size: rbuf.len(),
        tag: 5,
        mr: None,
    };
    // SAFETY: both buffers outlive the link (declared before it).
    let (r, s) = unsafe {
        (
            link.recv.irecv(&[one], false).map_err(err)?,
            link.send
                .isend(sbuf.as_ptr(), sbuf.len(), 5, None)
                .map_err(err)?,
        )
    };
    if r.is_none() || s.is_none() {
        return Err("requests not accepted".into());
    }
    say("WAITING");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut r, mut s) = (r, s);
    while r.is_some() || s.is_some() {
        watch("recv", Side::Recv(&mut link.recv), &mut r)?;
        watch("send", Side::Send(&mut link.send), &mut s)?;
        check_deadline(deadline, "peer death detection")?;
    }
    Ok(())
}

/// Tests a request to a dead peer once: its error is reported and ends it; success
/// is a failure of the scenario.
fn watch(name: &str, mut side: Side<'_>, req: &mut Option<Request>) -> R<()> {
    if let Some(q) = req {
        match side.test(q) {
            Ok(None) => {}
            Ok(Some(_)) => return Err(format!("{name} to a dead peer completed")),
            Err(e) => {
                say(&format!("PEER-ERROR {name}: {e}"));
                *req = None;
            }
        }
    }
    Ok(())
}

/// A live peer that makes no progress for a while must not be declared dead:
/// the `waiter` keeps a receive pending for `idle_ms` (liveness checks and pings
/// run meanwhile), then the `idler`, told `GO`, sends the data.
pub fn idle(abi: Abi, idler: bool, idle_ms: u64) -> R<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut link = link(Net::init(abi)?)?;
    if idler {
        say("READY");
        if flows::hear()? != "GO" {
            return Err("expected GO".into());
        }
        crate::pattern::fill(1, 1, &mut buf);
        // SAFETY: `buf` outlives the request, waited for right below.
        let s = unsafe { link.send.isend(buf.as_ptr(), buf.len(), 5, None) }
            .map_err(err)?
            .ok_or("send not accepted")?;
        wait(Side::Send(&mut link.send), s)?;
        fin(&mut link, false)?;
    } else {
        let one = RecvBuffer {
            data: buf.as_mut_ptr(),
            size: buf.len(),
            tag: 5,
            mr: None,
        };
        // SAFETY: `buf` outlives the request, tested to completion below.
        let mut r = unsafe { link.recv.irecv(&[one], false) }
            .map_err(err)?
            .ok_or("receive not accepted")?;
        let start = Instant::now();
        let mut told = false;
        let deadline = start + flows::WAIT;
        while link.recv.test(&mut r).map_err(err)?.is_none() {
            if !told && start.elapsed() >= Duration::from_millis(idle_ms) {
                say("IDLED");
                told = true;
            }
            check_deadline(deadline, "data after the idle period")?;
        }
        if !told {
            return Err("data arrived before the idle period ended".into());
        }
        if let Some(at) = crate::pattern::first_mismatch(1, 1, &buf) {
            return Err(format!("wrong byte at {at}"));
        }
        fin(&mut link, true)?;
    }
    flows::close(link)
}

/// Init with no usable provider: both tables must fail, and the error must name
/// the providers libfabric offered.
pub fn nodev() -> R<()> {
    if Net::init(Abi::V12).is_ok() {
        return Err("v12 init succeeded without a usable provider".into());
    }
    if Net::init(Abi::V8).is_ok() {
        return Err("v8 init succeeded without a usable provider".into());
    }
    match OfiNet::init(&InitArgs {
        host_abi: 12,
        profiler: cclkit_abi::profiler::net::NetProfiler::disabled(),
    }) {
        Ok(_) => Err("OfiNet::init succeeded without a usable provider".into()),
        Err(e) => {
            say(&format!("INIT-ERROR {}", e.message()));
            Ok(())
        }
    }
}

/// Stream benchmark side: `iters` messages of `size` bytes, `window` in flight,
/// registered once; the sender prints the timed rate after a warm-up round.
pub fn stream(abi: Abi, sender: bool, size: usize, iters: usize, window: usize) -> R<()> {
    let mut link = link(Net::init(abi)?)?;
    let mut s = PluginStream::new(&mut link, sender, size, window)?;
    s.phase(&mut link, window * 2)?;
    let secs = s.phase(&mut link, iters)?.as_secs_f64();
    if sender {
        say(&format!(
            "RESULT size={size} iters={iters} secs={secs:.6} MBps={:.1}",
            (size * iters) as f64 / secs / 1e6
        ));
    }
    s.close(&mut link)?;
    flows::close(link)
}
