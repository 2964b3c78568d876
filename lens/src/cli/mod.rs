//! The `lens` program. Files depend one way, top to bottom:
//!
//! - `mod.rs`: parses, picks the backend, runs the command;
//! - `demo.rs`, `bench.rs`: run, check and print, through the [`backend::Backend`] trait;
//!   `sample_bench.rs`: the step sampler's bench, in-process or TCP processes;
//! - `backends/`: one file per backend, forming its groups and its raw baselines;
//! - `launcher.rs`, `rank.rs`, `measure.rs`: what backends share (starting rank processes,
//!   one rank's demo work, the bench method);
//! - `soak.rs` (its plot in `plot.rs`): a TCP job left running on simulated hosts
//!   (`hosts.rs`), sampled for growth;
//! - `backend.rs`, `view.rs`, `record.rs`, `args.rs`: the trait, output, records, flags.

mod args;
mod backend;
mod backends;
mod bench;
mod demo;
#[cfg(test)]
mod docs_tests;
mod export;
#[cfg(feature = "tcp")]
mod hosts;
#[cfg(feature = "tcp")]
mod launcher;
mod measure;
#[cfg(feature = "tcp")]
mod plot;
mod rank;
mod record;
mod sample_bench;
#[cfg(feature = "tcp")]
mod soak;
#[cfg(feature = "tcp")]
mod soak_sample;
mod trace_svg;
mod view;

pub(crate) use args::Cli;
use args::Command;

/// Runs the parsed command.
pub(crate) fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Demo(args) => demo::run(backends::select(args.backend), &args),
        Command::Bench(args) => bench::run(backends::select(args.backend), &args),
        Command::SampleBench(args) => sample_bench::run(&args),
        #[cfg(feature = "tcp")]
        Command::Soak(args) => soak::run(&args),
    }
}
