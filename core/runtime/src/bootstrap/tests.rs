use super::*;

fn local_root(timeout: Duration) -> (UniqueId, BootstrapRoot) {
    BootstrapRoot::start("127.0.0.1:0".parse().unwrap(), random_u64(), timeout).unwrap()
}

#[test]
fn unique_id_round_trips_as_text() {
    let id = UniqueId {
        root: "10.1.2.3:4567".parse().unwrap(),
        magic: 0xdead_beef_0123,
    };
    assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
    assert!("cclkit1:nonsense".parse::<UniqueId>().is_err());
    let v6 = UniqueId {
        root: "[::1]:80".parse().unwrap(),
        magic: 7,
    };
    assert_eq!(v6.to_string().parse::<UniqueId>().unwrap(), v6);
}

#[test]
fn five_ranks_allgather_and_exchange() {
    let (id, root) = local_root(Duration::from_secs(20));
    let n = 5;
    let handles: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                let b = Bootstrap::init(&id, r, n, Duration::from_secs(20)).unwrap();
                let all = b.allgather(format!("rank{r}").as_bytes()).unwrap();
                for (i, v) in all.iter().enumerate() {
                    assert_eq!(v, format!("rank{i}").as_bytes());
                }
                // Out-of-order tags: send two, receive them in the other order.
                let next = (r + 1) % n;
                b.send(next, 7, &[r as u8; 3]).unwrap();
                b.send(next, 8, &[r as u8 + 100]).unwrap();
                let prev = (r + n - 1) % n;
                assert_eq!(b.recv(prev, 8).unwrap(), vec![prev as u8 + 100]);
                assert_eq!(b.recv(prev, 7).unwrap(), vec![prev as u8; 3]);
                b.barrier().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    root.join().unwrap();
}

#[test]
fn missing_rank_is_a_clear_timeout() {
    let (id, root) = local_root(Duration::from_millis(800));
    let t = std::thread::spawn(move || {
        Bootstrap::init(&id, 0, 3, Duration::from_secs(5))
            .err()
            .unwrap()
    });
    let err = t.join().unwrap();
    assert!(
        err.message().contains("ranks [1, 2] of 3 never joined"),
        "{err}"
    );
    assert!(root.join().unwrap_err().message().contains("never joined"));
}

#[test]
fn wrong_magic_is_rejected_not_matched() {
    let (id, root) = local_root(Duration::from_millis(1500));
    let wrong = UniqueId {
        magic: id.magic ^ 1,
        ..id
    };
    let err = Bootstrap::init(&wrong, 0, 1, Duration::from_secs(3))
        .err()
        .unwrap();
    assert!(
        err.message().contains("wrong magic") || err.message().contains("unique id"),
        "{err}"
    );
    // The root keeps waiting for a real rank, then gives up cleanly.
    assert!(
        root.join()
            .unwrap_err()
            .message()
            .contains("no rank joined")
    );
}

#[test]
fn nranks_mismatch_is_reported_to_ranks() {
    let (id, root) = local_root(Duration::from_secs(10));
    // Whichever arrives first sets nranks; both must hear about the mismatch.
    let a = std::thread::spawn(move || Bootstrap::init(&id, 0, 3, Duration::from_secs(10)).err());
    let b = Bootstrap::init(&id, 1, 2, Duration::from_secs(10))
        .err()
        .unwrap();
    let a = a.join().unwrap().unwrap();
    for e in [&a, &b] {
        assert!(e.message().contains("says nranks="), "{e}");
    }
    let _ = root.join();
}

/// Ranks 0..n join `id` in threads and allgather; returns how long it took.
fn run_job(id: UniqueId, n: usize) -> Duration {
    let t = std::time::Instant::now();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                let b = Bootstrap::init(&id, r, n, Duration::from_secs(20)).unwrap();
                // Strays against every rank's own listener while the ring runs.
                let _silent = std::net::TcpStream::connect(b.peer_addr(r).unwrap()).unwrap();
                let all = b.allgather(&[r as u8; 5]).unwrap();
                for (i, v) in all.iter().enumerate() {
                    assert_eq!(v, &vec![i as u8; 5]);
                }
                b.barrier().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    t.elapsed()
}

#[test]
fn silent_short_and_foreign_connections_cost_at_most_the_header_deadline() {
    use std::io::Write;
    let (id, root) = local_root(Duration::from_secs(20));
    let silent = std::net::TcpStream::connect(id.root).unwrap();
    let mut short = std::net::TcpStream::connect(id.root).unwrap();
    short.write_all(&[7u8; 10]).unwrap();
    let mut magic_only = std::net::TcpStream::connect(id.root).unwrap();
    magic_only.write_all(&id.magic.to_le_bytes()).unwrap();
    let mut foreign = std::net::TcpStream::connect(id.root).unwrap();
    foreign.write_all(&[0xa5u8; HEADER + 3]).unwrap();
    let took = run_job(id, 4);
    assert!(took < HEADER_DEADLINE_SLACK, "{took:?}");
    root.join().unwrap();
    drop((silent, short, magic_only, foreign));
}

/// The header deadline plus room for a loaded machine.
const HEADER_DEADLINE_SLACK: Duration = Duration::from_secs(listen::HEADER_DEADLINE.as_secs() + 6);

#[test]
fn a_flood_of_silent_connections_does_not_stall_the_job() {
    let (id, root) = local_root(Duration::from_secs(20));
    let flood: Vec<_> = (0..300)
        .filter_map(|_| std::net::TcpStream::connect(id.root).ok())
        .collect();
    assert!(flood.len() > 250);
    let took = run_job(id, 2);
    assert!(took < HEADER_DEADLINE_SLACK, "{took:?}");
    root.join().unwrap();
}

#[test]
fn crafted_hello_with_a_huge_rank_count_is_refused_alone() {
    let (id, root) = local_root(Duration::from_secs(20));
    for (from, n) in [(0u32, u32::MAX), (0, 0), (5, 2), (1 << 31, 1 << 20)] {
        let mut s = std::net::TcpStream::connect(id.root).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut payload = n.to_le_bytes().to_vec();
        payload.extend_from_slice(b"127.0.0.1:9");
        let f = Frame {
            kind: Kind::Hello,
            from,
            tag: 0,
            payload,
        };
        write_frame(&mut s, id.magic, &f).unwrap();
        let answer = read_frame(&mut s, id.magic).unwrap().unwrap();
        assert_eq!(answer.kind, Kind::Abort);
        let text = String::from_utf8_lossy(&answer.payload).into_owned();
        assert!(text.contains("refused a Hello"), "{text}");
    }
    // The job itself is unaffected.
    run_job(id, 3);
    root.join().unwrap();
}

#[test]
fn dropping_a_root_whose_ranks_are_gone_returns_at_once() {
    let (_, root) = local_root(Duration::from_secs(600));
    let t = std::time::Instant::now();
    drop(root);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn rank_counts_outside_the_limit_are_refused_before_anything_is_sized() {
    let id = UniqueId {
        root: "127.0.0.1:9".parse().unwrap(),
        magic: 1,
    };
    for n in [0, MAX_RANKS + 1, usize::MAX] {
        let e = Bootstrap::init(&id, 0, n, Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(e.message().contains("outside 1..="), "{e}");
    }
}

#[test]
fn random_headers_never_panic_and_never_pass_unchecked() {
    // A seeded xorshift: reproducible, no extra dependency.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let magic = next();
    for i in 0..20_000 {
        let mut h = [0u8; HEADER];
        for b in h.iter_mut() {
            *b = next() as u8;
        }
        if i % 2 == 0 {
            h[0..8].copy_from_slice(&magic.to_le_bytes());
        }
        match parse_header(&h, magic) {
            Ok(p) => {
                assert!(p.len <= MAX_MESSAGE);
                assert!((1..=4).contains(&(p.kind as u8)));
            }
            Err(Refused::Magic) => assert!(i % 2 == 1),
            Err(_) => {}
        }
        // Address tables of random bytes: an error or the right count, never a panic.
        let n = (next() % 4) as usize;
        let t: Vec<u8> = (0..(next() % 64)).map(|_| next() as u8).collect();
        if let Ok(v) = rank::parse_table(&t, n) {
            assert_eq!(v.len(), n);
        }
    }
}
