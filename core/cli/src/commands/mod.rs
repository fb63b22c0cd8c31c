//! The `cclkit` command line.
//!
//! Adding a subcommand: write `commands/<name>.rs` with an `Args` struct (clap derive) and
//! a `run(&Args) -> ExitCode`, then add one variant to [`Command`] and one match arm
//! in [`run`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod check;
pub mod doctor;
pub mod info;
pub mod new;
pub mod package;
pub mod perf;
pub mod plugin_args;
pub mod report;
pub mod tune;

/// cclkit: NCCL/RCCL plugin toolkit.
#[derive(Debug, Parser)]
#[command(name = "cclkit", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the conformance suite on a net or tuner plugin, each check in a child process.
    Check(check::CheckArgs),
    /// Walk the plugin resolution NCCL/RCCL would do here and explain every step.
    Doctor(doctor::DoctorArgs),
    /// Show symbols, versions, names and device properties of one plugin library.
    Info(info::InfoArgs),
    /// Start a net or tuner plugin crate of your own, outside this repository.
    New(new::NewArgs),
    /// Check a built plugin's symbols and install it under the names NCCL and RCCL search.
    Package(package::PackageArgs),
    /// Measure collectives like nccl-tests (`--np N` local ranks, or under a launcher).
    Perf(perf::PerfArgs),
    /// See, measure and compare tuner decisions: `tune show|auto|diff`.
    Tune(tune::TuneArgs),
}

/// Runs a parsed command line.
pub fn run(cli: &Cli) -> ExitCode {
    match &cli.command {
        Command::Check(a) => check::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Info(a) => info::run(a),
        Command::New(a) => new::run(a),
        Command::Package(a) => package::run(a),
        Command::Perf(a) => perf::run(a),
        Command::Tune(a) => tune::run(a),
    }
}
