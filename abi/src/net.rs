//! The `Net` trait plugin authors implement, and the safe types it speaks.
//!
//! One `impl Net` plus one [`export_net!`](crate::export_net) line publishes
//! `ncclNetPlugin_v6` … `ncclNetPlugin_v12`. The adapters under `export/` do what
//! NCCL's own version shims do (size narrowing, per-version property layouts,
//! refcounted init for pre-v11 hosts, v10 config-as-context) so the trait only sees
//! the current semantics:
//!
//! * one plugin instance per process (`init` on first use, dropped after the last
//!   communicator's `finalize`), one [`Net::Context`] per communicator;
//! * `connect`/`accept` are non-blocking: return `Ok(None)` until ready and keep
//!   state in the [`NetHandle`] (see [`NetHandle::set_pending`]);
//! * `isend`/`irecv` may return `Ok(None)` ("not now, retry"); requests complete
//!   in posting order per connection; [`Net::test`] reports sizes.
//!
//! Threads: NCCL calls a given comm from one proxy thread at a time, but different
//! comms from different threads, so the plugin is `Sync` and comms are `Send`.

use std::ffi::{CStr, c_int, c_void};
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::raw::common::ptr;
use crate::raw::net::{
    MAX_COLLNET_SIZE, NCCL_NET_HANDLE_MAXSIZE, NCCL_NET_ID_UNDEF, NetDeviceType, ncclNetAttr_v11_t,
};

/// What the host told the plugin at its first `init`.
#[derive(Debug, Clone, Copy)]
pub struct InitArgs {
    /// The net ABI version the host called `init` through (12 for NCCL 2.30, 11 for
    /// 2.28–2.29, …): a plugin can tell which NCCL generation loaded it.
    pub host_abi: u32,
    /// The profiler callback NCCL passed to `init` (v10+; disabled before v10 or
    /// when no profiler is loaded). Requests get it bound to their own handle as a
    /// [`RequestProfiler`](crate::profiler::net::RequestProfiler).
    pub profiler: crate::profiler::net::NetProfiler,
}

/// Per-communicator configuration (`ncclNetCommConfig_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommConfig {
    /// Traffic class asked for by the communicator, `None` when unset (-1).
    pub traffic_class: Option<i32>,
}

/// Device properties in the current (v12) shape; the adapters write the subset and
/// layout each older version has, never more bytes than its struct.
#[derive(Debug, Clone, PartialEq)]
pub struct Properties {
    /// Device name for logs (e.g. the interface name).
    pub name: String,
    /// Realpath of the device's `/sys` PCI directory, `None` for a virtual NIC.
    pub pci_path: Option<String>,
    /// Same guid ⇒ same physical port.
    pub guid: u64,
    /// `NCCL_PTR_*` bitmask ([`crate::raw::common::ptr`]).
    pub ptr_support: i32,
    /// Registrations are not tied to one comm.
    pub reg_is_global: bool,
    /// NCCL must flush after every GPU receive.
    pub force_flush: bool,
    /// Link speed in Mbps.
    pub speed_mbps: i32,
    /// Port number.
    pub port: i32,
    /// Latency in µs (0 = NCCL default).
    pub latency_us: f32,
    /// Maximum number of comms.
    pub max_comms: i32,
    /// Maximum `n` in a grouped `irecv` (≥ 1).
    pub max_recvs: i32,
    /// Device offload type (HOST for every host-memory transport).
    pub device_type: NetDeviceType,
    /// Device offload version.
    pub device_version: i32,
    /// Physical devices fused into this device; empty means "just this device".
    pub vdevs: Vec<i32>,
    /// NCCL cuts point-to-point transfers to this size (1 B … 1 TiB).
    pub max_p2p_bytes: usize,
    /// NCCL cuts collective transfers to this size (1 B … 1 TiB).
    pub max_coll_bytes: usize,
    /// Multi-request size; 1 = none.
    pub max_multi_request_size: i32,
    /// Rail id, -1 = ignore.
    pub rail_id: i16,
    /// Plane id, -1 = ignore.
    pub plane_id: i16,
}

impl Properties {
    /// Properties with NCCL's defaults for a host-memory device named `name`:
    /// HOST pointers only, 10 Gb/s, one receive per `irecv`, 1 TiB p2p and 512 MiB
    /// collective limits, no rail/plane.
    pub fn host(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            pci_path: None,
            guid: 0,
            ptr_support: ptr::HOST,
            reg_is_global: false,
            force_flush: false,
            speed_mbps: 10_000,
            port: 0,
            latency_us: 0.0,
            max_comms: 65_536,
            max_recvs: 1,
            device_type: NetDeviceType::HOST,
            device_version: 0,
            vdevs: Vec::new(),
            max_p2p_bytes: crate::raw::net::NCCL_MAX_NET_SIZE_BYTES,
            max_coll_bytes: MAX_COLLNET_SIZE,
            max_multi_request_size: 1,
            rail_id: NCCL_NET_ID_UNDEF,
            plane_id: NCCL_NET_ID_UNDEF,
        }
    }
}

/// The 128-byte listen handle NCCL ships to the peer (`NCCL_NET_HANDLE_MAXSIZE`).
///
/// Bytes `0..PAYLOAD` are the plugin's (address, magic, …). The last 16 bytes are
/// reserved for [`set_pending`](Self::set_pending): NCCL re-calls `connect` with the
/// **same handle pointer**, so a non-blocking connect keeps its progress there.
#[repr(C)]
pub struct NetHandle {
    bytes: [u8; NCCL_NET_HANDLE_MAXSIZE],
}

const PENDING_MAGIC_AT: usize = NetHandle::PAYLOAD;
const PENDING_PTR_AT: usize = NetHandle::PAYLOAD + 8;

impl NetHandle {
    /// Bytes available to the plugin.
    pub const PAYLOAD: usize = NCCL_NET_HANDLE_MAXSIZE - 16;

    /// A zeroed handle (what the adapters pass to `listen`).
    pub const fn zeroed() -> Self {
        Self {
            bytes: [0; NCCL_NET_HANDLE_MAXSIZE],
        }
    }

    /// The plugin's bytes.
    pub fn payload(&self) -> &[u8; Self::PAYLOAD] {
        self.bytes[..Self::PAYLOAD]
            .try_into()
            .unwrap_or(&[0; Self::PAYLOAD])
    }

    /// The plugin's bytes, writable.
    pub fn payload_mut(&mut self) -> &mut [u8; Self::PAYLOAD] {
        let (head, _) = self
            .bytes
            .split_first_chunk_mut::<{ Self::PAYLOAD }>()
            .unwrap_or_else(|| unreachable!());
        head
    }

    /// All 128 bytes (what travels to the peer).
    pub fn as_bytes(&self) -> &[u8; NCCL_NET_HANDLE_MAXSIZE] {
        &self.bytes
    }

    /// Reinterprets a 128-byte buffer as a handle.
    pub fn from_bytes_mut(bytes: &mut [u8; NCCL_NET_HANDLE_MAXSIZE]) -> &mut Self {
        // SAFETY: `NetHandle` is `repr(C)` over exactly this array type.
        unsafe { &mut *(bytes as *mut [u8; NCCL_NET_HANDLE_MAXSIZE]).cast::<Self>() }
    }

    /// Stores in-progress connect state until the next `connect` call on this handle.
    ///
    /// The state is tagged with a per-process secret and its type, so bytes that came
    /// from the peer can never be mistaken for a pointer.
    pub fn set_pending<T: Send + 'static>(&mut self, state: Box<T>) {
        let raw = Box::into_raw(state) as usize as u64;
        self.bytes[PENDING_MAGIC_AT..PENDING_PTR_AT]
            .copy_from_slice(&pending_tag::<T>(raw).to_ne_bytes());
        self.bytes[PENDING_PTR_AT..].copy_from_slice(&raw.to_ne_bytes());
    }

    /// Takes the state stored by [`set_pending`](Self::set_pending), if any.
    pub fn take_pending<T: Send + 'static>(&mut self) -> Option<Box<T>> {
        let tag = u64::from_ne_bytes(
            self.bytes[PENDING_MAGIC_AT..PENDING_PTR_AT]
                .try_into()
                .ok()?,
        );
        let raw = u64::from_ne_bytes(self.bytes[PENDING_PTR_AT..].try_into().ok()?);
        if raw == 0 || tag != pending_tag::<T>(raw) {
            return None;
        }
        self.bytes[PENDING_MAGIC_AT..].fill(0);
        // SAFETY: the tag proves `raw` came from `Box::<T>::into_raw` in `set_pending`
        // in this process, and zeroing the slot above makes this the only take.
        Some(unsafe { Box::from_raw(raw as usize as *mut T) })
    }
}

/// Tag binding a pending pointer to its type and to this process.
fn pending_tag<T: 'static>(raw: u64) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    use std::sync::OnceLock;
    static SECRET: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    let mut h = SECRET.get_or_init(Default::default).build_hasher();
    std::any::TypeId::of::<T>().hash(&mut h);
    raw.hash(&mut h);
    h.finish() | 1
}

/// A memory range handed to `regMr`.
#[derive(Debug, Clone, Copy)]
pub struct MemRegion {
    /// Start address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// `NCCL_PTR_HOST` or `NCCL_PTR_CUDA`.
    pub kind: i32,
}

/// Either side of a connection (what `regMr`/`deregMr` receive).
pub enum CommRef<'a, N: Net> {
    /// A send comm.
    Send(&'a N::SendComm),
    /// A receive comm.
    Recv(&'a N::RecvComm),
}

/// A data buffer owned by NCCL, valid until the request that uses it completes.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `Buf` is an address plus a length; NCCL keeps the memory alive until the
// request completes and does not touch it meanwhile, so the transport may move it
// to a helper thread.
unsafe impl Send for Buf {}
// SAFETY: as above; shared access only reads the address.
unsafe impl Sync for Buf {}

impl Buf {
    /// Wraps a raw buffer.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until every request
    /// using this buffer has completed, or `len` must be 0.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Self { ptr, len }
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, for reading.
    ///
    /// # Safety
    /// No other thread may write the buffer during `'a`, and the request using it
    /// must still be in flight.
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the caller upholds validity (constructor contract) and exclusivity.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// No other reference to the buffer may exist during `'a`, and the request using
    /// it must still be in flight.
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: the caller upholds validity (constructor contract) and exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// One buffer of a (grouped) receive or flush.
pub struct RecvBuf<'a, M> {
    /// Where the data lands.
    pub buf: Buf,
    /// Tag the matching send must carry (NCCL passes the sender's rank).
    pub tag: i32,
    /// Registration returned by `reg_mr`, `None` if NCCL passed NULL.
    pub mr: Option<&'a M>,
}

// Manual impls: a `RecvBuf` holds only a reference to `M`, so it is `Copy` whatever `M` is.
impl<M> Clone for RecvBuf<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for RecvBuf<'_, M> {}

/// Where `test` reports completed sizes (NCCL's `int* sizes`, possibly NULL).
pub struct Sizes<'a> {
    ptr: *mut c_int,
    _out: PhantomData<&'a mut c_int>,
}

impl Sizes<'_> {
    /// Most entries NCCL provides for a receive (`int sizes[64]`).
    pub const MAX: usize = 64;

    /// Wraps NCCL's `sizes` out-pointer.
    ///
    /// # Safety
    /// `ptr` must be NULL or point to at least as many `int`s as the request has buffers.
    pub unsafe fn from_raw(ptr: *mut c_int) -> Self {
        Self {
            ptr,
            _out: PhantomData,
        }
    }

    /// Reports the size of buffer `index` (0 for a send); narrows to `int` like NCCL.
    ///
    /// `index` must be below the number of buffers of the request being tested.
    pub fn set(&mut self, index: usize, size: usize) -> Result<()> {
        if self.ptr.is_null() {
            return Ok(());
        }
        if index >= Self::MAX {
            return Err(Error::internal(format!(
                "size index {index} beyond NCCL's {} entries",
                Self::MAX
            )));
        }
        let value = c_int::try_from(size).map_err(|_| {
            Error::internal(format!("completed size {size} does not fit test()'s int"))
        })?;
        // SAFETY: non-NULL and `index` is within the request's buffers (constructor
        // contract), itself at most 64.
        unsafe { self.ptr.add(index).write(value) };
        Ok(())
    }
}

/// A value that travels through C as an opaque, non-NULL `void*` (requests).
///
/// # Safety
/// `from_raw(into_raw(x))` must give back `x`, `into_raw` must never return the
/// address 1 (`NCCL_NET_OPTIONAL_RECV_COMPLETION`), and the pointer must stay
/// valid until `from_raw` is called on it once.
pub unsafe trait RawHandle: Send + Sized + 'static {
    /// Gives up ownership as a pointer.
    fn into_raw(self) -> NonNull<c_void>;
    /// Takes back ownership.
    ///
    /// # Safety
    /// `ptr` must come from `into_raw` of this type and not have been taken back yet.
    unsafe fn from_raw(ptr: NonNull<c_void>) -> Self;
}

// SAFETY: `Box::into_raw` round-trips with `Box::from_raw`; the const assertion rules
// out zero-sized `T`, whose dangling pointer could equal the sentinel 1.
unsafe impl<T: Send + 'static> RawHandle for Box<T> {
    fn into_raw(self) -> NonNull<c_void> {
        const {
            assert!(
                std::mem::size_of::<T>() != 0,
                "requests must not be zero-sized"
            )
        };
        // SAFETY: `Box::into_raw` never returns NULL.
        unsafe { NonNull::new_unchecked(Box::into_raw(self).cast()) }
    }

    unsafe fn from_raw(ptr: NonNull<c_void>) -> Self {
        // SAFETY: the caller guarantees `ptr` came from `into_raw` above.
        unsafe { Box::from_raw(ptr.as_ptr().cast()) }
    }
}

/// A network transport, written once and exported as every net ABI version.
pub trait Net: Sized + Send + Sync + 'static {
    /// The name NCCL logs and matches against `NCCL_NET` (case-insensitively).
    const NAME: &'static CStr;
    /// Publish `regMrDmaBuf` (NCCL only checks for it at init; set `ptr::DMABUF` too).
    const SUPPORTS_DMABUF: bool = false;
    /// Publish `irecvConsumed` (NCCL then calls it for every completed receive).
    const HAS_IRECV_CONSUMED: bool = false;
    /// Publish `setNetAttr` (v11+).
    const HAS_SET_NET_ATTR: bool = false;
    /// Publish `makeVDevice` (v9+).
    const HAS_MAKE_VDEVICE: bool = false;

    /// Per-communicator state (one per `init` on v11+ hosts).
    type Context: Send + Sync + 'static;
    /// A listening endpoint.
    type ListenComm: Send + 'static;
    /// The sending side of a connection.
    type SendComm: Send + 'static;
    /// The receiving side of a connection.
    type RecvComm: Send + 'static;
    /// A memory registration.
    type Mr: Send + Sync + 'static;
    /// An in-flight operation.
    type Request: RawHandle;

    /// Creates the process-wide instance: discovers devices, reads the environment.
    /// Failing here (e.g. no usable device) makes NCCL fall back to another transport.
    fn init(args: &InitArgs) -> Result<Self>;

    /// Number of devices (must be > 0 for NCCL to use the plugin).
    fn devices(&self) -> usize;

    /// Properties of device `dev` (< `devices()`).
    fn properties(&self, dev: usize) -> Result<Properties>;

    /// Opens the state of one communicator.
    fn open_context(&self, comm_id: u64, config: CommConfig) -> Result<Self::Context>;

    /// Releases a communicator's state (its comms are already closed).
    fn close_context(&self, ctx: Self::Context) -> Result<()> {
        drop(ctx);
        Ok(())
    }

    /// Starts listening on `dev`; fills `handle` (zeroed on entry) for the peer.
    fn listen(
        &self,
        ctx: &Self::Context,
        dev: usize,
        handle: &mut NetHandle,
    ) -> Result<Self::ListenComm>;

    /// Connects to the peer described by `handle`; `Ok(None)` = call again later with
    /// the same handle.
    fn connect(
        &self,
        ctx: &Self::Context,
        dev: usize,
        handle: &mut NetHandle,
    ) -> Result<Option<Self::SendComm>>;

    /// Accepts the next connection; `Ok(None)` = call again later. The result must
    /// not depend on `listen` staying open (NCCL closes it right after).
    fn accept(&self, listen: &mut Self::ListenComm) -> Result<Option<Self::RecvComm>>;

    /// Registers memory for use with `comm`.
    fn reg_mr(&self, comm: CommRef<'_, Self>, region: MemRegion) -> Result<Self::Mr>;

    /// Registers a dma-buf (only called when [`Net::SUPPORTS_DMABUF`]).
    fn reg_mr_dmabuf(
        &self,
        comm: CommRef<'_, Self>,
        region: MemRegion,
        offset: u64,
        fd: i32,
    ) -> Result<Self::Mr> {
        let _ = (comm, region, offset, fd);
        Err(Error::unsupported("regMrDmaBuf"))
    }

    /// Releases a registration.
    fn dereg_mr(&self, comm: CommRef<'_, Self>, mr: Self::Mr) -> Result<()> {
        let _ = comm;
        drop(mr);
        Ok(())
    }

    /// Posts a send of `buf` with `tag`; `Ok(None)` = not now, NCCL retries.
    fn isend(
        &self,
        comm: &mut Self::SendComm,
        buf: Buf,
        tag: i32,
        mr: Option<&Self::Mr>,
    ) -> Result<Option<Self::Request>>;

    /// Posts a (grouped) receive; `optional_completion` is NCCL's hint that the
    /// request may complete early (LL protocols). `Ok(None)` = not now.
    fn irecv(
        &self,
        comm: &mut Self::RecvComm,
        bufs: &[RecvBuf<'_, Self::Mr>],
        optional_completion: bool,
    ) -> Result<Option<Self::Request>>;

    /// [`isend`](Self::isend) with the request's profiler (v10+ hosts; a disabled
    /// one otherwise). Override it to report the transport's own events; the
    /// default ignores the profiler.
    fn isend_profiled(
        &self,
        comm: &mut Self::SendComm,
        buf: Buf,
        tag: i32,
        mr: Option<&Self::Mr>,
        profiler: crate::profiler::net::RequestProfiler,
    ) -> Result<Option<Self::Request>> {
        let _ = profiler;
        self.isend(comm, buf, tag, mr)
    }

    /// [`irecv`](Self::irecv) with the request's profiler, holding one handle per
    /// buffer of the group ([`RequestProfiler::for_buffer`]; `start` reports under
    /// the first); the default ignores it.
    ///
    /// [`RequestProfiler::for_buffer`]: crate::profiler::net::RequestProfiler::for_buffer
    fn irecv_profiled(
        &self,
        comm: &mut Self::RecvComm,
        bufs: &[RecvBuf<'_, Self::Mr>],
        optional_completion: bool,
        profiler: crate::profiler::net::RequestProfiler,
    ) -> Result<Option<Self::Request>> {
        let _ = profiler;
        self.irecv(comm, bufs, optional_completion)
    }

    /// Makes received GPU data visible; `Ok(None)` = nothing to wait for.
    fn iflush(
        &self,
        comm: &mut Self::RecvComm,
        bufs: &[RecvBuf<'_, Self::Mr>],
    ) -> Result<Option<Self::Request>> {
        let _ = (comm, bufs);
        Ok(None)
    }

    /// Polls a request: `Ok(true)` when done (sizes reported; the request is then
    /// dropped). An error also ends the request.
    fn test(request: &mut Self::Request, sizes: &mut Sizes<'_>) -> Result<bool>;

    /// Closes a send comm, releasing everything it holds (requests may be in flight).
    fn close_send(&self, comm: Self::SendComm) -> Result<()> {
        drop(comm);
        Ok(())
    }

    /// Closes a receive comm, releasing everything it holds.
    fn close_recv(&self, comm: Self::RecvComm) -> Result<()> {
        drop(comm);
        Ok(())
    }

    /// Closes a listening endpoint.
    fn close_listen(&self, comm: Self::ListenComm) -> Result<()> {
        drop(comm);
        Ok(())
    }

    /// NCCL consumed the data of a completed receive; `request` is only an identifier
    /// (the request itself was already released by `test`).
    fn irecv_consumed(&self, comm: &mut Self::RecvComm, n: usize, request: usize) -> Result<()> {
        let _ = (comm, n, request);
        Ok(())
    }

    /// Per-operation hints (v11+); the return value is ignored by NCCL.
    fn set_net_attr(&self, ctx: &Self::Context, attr: &ncclNetAttr_v11_t) -> Result<()> {
        let _ = (ctx, attr);
        Ok(())
    }

    /// Fuses physical devices into a virtual one; returns its index (appended after
    /// the existing devices).
    fn make_vdevice(&self, devs: &[usize]) -> Result<usize> {
        let _ = devs;
        Err(Error::unsupported("makeVDevice"))
    }
}
