//! The `lens` program: a pipeline-parallel demo and the broadcast benchmark.
#![allow(clippy::print_stdout, clippy::print_stderr)]
// Library paths return errors; unwrap/expect only in tests.
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One write: ranks of a job may share this stderr, and a line written in pieces
            // interleaves with theirs.
            use std::io::Write as _;
            let _ = std::io::stderr().write_all(format!("lens: {e}\n").as_bytes());
            ExitCode::FAILURE
        }
    }
}
