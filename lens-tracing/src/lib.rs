//! **lens** for code instrumented with the [`tracing`] crate (through
//! [`tracing-opentelemetry`](tracing_opentelemetry)).
//!
//! - [`broadcast_current`] (and [`broadcast_current_blocking`] for code without an async
//!   runtime): broadcast the OpenTelemetry context of a `tracing` span from one rank to
//!   every rank.
//! - [`linked`]: give a freshly created `tracing` span its links to other ranks' spans and,
//!   if asked, a remote parent, **before** its OpenTelemetry span is built, so samplers see
//!   them. (With `tracing-opentelemetry`, `set_parent` on a span that was already entered
//!   or whose context was read does nothing but return an error; lens does it at the
//!   right moment and reports the mistake when it is too late.)
//!
//! # Example
//!
//! A `tracing` user writes `info_span!` and one lens call per step:
//!
//! ```
//! use lens_core::Parent;
//! use lens_testkit::Cluster;
//! use tracing::info_span;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Four in-process ranks, each with its own tracing subscriber exporting to its own spans.
//! let report = Cluster::builder(4).tracing_subscribers().build().run_blocking(|rank| async move {
//!     let step = if rank.rank == 0 { info_span!("train_step") } else { tracing::Span::none() };
//!     // Rank 0 sends the context of its current span; every rank receives it.
//!     let remote = lens_tracing::broadcast_current(&*rank.broadcaster, 0, &step).await?;
//!     if rank.rank > 0 {
//!         let stage = lens_tracing::linked(info_span!("pp.recv_forward.linked"), &remote)
//!             .parent(Parent::Remote)
//!             .start()?;
//!         stage.in_scope(|| { /* the stage's work */ });
//!     }
//!     drop(step);
//!     Ok(())
//! })?;
//! report.check_single_trace()?;
//! report.check_links(3, "pp.recv_forward.linked", 0, "train_step")?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use lens_core::link::{DEFAULT_LINK_LIMIT, attributes, links_for, parent_context};
use lens_core::{Broadcaster, Carrier, Error, Parent, Remote, Result, broadcast_context};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::{Context, KeyValue};
/// The `tracing-opentelemetry` lens is built with, so that the layer a program installs
/// pairs with lens's OpenTelemetry version.
pub use tracing_opentelemetry;
use tracing_opentelemetry::{OpenTelemetrySpanExt as _, SetParentError};

/// The OpenTelemetry context of `span` (reading it starts the span's OTel side).
pub fn context_of(span: &tracing::Span) -> Context {
    span.context()
}

/// Broadcasts the OpenTelemetry context of `span` (on the source rank; other ranks pass any
/// span, such as `Span::none()` or `Span::current()`) from `root` to every rank, in one
/// collective. The source passes the span explicitly because async code has no reliable
/// "current" span across `.await`; in synchronous code pass `&tracing::Span::current()`.
///
/// # Errors
/// As [`lens_core::broadcast_context`].
pub async fn broadcast_current(
    b: &dyn Broadcaster,
    root: usize,
    span: &tracing::Span,
) -> Result<Option<Carrier>> {
    broadcast_context(b, root, &source_context(b, root, span)).await
}

/// What a rank sends: the span's context on the source, nothing elsewhere.
fn source_context(b: &dyn Broadcaster, root: usize, span: &tracing::Span) -> Context {
    if b.rank() == root {
        span.context()
    } else {
        Context::new()
    }
}

/// [`broadcast_current`] for code without an async runtime (a training loop): the same
/// collective, run on this thread (with no future where the backend can).
///
/// # Errors
/// As [`lens_core::blocking::broadcast_context`].
pub fn broadcast_current_blocking(
    b: &dyn Broadcaster,
    root: usize,
    span: &tracing::Span,
) -> Result<Option<Carrier>> {
    lens_core::blocking::broadcast_context(b, root, &source_context(b, root, span))
}

/// Starts linking `span` (created just now, not yet entered) to `remote`; finish with
/// [`Linked::start`].
pub fn linked(span: tracing::Span, remote: impl Into<Remote>) -> Linked {
    Linked {
        span,
        remotes: vec![remote.into()],
        parent: Parent::default(),
        link_attributes: Vec::new(),
        link_limit: DEFAULT_LINK_LIMIT,
    }
}

/// A `tracing` span being given its links and parent; see [`linked`].
#[derive(Debug)]
#[must_use = "the links are set by `start`"]
pub struct Linked {
    span: tracing::Span,
    remotes: Vec<Remote>,
    parent: Parent,
    link_attributes: Vec<KeyValue>,
    link_limit: usize,
}

impl Linked {
    /// Which span is the parent (default [`Parent::Auto`]: the current span if any, else
    /// the remote). With [`Parent::Remote`] every rank shares the source's trace id.
    pub fn parent(mut self, parent: Parent) -> Self {
        self.parent = parent;
        self
    }

    /// Fan-in: more remote spans to link (each with its own attributes, see
    /// [`Remote::with_link_attributes`]), up to the link limit.
    pub fn remotes<R: Into<Remote>>(mut self, remotes: impl IntoIterator<Item = R>) -> Self {
        self.remotes.extend(remotes.into_iter().map(Into::into));
        self
    }

    /// Attributes on every link, besides the source rank lens adds.
    pub fn link_attributes(mut self, attributes: impl IntoIterator<Item = KeyValue>) -> Self {
        self.link_attributes.extend(attributes);
        self
    }

    /// The most links (default [`DEFAULT_LINK_LIMIT`]); the rest are counted in
    /// `lens.links.dropped`.
    pub fn link_limit(mut self, limit: usize) -> Self {
        self.link_limit = limit;
        self
    }

    /// Sets the parent and the links on the span's OpenTelemetry builder and returns the
    /// span, ready to enter. A span that is disabled (filtered out) is returned unchanged.
    ///
    /// # Errors
    /// [`Error::Config`] when the span's OpenTelemetry side was already built (it was
    /// entered, or its context read, before this call), or when the subscriber has no
    /// `tracing-opentelemetry` layer: in both cases the links could not be set.
    pub fn start(self) -> Result<tracing::Span> {
        let span = self.span;
        if span.is_disabled() {
            return Ok(span);
        }
        let primary = self.remotes.iter().find_map(|r| r.span_context().cloned());
        // The span was created in the current context; Auto asks whether that has a span.
        let current = Context::map_current(|cx| {
            if cx.span().span_context().is_valid() {
                cx.clone()
            } else {
                tracing::Span::current().context()
            }
        });
        let parent = parent_context(self.parent, primary.as_ref(), &current);
        // Always set the parent: it is also how a span that already started is detected.
        let parent = parent.unwrap_or(current);
        span.set_parent(parent).map_err(|e| match e {
            SetParentError::AlreadyStarted => Error::config(
                "the tracing span's OpenTelemetry span was already started (entered, or its \
                 context read) before lens could link it: call lens_tracing::linked right after \
                 creating the span",
            ),
            other => Error::config(format!(
                "cannot link the tracing span ({other}): is a tracing_opentelemetry layer installed?"
            )),
        })?;
        let (links, dropped) = links_for(&self.remotes, &self.link_attributes, self.link_limit);
        for link in links {
            span.add_link_with_attributes(link.span_context, link.attributes);
        }
        if dropped > 0 {
            span.set_attribute(
                attributes::LINKS_DROPPED,
                i64::try_from(dropped).unwrap_or(i64::MAX),
            );
        }
        Ok(span)
    }
}
