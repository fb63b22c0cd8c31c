//! The engine at its limits, on a connection to this process. The test runs it
//! with settings of its own: `FI_OFI_RXM_RX_SIZE=64` (a quarter of that is two
//! comms' 8 bundle buffers each) and `CCLKIT_OFI_BUNDLE_BYTES=65536` (larger
//! than `ofi_rxm`'s eager messages). Checked:
//! - an open bundle goes out on its time bound while the send before it is a
//!   rendezvous, which is counted in flight (it is within the bundle size) but
//!   cannot complete before its receive is posted;
//! - every bundle buffer of a comm held for records while NCCL's receives, for
//!   data that will come bundled, exceed the receive queue: those receives must
//!   leave room for the bundle buffers (they once took it, and nothing completed
//!   again);
//! - a comm accepted while NCCL's receives fill the queue: its first bundle
//!   receive finds an entry or waits aside; the others, posted when its first
//!   bundle comes, meet `-FI_EAGAIN`, wait aside, and are posted as the queue
//!   empties;
//! - sends go out while receives wait for room in the receive queue (they once
//!   shared one backlog, and this process's sends, which would have emptied its
//!   receive queue, waited behind its receives for good); also without bundles.

use std::time::{Duration, Instant};

use cclkit_host::net::{RecvBuffer, Request};
use cclkit_net_ofi::bundle_counts;
use cclkit_net_ofi::engine::receives_refused;

use crate::bundles::{payloads, receive_each, send_burst};
use crate::flows::{self, Link, check_deadline, post_one, say, send_one, wait};
use crate::net::{Abi, Net, R, Side, err};
use crate::pattern::{Rng, fill, first_mismatch};
use crate::scenarios::self_link;

/// The provider's receive queue as the test sets it (`FI_OFI_RXM_RX_SIZE`).
fn rx_queue() -> R<usize> {
    std::env::var("FI_OFI_RXM_RX_SIZE")
        .map_err(|_| "FI_OFI_RXM_RX_SIZE must be set (the test sets it)".to_owned())?
        .parse()
        .map_err(|e| format!("FI_OFI_RXM_RX_SIZE: {e}"))
}
/// Buffers in one grouped receive (NCCL's most).
const GROUP: usize = 8;
/// How long an open bundle may take to go out on its time bound (200 µs) on a
/// busy machine.
const BOUND_WAIT: Duration = Duration::from_secs(5);

/// Runs the checks; prints `LIMITS ok`. Without bundles (`bundles` false, and
/// `CCLKIT_OFI_BUNDLE_BYTES=0`) only the last.
pub fn check(abi: Abi, seed: u64, bundles: bool) -> R<()> {
    let mut l = self_link(abi)?;
    if !bundles {
        Grouped::post(&mut l)?.send_and_check(&mut l, seed)?;
        say("LIMITS ok");
        return flows::close(l);
    }
    held_open(&mut l, seed)?;
    starved(&mut l, seed)?;
    late_comm(&mut l, abi, seed)?;
    // The comm still bundles, and delivers, after both.
    let data = payloads(seed, 900);
    send_burst(&mut l, &data, 60)?;
    receive_each(&mut l, seed, 900, 60)?;
    say("LIMITS ok");
    flows::close(l)
}

/// Waits for a receive of one buffer and checks it holds message `id`.
fn expect(l: &mut Link, r: Request, buf: &[u8], seed: u64, id: u64, want: usize) -> R<()> {
    let sizes = wait(Side::Recv(&mut l.recv), r)?;
    if sizes != [want] {
        return Err(format!("message {id}: received {sizes:?}, sent {want}"));
    }
    match first_mismatch(seed, id, &buf[..want]) {
        Some(at) => Err(format!("message {id}: wrong byte at {at}")),
        None => Ok(()),
    }
}

/// A small send queued behind a rendezvous send goes out on the open bundle's
/// time bound, before the rendezvous (whose receive comes later) completes.
fn held_open(l: &mut Link, seed: u64) -> R<()> {
    let mut big = vec![0u8; 40_003];
    fill(seed, 1, &mut big);
    let mut small = vec![0u8; 99];
    fill(seed, 2, &mut small);
    let before = bundle_counts();
    let mut rb = send_one(l, &big, 40)?;
    let mut rs = send_one(l, &small, 41)?;
    let deadline = Instant::now() + BOUND_WAIT;
    while l.send.test(&mut rs).map_err(err)?.is_none() {
        check_deadline(
            deadline,
            "a send queued behind a rendezvous (the bundle's time bound)",
        )?;
    }
    if l.send.test(&mut rb).map_err(err)?.is_some() {
        return Err(
            "the 40 KB send completed with no receive posted: it was no rendezvous, \
                    so nothing held the small one"
                .into(),
        );
    }
    let overdue = bundle_counts().overdue - before.overdue;
    if overdue != 1 {
        return Err(format!(
            "{overdue} open bundles went out on their time bound; expected 1"
        ));
    }
    let (mut got_small, mut got_big) = (vec![0xa5u8; 128], vec![0xa5u8; 65536]);
    let r_small = post_one(l, &mut got_small, 41)?;
    let r_big = post_one(l, &mut got_big, 40)?;
    expect(l, r_small, &got_small, seed, 2, small.len())?;
    expect(l, r_big, &got_big, seed, 1, big.len())?;
    wait(Side::Send(&mut l.send), rb).map(drop)
}

/// Drives the engine (testing `probe`, a receive nothing matches yet) until
/// `n` records arrived before their receives.
fn await_early(l: &mut Link, probe: &mut Request, since: u64, n: u64) -> R<()> {
    let deadline = Instant::now() + flows::WAIT;
    while bundle_counts().early - since < n {
        if l.recv.test(probe).map_err(err)?.is_some() {
            return Err("a receive completed without a send".into());
        }
        check_deadline(deadline, "records arriving before their receives")?;
    }
    Ok(())
}

/// Every bundle buffer of the comm is held (its records wait for their
/// receives) while NCCL's receives for data still to come fill the whole receive
/// queue; then the held records are taken, and the data comes, all of it in
/// bundles but the first send. The bundle buffers must find room in the queue
/// again, or the posted receives wait for records in bundles nobody receives.
fn starved(l: &mut Link, seed: u64) -> R<()> {
    const HELD: u64 = 8;
    let before = bundle_counts();
    let bursts: Vec<Vec<Vec<u8>>> = (0..HELD).map(|b| payloads(seed, 1000 + 100 * b)).collect();
    for (b, data) in bursts.iter().enumerate() {
        let sends = data
            .iter()
            .map(|d| send_one(l, d, 70 + b as i32))
            .collect::<R<Vec<_>>>()?;
        for r in sends {
            wait(Side::Send(&mut l.send), r)?;
        }
    }
    let sent = bundle_counts();
    if sent.bundles - before.bundles != HELD {
        return Err(format!(
            "{} bundles for {HELD} bursts: the bursts must take one bundle buffer each",
            sent.bundles - before.bundles
        ));
    }
    let mut probe_buf = [0u8; 8];
    let mut probe = post_one(l, &mut probe_buf, 59)?;
    await_early(l, &mut probe, before.early, sent.records - before.records)?;
    // More receives than the queue holds: some wait in the backlog.
    let grouped = Grouped::post(l)?;
    // The held records are taken, each buffer is posted again: into the entries
    // the receives above left free.
    let mut bufs: Vec<Vec<Vec<u8>>> = bursts
        .iter()
        .map(|d| d.iter().map(|_| vec![0xa5u8; 4096 + 64]).collect())
        .collect();
    let mut reqs = Vec::new();
    for (b, burst) in bufs.iter_mut().enumerate() {
        for buf in burst.iter_mut() {
            reqs.push(post_one(l, buf, 70 + b as i32)?);
        }
    }
    let deferred = bundle_counts().deferred - before.deferred;
    if deferred != 0 {
        return Err(format!(
            "{deferred} bundle buffers found the receive queue full: NCCL's receives took their entries"
        ));
    }
    grouped.send_and_check(l, seed)?;
    let mut reqs = reqs.into_iter();
    for (b, data) in bursts.iter().enumerate() {
        for (i, d) in data.iter().enumerate() {
            let r = reqs.next().ok_or("missing request")?;
            expect(
                l,
                r,
                &bufs[b][i],
                seed,
                1000 + 100 * b as u64 + i as u64,
                d.len(),
            )?;
        }
    }
    let fin = [7u8; 8];
    let s = send_one(l, &fin, 59)?;
    wait(Side::Send(&mut l.send), s)?;
    let got = wait(Side::Recv(&mut l.recv), probe)?;
    if got != [8] || probe_buf != fin {
        return Err(format!("the probe got {got:?}"));
    }
    Ok(())
}

/// A comm pair set up (listen, connect, accept) while NCCL's receives on `l`
/// fill the receive queue: the control receives find the entries kept for them.
/// The new comms bundle a burst; the new receive comm's bundle receives beyond
/// its first (posted when a bundle comes) meet `-FI_EAGAIN` and wait aside;
/// once `l`'s receives complete they are posted, and the burst arrives.
fn late_comm(l: &mut Link, abi: Abi, seed: u64) -> R<()> {
    let before = bundle_counts();
    // NCCL's receives first: the listen, connect and accept below must still
    // find room for their control receives.
    let grouped = Grouped::post(l)?;
    let net = Net::init(abi)?;
    let (handle, mut listen) = net.listen(0)?;
    let mut connecting = net.connect(0, &handle);
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + flows::WAIT;
    while send.is_none() || recv.is_none() {
        if recv.is_none() {
            recv = listen.accept().map_err(err)?;
        }
        if send.is_none() {
            send = connecting.poll().map_err(err)?;
        }
        check_deadline(deadline, "connect/accept next to a full receive queue")?;
    }
    listen.close().map_err(err)?;
    drop(connecting);
    let (Some(send), Some(recv)) = (send, recv) else {
        return Err("connect/accept ended without comms".into());
    };
    let mut late = Link { net, send, recv };
    let data = payloads(seed, 2000);
    send_burst(&mut late, &data, 80)?;
    // A receive nothing matches drives the new receive comm until its bundle
    // receives met the full queue.
    let mut probe_buf = [0u8; 8];
    // `probe_buf` outlives the probe, completed below.
    let mut probe = post_one(&mut late, &mut probe_buf, 81)?;
    let deadline = Instant::now() + BOUND_WAIT;
    while bundle_counts().deferred == before.deferred {
        if late.recv.test(&mut probe).map_err(err)?.is_some() {
            return Err("a receive completed without a send".into());
        }
        if Instant::now() > deadline {
            return Err(no_full_queue());
        }
    }
    grouped.send_and_check(l, seed)?;
    receive_each(&mut late, seed, 2000, 80)?;
    // Only the new receive comm had yet to post its other bundle receives
    // (`l`'s did when bundles first came, in `starved`).
    let grown = bundle_counts().grown - before.grown;
    if grown != 1 {
        return Err(format!(
            "{grown} receive comms posted their other bundle receives as the burst came; expected 1"
        ));
    }
    let s = send_one(&mut late, &[1u8; 8], 81)?;
    wait(Side::Send(&mut late.send), s)?;
    wait(Side::Recv(&mut late.recv), probe)?;
    if bundle_counts().reposted == before.reposted {
        return Err("none of the new comm's bundle receives was posted after waiting".into());
    }
    flows::close(late)
}

/// Why the new comm's bundle receives found room: a provider that never refused
/// a receive cannot be filled (libfabric 2.x's `ofi_rxm` grows its receive pool
/// past `FI_OFI_RXM_RX_SIZE`), so this check cannot run on it; otherwise the
/// plugin posted into a queue it should have found full.
fn no_full_queue() -> String {
    if receives_refused() == 0 {
        format!(
            "the provider never refused a receive with -FI_EAGAIN (FI_OFI_RXM_RX_SIZE={}): \
             its receive queue grows (libfabric 2.x's ofi_rxm), so the full-queue \
             checks cannot run here; they need a provider that caps it (libfabric 1.x)",
            rx_queue().unwrap_or(0)
        )
    } else {
        "the new comm's bundle receives found room in a full queue: this check shows nothing".into()
    }
}

/// Grouped receives of more buffers than the provider's receive queue holds, on
/// tags 51-58 (one per buffer of a group), and the requests that hold them.
struct Grouped {
    bufs: Vec<Vec<u8>>,
    reqs: Vec<Request>,
}

impl Grouped {
    /// Posts them: the queue fills, and the last group's posts wait in the
    /// receive backlog.
    fn post(l: &mut Link) -> R<Self> {
        let groups = rx_queue()? / GROUP + 1;
        let mut bufs: Vec<Vec<u8>> = (0..groups * GROUP).map(|_| vec![0xa5u8; 512]).collect();
        let mut reqs = Vec::new();
        for g in bufs.chunks_mut(GROUP) {
            let one: Vec<RecvBuffer> = g
                .iter_mut()
                .enumerate()
                .map(|(j, b)| RecvBuffer {
                    data: b.as_mut_ptr(),
                    size: b.len(),
                    tag: 51 + j as i32,
                    mr: None,
                })
                .collect();
            // SAFETY: the buffers live in `Self` (their heap blocks do not move),
            // which `send_and_check` consumes only after the requests completed.
            let r = unsafe { l.recv.irecv(&one, false) }.map_err(err)?;
            reqs.push(r.ok_or("grouped irecv not accepted")?);
        }
        Ok(Self { bufs, reqs })
    }

    /// Sends their messages, in random sizes of 1-512 bytes, while the receive
    /// backlog is not empty, and checks that each lands in its buffer.
    fn send_and_check(self, l: &mut Link, seed: u64) -> R<()> {
        let mut rng = Rng::new(seed ^ 0xf111);
        let sizes: Vec<usize> = self.bufs.iter().map(|_| 1 + rng.below(512)).collect();
        let out: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut b = vec![0u8; n];
                fill(seed, 300 + i as u64, &mut b);
                b
            })
            .collect();
        let sends = out
            .iter()
            .enumerate()
            .map(|(i, b)| send_one(l, b, 51 + (i % GROUP) as i32))
            .collect::<R<Vec<_>>>()?;
        for r in sends {
            wait(Side::Send(&mut l.send), r)?;
        }
        for (g, r) in self.reqs.into_iter().enumerate() {
            let got = wait(Side::Recv(&mut l.recv), r)?;
            let want = &sizes[g * GROUP..(g + 1) * GROUP];
            if got != want {
                return Err(format!("grouped receive {g}: sizes {got:?}, sent {want:?}"));
            }
            for (j, &n) in want.iter().enumerate() {
                let i = g * GROUP + j;
                if first_mismatch(seed, 300 + i as u64, &self.bufs[i][..n]).is_some() {
                    return Err(format!("grouped receive {g}, buffer {j}: wrong bytes"));
                }
            }
        }
        Ok(())
    }
}
