//! Bad arguments are errors that name the problem, never panics, and leave
//! the destination untouched.

use cclkit_abi::raw::common::NcclResult;
use cclkit_kernels::{DataType, KernelError, RedOp, Reduction, copy, reduce, reduce_in_place};

#[test]
fn unknown_types_ops_and_zero_ranks() {
    for dtype in [DataType(12), DataType(-1), DataType(i32::MAX)] {
        assert_eq!(
            Reduction::new(dtype, RedOp::SUM, 2),
            Err(KernelError::UnknownDataType(dtype))
        );
        let mut d = [7u8; 4];
        assert_eq!(
            reduce(dtype, RedOp::SUM, &mut d, &[0; 4], &[0; 4]),
            Err(KernelError::UnknownDataType(dtype))
        );
        assert_eq!(d, [7; 4]);
    }
    for op in [RedOp(5), RedOp(-1), RedOp(0x7fff_ffff)] {
        assert_eq!(
            Reduction::new(DataType::FLOAT32, op, 2),
            Err(KernelError::UnknownRedOp(op))
        );
        let mut d = [7u8; 4];
        assert_eq!(
            reduce_in_place(DataType::INT8, op, &mut d, &[0; 4]),
            Err(KernelError::UnknownRedOp(op))
        );
        assert_eq!(d, [7; 4]);
    }
    assert_eq!(
        Reduction::new(DataType::FLOAT32, RedOp::AVG, 0),
        Err(KernelError::ZeroRanks)
    );
}

#[test]
fn length_problems_write_nothing() {
    let red = Reduction::new(DataType::FLOAT32, RedOp::SUM, 2).unwrap();
    let mut d = [9u8; 8];
    let err = red.reduce(&mut d, &[0; 8], &[0; 4]).unwrap_err();
    assert_eq!(
        err,
        KernelError::LengthMismatch {
            input: "b",
            peer: None,
            expected: 8,
            actual: 4
        }
    );
    assert_eq!(d, [9; 8]);
    assert_eq!(
        red.reduce(&mut d[..7], &[0; 7], &[0; 7]),
        Err(KernelError::PartialElement {
            dtype: DataType::FLOAT32,
            len: 7
        })
    );
    assert!(matches!(
        red.reduce_local(&mut d, &[0; 8], &[0; 12], true),
        Err(KernelError::LengthMismatch { input: "local", .. })
    ));
    assert!(matches!(
        red.pre_op(&mut d, &[0; 4]),
        Err(KernelError::LengthMismatch { input: "src", .. })
    ));
    assert!(matches!(
        red.post_op_in_place(&mut d[..6]),
        Err(KernelError::PartialElement { .. })
    ));
    assert_eq!(
        red.reduce_many(&mut d, None, &[], true),
        Err(KernelError::NoInputs)
    );
    let err = red
        .reduce_many(&mut d, Some(&[0; 8]), &[&[0; 8], &[0; 16]], false)
        .unwrap_err();
    assert_eq!(
        err,
        KernelError::LengthMismatch {
            input: "peers",
            peer: Some(1),
            expected: 8,
            actual: 16
        }
    );
    assert_eq!(
        err.to_string(),
        "length mismatch: peers[1] has 16 bytes, dst has 8"
    );
    assert_eq!(d, [9; 8]);
    assert!(matches!(
        copy(&mut d, &[1; 3]),
        Err(KernelError::LengthMismatch { .. })
    ));
    assert_eq!(d, [9; 8]);
    copy(&mut d, &[1; 8]).unwrap();
    assert_eq!(d, [1; 8]);
}

#[test]
fn errors_convert_to_nccl_codes_with_their_message() {
    let e: cclkit_abi::Error = KernelError::UnknownDataType(DataType(42)).into();
    assert_eq!(e.code(), NcclResult::INVALID_ARGUMENT);
    assert!(e.message().contains("42"), "{}", e.message());
    let e: cclkit_abi::Error = KernelError::UnknownRedOp(RedOp(9)).into();
    assert_eq!(e.code(), NcclResult::INVALID_ARGUMENT);
    assert!(e.message().contains("user-created"), "{}", e.message());
    let e: cclkit_abi::Error = KernelError::PartialElement {
        dtype: DataType::FLOAT64,
        len: 12,
    }
    .into();
    assert_eq!(e.code(), NcclResult::INVALID_USAGE);
    assert_eq!(
        e.message(),
        "12 bytes is not a whole number of ncclFloat64 elements (8 bytes each)"
    );
}

#[test]
fn empty_buffers_are_fine() {
    for dtype in (0..DataType::COUNT).map(DataType) {
        for op in (0..RedOp::COUNT).map(RedOp) {
            let red = Reduction::new(dtype, op, 3).unwrap();
            red.reduce(&mut [], &[], &[]).unwrap();
            red.reduce_many(&mut [], Some(&[]), &[&[], &[], &[]], true)
                .unwrap();
            red.post_op_in_place(&mut []).unwrap();
        }
    }
}
