//! Builds the fake CUDA driver and NCCL ([`lens_testkit::fake_gpu::FakeGpu`]) and prints the
//! folder that holds them, kept for the caller to remove: `scripts/test.sh` starts the NCCL
//! tests with it on the loader's path, so the fake is built one way, by the test kit.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

fn main() -> ExitCode {
    match lens_testkit::fake_gpu::FakeGpu::build(2) {
        Ok(fake) => {
            println!("{}", fake.keep().display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fake_gpu: {e}");
            ExitCode::FAILURE
        }
    }
}
