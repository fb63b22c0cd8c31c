//! The exported tables seen as NCCL sees them, through `cclkit-host`'s adapter for
//! each version (int vs size_t sizes, ctx or not, the handle polled in place by
//! `connect`, the optional-completion sentinel).
//!
//! The tests were written against raw NCCL handles, so this keeps that shape: comms,
//! requests and registrations are opaque non-NULL [`Ptr`] keys into the host objects
//! kept here, NULL still means "not yet", and errors are the plugin's raw
//! `ncclResult_t` so tests can assert exact codes.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::{NcclResult, ptr};
use cclkit_host::CallError;
use cclkit_host::net::{
    CommConfig, ConnectHandle, Connecting, ListenComm, Mr, NetContext, NetPlugin, RecvBuffer,
    RecvComm, Request, SendComm,
};
use cclkit_net_socket::{ncclNetPlugin_v8, ncclNetPlugin_v11, ncclNetPlugin_v12};

/// `NCCL_PTR_HOST`.
pub const PTR_HOST: c_int = ptr::HOST;
/// `NCCL_PTR_CUDA`.
pub const PTR_CUDA: c_int = ptr::CUDA;
/// An opaque key standing for a comm, request or registration (never dereferenced).
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

    /// The statically linked table of this version, as the host drives it.
    fn plugin(self) -> NetPlugin {
        match self {
            Ver::V8 => NetPlugin::from_static(&ncclNetPlugin_v8),
            Ver::V11 => NetPlugin::from_static(&ncclNetPlugin_v11),
            Ver::V12 => NetPlugin::from_static(&ncclNetPlugin_v12),
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

/// The raw code of a failed call, logged with the host's full description.
fn code(e: CallError) -> NcclResult {
    eprintln!("{e}");
    e.code
}

/// Host objects behind the keys handed to tests.
#[derive(Default)]
struct Objects {
    last_key: usize,
    listens: HashMap<usize, ListenComm>,
    sends: HashMap<usize, SendComm>,
    recvs: HashMap<usize, RecvComm>,
    /// Connections in progress, by the address of the caller's handle buffer, with
    /// the handle bytes they started from.
    connecting: HashMap<usize, (ConnectHandle, Connecting)>,
    /// Request key → (comm key, request).
    requests: HashMap<usize, (usize, Request)>,
    /// Registration key → (comm key, registration).
    mrs: HashMap<usize, (usize, Mr)>,
}

impl Objects {
    fn key(&mut self) -> usize {
        self.last_key += 1;
        self.last_key
    }

    /// Forgets every request and registration of a comm being closed.
    fn forget(&mut self, comm: usize) {
        self.requests.retain(|_, (c, _)| *c != comm);
        self.mrs.retain(|_, (c, _)| *c != comm);
    }
}

/// The registration `mh` of `comm` among `mrs` (NULL = none).
fn mr_of(mrs: &HashMap<usize, (usize, Mr)>, comm: usize, mh: Ptr) -> Option<&Mr> {
    if mh.is_null() {
        return None;
    }
    match mrs.get(&key_of(mh)) {
        Some((c, mr)) if *c == comm => Some(mr),
        _ => panic!("{mh:?} is not a registration of comm {comm}"),
    }
}

fn key_of(p: Ptr) -> usize {
    p as usize
}

fn ptr_of(key: usize) -> Ptr {
    key as Ptr
}

/// One initialised plugin instance seen through one table version.
pub struct Plugin {
    pub ver: Ver,
    // Declared first so comms close before the context finalizes (the context would
    // wait for them anyway).
    objects: Mutex<Objects>,
    ctx: NetContext,
}

impl Plugin {
    /// `init` through table `ver` (per communicator for v11+, refcounted for v8).
    pub fn open(ver: Ver) -> Plugin {
        let ctx = ver
            .plugin()
            .init(7, CommConfig::default())
            .unwrap_or_else(|e| panic!("init v{} failed: {e}", ver.num()));
        Plugin {
            ver,
            objects: Mutex::new(Objects::default()),
            ctx,
        }
    }

    fn objects(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Name in the table.
    pub fn name(&self) -> String {
        self.ctx.plugin().name().to_owned()
    }

    /// `devices`.
    pub fn devices(&self) -> c_int {
        let n = self.ctx.devices().expect("devices");
        c_int::try_from(n).expect("device count fits an int")
    }

    /// `getProperties` through the version's own struct.
    pub fn properties(&self, dev: c_int) -> Result<Props, NcclResult> {
        let dev = usize::try_from(dev).map_err(|_| NcclResult::INVALID_ARGUMENT)?;
        let p = self.ctx.properties(dev).map_err(code)?;
        let v11 = self.ver != Ver::V8;
        Ok(Props {
            name: p.name,
            pci_path: p.pci_path,
            ptr_support: p.ptr_support,
            speed: p.speed_mbps,
            max_recvs: p.max_recvs,
            max_p2p_bytes: v11.then_some(p.max_p2p_bytes),
            max_coll_bytes: v11.then_some(p.max_coll_bytes),
        })
    }

    /// `listen`: the 128-byte handle and the listen comm.
    pub fn listen(&self, dev: c_int) -> Result<([u8; 128], Ptr), NcclResult> {
        let dev = usize::try_from(dev).map_err(|_| NcclResult::INVALID_ARGUMENT)?;
        let (handle, lc) = self.ctx.listen(dev).map_err(code)?;
        let mut o = self.objects();
        let key = o.key();
        o.listens.insert(key, lc);
        Ok((handle, ptr_of(key)))
    }

    /// One `connect` call on `handle` (the same buffer every time): NULL = not yet.
    pub fn connect(&self, dev: c_int, handle: &mut [u8; 128]) -> Result<Ptr, NcclResult> {
        let dev = usize::try_from(dev).map_err(|_| NcclResult::INVALID_ARGUMENT)?;
        let at = handle.as_ptr() as usize;
        let mut o = self.objects();
        // A new handle in a reused buffer starts a new connection.
        if o.connecting.get(&at).is_none_or(|(h, _)| h != handle) {
            let c = self.ctx.connect(dev, handle);
            o.connecting.insert(at, (*handle, c));
        }
        let (_, c) = o.connecting.get_mut(&at).expect("inserted above");
        match c.poll() {
            Ok(None) => Ok(std::ptr::null_mut()),
            Ok(Some(send)) => {
                o.connecting.remove(&at);
                let key = o.key();
                o.sends.insert(key, send);
                Ok(ptr_of(key))
            }
            Err(e) => {
                o.connecting.remove(&at);
                Err(code(e))
            }
        }
    }

    /// One `accept` call: NULL = not yet.
    pub fn accept(&self, lc: Ptr) -> Result<Ptr, NcclResult> {
        let mut o = self.objects();
        let listen = o
            .listens
            .get_mut(&key_of(lc))
            .unwrap_or_else(|| panic!("{lc:?} is not an open listen comm"));
        match listen.accept().map_err(code)? {
            None => Ok(std::ptr::null_mut()),
            Some(recv) => {
                let key = o.key();
                o.recvs.insert(key, recv);
                Ok(ptr_of(key))
            }
        }
    }

    /// Listens, then connects and accepts in turn until both are up (in-process pair).
    pub fn pair(&self, dev: c_int) -> (Ptr, Ptr) {
        let (mut handle, lc) = self.listen(dev).expect("listen");
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mut s, mut r): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
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

    /// `regMr` of `len` bytes at `data` on a send or receive comm.
    pub fn reg_mr(
        &self,
        comm: Ptr,
        data: *mut u8,
        len: usize,
        kind: c_int,
    ) -> Result<Ptr, NcclResult> {
        let mut o = self.objects();
        let c = key_of(comm);
        // SAFETY: the socket transport records the range and never dereferences it
        // (it copies from the buffers given to isend/irecv, whose contracts cover them).
        let mr = unsafe {
            if let Some(s) = o.sends.get_mut(&c) {
                s.reg_mr(data, len, kind)
            } else if let Some(r) = o.recvs.get_mut(&c) {
                r.reg_mr(data, len, kind)
            } else {
                panic!("{comm:?} is not an open send or receive comm")
            }
        }
        .map_err(code)?;
        let key = o.key();
        o.mrs.insert(key, (c, mr));
        Ok(ptr_of(key))
    }

    /// `deregMr`.
    pub fn dereg_mr(&self, comm: Ptr, mh: Ptr) {
        let mut o = self.objects();
        let c = key_of(comm);
        let (owner, mr) = o
            .mrs
            .remove(&key_of(mh))
            .unwrap_or_else(|| panic!("{mh:?} is not a registration"));
        assert_eq!(owner, c, "deregMr on another comm than regMr");
        let r = if let Some(s) = o.sends.get_mut(&c) {
            s.dereg_mr(mr)
        } else if let Some(r) = o.recvs.get_mut(&c) {
            r.dereg_mr(mr)
        } else {
            panic!("{comm:?} is not an open send or receive comm")
        };
        r.unwrap_or_else(|e| panic!("deregMr: {e}"));
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
        let mut guard = self.objects();
        let o = &mut *guard;
        let c = key_of(comm);
        let mr = mr_of(&o.mrs, c, mh);
        let send = o
            .sends
            .get_mut(&c)
            .unwrap_or_else(|| panic!("{comm:?} is not an open send comm"));
        // SAFETY: forwarded contract.
        let req = unsafe { send.isend(data, len, tag, mr) }.map_err(code)?;
        Ok(match req {
            None => std::ptr::null_mut(),
            Some(req) => {
                let key = o.key();
                o.requests.insert(key, (c, req));
                ptr_of(key)
            }
        })
    }

    /// One `irecv` call with `bufs.len()` buffers: NULL = not posted, retry. Like
    /// NCCL for LL protocols, a single receive carries the optional-completion
    /// sentinel (the host clears it for v8, as NCCL's shim does, and fails a plugin
    /// that leaves it in place).
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
        assert!(bufs.len() == tags.len() && bufs.len() == mhs.len());
        let mut guard = self.objects();
        let o = &mut *guard;
        let c = key_of(comm);
        let spec: Vec<RecvBuffer<'_>> = bufs
            .iter()
            .zip(tags)
            .zip(mhs)
            .map(|((&(data, size), &tag), &mh)| RecvBuffer {
                data,
                size,
                tag,
                mr: mr_of(&o.mrs, c, mh),
            })
            .collect();
        let recv = o
            .recvs
            .get_mut(&c)
            .unwrap_or_else(|| panic!("{comm:?} is not an open receive comm"));
        // SAFETY: forwarded contract.
        let req = unsafe { recv.irecv(&spec, bufs.len() == 1) }.map_err(code)?;
        drop(spec);
        Ok(match req {
            None => std::ptr::null_mut(),
            Some(req) => {
                let key = o.key();
                o.requests.insert(key, (c, req));
                ptr_of(key)
            }
        })
    }

    /// One `test` call; on completion the sizes are copied into `sizes` (which holds
    /// as many entries as the caller wants). A request is gone once it completed or
    /// failed, as in NCCL.
    pub fn test(&self, req: Ptr, sizes: &mut [c_int]) -> Result<bool, NcclResult> {
        let mut guard = self.objects();
        let o = &mut *guard;
        let key = key_of(req);
        let (c, request) = o
            .requests
            .get_mut(&key)
            .unwrap_or_else(|| panic!("{req:?} is not a pending request"));
        let r = if let Some(s) = o.sends.get_mut(c) {
            s.test(request)
        } else if let Some(r) = o.recvs.get_mut(c) {
            r.test(request)
        } else {
            panic!("request {req:?} outlived its comm")
        };
        match r {
            Ok(None) => Ok(false),
            Ok(Some(got)) => {
                o.requests.remove(&key);
                for (out, &n) in sizes.iter_mut().zip(got.as_slice()) {
                    *out = c_int::try_from(n).expect("sizes are ints in every version");
                }
                Ok(true)
            }
            Err(e) => {
                o.requests.remove(&key);
                Err(code(e))
            }
        }
    }

    /// `closeSend` (pending requests and registrations of the comm are forgotten).
    pub fn close_send(&self, c: Ptr) {
        let mut o = self.objects();
        let comm = o
            .sends
            .remove(&key_of(c))
            .unwrap_or_else(|| panic!("{c:?} is not an open send comm"));
        o.forget(key_of(c));
        comm.close().unwrap_or_else(|e| panic!("closeSend: {e}"));
    }

    /// `closeRecv` (pending requests and registrations of the comm are forgotten).
    pub fn close_recv(&self, c: Ptr) {
        let mut o = self.objects();
        let comm = o
            .recvs
            .remove(&key_of(c))
            .unwrap_or_else(|| panic!("{c:?} is not an open receive comm"));
        o.forget(key_of(c));
        comm.close().unwrap_or_else(|e| panic!("closeRecv: {e}"));
    }

    /// `closeListen`.
    pub fn close_listen(&self, c: Ptr) {
        let comm = self
            .objects()
            .listens
            .remove(&key_of(c))
            .unwrap_or_else(|| panic!("{c:?} is not an open listen comm"));
        comm.close().unwrap_or_else(|e| panic!("closeListen: {e}"));
    }
}
