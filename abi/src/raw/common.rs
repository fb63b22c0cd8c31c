//! Types shared by the net and tuner ABIs (NCCL_ABI.md §1, §4.1).

use core::ffi::{c_char, c_int, c_ulong, c_void};

/// Defines an `i32` newtype for a C enum with named constants.
///
/// Foreign code may hand back any value, so the type accepts every `i32`; `name()`
/// returns `None` for values NCCL does not define.
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $name:ident { $($(#[$cmeta:meta])* $konst:ident = $value:expr => $display:literal as $cname:ident,)* }
    ) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub i32);

        impl $name {
            $($(#[$cmeta])* pub const $konst: $name = $name($value);)*

            /// Every named value with its C identifier (used to generate the C header).
            pub const C_NAMES: &'static [(&'static str, i32)] = &[$((stringify!($cname), $value),)*];

            /// NCCL's name for this value, or `None` for a value NCCL does not define.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(v if v == $value => Some($display),)*
                    _ => None,
                }
            }
        }

        impl ::core::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                ::core::fmt::Debug::fmt(self, f)
            }
        }

        impl From<i32> for $name {
            fn from(v: i32) -> Self {
                $name(v)
            }
        }
    };
}
pub(crate) use c_enum;

c_enum! {
    /// `ncclResult_t`: the status every plugin entry point returns (NCCL_ABI.md §1.1).
    NcclResult {
        /// `ncclSuccess`
        SUCCESS = 0 => "ncclSuccess" as ncclSuccess,
        /// `ncclUnhandledCudaError`
        UNHANDLED_CUDA_ERROR = 1 => "ncclUnhandledCudaError" as ncclUnhandledCudaError,
        /// `ncclSystemError`
        SYSTEM_ERROR = 2 => "ncclSystemError" as ncclSystemError,
        /// `ncclInternalError`
        INTERNAL_ERROR = 3 => "ncclInternalError" as ncclInternalError,
        /// `ncclInvalidArgument`
        INVALID_ARGUMENT = 4 => "ncclInvalidArgument" as ncclInvalidArgument,
        /// `ncclInvalidUsage`
        INVALID_USAGE = 5 => "ncclInvalidUsage" as ncclInvalidUsage,
        /// `ncclRemoteError`
        REMOTE_ERROR = 6 => "ncclRemoteError" as ncclRemoteError,
        /// `ncclInProgress`
        IN_PROGRESS = 7 => "ncclInProgress" as ncclInProgress,
        /// `ncclTimeout` (NCCL core only)
        TIMEOUT = 8 => "ncclTimeout" as ncclTimeout,
    }
}

impl NcclResult {
    /// True for `ncclSuccess`.
    pub const fn is_ok(self) -> bool {
        self.0 == 0
    }
}

/// C name `ncclResult_t`.
pub type ncclResult_t = NcclResult;

c_enum! {
    /// `ncclDebugLogLevel`.
    LogLevel {
        /// `NCCL_LOG_NONE`
        NONE = 0 => "NONE" as NCCL_LOG_NONE,
        /// `NCCL_LOG_VERSION`
        VERSION = 1 => "VERSION" as NCCL_LOG_VERSION,
        /// `NCCL_LOG_WARN`
        WARN = 2 => "WARN" as NCCL_LOG_WARN,
        /// `NCCL_LOG_INFO`
        INFO = 3 => "INFO" as NCCL_LOG_INFO,
        /// `NCCL_LOG_ABORT`
        ABORT = 4 => "ABORT" as NCCL_LOG_ABORT,
        /// `NCCL_LOG_TRACE`
        TRACE = 5 => "TRACE" as NCCL_LOG_TRACE,
    }
}

/// `ncclDebugLogSubSys` bit flags (NCCL_ABI.md §1.2). `flags` is `unsigned long` in C.
pub mod subsys {
    use core::ffi::c_ulong;
    /// `NCCL_INIT`
    pub const INIT: c_ulong = 0x1;
    /// `NCCL_COLL`
    pub const COLL: c_ulong = 0x2;
    /// `NCCL_P2P`
    pub const P2P: c_ulong = 0x4;
    /// `NCCL_SHM`
    pub const SHM: c_ulong = 0x8;
    /// `NCCL_NET`
    pub const NET: c_ulong = 0x10;
    /// `NCCL_GRAPH`
    pub const GRAPH: c_ulong = 0x20;
    /// `NCCL_TUNING`
    pub const TUNING: c_ulong = 0x40;
    /// `NCCL_ENV`
    pub const ENV: c_ulong = 0x80;
    /// `NCCL_ALLOC`
    pub const ALLOC: c_ulong = 0x100;
    /// `NCCL_CALL`
    pub const CALL: c_ulong = 0x200;
    /// `NCCL_PROXY`
    pub const PROXY: c_ulong = 0x400;
    /// `NCCL_NVLS`
    pub const NVLS: c_ulong = 0x800;
    /// `NCCL_BOOTSTRAP`
    pub const BOOTSTRAP: c_ulong = 0x1000;
    /// `NCCL_REG`
    pub const REG: c_ulong = 0x2000;
    /// `NCCL_PROFILE`
    pub const PROFILE: c_ulong = 0x4000;
    /// `NCCL_RAS`
    pub const RAS: c_ulong = 0x8000;
    /// `NCCL_DESTROY` (2.30)
    pub const DESTROY: c_ulong = 0x10000;
    /// `NCCL_ALLOC_HOST`
    pub const ALLOC_HOST: c_ulong = 0x20000;
    /// `NCCL_ALL`
    pub const ALL: c_ulong = !0;

    /// Names accepted by `NCCL_DEBUG_SUBSYS`, with their bits.
    pub const NAMES: &[(&str, c_ulong)] = &[
        ("INIT", INIT),
        ("COLL", COLL),
        ("P2P", P2P),
        ("SHM", SHM),
        ("NET", NET),
        ("GRAPH", GRAPH),
        ("TUNING", TUNING),
        ("ENV", ENV),
        ("ALLOC", ALLOC),
        ("CALL", CALL),
        ("PROXY", PROXY),
        ("NVLS", NVLS),
        ("BOOTSTRAP", BOOTSTRAP),
        ("REG", REG),
        ("PROFILE", PROFILE),
        ("RAS", RAS),
        ("DESTROY", DESTROY),
        ("ALLOC_HOST", ALLOC_HOST),
        ("ALL", ALL),
    ];
}

/// `ncclDebugLogger_t`: NCCL's printf-style, C-variadic logger.
///
/// Stable Rust can call it (plugins pass a preformatted message with `"%s"`), but
/// cannot define one; the host side uses a small C shim.
pub type ncclDebugLogger_t = Option<
    unsafe extern "C" fn(
        level: LogLevel,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclProfilerCallback_t` handed to net plugins from v10 (NCCL_ABI.md §1.3).
pub type ncclProfilerCallback_t = Option<
    unsafe extern "C" fn(
        eHandle: *mut *mut c_void,
        type_: c_int,
        pHandle: *mut c_void,
        pluginId: i64,
        extData: *mut c_void,
    ) -> NcclResult,
>;

c_enum! {
    /// `ncclDataType_t` (NCCL_ABI.md §1.4).
    DataType {
        /// `ncclInt8` / `ncclChar`
        INT8 = 0 => "ncclInt8" as ncclInt8,
        /// `ncclUint8`
        UINT8 = 1 => "ncclUint8" as ncclUint8,
        /// `ncclInt32` / `ncclInt`
        INT32 = 2 => "ncclInt32" as ncclInt32,
        /// `ncclUint32`
        UINT32 = 3 => "ncclUint32" as ncclUint32,
        /// `ncclInt64`
        INT64 = 4 => "ncclInt64" as ncclInt64,
        /// `ncclUint64`
        UINT64 = 5 => "ncclUint64" as ncclUint64,
        /// `ncclFloat16` / `ncclHalf`
        FLOAT16 = 6 => "ncclFloat16" as ncclFloat16,
        /// `ncclFloat32` / `ncclFloat`
        FLOAT32 = 7 => "ncclFloat32" as ncclFloat32,
        /// `ncclFloat64` / `ncclDouble`
        FLOAT64 = 8 => "ncclFloat64" as ncclFloat64,
        /// `ncclBfloat16`
        BFLOAT16 = 9 => "ncclBfloat16" as ncclBfloat16,
        /// `ncclFloat8e4m3`
        FLOAT8E4M3 = 10 => "ncclFloat8e4m3" as ncclFloat8e4m3,
        /// `ncclFloat8e5m2`
        FLOAT8E5M2 = 11 => "ncclFloat8e5m2" as ncclFloat8e5m2,
    }
}

impl DataType {
    /// `ncclNumTypes` in NCCL 2.30.
    pub const COUNT: i32 = 12;

    /// Size of one element in bytes, or `None` for an unknown type.
    pub const fn size(self) -> Option<usize> {
        match self.0 {
            0 | 1 | 10 | 11 => Some(1),
            6 | 9 => Some(2),
            2 | 3 | 7 => Some(4),
            4 | 5 | 8 => Some(8),
            _ => None,
        }
    }
}

c_enum! {
    /// `ncclRedOp_t` (NCCL_ABI.md §1.4).
    RedOp {
        /// `ncclSum`
        SUM = 0 => "ncclSum" as ncclSum,
        /// `ncclProd`
        PROD = 1 => "ncclProd" as ncclProd,
        /// `ncclMax`
        MAX = 2 => "ncclMax" as ncclMax,
        /// `ncclMin`
        MIN = 3 => "ncclMin" as ncclMin,
        /// `ncclAvg`
        AVG = 4 => "ncclAvg" as ncclAvg,
    }
}

impl RedOp {
    /// `ncclNumOps`: the first value of user-created ops.
    pub const COUNT: i32 = 5;
}

c_enum! {
    /// `ncclFunc_t` (NCCL_ABI.md §4.1). Tuners are only called with 0…4.
    Func {
        /// `ncclFuncBroadcast`
        BROADCAST = 0 => "Broadcast" as ncclFuncBroadcast,
        /// `ncclFuncReduce`
        REDUCE = 1 => "Reduce" as ncclFuncReduce,
        /// `ncclFuncAllGather`
        ALL_GATHER = 2 => "AllGather" as ncclFuncAllGather,
        /// `ncclFuncReduceScatter`
        REDUCE_SCATTER = 3 => "ReduceScatter" as ncclFuncReduceScatter,
        /// `ncclFuncAllReduce`
        ALL_REDUCE = 4 => "AllReduce" as ncclFuncAllReduce,
        /// `ncclFuncSendRecv`
        SEND_RECV = 5 => "SendRecv" as ncclFuncSendRecv,
        /// `ncclFuncSend`
        SEND = 6 => "Send" as ncclFuncSend,
        /// `ncclFuncRecv`
        RECV = 7 => "Recv" as ncclFuncRecv,
        /// `ncclFuncAlltoAll` (core only)
        ALL_TO_ALL = 8 => "AlltoAll" as ncclFuncAlltoAll,
        /// `ncclFuncScatter` (core only)
        SCATTER = 9 => "Scatter" as ncclFuncScatter,
        /// `ncclFuncGather` (core only)
        GATHER = 10 => "Gather" as ncclFuncGather,
    }
}

impl Func {
    /// `NCCL_NUM_FUNCTIONS`: the collectives a tuner is asked about.
    pub const NUM_TUNED: i32 = 5;
}

/// C name `ncclFunc_t`.
pub type ncclFunc_t = Func;

c_enum! {
    /// Algorithm ids (`NCCL_ALGO_*`, NCCL_ABI.md §4.1).
    Algorithm {
        /// `NCCL_ALGO_UNDEF`
        UNDEF = -1 => "UNDEF" as NCCL_ALGO_UNDEF,
        /// `NCCL_ALGO_TREE`
        TREE = 0 => "TREE" as NCCL_ALGO_TREE,
        /// `NCCL_ALGO_RING`
        RING = 1 => "RING" as NCCL_ALGO_RING,
        /// `NCCL_ALGO_COLLNET_DIRECT`
        COLLNET_DIRECT = 2 => "COLLNET_DIRECT" as NCCL_ALGO_COLLNET_DIRECT,
        /// `NCCL_ALGO_COLLNET_CHAIN`
        COLLNET_CHAIN = 3 => "COLLNET_CHAIN" as NCCL_ALGO_COLLNET_CHAIN,
        /// `NCCL_ALGO_NVLS`
        NVLS = 4 => "NVLS" as NCCL_ALGO_NVLS,
        /// `NCCL_ALGO_NVLS_TREE`
        NVLS_TREE = 5 => "NVLS_TREE" as NCCL_ALGO_NVLS_TREE,
        /// `NCCL_ALGO_PAT`
        PAT = 6 => "PAT" as NCCL_ALGO_PAT,
    }
}

impl Algorithm {
    /// `NCCL_NUM_ALGORITHMS` since NCCL 2.23.
    pub const COUNT: usize = 7;
}

c_enum! {
    /// Protocol ids (`NCCL_PROTO_*`, NCCL_ABI.md §4.1).
    Protocol {
        /// `NCCL_PROTO_UNDEF`
        UNDEF = -1 => "UNDEF" as NCCL_PROTO_UNDEF,
        /// `NCCL_PROTO_LL`
        LL = 0 => "LL" as NCCL_PROTO_LL,
        /// `NCCL_PROTO_LL128`
        LL128 = 1 => "LL128" as NCCL_PROTO_LL128,
        /// `NCCL_PROTO_SIMPLE`
        SIMPLE = 2 => "SIMPLE" as NCCL_PROTO_SIMPLE,
    }
}

impl Protocol {
    /// `NCCL_NUM_PROTOCOLS`.
    pub const COUNT: usize = 3;
}

/// `NCCL_NUM_ALGORITHMS`.
pub const NCCL_NUM_ALGORITHMS: usize = 7;
/// `NCCL_NUM_PROTOCOLS`.
pub const NCCL_NUM_PROTOCOLS: usize = 3;
/// `NCCL_ALGO_PROTO_IGNORE`: a cost-table entry that must not be chosen.
pub const NCCL_ALGO_PROTO_IGNORE: f32 = -1.0;
/// `NCCL_NUM_HW_LINKS` (NVLINK, PCI, NET).
pub const NCCL_NUM_HW_LINKS: usize = 3;
/// `NCCL_NUM_COMPCAPS` (Volta, Ampere, Hopper, Blackwell).
pub const NCCL_NUM_COMPCAPS: usize = 4;
/// `NCCL_NUM_TUNING_SCALES` (1 node, 2 nodes, 4 nodes).
pub const NCCL_NUM_TUNING_SCALES: usize = 3;

/// Pointer-type flags (`NCCL_PTR_*`) used in `ptrSupport` and `regMr`'s `type`.
pub mod ptr {
    /// `NCCL_PTR_HOST`
    pub const HOST: i32 = 0x1;
    /// `NCCL_PTR_CUDA`
    pub const CUDA: i32 = 0x2;
    /// `NCCL_PTR_DMABUF` (net v6+)
    pub const DMABUF: i32 = 0x4;
}
