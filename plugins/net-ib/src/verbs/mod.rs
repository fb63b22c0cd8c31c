//! libibverbs, three levels: [`sys`] (C types), [`loader`] (the library opened at run
//! time) and [`safe`] (RAII objects whose errors name the verbs call).

pub mod loader;
pub mod safe;
pub mod sys;
