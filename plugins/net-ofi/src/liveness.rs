//! Who the peer process is, and whether it still exists.
//!
//! A receive posted on a reliable-datagram endpoint is not tied to a peer, so when
//! the peer dies it simply never completes. Two checks turn that into an error:
//! * same host and PID namespace (always the case for `shm`): the peer's
//!   `/proc/<pid>/stat` is gone, is a zombie, or shows another start time;
//! * any provider: a zero-byte ping to the peer's endpoint completes with an error
//!   (connection refused/reset on `tcp;ofi_rxm`, unreachable on EFA).
//!
//! Both run only when a comm has had no completion for `CCLKIT_OFI_LIVENESS_MS`.

use std::hash::{Hash, Hasher};

/// Identity of a process: enough to tell whether it is local and still alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcId {
    /// Hash of `/proc/sys/kernel/random/boot_id` (same kernel instance).
    pub boot: u64,
    /// Inode of `/proc/self/ns/pid` (same PID namespace).
    pub pidns: u64,
    /// Process id.
    pub pid: u32,
    /// Start time in clock ticks since boot (tells a reused pid apart).
    pub start: u64,
}

/// Encoded size of a [`ProcId`].
pub const PROC_ID_LEN: usize = 28;

impl ProcId {
    /// This process.
    pub fn current() -> Self {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                s.trim().hash(&mut h);
                h.finish()
            })
            .unwrap_or(0);
        let pidns = std::fs::metadata("/proc/self/ns/pid")
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or(0);
        let pid = std::process::id();
        Self {
            boot,
            pidns,
            pid,
            start: start_time(pid).unwrap_or(0),
        }
    }

    /// True when `other` runs on this kernel in this PID namespace, so its pid
    /// can be looked up here.
    pub fn is_local(&self, other: &ProcId) -> bool {
        self.boot != 0 && self.pidns != 0 && self.boot == other.boot && self.pidns == other.pidns
    }

    /// For a local process: `Some(reason)` when it has exited.
    pub fn exit_reason(&self) -> Option<String> {
        match proc_stat(self.pid) {
            None => Some(format!("peer process {} has exited", self.pid)),
            Some((state, _)) if state == 'Z' || state == 'X' => Some(format!(
                "peer process {} has exited (state {state})",
                self.pid
            )),
            Some((_, start)) if self.start != 0 && start != self.start => Some(format!(
                "peer process {} has exited (pid reused by another process)",
                self.pid
            )),
            Some(_) => None,
        }
    }

    /// Little-endian encoding.
    pub fn encode(&self) -> [u8; PROC_ID_LEN] {
        let mut b = [0u8; PROC_ID_LEN];
        b[0..8].copy_from_slice(&self.boot.to_le_bytes());
        b[8..16].copy_from_slice(&self.pidns.to_le_bytes());
        b[16..20].copy_from_slice(&self.pid.to_le_bytes());
        b[20..28].copy_from_slice(&self.start.to_le_bytes());
        b
    }

    /// Inverse of [`ProcId::encode`].
    pub fn decode(b: &[u8; PROC_ID_LEN]) -> Self {
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let mut pid = [0u8; 4];
        pid.copy_from_slice(&b[16..20]);
        Self {
            boot: u64_at(0),
            pidns: u64_at(8),
            pid: u32::from_le_bytes(pid),
            start: u64_at(20),
        }
    }
}

/// `(state, starttime)` from `/proc/<pid>/stat`, `None` if the process is gone.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and ')': fields resume after
    // the last ')'. Field 3 is the state, field 22 the start time.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

fn start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_is_local_and_alive() {
        let me = ProcId::current();
        assert_ne!(me.start, 0);
        assert!(me.is_local(&me));
        assert_eq!(me.exit_reason(), None);
        assert_eq!(ProcId::decode(&me.encode()), me);
    }

    #[test]
    fn exited_child_is_detected() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = start_time(pid).unwrap_or(0);
        child.wait().unwrap();
        let peer = ProcId {
            pid,
            start,
            ..ProcId::current()
        };
        assert!(peer.exit_reason().is_some());
    }

    #[test]
    fn other_namespace_is_not_local() {
        let me = ProcId::current();
        let other = ProcId {
            pidns: me.pidns + 1,
            ..me
        };
        assert!(!me.is_local(&other));
    }
}
