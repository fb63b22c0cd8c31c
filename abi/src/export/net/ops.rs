//! The operations behind every net table version; the only place where the net
//! export touches NCCL's raw pointers.
//!
//! Handles are checked on the way in by [`super::handle`].

use crate::profiler::net::RequestProfiler;
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use super::handle::{
    CTX_TAG, CommBox, LISTEN_TAG, MR_TAG, MrBox, RECV_TAG, SEND_TAG, borrow, put, tag_of, take,
};
use super::{CtxBox, NetExport};
use crate::error::{Error, Result};
use crate::net::{Buf, CommConfig, CommRef, MemRegion, Net, NetHandle, RawHandle, RecvBuf, Sizes};
use crate::raw::net::{
    NCCL_NET_OPTIONAL_RECV_COMPLETION, ncclNetAttr_v11_t, ncclNetCommConfig_v10_t,
};

fn device<T: Net>(plugin: &T, dev: c_int) -> Result<usize> {
    let n = plugin.devices();
    usize::try_from(dev).ok().filter(|d| *d < n).ok_or_else(|| {
        Error::invalid_argument(format!("device {dev} out of range (plugin has {n})"))
    })
}

/// Narrows a C size to `usize`, rejecting negative values.
pub(crate) fn size_from<S: Copy + TryInto<usize> + std::fmt::Display>(size: S) -> Result<usize> {
    size.try_into()
        .map_err(|_| Error::invalid_argument(format!("negative size {size}")))
}

pub(crate) fn config_from(config: *const ncclNetCommConfig_v10_t) -> CommConfig {
    if config.is_null() {
        return CommConfig::default();
    }
    // SAFETY: NCCL passes NULL or a pointer to its comm's config struct.
    let tc = unsafe { (*config).trafficClass };
    CommConfig {
        traffic_class: (tc != crate::raw::net::NCCL_NET_TRAFFIC_CLASS_UNDEF).then_some(tc),
    }
}

/// Which context a `listen`/`connect` runs in.
pub(crate) enum Ctx {
    /// v11+: the pointer NCCL got from our `init`.
    Raw(*mut c_void),
    /// v6–v10 `listen`, v6–v9 `connect`: the process context.
    Legacy,
    /// v10 `connect`: the context of this configuration.
    Config(CommConfig),
}

fn with_ctx<T: NetExport, R>(ctx: Ctx, f: impl FnOnce(&CtxBox<T>) -> Result<R>) -> Result<R> {
    match ctx {
        // SAFETY: NCCL hands back the pointer our v11+ init produced.
        Ctx::Raw(p) => f(unsafe { borrow::<CtxBox<T>>(p, CTX_TAG, "net context")? }),
        Ctx::Legacy => f(&*T::state().legacy_context()?),
        Ctx::Config(c) => f(&*T::state().context_for(c)?),
    }
}

pub(crate) fn init_legacy<T: NetExport>(version: u32) -> Result<()> {
    T::state().init_legacy(version)
}

/// # Safety
/// `ctx` must be NULL or writable; `config` NULL or readable.
pub(crate) unsafe fn init_ctx<T: NetExport>(
    version: u32,
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *const ncclNetCommConfig_v10_t,
) -> Result<()> {
    if ctx.is_null() {
        return Err(Error::invalid_argument("ctx out-pointer is NULL"));
    }
    let boxed = T::state().open_context(version, comm_id, config_from(config))?;
    // SAFETY: checked non-NULL above.
    unsafe { ctx.write(Box::into_raw(boxed).cast()) };
    Ok(())
}

/// # Safety
/// `ctx` must be a context from `init_ctx` (or NULL/garbage, which is reported).
pub(crate) unsafe fn finalize<T: NetExport>(ctx: *mut c_void) -> Result<()> {
    // SAFETY: tag-checked.
    let boxed = unsafe { take::<CtxBox<T>>(ctx, CTX_TAG, "net context")? };
    T::state().close_context(boxed)
}

/// # Safety
/// `ndev` must be NULL or writable.
pub(crate) unsafe fn devices<T: NetExport>(ndev: *mut c_int) -> Result<()> {
    let n = T::state().plugin()?.devices();
    let n = c_int::try_from(n)
        .map_err(|_| Error::internal(format!("{n} devices do not fit an int")))?;
    // SAFETY: forwarded contract.
    unsafe { put(ndev, n, "ndev") }
}

pub(crate) fn properties<T: NetExport>(dev: c_int) -> Result<crate::net::Properties> {
    let plugin = T::state().plugin()?;
    let d = device(&*plugin, dev)?;
    plugin.properties(d)
}

/// # Safety
/// `handle` must be NULL or 128 writable bytes; `listen_comm` NULL or writable.
pub(crate) unsafe fn listen<T: NetExport>(
    ctx: Ctx,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> Result<()> {
    if handle.is_null() || listen_comm.is_null() {
        return Err(Error::invalid_argument(
            "listen: handle or listenComm is NULL",
        ));
    }
    // SAFETY: NCCL provides NCCL_NET_HANDLE_MAXSIZE bytes; NetHandle is exactly that.
    let handle = unsafe { &mut *handle.cast::<NetHandle>() };
    *handle = NetHandle::zeroed();
    let comm = with_ctx::<T, _>(ctx, |c| {
        let d = device(&*c.plugin, dev)?;
        Ok(CommBox {
            tag: LISTEN_TAG,
            plugin: Arc::clone(&c.plugin),
            comm: c.plugin.listen(&c.ctx, d, handle)?,
        })
    })?;
    // SAFETY: checked non-NULL.
    unsafe { listen_comm.write(Box::into_raw(Box::new(comm)).cast()) };
    Ok(())
}

/// # Safety
/// `handle` must be NULL or the 128 bytes from the peer's `listen` (the same pointer
/// on every retry); `send_comm` NULL or writable.
pub(crate) unsafe fn connect<T: NetExport>(
    ctx: Ctx,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
) -> Result<()> {
    if handle.is_null() || send_comm.is_null() {
        return Err(Error::invalid_argument(
            "connect: handle or sendComm is NULL",
        ));
    }
    // SAFETY: NCCL provides NCCL_NET_HANDLE_MAXSIZE bytes.
    let handle = unsafe { &mut *handle.cast::<NetHandle>() };
    let comm = with_ctx::<T, _>(ctx, |c| {
        let d = device(&*c.plugin, dev)?;
        Ok(c.plugin.connect(&c.ctx, d, handle)?.map(|comm| CommBox {
            tag: SEND_TAG,
            plugin: Arc::clone(&c.plugin),
            comm,
        }))
    })?;
    let raw = comm.map_or(std::ptr::null_mut(), |c| Box::into_raw(Box::new(c)).cast());
    // SAFETY: checked non-NULL.
    unsafe { send_comm.write(raw) };
    Ok(())
}

/// # Safety
/// `listen_comm` must be a listen comm from `listen`; `recv_comm` NULL or writable.
pub(crate) unsafe fn accept<T: NetExport>(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
) -> Result<()> {
    if recv_comm.is_null() {
        return Err(Error::invalid_argument("accept: recvComm is NULL"));
    }
    // SAFETY: tag-checked.
    let l = unsafe { borrow::<CommBox<T, T::ListenComm>>(listen_comm, LISTEN_TAG, "listenComm")? };
    let raw = match l.plugin.accept(&mut l.comm)? {
        Some(comm) => Box::into_raw(Box::new(CommBox {
            tag: RECV_TAG,
            plugin: Arc::clone(&l.plugin),
            comm,
        }))
        .cast(),
        None => std::ptr::null_mut(),
    };
    // SAFETY: checked non-NULL.
    unsafe { recv_comm.write(raw) };
    Ok(())
}

/// Runs `f` on the send or receive comm behind `comm`.
///
/// # Safety
/// `comm` must be NULL or a live handle of this plugin.
unsafe fn with_comm<T: NetExport, R>(
    comm: *mut c_void,
    f: impl FnOnce(&T, CommRef<'_, T>) -> Result<R>,
) -> Result<R> {
    // SAFETY: forwarded contract.
    match unsafe { tag_of(comm, "comm")? } {
        SEND_TAG => {
            // SAFETY: tag-checked.
            let s = unsafe { borrow::<CommBox<T, T::SendComm>>(comm, SEND_TAG, "sendComm")? };
            f(&s.plugin, CommRef::Send(&s.comm))
        }
        RECV_TAG => {
            // SAFETY: tag-checked.
            let r = unsafe { borrow::<CommBox<T, T::RecvComm>>(comm, RECV_TAG, "recvComm")? };
            f(&r.plugin, CommRef::Recv(&r.comm))
        }
        _ => Err(Error::invalid_argument(format!(
            "comm {comm:p} is not a live send/recv comm of this plugin"
        ))),
    }
}

/// # Safety
/// `comm` must be a live comm; `mhandle` NULL or writable.
pub(crate) unsafe fn reg_mr<T: NetExport>(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
    mhandle: *mut *mut c_void,
) -> Result<()> {
    if mhandle.is_null() {
        return Err(Error::invalid_argument("regMr: mhandle is NULL"));
    }
    let region = MemRegion {
        addr: data as usize,
        len: size,
        kind,
    };
    // SAFETY: forwarded contract.
    let mr = unsafe {
        with_comm::<T, _>(comm, |p, c| match dmabuf {
            None => p.reg_mr(c, region),
            Some((offset, fd)) => p.reg_mr_dmabuf(c, region, offset, fd),
        })?
    };
    // SAFETY: checked non-NULL.
    unsafe { mhandle.write(Box::into_raw(Box::new(MrBox { tag: MR_TAG, mr })).cast()) };
    Ok(())
}

/// # Safety
/// `comm` must be a live comm, `mhandle` a registration from `reg_mr`.
pub(crate) unsafe fn dereg_mr<T: NetExport>(comm: *mut c_void, mhandle: *mut c_void) -> Result<()> {
    // SAFETY: tag-checked.
    let mr = unsafe { take::<MrBox<T::Mr>>(mhandle, MR_TAG, "mhandle")? };
    // SAFETY: forwarded contract.
    unsafe { with_comm::<T, _>(comm, |p, c| p.dereg_mr(c, mr.mr)) }
}

/// # Safety
/// `mhandle` must be NULL or a registration from `reg_mr`.
unsafe fn mr_ref<'a, M>(mhandle: *mut c_void) -> Result<Option<&'a M>> {
    if mhandle.is_null() {
        return Ok(None);
    }
    // SAFETY: tag-checked.
    Ok(Some(
        &unsafe { borrow::<MrBox<M>>(mhandle, MR_TAG, "mhandle")? }.mr,
    ))
}

fn put_request<R: RawHandle>(request: *mut *mut c_void, req: Option<R>) {
    let raw = req.map_or(std::ptr::null_mut(), |r| r.into_raw().as_ptr());
    // SAFETY: callers check `request` for NULL before posting.
    unsafe { request.write(raw) };
}

/// # Safety
/// `send_comm` must be a live send comm; `data` valid for `size` bytes until the
/// request completes; `request` NULL or writable.
pub(crate) unsafe fn isend<T: NetExport>(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe {
        isend_profiled::<T>(
            send_comm,
            data,
            size,
            tag,
            mhandle,
            request,
            RequestProfiler::none(),
        )
    }
}

/// [`isend`] with the request's profiler (v10+).
///
/// # Safety
/// As [`isend`].
pub(crate) unsafe fn isend_profiled<T: NetExport>(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
    prof: RequestProfiler,
) -> Result<()> {
    if request.is_null() {
        return Err(Error::invalid_argument("isend: request is NULL"));
    }
    // SAFETY: tag-checked.
    let s = unsafe { borrow::<CommBox<T, T::SendComm>>(send_comm, SEND_TAG, "sendComm")? };
    // SAFETY: NCCL keeps `data` valid until the request completes.
    let buf = unsafe { Buf::new(data.cast(), size) };
    // SAFETY: forwarded contract.
    let mr = unsafe { mr_ref::<T::Mr>(mhandle)? };
    let req = s.plugin.isend_profiled(&mut s.comm, buf, tag, mr, prof)?;
    put_request(request, req);
    Ok(())
}

/// Most buffers one grouped receive may carry here (NCCL's `int sizes[64]`).
const MAX_GROUP: usize = Sizes::MAX;

/// # Safety
/// `recv_comm` must be a live receive comm; `data`, `sizes`, `tags`, `mhandles` arrays
/// of `n` entries (mhandles may be NULL); buffers valid until completion.
pub(crate) unsafe fn irecv<T: NetExport, S: Copy + TryInto<usize> + std::fmt::Display>(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *const S,
    tags: *const c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    let none = RequestProfiler::none();
    // SAFETY: forwarded contract.
    unsafe { irecv_profiled::<T, S>(recv_comm, n, data, sizes, tags, mhandles, request, none) }
}

/// [`irecv`] with the request's profiler (v10+).
///
/// # Safety
/// As [`irecv`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn irecv_profiled<T: NetExport, S: Copy + TryInto<usize> + std::fmt::Display>(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *const S,
    tags: *const c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
    prof: RequestProfiler,
) -> Result<()> {
    if request.is_null() {
        return Err(Error::invalid_argument("irecv: request is NULL"));
    }
    // The sentinel NCCL may store before the call: read it, then always overwrite.
    // SAFETY: checked non-NULL.
    let optional = unsafe { request.read() } as usize == NCCL_NET_OPTIONAL_RECV_COMPLETION;
    // SAFETY: tag-checked.
    let r = unsafe { borrow::<CommBox<T, T::RecvComm>>(recv_comm, RECV_TAG, "recvComm")? };
    let mut bufs = Gathered::new();
    // SAFETY: forwarded contract.
    unsafe { gather::<T, S>(n, data, sizes, tags, mhandles, &mut bufs)? };
    let req = r
        .plugin
        .irecv_profiled(&mut r.comm, &bufs, optional, prof)?;
    put_request(request, req);
    Ok(())
}

/// The buffers of one grouped receive, on the stack (no allocation on the data path).
/// Only the first `n` entries are ever written: NCCL passes one buffer most of the
/// time, and initialising (then moving) all 64 entries cost more than the call's
/// other work.
pub(crate) struct Gathered<'a, M> {
    bufs: [MaybeUninit<RecvBuf<'a, M>>; MAX_GROUP],
    n: usize,
}

impl<'a, M> Gathered<'a, M> {
    /// An empty list (nothing initialised).
    pub(crate) fn new() -> Self {
        Self {
            bufs: [const { MaybeUninit::uninit() }; MAX_GROUP],
            n: 0,
        }
    }

    /// Appends `b`; the caller checked the count against `MAX_GROUP`.
    fn push(&mut self, b: RecvBuf<'a, M>) {
        if let Some(slot) = self.bufs.get_mut(self.n) {
            slot.write(b);
            self.n += 1;
        }
    }
}

impl<'a, M> std::ops::Deref for Gathered<'a, M> {
    type Target = [RecvBuf<'a, M>];
    fn deref(&self) -> &Self::Target {
        // SAFETY: entries 0..n were written by `push`; MaybeUninit<T> has T's layout.
        unsafe { std::slice::from_raw_parts(self.bufs.as_ptr().cast(), self.n) }
    }
}

/// Builds the buffer list of a grouped receive or flush into `out` (empty).
///
/// # Safety
/// As [`irecv`]; `tags` may be NULL (flush).
unsafe fn gather<'a, T: Net, S: Copy + TryInto<usize> + std::fmt::Display>(
    n: c_int,
    data: *mut *mut c_void,
    sizes: *const S,
    tags: *const c_int,
    mhandles: *mut *mut c_void,
    out: &mut Gathered<'a, T::Mr>,
) -> Result<()> {
    let n = usize::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_GROUP).contains(n))
        .ok_or_else(|| {
            Error::invalid_argument(format!("buffer count {n} outside 1..={MAX_GROUP}"))
        })?;
    if data.is_null() || sizes.is_null() {
        return Err(Error::invalid_argument("data or sizes array is NULL"));
    }
    for i in 0..n {
        // SAFETY: the arrays hold `n` entries (contract); `tags`/`mhandles` may be NULL.
        unsafe {
            let size = size_from(sizes.add(i).read())?;
            let tag = if tags.is_null() {
                0
            } else {
                tags.add(i).read()
            };
            let mh = if mhandles.is_null() {
                std::ptr::null_mut()
            } else {
                mhandles.add(i).read()
            };
            out.push(RecvBuf {
                buf: Buf::new(data.add(i).read().cast(), size),
                tag,
                mr: mr_ref::<T::Mr>(mh)?,
            });
        }
    }
    Ok(())
}

/// # Safety
/// As [`irecv`] with `int` sizes and no tags.
pub(crate) unsafe fn iflush<T: NetExport>(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *const c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    if request.is_null() {
        return Err(Error::invalid_argument("iflush: request is NULL"));
    }
    // SAFETY: tag-checked.
    let r = unsafe { borrow::<CommBox<T, T::RecvComm>>(recv_comm, RECV_TAG, "recvComm")? };
    let mut bufs = Gathered::new();
    // SAFETY: forwarded contract.
    unsafe { gather::<T, c_int>(n, data, sizes, std::ptr::null(), mhandles, &mut bufs)? };
    let req = r.plugin.iflush(&mut r.comm, &bufs)?;
    put_request(request, req);
    Ok(())
}

/// # Safety
/// `request` must be a live request of this plugin; `done` writable; `sizes` NULL or
/// large enough for the request's buffers.
pub(crate) unsafe fn test<T: NetExport>(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> Result<()> {
    let ptr =
        NonNull::new(request).ok_or_else(|| Error::invalid_argument("test: request is NULL"))?;
    if done.is_null() {
        return Err(Error::invalid_argument("test: done is NULL"));
    }
    // SAFETY: `ptr` came from `into_raw` of this request type; ManuallyDrop keeps
    // ownership with NCCL until the request completes.
    let mut req = std::mem::ManuallyDrop::new(unsafe { T::Request::from_raw(ptr) });
    // SAFETY: forwarded contract on `sizes`.
    let mut out = unsafe { Sizes::from_raw(sizes) };
    match T::test(&mut req, &mut out) {
        Ok(finished) => {
            if finished {
                // SAFETY: taken once, here; NCCL never tests a done request again.
                drop(unsafe { std::mem::ManuallyDrop::take(&mut req) });
            }
            // SAFETY: checked non-NULL.
            unsafe { done.write(c_int::from(finished)) };
            Ok(())
        }
        Err(e) => {
            // A failed request is over too: NCCL will not test it again.
            // SAFETY: as above.
            drop(unsafe { std::mem::ManuallyDrop::take(&mut req) });
            Err(e)
        }
    }
}

/// # Safety
/// `comm` must be a live send comm (it is freed).
pub(crate) unsafe fn close_send<T: NetExport>(comm: *mut c_void) -> Result<()> {
    // SAFETY: tag-checked.
    let b = unsafe { take::<CommBox<T, T::SendComm>>(comm, SEND_TAG, "sendComm")? };
    b.plugin.close_send(b.comm)
}

/// # Safety
/// `comm` must be a live receive comm (it is freed).
pub(crate) unsafe fn close_recv<T: NetExport>(comm: *mut c_void) -> Result<()> {
    // SAFETY: tag-checked.
    let b = unsafe { take::<CommBox<T, T::RecvComm>>(comm, RECV_TAG, "recvComm")? };
    b.plugin.close_recv(b.comm)
}

/// # Safety
/// `comm` must be a live listen comm (it is freed).
pub(crate) unsafe fn close_listen<T: NetExport>(comm: *mut c_void) -> Result<()> {
    // SAFETY: tag-checked.
    let b = unsafe { take::<CommBox<T, T::ListenComm>>(comm, LISTEN_TAG, "listenComm")? };
    b.plugin.close_listen(b.comm)
}

/// # Safety
/// `comm` must be a live receive comm.
pub(crate) unsafe fn irecv_consumed<T: NetExport>(
    comm: *mut c_void,
    n: c_int,
    request: *mut c_void,
) -> Result<()> {
    // SAFETY: tag-checked.
    let r = unsafe { borrow::<CommBox<T, T::RecvComm>>(comm, RECV_TAG, "recvComm")? };
    r.plugin
        .irecv_consumed(&mut r.comm, size_from(n)?, request as usize)
}

/// # Safety
/// `ctx` must be a context from `init_ctx`; `attr` NULL or readable.
pub(crate) unsafe fn set_net_attr<T: NetExport>(
    ctx: *mut c_void,
    attr: *const ncclNetAttr_v11_t,
) -> Result<()> {
    if attr.is_null() {
        return Err(Error::invalid_argument("setNetAttr: netAttr is NULL"));
    }
    // SAFETY: checked non-NULL; plain data.
    let attr = unsafe { attr.read() };
    with_ctx::<T, _>(Ctx::Raw(ctx), |c| c.plugin.set_net_attr(&c.ctx, &attr))
}

/// # Safety
/// `d` must be NULL or writable; `devs` the version's `devs[]` array.
pub(crate) unsafe fn make_vdevice<T: NetExport>(
    d: *mut c_int,
    ndevs: c_int,
    devs: &[c_int],
) -> Result<()> {
    let n = usize::try_from(ndevs)
        .ok()
        .filter(|n| (1..=devs.len()).contains(n))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "makeVDevice: ndevs {ndevs} outside 1..={}",
                devs.len()
            ))
        })?;
    let plugin = T::state().plugin()?;
    let phys = devs[..n]
        .iter()
        .map(|&x| device(&*plugin, x))
        .collect::<Result<Vec<_>>>()?;
    let v = plugin.make_vdevice(&phys)?;
    let v =
        c_int::try_from(v).map_err(|_| Error::internal("virtual device index overflows int"))?;
    // SAFETY: forwarded contract.
    unsafe { put(d, v, "d") }
}
