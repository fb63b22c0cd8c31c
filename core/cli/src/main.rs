//! The `cclkit` binary: logging from `NCCL_DEBUG`, then the subcommand.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    cclkit_host::log::init_from_env();
    cclkit_cli::commands::run(&cclkit_cli::commands::Cli::parse())
}
