//! Test kit for **lens**: run a multi-rank job inside one process.
//!
//! - [`LocalCluster`] / [`LocalBroadcaster`]: the in-process backend (N ranks, N = 1024 works).
//! - [`Cluster`]: a simulated job where each rank has its own tracer provider with an
//!   in-memory exporter and the rank resource; [`Report`] checks the spans afterwards
//!   ("all ranks share one trace id", "rank r's span links to the source span").
//! - [`Faulty`]: fault injection (a slow rank, a corrupted payload); [`ClusterBuilder::absent`]
//!   for a rank that never joins.
//! - [`conformance`]: the suite every backend runs.
//! - [`fake_gpu`]: a fake CUDA driver and NCCL, for the NCCL backend's tests without a GPU.
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod cluster;
pub mod conformance;
pub mod fake_gpu;
mod fault;
mod local;

pub use cluster::{CheckError, Cluster, ClusterBuilder, RankCtx, RankReport, Report};
pub use fault::{Corruption, Fault, Faulty};
pub use local::{DEFAULT_TIMEOUT, LocalBroadcaster, LocalCluster};
