//! A small ELF reader for what `doctor` and `info` need without loading a library:
//! dynamic symbols (name, type, size), `DT_NEEDED`, `DT_SONAME`, `DT_RPATH`,
//! `DT_RUNPATH`. 64-bit little-endian only (x86_64, aarch64, …); anything else is
//! rejected with a clear error rather than misread.

use std::fmt;
use std::path::Path;

pub mod deps;
pub mod ldcache;

/// `STT_OBJECT`: a data symbol (what NCCL's versioned plugin tables are).
pub const STT_OBJECT: u8 = 1;
/// `STT_FUNC`.
pub const STT_FUNC: u8 = 2;

/// Why a file could not be read as a supported ELF object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfError(pub String);

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ElfError {}

/// One defined dynamic symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// Name.
    pub name: String,
    /// `STT_*` type (`STT_OBJECT` for data).
    pub kind: u8,
    /// `st_size` in bytes.
    pub size: u64,
}

/// What the reader extracts from one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElfInfo {
    /// `e_machine` (62 = x86_64, 183 = aarch64).
    pub machine: u16,
    /// `DT_SONAME`.
    pub soname: Option<String>,
    /// `DT_NEEDED` entries, in order.
    pub needed: Vec<String>,
    /// `DT_RPATH` (colon list), only used by the loader when there is no RUNPATH.
    pub rpath: Option<String>,
    /// `DT_RUNPATH` (colon list).
    pub runpath: Option<String>,
    /// Defined dynamic symbols.
    pub symbols: Vec<Symbol>,
}

impl ElfInfo {
    /// Reads `path`.
    pub fn read(path: &Path) -> Result<Self, ElfError> {
        let data = std::fs::read(path).map_err(|e| ElfError(format!("{}: {e}", path.display())))?;
        Self::parse(&data).map_err(|e| ElfError(format!("{}: {}", path.display(), e.0)))
    }

    /// Parses an ELF image.
    pub fn parse(data: &[u8]) -> Result<Self, ElfError> {
        let r = Reader(data);
        if data.len() < 64 || &data[..4] != b"\x7fELF" {
            return Err(ElfError("not an ELF file".into()));
        }
        if data[4] != 2 {
            return Err(ElfError(
                "32-bit ELF is not supported (64-bit plugins only)".into(),
            ));
        }
        if data[5] != 1 {
            return Err(ElfError("big-endian ELF is not supported".into()));
        }
        let machine = r.u16(18)?;
        let shoff = r.u64(0x28)? as usize;
        let shentsize = r.u16(0x3a)? as usize;
        let shnum = r.u16(0x3c)? as usize;
        if shoff == 0 || shnum == 0 {
            return Err(ElfError(
                "no section headers (stripped with sstrip?)".into(),
            ));
        }
        if shentsize < 64 {
            return Err(ElfError(format!("section header size {shentsize} < 64")));
        }
        let sections: Vec<Section> = (0..shnum)
            .map(|i| Section::read(&r, shoff + i * shentsize))
            .collect::<Result<_, _>>()?;
        let mut info = ElfInfo {
            machine,
            ..Self::default()
        };
        for s in &sections {
            match s.kind {
                SHT_DYNAMIC => info.read_dynamic(&r, s, &sections)?,
                SHT_DYNSYM => info.read_dynsym(&r, s, &sections)?,
                _ => {}
            }
        }
        Ok(info)
    }

    /// The defined data symbols whose name starts with `prefix`.
    pub fn objects_with_prefix<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = &'a Symbol> + 'a {
        self.symbols
            .iter()
            .filter(move |s| s.kind == STT_OBJECT && s.name.starts_with(prefix))
    }

    fn read_dynamic(
        &mut self,
        r: &Reader<'_>,
        s: &Section,
        all: &[Section],
    ) -> Result<(), ElfError> {
        let strtab = all
            .get(s.link as usize)
            .ok_or_else(|| ElfError("bad .dynamic string table link".into()))?;
        for i in 0..(s.size / 16) as usize {
            let at = s.offset as usize + i * 16;
            let tag = r.u64(at)? as i64;
            let val = r.u64(at + 8)? as usize;
            let string = || {
                r.cstr(
                    strtab.offset as usize + val,
                    (strtab.size as usize).saturating_sub(val),
                )
            };
            match tag {
                0 => break,
                DT_NEEDED => self.needed.push(string()?),
                DT_SONAME => self.soname = Some(string()?),
                DT_RPATH => self.rpath = Some(string()?),
                DT_RUNPATH => self.runpath = Some(string()?),
                _ => {}
            }
        }
        Ok(())
    }

    fn read_dynsym(
        &mut self,
        r: &Reader<'_>,
        s: &Section,
        all: &[Section],
    ) -> Result<(), ElfError> {
        let strtab = all
            .get(s.link as usize)
            .ok_or_else(|| ElfError("bad .dynsym string table link".into()))?;
        let entsize = if s.entsize == 0 {
            24
        } else {
            s.entsize as usize
        };
        for i in 1..(s.size as usize / entsize) {
            let at = s.offset as usize + i * entsize;
            let name_off = r.u32(at)? as usize;
            let st_info = r.u8(at + 4)?;
            let shndx = r.u16(at + 6)?;
            let size = r.u64(at + 16)?;
            if shndx == 0 {
                continue; // undefined: imported, not exported
            }
            let name = r.cstr(
                strtab.offset as usize + name_off,
                (strtab.size as usize).saturating_sub(name_off),
            )?;
            self.symbols.push(Symbol {
                name,
                kind: st_info & 0xf,
                size,
            });
        }
        Ok(())
    }
}

const SHT_DYNAMIC: u32 = 6;
const SHT_DYNSYM: u32 = 11;
const DT_NEEDED: i64 = 1;
const DT_SONAME: i64 = 14;
const DT_RPATH: i64 = 15;
const DT_RUNPATH: i64 = 29;

struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

impl Section {
    fn read(r: &Reader<'_>, at: usize) -> Result<Self, ElfError> {
        let s = Self {
            kind: r.u32(at + 4)?,
            offset: r.u64(at + 24)?,
            size: r.u64(at + 32)?,
            link: r.u32(at + 40)?,
            entsize: r.u64(at + 56)?,
        };
        // SHT_NOBITS (8) occupies no file space; others must lie inside the file.
        if s.kind != 8 && s.offset.saturating_add(s.size) > r.0.len() as u64 {
            return Err(ElfError(
                "a section extends past the end of the file".into(),
            ));
        }
        Ok(s)
    }
}

/// Bounds-checked little-endian reads.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes<const N: usize>(&self, at: usize) -> Result<[u8; N], ElfError> {
        self.0
            .get(at..at.saturating_add(N))
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| ElfError(format!("truncated file (read at offset {at})")))
    }
    fn u8(&self, at: usize) -> Result<u8, ElfError> {
        Ok(self.bytes::<1>(at)?[0])
    }
    fn u16(&self, at: usize) -> Result<u16, ElfError> {
        Ok(u16::from_le_bytes(self.bytes(at)?))
    }
    fn u32(&self, at: usize) -> Result<u32, ElfError> {
        Ok(u32::from_le_bytes(self.bytes(at)?))
    }
    fn u64(&self, at: usize) -> Result<u64, ElfError> {
        Ok(u64::from_le_bytes(self.bytes(at)?))
    }
    /// A NUL-terminated string at `at`, at most `max` bytes long.
    fn cstr(&self, at: usize, max: usize) -> Result<String, ElfError> {
        let tail = self
            .0
            .get(at..)
            .ok_or_else(|| ElfError(format!("string offset {at} out of range")))?;
        let tail = &tail[..tail.len().min(max)];
        let end = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| ElfError(format!("unterminated string at offset {at}")))?;
        Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libc() {
        let lib = cclkit_host::Library::open(Some("libc.so.6")).expect("libc");
        let info = ElfInfo::read(lib.path().expect("path")).expect("parse libc");
        assert_eq!(info.soname.as_deref(), Some("libc.so.6"));
        assert!(
            info.needed.iter().any(|n| n.starts_with("ld-linux")),
            "{:?}",
            info.needed
        );
        let environ = info
            .symbols
            .iter()
            .find(|s| s.name == "environ")
            .expect("environ");
        assert_eq!((environ.kind, environ.size), (STT_OBJECT, 8));
        assert!(
            info.symbols
                .iter()
                .any(|s| s.name == "malloc" && s.kind == STT_FUNC)
        );
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        assert!(
            ElfInfo::parse(b"hello")
                .unwrap_err()
                .0
                .contains("not an ELF")
        );
        let mut hdr = vec![0u8; 64];
        hdr[..4].copy_from_slice(b"\x7fELF");
        hdr[4] = 1;
        assert!(ElfInfo::parse(&hdr).unwrap_err().0.contains("32-bit"));
        hdr[4] = 2;
        hdr[5] = 2;
        assert!(ElfInfo::parse(&hdr).unwrap_err().0.contains("big-endian"));
        hdr[5] = 1;
        assert!(
            ElfInfo::parse(&hdr)
                .unwrap_err()
                .0
                .contains("section headers")
        );
    }

    #[test]
    fn truncated_files_are_errors_not_panics() {
        let lib = cclkit_host::Library::open(Some("libc.so.6")).expect("libc");
        let data = std::fs::read(lib.path().expect("path")).expect("read");
        for cut in [64, 1000, data.len() / 2, data.len() - 1] {
            let _ = ElfInfo::parse(&data[..cut]);
        }
    }
}
