//! Net plugin checks (NCCL_ABI.md §2.11, §2.11b), one per rule NCCL relies on.
//!
//! Contract checks drive the plugin only the way NCCL's proxy does (oldest request
//! tested first per comm, the registered `mhandle` on every transfer, receives never
//! smaller than the send, at most the version's request limit in flight); they decide
//! the verdict. Probes do what NCCL never does and only warn.

mod after_close;
mod basic;
mod cuda;
mod data;
pub(crate) mod flow;
mod life;
mod limits;
mod probes;
mod props;
pub(crate) mod setup;
mod stray;
pub(crate) mod timing;

pub(crate) use basic::data_symbol;

use super::{CheckDef, Class, Family};

/// Every net check, in report order.
pub(crate) const CHECKS: &[CheckDef] = &[
    contract(
        "symbol",
        "the table is an exported data object of the version's size",
        "NCCL dlsym()s ncclNetPlugin_vN and reads the table struct at that address",
        basic::symbol,
    ),
    contract(
        "table",
        "name non-NULL, every function NCCL calls present",
        "NCCL calls listen/connect/accept/regMr/isend/irecv/test/close* without a NULL check",
        basic::table,
    ),
    contract(
        "init",
        "init/finalize per communicator (v11+), refcounted init (older)",
        "NCCL inits once per communicator (v11+) or once per process through its shim",
        basic::init,
    ),
    contract(
        "devices",
        "devices() reports at least one device, consistently",
        "NCCL calls devices() at init and sizes its device tables with the answer",
        basic::devices,
    ),
    contract(
        "properties",
        "getProperties fits the version's struct and is sane",
        "NCCL reads every field of the version's ncclNetProperties struct",
        basic::properties,
    ),
    contract(
        "props-written",
        "getProperties writes every field the version defines",
        "NCCL passes an uninitialised struct on its stack and uses every field",
        props::written,
    ),
    contract(
        "listen",
        "the listen handle fits 128 bytes; listenComm non-NULL",
        "NCCL ships the NCCL_NET_HANDLE_MAXSIZE-byte handle through its bootstrap",
        basic::listen,
    ),
    contract(
        "connect",
        "connect never blocks; re-called with the same handle",
        "NCCL calls connect before the peer accepts, again with the same handle pointer",
        basic::connect,
    ),
    contract(
        "accept-first",
        "accept before any connect returns at once; no setup call blocks",
        "NCCL's peer may call accept long before the other side connects",
        timing::accept_first,
    ),
    contract(
        "regmr",
        "regMr/deregMr pair on both comms, registrations usable",
        "NCCL registers every buffer on its comm before any transfer",
        data::regmr,
    ),
    contract(
        "sendrecv",
        "random data at many sizes (and into larger receives) arrives intact",
        "NCCL posts receives of the full slot, sends never larger, oldest request tested first",
        data::sendrecv,
    ),
    contract(
        "inflight",
        "the version's request limit in flight per comm (8 for v6, 32 from v7)",
        "NCCL keeps up to NCCL_NET_MAX_REQUESTS requests outstanding per comm",
        limits::inflight,
    ),
    contract(
        "request-reuse",
        "completed requests are recycled (no leak)",
        "NCCL posts and completes requests for the whole life of a comm",
        limits::request_reuse,
    ),
    contract(
        "grouped",
        "grouped receives of maxRecvs buffers, matched by tag",
        "NCCL groups up to maxRecvs receives into one irecv when maxRecvs > 1",
        data::grouped,
    ),
    contract(
        "optional-completion",
        "the optional-completion sentinel is overwritten",
        "NCCL v2.24+ passes NCCL_NET_OPTIONAL_RECV_COMPLETION in *request (v9+)",
        data::optional_completion,
    ),
    contract(
        "null-retry",
        "a NULL request sends nothing; retried posts arrive once",
        "NCCL retries a NULL request later while the other side keeps progressing",
        data::null_retry,
    ),
    contract(
        "close-inflight",
        "deregMr and close with requests in flight (ncclCommAbort)",
        "ncclCommAbort deregisters and closes comms with requests in flight, never tested again",
        life::close_inflight,
    ),
    contract(
        "reload",
        "dlclose and reload, then init and transfer again",
        "NCCL dlcloses the plugin with the last communicator and may load it again",
        life::reload,
    ),
    contract(
        "two-process",
        "two processes connect both ways over loopback",
        "NCCL connects every pair of ranks both ways, each rank in its own process",
        life::two_process,
    ),
    contract(
        "netns",
        "two processes in separate network namespaces over veth",
        "NCCL ranks on different hosts reach each other only over the network",
        life::netns,
    ),
    contract(
        "cuda-regmr",
        "regMr(NCCL_PTR_CUDA) of device buffers on both comms (NCCL_PTR_CUDA devices)",
        "NCCL registers its GPU buffers with type NCCL_PTR_CUDA when ptrSupport has it",
        cuda::regmr,
    ),
    contract(
        "cuda-sendrecv",
        "random data between device buffers, and host↔device, arrives exact",
        "with GPUDirect RDMA NCCL posts sends and receives straight on GPU memory",
        cuda::sendrecv,
    ),
    contract(
        "cuda-flush",
        "iflush of each device receive completes; data intact",
        "NCCL calls iflush after a GPU receive when forceFlush is set or PCI ordering needs it",
        cuda::flush,
    ),
    probe(
        "sizes",
        "a receive smaller than its send fails instead of truncating",
        "NCCL never posts a receive smaller than the send",
        data::sizes,
    ),
    probe(
        "out-of-order",
        "the newest request completes when tested before older ones",
        "NCCL tests only the oldest request of each comm",
        probes::out_of_order,
    ),
    probe(
        "null-mhandle",
        "transfers posted with a NULL mhandle work",
        "NCCL always passes the mhandle regMr returned",
        probes::null_mhandle,
    ),
    probe(
        "stray-connections",
        "raw TCP strays to its listening sockets, a second connect to a used handle, a \
         connect after closeListen: every call returns, the real connection works",
        "NCCL connects each handle once, to a listen comm that is still open",
        stray::stray_connections,
    ),
    probe(
        "test-after-close",
        "test() of in-flight requests after deregMr, then after their comm was closed",
        "NCCL's abort deregisters and closes comms with requests in flight and never tests \
         them again",
        after_close::test_after_close,
    ),
];

const fn contract(
    name: &'static str,
    about: &'static str,
    nccl: &'static str,
    run: fn(&super::child::Env) -> super::Checked,
) -> CheckDef {
    CheckDef {
        name,
        family: Family::Net,
        class: Class::Contract,
        about,
        nccl,
        run,
    }
}

const fn probe(
    name: &'static str,
    about: &'static str,
    nccl: &'static str,
    run: fn(&super::child::Env) -> super::Checked,
) -> CheckDef {
    CheckDef {
        name,
        family: Family::Net,
        class: Class::Probe,
        about,
        nccl,
        run,
    }
}
