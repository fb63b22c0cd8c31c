//! `/etc/ld.so.cache` (glibc "new" format, `glibc-ld.so.cache1.1`): the library names
//! `ldconfig` indexed, as the dynamic linker consults them.

use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const HEADER: usize = 48;
const ENTRY: usize = 24;

/// `FLAG_ELF_LIBC6`: an entry for a glibc ELF library.
const FLAG_ELF_LIBC6: i32 = 0x0003;

/// Name → path pairs for the running architecture, in cache order.
#[derive(Debug, Clone, Default)]
pub struct LdCache {
    entries: Vec<(String, PathBuf)>,
}

impl LdCache {
    /// Loads the system cache; an unreadable cache is empty (the dynamic linker then
    /// falls back to the default directories, and so do we).
    pub fn system() -> Self {
        std::fs::read("/etc/ld.so.cache")
            .ok()
            .and_then(|d| Self::parse(&d, arch_flag()))
            .unwrap_or_default()
    }

    /// Parses a cache image, keeping entries whose architecture flag is `arch`
    /// (`None` keeps all glibc entries).
    pub fn parse(data: &[u8], arch: Option<i32>) -> Option<Self> {
        let start = if data.starts_with(MAGIC) {
            0
        } else if data.starts_with(OLD_MAGIC) {
            // Old format first: 12-byte header + 12-byte entries, then the new one,
            // 8-aligned. String offsets stay relative to the new header.
            let n = u32::from_le_bytes(data.get(12..16)?.try_into().ok()?) as usize;
            let off = (16 + n * 12).next_multiple_of(8);
            if !data.get(off..)?.starts_with(MAGIC) {
                return None;
            }
            off
        } else {
            return None;
        };
        let d = data.get(start..)?;
        let nlibs = u32::from_le_bytes(d.get(20..24)?.try_into().ok()?) as usize;
        let mut entries = Vec::with_capacity(nlibs);
        for i in 0..nlibs {
            let e = d.get(HEADER + i * ENTRY..HEADER + (i + 1) * ENTRY)?;
            let flags = i32::from_le_bytes(e[0..4].try_into().ok()?);
            let key = u32::from_le_bytes(e[4..8].try_into().ok()?) as usize;
            let value = u32::from_le_bytes(e[8..12].try_into().ok()?) as usize;
            if flags & 0xff != FLAG_ELF_LIBC6 {
                continue;
            }
            if arch.is_some_and(|a| flags & 0xff00 != a) {
                continue;
            }
            entries.push((cstr(d, key)?, PathBuf::from(cstr(d, value)?)));
        }
        Some(Self { entries })
    }

    /// The first cached path for `name`.
    pub fn lookup(&self, name: &str) -> Option<&Path> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.as_path())
    }

    /// Every (name, path) entry, in cache order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.entries.iter().map(|(n, p)| (n.as_str(), p.as_path()))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing was read.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn cstr(d: &[u8], at: usize) -> Option<String> {
    let tail = d.get(at..)?;
    let end = tail.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&tail[..end]).into_owned())
}

/// The cache's architecture flag for this build (`FLAG_X8664_LIB64`, …).
fn arch_flag() -> Option<i32> {
    if cfg!(target_arch = "x86_64") {
        Some(0x0300)
    } else if cfg!(target_arch = "aarch64") {
        Some(0x0a00)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_cache_knows_libc() {
        let c = LdCache::system();
        assert!(!c.is_empty());
        let p = c.lookup("libc.so.6").expect("libc.so.6 in ld.so.cache");
        assert!(p.is_absolute() && p.exists(), "{p:?}");
        assert!(c.lookup("libcclkit-not-there.so").is_none());
    }

    #[test]
    fn garbage_is_rejected() {
        assert!(LdCache::parse(b"nonsense", None).is_none());
        let mut d = MAGIC.to_vec();
        d.resize(HEADER, 0);
        d[20] = 5; // claims 5 entries, has none
        assert!(LdCache::parse(&d, None).is_none());
    }
}
