//! The bootstrap root: gathers every rank's listener address and hands out the table.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::listen::{Incoming, Listener};
use super::*;
use crate::error::{Error, Result};

/// The root's gathering thread (NCCL's bootstrap root). Dropping it stops a gathering
/// still in progress (its ranks are gone or will time out) and waits for the thread.
pub struct BootstrapRoot {
    thread: Option<JoinHandle<Result<()>>>,
    stop: Arc<AtomicBool>,
}

impl BootstrapRoot {
    /// Listens on `bind` (port 0 = any) and gathers one communicator's ranks in a
    /// thread. Returns the id to hand to every rank.
    pub fn start(bind: SocketAddr, magic: u64, timeout: Duration) -> Result<(UniqueId, Self)> {
        let listener = TcpListener::bind(bind)
            .map_err(|e| Error::from_io(format!("bootstrap root: bind {bind}"), e))?;
        let mut root = listener
            .local_addr()
            .map_err(|e| Error::from_io("bootstrap root", e))?;
        if root.ip().is_unspecified() {
            root.set_ip(local_ip_towards(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))));
        }
        let listener = Listener::start(
            listener,
            format!("bootstrap root {root}"),
            magic,
            Kind::Hello,
            timeout,
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cclkit-bootstrap-root".into())
            .spawn(move || gather(&listener, magic, timeout, &flag))
            .map_err(|e| Error::system(format!("bootstrap root: spawn: {e}")))?;
        Ok((
            UniqueId { root, magic },
            Self {
                thread: Some(thread),
                stop,
            },
        ))
    }

    /// Waits for the gathering to finish and returns its outcome.
    pub fn join(mut self) -> Result<()> {
        self.thread.take().map_or(Ok(()), |t| {
            t.join()
                .unwrap_or_else(|_| Err(Error::internal("bootstrap root thread panicked")))
        })
    }

    /// Whether the gathering has ended (every rank got the table, or it failed).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for BootstrapRoot {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Joined = Vec<Option<(TcpStream, Vec<u8>)>>;

fn abort_all(joined: &mut Joined, magic: u64, msg: String) -> Result<()> {
    tracing::warn!(target: "cclkit::bootstrap", "{msg}");
    for (s, _) in joined.iter_mut().flatten() {
        send_abort(s, magic, &msg);
    }
    Err(Error::invalid_usage(msg))
}

fn send_abort(s: &mut TcpStream, magic: u64, msg: &str) {
    let _ = write_frame(
        s,
        magic,
        &Frame {
            kind: Kind::Abort,
            from: u32::MAX,
            tag: 0,
            payload: msg.as_bytes().to_vec(),
        },
    );
}

/// A Hello's rank count, checked before anything is sized from it.
fn hello_nranks(payload: &[u8], rank: u32) -> std::result::Result<usize, String> {
    let n = payload
        .get(0..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or("a Hello without a rank count")? as usize;
    if n == 0 || n > MAX_RANKS {
        return Err(format!(
            "rank {rank} says nranks={n}, outside 1..={MAX_RANKS} (the bootstrap's rank limit)"
        ));
    }
    if rank as usize >= n {
        return Err(format!("rank {rank} is outside 0..{n}"));
    }
    let addr = std::str::from_utf8(&payload[4..])
        .ok()
        .and_then(|a| a.parse::<SocketAddr>().ok());
    if addr.is_none() {
        return Err(format!("rank {rank} sent no valid listener address"));
    }
    Ok(n)
}

pub(super) fn gather(
    listener: &Listener,
    magic: u64,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut nranks: Option<usize> = None;
    let mut joined: Joined = Vec::new();
    while nranks.is_none_or(|n| joined.iter().flatten().count() < n) {
        if stop.load(Ordering::SeqCst) {
            return Err(Error::invalid_usage(
                "bootstrap root: stopped before every rank joined (the ranks are gone)",
            ));
        }
        let step = (Instant::now() + Duration::from_millis(50)).min(deadline);
        let Some(Incoming {
            frame: hello,
            stream: mut s,
            peer,
        }) = listener.next(step)
        else {
            if Instant::now() < deadline {
                continue;
            }
            let missing: Vec<usize> = joined
                .iter()
                .enumerate()
                .filter(|(_, j)| j.is_none())
                .map(|(r, _)| r)
                .collect();
            let strays = match listener.strays() {
                0 => String::new(),
                n => format!("; {n} stray connection(s) were dropped meanwhile"),
            };
            let msg = match nranks {
                Some(n) => format!(
                    "bootstrap root: ranks {missing:?} of {n} never joined within {timeout:?} (CCLKIT_BOOTSTRAP_TIMEOUT){strays}"
                ),
                None => format!("bootstrap root: no rank joined within {timeout:?}{strays}"),
            };
            return abort_all(&mut joined, magic, msg);
        };
        let rank = hello.from as usize;
        let their_n = match hello_nranks(&hello.payload, hello.from) {
            Ok(n) => n,
            Err(why) => {
                // Refused alone: the sender hears why, the job goes on.
                let msg = format!("bootstrap root: refused a Hello from {peer}: {why}");
                tracing::warn!(target: "cclkit::bootstrap", "{msg}");
                send_abort(&mut s, magic, &msg);
                continue;
            }
        };
        match nranks {
            None => {
                nranks = Some(their_n);
                joined.resize_with(their_n, || None);
            }
            Some(n) if n != their_n => {
                joined.push(Some((s, Vec::new())));
                return abort_all(
                    &mut joined,
                    magic,
                    format!(
                        "bootstrap root: rank {rank} says nranks={their_n}, earlier ranks said {n}"
                    ),
                );
            }
            Some(_) => {}
        }
        if joined[rank].is_some() {
            joined.push(Some((s, Vec::new())));
            return abort_all(
                &mut joined,
                magic,
                format!("bootstrap root: rank {rank} joined twice (the second from {peer})"),
            );
        }
        joined[rank] = Some((s, hello.payload[4..].to_vec()));
    }
    // Everyone is here: send the address table (length-prefixed entries).
    let mut table = Vec::new();
    for (_, addr) in joined.iter().flatten() {
        table.extend_from_slice(&(addr.len() as u32).to_le_bytes());
        table.extend_from_slice(addr);
    }
    for (rank, (s, _)) in joined.iter_mut().flatten().enumerate() {
        write_frame(
            s,
            magic,
            &Frame {
                kind: Kind::Table,
                from: u32::MAX,
                tag: 0,
                payload: table.clone(),
            },
        )
        .map_err(|e| Error::from_io(format!("bootstrap root: send table to rank {rank}"), e))?;
    }
    Ok(())
}
