//! Running code written against globals (`opentelemetry::global::tracer`, `tracing` macros)
//! on many in-process ranks, each rank's spans captured apart.
//!
//! A process has one global tracer provider and one global `tracing` dispatcher, but a
//! simulated job has N ranks in it. [`install`] makes the global provider a router: a span
//! started through it goes to the provider of the rank whose code is running on this thread
//! ([`with_rank`], or each rank's task in a [`crate::Cluster`] built with
//! [`crate::ClusterBuilder::route_globals`]). Outside any rank it goes to a provider that
//! exports nothing.
//!
//! Limit: a task the rank's code spawns itself (`tokio::spawn`) runs outside the rank's
//! scope; wrap it with [`RankScoped::new`] to keep its spans with the rank.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use opentelemetry::trace::{SpanBuilder, Tracer, TracerProvider};
use opentelemetry::{Context, InstrumentationScope};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};

thread_local! {
    static CURRENT: RefCell<Option<SdkTracerProvider>> = const { RefCell::new(None) };
}

/// Makes the global tracer provider route to the calling rank's provider. Idempotent; call
/// it again if other code replaced the global provider since.
pub fn install() {
    opentelemetry::global::set_tracer_provider(RoutingProvider {
        outside: SdkTracerProvider::builder().build(),
    });
}

/// Runs `f` as the rank whose provider is `provider`: spans started through the global
/// tracer on this thread during `f` go to it.
pub fn with_rank<R>(provider: &SdkTracerProvider, f: impl FnOnce() -> R) -> R {
    let previous = CURRENT.with(|c| c.replace(Some(provider.clone())));
    let _restore = Restore(previous);
    f()
}

struct Restore(Option<SdkTracerProvider>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// A future that runs as one rank at every poll: its global spans go to that rank's
/// provider and, with a dispatcher, its `tracing` spans to that rank's subscriber.
#[derive(Debug)]
pub struct RankScoped<F> {
    inner: Pin<Box<F>>,
    provider: SdkTracerProvider,
    dispatch: Option<tracing::Dispatch>,
}

impl<F: Future> RankScoped<F> {
    /// `inner`, run as the rank of `provider`, with `dispatch` as its `tracing` dispatcher
    /// if given.
    pub fn new(inner: F, provider: SdkTracerProvider, dispatch: Option<tracing::Dispatch>) -> Self {
        RankScoped {
            inner: Box::pin(inner),
            provider,
            dispatch,
        }
    }
}

impl<F: Future> Future for RankScoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let inner = &mut this.inner;
        with_rank(&this.provider, || match &this.dispatch {
            Some(d) => tracing::dispatcher::with_default(d, || inner.as_mut().poll(cx)),
            None => inner.as_mut().poll(cx),
        })
    }
}

#[derive(Debug)]
struct RoutingProvider {
    outside: SdkTracerProvider,
}

impl TracerProvider for RoutingProvider {
    type Tracer = RoutingTracer;

    fn tracer_with_scope(&self, scope: InstrumentationScope) -> RoutingTracer {
        RoutingTracer {
            outside: self.outside.tracer_with_scope(scope.clone()),
            scope,
        }
    }
}

/// The tracer the routing provider hands out; it picks the rank's provider at each span.
#[derive(Debug, Clone)]
struct RoutingTracer {
    scope: InstrumentationScope,
    outside: SdkTracer,
}

impl Tracer for RoutingTracer {
    type Span = Span;

    fn build_with_context(&self, builder: SpanBuilder, parent_cx: &Context) -> Span {
        let rank = CURRENT.with(|c| c.borrow().clone());
        match rank {
            Some(p) => p
                .tracer_with_scope(self.scope.clone())
                .build_with_context(builder, parent_cx),
            None => self.outside.build_with_context(builder, parent_cx),
        }
    }
}
