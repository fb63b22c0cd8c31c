//! 1000 connect/close cycles leave no file descriptor or thread behind, including
//! comms closed with requests in flight. Alone in its binary so that no other test
//! opens descriptors meanwhile.

mod common;

use std::time::Duration;

use common::script::{exchange, singles};
use common::{Plugin, Ptr, Ver, fd_count, seed, send_now, thread_count};

#[test]
fn thousand_connect_close_cycles_leak_nothing() {
    // Helper threads and data streams on any interface (loopback would get none).
    // SAFETY: the only test of this binary, before the plugin reads the environment.
    unsafe {
        std::env::set_var("NCCL_SOCKET_NTHREADS", "2");
        std::env::set_var("NCCL_NSOCKS_PERTHREAD", "2");
    }
    let p = Plugin::open(Ver::V12);
    let s = seed();
    // Warm up once: lazily created process state (logger, RNG) is not a leak.
    let (send, recv) = p.pair(0);
    exchange(
        &p,
        send,
        recv,
        &singles(&[1, 100_000]),
        s,
        0,
        0,
        4,
        Duration::from_secs(30),
    );
    p.close_send(send);
    p.close_recv(recv);
    let (fds, threads) = (fd_count(), thread_count());
    let mut big = vec![0u8; 8 << 20];
    let mut sink = vec![0u8; 8 << 20];
    for i in 0..1000 {
        let (send, recv) = p.pair(0);
        match i % 100 {
            0 => exchange(
                &p,
                send,
                recv,
                &singles(&[3, 300_000]),
                s,
                0,
                0,
                4,
                Duration::from_secs(30),
            ),
            50 => {
                // Close with a large send and receive still in flight.
                // SAFETY: the buffers outlive the comms (closed below, before reuse).
                let r: Ptr = unsafe {
                    p.irecv(
                        recv,
                        &[(sink.as_mut_ptr(), sink.len())],
                        &[0],
                        &[std::ptr::null_mut()],
                    )
                }
                .unwrap();
                assert!(!r.is_null());
                // SAFETY: as above.
                let q = unsafe { send_now(&p, send, big.as_mut_ptr(), big.len(), 0) }.unwrap();
                assert!(!q.is_null());
            }
            _ => {}
        }
        p.close_send(send);
        p.close_recv(recv);
    }
    assert_eq!(fd_count(), fds, "file descriptors leaked over 1000 cycles");
    assert_eq!(thread_count(), threads, "threads leaked over 1000 cycles");
}
