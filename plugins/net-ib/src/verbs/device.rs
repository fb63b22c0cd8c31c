//! Device discovery: every active port of every HCA that passes `NCCL_IB_HCA`, with
//! the properties NCCL reads (speed, port, guid, PCI path, pointer support, …).

use std::path::Path;
use std::sync::Arc;

use cclkit_abi::net::Properties;
use cclkit_abi::raw::common::ptr;
use cclkit_abi::raw::common::subsys;
use cclkit_abi::raw::net::MAX_COLLNET_SIZE;
use cclkit_abi::{Error, Result, nccl_info, nccl_warn};

use super::events::Monitor;
use super::gid::{SysfsTable, choose_gid_index};
use super::loader;
use super::nic::{VerbsNic, VerbsPort};
use super::safe::{DeviceList, Pd};
use super::sys::*;
use crate::config::Config;
use crate::fatal::FatalState;
use crate::nic::PortAddr;
use crate::proto::{MAX_MESSAGE, MAX_RECVS};
use crate::route::LocalPort;

/// A usable port and what NCCL should know about it.
pub struct Found {
    /// The NIC (device context, PD, port, chosen GID).
    pub nic: VerbsNic,
    /// Its properties.
    pub props: Properties,
}

/// Link speed in Mbps from `ibv_port_attr` (NCCL's `ncclIbSpeed` × `ncclIbWidth`:
/// per-lane rate of the lowest set speed bit × lanes of the lowest set width bit).
/// `speed` is `active_speed_ex` when the library reports it (XDR is bit 8, which
/// does not fit the 8-bit `active_speed`), else `active_speed`.
pub fn port_speed_mbps(speed: u32, active_width: u8) -> i32 {
    const SPEEDS: [i32; 9] = [
        2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000,
    ];
    const WIDTHS: [i32; 5] = [1, 4, 8, 12, 2];
    let first = |v: u32, max: usize| (0..max).find(|i| v & (1 << i) != 0).unwrap_or(max);
    SPEEDS[first(speed, SPEEDS.len() - 1)]
        * WIDTHS[first(u32::from(active_width), WIDTHS.len() - 1)]
}

/// The port speed NCCL reports (`ncclIbInitDevices`): `ibv_query_port_speed`
/// (100 Mbps units) when available, else the speed/width tables with
/// `active_speed_ex` preferred over `active_speed` when non-zero.
pub fn choose_speed_mbps(
    queried: Option<u64>,
    active_speed: u8,
    active_speed_ex: u32,
    active_width: u8,
) -> i32 {
    if let Some(q) = queried {
        return i32::try_from(q.saturating_mul(100)).unwrap_or(i32::MAX);
    }
    let speed = if active_speed_ex != 0 {
        active_speed_ex
    } else {
        u32::from(active_speed)
    };
    port_speed_mbps(speed, active_width)
}

/// `ptrSupport` as NCCL's `ncclIbGetPhysProperties`: HOST always; CUDA only with a
/// peer-memory module (GPU memory then registers through plain `ibv_reg_mr`);
/// DMABUF when the dma-buf probe passes, leaving it to NCCL to register GPU memory
/// through `regMrDmaBuf` (NCCL's core uses GPUDirect when CUDA, or DMABUF and its own
/// dma-buf support, is there).
pub fn ptr_support(peermem: bool, dmabuf: bool) -> i32 {
    let mut p = ptr::HOST;
    if peermem {
        p |= ptr::CUDA;
    }
    if dmabuf {
        p |= ptr::DMABUF;
    }
    p
}

/// `ibv_fork_init`, as NCCL's `ncclIbInitDevices` calls it before listing devices:
/// with it, registered pages are `MADV_DONTFORK`, so a process that forks after
/// init (data-loader workers) does not copy-on-write registered memory (hangs or
/// corrupt data on kernels before 5.13). On newer kernels the library returns at
/// once (`IBV_FORK_UNNEEDED`). `RDMAV_FORK_SAFE` / `IBV_FORK_SAFE` are honoured by
/// libibverbs itself. A failure is logged and ignored, as in NCCL.
fn fork_init(verbs: &loader::Verbs) {
    let Some(init) = verbs.fork_init else {
        nccl_warn!("NET/cclkit-ib: libibverbs lacks ibv_fork_init; fork() after init is unsafe");
        return;
    };
    // SAFETY: no arguments; idempotent, and safe before any registration.
    let r = unsafe { init() };
    if r != 0 {
        nccl_warn!(
            "NET/cclkit-ib: ibv_fork_init failed ({}); fork() after init is unsafe",
            std::io::Error::from_raw_os_error(r.abs())
        );
    }
}

/// `ibv_query_port_speed` when the library has it and `NCCL_IB_QUERY_PORT_SPEED`
/// allows (NCCL's `wrap_ibv_query_port_speed`).
fn query_speed(ctx: &super::safe::Context, port: u8, cfg: &Config) -> Option<u64> {
    let f = ctx
        .verbs()
        .query_port_speed
        .filter(|_| cfg.query_port_speed)?;
    let mut speed = 0u64;
    // SAFETY: live context, valid out-pointer.
    (unsafe { f(ctx.as_raw(), port, &mut speed) } == 0).then_some(speed)
}

/// GPUDirect RDMA through a peer-memory module (`nv_peermem`), as NCCL checks it.
pub fn gdr_peermem_loaded() -> bool {
    [
        "/sys/kernel/mm/memory_peers/nv_mem/version",
        "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
        "/sys/module/nvidia_peermem/version",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

/// Whether the kernel and device take dma-buf registrations: a dummy
/// `ibv_reg_dmabuf_mr` with fd -1 fails with EBADF when they do, and with
/// EOPNOTSUPP/EPROTONOSUPPORT when they do not (NCCL's probe).
fn dmabuf_supported(pd: &Pd) -> bool {
    match pd.reg_dmabuf_mr(0, 0, 0, -1, 0) {
        Ok(mr) => {
            let _ = mr.dereg();
            true
        }
        Err(e) => !e.is_unsupported(),
    }
}

/// Why there is no device at all: NULL from `ibv_get_device_list`.
fn no_device_list(e: &super::safe::VerbsError) -> Error {
    let hint = if Path::new("/dev/infiniband").exists() {
        "/dev/infiniband exists but verbs could not use it (missing provider library or permissions?)"
    } else {
        "/dev/infiniband does not exist: no RDMA device or no uverbs support in this kernel"
    };
    Error::system(format!(
        "NET/cclkit-ib: no RDMA devices: ibv_get_device_list returned NULL ({}); {hint}",
        e.source
    ))
}

/// Opens every active port that passes the filters; an error when there is none
/// (so NCCL and cclkit fall back to another transport).
pub fn discover(cfg: &Config) -> Result<Vec<Found>> {
    let verbs = loader::verbs().map_err(|m| Error::system(format!("NET/cclkit-ib: {m}")))?;
    fork_init(verbs);
    let list = DeviceList::new(verbs).map_err(|e| no_device_list(&e))?;
    if list.is_empty() {
        return Err(Error::system(
            "NET/cclkit-ib: no RDMA devices: ibv_get_device_list returned an empty list",
        ));
    }
    let gdr = gdr_peermem_loaded();
    let mut found = Vec::new();
    let mut seen = Vec::new();
    let mut skipped = Vec::new();
    for i in 0..list.len() {
        let Some(name) = list.name(i) else { continue };
        seen.push(name.clone());
        if !device_may_pass(&cfg.hca, &name) {
            continue;
        }
        match open_ports(&list, i, &name, cfg, gdr, &mut skipped) {
            Ok(mut ports) => found.append(&mut ports),
            Err(e) => {
                nccl_warn!("NET/cclkit-ib: skipping {name}: {}", e.message());
                skipped.push(format!("{name}: {}", e.message()));
            }
        }
    }
    if found.is_empty() {
        let why = if skipped.is_empty() {
            String::new()
        } else {
            format!(" (skipped: {})", skipped.join("; "))
        };
        return Err(Error::system(format!(
            "NET/cclkit-ib: no active port on the RDMA devices [{}] with NCCL_IB_HCA={}{why}",
            seen.join(", "),
            cfg.hca
        )));
    }
    Ok(found)
}

fn open_ports(
    list: &DeviceList,
    i: usize,
    name: &str,
    cfg: &Config,
    gdr: bool,
    skipped: &mut Vec<String>,
) -> Result<Vec<Found>> {
    let ctx = list.open(i)?;
    let attr = ctx.query_device()?;
    let pd = ctx.alloc_pd()?;
    let dmabuf = dmabuf_supported(&pd);
    let pci_path = std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    // One async-event monitor per opened device, shared by its ports' NICs.
    let fatal = Arc::new(FatalState::new(cfg.return_async_events));
    let monitor = Arc::new(Monitor::start(
        ctx.clone(),
        name.to_owned(),
        Arc::clone(&fatal),
    )?);
    if cfg.ooo_rq {
        // NCCL probes OOO RQ only through mlx5dv (`ncclIbQueryOooRqSize`:
        // `mlx5dv_query_device`, `ooo_recv_wrs_caps.max_rc`); for other providers
        // it stays off. This plugin does not bind mlx5dv, so `VerbsNic::ooo_rq_size`
        // is None and connections keep them off (`proto::ooo`).
        nccl_warn!(
            "NET/cclkit-ib: NCCL_IB_OOO_RQ=1 requested, but cclkit-ib does not use mlx5dv \
             (needed to probe and create out-of-order receive queues): oooRqSize=0 on {name}, \
             they stay off"
        );
    }
    let mut out = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        let pattr_ex = ctx.query_port_ex(port)?;
        let pattr = pattr_ex.attr;
        if pattr.state != IBV_PORT_ACTIVE {
            nccl_info!(
                subsys::NET | subsys::INIT,
                "NET/cclkit-ib: {name}:{port} is not active"
            );
            continue;
        }
        if pattr.link_layer != IBV_LINK_LAYER_INFINIBAND
            && pattr.link_layer != IBV_LINK_LAYER_ETHERNET
        {
            continue;
        }
        if !cfg.hca.matches(name, Some(u32::from(port))) {
            continue;
        }
        let query = |index: u32| -> Result<[u8; 16]> { Ok(ctx.query_gid(port, index as i32)?) };
        let table = SysfsTable {
            name,
            port,
            len: u32::try_from(pattr.gid_tbl_len).unwrap_or(0).min(65_536),
            query: &query,
        };
        // As NCCL, an unreadable RoCE type is an error, not a guess: this port is
        // unusable until NCCL_IB_GID_INDEX is set (NCCL fails its connections).
        let gid_index = match choose_gid_index(&table, pattr.link_layer, cfg) {
            Ok(i) => i,
            Err(e) => {
                nccl_warn!("NET/cclkit-ib: skipping {name}:{port}: {}", e.message());
                skipped.push(format!("{name}:{port}: {}", e.message()));
                continue;
            }
        };
        let gid = ctx.query_gid(port, gid_index as i32)?;
        let ptr_support = ptr_support(gdr, dmabuf);
        let ar = cfg
            .adaptive_routing
            .unwrap_or(pattr.link_layer == IBV_LINK_LAYER_INFINIBAND);
        let props = Properties {
            name: name.to_owned(),
            pci_path: pci_path.clone(),
            guid: attr.sys_image_guid,
            ptr_support,
            reg_is_global: true,
            speed_mbps: choose_speed_mbps(
                query_speed(&ctx, port, cfg),
                pattr.active_speed,
                pattr_ex.active_speed_ex,
                pattr.active_width,
            ),
            port: i32::from(port),
            max_comms: attr.max_qp,
            max_recvs: MAX_RECVS as i32,
            max_p2p_bytes: MAX_MESSAGE,
            max_coll_bytes: MAX_COLLNET_SIZE,
            ..Properties::host(name)
        };
        nccl_info!(
            subsys::NET | subsys::INIT,
            "NET/cclkit-ib: {name}:{port} {} speed {} Mbps, GID index {gid_index}, \
             ptrSupport {ptr_support:#x}, maxP2pBytes {MAX_MESSAGE}, ar={}",
            if pattr.link_layer == IBV_LINK_LAYER_ETHERNET {
                "RoCE"
            } else {
                "IB"
            },
            props.speed_mbps,
            u8::from(ar)
        );
        let local = LocalPort {
            addr: PortAddr {
                lid: pattr.lid,
                gid,
                link_layer: pattr.link_layer,
                mtu: pattr.active_mtu.clamp(IBV_MTU_256, IBV_MTU_4096) as u8,
            },
            gid_index: u8::try_from(gid_index).unwrap_or(0),
            grh_required: pattr.flags & IBV_QPF_GRH_REQUIRED != 0,
        };
        let nic = VerbsNic::new(
            VerbsPort {
                ctx: ctx.clone(),
                pd: pd.clone(),
                port,
                name: format!("{name}:{port}"),
                local,
                ar,
                fatal: Arc::clone(&fatal),
                monitor: Arc::clone(&monitor),
            },
            &attr,
            cfg,
        )?;
        out.push(Found { nic, props });
    }
    Ok(out)
}

/// Whether any port of device `name` can pass `NCCL_IB_HCA`, so the device is worth
/// opening. NCCL opens every device and checks `matchIfList(name, port) ^ searchNot`
/// per port, an entry without a port matching every port; an exclusion list can only
/// be decided per port (`^mlx5_1:2` keeps mlx5_1's other ports), so it opens all.
fn device_may_pass(hca: &crate::config::IfList, name: &str) -> bool {
    hca.is_exclude() || hca.selects(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IfList;

    #[test]
    fn hca_lists_follow_nccl_per_port_matching() {
        let all = IfList::parse("");
        assert!(device_may_pass(&all, "mlx5_0") && all.matches("mlx5_0", Some(1)));
        let f = IfList::parse("mlx5_0:1,mlx5_1");
        assert!(device_may_pass(&f, "mlx5_0"));
        assert!(f.matches("mlx5_0", Some(1)) && !f.matches("mlx5_0", Some(2)));
        assert!(f.matches("mlx5_1", Some(2)), "no port = every port");
        assert!(f.matches("mlx5_10", Some(1)), "prefix match without '='");
        assert!(!device_may_pass(&f, "mlx4_0"));
        let exact = IfList::parse("=mlx5_1");
        assert!(exact.matches("mlx5_1", Some(1)) && !device_may_pass(&exact, "mlx5_10"));
        // Exclusions: the device is opened, its ports decide.
        let not_port = IfList::parse("^=mlx5_1:2");
        assert!(device_may_pass(&not_port, "mlx5_1"));
        assert!(!not_port.matches("mlx5_1", Some(2)));
        assert!(not_port.matches("mlx5_1", Some(1)), "other ports stay");
        assert!(not_port.matches("mlx5_10", Some(2)));
        let not_dev = IfList::parse("^mlx5_3");
        assert!((1..=4).all(|p| !not_dev.matches("mlx5_3", Some(p))));
        assert!(not_dev.matches("mlx5_2", Some(1)));
        // NCCL: '^' with no names selects nothing.
        let nothing = IfList::parse("^");
        assert!(!nothing.matches("mlx5_0", Some(1)));
    }

    #[test]
    fn speed_is_lane_rate_times_width_like_nccl() {
        assert_eq!(port_speed_mbps(1, 1), 2500); // SDR 1x
        assert_eq!(port_speed_mbps(32, 2), 100_000); // EDR 4x
        assert_eq!(port_speed_mbps(64, 2), 200_000); // HDR 4x
        assert_eq!(port_speed_mbps(128, 2), 400_000); // NDR 4x
        assert_eq!(port_speed_mbps(128, 16), 200_000); // NDR 2x
        assert_eq!(port_speed_mbps(16, 4), 112_000); // FDR 8x
        assert_eq!(port_speed_mbps(32, 8), 300_000); // EDR 12x
        assert_eq!(
            port_speed_mbps(0, 0),
            200_000 * 2,
            "unknown bits → last entries"
        );
    }

    #[test]
    fn xdr_speed_comes_from_active_speed_ex() {
        assert_eq!(
            port_speed_mbps(0x100, 2),
            800_000,
            "XDR 4x needs active_speed_ex"
        );
        assert_eq!(port_speed_mbps(0x80, 2), 400_000);
    }

    #[test]
    fn ptr_support_follows_ncclibgetphysproperties() {
        use cclkit_abi::raw::common::ptr;
        assert_eq!(ptr_support(false, false), ptr::HOST);
        assert_eq!(ptr_support(true, false), ptr::HOST | ptr::CUDA);
        assert_eq!(
            ptr_support(false, true),
            ptr::HOST | ptr::DMABUF,
            "dma-buf alone is not NCCL_PTR_CUDA: NCCL would regMr GPU memory and fail"
        );
        assert_eq!(ptr_support(true, true), ptr::HOST | ptr::CUDA | ptr::DMABUF);
    }

    #[test]
    fn fork_init_runs_before_the_device_list_and_enables_fork_safety() {
        let verbs = loader::verbs().unwrap();
        let is = verbs.is_fork_initialized.unwrap();
        // The real library. Without RDMA hardware discovery fails after fork_init;
        // with it, it succeeds: either way fork_init has run.
        let _ = discover(&Config::default());
        // SAFETY: no arguments, no preconditions.
        let status = unsafe { is() };
        assert!(
            status == IBV_FORK_ENABLED || status == IBV_FORK_UNNEEDED,
            "ibv_is_fork_initialized() = {status} after init"
        );
        // A fork after init (a data-loader worker) runs and exits normally.
        // SAFETY: the child only calls async-signal-safe _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: terminate the child immediately.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0);
        let mut st = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0);
    }
}
