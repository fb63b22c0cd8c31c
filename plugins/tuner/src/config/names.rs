//! NCCL's lower-case names for collectives, algorithms and protocols.
//!
//! The CSV reader looks names up exactly as NVIDIA's example does (`strcmp`, so
//! "Ring" is unknown) and falls back to NCCL's defaults; the TOML reader accepts any
//! case and ignores `_`/`-`, but rejects unknown names.

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};

/// The collectives a tuner is asked about, by `ncclFunc_t` value.
pub const COLLECTIVES: [(&str, Func); 5] = [
    ("broadcast", Func::BROADCAST),
    ("reduce", Func::REDUCE),
    ("allgather", Func::ALL_GATHER),
    ("reducescatter", Func::REDUCE_SCATTER),
    ("allreduce", Func::ALL_REDUCE),
];

/// Algorithm names as NCCL's example tuner spells them.
pub const ALGORITHMS: [(&str, Algorithm); 7] = [
    ("tree", Algorithm::TREE),
    ("ring", Algorithm::RING),
    ("collnet_direct", Algorithm::COLLNET_DIRECT),
    ("collnet_chain", Algorithm::COLLNET_CHAIN),
    ("nvls", Algorithm::NVLS),
    ("nvls_tree", Algorithm::NVLS_TREE),
    ("pat", Algorithm::PAT),
];

/// Protocol names as NCCL's example tuner spells them.
pub const PROTOCOLS: [(&str, Protocol); 3] = [
    ("ll", Protocol::LL),
    ("ll128", Protocol::LL128),
    ("simple", Protocol::SIMPLE),
];

/// The lower-case name of a collective (`"unknown"` outside 0…4).
pub fn collective_name(f: Func) -> &'static str {
    name_of(&COLLECTIVES, f)
}

/// The lower-case name of an algorithm (`"unknown"` outside 0…6).
pub fn algorithm_name(a: Algorithm) -> &'static str {
    name_of(&ALGORITHMS, a)
}

/// The lower-case name of a protocol (`"unknown"` outside 0…2).
pub fn protocol_name(p: Protocol) -> &'static str {
    name_of(&PROTOCOLS, p)
}

fn name_of<T: PartialEq + Copy>(table: &[(&'static str, T)], v: T) -> &'static str {
    table
        .iter()
        .find(|(_, x)| *x == v)
        .map_or("unknown", |(n, _)| n)
}

/// Exact lookup (NCCL's `strcmp`).
pub(crate) fn exact<T: Copy>(table: &[(&'static str, T)], s: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == s).map(|(_, v)| *v)
}

/// Case-insensitive lookup that ignores `_`, `-` and spaces ("AllReduce", "all_reduce").
pub(crate) fn loose<T: Copy>(table: &[(&'static str, T)], s: &str) -> Option<T> {
    let want = normalise(s);
    table
        .iter()
        .find(|(n, _)| normalise(n) == want)
        .map(|(_, v)| *v)
}

fn normalise(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, '_' | '-' | ' '))
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// "a, b or c" for error messages.
pub(crate) fn expected<T>(table: &[(&'static str, T)]) -> String {
    let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => (*last).to_owned(),
        None => String::new(),
    }
}
