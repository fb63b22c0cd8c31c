//! An opened device: the endpoint of one domain and the engine behind its lock.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cclkit_abi::raw::common::subsys;
use cclkit_abi::{Error, Result, nccl_info};

use crate::config::Config;
use crate::discover::{DeviceDesc, bind_info};
use crate::engine::{Engine, Liveness, SLOT_SHARED};
use crate::fabric::{Av, Cq, Domain, Endpoint, Fabric};
use crate::mr::MrCache;
use crate::proto::provider_fingerprint;
use crate::sys;

/// One NCCL device with its open endpoint, shared by every comm on it.
pub struct Device {
    /// Index in the device list.
    pub index: usize,
    /// Domain name, for messages.
    pub name: String,
    /// Fingerprint of the provider name, carried in handles.
    pub fingerprint: u32,
    /// This endpoint's address.
    pub addr: Vec<u8>,
    /// Largest grouped receive.
    pub max_recvs: usize,
    /// Bundle size of this device's connections (`bundle.rs`); 0 = none.
    pub bundle_bytes: usize,
    /// Sizes this device's sends go as RMA writes (`engine/write.rs`); `None` = none.
    pub writes: Option<(usize, usize)>,
    /// Bundles larger than one eager message go into the receiver's bundle slots
    /// (`engine/slots.rs`): needs bundles and writes.
    pub slots: bool,
    /// Longest wait of a send for its offer, µs (`CCLKIT_OFI_OFFER_WAIT_US`);
    /// `None` = by size (`data::isend`).
    pub offer_wait_us: Option<u64>,
    engine: Mutex<Engine>,
}

impl Device {
    /// Opens fabric, domain, CQ, AV and endpoint for `desc`.
    /// `bundle_bytes`: the bundle size for its connections (0 = no bundles);
    /// `writes`: the sizes to send as RMA writes, if the provider can.
    pub fn open(
        index: usize,
        provider: &str,
        desc: &DeviceDesc,
        cfg: &Config,
        bundle_bytes: usize,
        writes: Option<(usize, usize)>,
    ) -> Result<Arc<Self>> {
        let ctx = |e: crate::fabric::FiError| {
            Error::system(format!(
                "NET/OFI: opening {provider} device {}: {e}",
                desc.name
            ))
        };
        let (info, rma) = bind_info(provider, desc, writes.is_some())?;
        let writes = writes.filter(|_| rma);
        let info = info.as_ref();
        let fabric = Fabric::open(info).map_err(ctx)?;
        let domain = Domain::open(&fabric, info).map_err(ctx)?;
        let cq = Cq::open(&domain).map_err(ctx)?;
        let av = Av::open(&domain).map_err(ctx)?;
        let ep = Endpoint::open(&domain, info, &cq, &av).map_err(ctx)?;
        let addr = ep.name().map_err(ctx)?;
        let liveness = Liveness {
            interval: (cfg.liveness_ms > 0).then(|| Duration::from_millis(cfg.liveness_ms)),
            proc_check: cfg.liveness_proc,
        };
        let mut engine = Engine::new(
            ep,
            cq,
            av,
            domain,
            MrCache::new(
                desc.mr_mode
                    | if cfg.register_host {
                        sys::FI_MR_LOCAL
                    } else {
                        0
                    },
                cfg.mr_cache,
            )
            .with_remote_write(writes.is_some()),
            desc.layout,
            liveness,
        )?;
        engine.set_bundle_rx_budget(desc.rx_size);
        let slots = cfg.bundle_slots && bundle_bytes > 0 && writes.is_some();
        let writes = writes_beside_slots(writes, slots, cfg.write.is_some());
        nccl_info!(
            subsys::NET | subsys::INIT,
            "NET/OFI: opened device {index} ({provider} {}), address {} bytes, mr_mode {:#x}, \
             receive queue {}, bundles {}{}, writes {}",
            desc.name,
            addr.len(),
            desc.mr_mode,
            desc.rx_size,
            if bundle_bytes > 0 {
                format!("of up to {bundle_bytes} bytes")
            } else {
                "off".to_owned()
            },
            if slots {
                " (into slots beyond that)"
            } else {
                ""
            },
            match writes {
                Some((lo, hi)) => format!(
                    "for sends of {lo}-{hi} bytes (TCP congestion control {})",
                    cfg.tcp_cc.as_deref().unwrap_or("unknown")
                ),
                None => "off".to_owned(),
            }
        );
        Ok(Arc::new(Self {
            index,
            name: desc.name.clone(),
            fingerprint: provider_fingerprint(provider),
            addr,
            max_recvs: cfg.max_recvs,
            bundle_bytes,
            writes,
            slots,
            offer_wait_us: cfg.offer_wait_us,
            engine: Mutex::new(engine),
        }))
    }

    /// The engine. A panic elsewhere never leaves it half-updated in a way later
    /// calls could misread, so a poisoned lock is still used.
    pub fn lock(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let e = self.lock();
        let w = crate::engine::write_counts();
        let b = crate::engine::bundle_counts();
        nccl_info!(
            subsys::NET,
            "NET/OFI: closing device {} ({}): {} posts waited for room in the provider's queues \
             (-FI_EAGAIN, or entries kept for bundle receives), {} registrations left; this \
             process so far: {} receives offered for writes, {} sends written ({} in range \
             found no offer; {} waited for theirs, {} waits ran out), {} writes landed; {} \
             sends in {} bundles ({} into slots, {} overdue), {} sends held for a full \
             bundle, {} sends alone for want of a slot",
            self.index,
            self.name,
            e.backlogged,
            e.mrs.len(),
            w.offers,
            w.writes,
            w.missed,
            w.waited,
            w.expired,
            w.landed,
            b.records,
            b.bundles,
            b.written,
            b.overdue,
            b.held,
            b.singles
        );
    }
}

/// The write range once bundle slots are on (`slots`): sends four of which
/// share one slot ([`SLOT_SHARED`]) go there instead of being written, unless
/// `CCLKIT_OFI_WRITE_BYTES` set the range (`set`) or nothing above them would
/// be left to write.
fn writes_beside_slots(
    writes: Option<(usize, usize)>,
    slots: bool,
    set: bool,
) -> Option<(usize, usize)> {
    match writes {
        Some((lo, hi)) if slots && !set && SLOT_SHARED < hi => Some((lo.max(SLOT_SHARED + 1), hi)),
        w => w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_take_the_sends_four_of_which_share_one() {
        let rxm = Some((16_385, 131_071));
        assert_eq!(
            writes_beside_slots(rxm, true, false),
            Some((32_753, 131_071))
        );
        // Without slots, or with the range set, the range stands.
        assert_eq!(writes_beside_slots(rxm, false, false), rxm);
        assert_eq!(writes_beside_slots(rxm, true, true), rxm);
        // A range that starts above stays; one that would be left empty too.
        assert_eq!(
            writes_beside_slots(Some((40_000, 90_000)), true, false),
            Some((40_000, 90_000))
        );
        assert_eq!(
            writes_beside_slots(Some((16_385, 30_000)), true, false),
            Some((16_385, 30_000))
        );
        assert_eq!(writes_beside_slots(None, true, false), None);
    }
}
