//! A typed, layout-aware view of the model constants a host hands a tuner's `init`.
//!
//! NCCL and RCCL pass structs of four sizes through the same `constants` pointer
//! (NCCL v5/v6 1152 bytes, NCCL v7 1272, RCCL with `bwRatio` 1488 for 7 algorithms or
//! 1632 for 8). A [`Constants`] holds a reference to exactly the struct its host
//! allocated, so every accessor is a bounds-checked index into that struct: an
//! algorithm, link, GPU generation or table the host's struct lacks reads `None` and
//! a write to it returns `false`, never touching memory outside the struct.

use std::ffi::c_void;

use crate::raw::common::{Algorithm, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, Protocol};
use crate::raw::tuner::{
    NCCL_DEFAULT_CONSTANTS, ncclTunerConstants_v5_t, ncclTunerConstants_v7_t,
    rcclTunerConstants_a7_t, rcclTunerConstants_a8_t,
};

/// `[algo][proto]` rows of doubles.
type Rows = [[f64; NCCL_NUM_PROTOCOLS]];

/// Which constants struct the host passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConstantsLayout {
    /// NCCL's `ncclTunerConstants_v5_t` (= v6): 7 algorithms, 4 GPU generations, 1152 bytes.
    Nccl,
    /// NCCL's `ncclTunerConstants_v7_t`: 5 GPU generations, 1272 bytes.
    NcclV7,
    /// RCCL with 7 algorithms plus `bwRatio`: 1488 bytes.
    Rccl7,
    /// RCCL with 8 algorithms (`DIRECT_A2A`) plus `bwRatio`: 1632 bytes.
    Rccl8,
    /// RCCL whose algorithm count could not be learnt: only the 168 bytes both RCCL
    /// layouts share (base latencies of the first 7 algorithms) are reachable.
    RcclUnknown,
}

impl ConstantsLayout {
    /// Bytes the host allocated (for `RcclUnknown`, the bytes this view may touch).
    pub const fn size(self) -> usize {
        match self {
            Self::Nccl => 1152,
            Self::NcclV7 => 1272,
            Self::Rccl7 => 1488,
            Self::Rccl8 => 1632,
            Self::RcclUnknown => 168,
        }
    }

    /// Algorithms in the algorithm-indexed arrays.
    pub const fn num_algo(self) -> usize {
        match self {
            Self::Rccl8 => 8,
            _ => NCCL_NUM_ALGORITHMS,
        }
    }

    /// True for the layouts of an RCCL host.
    pub const fn is_rccl(self) -> bool {
        matches!(self, Self::Rccl7 | Self::Rccl8 | Self::RcclUnknown)
    }

    /// A short name for messages ("RCCL, 8 algorithms, 1632 bytes").
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Nccl => "NCCL v5/v6, 1152 bytes",
            Self::NcclV7 => "NCCL v7, 1272 bytes",
            Self::Rccl7 => "RCCL, 7 algorithms, 1488 bytes",
            Self::Rccl8 => "RCCL, 8 algorithms, 1632 bytes",
            Self::RcclUnknown => "RCCL, algorithm count unknown (base latencies only)",
        }
    }
}

/// One of the five `[compcap][scale]` bandwidth tables, in GB/s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BwTableKind {
    /// `llMaxBws`.
    LlMax,
    /// `perChMaxRingLL128Bws`.
    RingLl128,
    /// `perChMaxTreeLL128Bws`.
    TreeLl128,
    /// `perChMaxTreeBws`.
    Tree,
    /// `perChMaxNVLSTreeBws`.
    NvlsTree,
}

enum Inner<'a> {
    Nccl(&'a mut ncclTunerConstants_v5_t),
    NcclV7(&'a mut ncclTunerConstants_v7_t),
    Rccl7(&'a mut rcclTunerConstants_a7_t),
    Rccl8(&'a mut rcclTunerConstants_a8_t),
    RcclUnknown(&'a mut [[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS]),
}

/// The host's model constants, read and written through bounds-checked accessors.
pub struct Constants<'a> {
    inner: Inner<'a>,
}

/// Expands `$body` once per variant with `$c` bound to the struct (prefix excluded).
macro_rules! each {
    ($s:expr, $c:ident => $body:expr, unknown => $u:expr) => {
        match $s {
            Inner::Nccl($c) => $body,
            Inner::NcclV7($c) => $body,
            Inner::Rccl7($c) => $body,
            Inner::Rccl8($c) => $body,
            Inner::RcclUnknown(_) => $u,
        }
    };
}

fn idx(algo: Algorithm, proto: Protocol) -> Option<(usize, usize)> {
    Some((
        usize::try_from(algo.0).ok()?,
        usize::try_from(proto.0).ok()?,
    ))
}

fn cell(rows: &Rows, algo: Algorithm, proto: Protocol) -> Option<f64> {
    let (a, p) = idx(algo, proto)?;
    rows.get(a)?.get(p).copied()
}

fn set_cell(rows: &mut Rows, algo: Algorithm, proto: Protocol, v: f64) -> bool {
    match idx(algo, proto).and_then(|(a, p)| rows.get_mut(a)?.get_mut(p)) {
        Some(c) => {
            *c = v;
            true
        }
        None => false,
    }
}

impl<'a> Constants<'a> {
    /// NCCL's v5/v6 struct.
    pub fn nccl(c: &'a mut ncclTunerConstants_v5_t) -> Self {
        Self {
            inner: Inner::Nccl(c),
        }
    }

    /// NCCL's v7 struct.
    pub fn nccl_v7(c: &'a mut ncclTunerConstants_v7_t) -> Self {
        Self {
            inner: Inner::NcclV7(c),
        }
    }

    /// RCCL's struct with 7 algorithms.
    pub fn rccl7(c: &'a mut rcclTunerConstants_a7_t) -> Self {
        Self {
            inner: Inner::Rccl7(c),
        }
    }

    /// RCCL's struct with 8 algorithms.
    pub fn rccl8(c: &'a mut rcclTunerConstants_a8_t) -> Self {
        Self {
            inner: Inner::Rccl8(c),
        }
    }

    /// The part both RCCL layouts share (base latencies of 7 algorithms).
    pub fn rccl_unknown(c: &'a mut [[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS]) -> Self {
        Self {
            inner: Inner::RcclUnknown(c),
        }
    }

    /// Views the host's `constants` pointer as `layout`; `None` for NULL.
    ///
    /// # Safety
    /// `ptr` must be NULL or point to at least `layout.size()` bytes, 8-aligned,
    /// exclusively ours for `'a`.
    pub unsafe fn from_raw(ptr: *mut c_void, layout: ConstantsLayout) -> Option<Self> {
        if ptr.is_null() {
            return None;
        }
        // SAFETY: caller's contract; every layout is plain f64s (any bit pattern valid).
        Some(unsafe {
            match layout {
                ConstantsLayout::Nccl => Self::nccl(&mut *ptr.cast()),
                ConstantsLayout::NcclV7 => Self::nccl_v7(&mut *ptr.cast()),
                ConstantsLayout::Rccl7 => Self::rccl7(&mut *ptr.cast()),
                ConstantsLayout::Rccl8 => Self::rccl8(&mut *ptr.cast()),
                ConstantsLayout::RcclUnknown => Self::rccl_unknown(&mut *ptr.cast()),
            }
        })
    }

    /// The struct this view covers.
    pub fn layout(&self) -> ConstantsLayout {
        match self.inner {
            Inner::Nccl(_) => ConstantsLayout::Nccl,
            Inner::NcclV7(_) => ConstantsLayout::NcclV7,
            Inner::Rccl7(_) => ConstantsLayout::Rccl7,
            Inner::Rccl8(_) => ConstantsLayout::Rccl8,
            Inner::RcclUnknown(_) => ConstantsLayout::RcclUnknown,
        }
    }

    fn base(&self) -> &Rows {
        match &self.inner {
            Inner::Nccl(c) => &c.baseLatencies[..],
            Inner::NcclV7(c) => &c.baseLatencies[..],
            Inner::Rccl7(c) => &c.baseLatencies[..],
            Inner::Rccl8(c) => &c.baseLatencies[..],
            Inner::RcclUnknown(b) => &b[..],
        }
    }

    fn base_mut(&mut self) -> &mut Rows {
        match &mut self.inner {
            Inner::Nccl(c) => &mut c.baseLatencies[..],
            Inner::NcclV7(c) => &mut c.baseLatencies[..],
            Inner::Rccl7(c) => &mut c.baseLatencies[..],
            Inner::Rccl8(c) => &mut c.baseLatencies[..],
            Inner::RcclUnknown(b) => &mut b[..],
        }
    }

    fn hw(&self, hw: usize) -> Option<&Rows> {
        each!(&self.inner, c => c.hwLatencies.get(hw).map(|r| &r[..]), unknown => None)
    }

    fn hw_mut(&mut self, hw: usize) -> Option<&mut Rows> {
        each!(&mut self.inner, c => c.hwLatencies.get_mut(hw).map(|r| &mut r[..]), unknown => None)
    }

    fn bw_table(&self, kind: BwTableKind) -> Option<&Rows> {
        use BwTableKind as K;
        each!(&self.inner, c => Some(match kind {
            K::LlMax => &c.llMaxBws[..],
            K::RingLl128 => &c.perChMaxRingLL128Bws[..],
            K::TreeLl128 => &c.perChMaxTreeLL128Bws[..],
            K::Tree => &c.perChMaxTreeBws[..],
            K::NvlsTree => &c.perChMaxNVLSTreeBws[..],
        }), unknown => None)
    }

    fn bw_table_mut(&mut self, kind: BwTableKind) -> Option<&mut Rows> {
        use BwTableKind as K;
        each!(&mut self.inner, c => Some(match kind {
            K::LlMax => &mut c.llMaxBws[..],
            K::RingLl128 => &mut c.perChMaxRingLL128Bws[..],
            K::TreeLl128 => &mut c.perChMaxTreeLL128Bws[..],
            K::Tree => &mut c.perChMaxTreeBws[..],
            K::NvlsTree => &mut c.perChMaxNVLSTreeBws[..],
        }), unknown => None)
    }

    fn ratio(&self, row: usize) -> Option<&Rows> {
        match &self.inner {
            Inner::Rccl7(c) => c.bwRatio.get(row).map(|r| &r[..]),
            Inner::Rccl8(c) => c.bwRatio.get(row).map(|r| &r[..]),
            _ => None,
        }
    }

    fn ratio_mut(&mut self, row: usize) -> Option<&mut Rows> {
        match &mut self.inner {
            Inner::Rccl7(c) => c.bwRatio.get_mut(row).map(|r| &mut r[..]),
            Inner::Rccl8(c) => c.bwRatio.get_mut(row).map(|r| &mut r[..]),
            _ => None,
        }
    }

    /// `baseLatencies[algo][proto]` in µs; `None` outside the host's struct.
    pub fn base_latency(&self, algo: Algorithm, proto: Protocol) -> Option<f64> {
        cell(self.base(), algo, proto)
    }

    /// Sets `baseLatencies[algo][proto]`; `false` (nothing written) outside the struct.
    pub fn set_base_latency(&mut self, algo: Algorithm, proto: Protocol, us: f64) -> bool {
        set_cell(self.base_mut(), algo, proto, us)
    }

    /// `hwLatencies[hw][algo][proto]` in µs (`hw`: `NCCL_HW_NVLINK`, `_PCI`, `_NET`).
    pub fn hw_latency(&self, hw: usize, algo: Algorithm, proto: Protocol) -> Option<f64> {
        cell(self.hw(hw)?, algo, proto)
    }

    /// Sets `hwLatencies[hw][algo][proto]`; `false` outside the struct.
    pub fn set_hw_latency(&mut self, hw: usize, algo: Algorithm, proto: Protocol, us: f64) -> bool {
        self.hw_mut(hw)
            .is_some_and(|rows| set_cell(rows, algo, proto, us))
    }

    /// `table[compcap][scale]` in GB/s; `None` outside the struct (v7 has a fifth
    /// generation row, the others four).
    pub fn bw(&self, table: BwTableKind, compcap: usize, scale: usize) -> Option<f64> {
        self.bw_table(table)?.get(compcap)?.get(scale).copied()
    }

    /// Sets `table[compcap][scale]`; `false` outside the struct.
    pub fn set_bw(&mut self, table: BwTableKind, compcap: usize, scale: usize, gbs: f64) -> bool {
        match self
            .bw_table_mut(table)
            .and_then(|t| t.get_mut(compcap)?.get_mut(scale))
        {
            Some(c) => {
                *c = gbs;
                true
            }
            None => false,
        }
    }

    /// RCCL's `bwRatio[row][algo][proto]`; `None` under NCCL or outside the struct.
    pub fn bw_ratio(&self, row: usize, algo: Algorithm, proto: Protocol) -> Option<f64> {
        cell(self.ratio(row)?, algo, proto)
    }

    /// Sets RCCL's `bwRatio[row][algo][proto]`; `false` under NCCL or outside the struct.
    pub fn set_bw_ratio(&mut self, row: usize, algo: Algorithm, proto: Protocol, v: f64) -> bool {
        self.ratio_mut(row)
            .is_some_and(|rows| set_cell(rows, algo, proto, v))
    }

    /// NCCL's 1152-byte struct holding the host's values for every field NCCL's layout
    /// has (RCCL's eighth algorithm, `bwRatio` and v7's fifth generation are left out);
    /// fields the view cannot reach keep [`NCCL_DEFAULT_CONSTANTS`].
    pub fn to_nccl(&self) -> ncclTunerConstants_v5_t {
        match &self.inner {
            Inner::Nccl(c) => **c,
            Inner::NcclV7(c) => c.to_v5(),
            Inner::Rccl7(c) => c.to_nccl(),
            Inner::Rccl8(c) => c.to_nccl(),
            Inner::RcclUnknown(b) => ncclTunerConstants_v5_t {
                baseLatencies: **b,
                ..NCCL_DEFAULT_CONSTANTS
            },
        }
    }

    /// Writes every field of `v5` the host's struct has, at that struct's offsets.
    pub fn update_from_nccl(&mut self, v5: &ncclTunerConstants_v5_t) {
        match &mut self.inner {
            Inner::Nccl(c) => **c = *v5,
            Inner::NcclV7(c) => c.update_from_v5(v5),
            Inner::Rccl7(c) => c.update_from_nccl(v5),
            Inner::Rccl8(c) => c.update_from_nccl(v5),
            Inner::RcclUnknown(b) => **b = v5.baseLatencies,
        }
    }
}

impl std::fmt::Debug for Constants<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constants")
            .field("layout", &self.layout())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::tuner::rcclTunerConstants_a8_t;

    #[test]
    fn unknown_rccl_reaches_only_the_shared_prefix() {
        let mut prefix = NCCL_DEFAULT_CONSTANTS.baseLatencies;
        let mut c = Constants::rccl_unknown(&mut prefix);
        assert_eq!(c.layout().size(), 168);
        assert_eq!(c.base_latency(Algorithm::PAT, Protocol::SIMPLE), Some(8.0));
        assert!(c.set_base_latency(Algorithm::RING, Protocol::LL, 2.5));
        assert!(!c.set_base_latency(Algorithm(7), Protocol::LL, 1.0));
        assert_eq!(c.hw_latency(0, Algorithm::RING, Protocol::LL), None);
        assert!(!c.set_bw(BwTableKind::Tree, 0, 0, 1.0));
        assert!(!c.set_bw_ratio(0, Algorithm::RING, Protocol::LL, 1.0));
        let v5 = c.to_nccl();
        assert_eq!(v5.baseLatencies[1][0], 2.5);
        assert_eq!(v5.hwLatencies, NCCL_DEFAULT_CONSTANTS.hwLatencies);
    }

    #[test]
    fn rccl8_indices_are_checked_against_its_own_shape() {
        let mut r = rcclTunerConstants_a8_t::zeroed();
        let mut c = Constants::rccl8(&mut r);
        assert_eq!(c.layout().num_algo(), 8);
        assert!(c.set_base_latency(Algorithm(7), Protocol::SIMPLE, 3.5));
        assert!(!c.set_base_latency(Algorithm(8), Protocol::SIMPLE, 3.5));
        assert!(!c.set_base_latency(Algorithm(-1), Protocol::SIMPLE, 3.5));
        assert!(!c.set_hw_latency(3, Algorithm::RING, Protocol::LL, 1.0));
        assert!(!c.set_bw(BwTableKind::LlMax, 4, 0, 1.0), "four generations");
        assert!(!c.set_bw(BwTableKind::LlMax, 0, 3, 1.0), "three scales");
        assert!(c.set_bw_ratio(1, Algorithm(7), Protocol::LL128, 0.25));
        assert!(!c.set_bw_ratio(2, Algorithm::RING, Protocol::LL, 1.0));
        assert_eq!(c.bw_ratio(1, Algorithm(7), Protocol::LL128), Some(0.25));
        assert_eq!(r.baseLatencies[7][2], 3.5);
        assert_eq!(r.bwRatio[1][7][1], 0.25);
    }
}
