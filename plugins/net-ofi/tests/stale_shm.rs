//! A killed process leaves its `shm` region in `/dev/shm`, named after its PID. When
//! the kernel later hands that PID to a new process, the region's owner PID is alive
//! (it is the new process) and `fi_enable` refuses it with `-FI_EBUSY`, unlinking it
//! as it refuses. `Endpoint::open` retries once (libfabric 1.x), and libfabric 2.x
//! retries itself under a seeded name, so a job never fails on an old crash. This
//! test plants such a region for the next endpoint this process opens.
//! It is alone in its file: the endpoint index libfabric puts in region names is
//! process-wide, and no other test may open endpoints meanwhile.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cclkit_net_ofi::fabric::{Av, Cq, Domain, Endpoint, Fabric, Hints, getinfo};
use cclkit_net_ofi::sys;

fn shm_endpoint() -> Result<Endpoint, cclkit_net_ofi::fabric::FiError> {
    let mut h = Hints::new()?;
    h.caps(sys::FI_TAGGED as u64)
        .mode(sys::FI_CONTEXT | sys::FI_CONTEXT2)
        .ep_type(sys::FI_EP_RDM);
    h.provider("shm")?;
    let list = getinfo(None, None, 0, &h)?;
    let info = list.iter().next().expect("Debian's libfabric has shm");
    let fabric = Fabric::open(info)?;
    let domain: Arc<Domain> = Domain::open(&fabric, info)?;
    let cq = Cq::open(&domain)?;
    let av = Av::open(&domain)?;
    Endpoint::open(&domain, info, &cq, &av)
}

/// This process's regions: `/dev/shm/<pid>:<uid>:<endpoint index>` (a region
/// libfabric 2.x renamed after `-FI_EBUSY` has `:<seed>` appended), as (path,
/// uid, index, seed).
fn own_regions() -> Vec<(PathBuf, String, u32, Option<u32>)> {
    let prefix = format!("{}:", std::process::id());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/dev/shm").expect("/dev/shm") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let parts: Vec<&str> = rest.split(':').collect();
        let num = |i: usize| parts.get(i).and_then(|p| p.parse::<u32>().ok());
        if let (2 | 3, Some(idx)) = (parts.len(), num(1)) {
            let seed = if parts.len() == 3 { num(2) } else { None };
            if parts.len() == 2 || seed.is_some() {
                let path = Path::new("/dev/shm").join(&name);
                found.push((path, parts[0].to_owned(), idx, seed));
            }
        }
    }
    found.sort_by_key(|r| r.2);
    found
}

#[test]
fn a_stale_region_with_a_reused_pid_is_replaced() {
    let first = shm_endpoint().expect("first shm endpoint");
    let regions = own_regions();
    assert_eq!(regions.len(), 1, "one region for one endpoint: {regions:?}");
    let (path, uid, idx, _) = &regions[0];
    // A copy of a live region records this PID as its owner: exactly what a killed
    // process leaves behind once its PID is ours.
    let stale = Path::new("/dev/shm").join(format!("{}:{uid}:{}", std::process::id(), idx + 1));
    std::fs::copy(path, &stale).expect("plant the stale region");

    let second = shm_endpoint().expect("the second endpoint opens despite the stale region");
    assert!(
        !stale.exists(),
        "libfabric unlinked the stale region before the retry"
    );
    let after: Vec<(u32, Option<u32>)> = own_regions().iter().map(|r| (r.2, r.3)).collect();
    // 1.x: `Endpoint::open`'s retry took the next index. 2.x: libfabric retried
    // the busy name itself, with a seed appended.
    let retried = match after.get(1) {
        Some(&(i, None)) => i == idx + 2,
        Some(&(i, Some(_))) => i == idx + 1,
        None => false,
    };
    assert!(
        after.len() == 2 && after[0] == (*idx, None) && retried,
        "the original region and one retried past the stale one: {after:?}"
    );
    drop(second);
    drop(first);
    assert!(own_regions().is_empty(), "closing removes both regions");
}
