//! The GPU kernel's part of a slice on a CUDA communicator: the device twin of
//! `schedule::combine` plus the copies to
//! further destinations, run on the communicator's stream with the device
//! kernels (`cclkit_kernels::cuda`). Inputs and outputs are device addresses:
//! user buffers, GPU FIFO slots, or pinned host slots the GPU maps.

use cclkit_abi::raw::common::Protocol;
use cclkit_kernels::Reduction;
use cclkit_kernels::cuda::{CudaDevice, DevPtr, DeviceBuffer, Stream};

use super::cuda_error;
use crate::error::{Error, Result};
use crate::op::OpRef;
use crate::schedule::{Buffer, Combine, Prim, Span};

/// One slice's addresses.
#[derive(Clone, Copy, Debug)]
pub struct SliceIo<'a> {
    /// This rank's input (user send buffer), if the primitive has one.
    pub src: Option<DevPtr>,
    /// Received slots (one per receive link).
    pub recvs: &'a [DevPtr],
    /// Where the result lands locally (user receive buffer), if anywhere.
    pub dst: Option<DevPtr>,
    /// Send slots to fill with the result.
    pub sends: &'a [DevPtr],
    /// Bytes of data.
    pub len: usize,
}

/// Most links of one primitive the proxy hands over (as the proxy's own limit).
const MAX_LINKS: usize = 8;

/// A communicator's device work queue: one stream, one scratch buffer.
pub struct DevCompute {
    dev: CudaDevice,
    stream: Stream,
    scratch: Option<DeviceBuffer>,
}

fn overlaps(a: DevPtr, b: DevPtr, len: usize) -> bool {
    a.0 < b.0 + len as u64 && b.0 < a.0 + len as u64
}

impl DevCompute {
    /// A stream on `dev`.
    ///
    /// # Errors
    /// The driver could not create a stream.
    pub fn new(dev: &CudaDevice) -> Result<Self> {
        Ok(Self {
            dev: dev.clone(),
            stream: dev.stream().map_err(cuda_error)?,
            scratch: None,
        })
    }

    fn scratch(&mut self, len: usize) -> Result<DevPtr> {
        if self.scratch.as_ref().is_none_or(|s| s.len() < len) {
            self.scratch = Some(self.dev.alloc(len.max(1 << 16)).map_err(cuda_error)?);
        }
        self.scratch
            .as_ref()
            .map(DeviceBuffer::ptr)
            .ok_or_else(|| Error::internal("device scratch"))
    }

    /// `out = combine(src, recvs)` on the device (see `schedule::combine`).
    ///
    /// # Safety
    /// Every address valid for `len` bytes on this device until the stream is
    /// synchronised; `out` equal to or disjoint from each input.
    pub unsafe fn combine(
        &mut self,
        c: Combine,
        red: &Reduction,
        src: Option<DevPtr>,
        recvs: &[DevPtr],
        out: DevPtr,
        len: usize,
    ) -> Result<()> {
        let k = |e: cclkit_kernels::cuda::CudaError| {
            Error::internal(format!("device reduction kernel: {e}"))
        };
        let s = &self.stream;
        let need_src = || src.ok_or_else(|| Error::internal("copy prim without input"));
        match c {
            Combine::Copy { .. } if !recvs.is_empty() => {
                // SAFETY: forwarded from the caller.
                unsafe { s.copy_raw(out, recvs[0], len) }
            }
            Combine::Copy { pre: true } => {
                let src = need_src()?;
                // SAFETY: forwarded from the caller.
                unsafe { s.pre_op_raw(red, out, src, len) }
            }
            Combine::Copy { pre: false } => {
                let src = need_src()?;
                // SAFETY: forwarded from the caller.
                unsafe { s.copy_raw(out, src, len) }
            }
            Combine::Reduce { finish } => {
                // SAFETY: forwarded from the caller.
                unsafe { s.reduce_many_raw(red, out, src, recvs, len, finish) }
            }
        }
        .map_err(k)
    }

    /// Runs one slice: the result goes to `dst` (or the first send slot, or
    /// scratch when neither is safe to compute into), then is copied to every
    /// other destination; waits for the device before returning, because the
    /// proxy posts the send slots right after.
    ///
    /// # Safety
    /// Every address in `io` valid for `io.len` bytes on this device; the send
    /// slots disjoint from everything else.
    pub unsafe fn slice(&mut self, c: Combine, red: &Reduction, io: SliceIo<'_>) -> Result<()> {
        let len = io.len;
        let trivial = matches!(c, Combine::Copy { pre: false }) && io.recvs.is_empty();
        // Computing into `dst` is safe when it equals or avoids every input.
        let clean = |d: DevPtr| {
            io.src
                .into_iter()
                .chain(io.recvs.iter().copied())
                .all(|i| i == d || !overlaps(i, d, len))
        };
        let out = match (io.dst, io.sends.first()) {
            (Some(d), _) if trivial && io.src == Some(d) => d,
            (Some(d), _) if clean(d) => d,
            (None, Some(&o)) => o,
            _ => self.scratch(len)?,
        };
        if !(trivial && io.src == Some(out)) {
            // SAFETY: forwarded from the caller; `out` is clean (checked) or scratch.
            unsafe { self.combine(c, red, io.src, io.recvs, out, len)? };
        }
        let s = &self.stream;
        let copy_err = |e| Error::internal(format!("device copy: {e}"));
        for &o in io.sends.iter().filter(|&&o| o != out) {
            // SAFETY: send slots are disjoint from the result (caller).
            unsafe { s.copy_raw(o, out, len) }.map_err(copy_err)?;
        }
        if let Some(d) = io.dst.filter(|&d| d != out) {
            // SAFETY: the result is in a send slot or scratch, disjoint from `d`.
            unsafe { s.copy_raw(d, out, len) }.map_err(copy_err)?;
        }
        self.stream
            .synchronize()
            .map_err(|e| Error::internal(format!("device slice: {e}")))
    }

    /// The proxy's entry for one slice: addresses as the proxy has them (user
    /// buffer spans already bounds-checked, FIFO slots with their wire sizes,
    /// which are data sizes under Simple).
    ///
    /// # Safety
    /// As [`slice`](Self::slice).
    ///
    /// # Errors
    /// A protocol other than Simple, more than 8 links, or a device failure.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn proxy_slice(
        &mut self,
        c: Combine,
        red: &Reduction,
        proto: Protocol,
        src: Option<*const u8>,
        dst: Option<*mut u8>,
        recvs: &[(*const u8, usize)],
        sends: &[*mut u8],
        len: usize,
    ) -> Result<()> {
        if proto != Protocol::SIMPLE {
            return Err(Error::internal(format!(
                "device communicators run the Simple protocol, not {proto:?}"
            )));
        }
        if recvs.len() > MAX_LINKS || sends.len() > MAX_LINKS {
            return Err(Error::internal("a device slice with more than 8 links"));
        }
        let at = |p: *const u8| DevPtr(p as u64);
        let mut rv = [DevPtr(0); MAX_LINKS];
        for (d, (p, _)) in rv.iter_mut().zip(recvs) {
            *d = at(*p);
        }
        let mut sv = [DevPtr(0); MAX_LINKS];
        for (d, p) in sv.iter_mut().zip(sends) {
            *d = at(*p);
        }
        let io = SliceIo {
            src: src.map(at),
            recvs: &rv[..recvs.len()],
            dst: dst.map(|d| at(d)),
            sends: &sv[..sends.len()],
            len,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.slice(c, red, io) }
    }

    /// The proxy's step for slice `[off, off + len)` of `prim` of operation `op`:
    /// the user buffer spans (bounds-checked here) and the slots the proxy
    /// holds, computed on the device ([`proxy_slice`](Self::proxy_slice)).
    ///
    /// # Safety
    /// `op`'s buffers are memory of this device, valid for their lengths; the
    /// slots are this slice's ready receive slots and free send slots.
    ///
    /// # Errors
    /// As [`proxy_slice`](Self::proxy_slice), and a span beyond its buffer.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn proxy_step(
        &mut self,
        prim: &Prim,
        op: &OpRef,
        off: usize,
        len: usize,
        proto: Protocol,
        recvs: &[(*const u8, usize)],
        sends: &[*mut u8],
    ) -> Result<()> {
        let span = |s: Option<Span>| -> Result<Option<*mut u8>> {
            let Some(span) = s else { return Ok(None) };
            let (base, cap) = match span.buf {
                Buffer::Send => (op.bufs.send.cast_mut(), op.bufs.send_len),
                Buffer::Recv => (op.bufs.recv, op.bufs.recv_len),
            };
            if span.offset + off + len > cap {
                return Err(Error::internal(format!(
                    "span {span:?} + {len} exceeds a {cap}-byte buffer"
                )));
            }
            // A device address: offset only, never dereferenced here.
            Ok(Some(base.wrapping_add(span.offset + off)))
        };
        let (src, dst) = (span(prim.src)?, span(prim.dst)?);
        // SAFETY: forwarded from the caller; the spans are bounds-checked.
        unsafe {
            self.proxy_slice(
                prim.combine,
                &op.red,
                proto,
                src.map(<*mut u8>::cast_const),
                dst,
                recvs,
                sends,
                len,
            )
        }
    }
}
