//! The dynamic section as the loader sees it: `PT_DYNAMIC` and the `PT_LOAD` segments
//! that map its addresses to file offsets. Used for `DT_NEEDED`/`DT_SONAME`/RPATHs,
//! and for the dynamic symbols when section headers are missing or cut (a library
//! stripped of its section table, or truncated after its loadable segments, still
//! loads: `ld.so` reads only program headers).

use object::elf;
use object::read::elf::{Dyn, FileHeader, GnuHashTable, HashTable, ProgramHeader, Sym};

use super::{ElfError, Symbol};

/// The dynamic entries of one file and how to read what they point at.
pub(super) struct Dynamic<'a, H: FileHeader> {
    data: &'a [u8],
    endian: H::Endian,
    phdrs: &'a [H::ProgramHeader],
    /// `(d_tag, d_val)`, up to `DT_NULL`.
    pub entries: Vec<(u64, u64)>,
}

impl<'a, H: FileHeader> Dynamic<'a, H> {
    /// The `PT_DYNAMIC` entries; `None` when the file has none (not a dynamic object).
    pub fn read(header: &H, endian: H::Endian, data: &'a [u8]) -> Result<Option<Self>, ElfError> {
        let phdrs = header
            .program_headers(endian, data)
            .map_err(|e| ElfError(format!("bad program headers: {e}")))?;
        let Some(dyns) = phdrs
            .iter()
            .find_map(|p| p.dynamic(endian, data).transpose())
            .transpose()
            .map_err(|e| ElfError(format!("bad PT_DYNAMIC: {e}")))?
        else {
            return Ok(None);
        };
        let entries = dyns
            .iter()
            .map(|d| (d.d_tag(endian).into(), d.d_val(endian).into()))
            .take_while(|&(tag, _)| tag != u64::from(elf::DT_NULL))
            .collect();
        Ok(Some(Self {
            data,
            endian,
            phdrs,
            entries,
        }))
    }

    /// The value of the first entry with `tag`.
    pub fn get(&self, tag: u32) -> Option<u64> {
        self.entries
            .iter()
            .find(|(t, _)| *t == u64::from(tag))
            .map(|&(_, v)| v)
    }

    /// The file bytes from virtual address `addr` to the end of its `PT_LOAD` segment.
    fn at(&self, addr: u64) -> Option<&'a [u8]> {
        self.phdrs.iter().find_map(|p| {
            if p.p_type(self.endian) != elf::PT_LOAD {
                return None;
            }
            let (va, off, size): (u64, u64, u64) = (
                p.p_vaddr(self.endian).into(),
                p.p_offset(self.endian).into(),
                p.p_filesz(self.endian).into(),
            );
            let rel = addr.checked_sub(va).filter(|&r| r < size)?;
            let start = usize::try_from(off.checked_add(rel)?).ok()?;
            let end = usize::try_from(off.checked_add(size)?).ok()?;
            self.data.get(start..end.min(self.data.len()))
        })
    }

    /// The dynamic string table (`DT_STRTAB`, `DT_STRSZ` bytes).
    fn strtab(&self) -> Result<&'a [u8], ElfError> {
        let addr = self
            .get(elf::DT_STRTAB)
            .ok_or_else(|| ElfError("PT_DYNAMIC has no DT_STRTAB".into()))?;
        let bytes = self
            .at(addr)
            .ok_or_else(|| ElfError("DT_STRTAB points outside the file's segments".into()))?;
        let size = self
            .get(elf::DT_STRSZ)
            .and_then(|s| usize::try_from(s).ok())
            .unwrap_or(bytes.len());
        Ok(&bytes[..size.min(bytes.len())])
    }

    /// The NUL-terminated string at offset `off` of the dynamic string table.
    pub fn string(&self, off: u64) -> Result<String, ElfError> {
        let tab = self.strtab()?;
        let tail = usize::try_from(off)
            .ok()
            .and_then(|o| tab.get(o..))
            .ok_or_else(|| ElfError(format!("string offset {off} outside DT_STRTAB")))?;
        let end = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| ElfError(format!("unterminated string at DT_STRTAB+{off}")))?;
        Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
    }

    /// Number of dynamic symbols, from `DT_HASH` or else `DT_GNU_HASH`.
    fn symbol_count(&self) -> Result<usize, ElfError> {
        if let Some(bytes) = self.get(elf::DT_HASH).and_then(|a| self.at(a))
            && let Ok(h) = HashTable::<H>::parse(self.endian, bytes)
        {
            return Ok(h.symbol_table_length() as usize);
        }
        if let Some(bytes) = self.get(elf::DT_GNU_HASH).and_then(|a| self.at(a))
            && let Ok(h) = GnuHashTable::<H>::parse(self.endian, bytes)
            && let Some(n) = h.symbol_table_length(self.endian)
        {
            return Ok(n as usize);
        }
        Err(ElfError(
            "no section headers, and PT_DYNAMIC has no usable DT_HASH or DT_GNU_HASH to size \
             the dynamic symbol table"
                .into(),
        ))
    }

    /// The defined dynamic symbols, read through `DT_SYMTAB` as the loader does.
    pub fn symbols(&self) -> Result<Vec<Symbol>, ElfError> {
        let addr = self
            .get(elf::DT_SYMTAB)
            .ok_or_else(|| ElfError("PT_DYNAMIC has no DT_SYMTAB".into()))?;
        let bytes = self
            .at(addr)
            .ok_or_else(|| ElfError("DT_SYMTAB points outside the file's segments".into()))?;
        let count = self.symbol_count()?;
        let (syms, _) = object::pod::slice_from_bytes::<H::Sym>(bytes, count)
            .map_err(|()| ElfError(format!("DT_SYMTAB holds fewer than {count} symbols")))?;
        let mut out = Vec::new();
        for s in syms.iter().skip(1) {
            if s.st_shndx(self.endian) == elf::SHN_UNDEF {
                continue; // imported, not exported
            }
            out.push(Symbol {
                name: self.string(u64::from(s.st_name(self.endian)))?,
                kind: s.st_type(),
                size: s.st_size(self.endian).into(),
            });
        }
        Ok(out)
    }
}
