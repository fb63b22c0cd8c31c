//! Calls the plugin's exported `ncclNetPlugin_v8` / `ncclNetPlugin_v12` statics
//! through their raw function pointers, with NCCL's exact argument shapes (int
//! sizes on v8; size_t sizes, profiler handles and per-comm init on v12).

use std::ffi::{CStr, c_int, c_void};
use std::ptr::null_mut;

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::net::ncclNetCommConfig_v10_t;
use cclkit_abi::raw::net::v8::ncclNetProperties_v8_t;
use cclkit_abi::raw::net::v12::ncclNetProperties_v12_t;
use cclkit_net_ofi::{ncclNetPlugin_v8, ncclNetPlugin_v12};

/// Result of a table call: the message names the call and the code.
pub type R<T> = Result<T, String>;

/// Which table the peer drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// `ncclNetPlugin_v8` (NCCL 2.20–2.23).
    V8,
    /// `ncclNetPlugin_v12` (NCCL 2.30).
    V12,
}

fn ok(what: &str, r: NcclResult) -> R<()> {
    if r.0 == 0 {
        Ok(())
    } else {
        Err(format!("{what} returned {} ({:?})", r.0, r.name()))
    }
}

macro_rules! f {
    ($table:expr, $slot:ident) => {
        $table
            .$slot
            .ok_or_else(|| format!("{} slot is NULL", stringify!($slot)))?
    };
}

/// Device properties the scenarios look at.
#[derive(Debug)]
pub struct Props {
    /// Device name.
    pub name: String,
    /// `NCCL_PTR_*` mask.
    pub ptr_support: i32,
    /// Largest grouped receive.
    pub max_recvs: i32,
    /// Link speed (Mbps).
    pub speed: i32,
}

/// An initialised plugin, as NCCL holds it.
pub struct Net {
    /// The table version in use.
    pub abi: Abi,
    ctx: *mut c_void,
}

/// Prints the plugin's log lines to stderr as `LOG <level> <text>`.
///
/// NCCL's logger is C-variadic, which stable Rust cannot define. cclkit plugins
/// always call it as `(…, "%s", text)`, and on the Linux x86-64 and AArch64
/// calling conventions a fixed-argument function receives those arguments in
/// the same registers, so this test tool passes one with the fixed shape.
unsafe extern "C" fn log_fixed(
    level: c_int,
    _flags: std::ffi::c_ulong,
    _file: *const std::ffi::c_char,
    _line: c_int,
    _fmt: *const std::ffi::c_char,
    text: *const std::ffi::c_char,
) {
    if !text.is_null() {
        // SAFETY: the plugin passes a NUL-terminated string for "%s".
        let t = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        eprintln!("LOG {level} {t}");
    }
}

fn logger() -> cclkit_abi::raw::common::ncclDebugLogger_t {
    if cfg!(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )) {
        type Fixed = unsafe extern "C" fn(
            c_int,
            std::ffi::c_ulong,
            *const std::ffi::c_char,
            c_int,
            *const std::ffi::c_char,
            *const std::ffi::c_char,
        );
        type Variadic = unsafe extern "C" fn(
            cclkit_abi::raw::common::LogLevel,
            std::ffi::c_ulong,
            *const std::ffi::c_char,
            c_int,
            *const std::ffi::c_char,
            ...
        );
        // SAFETY: see `log_fixed`; same argument registers on these targets.
        Some(unsafe { std::mem::transmute::<Fixed, Variadic>(log_fixed as Fixed) })
    } else {
        None
    }
}

impl Net {
    /// `init` (v8: once per process; v12: per communicator, with a context).
    pub fn init(abi: Abi) -> R<Self> {
        let mut ctx = null_mut();
        // SAFETY: NCCL's calling sequence: init before anything else; a NULL logger
        // and profiler are allowed.
        unsafe {
            match abi {
                Abi::V8 => ok("v8 init", f!(ncclNetPlugin_v8, init)(logger()))?,
                Abi::V12 => {
                    let mut cfg = ncclNetCommConfig_v10_t { trafficClass: -1 };
                    ok(
                        "v12 init",
                        f!(ncclNetPlugin_v12, init)(&mut ctx, 0x5eed, &mut cfg, logger(), None),
                    )?
                }
            }
        }
        Ok(Self { abi, ctx })
    }

    /// `devices`.
    pub fn devices(&self) -> R<i32> {
        let mut n = 0;
        // SAFETY: after init; `n` is writable.
        unsafe {
            match self.abi {
                Abi::V8 => ok("devices", f!(ncclNetPlugin_v8, devices)(&mut n))?,
                Abi::V12 => ok("devices", f!(ncclNetPlugin_v12, devices)(&mut n))?,
            }
        }
        Ok(n)
    }

    /// `getProperties`.
    pub fn props(&self, dev: i32) -> R<Props> {
        // SAFETY: after init; the props structs are writable and the returned name
        // stays valid while the library is loaded.
        unsafe {
            let (name, ptr_support, max_recvs, speed) = match self.abi {
                Abi::V8 => {
                    let mut p: ncclNetProperties_v8_t = std::mem::zeroed();
                    ok(
                        "getProperties",
                        f!(ncclNetPlugin_v8, getProperties)(dev, &mut p),
                    )?;
                    (p.name, p.ptrSupport, p.maxRecvs, p.speed)
                }
                Abi::V12 => {
                    let mut p: ncclNetProperties_v12_t = std::mem::zeroed();
                    ok(
                        "getProperties",
                        f!(ncclNetPlugin_v12, getProperties)(dev, &mut p),
                    )?;
                    (p.name, p.ptrSupport, p.maxRecvs, p.speed)
                }
            };
            let name = if name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            };
            Ok(Props {
                name,
                ptr_support,
                max_recvs,
                speed,
            })
        }
    }

    /// `listen`: fills the 128-byte handle.
    pub fn listen(&self, dev: i32, handle: &mut [u8; 128]) -> R<*mut c_void> {
        let mut l = null_mut();
        let h = handle.as_mut_ptr().cast();
        // SAFETY: 128 writable handle bytes, writable out-pointer.
        unsafe {
            match self.abi {
                Abi::V8 => ok("listen", f!(ncclNetPlugin_v8, listen)(dev, h, &mut l))?,
                Abi::V12 => ok(
                    "listen",
                    f!(ncclNetPlugin_v12, listen)(self.ctx, dev, h, &mut l),
                )?,
            }
        }
        Ok(l)
    }

    /// One `connect` attempt (NULL = call again with the same handle).
    pub fn connect(&self, dev: i32, handle: &mut [u8; 128]) -> R<*mut c_void> {
        let mut s = null_mut();
        let mut dev_comm = null_mut();
        let h = handle.as_mut_ptr().cast();
        // SAFETY: the peer's handle, the same memory on every retry.
        unsafe {
            match self.abi {
                Abi::V8 => ok(
                    "connect",
                    f!(ncclNetPlugin_v8, connect)(dev, h, &mut s, &mut dev_comm),
                )?,
                Abi::V12 => ok(
                    "connect",
                    f!(ncclNetPlugin_v12, connect)(self.ctx, dev, h, &mut s, &mut dev_comm),
                )?,
            }
        }
        Ok(s)
    }

    /// One `accept` attempt (NULL = call again).
    pub fn accept(&self, listen: *mut c_void) -> R<*mut c_void> {
        let mut r = null_mut();
        let mut dev_comm = null_mut();
        // SAFETY: a listen comm from `listen`.
        unsafe {
            match self.abi {
                Abi::V8 => ok(
                    "accept",
                    f!(ncclNetPlugin_v8, accept)(listen, &mut r, &mut dev_comm),
                )?,
                Abi::V12 => ok(
                    "accept",
                    f!(ncclNetPlugin_v12, accept)(listen, &mut r, &mut dev_comm),
                )?,
            }
        }
        Ok(r)
    }

    /// `regMr` of host memory.
    pub fn reg_mr(&self, comm: *mut c_void, data: *mut u8, len: usize) -> R<*mut c_void> {
        let mut mh = null_mut();
        let host = cclkit_abi::raw::common::ptr::HOST;
        // SAFETY: `data` is valid for `len` bytes until `dereg_mr`.
        unsafe {
            match self.abi {
                Abi::V8 => ok(
                    "regMr",
                    f!(ncclNetPlugin_v8, regMr)(comm, data.cast(), len, host, &mut mh),
                )?,
                Abi::V12 => ok(
                    "regMr",
                    f!(ncclNetPlugin_v12, regMr)(comm, data.cast(), len, host, &mut mh),
                )?,
            }
        }
        Ok(mh)
    }

    /// `deregMr`.
    pub fn dereg_mr(&self, comm: *mut c_void, mh: *mut c_void) -> R<()> {
        // SAFETY: a registration of `comm`.
        unsafe {
            match self.abi {
                Abi::V8 => ok("deregMr", f!(ncclNetPlugin_v8, deregMr)(comm, mh)),
                Abi::V12 => ok("deregMr", f!(ncclNetPlugin_v12, deregMr)(comm, mh)),
            }
        }
    }

    /// One `isend` attempt (NULL request = retry later).
    pub fn isend(
        &self,
        comm: *mut c_void,
        data: *mut u8,
        len: usize,
        tag: i32,
        mh: *mut c_void,
    ) -> R<*mut c_void> {
        let mut req = null_mut();
        // SAFETY: `data` stays valid until the request completes.
        unsafe {
            match self.abi {
                Abi::V8 => {
                    let len = c_int::try_from(len).map_err(|_| "v8 isend size overflows int")?;
                    ok(
                        "isend",
                        f!(ncclNetPlugin_v8, isend)(comm, data.cast(), len, tag, mh, &mut req),
                    )?
                }
                Abi::V12 => ok(
                    "isend",
                    f!(ncclNetPlugin_v12, isend)(
                        comm,
                        data.cast(),
                        len,
                        tag,
                        mh,
                        null_mut(),
                        &mut req,
                    ),
                )?,
            }
        }
        Ok(req)
    }

    /// One (grouped) `irecv` attempt: `(data, capacity, tag, mhandle)` per buffer.
    pub fn irecv(
        &self,
        comm: *mut c_void,
        bufs: &[(*mut u8, usize, i32, *mut c_void)],
    ) -> R<*mut c_void> {
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| b.0.cast()).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.2).collect();
        let mut mhs: Vec<*mut c_void> = bufs.iter().map(|b| b.3).collect();
        let n = bufs.len() as c_int;
        let mut req = null_mut();
        // SAFETY: arrays of `n` entries; buffers valid until completion.
        unsafe {
            match self.abi {
                Abi::V8 => {
                    let mut sizes = bufs
                        .iter()
                        .map(|b| c_int::try_from(b.1))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|_| "v8 irecv size overflows int")?;
                    ok(
                        "irecv",
                        f!(ncclNetPlugin_v8, irecv)(
                            comm,
                            n,
                            data.as_mut_ptr(),
                            sizes.as_mut_ptr(),
                            tags.as_mut_ptr(),
                            mhs.as_mut_ptr(),
                            &mut req,
                        ),
                    )?
                }
                Abi::V12 => {
                    let mut sizes: Vec<usize> = bufs.iter().map(|b| b.1).collect();
                    let mut ph: Vec<*mut c_void> = vec![null_mut(); bufs.len()];
                    ok(
                        "irecv",
                        f!(ncclNetPlugin_v12, irecv)(
                            comm,
                            n,
                            data.as_mut_ptr(),
                            sizes.as_mut_ptr(),
                            tags.as_mut_ptr(),
                            mhs.as_mut_ptr(),
                            ph.as_mut_ptr(),
                            &mut req,
                        ),
                    )?
                }
            }
        }
        Ok(req)
    }

    /// `test`: `Some(sizes)` when done.
    pub fn test(&self, req: *mut c_void, n: usize) -> R<Option<Vec<i32>>> {
        let mut done = 0;
        // NCCL's own `int sizes[NCCL_NET_MAX_RECVS]`-style stack array: no
        // allocation while polling.
        let mut sizes = [-1i32; 64];
        if n > sizes.len() {
            return Err(format!("test of {n} buffers"));
        }
        // SAFETY: a live request; `sizes` has room for its buffers.
        unsafe {
            match self.abi {
                Abi::V8 => ok(
                    "test",
                    f!(ncclNetPlugin_v8, test)(req, &mut done, sizes.as_mut_ptr()),
                )?,
                Abi::V12 => ok(
                    "test",
                    f!(ncclNetPlugin_v12, test)(req, &mut done, sizes.as_mut_ptr()),
                )?,
            }
        }
        Ok((done != 0).then(|| sizes[..n.max(1)].to_vec()))
    }

    /// `closeSend` / `closeRecv` / `closeListen`.
    pub fn close(&self, kind: Close, comm: *mut c_void) -> R<()> {
        // SAFETY: a live comm of that kind.
        unsafe {
            match (self.abi, kind) {
                (Abi::V8, Close::Send) => ok("closeSend", f!(ncclNetPlugin_v8, closeSend)(comm)),
                (Abi::V8, Close::Recv) => ok("closeRecv", f!(ncclNetPlugin_v8, closeRecv)(comm)),
                (Abi::V8, Close::Listen) => {
                    ok("closeListen", f!(ncclNetPlugin_v8, closeListen)(comm))
                }
                (Abi::V12, Close::Send) => ok("closeSend", f!(ncclNetPlugin_v12, closeSend)(comm)),
                (Abi::V12, Close::Recv) => ok("closeRecv", f!(ncclNetPlugin_v12, closeRecv)(comm)),
                (Abi::V12, Close::Listen) => {
                    ok("closeListen", f!(ncclNetPlugin_v12, closeListen)(comm))
                }
            }
        }
    }

    /// v12 `finalize` (v8 hosts never finalize).
    pub fn finalize(self) -> R<()> {
        match self.abi {
            Abi::V8 => Ok(()),
            // SAFETY: the context from init, once.
            Abi::V12 => unsafe { ok("finalize", f!(ncclNetPlugin_v12, finalize)(self.ctx)) },
        }
    }
}

/// Which close call.
#[derive(Debug, Clone, Copy)]
pub enum Close {
    /// `closeSend`.
    Send,
    /// `closeRecv`.
    Recv,
    /// `closeListen`.
    Listen,
}
