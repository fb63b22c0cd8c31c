//! The PROFILER section of `cclkit doctor`: which profiler NCCL would load for
//! `NCCL_PROFILER_PLUGIN` (the value, `libnccl-profiler-<value>.so`, else a table in
//! the net plugin's own library), and the activation mask its `init` returns for
//! one communicator of the doctor's shape: the usual reason for an empty trace is a
//! profiler that asked for no events (NCCL's example profiler reads the mask from
//! `NCCL_PROFILE_EVENT_MASK`, 0 when unset).

use std::fmt::Write as _;

use serde::Serialize;

use cclkit_abi::raw::profiler::event as bit;
use cclkit_host::Library;
use cclkit_host::profiler::{self, InitArgs, LoadOutcome, ProfilerContext, ProfilerPlugin};

use super::contain;

/// What the doctor found for the profiler.
#[derive(Debug, Default, Serialize)]
pub struct ProfilerReport {
    /// `NCCL_PROFILER_PLUGIN` as NCCL reads it (through the env plugin).
    pub setting: Option<String>,
    /// The names `dlopen` is tried with, in order (`(main program)` for
    /// `STATIC_PLUGIN`).
    pub candidates: Vec<String>,
    /// The profiler loaded: "'name' (ncclProfiler_vN in FILE)".
    pub chosen: Option<String>,
    /// Why none was loaded (`None` when one was).
    pub outcome: Option<String>,
    /// The activation mask `init` returned, limited to the version's event types.
    pub mask: Option<u64>,
    /// The event types of the mask, by NCCL's names.
    pub events: Vec<&'static str>,
    /// `init` failed: the profiler's error (NCCL continues without it).
    pub init_error: Option<String>,
    /// The release doctor follows (`--nccl-version`) loads no profiler plugins.
    pub release_has_none: bool,
}

/// Loads the profiler for `setting` as NCCL would (falling back to a table in
/// `net_library`), runs `init` and `finalize` for one communicator, and returns the
/// report with its problems and notes.
pub fn report(
    setting: Option<String>,
    net_library: Option<&Library>,
    ranks: usize,
    nodes: usize,
) -> (ProfilerReport, Vec<String>, Vec<String>) {
    let mut r = ProfilerReport {
        candidates: profiler::candidates(setting.as_deref())
            .into_iter()
            .map(|c| c.unwrap_or_else(|| "(main program)".into()))
            .collect(),
        setting,
        ..ProfilerReport::default()
    };
    let (mut problems, mut notes) = (Vec::new(), Vec::new());
    contain::step("profiler: loading (NCCL_PROFILER_PLUGIN resolution)");
    let plugin = match ProfilerPlugin::load_with(r.setting.as_deref(), net_library) {
        Ok(p) => p,
        Err(e) => {
            // Asked for and missing, or present but unusable: the job runs without a
            // profiler, which is what the operator has to know. Nothing asked and
            // nothing found is the normal case.
            let asked = r.setting.as_deref().is_some_and(|v| !v.is_empty());
            if matches!(e, LoadOutcome::Unsupported { .. })
                || (asked && matches!(e, LoadOutcome::NotFound(_)))
            {
                problems.push(format!(
                    "PROFILER: {e}; the job would run without a profiler"
                ));
            }
            r.outcome = Some(e.to_string());
            return (r, problems, notes);
        }
    };
    r.chosen = Some(format!(
        "'{}' ({} in {})",
        plugin.name(),
        plugin.symbol(),
        plugin
            .library()
            .map_or_else(|| "the program".to_owned(), Library::display_name)
    ));
    match init_mask(&plugin, ranks, nodes) {
        Ok((mask, events)) => {
            r.mask = Some(mask);
            r.events = events;
            if mask == 0 {
                notes.push(format!(
                    "PROFILER: '{}' asked for no events at init (mask 0): it will record \
                     nothing. NCCL's example profiler takes its mask from \
                     NCCL_PROFILE_EVENT_MASK (decimal, e.g. 4095); cclkit's from \
                     CCLKIT_PROFILE_MASK",
                    plugin.name()
                ));
            }
        }
        Err(e) => {
            problems.push(format!(
                "PROFILER: init failed: {e}; NCCL would run without this profiler"
            ));
            r.init_error = Some(e);
        }
    }
    (r, problems, notes)
}

/// `init` and `finalize` of `plugin` for one communicator of `ranks` ranks on
/// `nodes` nodes: the activation mask it returned, with the event types by name.
///
/// A profiler writes its trace where it is told, by default the working directory
/// (cclkit's trace plugin), often at finalize: both calls run in a scratch directory
/// removed afterwards, so looking at a profiler leaves no files behind.
pub fn init_mask(
    plugin: &ProfilerPlugin,
    ranks: usize,
    nodes: usize,
) -> Result<(u64, Vec<&'static str>), String> {
    contain::step("profiler: init and finalize of one communicator");
    let args = InitArgs {
        comm_id: 0x0cc1_c17d_0c70_0001,
        comm_name: None,
        n_nodes: i32::try_from(nodes).unwrap_or(i32::MAX),
        n_ranks: i32::try_from(ranks).unwrap_or(i32::MAX),
        rank: 0,
    };
    let _scratch = Scratch::enter();
    let ctx = ProfilerContext::init(plugin, &args).map_err(|e| e.to_string())?;
    let mask = ctx.mask();
    drop(ctx);
    let events = (0..64)
        .map(|i| 1u64 << i)
        .filter(|b| mask & b != 0)
        .filter_map(bit::name)
        .collect();
    Ok((mask, events))
}

/// The working directory moved to a fresh temporary directory until dropped; then
/// moved back and the directory removed with whatever was written into it.
struct Scratch {
    back: Option<std::path::PathBuf>,
    dir: std::path::PathBuf,
}

impl Scratch {
    fn enter() -> Self {
        let dir = std::env::temp_dir().join(format!("cclkit-doctor-{}", std::process::id()));
        let back = std::env::current_dir().ok().filter(|_| {
            std::fs::create_dir_all(&dir).is_ok() && std::env::set_current_dir(&dir).is_ok()
        });
        Self { back, dir }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(back) = &self.back {
            let _ = std::env::set_current_dir(back);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The section's text.
pub fn render(o: &mut String, r: &ProfilerReport) {
    let setting = r.setting.as_deref().unwrap_or("unset");
    let _ = writeln!(o, "\nPROFILER (NCCL_PROFILER_PLUGIN={setting})");
    if r.release_has_none {
        let _ = writeln!(o, "  => this release has no profiler plugins");
        return;
    }
    if r.candidates.is_empty() {
        let _ = writeln!(o, "  => no profiler: disabled by the setting");
        return;
    }
    let _ = writeln!(o, "  tries: {}", r.candidates.join(", "));
    match (&r.chosen, &r.outcome) {
        (Some(c), _) => {
            let _ = writeln!(o, "  => PROFILER uses {c}");
        }
        (None, Some(why)) => {
            let _ = writeln!(o, "  => no profiler: {why}");
        }
        (None, None) => {}
    }
    if let Some(e) = &r.init_error {
        let _ = writeln!(o, "  init: FAILED: {e}");
    } else if let Some(m) = r.mask {
        let _ = writeln!(o, "  {}", mask_line(m, &r.events));
    }
}

/// "init mask 0x12: Coll, ProxyStep", or that the profiler asked for nothing.
pub fn mask_line(mask: u64, events: &[&str]) -> String {
    if events.is_empty() {
        format!("init mask {mask:#x}: none: it records nothing")
    } else {
        format!("init mask {mask:#x}: {}", events.join(", "))
    }
}
