//! The thin safe layer over [`crate::sys`]: RAII objects and errors that name the
//! `fi_` call with `fi_strerror` text. No NCCL logic lives here.
//!
//! | level | module | what |
//! | --- | --- | --- |
//! | raw | [`crate::sys`] | bindgen output, `static inline` calls via C wrappers |
//! | result | [`error`] | `FiError { call, code, detail }`, [`error::check`] |
//! | safe | [`info`], [`objects`] | `fi_getinfo` lists and hints; fabric/domain/cq/av/ep/mr |

pub mod error;
pub mod info;
pub mod objects;

pub use error::{FiError, FiResult};
pub use info::{Hints, Info, InfoList, InfoRef, getinfo};
pub use objects::{ADDR_UNSPEC, Av, Cq, CqError, Domain, Endpoint, Fabric, MemIface, Mr};
