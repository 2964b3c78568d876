//! OTLP export for **lens**: each rank's spans to Jaeger, Tempo or any OTLP receiver, with the
//! rank in the resource, in one call.
//!
//! [`OtlpBuilder`] builds a rank's tracer provider from its [`RankInfo`](lens_core::RankInfo):
//! the resource carries `nv.dl.rank`, `nv.dl.world_size`, `nv.dl.local_rank`, `nv.dl.job_id`,
//! `service.instance.id` and `service.name` (from `OTEL_SERVICE_NAME`); spans go through a
//! batch processor to an OTLP exporter (gRPC or HTTP/protobuf, plain or over TLS with
//! rustls, mutual TLS, gzip and headers, chosen by the standard `OTEL_EXPORTER_OTLP_*`
//! variables or in code, see [`env`](mod@env) and [`OtlpBuilder`]); the resource also
//! names the host, process, job, run and GPU ([`resource_keys`]); the
//! [`OtlpGuard`] it returns flushes and shuts down on drop and reports the spans that did not
//! arrive. [`ExportRanks`] picks which ranks export; the others still broadcast and link.
//!
//! The training loop's thread only hands each ended span to a bounded queue: a receiver that
//! is down or slow costs the job lost spans (counted and reported), never a stalled step.
//!
//! # Example
//!
//! ```
//! use lens_core::RankInfo;
//! use lens_otlp::{OtlpBuilder, Protocol};
//! use lens_testkit::otlp::Receiver;
//! use opentelemetry::trace::{Span as _, Tracer as _};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let receiver = Receiver::start()?; // an OTLP receiver on 127.0.0.1, for this example
//! // In a job: RankInfo::from_env()? and OtlpBuilder::from_env(info).
//! let info = RankInfo::new(1, 4)?.with_job_id("job-42");
//! let guard = OtlpBuilder::new(info)
//!     .protocol(Protocol::Grpc)
//!     .endpoint(receiver.grpc_endpoint())
//!     .service_name("trainer")
//!     .build()?;
//! guard.tracer("train").start("train_step").end();
//! let stats = guard.shutdown()?; // flushes; an error would say how many spans were lost
//! assert_eq!(stats.exported, 1);
//! let spans = receiver.spans();
//! assert_eq!(spans[0].resource_int("nv.dl.rank"), Some(1));
//! assert_eq!(spans[0].resource_str("service.name").as_deref(), Some("trainer"));
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod builder;
mod clock;
mod counted;
mod endpoint;
pub mod env;
mod exporter;
mod guard;
mod headers;
mod job;
mod nvml;
mod resource;
mod select;
mod tls;
mod vars;

pub use builder::{DEFAULT_EXPORT_TIMEOUT, OtlpBuilder};
pub use counted::ExportStats;
pub use endpoint::Protocol;
pub use guard::OtlpGuard;
pub use job::share_job_id;
pub use select::ExportRanks;

/// Resource attributes lens-otlp adds beside the rank's
/// ([`lens_core::rank::resource_keys`]), besides the semantic conventions' `host.name`,
/// `process.pid`, `service.instance.id` and `service.version`, and Slurm's `slurm.job.id`,
/// `slurm.step.id` and `slurm.restart_count` when set.
pub mod resource_keys {
    pub use crate::nvml::{GPU_DRIVER_VERSION, GPU_INDEX, GPU_MODEL, GPU_UUID};
    pub use crate::resource::{JOB_UUID, RUN_UUID};
}
