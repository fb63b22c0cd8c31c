//! The panic edge: every exported entry point runs its body through [`guard`].
//!
//! A panic that unwinds out of an `extern "C"` fn aborts the process (and the whole
//! NCCL job with it). Here it becomes `ncclInternalError`, and the panic message and
//! location go to NCCL's log once.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, Once};

use crate::error::Result;
use crate::raw::common::NcclResult;

thread_local! {
    // Const-initialised and without a destructor, so a dlclose()d plugin leaves no
    // thread-exit hook behind.
    static IN_GUARD: Cell<u32> = const { Cell::new(0) };
}

/// Message and location of the last panic caught inside a guard.
static LAST_PANIC: Mutex<Option<(std::thread::ThreadId, String)>> = Mutex::new(None);
static HOOK: Once = Once::new();
static HOOK_REMOVED: Once = Once::new();

/// Chains a panic hook that records panics raised inside a guard (instead of
/// printing them) and leaves every other panic to the previous hook, so a host
/// that links a plugin as a Rust library keeps its own panic reporting.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_GUARD.with(Cell::get) > 0 {
                let text = match info.location() {
                    Some(loc) => format!(
                        "{} at {}:{}",
                        payload_text(info.payload()),
                        loc.file(),
                        loc.line()
                    ),
                    None => payload_text(info.payload()),
                };
                if let Ok(mut last) = LAST_PANIC.lock() {
                    *last = Some((std::thread::current().id(), text));
                }
            } else {
                previous(info);
            }
        }));
    });
}

/// Removes the hook again when the library is unloaded (`.fini_array`), so its boxed
/// closure is freed rather than left behind by every dlopen/dlclose cycle. A plugin's
/// copy of std goes away with the library, so nothing else can observe the change.
pub fn uninstall_hook() {
    if HOOK.is_completed() {
        HOOK_REMOVED.call_once(|| drop(std::panic::take_hook()));
    }
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Runs `body` for the entry point `entry` (e.g. `"ncclNetPlugin_v12.isend"`):
/// `Ok` → `ncclSuccess`; `Err(e)` → `e.code()` with the message logged at WARN;
/// a panic → `ncclInternalError` with the panic message and location logged.
pub fn guard(entry: &'static str, body: impl FnOnce() -> Result<()>) -> NcclResult {
    install_hook();
    IN_GUARD.with(|g| g.set(g.get() + 1));
    let outcome = catch_unwind(AssertUnwindSafe(body));
    IN_GUARD.with(|g| g.set(g.get().saturating_sub(1)));
    match outcome {
        Ok(Ok(())) => NcclResult::SUCCESS,
        Ok(Err(err)) => {
            crate::nccl_warn!("{entry}: {}", err.message());
            err.code()
        }
        Err(payload) => {
            let me = std::thread::current().id();
            let recorded = LAST_PANIC
                .lock()
                .ok()
                .and_then(|mut last| last.take_if(|(tid, _)| *tid == me))
                .map(|(_, text)| text);
            let text = recorded.unwrap_or_else(|| payload_text(payload.as_ref()));
            crate::nccl_warn!("{entry}: plugin panicked: {text}; returning ncclInternalError");
            NcclResult::INTERNAL_ERROR
        }
    }
}
