//! The plugin as NCCL holds it, through `cclkit-host`: the statically linked
//! `ncclNetPlugin_v8` / `ncclNetPlugin_v12` tables driven by the host's adapters
//! (NCCL's argument shapes for each version, per-communicator `init` on v12), with
//! every plugin log line printed to stderr as `LOG <level> <text>` (tests read them).

use cclkit_abi::raw::common::{LogLevel, ptr};
use cclkit_host::CallError;
use cclkit_host::logger;
use cclkit_host::net::{
    CommConfig, ConnectHandle, Connecting, ListenComm, Mr, NetContext, NetPlugin, RecvComm,
    Request, SendComm,
};
use cclkit_net_ofi::{ncclNetPlugin_v8, ncclNetPlugin_v12};

/// Result of a plugin call: the message names the plugin, the call and the code,
/// and quotes the plugin's own warning.
pub type R<T> = Result<T, String>;

/// A failed call as the peer reports it.
pub fn err(e: CallError) -> String {
    e.to_string()
}

/// Which table the peer drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// `ncclNetPlugin_v8` (NCCL 2.20–2.23).
    V8,
    /// `ncclNetPlugin_v12` (NCCL 2.30).
    V12,
}

/// Device properties the scenarios look at.
#[derive(Debug)]
pub struct Props {
    /// Device name.
    pub name: String,
    /// `NCCL_PTR_*` mask.
    pub ptr_support: i32,
    /// Largest grouped receive.
    pub max_recvs: i32,
    /// Link speed (Mbps).
    pub speed: i32,
}

/// Prints one plugin log line for the parent (stderr, `LOG <level> <text>`).
fn print_log(level: LogLevel, _subsys: u64, text: &str) {
    eprintln!("LOG {} {text}", level.0);
}

/// An initialised plugin, as NCCL holds it.
pub struct Net {
    ctx: NetContext,
}

impl Net {
    /// `init` (v8: once while any `Net` of this process is alive; v12: per
    /// communicator, with a context).
    pub fn init(abi: Abi) -> R<Self> {
        logger::set_observer(print_log);
        let plugin = match abi {
            Abi::V8 => NetPlugin::from_static(&ncclNetPlugin_v8),
            Abi::V12 => NetPlugin::from_static(&ncclNetPlugin_v12),
        };
        let ctx = plugin.init(0x5eed, CommConfig::default()).map_err(err)?;
        Ok(Self { ctx })
    }

    /// `devices`.
    pub fn devices(&self) -> R<usize> {
        self.ctx.devices().map_err(err)
    }

    /// `getProperties`.
    pub fn props(&self, dev: usize) -> R<Props> {
        let p = self.ctx.properties(dev).map_err(err)?;
        Ok(Props {
            name: p.name,
            ptr_support: p.ptr_support,
            max_recvs: p.max_recvs,
            speed: p.speed_mbps,
        })
    }

    /// `listen`: the 128-byte handle for the peer and the listen comm.
    pub fn listen(&self, dev: usize) -> R<(ConnectHandle, ListenComm)> {
        self.ctx.listen(dev).map_err(err)
    }

    /// Starts connecting to the peer that sent `handle` (poll it until it yields).
    pub fn connect(&self, dev: usize, handle: &ConnectHandle) -> Connecting {
        self.ctx.connect(dev, handle)
    }

    /// `finalize` once every comm is closed (v8 has none: the last context ends it).
    pub fn finalize(self) -> R<()> {
        match self.ctx.finalize().map_err(err)? {
            true => Ok(()),
            false => Err("finalize: comms of this context are still open".into()),
        }
    }
}

/// One side of a connection, for code that handles sends and receives alike.
pub enum Side<'a> {
    /// The send comm.
    Send(&'a mut SendComm),
    /// The receive comm.
    Recv(&'a mut RecvComm),
}

impl Side<'_> {
    /// True for the send side.
    pub fn is_send(&self) -> bool {
        matches!(self, Side::Send(_))
    }

    /// `regMr` of host memory.
    ///
    /// # Safety
    /// `buf`'s memory must stay allocated (it may move as a `Vec` does: its heap
    /// buffer stays put) until the registration is deregistered.
    pub unsafe fn reg_mr(&mut self, buf: &mut [u8]) -> R<Mr> {
        let (p, n) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Side::Send(c) => c.reg_mr(p, n, ptr::HOST),
                Side::Recv(c) => c.reg_mr(p, n, ptr::HOST),
            }
        }
        .map_err(err)
    }

    /// `deregMr`.
    pub fn dereg_mr(&mut self, mr: Mr) -> R<()> {
        match self {
            Side::Send(c) => c.dereg_mr(mr),
            Side::Recv(c) => c.dereg_mr(mr),
        }
        .map_err(err)
    }

    /// `test`: `Some(sizes)` when done.
    pub fn test(&mut self, req: &mut Request) -> R<Option<Vec<usize>>> {
        let sizes = match self {
            Side::Send(c) => c.test(req),
            Side::Recv(c) => c.test(req),
        }
        .map_err(err)?;
        Ok(sizes.map(|s| s.as_slice().to_vec()))
    }
}
