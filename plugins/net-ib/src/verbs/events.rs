//! The async-event monitor of one device: NCCL's `ncclIbAsyncThreadMain`.
//!
//! NCCL starts a detached thread per device blocked in `ibv_get_async_event`. A
//! plugin may be dlclosed, so this thread must end first: the context's `async_fd`
//! is made non-blocking and the thread waits on it with `poll` in 100 ms slices,
//! checking a stop flag; dropping the [`Monitor`] stops and joins it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use cclkit_abi::{Error, Result, nccl_warn};

use super::safe::Context;
use super::sys::*;
use crate::fatal::{EventClass, FatalState, classify};

/// How long one `poll` on the async fd waits before the stop flag is checked again.
const SLICE_MS: i32 = 100;

/// Where events come from: `ibv_get_async_event` / `ibv_ack_async_event` on a
/// context, or a test's pipe.
pub trait EventSource: Send + 'static {
    /// The fd that becomes readable when an event is pending.
    fn fd(&self) -> i32;
    /// Takes one event (`false` when none after all).
    fn get(&mut self, ev: &mut ibv_async_event) -> bool;
    /// Acknowledges an event taken by [`EventSource::get`].
    fn ack(&mut self, ev: &mut ibv_async_event);
}

/// A device context's events.
struct ContextEvents(Context);

impl EventSource for ContextEvents {
    fn fd(&self) -> i32 {
        // SAFETY: live context; async_fd is a plain fd owned by the context.
        unsafe { (*self.0.as_raw()).async_fd }
    }

    fn get(&mut self, ev: &mut ibv_async_event) -> bool {
        // SAFETY: live context, valid out-pointer; the fd is non-blocking, so this
        // returns -1/EAGAIN instead of blocking when no event is there after all.
        unsafe { (self.0.verbs().get_async_event)(self.0.as_raw(), ev) == 0 }
    }

    fn ack(&mut self, ev: &mut ibv_async_event) {
        // SAFETY: an event returned by ibv_get_async_event, acknowledged once.
        unsafe { (self.0.verbs().ack_async_event)(ev) }
    }
}

/// A running monitor; stopped and joined on drop.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts watching `ctx`'s async events, recording them in `state` under the
    /// name `dev` (`mlx5_0`).
    pub fn start(ctx: Context, dev: String, state: Arc<FatalState>) -> Result<Self> {
        Self::watch(ContextEvents(ctx), dev, state)
    }

    /// Starts watching `src` (made non-blocking).
    pub fn watch<S: EventSource>(mut src: S, dev: String, state: Arc<FatalState>) -> Result<Self> {
        let fd = src.fd();
        // SAFETY: fcntl on an fd with integer arguments (an invalid fd fails).
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(Error::io(
                "NET/cclkit-ib: fcntl(async_fd, O_NONBLOCK)",
                std::io::Error::last_os_error(),
            ));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("cclkit-ib async {dev}"))
            .spawn(move || run(&mut src, &dev, &state, &flag))
            .map_err(|e| Error::io("NET/cclkit-ib: spawn async-event thread", e))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                nccl_warn!("NET/cclkit-ib: async-event thread panicked");
            }
        }
    }
}

fn run(src: &mut impl EventSource, dev: &str, state: &FatalState, stop: &AtomicBool) {
    let fd = src.fd();
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, SLICE_MS) };
        if r <= 0 {
            continue;
        }
        let mut ev = ibv_async_event::default();
        if !src.get(&mut ev) {
            continue;
        }
        let cq = match classify(ev.event_type) {
            EventClass::CqFatal => Some(ev.element),
            // The QP's send CQ: the comm's CQ, which the data path checks. The QP
            // stays alive until the event is acknowledged (ibv_destroy_qp waits).
            EventClass::QpFatal if ev.element != 0 => {
                // SAFETY: for QP events `element` is a live `ibv_qp*` (see above).
                let cq = unsafe { (*(ev.element as *const ibv_qp)).send_cq };
                Some(cq as usize)
            }
            _ => None,
        };
        let name = match ev.event_type {
            IBV_EVENT_PORT_ERR | IBV_EVENT_PORT_ACTIVE => format!("{dev}:{}", ev.element as u32),
            _ => dev.to_owned(),
        };
        state.record(&name, ev.event_type, cq);
        // Last, as in NCCL: acknowledging lets a pending destroy free the object.
        src.ack(&mut ev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// A pipe whose bytes stand for pending events, taken from a queue.
    struct Pipe {
        rd: i32,
        queue: Arc<Mutex<Vec<ibv_async_event>>>,
        acked: Arc<Mutex<Vec<u32>>>,
    }

    impl EventSource for Pipe {
        fn fd(&self) -> i32 {
            self.rd
        }
        fn get(&mut self, ev: &mut ibv_async_event) -> bool {
            let mut b = 0u8;
            // SAFETY: reading one byte into a local from our own pipe.
            if unsafe { libc::read(self.rd, (&mut b as *mut u8).cast(), 1) } != 1 {
                return false;
            }
            match self.queue.lock().unwrap().pop() {
                Some(e) => {
                    *ev = e;
                    true
                }
                None => false,
            }
        }
        fn ack(&mut self, ev: &mut ibv_async_event) {
            self.acked.lock().unwrap().push(ev.event_type);
        }
    }

    #[test]
    fn monitor_records_fatal_events_acks_them_and_stops_promptly() {
        let mut fds = [0i32; 2];
        // SAFETY: valid out-array of two fds.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let queue = Arc::new(Mutex::new(Vec::new()));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new(FatalState::new(true));
        let src = Pipe {
            rd: fds[0],
            queue: Arc::clone(&queue),
            acked: Arc::clone(&acked),
        };
        let m = Monitor::watch(src, "mlx5_9".into(), Arc::clone(&state)).unwrap();
        // A QP fatal event: the monitor maps it to the QP's send CQ.
        // SAFETY: all-zero is a valid plain C struct.
        let mut qp: ibv_qp = unsafe { std::mem::zeroed() };
        qp.send_cq = 0x5000 as *mut ibv_cq;
        let push = |event_type: u32, element: usize| {
            queue.lock().unwrap().push(ibv_async_event {
                element,
                event_type,
            });
            // SAFETY: writing one byte from a local to our own pipe.
            assert_eq!(unsafe { libc::write(fds[1], [1u8].as_ptr().cast(), 1) }, 1);
        };
        push(IBV_EVENT_PORT_ERR, 1);
        push(IBV_EVENT_QP_FATAL, &qp as *const ibv_qp as usize);
        let start = Instant::now();
        while acked.lock().unwrap().len() < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "events not handled"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(state.check(0x6000).is_ok(), "port error is not fatal");
        let e = state.check(0x5000).unwrap_err();
        assert!(e.message().contains("mlx5_9"), "{}", e.message());
        push(IBV_EVENT_DEVICE_FATAL, 0);
        while acked.lock().unwrap().len() < 3 {
            assert!(start.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(state.check(0x6000).is_err(), "device fatal fails every CQ");
        let t = Instant::now();
        drop(m);
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "stop took {:?}",
            t.elapsed()
        );
        // SAFETY: closing our own fds once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
