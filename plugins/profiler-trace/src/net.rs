//! A net plugin's updated descriptor: the byte count it reports now.
//!
//! NCCL's socket and IB plugins start a NetPlugin event with the posted size and,
//! with `NetPluginUpdate`, report the bytes the request actually moved; the trace
//! shows the latest. Only NCCL's own layouts (socket and IB, version 1) are read;
//! any other id leaves the bytes as they were.

use cclkit_abi::raw::profiler::{
    NCCL_PROFILER_NET_TYPE_IB, NCCL_PROFILER_NET_TYPE_MASK, NCCL_PROFILER_NET_TYPE_SOCK,
    NCCL_PROFILER_NET_VER_MASK, ncclProfilerNetIbDescr_v1_t, ncclProfilerNetSockDescr_v1_t,
};

/// The length in the descriptor at `data` of a net plugin with id `id`.
///
/// # Safety
/// `data` is 0 or the address of the descriptor `id` names, live for the call (NCCL
/// passes it to `recordEventState` during the net plugin's callback).
pub unsafe fn updated_length(id: i64, data: usize) -> Option<u64> {
    let id = u32::try_from(id).ok()?;
    if data == 0 || id & NCCL_PROFILER_NET_VER_MASK != 1 {
        return None;
    }
    let len = match id & NCCL_PROFILER_NET_TYPE_MASK {
        // SAFETY: caller's contract: a socket v1 id names a socket v1 descriptor.
        NCCL_PROFILER_NET_TYPE_SOCK => unsafe {
            (*(data as *const ncclProfilerNetSockDescr_v1_t))
                .sock
                .length
        },
        // SAFETY: as above, for IB v1.
        NCCL_PROFILER_NET_TYPE_IB => unsafe {
            (*(data as *const ncclProfilerNetIbDescr_v1_t)).qp.length
        },
        _ => return None,
    };
    u64::try_from(len).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cclkit_abi::raw::profiler::{NCCL_PROFILE_SOCKET, ncclProfilerNetSockSockDescr_v1_t};

    #[test]
    fn reads_the_socket_length_and_ignores_unknown_ids() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let n = nanos as usize + 1;
        let d = ncclProfilerNetSockDescr_v1_t {
            type_: NCCL_PROFILE_SOCKET,
            sock: ncclProfilerNetSockSockDescr_v1_t {
                fd: 3,
                op: 1,
                length: n,
            },
        };
        let addr = &d as *const _ as usize;
        let sock = i64::from(NCCL_PROFILER_NET_TYPE_SOCK | 1);
        // SAFETY: `addr` is the socket descriptor `sock` names.
        assert_eq!(unsafe { updated_length(sock, addr) }, Some(n as u64));
        // SAFETY: unknown versions and types are not read.
        assert_eq!(unsafe { updated_length(sock + 1, addr) }, None);
        let unknown_type = i64::from(7u32 << 16 | 1);
        // SAFETY: as above.
        let unknown = unsafe { updated_length(unknown_type, addr) };
        assert_eq!(unknown, None);
        // SAFETY: a NULL descriptor is not read.
        assert_eq!(unsafe { updated_length(sock, 0) }, None);
    }
}
