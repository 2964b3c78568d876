//! Spans linked to a span on another rank.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{Link, SpanBuilder, SpanContext, SpanKind, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};

use crate::carrier::Carrier;

/// Attribute names lens writes.
pub mod attributes {
    /// On a link: the rank the linked span context was broadcast from.
    pub const LINK_SOURCE_RANK: &str = "lens.link.source_rank";
    /// On a link: how the remote context arrived, one of [`SOURCE_BROADCAST`],
    /// [`SOURCE_CARRIER`], [`SOURCE_CONTEXT`] and [`SOURCE_SPAN_CONTEXT`].
    pub const LINK_SOURCE: &str = "lens.link.source";
    /// [`LINK_SOURCE`] of a carrier that came from a broadcast (it knows its source rank).
    pub const SOURCE_BROADCAST: &str = "broadcast";
    /// [`LINK_SOURCE`] of any other carrier (one the application passed along itself).
    pub const SOURCE_CARRIER: &str = "carrier";
    /// [`LINK_SOURCE`] of a remote given as an OpenTelemetry `Context`.
    pub const SOURCE_CONTEXT: &str = "context";
    /// [`LINK_SOURCE`] of a remote given as a bare `SpanContext`.
    pub const SOURCE_SPAN_CONTEXT: &str = "span_context";
    /// On a span: how many of its remotes were not linked because of the link limit
    /// (present only when some were dropped).
    pub const LINKS_DROPPED: &str = "lens.links.dropped";
}

/// The most links lens gives one span unless told otherwise: the OpenTelemetry SDK's
/// default limit (`OTEL_SPAN_LINK_COUNT_LIMIT`), beyond which it would drop them silently.
pub const DEFAULT_LINK_LIMIT: usize = 128;

/// The remote span a linked span points to: made from a [`Context`], a [`Carrier`] (as
/// [`crate::broadcast_trace_context`] returns), an `Option<Carrier>` or a [`SpanContext`].
///
/// An invalid or absent remote is not an error: the span is then created without a link,
/// as in Python.
#[derive(Debug, Clone, Default)]
pub struct Remote {
    span_context: Option<SpanContext>,
    source_rank: Option<usize>,
    origin: &'static str,
    link_attributes: Vec<KeyValue>,
}

impl Remote {
    /// No remote: the span gets no link.
    pub fn none() -> Self {
        Self::default()
    }

    fn from_span_context(sc: SpanContext, origin: &'static str) -> Self {
        Remote {
            span_context: sc.is_valid().then_some(sc),
            source_rank: None,
            origin,
            link_attributes: Vec::new(),
        }
    }

    /// Attributes of this remote's link only (with fan-in, each link can say which
    /// request or stage it stands for).
    pub fn with_link_attributes(mut self, attributes: impl IntoIterator<Item = KeyValue>) -> Self {
        self.link_attributes.extend(attributes);
        self
    }

    /// The link lens gives a span for this remote (`None` when the remote is absent or
    /// invalid): the source rank and origin attributes, then this remote's own, then `extra`.
    pub fn link(&self, extra: &[KeyValue]) -> Option<Link> {
        let sc = self.span_context.as_ref()?;
        let mut attrs = Vec::with_capacity(2 + self.link_attributes.len() + extra.len());
        if let Some(rank) = self.source_rank {
            attrs.push(KeyValue::new(
                attributes::LINK_SOURCE_RANK,
                i64::try_from(rank).unwrap_or(i64::MAX),
            ));
        }
        attrs.push(KeyValue::new(attributes::LINK_SOURCE, self.origin));
        attrs.extend(self.link_attributes.iter().cloned());
        attrs.extend(extra.iter().cloned());
        Some(Link::new(sc.clone(), attrs, 0))
    }

    /// Records the rank the remote context came from (a link attribute).
    pub fn with_source_rank(mut self, rank: usize) -> Self {
        self.source_rank = Some(rank);
        self
    }

    /// The remote span context, when valid.
    pub fn span_context(&self) -> Option<&SpanContext> {
        self.span_context.as_ref()
    }

    /// The source rank, when known.
    pub fn source_rank(&self) -> Option<usize> {
        self.source_rank
    }
}

impl From<SpanContext> for Remote {
    fn from(sc: SpanContext) -> Self {
        Remote::from_span_context(sc, attributes::SOURCE_SPAN_CONTEXT)
    }
}

impl From<&Context> for Remote {
    fn from(cx: &Context) -> Self {
        Remote::from_span_context(cx.span().span_context().clone(), attributes::SOURCE_CONTEXT)
    }
}

impl From<Context> for Remote {
    fn from(cx: Context) -> Self {
        Remote::from(&cx)
    }
}

impl From<&Carrier> for Remote {
    fn from(c: &Carrier) -> Self {
        let origin = if c.source_rank().is_some() {
            attributes::SOURCE_BROADCAST
        } else {
            attributes::SOURCE_CARRIER
        };
        Remote {
            span_context: c.span_context(),
            source_rank: c.source_rank(),
            origin,
            link_attributes: Vec::new(),
        }
    }
}

impl From<Carrier> for Remote {
    fn from(c: Carrier) -> Self {
        Remote::from(&c)
    }
}

impl<T: Into<Remote>> From<Option<T>> for Remote {
    fn from(o: Option<T>) -> Self {
        o.map(Into::into).unwrap_or_default()
    }
}

impl From<&Option<Carrier>> for Remote {
    fn from(o: &Option<Carrier>) -> Self {
        o.as_ref().map(Remote::from).unwrap_or_default()
    }
}

/// Which span a linked span is the child of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Parent {
    /// The default: the local current span when the rank has one (as Python does, the
    /// remote is then only linked), else the remote span, so that a rank with no span of
    /// its own joins the source's trace instead of starting a trace of its own.
    #[default]
    Auto,
    /// The local current span (as Python does); the remote is only linked. A rank with no
    /// current span starts a new trace.
    Current,
    /// The remote span: every rank then shares the source's trace id, so the whole job is
    /// one trace. Falls back to the current span when the remote is absent or invalid.
    Remote,
    /// No parent: a new trace, linked to the remote.
    Root,
}

/// Starts a span linked to `remote`, with `attributes`: a child of the current span when
/// there is one, else of the remote span ([`Parent::Auto`]), so that a rank without a span
/// of its own still lands in the job's trace.
///
/// Links and attributes are given at creation, so samplers see them. Shorthand for
/// [`LinkedSpan::builder`].
///
/// ```
/// use lens_core::{create_linked_span, Carrier};
/// use opentelemetry::{trace::TracerProvider as _, KeyValue};
/// use opentelemetry_sdk::trace::SdkTracerProvider;
///
/// let tracer = SdkTracerProvider::builder().build().tracer("doc");
/// let carrier = Carrier::decode(
///     br#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
/// )?;
/// let _span = create_linked_span(&tracer, "pp.recv_forward.linked", &carrier,
///     vec![KeyValue::new("pp.stage", 1)]);
/// # Ok::<(), lens_core::CarrierError>(())
/// ```
pub fn create_linked_span<T: Tracer>(
    tracer: &T,
    name: impl Into<Cow<'static, str>>,
    remote: impl Into<Remote>,
    attributes: Vec<KeyValue>,
) -> T::Span {
    let (name, remote) = (name.into(), remote.into());
    Context::map_current(|cx| {
        start_linked(
            tracer,
            name,
            std::slice::from_ref(&remote),
            attributes,
            &[],
            DEFAULT_LINK_LIMIT,
            SpanKind::Internal,
            Parent::default(),
            None,
            cx,
        )
    })
}

/// The links of a span linked to `remotes` (absent ones skipped), at most `limit` of them,
/// and how many valid remotes the limit left out. For integrations such as `lens-tracing`
/// that build spans their own way; [`LinkedSpan::builder`] uses it.
pub fn links_for(remotes: &[Remote], extra: &[KeyValue], limit: usize) -> (Vec<Link>, usize) {
    let valid = remotes.iter().filter(|r| r.span_context.is_some()).count();
    let links: Vec<Link> = remotes
        .iter()
        .filter_map(|r| r.link(extra))
        .take(limit)
        .collect();
    let dropped = valid - links.len();
    (links, dropped)
}

/// The context a linked span's parent is taken from, under `parent`, given the first valid
/// remote and the caller's context `cx` (see [`Parent`]); `None` means `cx` itself.
pub fn parent_context(
    parent: Parent,
    remote: Option<&SpanContext>,
    cx: &Context,
) -> Option<Context> {
    let has_local = cx.span().span_context().is_valid();
    match (parent, remote) {
        (Parent::Auto, Some(sc)) if !has_local => Some(cx.with_remote_span_context(sc.clone())),
        (Parent::Remote, Some(sc)) => Some(cx.with_remote_span_context(sc.clone())),
        (Parent::Root, _) => Some(Context::new()),
        _ => None,
    }
}

/// Starts the span: the links (with their attributes) and the span attributes are handed to
/// the SDK at creation, so samplers see them.
#[allow(clippy::too_many_arguments)]
fn start_linked<T: Tracer>(
    tracer: &T,
    name: Cow<'static, str>,
    remotes: &[Remote],
    mut attributes: Vec<KeyValue>,
    link_attributes: &[KeyValue],
    link_limit: usize,
    kind: SpanKind,
    parent: Parent,
    start_time: Option<SystemTime>,
    cx: &Context,
) -> T::Span {
    let (links, dropped) = links_for(remotes, link_attributes, link_limit);
    if dropped > 0 {
        attributes.push(KeyValue::new(
            attributes::LINKS_DROPPED,
            i64::try_from(dropped).unwrap_or(i64::MAX),
        ));
    }
    let primary = remotes.iter().find_map(|r| r.span_context.as_ref());
    let own_parent = parent_context(parent, primary, cx);
    // Fields set in place: the `with_*` chain moves the (large) builder at every step.
    let mut builder = SpanBuilder::from_name(name);
    builder.span_kind = Some(kind);
    builder.attributes = Some(attributes);
    builder.links = (!links.is_empty()).then_some(links);
    builder.start_time = start_time;
    tracer.build_with_context(builder, own_parent.as_ref().unwrap_or(cx))
}

/// Namespace for [`LinkedSpan::builder`].
#[derive(Debug)]
pub struct LinkedSpan(());

impl LinkedSpan {
    /// A builder for a span named `name`.
    ///
    /// ```
    /// use lens_core::{LinkedSpan, Parent, Remote};
    /// use opentelemetry::trace::{SpanKind, TracerProvider as _};
    /// use opentelemetry::KeyValue;
    /// use opentelemetry_sdk::trace::SdkTracerProvider;
    ///
    /// let tracer = SdkTracerProvider::builder().build().tracer("doc");
    /// let _span = LinkedSpan::builder("pp.recv_forward.linked")
    ///     .remote(Remote::none())
    ///     .kind(SpanKind::Consumer)
    ///     .parent(Parent::Remote)
    ///     .attributes([KeyValue::new("pp.stage", 2)])
    ///     .link_attributes([KeyValue::new("pp.microbatch", 0)])
    ///     .start(&tracer);
    /// ```
    pub fn builder(name: impl Into<Cow<'static, str>>) -> LinkedSpanBuilder {
        LinkedSpanBuilder {
            name: name.into(),
            remotes: Vec::new(),
            link_limit: DEFAULT_LINK_LIMIT,
            attributes: Vec::new(),
            link_attributes: Vec::new(),
            kind: SpanKind::Internal,
            parent: Parent::default(),
            start_time: None,
        }
    }
}

/// Builds a span linked to a remote span; see [`LinkedSpan::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct LinkedSpanBuilder {
    name: Cow<'static, str>,
    remotes: Vec<Remote>,
    link_limit: usize,
    attributes: Vec<KeyValue>,
    link_attributes: Vec<KeyValue>,
    kind: SpanKind,
    parent: Parent,
    start_time: Option<SystemTime>,
}

impl LinkedSpanBuilder {
    /// The remote span to link to (the first remote: with [`Parent::Remote`] it is the
    /// parent). Replaces an earlier `remote`; [`LinkedSpanBuilder::remotes`] adds more.
    pub fn remote(mut self, remote: impl Into<Remote>) -> Self {
        let remote = remote.into();
        match self.remotes.first_mut() {
            Some(first) => *first = remote,
            None => self.remotes.push(remote),
        }
        self
    }

    /// Fan-in: links to many remote spans at once (a batched inference step serving
    /// requests from many traces, an all-reduce linking every stage's step), each with its
    /// own attributes ([`Remote::with_link_attributes`]). Absent remotes are skipped; past
    /// the link limit the rest are counted in `lens.links.dropped`, not lost silently.
    ///
    /// ```
    /// use lens_core::{LinkedSpan, Parent, Remote};
    /// use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState, TracerProvider as _};
    /// use opentelemetry::KeyValue;
    /// use opentelemetry_sdk::trace::SdkTracerProvider;
    ///
    /// let tracer = SdkTracerProvider::builder().build().tracer("doc");
    /// let request = |i: u64| {
    ///     let sc = SpanContext::new(TraceId::from(u128::from(i) + 1), SpanId::from(i + 1),
    ///         TraceFlags::SAMPLED, true, TraceState::default());
    ///     Remote::from(sc).with_link_attributes([KeyValue::new("request.index", i as i64)])
    /// };
    /// let _batch = LinkedSpan::builder("infer.batch")
    ///     .remotes((0..200).map(request)) // 128 linked, `lens.links.dropped` = 72
    ///     .parent(Parent::Root)
    ///     .start(&tracer);
    /// ```
    pub fn remotes<R: Into<Remote>>(mut self, remotes: impl IntoIterator<Item = R>) -> Self {
        self.remotes.extend(remotes.into_iter().map(Into::into));
        self
    }

    /// The most links the span gets (default [`DEFAULT_LINK_LIMIT`], the SDK's own default
    /// limit; set it to the provider's `SpanLimits::max_links_per_span` if you changed that).
    pub fn link_limit(mut self, limit: usize) -> Self {
        self.link_limit = limit;
        self
    }

    /// Span attributes (added to those given before).
    pub fn attributes(mut self, attributes: impl IntoIterator<Item = KeyValue>) -> Self {
        self.attributes.extend(attributes);
        self
    }

    /// Extra link attributes, besides the source rank lens adds.
    pub fn link_attributes(mut self, attributes: impl IntoIterator<Item = KeyValue>) -> Self {
        self.link_attributes.extend(attributes);
        self
    }

    /// The span kind (default [`SpanKind::Internal`]).
    pub fn kind(mut self, kind: SpanKind) -> Self {
        self.kind = kind;
        self
    }

    /// The parent (default [`Parent::Auto`]: the current span if any, else the remote).
    pub fn parent(mut self, parent: Parent) -> Self {
        self.parent = parent;
        self
    }

    /// An explicit start time.
    pub fn start_time(mut self, t: SystemTime) -> Self {
        self.start_time = Some(t);
        self
    }

    /// Starts the span with `tracer`, the parent taken from the current context.
    pub fn start<T: Tracer>(self, tracer: &T) -> T::Span {
        Context::map_current(|cx| self.start_with_context(tracer, cx))
    }

    /// Starts the span with `tracer`, using `cx` as the "current" context.
    pub fn start_with_context<T: Tracer>(self, tracer: &T, cx: &Context) -> T::Span {
        start_linked(
            tracer,
            self.name,
            &self.remotes,
            self.attributes,
            &self.link_attributes,
            self.link_limit,
            self.kind,
            self.parent,
            self.start_time,
            cx,
        )
    }
}
