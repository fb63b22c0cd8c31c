//! The exported tables seen as NCCL sees them: one wrapper method per call, every
//! version's argument shapes (int vs size_t sizes, ctx or not, the handle polled in
//! place by `connect`).

use std::ffi::{CStr, c_int, c_void};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::net::v8::ncclNetProperties_v8_t;
use cclkit_abi::raw::net::v11::ncclNetProperties_v11_t;
use cclkit_abi::raw::net::v12::ncclNetProperties_v12_t;
use cclkit_abi::raw::net::{NCCL_NET_OPTIONAL_RECV_COMPLETION, ncclNetCommConfig_v10_t};
use cclkit_net_socket::{ncclNetPlugin_v8, ncclNetPlugin_v11, ncclNetPlugin_v12};

/// `NCCL_PTR_HOST`.
pub const PTR_HOST: c_int = 1;
/// `NCCL_PTR_CUDA`.
pub const PTR_CUDA: c_int = 2;
/// A raw pointer NCCL passes around (comm, request, mhandle).
pub type Ptr = *mut c_void;

/// Which exported table to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ver {
    /// NCCL 2.20–2.23 (int sizes, no ctx).
    V8,
    /// NCCL 2.28–2.29.
    V11,
    /// NCCL 2.30.
    V12,
}

impl Ver {
    /// Every version under test.
    pub const ALL: [Ver; 3] = [Ver::V8, Ver::V11, Ver::V12];

    /// Parses "8"/"11"/"12".
    pub fn parse(s: &str) -> Ver {
        match s {
            "8" => Ver::V8,
            "11" => Ver::V11,
            _ => Ver::V12,
        }
    }

    /// The number as a string (for child processes).
    pub fn num(self) -> &'static str {
        match self {
            Ver::V8 => "8",
            Ver::V11 => "11",
            Ver::V12 => "12",
        }
    }
}

/// Properties common to every version.
#[derive(Debug, Clone)]
pub struct Props {
    pub name: String,
    pub pci_path: Option<String>,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub max_recvs: c_int,
    pub max_p2p_bytes: Option<usize>,
    pub max_coll_bytes: Option<usize>,
}

fn ok(r: NcclResult, what: &str) -> Result<(), NcclResult> {
    if r.is_ok() {
        Ok(())
    } else {
        eprintln!("{what} returned {r:?}");
        Err(r)
    }
}

fn cstr(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: the plugin returns NULL or a NUL-terminated string it keeps alive.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// One initialised plugin instance seen through one table version.
pub struct Plugin {
    pub ver: Ver,
    ctx: Ptr,
}

// SAFETY: ctx is the plugin's context pointer; the plugin is thread-safe.
unsafe impl Send for Plugin {}

impl Plugin {
    /// `init` through table `ver` (per communicator for v11+, refcounted for v8).
    pub fn open(ver: Ver) -> Plugin {
        let mut ctx: Ptr = null_mut();
        let mut config = ncclNetCommConfig_v10_t { trafficClass: -1 };
        // SAFETY: NCCL's calling convention for each version's init.
        let r = unsafe {
            match ver {
                Ver::V8 => (ncclNetPlugin_v8.init.unwrap())(None),
                Ver::V11 => (ncclNetPlugin_v11.init.unwrap())(&mut ctx, 7, &mut config, None, None),
                Ver::V12 => (ncclNetPlugin_v12.init.unwrap())(&mut ctx, 7, &mut config, None, None),
            }
        };
        assert!(r.is_ok(), "init v{} failed: {r:?}", ver.num());
        Plugin { ver, ctx }
    }

    /// Name in the table.
    pub fn name(&self) -> String {
        let p = match self.ver {
            Ver::V8 => ncclNetPlugin_v8.name,
            Ver::V11 => ncclNetPlugin_v11.name,
            Ver::V12 => ncclNetPlugin_v12.name,
        };
        cstr(p).unwrap_or_default()
    }

    /// `devices`.
    pub fn devices(&self) -> c_int {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.devices.unwrap())(&mut n),
                Ver::V11 => (ncclNetPlugin_v11.devices.unwrap())(&mut n),
                Ver::V12 => (ncclNetPlugin_v12.devices.unwrap())(&mut n),
            }
        };
        assert!(r.is_ok());
        n
    }

    /// `getProperties` into the version's own struct.
    pub fn properties(&self, dev: c_int) -> Result<Props, NcclResult> {
        // SAFETY: each call gets a zeroed struct of its own version's layout.
        unsafe {
            match self.ver {
                Ver::V8 => {
                    let mut p: ncclNetProperties_v8_t = std::mem::zeroed();
                    ok(
                        (ncclNetPlugin_v8.getProperties.unwrap())(dev, &mut p),
                        "props",
                    )?;
                    Ok(Props {
                        name: cstr(p.name).unwrap_or_default(),
                        pci_path: cstr(p.pciPath),
                        ptr_support: p.ptrSupport,
                        speed: p.speed,
                        max_recvs: p.maxRecvs,
                        max_p2p_bytes: None,
                        max_coll_bytes: None,
                    })
                }
                Ver::V11 => {
                    let mut p: ncclNetProperties_v11_t = std::mem::zeroed();
                    ok(
                        (ncclNetPlugin_v11.getProperties.unwrap())(dev, &mut p),
                        "props",
                    )?;
                    Ok(Props {
                        name: cstr(p.name).unwrap_or_default(),
                        pci_path: cstr(p.pciPath),
                        ptr_support: p.ptrSupport,
                        speed: p.speed,
                        max_recvs: p.maxRecvs,
                        max_p2p_bytes: Some(p.maxP2pBytes),
                        max_coll_bytes: Some(p.maxCollBytes),
                    })
                }
                Ver::V12 => {
                    let mut p: ncclNetProperties_v12_t = std::mem::zeroed();
                    ok(
                        (ncclNetPlugin_v12.getProperties.unwrap())(dev, &mut p),
                        "props",
                    )?;
                    Ok(Props {
                        name: cstr(p.name).unwrap_or_default(),
                        pci_path: cstr(p.pciPath),
                        ptr_support: p.ptrSupport,
                        speed: p.speed,
                        max_recvs: p.maxRecvs,
                        max_p2p_bytes: Some(p.maxP2pBytes),
                        max_coll_bytes: Some(p.maxCollBytes),
                    })
                }
            }
        }
    }

    /// `listen`: the 128-byte handle and the listen comm.
    pub fn listen(&self, dev: c_int) -> Result<([u8; 128], Ptr), NcclResult> {
        let mut handle = [0xa5u8; 128];
        let mut lc: Ptr = null_mut();
        let h = handle.as_mut_ptr().cast();
        // SAFETY: 128-byte handle buffer and a valid out-pointer.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.listen.unwrap())(dev, h, &mut lc),
                Ver::V11 => (ncclNetPlugin_v11.listen.unwrap())(self.ctx, dev, h, &mut lc),
                Ver::V12 => (ncclNetPlugin_v12.listen.unwrap())(self.ctx, dev, h, &mut lc),
            }
        };
        ok(r, "listen")?;
        assert!(!lc.is_null());
        Ok((handle, lc))
    }

    /// One `connect` call on `handle` (the same buffer every time): NULL = not yet.
    pub fn connect(&self, dev: c_int, handle: &mut [u8; 128]) -> Result<Ptr, NcclResult> {
        let mut sc: Ptr = null_mut();
        let mut dev_comm = null_mut();
        let h = handle.as_mut_ptr().cast();
        // SAFETY: NCCL's convention: same handle pointer on every retry.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.connect.unwrap())(dev, h, &mut sc, &mut dev_comm),
                Ver::V11 => {
                    (ncclNetPlugin_v11.connect.unwrap())(self.ctx, dev, h, &mut sc, &mut dev_comm)
                }
                Ver::V12 => {
                    (ncclNetPlugin_v12.connect.unwrap())(self.ctx, dev, h, &mut sc, &mut dev_comm)
                }
            }
        };
        ok(r, "connect")?;
        Ok(sc)
    }

    /// One `accept` call: NULL = not yet.
    pub fn accept(&self, lc: Ptr) -> Result<Ptr, NcclResult> {
        let mut rc: Ptr = null_mut();
        let mut dev_comm = null_mut();
        // SAFETY: valid listen comm and out-pointers.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.accept.unwrap())(lc, &mut rc, &mut dev_comm),
                Ver::V11 => (ncclNetPlugin_v11.accept.unwrap())(lc, &mut rc, &mut dev_comm),
                Ver::V12 => (ncclNetPlugin_v12.accept.unwrap())(lc, &mut rc, &mut dev_comm),
            }
        };
        ok(r, "accept")?;
        Ok(rc)
    }

    /// Listens, then connects and accepts in turn until both are up (in-process pair).
    pub fn pair(&self, dev: c_int) -> (Ptr, Ptr) {
        let (mut handle, lc) = self.listen(dev).expect("listen");
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mut s, mut r): (Ptr, Ptr) = (null_mut(), null_mut());
        while s.is_null() || r.is_null() {
            assert!(Instant::now() < deadline, "pair setup timed out");
            if s.is_null() {
                s = self.connect(dev, &mut handle).expect("connect");
            }
            if r.is_null() {
                r = self.accept(lc).expect("accept");
            }
        }
        self.close_listen(lc);
        (s, r)
    }

    /// `regMr` of `len` bytes at `data`.
    pub fn reg_mr(
        &self,
        comm: Ptr,
        data: *mut u8,
        len: usize,
        kind: c_int,
    ) -> Result<Ptr, NcclResult> {
        let mut mh: Ptr = null_mut();
        // SAFETY: valid comm and out-pointer; the plugin does not touch the memory.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.regMr.unwrap())(comm, data.cast(), len, kind, &mut mh),
                Ver::V11 => {
                    (ncclNetPlugin_v11.regMr.unwrap())(comm, data.cast(), len, kind, &mut mh)
                }
                Ver::V12 => {
                    (ncclNetPlugin_v12.regMr.unwrap())(comm, data.cast(), len, kind, &mut mh)
                }
            }
        };
        ok(r, "regMr")?;
        Ok(mh)
    }

    /// `deregMr`.
    pub fn dereg_mr(&self, comm: Ptr, mh: Ptr) {
        // SAFETY: a registration of `comm`.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.deregMr.unwrap())(comm, mh),
                Ver::V11 => (ncclNetPlugin_v11.deregMr.unwrap())(comm, mh),
                Ver::V12 => (ncclNetPlugin_v12.deregMr.unwrap())(comm, mh),
            }
        };
        assert!(r.is_ok(), "deregMr: {r:?}");
    }

    /// One `isend` call: NULL = not posted, retry.
    ///
    /// # Safety
    /// `data..data+len` must stay valid until the request completes.
    pub unsafe fn isend(
        &self,
        comm: Ptr,
        data: *mut u8,
        len: usize,
        tag: c_int,
        mh: Ptr,
    ) -> Result<Ptr, NcclResult> {
        let mut req: Ptr = null_mut();
        // SAFETY: forwarded contract.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.isend.unwrap())(
                    comm,
                    data.cast(),
                    len as c_int,
                    tag,
                    mh,
                    &mut req,
                ),
                Ver::V11 => (ncclNetPlugin_v11.isend.unwrap())(
                    comm,
                    data.cast(),
                    len,
                    tag,
                    mh,
                    null_mut(),
                    &mut req,
                ),
                Ver::V12 => (ncclNetPlugin_v12.isend.unwrap())(
                    comm,
                    data.cast(),
                    len,
                    tag,
                    mh,
                    null_mut(),
                    &mut req,
                ),
            }
        };
        ok(r, "isend")?;
        Ok(req)
    }

    /// One `irecv` call with `bufs.len()` buffers: NULL = not posted, retry. Like
    /// NCCL for LL protocols, a single receive carries the optional-completion sentinel.
    ///
    /// # Safety
    /// Every buffer must stay valid until the request completes.
    pub unsafe fn irecv(
        &self,
        comm: Ptr,
        bufs: &[(*mut u8, usize)],
        tags: &[c_int],
        mhs: &[Ptr],
    ) -> Result<Ptr, NcclResult> {
        let n = bufs.len();
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| b.0.cast()).collect();
        let mut tags = tags.to_vec();
        let mut mhs = mhs.to_vec();
        let mut req: Ptr = if n == 1 {
            NCCL_NET_OPTIONAL_RECV_COMPLETION as Ptr
        } else {
            null_mut()
        };
        // SAFETY: arrays of n entries; forwarded contract.
        let r = unsafe {
            match self.ver {
                Ver::V8 => {
                    let mut sizes: Vec<c_int> = bufs.iter().map(|b| b.1 as c_int).collect();
                    req = null_mut(); // the v6–v8 shims clear the sentinel
                    (ncclNetPlugin_v8.irecv.unwrap())(
                        comm,
                        n as c_int,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mhs.as_mut_ptr(),
                        &mut req,
                    )
                }
                Ver::V11 => {
                    let mut sizes: Vec<usize> = bufs.iter().map(|b| b.1).collect();
                    (ncclNetPlugin_v11.irecv.unwrap())(
                        comm,
                        n as c_int,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mhs.as_mut_ptr(),
                        null_mut(),
                        &mut req,
                    )
                }
                Ver::V12 => {
                    let mut sizes: Vec<usize> = bufs.iter().map(|b| b.1).collect();
                    (ncclNetPlugin_v12.irecv.unwrap())(
                        comm,
                        n as c_int,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mhs.as_mut_ptr(),
                        null_mut(),
                        &mut req,
                    )
                }
            }
        };
        ok(r, "irecv")?;
        assert_ne!(
            req as usize, NCCL_NET_OPTIONAL_RECV_COMPLETION,
            "sentinel left in *request"
        );
        Ok(req)
    }

    /// One `test` call; `sizes` must hold as many entries as the request has buffers.
    pub fn test(&self, req: Ptr, sizes: &mut [c_int]) -> Result<bool, NcclResult> {
        let mut done: c_int = 0;
        // SAFETY: a live request; sizes large enough.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.test.unwrap())(req, &mut done, sizes.as_mut_ptr()),
                Ver::V11 => (ncclNetPlugin_v11.test.unwrap())(req, &mut done, sizes.as_mut_ptr()),
                Ver::V12 => (ncclNetPlugin_v12.test.unwrap())(req, &mut done, sizes.as_mut_ptr()),
            }
        };
        if r.is_ok() { Ok(done == 1) } else { Err(r) }
    }

    /// `closeSend`.
    pub fn close_send(&self, c: Ptr) {
        // SAFETY: a live send comm.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.closeSend.unwrap())(c),
                Ver::V11 => (ncclNetPlugin_v11.closeSend.unwrap())(c),
                Ver::V12 => (ncclNetPlugin_v12.closeSend.unwrap())(c),
            }
        };
        assert!(r.is_ok(), "closeSend: {r:?}");
    }

    /// `closeRecv`.
    pub fn close_recv(&self, c: Ptr) {
        // SAFETY: a live receive comm.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.closeRecv.unwrap())(c),
                Ver::V11 => (ncclNetPlugin_v11.closeRecv.unwrap())(c),
                Ver::V12 => (ncclNetPlugin_v12.closeRecv.unwrap())(c),
            }
        };
        assert!(r.is_ok(), "closeRecv: {r:?}");
    }

    /// `closeListen`.
    pub fn close_listen(&self, c: Ptr) {
        // SAFETY: a live listen comm.
        let r = unsafe {
            match self.ver {
                Ver::V8 => (ncclNetPlugin_v8.closeListen.unwrap())(c),
                Ver::V11 => (ncclNetPlugin_v11.closeListen.unwrap())(c),
                Ver::V12 => (ncclNetPlugin_v12.closeListen.unwrap())(c),
            }
        };
        assert!(r.is_ok(), "closeListen: {r:?}");
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // SAFETY: the ctx our init produced (v11+); v8 has no finalize.
        unsafe {
            match self.ver {
                Ver::V8 => {}
                Ver::V11 => {
                    let _ = (ncclNetPlugin_v11.finalize.unwrap())(self.ctx);
                }
                Ver::V12 => {
                    let _ = (ncclNetPlugin_v12.finalize.unwrap())(self.ctx);
                }
            }
        }
    }
}
