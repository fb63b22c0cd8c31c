//! Registrations of the plugin: one NIC registration per physical port of a
//! (virtual) device through each port's cache, and the keys a buffer uses.

use cclkit_abi::net::MemRegion;
use cclkit_abi::{Error, Result};

use super::{Backend, IbMr, IbNet, MrOf, lock};
use crate::nic::Nic;
use crate::proto::{Keys, MAX_DEVS};

impl<B: Backend> IbNet<B> {
    /// The keys (local, remote; per port of the virtual device) of the registration
    /// covering `[addr, addr+len)` on virtual device `dev`; `None` for an empty buffer.
    pub(super) fn covering(
        &self,
        dev: usize,
        mr: Option<&IbMr<<B::Nic as Nic>::Mr>>,
        addr: usize,
        len: usize,
    ) -> Result<Option<(Keys, Keys)>> {
        let Some(mr) = mr else {
            return if len == 0 {
                Ok(None)
            } else {
                Err(Error::invalid_argument(
                    "NET/cclkit-ib: buffer without a registration (mhandle is NULL)",
                ))
            };
        };
        if mr.dev != dev {
            return Err(Error::invalid_argument(format!(
                "NET/cclkit-ib: registration of device {} used on device {dev}",
                mr.dev
            )));
        }
        if len == 0 {
            return Ok(None);
        }
        if mr.entries.is_empty() {
            return Err(Error::invalid_argument(format!(
                "NET/cclkit-ib: buffer {addr:#x}+{len} used with an empty registration"
            )));
        }
        let (mut lkeys, mut rkeys) = ([0u32; MAX_DEVS], [0u32; MAX_DEVS]);
        for (i, (_, e)) in mr.entries.iter().enumerate() {
            if !e.covers(addr, len) {
                return Err(Error::invalid_argument(format!(
                    "NET/cclkit-ib: buffer {addr:#x}+{len} lies outside its registration {:#x}+{}",
                    e.start, e.len
                )));
            }
            (lkeys[i], rkeys[i]) = B::Nic::keys(&e.mr);
        }
        Ok(Some((lkeys, rkeys)))
    }

    /// Registers a region on every port of virtual device `dev` through each port's
    /// cache (`reg(nic, start, len)` makes a new NIC registration); on a failure the
    /// ports already done are released.
    pub(super) fn register(
        &self,
        dev: usize,
        region: MemRegion,
        reg: impl Fn(&B::Nic, usize, usize) -> Result<<B::Nic as Nic>::Mr>,
    ) -> Result<MrOf<B>> {
        let v = self.vdev(dev)?;
        let mut entries = Vec::with_capacity(v.devs.len());
        if region.len > 0 {
            for &p in &v.devs {
                let d = &self.devices[p];
                let got = lock(&d.cache).and_then(|mut c| {
                    c.acquire(region.addr, region.len, region.kind, |start, len| {
                        reg(&d.nic, start, len)
                    })
                });
                match got {
                    Ok(e) => entries.push((p, e)),
                    Err(e) => {
                        let undo = IbMr {
                            dev,
                            kind: region.kind,
                            entries,
                        };
                        // The first error is the one to report.
                        let _ = self.release(undo);
                        return Err(e);
                    }
                }
            }
        }
        Ok(IbMr {
            dev,
            kind: region.kind,
            entries,
        })
    }

    /// Drops one reference per port; deregisters those that were the last.
    pub(super) fn release(&self, mr: MrOf<B>) -> Result<()> {
        let mut first_err = None;
        for (p, entry) in mr.entries {
            let d = &self.devices[p];
            let r = lock(&d.cache)
                .and_then(|mut c| c.release(entry))
                .and_then(|last| match last {
                    Some(m) => d.nic.dereg_mr(m),
                    None => Ok(()),
                });
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}
