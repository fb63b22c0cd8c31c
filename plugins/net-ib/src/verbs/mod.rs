//! libibverbs in three levels: [`sys`] (hand-written C types with layout checks),
//! [`loader`] (`libibverbs.so.1` opened at run time), [`safe`] (RAII objects whose
//! errors name the verbs call and keep errno); then [`device`] (discovery), [`gid`]
//! (GID index choice), [`port`] (`active_speed_ex`), [`events`] (the async-event monitor) and [`nic`] (the
//! [`crate::nic::Nic`] implementation).

pub mod device;
pub mod events;
pub mod gid;
pub mod loader;
pub mod nic;
pub mod port;
pub mod safe;
pub mod sys;
