//! Test kit for **lens**: run a multi-rank job inside one process.
//!
//! - [`LocalCluster`] / [`LocalBroadcaster`]: the in-process backend (N ranks, N = 1024 works).
//! - [`Cluster`]: a simulated job where each rank has its own tracer provider with an
//!   in-memory exporter and the rank resource; [`Report`] checks the spans afterwards
//!   ("all ranks share one trace id", "rank r's span links to the source span").
//! - [`Faulty`]: fault injection (a slow rank, a corrupted payload); [`ClusterBuilder::absent`]
//!   for a rank that never joins.
//! - [`conformance`]: the suite every backend runs; [`on_each_rank`] runs a closure on every
//!   rank at once, one thread each.
//! - [`fake_gpu`]: a fake CUDA driver and NCCL, for the NCCL backend's tests without a GPU.
//! - [`hosts`]: simulated hosts on one machine (network namespaces and a switch that delays,
//!   drops, cuts and resets), for tests of ranks on separate hosts.
//! - [`docs`]: the code blocks of a Markdown page, for tests that run the documentation.
//! - [`thread_cpu`]: the calling thread's CPU clock.
//! - [`globals`]: code written against the global tracer or `tracing` macros, run per rank.
//! - `otlp` (feature `otlp`): a real OTLP receiver (gRPC and HTTP/protobuf) on 127.0.0.1.
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod cluster;
pub mod conformance;
mod cpu;
pub mod docs;
pub mod fake_gpu;
mod fault;
pub mod globals;
pub mod hosts;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod process;

pub use cluster::{CheckError, Cluster, ClusterBuilder, RankCtx, RankReport, Report};
pub use cpu::thread_cpu;
pub use fault::{Corruption, Fault, Faulty};
/// The in-process backend (`lens-local`), re-exported: the test kit builds on it.
pub use lens_local::{DEFAULT_ROUND_TIMEOUT, LocalBroadcaster, LocalCluster};

/// Sleeps until the wall clock's next whole multiple of `every` (at once for a zero
/// `every`): ranks in processes on one machine that each call it before a round start the
/// round together, as the ranks of a training step do, so that a rank comes late only by
/// what its own host, link or fault make it.
pub fn sleep_to_next_tick(every: std::time::Duration) {
    let Some(e) = u64::try_from(every.as_nanos()).ok().filter(|&e| e > 0) else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(0));
    std::thread::sleep(std::time::Duration::from_nanos(e - now % e));
}

/// Runs `f` on every rank at once, one thread each, and returns the results in rank order:
/// for backends whose `broadcast` blocks its thread (TCP, NCCL), where one thread cannot
/// drive every rank. A panic on a rank's thread is raised again here.
pub fn on_each_rank<B: Sync, T: Send>(ranks: &[B], f: impl Fn(&B) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks.iter().map(|b| s.spawn(|| f(b))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}
