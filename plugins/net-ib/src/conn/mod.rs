//! Connection setup over a TCP side channel whose address and magic travel in
//! NCCL's listen handle: [`wire`] (bytes), [`sock`] (non-blocking socket plumbing),
//! [`setup`] (the resumable connect/accept state machines).

pub mod setup;
pub mod sock;
pub mod wire;
