//! In-flight requests and the sizes `test` reports.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::ptr::NonNull;

use super::comm::MAX_GROUPED;
use super::table::common_slot;
use super::{NetError, NetShared};
use crate::logger;

/// An in-flight `isend`/`irecv`/`iflush`. It is an inert token: poll it with its comm's
/// `test` (which needs `&mut` access to the comm, as NCCL's one-thread-per-comm rule
/// requires). Dropping an unfinished request abandons it; the comm's close cleans up.
pub struct Request {
    raw: NonNull<c_void>,
    pub(crate) comm: usize,
    kind: ReqKind,
    done: bool,
}

// SAFETY: a request is an opaque plugin token, only dereferenced by the plugin when
// passed back through its comm (which `&mut` access serialises).
unsafe impl Send for Request {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReqKind {
    Send,
    Recv(usize),
    Flush,
}

/// A completed request's identifier, for `irecv_consumed` (the plugin freed the
/// request itself in `test`; NCCL passes the stale pointer as an identifier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId {
    pub(crate) raw: usize,
    pub(crate) comm: usize,
}

/// Sizes a completed request reported: one per buffer of a receive, one for a send,
/// none for a flush.
///
/// Up to 8 sizes are kept inline (every NCCL receive groups at most
/// 8 buffers); a larger group, which only a host may ask for, is boxed. `test` is
/// the data path's hottest call, so a completion must not clear and move NCCL's
/// whole 64-entry array.
#[derive(Clone, PartialEq, Eq)]
pub struct Sizes {
    len: usize,
    inline: [usize; INLINE_SIZES],
    spill: Option<Box<[usize]>>,
}

/// Sizes a [`Sizes`] holds without allocating.
const INLINE_SIZES: usize = 8;

impl Sizes {
    /// The sizes, in buffer order.
    pub fn as_slice(&self) -> &[usize] {
        match &self.spill {
            Some(all) => all,
            None => &self.inline[..self.len],
        }
    }
}

impl fmt::Debug for Sizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Request {
    /// `None` when the plugin returned no request (NULL = "not now" for isend/irecv,
    /// "nothing to wait for" for iflush).
    pub(crate) fn new(raw: *mut c_void, comm: usize, kind: ReqKind) -> Option<Self> {
        Some(Self {
            raw: NonNull::new(raw)?,
            comm,
            kind,
            done: false,
        })
    }

    /// The identifier to pass to `irecv_consumed` once complete.
    pub fn id(&self) -> RequestId {
        RequestId {
            raw: self.raw.as_ptr() as usize,
            comm: self.comm,
        }
    }

    /// The raw request pointer the plugin returned, for a host that must call the
    /// table itself (`cclkit check`'s probes test a request after its comm was closed,
    /// which the adapter refuses).
    pub fn as_raw(&self) -> *mut c_void {
        self.raw.as_ptr()
    }

    /// True once `test` reported completion (or failed).
    pub fn is_done(&self) -> bool {
        self.done
    }

    pub(crate) fn test(&mut self, s: &NetShared) -> Result<Option<Sizes>, NetError> {
        if self.done {
            return Err(s.refuse(
                "test",
                "the request already completed; it must not be tested again",
            ));
        }
        let f = common_slot!(s.raw, test).ok_or_else(|| s.missing("test"))?;
        // NCCL passes int[64] zeroed for receives, &int for sends, NULL for flushes;
        // the plugin writes one int per buffer, so small groups get a small array.
        let mut small = [0 as c_int; 8];
        let mut large;
        let (ptr, n) = match self.kind {
            ReqKind::Send => (small.as_mut_ptr(), 1),
            ReqKind::Recv(n) if n <= small.len() => (small.as_mut_ptr(), n),
            ReqKind::Recv(n) => {
                large = [0 as c_int; MAX_GROUPED];
                (large.as_mut_ptr(), n)
            }
            ReqKind::Flush => (std::ptr::null_mut(), 0),
        };
        let mut done: c_int = 0;
        let mark = logger::warn_mark();
        // SAFETY: `test(request, &done, sizes)` on a request this comm's plugin returned
        // and that has not completed; `sizes` has room for every buffer or is NULL.
        let rc = unsafe { f(self.raw.as_ptr(), &mut done, ptr) };
        if let Err(e) = s.check("test", mark, rc) {
            self.done = true;
            return Err(e);
        }
        if done == 0 {
            return Ok(None);
        }
        self.done = true;
        let mut out = Sizes {
            len: n,
            inline: [0; INLINE_SIZES],
            spill: (n > INLINE_SIZES).then(|| vec![0; n].into_boxed_slice()),
        };
        let values = match &mut out.spill {
            Some(all) => &mut all[..],
            None => &mut out.inline[..n],
        };
        for (i, slot) in values.iter_mut().enumerate() {
            // SAFETY: `ptr` points to an array of at least `n` ints (chosen above).
            let v = unsafe { ptr.add(i).read() };
            *slot = usize::try_from(v)
                .map_err(|_| s.refuse("test", format!("reported size {v} for buffer {i}")))?;
        }
        Ok(Some(out))
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("raw", &self.raw)
            .field("kind", &self.kind)
            .field("done", &self.done)
            .finish()
    }
}
