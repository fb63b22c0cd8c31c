//! Shared-library dependency resolution the way `ld.so` does it, to explain a failed
//! `dlopen` ("libfoo.so: cannot open shared object file") before anyone runs `ldd`.
//!
//! Search order for a `DT_NEEDED` name of object O (ld.so(8)): a name containing `/`
//! is a path; otherwise O's `DT_RPATH` and its loaders' (only when O has no
//! `DT_RUNPATH`), `LD_LIBRARY_PATH`, O's `DT_RUNPATH`, `/etc/ld.so.cache`, then the
//! default directories. `$ORIGIN` expands to O's directory. Files of another
//! architecture are skipped, as the loader skips them.

use std::collections::{HashSet, VecDeque};
use std::io::Read;
use std::path::{Path, PathBuf};

use object::Endianness;
use object::read::elf::FileHeader;
use serde::Serialize;

use super::ElfInfo;
use super::ldcache::LdCache;

/// Where a library was found and by which rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Located {
    /// The file.
    pub path: String,
    /// The rule: "path", "DT_RPATH", "LD_LIBRARY_PATH", "DT_RUNPATH", "ld.so.cache",
    /// "default directory".
    pub via: &'static str,
}

/// One dependency of the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dep {
    /// The `DT_NEEDED` name.
    pub name: String,
    /// The object that needs it.
    pub needed_by: String,
    /// Where it was found (`None` = missing).
    pub found: Option<Located>,
}

/// The dependency tree of one file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DepReport {
    /// Every dependency found, in breadth-first order.
    pub resolved: Vec<Dep>,
    /// Dependencies the loader would not find.
    pub missing: Vec<Dep>,
    /// Files that could not be read as ELF.
    pub errors: Vec<String>,
}

/// The search context of the dynamic linker.
#[derive(Debug, Clone)]
pub struct Resolver {
    ld_library_path: Vec<PathBuf>,
    cache: LdCache,
    defaults: Vec<PathBuf>,
}

/// Dependencies examined at most (a plugin's tree is rarely over a few dozen).
const MAX_DEPS: usize = 512;

impl Resolver {
    /// The context of this process (`LD_LIBRARY_PATH`, the system cache).
    pub fn from_env() -> Self {
        Self::new(
            std::env::var("LD_LIBRARY_PATH").ok().as_deref(),
            LdCache::system(),
        )
    }

    /// A context with an explicit `LD_LIBRARY_PATH` value and cache.
    pub fn new(ld_library_path: Option<&str>, cache: LdCache) -> Self {
        let triplet = if cfg!(target_arch = "aarch64") {
            "aarch64-linux-gnu"
        } else {
            "x86_64-linux-gnu"
        };
        Self {
            ld_library_path: split_paths(ld_library_path.unwrap_or(""), None),
            cache,
            defaults: [
                format!("/lib/{triplet}"),
                format!("/usr/lib/{triplet}"),
                "/lib64".into(),
                "/usr/lib64".into(),
                "/lib".into(),
                "/usr/lib".into(),
            ]
            .into_iter()
            .map(PathBuf::from)
            .collect(),
        }
    }

    /// Where `dlopen(name)` from an application without RPATH/RUNPATH finds `name`.
    pub fn locate(&self, name: &str, machine: Option<u16>) -> Option<Located> {
        self.search(name, machine, None, &[], None)
    }

    fn search(
        &self,
        name: &str,
        machine: Option<u16>,
        origin: Option<&Path>,
        rpaths: &[PathBuf],
        runpath: Option<&[PathBuf]>,
    ) -> Option<Located> {
        let hit = |p: PathBuf, via: &'static str| {
            compatible(&p, machine).then(|| Located {
                path: p.display().to_string(),
                via,
            })
        };
        if name.contains('/') {
            let p = match origin {
                Some(dir) if !name.starts_with('/') => dir.join(name),
                _ => PathBuf::from(name),
            };
            return hit(p, "path");
        }
        let dirs = |list: &[PathBuf], via| list.iter().find_map(|d| hit(d.join(name), via));
        if runpath.is_none()
            && let Some(l) = dirs(rpaths, "DT_RPATH")
        {
            return Some(l);
        }
        if let Some(l) = dirs(&self.ld_library_path, "LD_LIBRARY_PATH") {
            return Some(l);
        }
        if let Some(l) = runpath.and_then(|r| dirs(r, "DT_RUNPATH")) {
            return Some(l);
        }
        if let Some(p) = self.cache.lookup(name)
            && let Some(l) = hit(p.to_path_buf(), "ld.so.cache")
        {
            return Some(l);
        }
        dirs(&self.defaults, "default directory")
    }

    /// Library files whose name starts with `prefix` and ends in `.so`, from
    /// `LD_LIBRARY_PATH`, the cache and the default directories (name, path), first
    /// occurrence of each name only. Used to suggest what a mistyped name meant.
    pub fn files_with_prefix(&self, prefix: &str) -> Vec<(String, PathBuf)> {
        let mut out: Vec<(String, PathBuf)> = Vec::new();
        let mut add = |name: String, path: PathBuf| {
            if name.starts_with(prefix)
                && name.ends_with(".so")
                && !out.iter().any(|(n, _)| *n == name)
            {
                out.push((name, path));
            }
        };
        for dir in self.ld_library_path.iter().chain(&self.defaults) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                if let Some(name) = e.file_name().to_str() {
                    add(name.to_owned(), e.path());
                }
            }
        }
        for (name, path) in self.cache.entries() {
            add(name.to_owned(), path.to_path_buf());
        }
        out
    }

    /// Resolves the whole `DT_NEEDED` tree of `path`.
    pub fn dependencies(&self, path: &Path) -> DepReport {
        let mut report = DepReport::default();
        let root = match ElfInfo::read(path) {
            Ok(i) => i,
            Err(e) => {
                report.errors.push(e.to_string());
                return report;
            }
        };
        let machine = Some(root.machine);
        let mut seen: HashSet<String> = HashSet::new();
        // (object path, its info, RPATHs inherited from the objects that loaded it)
        let mut queue = VecDeque::from([(path.to_path_buf(), root, Vec::<PathBuf>::new())]);
        while let Some((obj, info, inherited)) = queue.pop_front() {
            let origin = obj.parent().map(Path::to_path_buf);
            let own_rpath = info
                .rpath
                .as_deref()
                .map(|r| split_paths(r, origin.as_deref()))
                .unwrap_or_default();
            let runpath = info
                .runpath
                .as_deref()
                .map(|r| split_paths(r, origin.as_deref()));
            let mut rpaths = own_rpath;
            rpaths.extend(inherited.iter().cloned());
            for name in &info.needed {
                if !seen.insert(name.clone()) || seen.len() > MAX_DEPS {
                    continue;
                }
                let found = self.search(
                    name,
                    machine,
                    origin.as_deref(),
                    &rpaths,
                    runpath.as_deref(),
                );
                let dep = Dep {
                    name: name.clone(),
                    needed_by: obj.display().to_string(),
                    found: found.clone(),
                };
                match found {
                    Some(l) => {
                        report.resolved.push(dep);
                        match ElfInfo::read(Path::new(&l.path)) {
                            Ok(child) => {
                                queue.push_back((PathBuf::from(&l.path), child, rpaths.clone()))
                            }
                            Err(e) => report.errors.push(e.to_string()),
                        }
                    }
                    None => report.missing.push(dep),
                }
            }
        }
        report
    }
}

/// Splits a colon list, expanding `$ORIGIN`/`${ORIGIN}`; empty elements mean the
/// current directory, as for the dynamic linker.
fn split_paths(list: &str, origin: Option<&Path>) -> Vec<PathBuf> {
    if list.is_empty() {
        return Vec::new();
    }
    list.split([':', ';'])
        .map(|p| {
            let p = if p.is_empty() { "." } else { p };
            match origin {
                Some(o) => {
                    let o = o.display().to_string();
                    PathBuf::from(p.replace("${ORIGIN}", &o).replace("$ORIGIN", &o))
                }
                None => PathBuf::from(p),
            }
        })
        .collect()
}

/// True when `path` is a regular ELF file for `machine` (any if `None`), as the loader
/// skips libraries of another architecture while searching.
fn compatible(path: &Path, machine: Option<u16>) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let mut hdr = Vec::with_capacity(64);
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .and_then(|f| {
            if f.metadata()?.is_file() {
                f.take(64).read_to_end(&mut hdr)
            } else {
                Ok(0)
            }
        });
    if read.is_err() {
        return false;
    }
    let found = match object::FileKind::parse(&hdr[..]) {
        Ok(object::FileKind::Elf32) => e_machine::<object::elf::FileHeader32<Endianness>>(&hdr),
        Ok(object::FileKind::Elf64) => e_machine::<object::elf::FileHeader64<Endianness>>(&hdr),
        _ => None,
    };
    found.is_some_and(|m| machine.is_none_or(|want| want == m))
}

/// `e_machine` of an ELF header of type `H`.
fn e_machine<H: FileHeader<Endian = Endianness>>(hdr: &[u8]) -> Option<u16> {
    let h = H::parse(hdr).ok()?;
    Some(h.e_machine(h.endian().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_deps_resolve() {
        let r = Resolver::new(None, LdCache::system());
        let libc = r.locate("libc.so.6", None).expect("libc");
        assert_eq!(libc.via, "ld.so.cache");
        let rep = r.dependencies(Path::new(&libc.path));
        assert!(rep.missing.is_empty(), "{rep:?}");
        assert!(!rep.resolved.is_empty());
    }

    #[test]
    fn ld_library_path_comes_before_the_cache_and_origin_expands() {
        let dir = tempfile::tempdir().expect("tempdir");
        let libc = Resolver::new(None, LdCache::system())
            .locate("libc.so.6", None)
            .expect("libc");
        std::fs::copy(&libc.path, dir.path().join("libc.so.6")).expect("copy");
        let lp = dir.path().display().to_string();
        let r = Resolver::new(Some(&lp), LdCache::system());
        let l = r.locate("libc.so.6", None).expect("found");
        assert_eq!(l.via, "LD_LIBRARY_PATH");
        assert_eq!(
            split_paths("$ORIGIN/../lib:/x", Some(Path::new("/opt/p"))),
            [PathBuf::from("/opt/p/../lib"), PathBuf::from("/x")]
        );
        assert!(!compatible(&dir.path().join("nothing.so"), None));
    }
}
