//! The header's lines about the ranks: each rank's device line (nccl-tests'
//! "Using devices"), where the buffers live, and the tuner's name.

use cclkit_runtime::Comm;

use super::place::pinned_cpu;

/// This rank's device line, nccl-tests style, with the net plugin, tuner and (when
/// one is loaded) profiler in use.
pub fn device_line(comm: &Comm) -> String {
    let me = &comm.peers()[comm.rank()];
    let devs: Vec<cclkit_runtime::NetDevice> = me.devices.clone();
    let dev = cclkit_runtime::select_nic(&devs, None, comm.local_rank(), 0).unwrap_or(0);
    let dev_name = devs.get(dev).map_or("-", |d| d.name.as_str());
    let net = comm.net();
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    format!(
        "#  Rank {:>2} Group {:>2} Pid {:>6} on {:>10} device {:>2} [{dev_name}]{} net '{}' v{}, tuner '{}'{}, {}",
        comm.rank(),
        0,
        me.pid,
        me.hostname,
        dev,
        comm.device()
            .gpu_label()
            .map_or_else(String::new, |g| format!(" GPU {g},")),
        net.name,
        net.version,
        tuner_name(comm),
        comm.profiler_name()
            .map_or_else(String::new, |p| format!(", profiler '{p}'")),
        match pinned_cpu() {
            Some(c) => format!("pinned to cpu {c}"),
            None => format!("on cpu {cpu}, not pinned"),
        }
    )
}

/// Where this run's buffers live, for the header's first line.
pub fn buffers_note(comm: &Comm) -> &'static str {
    if !comm.device().is_cuda() {
        "no GPUs: host buffers over the net plugin"
    } else if crate::standin::active_in(&|k| std::env::var_os(k)).is_some() {
        "CUDA device buffers on cclkit's host-memory CUDA stand-in: no GPU, no speed claim"
    } else {
        "CUDA device buffers"
    }
}

/// The tuner plugin's name, or the built-in cost model's.
pub fn tuner_name(comm: &Comm) -> String {
    comm.tuning()
        .tuner_name()
        .unwrap_or_else(|| cclkit_host::select::BUILTIN_MODEL.to_string())
}
