//! Protocols: how a connection's buffer is cut into steps and slices, and what goes
//! on the wire — NCCL's buffer → chunk → slice → step hierarchy.
//!
//! Every connection has a FIFO buffer of `NCCL_STEPS` (8) steps per protocol. A
//! *slice* (`slice_steps` steps) is the unit one `isend`/`irecv` moves; a *chunk*
//! (`chunk_steps` steps) is the unit an algorithm step works on.
//!
//! | protocol | buffer (default) | step | slice | chunk | on the wire |
//! | --- | --- | --- | --- | --- | --- |
//! | Simple | 4 MiB (`NCCL_BUFFSIZE`) | 512 KiB | 2 steps | 4 steps | raw data |
//! | LL | 512 KiB of 16-byte lines (`NCCL_LL_BUFFSIZE`) | 32 KiB data | 1 step | 1 step | 8 data bytes + 2×4-byte flags per line (50 %) |
//! | LL128 | 4800 KiB of 128-byte lines (`NCCL_LL128_BUFFSIZE`) | 562.5 KiB data | 1 step | 1 step | 120 data bytes + 8-byte flag per line (93.75 %) |
//!
//! On host communicators Simple slices and chunks are smaller than the table's
//! ([`HOST_SIMPLE_SLICE`], [`HOST_SIMPLE_CHUNK`]); the buffers keep NCCL's sizes.
//!
//! LL and LL128 carry a flag (the step number) with every line, as on a GPU where the
//! receiver polls flags instead of waiting for a completion; here the receiver
//! validates them, so a transport that reorders or corrupts data is caught.

use cclkit_abi::raw::common::Protocol;
use cclkit_abi::raw::net::NCCL_STEPS;

use super::error::{Error, Result};

/// Default `NCCL_BUFFSIZE` (Simple).
pub const DEFAULT_BUFFSIZE: usize = 4 << 20;
/// Default LL buffer: 8 lines/thread × 512 threads × 8 steps × 16 bytes.
pub const DEFAULT_LL_BUFFSIZE: usize = 8 * 512 * NCCL_STEPS * 16;
/// Default LL128 buffer: 120 elements/thread × 640 threads × 8 steps × 8 bytes.
pub const DEFAULT_LL128_BUFFSIZE: usize = 120 * 640 * NCCL_STEPS * 8;
/// Largest Simple slice (what one `isend` carries) on a communicator whose buffers
/// are in host memory. NCCL's 4 MiB buffer (1 MiB slices, 2 MiB chunks) is sized
/// for GPU memory; here every byte a slice brings is reduced or forwarded by a CPU,
/// and a slice that stays in the core's L2 is worked on while hot. Measured with
/// [`HOST_SIMPLE_CHUNK`] chunks, 1–16 MiB AllReduce, old and new binary alternated
/// (docs/PERFORMANCE.md): 8–16 MiB took 25–35 % less time on 2 and 4 ranks; 4 MiB
/// 30 % less on 2–3 ranks and 5–15 % less on 4.
pub const HOST_SIMPLE_SLICE: usize = 128 << 10;
/// Largest Simple chunk on a host communicator: a ring or tree loop's piece per
/// rank and channel, so a loop's pieces are still in cache when its all-gather
/// phase forwards what its reduce-scatter phase produced.
pub const HOST_SIMPLE_CHUNK: usize = 256 << 10;
/// LL line: 16 bytes carrying 8 data bytes.
pub const LL_LINE: usize = 16;
/// LL128 line: 128 bytes carrying 120 data bytes.
pub const LL128_LINE: usize = 128;
/// Data bytes in an LL128 line.
pub const LL128_DATA: usize = 120;

/// Sizes of one protocol on one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtoParams {
    /// The protocol.
    pub proto: Protocol,
    /// Buffer bytes (wire format) per connection.
    pub buff_bytes: usize,
    /// Steps per slice.
    pub slice_steps: usize,
    /// Steps per chunk.
    pub chunk_steps: usize,
}

impl ProtoParams {
    /// Parameters of `proto`, with buffer sizes from NCCL's environment variables.
    pub fn new(proto: Protocol, env: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let size = |name: &str, default: usize| -> Result<usize> {
            match env(name) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&b| b >= 4096 * NCCL_STEPS)
                    .ok_or_else(|| {
                        Error::invalid_argument(format!(
                            "{name}={v}: expected a byte count ≥ {}",
                            4096 * NCCL_STEPS
                        ))
                    }),
            }
        };
        Ok(match proto {
            Protocol::SIMPLE => Self {
                proto,
                buff_bytes: size("NCCL_BUFFSIZE", DEFAULT_BUFFSIZE)?,
                slice_steps: 2,
                chunk_steps: 4,
            },
            Protocol::LL => Self {
                proto,
                buff_bytes: size("NCCL_LL_BUFFSIZE", DEFAULT_LL_BUFFSIZE)?,
                slice_steps: 1,
                chunk_steps: 1,
            },
            Protocol::LL128 => Self {
                proto,
                buff_bytes: size("NCCL_LL128_BUFFSIZE", DEFAULT_LL128_BUFFSIZE)?,
                slice_steps: 1,
                chunk_steps: 1,
            },
            p => return Err(Error::invalid_argument(format!("unknown protocol {p:?}"))),
        })
    }

    /// Wire bytes of one step.
    pub fn step_wire(&self) -> usize {
        self.buff_bytes / NCCL_STEPS
    }

    /// Data bytes that fit in `wire` bytes of this protocol's format.
    pub fn data_in(&self, wire: usize) -> usize {
        match self.proto {
            Protocol::LL => wire / LL_LINE * 8,
            Protocol::LL128 => wire / LL128_LINE * LL128_DATA,
            _ => wire,
        }
    }

    /// Wire bytes needed for `data` bytes.
    pub fn wire_for(&self, data: usize) -> usize {
        match self.proto {
            Protocol::LL => data.div_ceil(8) * LL_LINE,
            Protocol::LL128 => data.div_ceil(LL128_DATA) * LL128_LINE,
            _ => data,
        }
    }

    /// Data bytes of one step.
    pub fn step_data(&self) -> usize {
        self.data_in(self.step_wire())
    }

    /// Data bytes of one slice (what one isend carries).
    pub fn slice_data(&self) -> usize {
        self.step_data() * self.slice_steps
    }

    /// Data bytes of one chunk.
    pub fn chunk_data(&self) -> usize {
        self.step_data() * self.chunk_steps
    }

    /// [`slice_data`](Self::slice_data) as a communicator runs it: Simple slices
    /// are capped at `HOST_SIMPLE_SLICE` when the buffers are in host memory.
    pub fn slice_on(&self, host: bool) -> usize {
        match (host, self.proto) {
            (true, Protocol::SIMPLE) => self.slice_data().min(HOST_SIMPLE_SLICE),
            _ => self.slice_data(),
        }
    }

    /// [`chunk_data`](Self::chunk_data) as a communicator's default: Simple chunks
    /// are capped at `HOST_SIMPLE_CHUNK` when the buffers are in host memory.
    pub fn chunk_on(&self, host: bool) -> usize {
        match (host, self.proto) {
            (true, Protocol::SIMPLE) => self.chunk_data().min(HOST_SIMPLE_CHUNK),
            _ => self.chunk_data(),
        }
    }

    /// Slices in flight per connection (the FIFO depth in slices).
    pub fn slots(&self) -> usize {
        NCCL_STEPS / self.slice_steps
    }

    /// Wire bytes of one slot.
    pub fn slot_wire(&self) -> usize {
        self.step_wire() * self.slice_steps
    }

    /// Fraction of wire bytes that are data.
    pub fn efficiency(&self) -> f64 {
        match self.proto {
            Protocol::LL => 0.5,
            Protocol::LL128 => LL128_DATA as f64 / LL128_LINE as f64,
            _ => 1.0,
        }
    }

    /// Granularity a chunk size is rounded down to (NCCL rounds the tuner's chunk size
    /// to the protocol's grain).
    pub fn grain(&self) -> usize {
        match self.proto {
            Protocol::LL => 8,
            Protocol::LL128 => LL128_DATA,
            _ => 4096,
        }
    }
}

/// Writes `data` into `wire` in the protocol's line format with `flag` (the step
/// number); returns the wire bytes used.
pub fn encode(proto: Protocol, data: &[u8], wire: &mut [u8], flag: u32) -> usize {
    match proto {
        Protocol::LL => {
            let n = data.len().div_ceil(8);
            for (i, line) in wire[..n * LL_LINE].chunks_exact_mut(LL_LINE).enumerate() {
                let src = &data[i * 8..(i * 8 + 8).min(data.len())];
                let mut d = [0u8; 8];
                d[..src.len()].copy_from_slice(src);
                line[0..4].copy_from_slice(&d[0..4]);
                line[4..8].copy_from_slice(&flag.to_le_bytes());
                line[8..12].copy_from_slice(&d[4..8]);
                line[12..16].copy_from_slice(&flag.to_le_bytes());
            }
            n * LL_LINE
        }
        Protocol::LL128 => {
            let n = data.len().div_ceil(LL128_DATA);
            for (i, line) in wire[..n * LL128_LINE]
                .chunks_exact_mut(LL128_LINE)
                .enumerate()
            {
                let src = &data[i * LL128_DATA..(i * LL128_DATA + LL128_DATA).min(data.len())];
                line[..src.len()].copy_from_slice(src);
                line[src.len()..LL128_DATA].fill(0);
                line[LL128_DATA..].copy_from_slice(&u64::from(flag).to_le_bytes());
            }
            n * LL128_LINE
        }
        _ => {
            wire[..data.len()].copy_from_slice(data);
            data.len()
        }
    }
}

/// Reads `data.len()` bytes back from `wire`, checking every line's flag.
pub fn decode(proto: Protocol, wire: &[u8], data: &mut [u8], flag: u32) -> Result<()> {
    let bad = |line: usize, got: u64| {
        Err(Error::internal(format!(
            "{proto:?} line {line}: flag {got} where step {flag} was expected (data reordered or corrupted by the transport)"
        )))
    };
    match proto {
        Protocol::LL => {
            let n = data.len().div_ceil(8);
            if wire.len() < n * LL_LINE {
                return Err(Error::internal(format!(
                    "LL: {} wire bytes for {} data bytes",
                    wire.len(),
                    data.len()
                )));
            }
            for i in 0..n {
                let line = &wire[i * LL_LINE..(i + 1) * LL_LINE];
                let (f1, f2) = (le32(&line[4..8]), le32(&line[12..16]));
                if f1 != flag || f2 != flag {
                    return bad(i, u64::from(if f1 != flag { f1 } else { f2 }));
                }
                let mut d = [0u8; 8];
                d[0..4].copy_from_slice(&line[0..4]);
                d[4..8].copy_from_slice(&line[8..12]);
                let end = (i * 8 + 8).min(data.len());
                data[i * 8..end].copy_from_slice(&d[..end - i * 8]);
            }
            Ok(())
        }
        Protocol::LL128 => {
            let n = data.len().div_ceil(LL128_DATA);
            if wire.len() < n * LL128_LINE {
                return Err(Error::internal(format!(
                    "LL128: {} wire bytes for {} data bytes",
                    wire.len(),
                    data.len()
                )));
            }
            for i in 0..n {
                let line = &wire[i * LL128_LINE..(i + 1) * LL128_LINE];
                let f = u64::from_le_bytes(line[LL128_DATA..].try_into().unwrap_or([0; 8]));
                if f != u64::from(flag) {
                    return bad(i, f);
                }
                let end = (i * LL128_DATA + LL128_DATA).min(data.len());
                data[i * LL128_DATA..end].copy_from_slice(&line[..end - i * LL128_DATA]);
            }
            Ok(())
        }
        _ => {
            data.copy_from_slice(&wire[..data.len()]);
            Ok(())
        }
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().unwrap_or([0; 4]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn host_memory_caps_simple_slices_and_chunks_only() {
        let s = ProtoParams::new(Protocol::SIMPLE, &none).unwrap();
        assert_eq!((s.slice_on(true), s.chunk_on(true)), (128 << 10, 256 << 10));
        assert_eq!((s.slice_on(false), s.chunk_on(false)), (1 << 20, 2 << 20));
        // A buffer already smaller than the caps keeps its own sizes.
        let env = |n: &str| (n == "NCCL_BUFFSIZE").then(|| "262144".to_string());
        let small = ProtoParams::new(Protocol::SIMPLE, &env).unwrap();
        assert_eq!(
            (small.slice_on(true), small.chunk_on(true)),
            (64 << 10, 128 << 10)
        );
        for p in [Protocol::LL, Protocol::LL128] {
            let q = ProtoParams::new(p, &none).unwrap();
            assert_eq!(
                (q.slice_on(true), q.chunk_on(true)),
                (q.slice_data(), q.chunk_data())
            );
        }
    }

    #[test]
    fn hierarchy_matches_nccl_defaults() {
        let s = ProtoParams::new(Protocol::SIMPLE, &none).unwrap();
        assert_eq!(
            (s.step_wire(), s.slice_data(), s.chunk_data(), s.slots()),
            (512 << 10, 1 << 20, 2 << 20, 4)
        );
        let ll = ProtoParams::new(Protocol::LL, &none).unwrap();
        assert_eq!(
            (ll.buff_bytes, ll.step_data(), ll.slots()),
            (512 << 10, 32 << 10, 8)
        );
        let l128 = ProtoParams::new(Protocol::LL128, &none).unwrap();
        assert_eq!((l128.buff_bytes, l128.step_data()), (4_915_200, 576_000));
        let env = |n: &str| (n == "NCCL_BUFFSIZE").then(|| "1048576".to_string());
        assert_eq!(
            ProtoParams::new(Protocol::SIMPLE, &env)
                .unwrap()
                .slice_data(),
            256 << 10
        );
        let bad = |_: &str| Some("12".to_string());
        assert!(
            ProtoParams::new(Protocol::LL, &bad)
                .unwrap_err()
                .message()
                .contains("NCCL_LL_BUFFSIZE=12")
        );
    }

    #[test]
    fn ll_and_ll128_round_trip_and_catch_bad_flags() {
        for proto in [Protocol::LL, Protocol::LL128, Protocol::SIMPLE] {
            let p = ProtoParams::new(proto, &none).unwrap();
            for len in [0usize, 1, 7, 8, 9, 119, 120, 121, 1000, 4097] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
                let mut wire = vec![0u8; p.wire_for(len)];
                assert_eq!(encode(proto, &data, &mut wire, 5), p.wire_for(len));
                let mut back = vec![0u8; len];
                decode(proto, &wire, &mut back, 5).unwrap();
                assert_eq!(back, data);
                if proto != Protocol::SIMPLE && len > 0 {
                    let err = decode(proto, &wire, &mut back, 6).unwrap_err();
                    assert!(err.message().contains("flag 5 where step 6"), "{err}");
                }
            }
        }
    }
}
