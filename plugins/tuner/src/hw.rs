//! The hardware a model describes: intra-node link and GPU generation.
//!
//! A leaf module: both the rule files ([`crate::config`], `[model]` settings) and the
//! [`crate::model`] name these, and neither should import the other to do so.

use cclkit_abi::raw::tuner::{
    NCCL_AMPERE_COMPCAP_IDX, NCCL_BLACKWELL_COMPCAP_IDX, NCCL_HOPPER_COMPCAP_IDX, NCCL_HW_NVLINK,
    NCCL_HW_PCI, NCCL_VOLTA_COMPCAP_IDX,
};

/// Intra-node link type: picks the row of the hardware-latency table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntraLink {
    /// NVLink (`NCCL_HW_NVLINK`).
    NvLink,
    /// PCIe (`NCCL_HW_PCI`).
    Pci,
}

impl IntraLink {
    /// Parses `nvlink` or `pci` (any case).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nvlink" => Ok(Self::NvLink),
            "pci" | "pcie" => Ok(Self::Pci),
            _ => Err(format!(
                "unknown intra-node link \"{s}\" (expected nvlink or pci)"
            )),
        }
    }

    /// `nvlink` or `pci`.
    pub fn name(self) -> &'static str {
        match self {
            Self::NvLink => "nvlink",
            Self::Pci => "pci",
        }
    }

    /// Row of `hwLatencies` for this link.
    pub(crate) fn hw_index(self) -> usize {
        match self {
            Self::NvLink => NCCL_HW_NVLINK,
            Self::Pci => NCCL_HW_PCI,
        }
    }
}

/// GPU generation: picks the column of the bandwidth-ceiling tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `NCCL_VOLTA_COMPCAP_IDX`.
    Volta,
    /// `NCCL_AMPERE_COMPCAP_IDX`.
    Ampere,
    /// `NCCL_HOPPER_COMPCAP_IDX`.
    Hopper,
    /// `NCCL_BLACKWELL_COMPCAP_IDX`.
    Blackwell,
}

impl Arch {
    /// Parses `volta`, `ampere`, `hopper` or `blackwell` (any case).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "volta" => Ok(Self::Volta),
            "ampere" => Ok(Self::Ampere),
            "hopper" => Ok(Self::Hopper),
            "blackwell" => Ok(Self::Blackwell),
            _ => Err(format!(
                "unknown architecture \"{s}\" (expected volta, ampere, hopper or blackwell)"
            )),
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Volta => "volta",
            Self::Ampere => "ampere",
            Self::Hopper => "hopper",
            Self::Blackwell => "blackwell",
        }
    }
}

impl Arch {
    /// Row of the constants' bandwidth tables for this generation.
    pub(crate) fn compcap_index(self) -> usize {
        match self {
            Self::Volta => NCCL_VOLTA_COMPCAP_IDX,
            Self::Ampere => NCCL_AMPERE_COMPCAP_IDX,
            Self::Hopper => NCCL_HOPPER_COMPCAP_IDX,
            Self::Blackwell => NCCL_BLACKWELL_COMPCAP_IDX,
        }
    }
}
