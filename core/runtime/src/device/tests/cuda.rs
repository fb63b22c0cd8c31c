//! Device-path tests on the emulated CUDA device (the kernels' own source run
//! on the CPU): memory plans and slots, and slices against the host's combine.

use cclkit_abi::raw::common::{DataType, RedOp, ptr};
use cclkit_kernels::Reduction;
use cclkit_kernels::cuda::{CudaDevice, DevPtr};

use super::super::compute::SliceIo;
use super::super::mem::register;
use super::FakeComm;
use crate::device::{ConnPlan, Device, GdrEnv, RegKind, SlotKind, SlotMem};
use crate::schedule::{Combine, combine};
use crate::topo::PciDistance;

fn emulated() -> Device {
    Device::Cuda(CudaDevice::emulated_with_threads(64))
}

#[test]
fn emulated_device_plans_and_slots() {
    let dev = emulated();
    assert!(dev.is_cuda() && dev.describe().contains("[emulated]"));
    // No PCI path: distance SYS, beyond the default level, so host staging.
    let all = ptr::HOST | ptr::CUDA | ptr::DMABUF;
    let (s, r, dec) = dev.plans(
        Some("/sys/devices/pci0000:00/x"),
        all,
        false,
        &GdrEnv::default(),
    );
    let dec = dec.expect("a CUDA device decides");
    assert_eq!(dec.distance, PciDistance::Sys);
    assert_eq!((s.slots, r.slots), (SlotKind::Staged, SlotKind::Staged));
    // With NCCL_NET_GDR_LEVEL=SYS: GPU slots; the emulator exports no dma-buf,
    // so regMr(NCCL_PTR_CUDA); compute capability 0 < 9, so receives flush.
    let sys = GdrEnv {
        level: Some(PciDistance::Sys),
        ..GdrEnv::default()
    };
    let (s, r, _) = dev.plans(None, all, false, &sys);
    assert_eq!(
        (s.slots, s.reg, s.flush),
        (SlotKind::Gpu, RegKind::Cuda, false)
    );
    assert_eq!(
        (r.slots, r.reg, r.flush),
        (SlotKind::Gpu, RegKind::Cuda, true)
    );
    // Every kind of slot memory, registered as planned.
    let mut c = FakeComm::default();
    for plan in [
        ConnPlan::HOST,
        s,
        ConnPlan::cuda(false, false, false),
        ConnPlan::cuda(true, true, false),
    ] {
        let mut mem = SlotMem::alloc(&dev, &plan, 4096).expect("slots");
        assert_eq!(mem.base() as usize % 8, 0);
        // SAFETY: `mem` outlives the fake registration (which keeps nothing).
        unsafe { register(&mut c, &mut mem, &plan, &dev) }.expect("register");
    }
    let types: Vec<i32> = c.calls.iter().map(|c| c.0).collect();
    // host, GPU (regMr CUDA), staged (host), GPU with a failed dma-buf export
    // (falls back to regMr CUDA).
    assert_eq!(types, vec![ptr::HOST, ptr::CUDA, ptr::HOST, ptr::CUDA]);
}

#[test]
fn user_buffers_are_slices_on_every_device() {
    for dev in [Device::Host, emulated()] {
        let mut b = dev.alloc_user(1000).expect("alloc");
        assert_eq!(b.len(), 1000);
        assert!(b.iter().all(|&x| x == 0));
        b[999] = 7;
        assert_eq!(b[999], 7);
        assert!(dev.check_buffer(b.as_ptr(), b.len(), "buffer").is_ok());
        assert!(dev.alloc_user(0).is_ok_and(|b| b.is_empty()));
    }
}

/// Host data in, device result out: one `DevCompute::slice` against the host
/// `combine` for every combine kind, with and without a destination, in place.
#[test]
fn emulated_slices_match_host_combine() {
    let cuda = CudaDevice::emulated_with_threads(48);
    let dev = Device::Cuda(cuda.clone());
    let Some(mut dc) = dev.compute().expect("stream") else {
        panic!("a CUDA device has a compute queue")
    };
    let s = cuda.stream().expect("stream");
    let len_elems = 1001usize;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (dtype, op, n) in [
        (DataType::FLOAT32, RedOp::SUM, 3),
        (DataType::FLOAT16, RedOp::AVG, 4),
        (DataType::INT32, RedOp::AVG, 3),
        (DataType::BFLOAT16, RedOp::MAX, 2),
        (DataType::FLOAT8E4M3, RedOp::PROD, 2),
    ] {
        let red = Reduction::new(dtype, op, n).expect("op");
        let len = len_elems * red.elem_size();
        let host: Vec<Vec<u8>> = (0..4)
            .map(|_| {
                (0..len)
                    .map(|i| {
                        if dtype == DataType::FLOAT32 && i % 4 == 3 {
                            0x3f
                        } else {
                            rnd() as u8 & 0x3b
                        }
                    })
                    .collect()
            })
            .collect();
        let mut bufs: Vec<_> = (0..7).map(|_| cuda.alloc(len).expect("alloc")).collect();
        for (i, h) in host.iter().enumerate() {
            s.upload(&mut bufs[i], 0, h).expect("upload");
        }
        let ptrs: Vec<DevPtr> = bufs.iter().map(|b| b.ptr()).collect();
        let p = |i: usize| ptrs[i];
        let (src, r1, r2) = (p(0), p(1), p(2));
        for c in [
            Combine::Copy { pre: false },
            Combine::Copy { pre: true },
            Combine::Reduce { finish: false },
            Combine::Reduce { finish: true },
        ] {
            for recvs in [vec![], vec![r1], vec![r1, r2]] {
                if matches!(c, Combine::Copy { .. }) && recvs.len() > 1 {
                    continue;
                }
                let host_ins: Vec<&[u8]> = (1..=recvs.len()).map(|i| host[i].as_slice()).collect();
                let mut want = vec![0u8; len];
                combine(c, &red, Some(&host[0]), &host_ins, &mut want).expect("host combine");
                // To a user destination and two send slots.
                let (dst, o1, o2) = (p(4), p(5), p(6));
                let io = SliceIo {
                    src: Some(src),
                    recvs: &recvs,
                    dst: Some(dst),
                    sends: &[o1, o2],
                    len,
                };
                // SAFETY: every buffer holds `len` bytes; sends are distinct.
                unsafe { dc.slice(c, &red, io) }.expect("slice");
                for (i, what) in [(4, "dst"), (5, "send 0"), (6, "send 1")] {
                    let mut got = vec![0u8; len];
                    s.download(&bufs[i], 0, &mut got).expect("download");
                    assert_eq!(
                        got,
                        want,
                        "{dtype:?} {op:?} {c:?} {} recvs: {what}",
                        recvs.len()
                    );
                }
                // Only a send slot (a middle ring step).
                let io = SliceIo {
                    src: Some(src),
                    recvs: &recvs,
                    dst: None,
                    sends: &[o1],
                    len,
                };
                // SAFETY: as above.
                unsafe { dc.slice(c, &red, io) }.expect("slice");
                let mut got = vec![0u8; len];
                s.download(&bufs[5], 0, &mut got).expect("download");
                assert_eq!(got, want, "{dtype:?} {c:?} send only");
            }
        }
        // In place: the destination is the input (an in-place all-reduce).
        s.upload(&mut bufs[3], 0, &host[0]).expect("upload");
        let mut want = vec![0u8; len];
        combine(
            Combine::Reduce { finish: true },
            &red,
            Some(&host[0]),
            &[&host[1]],
            &mut want,
        )
        .expect("host");
        let io = SliceIo {
            src: Some(p(3)),
            recvs: &[r1],
            dst: Some(p(3)),
            sends: &[],
            len,
        };
        // SAFETY: as above; dst equals src exactly.
        unsafe { dc.slice(Combine::Reduce { finish: true }, &red, io) }.expect("in place");
        let mut got = vec![0u8; len];
        s.download(&bufs[3], 0, &mut got).expect("download");
        assert_eq!(got, want, "{dtype:?} in place");
        // A destination overlapping the input at an offset goes through scratch.
        let half = (len_elems / 2) * red.elem_size();
        s.upload(&mut bufs[3], 0, &host[0]).expect("upload");
        let shifted = DevPtr(p(3).0 + half as u64);
        let n = len - half;
        let mut want = vec![0u8; n];
        combine(
            Combine::Copy { pre: true },
            &red,
            Some(&host[0][..n]),
            &[],
            &mut want,
        )
        .expect("host");
        let io = SliceIo {
            src: Some(p(3)),
            recvs: &[],
            dst: Some(shifted),
            sends: &[],
            len: n,
        };
        // SAFETY: both ranges lie inside bufs[3]; overlap is handled by scratch.
        unsafe { dc.slice(Combine::Copy { pre: true }, &red, io) }.expect("overlap");
        let mut got = vec![0u8; n];
        s.download(&bufs[3], half, &mut got).expect("download");
        assert_eq!(got, want, "{dtype:?} overlapping destination");
    }
}
