//! Net plugin checks (NCCL_ABI.md §2.11), one per rule NCCL relies on.

mod basic;
mod data;
mod life;
mod limits;
pub(crate) mod setup;

pub(crate) use basic::data_symbol;

use super::{CheckDef, Family};

/// Every net check, in report order.
pub(crate) const CHECKS: &[CheckDef] = &[
    def(
        "symbol",
        "the table is an exported data object of the version's size",
        basic::symbol,
    ),
    def(
        "table",
        "name non-NULL, every function NCCL calls present",
        basic::table,
    ),
    def(
        "init",
        "init/finalize per communicator (v11+), refcounted init (older)",
        basic::init,
    ),
    def(
        "devices",
        "devices() reports at least one device, consistently",
        basic::devices,
    ),
    def(
        "properties",
        "getProperties fits the version's struct and is sane",
        basic::properties,
    ),
    def(
        "listen",
        "the listen handle fits 128 bytes; listenComm non-NULL",
        basic::listen,
    ),
    def(
        "connect",
        "connect/accept never block; re-called with the same handle",
        basic::connect,
    ),
    def(
        "regmr",
        "regMr/deregMr pair on both comms, registrations usable",
        data::regmr,
    ),
    def(
        "sendrecv",
        "random data at many sizes arrives intact, sizes reported",
        data::sendrecv,
    ),
    def(
        "sizes",
        "a larger receive is accepted, a smaller one rejected",
        data::sizes,
    ),
    def(
        "inflight",
        "32 receives and 32 x maxRecvs sends in flight per comm",
        limits::inflight,
    ),
    def(
        "request-reuse",
        "completed requests are recycled (no leak)",
        limits::request_reuse,
    ),
    def(
        "grouped",
        "grouped receives of maxRecvs buffers, matched by tag",
        data::grouped,
    ),
    def(
        "optional-completion",
        "the optional-completion sentinel is overwritten",
        data::optional_completion,
    ),
    def(
        "null-retry",
        "a NULL request sends nothing; retried posts arrive once",
        data::null_retry,
    ),
    def(
        "close-inflight",
        "closing comms with requests in flight",
        life::close_inflight,
    ),
    def(
        "reload",
        "dlclose and reload, then init and transfer again",
        life::reload,
    ),
    def(
        "two-process",
        "two processes connect both ways over loopback",
        life::two_process,
    ),
    def(
        "netns",
        "two processes in separate network namespaces over veth",
        life::netns,
    ),
];

const fn def(
    name: &'static str,
    about: &'static str,
    run: fn(&super::child::Env) -> super::Checked,
) -> CheckDef {
    CheckDef {
        name,
        family: Family::Net,
        about,
        run,
    }
}
