//! What `check`, `doctor`, `info` and `package` need from a library without loading it:
//! dynamic symbols (name, type, size), `DT_NEEDED`, `DT_SONAME`, `DT_RPATH`,
//! `DT_RUNPATH`, the machine. Parsing is the `object` crate's; this module only picks
//! what the dynamic loader itself reads, so a library `dlopen` accepts is accepted
//! here: dynamic entries come from `PT_DYNAMIC`, and the dynamic symbols from the
//! section headers when they are intact, else through `DT_SYMTAB` and the hash
//! tables (see `dynamic`). 32- and 64-bit files of either byte order and any machine
//! are read; the machine is reported, never a reason to refuse.
//!
//! Files are opened safely (`file`): regular files only, without blocking, read up
//! to [`file::MAX_FILE_BYTES`].

use std::fmt;
use std::path::Path;

use object::elf;
use object::read::elf::{FileHeader, Sym};
use object::{Endianness, FileKind};

pub mod deps;
mod dynamic;
pub mod file;
pub mod ldcache;

use dynamic::Dynamic;

/// `STT_OBJECT`: a data symbol (what NCCL's versioned plugin tables are).
pub const STT_OBJECT: u8 = elf::STT_OBJECT;
/// `STT_FUNC`.
pub const STT_FUNC: u8 = elf::STT_FUNC;

/// Why a file could not be read as an ELF object.
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
    /// `e_machine` (62 = x86_64, 183 = aarch64, 3 = i386).
    pub machine: u16,
    /// 32 or 64 (0 when unknown).
    pub bits: u8,
    /// Big-endian file.
    pub big_endian: bool,
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

/// A short name of an `e_machine` value ("x86_64", "aarch64", "machine 243").
pub fn machine_name(machine: u16) -> String {
    match machine {
        elf::EM_X86_64 => "x86_64".into(),
        elf::EM_AARCH64 => "aarch64".into(),
        elf::EM_386 => "i386".into(),
        elf::EM_ARM => "arm".into(),
        elf::EM_PPC64 => "ppc64".into(),
        elf::EM_S390 => "s390".into(),
        elf::EM_RISCV => "riscv".into(),
        elf::EM_SPARCV9 => "sparcv9".into(),
        other => format!("machine {other}"),
    }
}

impl ElfInfo {
    /// Reads `path` (a regular file only, see [`mod@file`]).
    pub fn read(path: &Path) -> Result<Self, ElfError> {
        let data = file::read_regular(path)?;
        Self::parse(&data).map_err(|e| ElfError(format!("{}: {}", path.display(), e.0)))
    }

    /// Parses an ELF image of either class and byte order.
    pub fn parse(data: &[u8]) -> Result<Self, ElfError> {
        match FileKind::parse(data) {
            Ok(FileKind::Elf32) => parse_as::<elf::FileHeader32<Endianness>>(data, 32),
            Ok(FileKind::Elf64) => parse_as::<elf::FileHeader64<Endianness>>(data, 64),
            _ => Err(ElfError("not an ELF file".into())),
        }
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
}

/// [`ElfInfo::parse`] for one header type.
fn parse_as<H: FileHeader<Endian = Endianness>>(
    data: &[u8],
    bits: u8,
) -> Result<ElfInfo, ElfError> {
    let header = H::parse(data).map_err(|e| ElfError(format!("bad ELF header: {e}")))?;
    let endian = header
        .endian()
        .map_err(|e| ElfError(format!("bad ELF header: {e}")))?;
    let mut info = ElfInfo {
        machine: header.e_machine(endian),
        bits,
        big_endian: endian == Endianness::Big,
        ..ElfInfo::default()
    };
    let dynamic = Dynamic::read(header, endian, data)?;
    if let Some(d) = &dynamic {
        for &(tag, val) in &d.entries {
            let Ok(tag) = u32::try_from(tag) else {
                continue;
            };
            match tag {
                elf::DT_NEEDED => info.needed.push(d.string(val)?),
                elf::DT_SONAME => info.soname = Some(d.string(val)?),
                elf::DT_RPATH => info.rpath = Some(d.string(val)?),
                elf::DT_RUNPATH => info.runpath = Some(d.string(val)?),
                _ => {}
            }
        }
    }
    // Intact section headers give the symbol table the linker wrote; when they are
    // missing or cut, read it the way ld.so does.
    let from_sections = header
        .sections(endian, data)
        .and_then(|s| s.symbols(endian, data, elf::SHT_DYNSYM))
        .ok()
        .filter(|t| !t.is_empty());
    info.symbols = match (from_sections, &dynamic) {
        (Some(table), _) => table
            .iter()
            .skip(1)
            .filter(|s| s.st_shndx(endian) != elf::SHN_UNDEF)
            .map(|s| {
                let name = s
                    .name(endian, table.strings())
                    .map_err(|e| ElfError(format!("bad .dynsym name: {e}")))?;
                Ok(Symbol {
                    name: String::from_utf8_lossy(name).into_owned(),
                    kind: s.st_type(),
                    size: s.st_size(endian).into(),
                })
            })
            .collect::<Result<_, ElfError>>()?,
        (None, Some(d)) => d.symbols()?,
        (None, None) => Vec::new(),
    };
    Ok(info)
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

    /// libc's bytes.
    fn libc() -> Vec<u8> {
        let lib = cclkit_host::Library::open(Some("libc.so.6")).expect("libc");
        file::read_regular(lib.path().expect("path")).expect("read")
    }

    fn names(info: &ElfInfo) -> Vec<(String, u8, u64)> {
        let mut v: Vec<_> = info
            .symbols
            .iter()
            .map(|s| (s.name.clone(), s.kind, s.size))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn other_classes_byte_orders_and_machines_are_read_not_refused() {
        assert!(
            ElfInfo::parse(b"hello")
                .unwrap_err()
                .0
                .contains("not an ELF")
        );
        // A bare 32-bit big-endian PowerPC header: no segments, no sections.
        let mut h = vec![0u8; 52];
        h[..7].copy_from_slice(&[0x7f, b'E', b'L', b'F', 1, 2, 1]);
        h[16..18].copy_from_slice(&3u16.to_be_bytes()); // ET_DYN
        h[18..20].copy_from_slice(&20u16.to_be_bytes()); // EM_PPC
        h[20..24].copy_from_slice(&1u32.to_be_bytes());
        h[40..42].copy_from_slice(&52u16.to_be_bytes());
        let info = ElfInfo::parse(&h).expect("32-bit big-endian");
        assert_eq!((info.machine, info.bits, info.big_endian), (20, 32, true));
        assert!(info.symbols.is_empty());
        assert_eq!(machine_name(info.machine), "machine 20");
        assert_eq!(machine_name(62), "x86_64");
    }

    #[test]
    fn symbols_come_from_pt_dynamic_when_section_headers_are_gone_or_cut() {
        let data = libc();
        let whole = ElfInfo::parse(&data).expect("libc");
        assert!(whole.symbols.len() > 1000);
        // Section header table removed (e_shoff = 0, e_shnum = 0), as sstrip does.
        let mut stripped = data.clone();
        stripped[0x28..0x30].fill(0);
        stripped[0x3c..0x3e].fill(0);
        let info = ElfInfo::parse(&stripped).expect("without section headers");
        assert_eq!(names(&info), names(&whole));
        assert_eq!(info.soname, whole.soname);
        assert_eq!(info.needed, whole.needed);
        // File cut after its last loadable byte: the section headers at the end are
        // gone, and ld.so would still load what remains.
        let end = last_loaded_byte(&data);
        assert!(end < data.len(), "libc has nothing after its segments");
        let info = ElfInfo::parse(&data[..end]).expect("cut after the segments");
        assert_eq!(names(&info), names(&whole));
    }

    /// The end of the furthest `PT_LOAD` file range of a 64-bit little-endian file.
    fn last_loaded_byte(data: &[u8]) -> usize {
        let u = |at: usize, n: usize| {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&data[at..at + n]);
            u64::from_le_bytes(b) as usize
        };
        let (phoff, phentsize, phnum) = (u(0x20, 8), u(0x36, 2), u(0x38, 2));
        (0..phnum)
            .map(|i| phoff + i * phentsize)
            .filter(|&p| u(p, 4) == 1)
            .map(|p| u(p + 8, 8) + u(p + 32, 8))
            .max()
            .unwrap_or(data.len())
    }

    #[test]
    fn truncated_files_are_errors_not_panics() {
        let data = libc();
        for cut in [64, 1000, data.len() / 2, data.len() - 1] {
            let _ = ElfInfo::parse(&data[..cut]);
        }
    }
}
