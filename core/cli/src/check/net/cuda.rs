//! Contract checks on CUDA memory, for a device that advertises `NCCL_PTR_CUDA`
//! (NCCL_ABI.md §2.11, §2.11b): NCCL then registers GPU buffers with
//! `regMr(NCCL_PTR_CUDA)`, posts sends and receives on them, and after a receive
//! into GPU memory calls `iflush` so the data the NIC wrote is visible to kernels.
//!
//! The buffers come from the CUDA driver the plugin itself sees (`libcuda.so.1`,
//! found like the plugin finds it): a GPU's, or under `--cuda-standin` the
//! stand-in's. The checks write and read device memory only through
//! `cuMemcpyHtoD`/`cuMemcpyDtoH` and never touch it from the host, so they mean the
//! same on a GPU. Device buffers are never freed, like every check buffer: a plugin
//! may still touch the buffers of requests a failing check abandoned.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::time::Instant;

use cclkit_abi::raw::common::ptr;
use cclkit_abi::raw::net::NetDeviceType;
use cclkit_host::net::{Mr, RecvBuffer, Request};

use super::setup::{self, Flow, OP_LIMIT, Ready, buffer, no_device, reg_recv, reg_send};
use crate::check::child::{Env, step};
use crate::check::rng::Rng;
use crate::check::{Checked, Stop, fail};

type CuResult = c_int;
/// `cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)`.
type MemAllocFn = unsafe extern "C" fn(*mut u64, usize) -> CuResult;
/// `cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)`.
type HtoDFn = unsafe extern "C" fn(u64, *const c_void, usize) -> CuResult;
/// `cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)`.
type DtoHFn = unsafe extern "C" fn(*mut c_void, u64, usize) -> CuResult;

/// The driver functions the checks use, from `libcuda.so.1`.
struct Driver {
    mem_alloc: MemAllocFn,
    htod: HtoDFn,
    dtoh: DtoHFn,
}

/// One device allocation (an address in device memory, not dereferenceable here).
#[derive(Clone, Copy)]
struct DevBuf {
    addr: u64,
    len: usize,
}

impl DevBuf {
    /// The address `off` bytes in, as the plugin receives it.
    fn at(self, off: usize) -> *mut u8 {
        (self.addr as usize + off) as *mut u8
    }
}

/// `dlsym` of `name` in `lib`, as a C string literal.
fn sym(lib: *mut c_void, name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: `lib` is a handle dlopen returned; `name` is NUL-terminated.
    let f = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if f.is_null() {
        Err(format!("libcuda.so.1 has no {}", name.to_string_lossy()))
    } else {
        Ok(f)
    }
}

impl Driver {
    /// Loads the driver, initialises it and makes device 0's primary context current.
    fn open() -> Result<Self, String> {
        // SAFETY: dlopen of a library by name; its constructors run as in any host.
        let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated string.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                "unknown error".to_owned()
            } else {
                // SAFETY: non-NULL dlerror text, read at once.
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!("cannot load libcuda.so.1: {why}"));
        }
        // SAFETY: each symbol is the documented driver function with this C signature.
        unsafe {
            let init: unsafe extern "C" fn(c_uint) -> CuResult =
                std::mem::transmute(sym(lib, c"cuInit")?);
            let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult =
                std::mem::transmute(sym(lib, c"cuDevicePrimaryCtxRetain")?);
            let set: unsafe extern "C" fn(*mut c_void) -> CuResult =
                std::mem::transmute(sym(lib, c"cuCtxSetCurrent")?);
            let name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult =
                std::mem::transmute(sym(lib, c"cuGetErrorName")?);
            let named = |r: CuResult| {
                let mut s: *const c_char = std::ptr::null();
                if name(r, &mut s) == 0 && !s.is_null() {
                    format!("{} ({r})", CStr::from_ptr(s).to_string_lossy())
                } else {
                    format!("CUresult {r}")
                }
            };
            let r = init(0);
            if r != 0 {
                return Err(format!("cuInit: {}", named(r)));
            }
            let mut ctx = std::ptr::null_mut();
            let r = retain(&mut ctx, 0);
            if r != 0 {
                return Err(format!("cuDevicePrimaryCtxRetain(0): {}", named(r)));
            }
            let r = set(ctx);
            if r != 0 {
                return Err(format!("cuCtxSetCurrent: {}", named(r)));
            }
            Ok(Self {
                mem_alloc: std::mem::transmute::<*mut c_void, MemAllocFn>(sym(
                    lib,
                    c"cuMemAlloc_v2",
                )?),
                htod: std::mem::transmute::<*mut c_void, HtoDFn>(sym(lib, c"cuMemcpyHtoD_v2")?),
                dtoh: std::mem::transmute::<*mut c_void, DtoHFn>(sym(lib, c"cuMemcpyDtoH_v2")?),
            })
        }
    }

    /// `len` bytes of device memory (never freed, see the module docs).
    fn alloc(&self, len: usize) -> Result<DevBuf, Stop> {
        let mut addr = 0u64;
        // SAFETY: cuMemAlloc writes one device address.
        let r = unsafe { (self.mem_alloc)(&mut addr, len.max(1)) };
        if r != 0 || addr == 0 {
            return Err(Stop::Skip(format!(
                "cuMemAlloc({len}) failed (CUresult {r}): no device memory to check with"
            )));
        }
        Ok(DevBuf { addr, len })
    }

    /// Copies `data` to `off` bytes into `buf`.
    fn upload(&self, buf: DevBuf, off: usize, data: &[u8]) -> Result<(), Stop> {
        assert!(off + data.len() <= buf.len, "upload past the allocation");
        // SAFETY: the range lies inside `buf` (asserted), `data` is host memory.
        let r = unsafe { (self.htod)(buf.addr + off as u64, data.as_ptr().cast(), data.len()) };
        if r != 0 {
            return fail!("cuMemcpyHtoD of {} bytes failed (CUresult {r})", data.len());
        }
        Ok(())
    }

    /// `len` bytes from `off` bytes into `buf`.
    fn download(&self, buf: DevBuf, off: usize, len: usize) -> Result<Vec<u8>, Stop> {
        assert!(off + len <= buf.len, "download past the allocation");
        let mut out = vec![0u8; len];
        // SAFETY: as in `upload`, the other way.
        let r = unsafe { (self.dtoh)(out.as_mut_ptr().cast(), buf.addr + off as u64, len) };
        if r != 0 {
            return fail!("cuMemcpyDtoH of {len} bytes failed (CUresult {r})");
        }
        Ok(out)
    }
}

/// A connected pair on a plugin whose device 0 takes CUDA memory, and the driver.
fn open(env: &Env) -> Result<(Ready, Flow, Driver), Stop> {
    let r = Ready::new(env)?;
    if r.props.device_type != NetDeviceType::HOST {
        return Err(Stop::Skip(format!(
            "device 0 is of type {:?} (GPU offload): proxy transfers do not apply",
            r.props.device_type
        )));
    }
    if r.props.ptr_support & ptr::CUDA == 0 {
        return Err(Stop::Skip(
            "device 0 does not advertise NCCL_PTR_CUDA: NCCL never gives it GPU memory".into(),
        ));
    }
    step("load the CUDA driver and make device 0 current");
    let driver = Driver::open().map_err(|e| {
        no_device(
            env,
            format!(
                "the plugin advertises NCCL_PTR_CUDA but no CUDA driver is usable here ({e}); \
                 --cuda-standin provides one"
            ),
        )
    })?;
    let flow = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    Ok((r, flow, driver))
}

/// One side of a transfer: where the bytes are and their registration.
struct Side<'a> {
    data: *mut u8,
    mr: &'a Mr,
}

/// Posts one receive of `recv_len` bytes and one send of `len` bytes, retrying NULL
/// requests, and tests both (oldest first) until done; returns (sent, received).
fn exchange(
    flow: &mut Flow,
    send: &Side<'_>,
    len: usize,
    recv: &Side<'_>,
    recv_len: usize,
    tag: i32,
) -> Result<(usize, usize), Stop> {
    let deadline = Instant::now() + OP_LIMIT;
    let rbufs = [RecvBuffer {
        data: recv.data,
        size: recv_len,
        tag,
        mr: Some(recv.mr),
    }];
    let (mut rreq, mut sreq): (Option<Request>, Option<Request>) = (None, None);
    let (mut got, mut sent) = (None, None);
    while got.is_none() || sent.is_none() {
        if Instant::now() > deadline {
            return fail!(
                "a {len}-byte transfer between CUDA buffers did not complete within {} s \
                 (receive {}, send {})",
                OP_LIMIT.as_secs(),
                if got.is_some() { "done" } else { "pending" },
                if sent.is_some() { "done" } else { "pending" }
            );
        }
        if got.is_none() && rreq.is_none() {
            // SAFETY: the device buffer outlives the request (never freed).
            rreq = unsafe { flow.recv.irecv(&rbufs, false) }?;
        }
        if sent.is_none() && sreq.is_none() {
            // SAFETY: as above.
            sreq = unsafe { flow.send.isend(send.data, len, tag, Some(send.mr)) }?;
        }
        if let Some(req) = rreq.as_mut()
            && let Some(sizes) = flow.recv.test(req)?
        {
            got = Some(sizes.as_slice().first().copied().unwrap_or(0));
            rreq = None;
        }
        if let Some(req) = sreq.as_mut()
            && let Some(sizes) = flow.send.test(req)?
        {
            sent = Some(sizes.as_slice().first().copied().unwrap_or(0));
            sreq = None;
        }
        std::thread::yield_now();
    }
    Ok((sent.unwrap_or(0), got.unwrap_or(0)))
}

/// regMr(NCCL_PTR_CUDA) of device buffers of several sizes, at the start of an
/// allocation and inside one (NCCL carves slots out of one buffer), on both comms;
/// each released once.
pub(crate) fn regmr(env: &Env) -> Checked {
    let (_r, mut flow, driver) = open(env)?;
    let mut mrs = (Vec::new(), Vec::new());
    let sizes = [1usize, 4097, 1 << 20];
    for &n in &sizes {
        step(format!(
            "regMr(NCCL_PTR_CUDA) of {n} device bytes on both comms"
        ));
        let a = driver.alloc(n + 4096)?;
        let b = driver.alloc(n + 4096)?;
        // SAFETY: device memory of at least n bytes from those offsets, never freed.
        unsafe {
            mrs.0.push(flow.send.reg_mr(a.at(0), n, ptr::CUDA)?);
            mrs.1.push(flow.recv.reg_mr(b.at(4096), n, ptr::CUDA)?);
        }
    }
    let count = mrs.0.len() + mrs.1.len();
    step("deregMr of every CUDA registration");
    for m in mrs.0 {
        flow.send.dereg_mr(m)?;
    }
    for m in mrs.1 {
        flow.recv.dereg_mr(m)?;
    }
    flow.close()?;
    Ok(format!(
        "{count} CUDA registrations (1 B … 1 MiB, at and inside allocations) on both comms, \
         each released once"
    ))
}

/// Random data between device buffers at odd sizes (and into larger receives), and
/// between host and device buffers both ways; read back through the driver.
pub(crate) fn sendrecv(env: &Env) -> Checked {
    let (_r, mut flow, driver) = open(env)?;
    let mut rng = Rng::new(env.seed, 4000);
    let max = 1 << 20;
    let (sdev, rdev) = (driver.alloc(max)?, driver.alloc(max + 64)?);
    // SAFETY: both allocations are at least this large and never freed.
    let smr = unsafe { flow.send.reg_mr(sdev.at(0), max, ptr::CUDA) }?;
    // SAFETY: as above.
    let rmr = unsafe { flow.recv.reg_mr(rdev.at(0), max + 64, ptr::CUDA) }?;
    let (shost, rhost) = (buffer(max), buffer(max + 64));
    let shmr = reg_send(&mut flow.send, shost)?;
    let rhmr = reg_recv(&mut flow.recv, rhost)?;
    let mut sizes = vec![0usize, 1, 7, 4095, 65_537, max];
    sizes.push(rng.range(2, max - 1));
    let mut count = 0;
    for (i, &n) in sizes.iter().enumerate() {
        let data = rng.bytes(n);
        let extra = rng.range(0, 64);
        let tag = i32::try_from(i).unwrap_or(0);
        for (what, from_dev, to_dev) in [
            ("device to device", true, true),
            ("host to device", false, true),
            ("device to host", true, false),
        ] {
            step(format!(
                "{what}: {n} bytes into a {}-byte receive",
                n + extra
            ));
            let fill = vec![0xA5u8; n + extra];
            let send = if from_dev {
                driver.upload(sdev, 0, &data)?;
                Side {
                    data: sdev.at(0),
                    mr: &smr,
                }
            } else {
                shost[..n].copy_from_slice(&data);
                Side {
                    data: shost.as_mut_ptr(),
                    mr: &shmr,
                }
            };
            let recv = if to_dev {
                driver.upload(rdev, 0, &fill)?;
                Side {
                    data: rdev.at(0),
                    mr: &rmr,
                }
            } else {
                rhost[..n + extra].copy_from_slice(&fill);
                Side {
                    data: rhost.as_mut_ptr(),
                    mr: &rhmr,
                }
            };
            let (sent, got) = exchange(&mut flow, &send, n, &recv, n + extra, tag)?;
            let back = if to_dev {
                driver.download(rdev, 0, n + extra)?
            } else {
                rhost[..n + extra].to_vec()
            };
            if sent != n || got != n {
                return fail!("{what}, {n} bytes: test reported {sent} sent and {got} received");
            }
            if let Some(at) = (0..n).find(|&k| back[k] != data[k]) {
                return fail!(
                    "{what}, {n} bytes: byte {at} arrived as {:#04x}, sent {:#04x}",
                    back[at],
                    data[at]
                );
            }
            if back[n..].iter().any(|&b| b != 0xA5) {
                return fail!("{what}, {n} bytes: the receive was written past the message");
            }
            count += 1;
        }
    }
    flow.send.dereg_mr(smr)?;
    flow.send.dereg_mr(shmr)?;
    flow.recv.dereg_mr(rmr)?;
    flow.recv.dereg_mr(rhmr)?;
    flow.close()?;
    Ok(format!(
        "{count} transfers (0 B … 1 MiB, device↔device, host→device, device→host) arrived \
         exact, nothing written past them"
    ))
}

/// After each receive into device memory, iflush of that buffer completes and the
/// data stays intact (NCCL flushes GPU receives when the plugin sets forceFlush, and
/// whenever its topology says PCI writes need it).
pub(crate) fn flush(env: &Env) -> Checked {
    let (r, mut flow, driver) = open(env)?;
    let force = r.props.force_flush;
    let mut rng = Rng::new(env.seed, 4100);
    let max = 256 * 1024;
    let (sdev, rdev) = (driver.alloc(max)?, driver.alloc(max)?);
    // SAFETY: both allocations are this large and never freed.
    let smr = unsafe { flow.send.reg_mr(sdev.at(0), max, ptr::CUDA) }?;
    // SAFETY: as above.
    let rmr = unsafe { flow.recv.reg_mr(rdev.at(0), max, ptr::CUDA) }?;
    let mut flushed = 0;
    for (i, n) in [1usize, 4099, rng.range(2, max)].into_iter().enumerate() {
        let data = rng.bytes(n);
        driver.upload(sdev, 0, &data)?;
        let tag = i32::try_from(i).unwrap_or(0);
        let send = Side {
            data: sdev.at(0),
            mr: &smr,
        };
        let recv = Side {
            data: rdev.at(0),
            mr: &rmr,
        };
        step(format!("receive {n} bytes into device memory"));
        exchange(&mut flow, &send, n, &recv, n, tag)?;
        step(format!("iflush of the {n}-byte device receive"));
        let bufs = [RecvBuffer {
            data: rdev.at(0),
            size: n,
            tag,
            mr: Some(&rmr),
        }];
        // SAFETY: the device buffer is never freed.
        let req = match unsafe { flow.recv.iflush(&bufs) } {
            Ok(req) => req,
            Err(e) if e.to_string().contains("no 'iflush' function") => {
                return if force {
                    fail!("forceFlush is 1 but the table has no iflush: NCCL would call NULL")
                } else {
                    Err(Stop::Skip(
                        "the table has no iflush and forceFlush is 0: NCCL flushes through \
                         its own path"
                            .into(),
                    ))
                };
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(mut req) = req {
            let deadline = Instant::now() + OP_LIMIT;
            while flow.recv.test(&mut req)?.is_none() {
                if Instant::now() > deadline {
                    return fail!(
                        "the iflush request of a {n}-byte device receive did not complete \
                         within {} s",
                        OP_LIMIT.as_secs()
                    );
                }
                std::thread::yield_now();
            }
        }
        if driver.download(rdev, 0, n)? != data {
            return fail!("after iflush the {n}-byte device receive holds other bytes");
        }
        flushed += 1;
    }
    flow.send.dereg_mr(smr)?;
    flow.recv.dereg_mr(rmr)?;
    flow.close()?;
    Ok(format!(
        "{flushed} device receives (1 B … 256 KiB) each flushed with iflush, which completed; \
         data intact (forceFlush {})",
        u8::from(force)
    ))
}
