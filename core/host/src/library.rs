//! `dlopen`ed plugin libraries, shared by reference count.
//!
//! A [`Library`] is a cheap handle: clones share one `dlopen` handle, and the library
//! is `dlclose`d when the last clone is dropped, exactly like NCCL's per-communicator
//! refcount (net.cc `ncclNetPluginFinalize` → `ncclNetPluginUnload`). A later load
//! opens it afresh, so plugin globals start over (NCCL_ABI.md §3.2). Plugin tables hold
//! a clone, so a table can never outlive the code it points into.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use libloading::os::unix::{Library as RawLibrary, RTLD_LOCAL, RTLD_NOW};

/// A loaded plugin library (or the main program, for `STATIC_PLUGIN`).
#[derive(Clone)]
pub struct Library {
    inner: Arc<Inner>,
}

struct Inner {
    lib: RawLibrary,
    /// The string handed to `dlopen`, `None` for the main program.
    requested: Option<String>,
    /// The file the dynamic linker mapped, from its link map.
    path: Option<PathBuf>,
}

/// Why `dlopen` failed, with the text of `dlerror()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenError {
    /// `dlerror()` text.
    pub message: String,
    /// True when the file itself was not found (the error starts with the name and
    /// says "No such file or directory"; NCCL's plugin_open.cc uses a looser test of
    /// the same text); false when the file exists but cannot be loaded (missing
    /// dependency, wrong architecture, undefined symbol, …).
    pub not_found: bool,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Library {
    /// `dlopen(name, RTLD_NOW | RTLD_LOCAL)` as NCCL does; `None` opens the main program.
    ///
    /// Loading runs the library's constructors: only open libraries you intend to run.
    pub fn open(name: Option<&str>) -> Result<Self, OpenError> {
        let flags = RTLD_NOW | RTLD_LOCAL;
        // SAFETY: loading a library runs its initialisers; that is the purpose of a
        // plugin loader and the caller chose the name. No Rust invariant depends on it.
        let lib = unsafe { RawLibrary::open(name, flags) }.map_err(|e| {
            let message = dl_message(&e);
            // glibc reports a missing file as "<name>: cannot open shared object file:
            // No such file or directory"; a missing *dependency* names the dependency.
            let not_found = name.is_some_and(|n| message.starts_with(&format!("{n}: ")))
                && message.contains("No such file or directory");
            OpenError { message, not_found }
        })?;
        let (lib, path) = link_map_path(lib);
        Ok(Self {
            inner: Arc::new(Inner {
                lib,
                requested: name.map(str::to_owned),
                path,
            }),
        })
    }

    /// The string that was passed to `dlopen` (`None` for the main program).
    pub fn requested(&self) -> Option<&str> {
        self.inner.requested.as_deref()
    }

    /// The file the dynamic linker mapped (`None` for the main program).
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The path if known, else the requested name, else "(main program)".
    pub fn display_name(&self) -> String {
        match (self.path(), self.requested()) {
            (Some(p), _) => p.display().to_string(),
            (None, Some(n)) => n.to_owned(),
            (None, None) => "(main program)".to_owned(),
        }
    }

    /// Address of a data symbol, or `None` if the library does not export it.
    ///
    /// The address stays valid while any clone of this `Library` is alive.
    pub fn data_symbol(&self, name: &str) -> Option<NonNull<c_void>> {
        let cname = CString::new(name).ok()?;
        // SAFETY: the symbol is read as an address only (`*mut c_void`), never called;
        // dereferencing it is the caller's business.
        let sym = unsafe { self.inner.lib.get::<*mut c_void>(cname.as_bytes_with_nul()) }.ok()?;
        NonNull::new(*sym)
    }

    /// Number of live handles to this library (for tests and reports).
    pub fn handle_count(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// True if `a` and `b` share one `dlopen` handle.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }

    /// A handle that does not keep the library loaded.
    pub fn downgrade(&self) -> WeakLibrary {
        WeakLibrary {
            inner: Arc::downgrade(&self.inner),
        }
    }
}

/// A [`Library`] that may have been closed since (see [`Library::downgrade`]).
#[derive(Clone)]
pub struct WeakLibrary {
    inner: std::sync::Weak<Inner>,
}

impl WeakLibrary {
    /// The library, if some handle still keeps it loaded.
    pub fn upgrade(&self) -> Option<Library> {
        self.inner.upgrade().map(|inner| Library { inner })
    }
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library")
            .field("requested", &self.inner.requested)
            .field("path", &self.inner.path)
            .finish()
    }
}

/// True if the library at `path` is currently mapped in this process
/// (`dlopen(path, RTLD_NOW | RTLD_NOLOAD)`), e.g. to check that a release unloaded it.
pub fn is_loaded(path: &Path) -> bool {
    let Ok(cpath) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: RTLD_NOLOAD never loads anything (no initialisers run); a non-NULL result
    // is a new reference that we release immediately.
    unsafe {
        let h = libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
    }
    true
}

/// The size the ELF symbol table records for the object at `addr` (`st_size`), if the
/// dynamic linker knows it: used to reject a versioned table smaller than its version.
pub fn symbol_size(addr: NonNull<c_void>) -> Option<usize> {
    /// `Elf64_Sym` (the prefix we read; the layout is fixed by the ELF spec).
    #[repr(C)]
    struct Elf64Sym {
        st_name: u32,
        st_info: u8,
        st_other: u8,
        st_shndx: u16,
        st_value: u64,
        st_size: u64,
    }
    /// `RTLD_DL_SYMENT` from `<dlfcn.h>`.
    const RTLD_DL_SYMENT: c_int = 1;
    if cfg!(not(target_pointer_width = "64")) {
        return None;
    }
    // SAFETY: `Dl_info` is plain data; zero is a valid initial value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 only inspects the address; `info` and `sym` are valid out-params.
    let ok = unsafe { libc::dladdr1(addr.as_ptr(), &mut info, &mut sym, RTLD_DL_SYMENT) };
    if ok == 0 || sym.is_null() {
        return None;
    }
    // SAFETY: with RTLD_DL_SYMENT, glibc stores a pointer to the matching `ElfW(Sym)` in
    // the loaded object's symbol table, which stays mapped while the object is loaded.
    let size = unsafe { (*sym.cast::<Elf64Sym>()).st_size };
    usize::try_from(size).ok().filter(|s| *s > 0)
}

/// The `dlerror()` text inside a libloading error.
fn dl_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(src) => src.to_string(),
        None => e.to_string(),
    }
}

/// Reads the mapped file's name from the link map (as NCCL's `getLibPath` does).
fn link_map_path(lib: RawLibrary) -> (RawLibrary, Option<PathBuf>) {
    /// The first fields of glibc's `struct link_map` (public ABI in `<link.h>`).
    #[repr(C)]
    struct LinkMap {
        l_addr: usize,
        l_name: *const c_char,
    }
    let handle = lib.into_raw();
    let mut map: *mut LinkMap = std::ptr::null_mut();
    // SAFETY: `handle` is a live dlopen handle; RTLD_DI_LINKMAP writes a `link_map*`.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *mut LinkMap).cast(),
        )
    };
    let path = if rc == 0 && !map.is_null() {
        // SAFETY: the link map of a loaded object is valid while it is loaded; `l_name`
        // is a NUL-terminated string (empty for the main program).
        let name = unsafe { (*map).l_name };
        if name.is_null() {
            None
        } else {
            // SAFETY: see above.
            let s = unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            (!s.is_empty()).then(|| PathBuf::from(s))
        }
    } else {
        None
    };
    // SAFETY: `handle` came from `into_raw` above and is given back exactly once.
    (unsafe { RawLibrary::from_raw(handle) }, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_not_found() {
        let e = Library::open(Some("libcclkit-definitely-missing.so")).unwrap_err();
        assert!(e.not_found, "{e}");
        assert!(e.message.contains("libcclkit-definitely-missing.so"));
    }

    #[test]
    fn libc_opens_with_its_path_and_symbols() {
        let lib = Library::open(Some("libc.so.6")).expect("libc");
        let path = lib.path().expect("path from the link map");
        assert!(path.to_string_lossy().contains("libc.so.6"), "{path:?}");
        assert!(is_loaded(path));
        let environ = lib.data_symbol("environ").expect("environ is data in libc");
        assert!(symbol_size(environ).is_some_and(|s| s == 8));
        assert!(lib.data_symbol("ncclNetPlugin_v12").is_none());
    }

    #[test]
    fn main_program_has_no_path() {
        let lib = Library::open(None).expect("dlopen(NULL) cannot fail");
        assert_eq!(lib.path(), None);
        assert_eq!(lib.display_name(), "(main program)");
    }
}
