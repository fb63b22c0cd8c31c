//! The `cclkit` binary: logging from `NCCL_DEBUG`, then the subcommand.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    cclkit::log::init_from_env();
    cclkit::cli::run(&cclkit::cli::Cli::parse())
}
