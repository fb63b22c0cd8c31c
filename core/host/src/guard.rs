//! Canary-guarded out-parameters: catch a plugin that writes past the struct it was given.
//!
//! The classic ABI mismatch is a plugin built against a newer header writing a bigger
//! struct than its host allocated (v12 properties into a v11 buffer, a 1152-byte tuner
//! constants struct into NVIDIA's 1056-byte copy, `float[8][3]` into `float[7][3]`).
//! NCCL passes stack buffers and silently corrupts its stack; cclkit surrounds the
//! buffer with known bytes and reports the overrun.

use std::fmt;
use std::mem::{align_of, size_of};

/// Guard bytes on each side of the struct.
const GUARD: usize = 64;
/// The largest struct guarded: tuner constants (NCCL 1152 bytes, v7 1272, RCCL up to
/// 1632 with `bwRatio` and 8 algorithms).
const MAX_SIZE: usize = 1632;

/// The byte at position `i` of a guard area (a repeating, unlikely pattern).
const fn canary(i: usize) -> u8 {
    (0xC5 ^ (i as u8).wrapping_mul(0x3B)) | 0x01
}

#[repr(C, align(8))]
struct Buffer([u8; GUARD + MAX_SIZE + GUARD]);

/// A plugin wrote outside the struct it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overrun {
    /// Size of the struct in bytes.
    pub size: usize,
    /// Bytes changed before the struct.
    pub before: usize,
    /// Bytes changed after the struct, counted up to the furthest one (≤ 64).
    pub after: usize,
}

impl fmt::Display for Overrun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.after > 0 {
            write!(
                f,
                "wrote at least {} bytes past the end of the {}-byte struct",
                self.after, self.size
            )?;
        }
        if self.before > 0 {
            if self.after > 0 {
                f.write_str(" and ")?;
            }
            write!(f, "wrote {} bytes before the struct", self.before)?;
        }
        Ok(())
    }
}

/// Calls `f` with a pointer to a copy of `init` surrounded by canaries; returns the
/// value `f` left there, `f`'s result, and the overrun if a canary changed.
///
/// # Safety
/// `T` must be plain data for which every bit pattern is valid (integers, floats, raw
/// pointers, arrays and `repr(C)` structs of those), since the plugin may write any
/// bytes into it.
pub unsafe fn guarded<T: Copy, R>(
    init: &T,
    f: impl FnOnce(*mut T) -> R,
) -> (T, R, Option<Overrun>) {
    const {
        assert!(size_of::<T>() <= MAX_SIZE, "guarded struct too large");
        assert!(align_of::<T>() <= 8, "guarded struct over-aligned");
    }
    let size = size_of::<T>();
    let mut buf = Buffer([0; GUARD + MAX_SIZE + GUARD]);
    for i in 0..GUARD {
        buf.0[i] = canary(i);
        buf.0[GUARD + size + i] = canary(i);
    }
    // SAFETY: `GUARD` is a multiple of 8 and the buffer is 8-aligned, so the slot is
    // aligned for `T` (align ≤ 8) and has room for it (size ≤ MAX_SIZE).
    let slot = unsafe { buf.0.as_mut_ptr().add(GUARD) }.cast::<T>();
    // SAFETY: `slot` is valid and aligned for a `T` (see above).
    unsafe { slot.write(*init) };
    let result = f(slot);
    // SAFETY: `slot` holds a `T`: initialised above, and any bytes the plugin wrote
    // form a valid `T` by this function's contract.
    let value = unsafe { slot.read() };
    let before = (0..GUARD).filter(|&i| buf.0[i] != canary(i)).count();
    let after = (0..GUARD)
        .rev()
        .find(|&i| buf.0[GUARD + size + i] != canary(i))
        .map_or(0, |i| i + 1);
    let overrun = (before > 0 || after > 0).then_some(Overrun {
        size,
        before,
        after,
    });
    (value, result, overrun)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_bounds_writes_pass() {
        // SAFETY: `[f32; 21]` accepts any bit pattern.
        let (v, r, o) = unsafe {
            guarded(&[-1.0f32; 21], |p| {
                (*p)[20] = 0.0;
                7
            })
        };
        assert_eq!((v[20], v[0], r, o), (0.0, -1.0, 7, None));
    }

    #[test]
    fn overruns_are_reported() {
        // SAFETY: as above; the write past the end lands in the guard area we own.
        let (_, _, o) = unsafe {
            guarded(&[0f32; 21], |p| {
                p.cast::<f32>().add(21 + 3).write(0.0);
            })
        };
        assert_eq!(
            o,
            Some(Overrun {
                size: 84,
                before: 0,
                after: 16
            })
        );
        // SAFETY: writing the byte before the struct, inside our guard area.
        let (_, _, o) = unsafe { guarded(&0u64, |p| p.cast::<u8>().sub(1).write(0)) };
        assert_eq!(o.map(|o| o.before), Some(1));
    }
}
