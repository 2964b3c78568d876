//! **lens** makes a distributed job (LLM training, inference, HPC) show up as one
//! OpenTelemetry trace.
//!
//! One rank's W3C trace context is broadcast to every rank
//! ([`broadcast_trace_context`]), and spans on different ranks are joined with OTel links
//! where parent/child makes no sense ([`create_linked_span`], [`LinkedSpan::builder`]).
//! Transports plug in behind one trait, [`Broadcaster`]; pick one with a Cargo feature:
//!
//! | feature | what it adds |
//! |---|---|
//! | `local` | `lens::local`: the in-process backend, N ranks of one process (`LocalCluster`) |
//! | `testkit` | `lens::testkit`: the cluster runner, span capture, fault injection, the conformance suite (enables `local`) |
//! | `tcp` | `lens::tcp`: TCP on the process's own sockets, authenticated, any rank the root |
//! | `mpi` | `lens::mpi`: one collective per carrier over any communicator (direct sends, a persistent broadcast or `MPI_Ibcast`, whichever measures fastest when built), with a deadline |
//! | `nccl` | `lens::nccl`: one `ncclBroadcast` per carrier on GPU; `Unavailable` without CUDA |
//! | `otlp` | `lens::otlp`: each rank's spans to an OTLP receiver (gRPC or HTTP, TLS), with the rank resource and a flushing guard |
//! | `tracing` | `lens::tracing`: for `tracing` users, broadcast a span's context and open linked `tracing` spans |
//!
//! No feature is on by default. This library is the package `lens-trace`, imported as
//! `lens` (`lens-trace = { version = "0.1", features = ["tcp"] }`); the package `lens` is
//! the program (`lens demo`, `lens bench`), so a library user's build has none of it.
//!
//! This crate re-exports `lens-core`'s user surface by name (the broadcasts, the
//! [`Broadcaster`] trait, carriers, linked spans, ranks, clock offsets, errors); what a
//! backend author needs stays under [`backend`]. Which rank came last to a round: [`arrivals`]; where
//! every rank was when one timed out: [`hang`]; each step kept or dropped whole on every
//! rank: [`sample`].
//!
//! **One trace per job.** A linked span's parent is [`Parent::Auto`] by default: the rank's
//! current span if it has one (as NeMo Lens does), else the broadcast span, so a rank with
//! no span of its own lands in the source's trace. [`Parent::Remote`] always joins it. In
//! async code pass contexts explicitly ([`broadcast_context`], `start_with_context`): a
//! context guard is not `Send`. The guide's "Writing rank code" (docs/guide/rust.md) shows rank code generic
//! over the tracer, so that the test kit can run it; ARCHITECTURE.md shows where things live.
//!
//! # Quick start
//!
//! ```
//! use lens::{broadcast_context, LinkedSpan, Parent};
//! use lens::testkit::Cluster;
//! use opentelemetry::trace::{Span as _, TraceContextExt, Tracer};
//! use opentelemetry::Context;
//!
//! // Four in-process ranks; each has its own tracer and span capture.
//! let report = Cluster::builder(4).build().run_blocking(|rank| async move {
//!     // Rank 0 (the first pipeline stage) opens the step...
//!     let cx = if rank.rank == 0 {
//!         Context::new().with_span(rank.tracer.start("train_step"))
//!     } else {
//!         Context::new()
//!     };
//!     // ...every rank gets its trace context in one collective...
//!     let remote = broadcast_context(&*rank.broadcaster, 0, &cx).await?;
//!     // ...and later stages open spans in the same trace, linked to rank 0's step.
//!     if rank.rank > 0 {
//!         LinkedSpan::builder("pp.recv_forward.linked")
//!             .remote(&remote)
//!             .parent(Parent::Remote)
//!             .start_with_context(&rank.tracer, &Context::new())
//!             .end();
//!     }
//!     cx.span().end();
//!     Ok(())
//! })?;
//! report.check_single_trace()?;
//! report.check_links(3, "pp.recv_forward.linked", 0, "train_step")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]
// Library paths return errors; unwrap/expect only in tests.
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub use lens_core::{
    BoxError, Broadcaster, Carrier, CarrierError, ClockOffset, DEFAULT_MAX_PAYLOAD, Disagreement,
    Error, Hierarchical, Launcher, LinkedSpan, LinkedSpanBuilder, NodeLayout, Parent, RankInfo,
    Remote, Result, broadcast_carrier, broadcast_context, broadcast_trace_context,
    create_linked_span, measure_clock_offsets,
};
pub use lens_core::{arrivals, blocking, carrier, clock, hang, link, rank, sample};

/// For those who write a backend: argument checks, deadlines, the slab round, the W3C
/// header parsers. Users of lens do not need it.
pub use lens_core::backend;

/// The OpenTelemetry API lens is built with: name it through lens to get the same version.
pub use opentelemetry;
/// The OpenTelemetry SDK lens is built with (moves with [`opentelemetry`]).
pub use opentelemetry_sdk;

/// The `tracing-opentelemetry` that pairs with lens's OpenTelemetry (feature `tracing`).
#[cfg(feature = "tracing")]
pub use lens_tracing::tracing_opentelemetry;

/// The in-process backend: N ranks of one process (`LocalCluster`), for simulations.
#[cfg(feature = "local")]
pub use lens_local as local;

/// The test kit: in-process cluster, span capture, faults, conformance suite.
#[cfg(feature = "testkit")]
pub use lens_testkit as testkit;

/// OTLP export: a rank-aware tracer provider and its flushing guard (`OtlpBuilder`).
#[cfg(feature = "otlp")]
pub use lens_otlp as otlp;

/// For `tracing` users: `broadcast_current` and `linked`.
#[cfg(feature = "tracing")]
pub use lens_tracing as tracing;

/// The TCP backend (`TcpBroadcaster`).
#[cfg(feature = "tcp")]
pub use lens_tcp as tcp;

/// The MPI backend (`MpiBroadcaster`).
#[cfg(feature = "mpi")]
pub use lens_mpi as mpi;

/// The NCCL backend (`NcclBroadcaster`).
#[cfg(feature = "nccl")]
pub use lens_nccl as nccl;

#[cfg(all(feature = "otlp", feature = "tracing"))]
mod layer;
#[cfg(all(feature = "otlp", feature = "tracing"))]
pub use layer::otlp_layer;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The guide's Rust examples, compiled and run as doc tests: one item per page that has
/// any (`lens/tests/docs.rs` checks that every such page is here).
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../../docs/guide/rust.md")]
    pub struct Rust;
    #[doc = include_str!("../../docs/guide/export.md")]
    pub struct Export;
    #[doc = include_str!("../../docs/guide/sampling.md")]
    pub struct Sampling;
}
