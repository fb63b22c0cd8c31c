//! A plugin whose methods panic or fail must never take the host down: through the
//! exported tables a panic becomes `ncclInternalError`, an error keeps its code, and
//! the plugin keeps working afterwards. The plugin is exported into this test binary
//! with the same macros vendors use.

// Every unsafe call below is an NCCL-convention call into the plugin under test.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::{CStr, c_int, c_void};
use std::ptr::null_mut;

use cclkit_abi::net::{
    Buf, CommConfig, CommRef, InitArgs, MemRegion, Net, NetHandle, Properties, RecvBuf, Sizes,
};
use cclkit_abi::raw::common::{Algorithm, Func, NcclResult, Protocol};
use cclkit_abi::tuner::{CollInfo, CostTable, Tuner, TunerInit};
use cclkit_abi::{Error, Result, export_net, export_tuner};

/// `properties(dev)` panics for dev 0 and fails for dev 1; `listen` always panics.
struct Faulty;

impl Net for Faulty {
    const NAME: &'static CStr = c"faulty";
    type Context = ();
    type ListenComm = ();
    type SendComm = ();
    type RecvComm = ();
    type Mr = ();
    type Request = Box<u8>;

    fn init(_: &InitArgs) -> Result<Self> {
        Ok(Faulty)
    }
    fn devices(&self) -> usize {
        3
    }
    fn properties(&self, dev: usize) -> Result<Properties> {
        match dev {
            0 => panic!("deliberate panic in properties"),
            1 => Err(Error::remote("deliberate remote error")),
            _ => Ok(Properties::host("faulty")),
        }
    }
    fn open_context(&self, _: u64, _: CommConfig) -> Result<()> {
        Ok(())
    }
    fn listen(&self, _: &(), _: usize, _: &mut NetHandle) -> Result<()> {
        let v: Vec<u8> = Vec::new();
        let _ = v[3]; // index out of bounds: a panic from ordinary code
        Ok(())
    }
    fn connect(&self, _: &(), _: usize, _: &mut NetHandle) -> Result<Option<()>> {
        Ok(None)
    }
    fn accept(&self, _: &mut ()) -> Result<Option<()>> {
        Ok(None)
    }
    fn reg_mr(&self, _: CommRef<'_, Self>, _: MemRegion) -> Result<()> {
        Ok(())
    }
    fn isend(&self, _: &mut (), _: Buf, _: i32, _: Option<&()>) -> Result<Option<Box<u8>>> {
        Ok(None)
    }
    fn irecv(&self, _: &mut (), _: &[RecvBuf<'_, ()>], _: bool) -> Result<Option<Box<u8>>> {
        Ok(None)
    }
    fn test(_: &mut Box<u8>, _: &mut Sizes<'_>) -> Result<bool> {
        Ok(true)
    }
}

export_net!(Faulty);

/// A tuner that panics for AllReduce and fails for Broadcast.
struct FaultyTuner;

impl Tuner for FaultyTuner {
    const NAME: &'static CStr = c"faulty-tuner";
    fn init(_: TunerInit<'_>) -> Result<Self> {
        Ok(FaultyTuner)
    }
    fn get_coll_info(&self, info: &CollInfo, table: &mut CostTable<'_>, _: &mut i32) -> Result<()> {
        match info.func {
            Func::ALL_REDUCE => panic!("deliberate tuner panic"),
            Func::BROADCAST => Err(Error::invalid_usage("deliberate tuner error")),
            _ => {
                table.prefer(Algorithm::RING, Protocol::SIMPLE);
                Ok(())
            }
        }
    }
}

export_tuner!(FaultyTuner);

#[test]
fn net_panics_become_internal_error_and_plugin_survives() {
    let t = &ncclNetPlugin_v12;
    let mut ctx: *mut c_void = null_mut();
    // SAFETY: NCCL's v12 calling convention on this binary's own exported table.
    unsafe {
        assert_eq!(
            (t.init.unwrap())(&mut ctx, 1, null_mut(), None, None),
            NcclResult::SUCCESS
        );
        let mut props = std::mem::zeroed();
        assert_eq!(
            (t.getProperties.unwrap())(0, &mut props),
            NcclResult::INTERNAL_ERROR
        );
        assert_eq!(
            (t.getProperties.unwrap())(1, &mut props),
            NcclResult::REMOTE_ERROR
        );
        assert_eq!(
            (t.getProperties.unwrap())(2, &mut props),
            NcclResult::SUCCESS
        );
        let mut handle = [0u8; 128];
        let mut lc = null_mut();
        assert_eq!(
            (t.listen.unwrap())(ctx, 0, handle.as_mut_ptr().cast(), &mut lc),
            NcclResult::INTERNAL_ERROR
        );
        assert!(lc.is_null());
        // Still alive and answering after the panics, through an older table too.
        let mut n: c_int = 0;
        assert_eq!((t.devices.unwrap())(&mut n), NcclResult::SUCCESS);
        assert_eq!(n, 3);
        let mut p8 = std::mem::zeroed();
        assert_eq!(
            (ncclNetPlugin_v8.getProperties.unwrap())(0, &mut p8),
            NcclResult::INTERNAL_ERROR
        );
        // Garbage handles are rejected, not dereferenced as comms.
        let mut junk = [0u64; 4];
        assert_eq!(
            (t.closeSend.unwrap())(junk.as_mut_ptr().cast()),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(
            (t.closeRecv.unwrap())(null_mut()),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!((t.finalize.unwrap())(ctx), NcclResult::SUCCESS);
        assert_eq!(
            (t.finalize.unwrap())(ctx),
            NcclResult::INVALID_ARGUMENT,
            "double finalize is caught"
        );
    }
}

#[test]
fn tuner_panics_become_internal_error() {
    let t = &ncclTunerPlugin_v6;
    let mut ctx = null_mut();
    let mut table = [100.0f32; 21];
    let mut nch = 0;
    // SAFETY: NCCL's v6 calling convention on this binary's own exported table.
    unsafe {
        assert_eq!(
            (t.init.unwrap())(&mut ctx, 1, 2, 1, None, null_mut(), null_mut()),
            NcclResult::SUCCESS
        );
        let f = t.getCollInfo.unwrap();
        let tp = table.as_mut_ptr().cast();
        assert_eq!(
            f(ctx, Func::ALL_REDUCE, 8, 1, tp, 7, 3, 0, &mut nch),
            NcclResult::INTERNAL_ERROR
        );
        assert_eq!(
            f(ctx, Func::BROADCAST, 8, 1, tp, 7, 3, 0, &mut nch),
            NcclResult::INVALID_USAGE
        );
        assert_eq!(
            f(ctx, Func::REDUCE, 8, 1, tp, 7, 3, 0, &mut nch),
            NcclResult::SUCCESS
        );
        assert_eq!(
            table[Algorithm::RING.0 as usize * 3 + Protocol::SIMPLE.0 as usize],
            0.0
        );
        assert_eq!(
            f(ctx, Func::REDUCE, 8, 1, tp, 0, 3, 0, &mut nch),
            NcclResult::INVALID_ARGUMENT,
            "bad table shape"
        );
        assert_eq!((t.finalize.unwrap())(ctx), NcclResult::SUCCESS);
    }
}
