//! GID selection against NCCL's rules, on in-memory tables.

use std::collections::HashMap;

use super::*;

/// A table with optional sysfs types: `None` = file missing, `Some(None)` = EINVAL.
struct Table {
    gids: Vec<[u8; 16]>,
    types: HashMap<u32, Option<Option<u32>>>,
}

impl GidTable for Table {
    fn len(&self) -> u32 {
        self.gids.len() as u32
    }
    fn gid(&self, index: u32) -> Result<[u8; 16]> {
        self.gids
            .get(index as usize)
            .copied()
            .ok_or_else(|| Error::system("ibv_query_gid: EINVAL"))
    }
    fn roce_version(&self, index: u32) -> Result<Option<u32>> {
        match self.types.get(&index) {
            Some(Some(v)) => Ok(*v),
            Some(None) => Ok(None),
            None => Err(Error::system(format!("cannot open types/{index}"))),
        }
    }
}

fn v4(last: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, last]);
    g
}

fn link_local() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..].copy_from_slice(&[2, 3, 4, 5, 6, 7, 8, 9]);
    g
}

fn v6(first: u8) -> [u8; 16] {
    let mut g = [0x11u8; 16];
    g[0] = first;
    g
}

/// A typical mlx5 RoCE table: link-local v1/v2, then IPv4 v1/v2, then IPv6 v1/v2.
fn roce_table() -> Table {
    Table {
        gids: vec![link_local(), link_local(), v4(5), v4(5), v6(0xfd), v6(0xfd)],
        types: (0..6)
            .map(|i| (i, Some(Some(if i % 2 == 0 { 1 } else { 2 }))))
            .collect(),
    }
}

fn cfg(pairs: &[(&str, &str)]) -> Config {
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| env.get(k).cloned())
}

#[test]
fn roce_picks_the_v2_gid_of_the_wanted_family() {
    let t = roce_table();
    assert_eq!(choose_gid_index(&t, LINK_ETHERNET, &cfg(&[])).unwrap(), 3);
    let v1 = cfg(&[("NCCL_IB_ROCE_VERSION_NUM", "1")]);
    assert_eq!(choose_gid_index(&t, LINK_ETHERNET, &v1).unwrap(), 2);
    let six = cfg(&[("NCCL_IB_ADDR_FAMILY", "AF_INET6")]);
    assert_eq!(choose_gid_index(&t, LINK_ETHERNET, &six).unwrap(), 5);
}

#[test]
fn roce_with_unreadable_sysfs_type_is_an_error_not_a_v1_guess() {
    let mut t = roce_table();
    t.types.remove(&3);
    let e = choose_gid_index(&t, LINK_ETHERNET, &cfg(&[])).unwrap_err();
    assert!(e.message().contains("types/3"), "{}", e.message());
    // NCCL_IB_GID_INDEX bypasses the walk (and sysfs) entirely.
    let set = cfg(&[("NCCL_IB_GID_INDEX", "3")]);
    assert_eq!(choose_gid_index(&t, LINK_ETHERNET, &set).unwrap(), 3);
    // A container where the read fails with EINVAL: "unknown", the walk goes on and
    // keeps the first IPv4 GID rather than erroring.
    let mut c = roce_table();
    c.types.insert(2, Some(None));
    c.types.insert(3, Some(None));
    assert_eq!(choose_gid_index(&c, LINK_ETHERNET, &cfg(&[])).unwrap(), 2);
}

#[test]
fn addr_range_restricts_the_candidates() {
    let mut t = roce_table();
    t.gids.extend([v4(77), v4(77)]);
    t.gids[6][12] = 192;
    t.gids[7][12] = 192;
    t.types.insert(6, Some(Some(1)));
    t.types.insert(7, Some(Some(2)));
    let c = cfg(&[("NCCL_IB_ADDR_RANGE", "192.0.0.0/8")]);
    assert_eq!(choose_gid_index(&t, LINK_ETHERNET, &c).unwrap(), 7);
    let other = cfg(&[("NCCL_IB_ADDR_RANGE", "10.0.0.0/24")]);
    assert_eq!(choose_gid_index(&t, LINK_ETHERNET, &other).unwrap(), 3);
    assert_eq!(
        parse_range(Some("10.0.0.0"), Family::V4),
        None,
        "no mask: ignored"
    );
    assert_eq!(parse_range(Some("10.0.0.0/33"), Family::V4), None);
    assert_eq!(
        parse_range(Some("fd00::/8"), Family::V4),
        None,
        "wrong family"
    );
    assert!(parse_range(Some("fd00::/8"), Family::V6).is_some());
}

#[test]
fn gid_index_applies_to_roce_only_and_ib_prefers_a_routable_flid() {
    let mut plain = [0u8; 16];
    plain[0] = 0xfe;
    plain[1] = 0x80;
    let mut routable = plain;
    routable[4] = 0x12;
    routable[5] = 0x34;
    let ib = Table {
        gids: vec![plain, routable],
        types: HashMap::new(),
    };
    let with_index = cfg(&[("NCCL_IB_GID_INDEX", "3")]);
    assert_eq!(
        choose_gid_index(&ib, 1, &with_index).unwrap(),
        1,
        "FLID GID"
    );
    let no_flid = Table {
        gids: vec![plain, plain],
        types: HashMap::new(),
    };
    assert_eq!(choose_gid_index(&no_flid, 1, &with_index).unwrap(), 0);
    let moved = cfg(&[("NCCL_IB_ROUTABLE_FLID_GID_INDEX", "5")]);
    assert_eq!(
        choose_gid_index(&ib, 1, &moved).unwrap(),
        0,
        "index past the table"
    );
}

#[test]
fn sysfs_type_text_and_gid_validity() {
    assert_eq!(parse_roce_type("RoCE v2\n"), Some(2));
    assert_eq!(parse_roce_type("IB/RoCE v1\n"), Some(1));
    assert_eq!(parse_roce_type(""), None);
    assert!(!valid_gid(&[0; 16]));
    assert!(!valid_gid(&link_local()));
    assert!(valid_gid(&v4(1)) && valid_gid(&v6(0xfd)));
}
