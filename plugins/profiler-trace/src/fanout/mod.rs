//! `CCLKIT_PROFILERS=a,b`: load other profiler libraries and forward every event
//! to each (NCCL itself loads only one profiler).
//!
//! Libraries are opened once per process, as NCCL opens a profiler (`dlopen` of the
//! name, then `libnccl-profiler-<name>.so`, `RTLD_NOW | RTLD_LOCAL`), and never
//! closed: their event handles may still be held when a communicator ends. Each
//! library is used through its newest table from `ncclProfiler_v7` down to `_v4`
//! (older ones lack the communicator arguments); events are re-encoded for that
//! version (see [`encode`]). A library that fails to load or to `init` is skipped
//! with a warning; this profiler keeps working.

use std::ffi::{CString, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use cclkit_abi::nccl_warn;
use cclkit_abi::profiler::{Event, EventState, ProfilerInit};
use cclkit_abi::raw::profiler::{v4, v5, v6, v7};

mod encode;

/// One loaded library's table, at the version it was found.
#[derive(Clone, Copy)]
enum Table {
    V7(&'static v7::ncclProfiler_v7_t),
    V6(&'static v6::ncclProfiler_v6_t),
    V5(&'static v5::ncclProfiler_v5_t),
    V4(&'static v4::ncclProfiler_v4_t),
}

struct Library {
    name: String,
    table: Table,
    warned: AtomicBool,
}

static LIBRARIES: OnceLock<Vec<Library>> = OnceLock::new();

fn dlopen(name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: a valid C string; flags as NCCL uses for plugins.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    (!h.is_null()).then_some(h)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a thread-local C string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL C string from dlerror.
        unsafe { std::ffi::CStr::from_ptr(e) }
            .to_string_lossy()
            .into_owned()
    }
}

fn symbol(lib: *mut c_void, name: &std::ffi::CStr) -> *mut c_void {
    // SAFETY: `lib` is a live handle from dlopen; `name` a C string.
    unsafe { libc::dlsym(lib, name.as_ptr()) }
}

fn load(name: &str) -> Option<Library> {
    // NCCL's rule: a plain name that fails is retried as libnccl-profiler-<name>.so,
    // unless it is a path or already of the form lib….so.
    let is_path_or_file = name.contains('/') || (name.starts_with("lib") && name.ends_with(".so"));
    let retry = !is_path_or_file;
    let opened = dlopen(name).or_else(|| {
        retry
            .then(|| dlopen(&format!("libnccl-profiler-{name}.so")))
            .flatten()
    });
    let Some(lib) = opened else {
        nccl_warn!("CCLKIT_PROFILERS: cannot load {name}: {}", dlerror());
        return None;
    };
    let own = [
        std::ptr::addr_of!(crate::ncclProfiler_v7) as usize,
        std::ptr::addr_of!(crate::ncclProfiler_v6) as usize,
        std::ptr::addr_of!(crate::ncclProfiler_v5) as usize,
        std::ptr::addr_of!(crate::ncclProfiler_v4) as usize,
    ];
    let found = [
        c"ncclProfiler_v7",
        c"ncclProfiler_v6",
        c"ncclProfiler_v5",
        c"ncclProfiler_v4",
    ]
    .iter()
    .map(|s| symbol(lib, s))
    .enumerate()
    .find(|(_, p)| !p.is_null());
    let Some((i, p)) = found else {
        nccl_warn!("CCLKIT_PROFILERS: {name} exports no ncclProfiler_v7…v4 table; skipped");
        return None;
    };
    if own.contains(&(p as usize)) {
        nccl_warn!("CCLKIT_PROFILERS: {name} is this profiler itself; skipped");
        return None;
    }
    // SAFETY: the symbol is the library's table of the version its name says; the
    // library is never closed, so the reference is 'static.
    let table = unsafe {
        match i {
            0 => Table::V7(&*p.cast()),
            1 => Table::V6(&*p.cast()),
            2 => Table::V5(&*p.cast()),
            _ => Table::V4(&*p.cast()),
        }
    };
    Some(Library {
        name: name.to_owned(),
        table,
        warned: AtomicBool::new(false),
    })
}

/// Opens the libraries named in `names` (first call only; later calls reuse them).
fn libraries(names: &[String]) -> &'static [Library] {
    LIBRARIES.get_or_init(|| names.iter().filter_map(|n| load(n)).collect())
}

/// A forwarded profiler's context in one communicator.
struct Child {
    lib: &'static Library,
    ctx: usize,
    mask: u64,
}

/// The forwarded profilers of one communicator.
pub struct Fanout {
    children: Vec<Child>,
}

/// Each forwarded profiler's handle for one event (0 = none), by child index.
pub type Handles = Box<[usize]>;

impl Library {
    fn failed(&self, what: &str, rc: cclkit_abi::raw::common::NcclResult) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            nccl_warn!(
                "CCLKIT_PROFILERS: {} {what} returned {rc}; further errors from it are not logged",
                self.name
            );
        }
    }
}

impl Fanout {
    /// Loads (once) and initialises every library for this communicator.
    pub fn init(names: &[String], args: &ProfilerInit<'_>) -> Self {
        if names.is_empty() {
            return Self {
                children: Vec::new(),
            };
        }
        let name = CString::new(args.comm_name.unwrap_or("")).unwrap_or_default();
        let name_ptr = if args.comm_name.is_some() {
            name.as_ptr()
        } else {
            std::ptr::null()
        };
        let (id, nodes, ranks, rank) = (
            args.comm_id.unwrap_or(0),
            args.n_nodes.unwrap_or(1),
            args.n_ranks.unwrap_or(1),
            args.rank.unwrap_or(0),
        );
        let log = cclkit_abi::log::host_logger();
        let mut children = Vec::new();
        for lib in libraries(names) {
            let mut ctx: *mut c_void = std::ptr::null_mut();
            let mut mask: c_int = 0;
            // SAFETY: each table's init with its version's arguments and valid
            // out-pointers; the name outlives the call.
            let rc = unsafe {
                match lib.table {
                    Table::V7(t) => t
                        .init
                        .map(|f| f(&mut ctx, id, &mut mask, name_ptr, nodes, ranks, rank, log)),
                    Table::V6(t) => t
                        .init
                        .map(|f| f(&mut ctx, id, &mut mask, name_ptr, nodes, ranks, rank, log)),
                    Table::V5(t) => t
                        .init
                        .map(|f| f(&mut ctx, id, &mut mask, name_ptr, nodes, ranks, rank, log)),
                    Table::V4(t) => t
                        .init
                        .map(|f| f(&mut ctx, &mut mask, name_ptr, id, nodes, ranks, rank, log)),
                }
            };
            match rc {
                Some(rc) if rc.is_ok() => children.push(Child {
                    lib,
                    ctx: ctx as usize,
                    mask: u64::from(mask as u32),
                }),
                Some(rc) => lib.failed("init", rc),
                None => nccl_warn!("CCLKIT_PROFILERS: {} has no init; skipped", lib.name),
            }
        }
        Self { children }
    }

    /// The union of the forwarded profilers' activation masks.
    pub fn mask(&self) -> u64 {
        self.children.iter().fold(0, |m, c| m | c.mask)
    }

    /// Whether anything is forwarded.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Starts `event` in every forwarded profiler that wants it; `parents` are the
    /// parent's handles from the same profilers.
    pub fn start(&self, event: &Event<'_>, parents: Option<&Handles>) -> Handles {
        let ty = event.kind.type_bit();
        self.children
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if c.mask & ty == 0 {
                    return 0;
                }
                let parent = parents.and_then(|p| p.get(i).copied()).unwrap_or(0) as *mut c_void;
                let mut sc = encode::Scratch::new();
                let mut h: *mut c_void = std::ptr::null_mut();
                let ctx = c.ctx as *mut c_void;
                // SAFETY: each descriptor is fully initialised for its version and
                // lives (with its strings in `sc`) until the call returns.
                let rc = unsafe {
                    match c.lib.table {
                        Table::V7(t) => encode::v7(event, parent, &mut sc).and_then(|mut d| {
                            encode::v7_tags(&mut d, event, &mut sc);
                            t.startEvent.map(|f| f(ctx, &mut h, &mut d))
                        }),
                        Table::V6(t) => encode::v6(event, parent, &mut sc)
                            .and_then(|mut d| t.startEvent.map(|f| f(ctx, &mut h, &mut d))),
                        Table::V5(t) => encode::v5(event, parent, &mut sc)
                            .and_then(|mut d| t.startEvent.map(|f| f(ctx, &mut h, &mut d))),
                        Table::V4(t) => encode::v4(event, parent, &mut sc)
                            .and_then(|mut d| t.startEvent.map(|f| f(ctx, &mut h, &mut d))),
                    }
                };
                match rc {
                    Some(rc) if rc.is_ok() => h as usize,
                    Some(rc) => {
                        c.lib.failed("startEvent", rc);
                        0
                    }
                    None => 0,
                }
            })
            .collect()
    }

    /// Forwards a state transition.
    pub fn record(&self, handles: &Handles, state: &EventState) {
        let args = encode::state_args(&state.args);
        for (c, &h) in self.children.iter().zip(handles.iter()) {
            if h == 0 {
                continue;
            }
            let mut a = args;
            let p = a.as_mut().map_or(std::ptr::null_mut(), |a| a as *mut _);
            // SAFETY: `h` came from this profiler's startEvent; args live for the call.
            let rc = unsafe {
                match c.lib.table {
                    Table::V7(t) => t
                        .recordEventState
                        .map(|f| f(h as *mut c_void, state.state, p)),
                    Table::V6(t) => t
                        .recordEventState
                        .map(|f| f(h as *mut c_void, state.state, p)),
                    Table::V5(t) => t
                        .recordEventState
                        .map(|f| f(h as *mut c_void, state.state, p)),
                    Table::V4(t) => t
                        .recordEventState
                        .map(|f| f(h as *mut c_void, state.state, p)),
                }
            };
            if let Some(rc) = rc.filter(|rc| !rc.is_ok()) {
                c.lib.failed("recordEventState", rc);
            }
        }
    }

    /// Forwards a stop.
    pub fn stop(&self, handles: &Handles) {
        for (c, &h) in self.children.iter().zip(handles.iter()) {
            if h == 0 {
                continue;
            }
            let stop = match c.lib.table {
                Table::V7(t) => t.stopEvent,
                Table::V6(t) => t.stopEvent,
                Table::V5(t) => t.stopEvent,
                Table::V4(t) => t.stopEvent,
            };
            let Some(f) = stop else { continue };
            // SAFETY: `h` came from this profiler's startEvent.
            let rc = unsafe { f(h as *mut c_void) };
            if !rc.is_ok() {
                c.lib.failed("stopEvent", rc);
            }
        }
    }

    /// Finalizes every forwarded profiler's context.
    pub fn finalize(&self) {
        for c in &self.children {
            let fin = match c.lib.table {
                Table::V7(t) => t.finalize,
                Table::V6(t) => t.finalize,
                Table::V5(t) => t.finalize,
                Table::V4(t) => t.finalize,
            };
            let Some(f) = fin else { continue };
            // SAFETY: the context came from this profiler's init and is finalized once.
            let rc = unsafe { f(c.ctx as *mut c_void) };
            if !rc.is_ok() {
                c.lib.failed("finalize", rc);
            }
        }
    }
}
