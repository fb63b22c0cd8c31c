//! Shared helpers: environment isolation, temp rule files, guarded cost tables and
//! constants, log capture.
#![allow(dead_code)]

pub mod comm;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cclkit_abi::raw::tuner::ncclTunerConstants_v5_t;

/// Serialises every test that touches the environment or the working directory.
static ENV_LOCK: Mutex<()> = Mutex::new(());

/// Variables a test may set; all are cleared on entry and on drop.
const VARS: [&str; 8] = [
    "NCCL_TUNER_CONFIG_FILE",
    "CCLKIT_TUNER_MODE",
    "CCLKIT_TUNER_INTRA_BW",
    "CCLKIT_TUNER_NET_BW",
    "CCLKIT_TUNER_NET_LAT",
    "CCLKIT_TUNER_INTRA_LINK",
    "CCLKIT_TUNER_ARCH",
    "CCLKIT_TUNER_CHANNELS",
];

/// Holds the environment lock; restores a clean tuner environment on drop.
pub struct Env {
    _guard: MutexGuard<'static, ()>,
    extra: Vec<String>,
    files: Vec<PathBuf>,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl Env {
    pub fn lock() -> Self {
        let guard = ENV_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for v in VARS {
            // SAFETY: every test that reads or writes these holds ENV_LOCK.
            unsafe { std::env::remove_var(v) };
        }
        Self {
            _guard: guard,
            extra: Vec::new(),
            files: Vec::new(),
        }
    }

    pub fn set(&mut self, k: &str, v: &str) {
        if !VARS.contains(&k) {
            self.extra.push(k.to_owned());
        }
        // SAFETY: ENV_LOCK is held.
        unsafe { std::env::set_var(k, v) };
    }

    pub fn unset(&mut self, k: &str) {
        // SAFETY: ENV_LOCK is held.
        unsafe { std::env::remove_var(k) };
    }

    /// Writes `text` to a fresh temp file named `*.{ext}` and points
    /// `NCCL_TUNER_CONFIG_FILE` at it.
    pub fn config(&mut self, text: &str, ext: &str) -> PathBuf {
        let p = temp_file(text, ext);
        self.set("NCCL_TUNER_CONFIG_FILE", p.to_str().unwrap());
        self.files.push(p.clone());
        p
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for v in VARS
            .iter()
            .map(|s| s.to_string())
            .chain(self.extra.drain(..))
        {
            // SAFETY: ENV_LOCK is still held (the guard drops after this body).
            unsafe { std::env::remove_var(v) };
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

pub fn temp_file(text: &str, ext: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "cclkit-tuner-test-{}-{}.{ext}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&p, text).unwrap();
    p
}

pub const CANARY: f32 = 31337.25;
pub const NA: usize = 7;
pub const NP: usize = 3;
const PAD: usize = 4;

/// A flat float[7][3] cost table with canary floats on both sides.
pub struct Table {
    buf: [f32; PAD + NA * NP + PAD],
}

impl Table {
    /// `costs[a][p]`; -1 = unsupported.
    #[allow(clippy::needless_range_loop)]
    pub fn new(costs: [[f32; NP]; NA]) -> Self {
        let mut buf = [CANARY; PAD + NA * NP + PAD];
        for a in 0..NA {
            for p in 0..NP {
                buf[PAD + a * NP + p] = costs[a][p];
            }
        }
        Self { buf }
    }

    /// NCCL's typical offer: tree/ring × 3 protocols, PAT simple; the rest -1.
    pub fn typical() -> Self {
        let mut c = [[-1.0; NP]; NA];
        c[0] = [40.0, 35.0, 60.0];
        c[1] = [30.0, 25.0, 50.0];
        c[6][2] = 45.0;
        Self::new(c)
    }

    /// What NCCL passes as `float** collCostTable`.
    pub fn ptr(&mut self) -> *mut *mut f32 {
        self.buf[PAD..].as_mut_ptr().cast()
    }

    pub fn get(&self, a: usize, p: usize) -> f32 {
        self.buf[PAD + a * NP + p]
    }

    pub fn costs(&self) -> [[f32; NP]; NA] {
        std::array::from_fn(|a| std::array::from_fn(|p| self.get(a, p)))
    }

    pub fn canaries_intact(&self) -> bool {
        self.buf[..PAD].iter().all(|c| *c == CANARY)
            && self.buf[PAD + NA * NP..].iter().all(|c| *c == CANARY)
    }

    /// NCCL's pick: smallest non-negative, first in algo-major order.
    pub fn nccl_choice(&self) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize, f32)> = None;
        for a in 0..NA {
            for p in 0..NP {
                let c = self.get(a, p);
                if c >= 0.0 && best.is_none_or(|b| c < b.2) {
                    best = Some((a, p, c));
                }
            }
        }
        best.map(|(a, p, _)| (a, p))
    }

    #[allow(clippy::needless_range_loop)]
    /// Asserts what every call must guarantee relative to `before`: canaries
    /// intact, unsupported entries untouched, supported ones only lowered.
    pub fn assert_only_lowered(&self, before: &[[f32; NP]; NA]) {
        assert!(
            self.canaries_intact(),
            "canaries overwritten: {:?}",
            self.buf
        );
        for a in 0..NA {
            for p in 0..NP {
                let (old, new) = (before[a][p], self.get(a, p));
                if old < 0.0 {
                    assert_eq!(new, old, "unsupported entry [{a}][{p}] changed");
                } else {
                    assert!(new >= 0.0 && new <= old, "entry [{a}][{p}] {old} -> {new}");
                }
            }
        }
    }
}

/// An int with canaries on both sides, as NCCL's nChannels.
pub struct Channels {
    buf: [i32; 3],
}

impl Channels {
    pub fn new() -> Self {
        Self {
            buf: [0x5a5a5a5a, 0, 0x5a5a5a5a],
        }
    }
    pub fn ptr(&mut self) -> *mut i32 {
        &mut self.buf[1]
    }
    pub fn get(&self) -> i32 {
        assert_eq!(self.buf[0], 0x5a5a5a5a, "nChannels canary");
        assert_eq!(self.buf[2], 0x5a5a5a5a, "nChannels canary");
        self.buf[1]
    }
}

/// NCCL's 1152-byte constants struct with canaries on both sides.
#[repr(C)]
pub struct Constants {
    pre: [u64; 4],
    pub c: ncclTunerConstants_v5_t,
    post: [u64; 4],
}

const CONST_CANARY: u64 = 0xdead_beef_cafe_f00d;

impl Constants {
    pub fn new(c: ncclTunerConstants_v5_t) -> Box<Self> {
        Box::new(Self {
            pre: [CONST_CANARY; 4],
            c,
            post: [CONST_CANARY; 4],
        })
    }
    pub fn canaries_intact(&self) -> bool {
        self.pre
            .iter()
            .chain(&self.post)
            .all(|c| *c == CONST_CANARY)
    }
}

/// Collects everything logged through `tracing` while `f` runs on this thread.
pub fn capture_logs<R>(f: impl FnOnce() -> R) -> (R, String) {
    #[derive(Clone)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf(Arc::new(Mutex::new(Vec::new())));
    let w = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let r = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
    (r, text)
}
