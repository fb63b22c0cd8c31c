//! Support for cclkit's cross-crate integration tests: finding packaged plugins and
//! example peers, canary-guarded buffers, deterministic random data, child processes
//! with timeouts.
//!
//! The tests load the `.so` files `make package` installs under NCCL's names, so
//! they exercise exactly what NCCL would load. They drive them through `cclkit-host`
//! (a dev-dependency), the loader NCCL's own shims are modelled on.

pub mod cplugin;
pub mod props;

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};

/// Directory of packaged plugins: `CCLKIT_LIB_DIR`, else `<workspace>/build/lib`.
pub fn lib_dir() -> PathBuf {
    std::env::var_os("CCLKIT_LIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build/lib"))
}

/// Path of a packaged plugin, e.g. `plugin("libnccl-net-template.so")`.
///
/// Panics with the command to run when it is missing, so a test never silently skips.
pub fn plugin(file: &str) -> PathBuf {
    let path = lib_dir().join(file);
    assert!(
        path.exists(),
        "{} is missing: run `make package` first (or set CCLKIT_LIB_DIR)",
        path.display()
    );
    path
}

/// Path of example `name` of the package whose test is running: cargo puts test
/// binaries in `target/<profile>/deps/` and examples in `target/<profile>/examples/`.
///
/// `cargo test -p <package>` builds examples; a run narrowed with `--test` does not,
/// so a missing example panics with the command that builds it.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("path of the running test");
    let profile_dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("test binary inside target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo test` for the whole package, or \
         `cargo build --examples` with the same profile, first",
        path.display()
    );
    path
}

/// Fills `buf` with bytes derived from `seed` (both peers can regenerate them).
pub fn fill(seed: u64, buf: &mut [u8]) {
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(buf);
}

/// Deterministic bytes for message `index` of a run seeded with `seed`.
pub fn message(seed: u64, index: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(
        seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        &mut v,
    );
    v
}

/// Bytes placed before and after a guarded value.
pub const CANARY: u8 = 0xA5;
/// Number of canary bytes on each side.
pub const CANARY_LEN: usize = 64;

/// A buffer of `len` bytes with canaries on both sides, to catch writes past a
/// struct of exactly that size.
pub struct Guarded {
    bytes: Vec<u64>,
    len: usize,
}

impl Guarded {
    /// A zeroed, 8-byte aligned region of `len` bytes between canaries.
    pub fn new(len: usize) -> Self {
        let total = CANARY_LEN * 2 + len;
        let mut bytes = vec![0u64; total.div_ceil(8)];
        let b = Self::as_bytes_of(&mut bytes);
        b.fill(CANARY);
        b[CANARY_LEN..CANARY_LEN + len].fill(0);
        Self { bytes, len }
    }

    fn as_bytes_of(v: &mut [u64]) -> &mut [u8] {
        // SAFETY: u64 storage reinterpreted as bytes; alignment only decreases.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 8) }
    }

    /// Pointer to the guarded region.
    pub fn ptr<T>(&mut self) -> *mut T {
        // SAFETY: CANARY_LEN is a multiple of 8, so the region stays 8-byte aligned.
        unsafe { self.bytes.as_mut_ptr().cast::<u8>().add(CANARY_LEN).cast() }
    }

    /// Reads the region as a `T` (which must be plain data of at most `len` bytes).
    pub fn read<T: Copy>(&mut self) -> T {
        assert!(std::mem::size_of::<T>() <= self.len);
        // SAFETY: size checked; the region is aligned and initialised.
        unsafe { self.ptr::<T>().read() }
    }

    /// Offsets of canary bytes that were overwritten (empty when intact).
    pub fn damaged(&mut self) -> Vec<usize> {
        let len = self.len;
        let b = Self::as_bytes_of(&mut self.bytes);
        (0..CANARY_LEN)
            .chain(CANARY_LEN + len..CANARY_LEN * 2 + len)
            .filter(|&i| b[i] != CANARY)
            .collect()
    }
}

/// Waits for `child` up to `timeout`, killing it when the time is up.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Runs a command to completion with a timeout; panics (naming it) if it overruns.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {desc}: {e}"));
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => out.unwrap_or_else(|e| panic!("wait {desc}: {e}")),
        Err(_) => {
            // SAFETY: plain kill(2) on the child's pid.
            unsafe { libc::kill(id as i32, libc::SIGKILL) };
            panic!("{desc} did not finish within {timeout:?}");
        }
    }
}

/// Records that `test` could not run here and why: one `cclkit-skip: TEST: WHY` line
/// written straight to stderr (libtest captures only `print!`), which `make test`'s
/// summary (`tests/skips.sh`) lists. Call it only where skipping is legitimate (e.g. not
/// root); where a test must run, fail instead.
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    let line = format!("cclkit-skip: {test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Whether this process runs as root (CI's case: namespace tests must run there).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this machine has the NVIDIA driver library (`libcuda.so.1`).
pub fn cuda_driver_present() -> bool {
    ["libcuda.so.1", "libcuda.so"]
        .iter()
        // SAFETY: only probes whether the NVIDIA driver library can be loaded.
        .any(|n| unsafe { libloading::Library::new(*n) }.is_ok())
}
