//! Cost of the net host adapter on the data path: one `irecv` + `isend` + two `test`s
//! of 8 bytes through the v12 and v6 adapters on the in-memory C mock
//! (tests/fixtures/net_mock.c), next to the same cycle called from C on the raw table
//! (benches/raw_baseline.c, printed before the criterion results).
//!
//! `cargo bench -p cclkit-host --bench adapter -- --warm-up-time 1 --measurement-time 3`

use std::path::{Path, PathBuf};
use std::process::Command;

use cclkit_host::Library;
use cclkit_host::net::{CommConfig, NetPlugin, RecvBuffer, RecvComm, SendComm};
use criterion::{Criterion, criterion_group, criterion_main};

fn cc(out: &Path, sources: &[PathBuf], args: &[&str]) {
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O2", "-o"])
        .arg(out)
        .args(sources)
        .args(args)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc {out:?}");
}

fn mock(dir: &Path, version: u32) -> PathBuf {
    let out = dir.join(format!("mock{version}.so"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/net_mock.c");
    cc(
        &out,
        &[src],
        &["-shared", "-fPIC", &format!("-DNET_VERSION={version}")],
    );
    out
}

fn connected(path: &Path) -> (cclkit_host::net::NetContext, SendComm, RecvComm) {
    let plugin = NetPlugin::load(Library::open(path.to_str()).expect("dlopen")).expect("table");
    let ctx = plugin.init(1, CommConfig::default()).expect("init");
    let (h, mut l) = ctx.listen(0).expect("listen");
    let mut c = ctx.connect(0, &h);
    let (mut s, mut r) = (None, None);
    for _ in 0..100 {
        if s.is_none() {
            s = c.poll().expect("connect");
        }
        if r.is_none() {
            r = l.accept().expect("accept");
        }
    }
    (ctx, s.expect("send comm"), r.expect("recv comm"))
}

fn cycle(send: &mut SendComm, recv: &mut RecvComm, src: &[u8; 8], dst: &mut [u8; 16]) {
    // SAFETY: both buffers outlive the requests, which complete inside this call.
    unsafe {
        let b = [RecvBuffer {
            data: dst.as_mut_ptr(),
            size: dst.len(),
            tag: 5,
            mr: None,
        }];
        let mut rr = recv.irecv(&b, false).expect("irecv").expect("posted");
        let mut sr = send
            .isend(src.as_ptr(), src.len(), 5, None)
            .expect("isend")
            .expect("posted");
        while recv.test(&mut rr).expect("test").is_none() {}
        while send.test(&mut sr).expect("test").is_none() {}
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let v12 = mock(dir.path(), 12);
    let v6 = mock(dir.path(), 6);
    let baseline = dir.path().join("raw_baseline");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/raw_baseline.c");
    cc(&baseline, &[src], &["-ldl"]);
    let out = Command::new(&baseline)
        .arg(&v12)
        .arg("2000000")
        .output()
        .expect("baseline");
    println!(
        "raw C baseline (v12 table, no adapter): {}",
        String::from_utf8_lossy(&out.stdout).trim()
    );
    let (src8, mut dst) = (*b"payload\0", [0u8; 16]);
    for (name, path) in [("v12", &v12), ("v6", &v6)] {
        let (_ctx, mut send, mut recv) = connected(path);
        c.bench_function(&format!("adapter {name}: irecv+isend+2 tests, 8 B"), |b| {
            b.iter(|| cycle(&mut send, &mut recv, &src8, &mut dst))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
