//! Core of **lens**: make a distributed job (training, inference, HPC) show up as one
//! OpenTelemetry trace.
//!
//! - [`Broadcaster`]: the transport trait every backend implements (MPI, NCCL, TCP, the
//!   in-process backend `lens-local`), usable as `dyn Broadcaster`.
//! - [`Carrier`]: the W3C trace-context carrier and its Python-compatible codec.
//! - [`broadcast_trace_context`]: one rank's current trace context to every rank, in one
//!   collective.
//! - [`create_linked_span`] / [`LinkedSpan::builder`]: spans linked to a span on another rank.
//! - [`RankInfo`]: rank and world size from torchrun, Slurm, Open MPI, MPICH or PMIx.
//! - [`Hierarchical`]: a broadcaster made of a leaders group and a per-node group.
//! - [`blocking`]: synchronous twins for code with no async runtime.
//! - [`clock`]: every rank's wall-clock offset from a reference rank, with an error bound.
//! - [`arrivals`]: which rank came last to a round, written on the source's step span.
//! - [`hang`]: where every rank was when a round timed out, as a `lens.hang` span.
//! - [`backend`]: for those who write a backend (argument checks, deadlines, the slab round,
//!   the W3C header parsers); users of lens do not need it.
//!
//! # Example
//!
//! ```
//! use lens_core::{broadcast_trace_context, Broadcaster, LinkedSpan, Parent};
//! use lens_testkit::LocalCluster;
//! use opentelemetry::trace::{Span as _, TraceContextExt, Tracer, TracerProvider as _};
//! use opentelemetry::Context;
//! use opentelemetry_sdk::trace::SdkTracerProvider;
//!
//! # fn main() -> Result<(), lens_core::Error> {
//! // Four ranks in one process; in a real job each rank builds its own broadcaster.
//! let ranks = LocalCluster::new(4).broadcasters();
//! let provider = SdkTracerProvider::builder().build();
//! let tracer = provider.tracer("train");
//!
//! let results = std::thread::scope(|s| {
//!     let handles: Vec<_> = ranks.iter().map(|b| {
//!         let tracer = &tracer;
//!         s.spawn(move || {
//!             let step = (b.rank() == 0).then(|| tracer.start("train_step"));
//!             let _guard = step.map(|span| Context::current_with_span(span).attach());
//!             // Every rank gets rank 0's context...
//!             let remote = lens_core::blocking::broadcast_trace_context(b, 0)?;
//!             // ...and opens a span in the same trace, linked to rank 0's step.
//!             let mut span = LinkedSpan::builder("pp.recv_forward.linked")
//!                 .remote(&remote)
//!                 .parent(Parent::Remote)
//!                 .start(tracer);
//!             let trace_id = span.span_context().trace_id();
//!             span.end();
//!             Ok::<_, lens_core::Error>(trace_id)
//!         })
//!     }).collect();
//!     // `join` fails only when the rank's thread panicked: pass that panic on.
//!     handles.into_iter().map(|h| h.join().expect("rank thread")).collect::<Result<Vec<_>, _>>()
//! })?;
//! assert!(results.iter().all(|t| *t == results[0]), "one trace for the whole job");
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod arrivals;
pub mod backend;
pub mod blocking;
mod broadcast;
mod broadcaster;
pub mod carrier;
pub mod clock;
mod error;
pub mod hang;
mod hierarchical;
pub mod link;
pub mod rank;
mod round;
pub mod sample;

pub use broadcast::{broadcast_carrier, broadcast_context, broadcast_trace_context};
pub use broadcaster::{Broadcaster, DEFAULT_MAX_PAYLOAD};
pub use carrier::{Carrier, CarrierError};
pub use clock::{ClockOffset, ClockTracker, measure_clock_offsets};
pub use error::{BoxError, Disagreement, Error, Result};
pub use hierarchical::{Hierarchical, NodeLayout};
pub use link::{LinkedSpan, LinkedSpanBuilder, Parent, Remote, create_linked_span};
pub use rank::{Launcher, RankInfo};
