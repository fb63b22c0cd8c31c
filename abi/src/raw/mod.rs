//! The raw C ABI: `#[repr(C)]` structs and function tables, one module per version.
//!
//! Field names, order and C types follow NCCL's headers exactly (so NCCL readers
//! recognise them); every size and offset listed in `NCCL_ABI.md` is asserted at
//! compile time next to the struct, so a wrong layout fails the build.
//!
//! Values that come from foreign code (result codes, enums) are `i32` newtypes
//! ([`common::NcclResult`], [`common::DataType`], …), never Rust enums: a value
//! outside a Rust enum's range would be undefined behaviour.
#![allow(non_camel_case_types, non_snake_case)]
// The tables mirror C function-pointer fields one for one.
#![allow(clippy::type_complexity)]

pub mod collnet;
pub mod common;
pub mod env;
pub mod net;
pub mod profiler;
pub mod tuner;

/// Asserts size, alignment and field offsets of a `#[repr(C)]` type at compile time.
macro_rules! assert_layout {
    ($t:ty, size = $size:expr, align = $align:expr $(, $field:ident = $off:expr)* $(,)?) => {
        const _: () = {
            assert!(::core::mem::size_of::<$t>() == $size, concat!("size of ", stringify!($t)));
            assert!(::core::mem::align_of::<$t>() == $align, concat!("align of ", stringify!($t)));
            $(assert!(
                ::core::mem::offset_of!($t, $field) == $off,
                concat!("offset of ", stringify!($t), ".", stringify!($field))
            );)*
        };
    };
}
pub(crate) use assert_layout;

/// Declares that a raw function table may be shared between threads.
macro_rules! table_is_sync {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: a table holds only function pointers and `name`, which points to a
        // `'static` NUL-terminated string; exported tables are immutable statics that
        // are never written after construction, so sharing them is sound.
        unsafe impl Sync for $t {}
        // SAFETY: as above; nothing in a table is tied to a thread.
        unsafe impl Send for $t {}
    )*};
}
pub(crate) use table_is_sync;
