//! A simulated job: N ranks in one process, each with its own tracer provider and
//! in-memory span capture, optional faults, and checks over the spans afterwards.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lens_core::link::attributes::LINK_SOURCE_RANK;
use lens_core::{Broadcaster, Error, RankInfo, Result};
use opentelemetry::Value;
use opentelemetry::trace::{TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracer, SdkTracerProvider, SpanData};

use crate::fault::{Fault, Faulty};
use crate::globals::RankScoped;
use lens_local::{DEFAULT_ROUND_TIMEOUT, LocalCluster};

/// What one rank of a [`Cluster`] run is given.
#[derive(Clone)]
pub struct RankCtx {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// This rank's broadcaster (with its faults, if any).
    pub broadcaster: Arc<dyn Broadcaster>,
    /// A tracer of this rank's own provider, whose resource carries the rank attributes.
    pub tracer: SdkTracer,
}

impl std::fmt::Debug for RankCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankCtx")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Cluster`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ClusterBuilder {
    world_size: usize,
    timeout: Duration,
    faults: HashMap<usize, Vec<Fault>>,
    absent: BTreeSet<usize>,
    route_globals: bool,
    #[cfg(feature = "tracing")]
    tracing_subscribers: bool,
    providers: Option<ProviderFactory>,
}

/// Builds a rank's tracer provider; see [`ClusterBuilder::tracer_provider`].
type MakeProvider = dyn Fn(&RankInfo, InMemorySpanExporter) -> SdkTracerProvider + Send + Sync;

#[derive(Clone)]
struct ProviderFactory(Arc<MakeProvider>);

impl std::fmt::Debug for ProviderFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProviderFactory")
    }
}

impl ClusterBuilder {
    /// Builds each rank's tracer provider with `make(info, exporter)` instead of the default
    /// one: for providers that also export elsewhere (OTLP). The provider must send every
    /// span to `exporter` (with a simple processor), which the [`Report`] reads, and should
    /// carry `info`'s resource.
    pub fn tracer_provider(
        mut self,
        make: impl Fn(&RankInfo, InMemorySpanExporter) -> SdkTracerProvider + Send + Sync + 'static,
    ) -> Self {
        self.providers = Some(ProviderFactory(Arc::new(make)));
        self
    }

    /// Code that calls `opentelemetry::global::tracer(..)` records its spans on the rank
    /// that runs it: the global provider becomes a router ([`crate::globals`]) and each
    /// rank's task runs in its rank's scope.
    pub fn route_globals(mut self) -> Self {
        self.route_globals = true;
        self
    }

    /// Each rank's task gets its own `tracing` subscriber (a registry with a
    /// `tracing-opentelemetry` layer over the rank's tracer), so `info_span!` and friends
    /// record on the rank that runs them.
    #[cfg(feature = "tracing")]
    pub fn tracing_subscribers(mut self) -> Self {
        self.tracing_subscribers = true;
        self
    }

    /// Deadline of each collective.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Injects `fault` on `rank`.
    pub fn fault(mut self, rank: usize, fault: Fault) -> Self {
        self.faults.entry(rank).or_default().push(fault);
        self
    }

    /// `rank` never joins: its closure is not run.
    pub fn absent(mut self, rank: usize) -> Self {
        self.absent.insert(rank);
        self
    }

    /// The cluster.
    pub fn build(self) -> Cluster {
        Cluster { cfg: self }
    }
}

/// N ranks in one process. See [`Cluster::run`].
///
/// ```
/// use lens_testkit::Cluster;
/// use lens_core::broadcast_context;
/// use opentelemetry::trace::{Tracer, TraceContextExt};
/// use opentelemetry::Context;
///
/// let report = Cluster::builder(4).build().run_blocking(|rank| async move {
///     let cx = if rank.rank == 0 {
///         Context::new().with_span(rank.tracer.start("train_step"))
///     } else {
///         Context::new()
///     };
///     let carrier = broadcast_context(&*rank.broadcaster, 0, &cx).await?;
///     Ok(carrier.is_some())
/// })?;
/// assert!(report.outcomes()?.into_iter().all(|got| *got));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Cluster {
    cfg: ClusterBuilder,
}

impl Cluster {
    /// A cluster of `world_size` ranks.
    pub fn builder(world_size: usize) -> ClusterBuilder {
        ClusterBuilder {
            world_size: world_size.max(1),
            timeout: DEFAULT_ROUND_TIMEOUT,
            faults: HashMap::new(),
            absent: BTreeSet::new(),
            route_globals: false,
            #[cfg(feature = "tracing")]
            tracing_subscribers: false,
            providers: None,
        }
    }

    /// Runs `f` once per rank, each as a task of the current tokio runtime, and collects
    /// every rank's outcome and finished spans.
    ///
    /// Must be called inside a multi-threaded tokio runtime; see [`Cluster::run_blocking`].
    ///
    /// # Errors
    /// [`Error::Config`] when the ranks' tracer providers cannot be built.
    pub async fn run<F, Fut, T>(&self, f: F) -> Result<Report<T>>
    where
        F: Fn(RankCtx) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let n = self.cfg.world_size;
        let broadcasters = LocalCluster::new(n)
            .timeout(self.cfg.timeout)
            .broadcasters();
        if self.cfg.route_globals {
            crate::globals::install();
        }
        let mut running = Vec::with_capacity(n);
        for (rank, b) in broadcasters.into_iter().enumerate() {
            let exporter = InMemorySpanExporter::default();
            let info = RankInfo::new(rank, n)?.with_local_rank(rank);
            let provider = match &self.cfg.providers {
                Some(make) => (make.0)(&info, exporter.clone()),
                // Hang reports name the spans open in the process (`lens_core::hang`).
                None => SdkTracerProvider::builder()
                    .with_span_processor(lens_core::hang::OpenSpans)
                    .with_simple_exporter(exporter.clone())
                    .with_resource(info.resource())
                    .build(),
            };
            let broadcaster: Arc<dyn Broadcaster> = match self.cfg.faults.get(&rank) {
                Some(faults) => Arc::new(Faulty::new(b, faults.clone())),
                None => Arc::new(b),
            };
            let tracer = provider.tracer("lens-testkit");
            let task = (!self.cfg.absent.contains(&rank)).then(|| {
                let code = f(RankCtx {
                    rank,
                    world_size: n,
                    broadcaster,
                    tracer: tracer.clone(),
                });
                if self.scoped() {
                    tokio::spawn(RankScoped::new(
                        code,
                        provider.clone(),
                        self.dispatch(&tracer),
                    ))
                } else {
                    tokio::spawn(code)
                }
            });
            running.push((task, provider, exporter));
        }
        let mut ranks = Vec::with_capacity(n);
        for (rank, (task, provider, exporter)) in running.into_iter().enumerate() {
            let outcome = match task {
                None => None,
                Some(handle) => Some(handle.await.unwrap_or_else(|e| {
                    let what = if e.is_panic() {
                        "panicked"
                    } else {
                        "was cancelled"
                    };
                    Err(Error::Closed {
                        backend: "testkit",
                        reason: format!("rank {rank}'s code {what}: {e}"),
                    })
                })),
            };
            if let Err(e) = provider.force_flush() {
                tracing::warn!(rank, error = %e, "flushing the rank's spans failed");
            }
            let spans = exporter.get_finished_spans().unwrap_or_default();
            ranks.push(RankReport {
                rank,
                outcome,
                spans,
            });
        }
        Ok(Report { ranks })
    }

    fn scoped(&self) -> bool {
        #[cfg(feature = "tracing")]
        if self.cfg.tracing_subscribers {
            return true;
        }
        self.cfg.route_globals
    }

    #[cfg(feature = "tracing")]
    fn dispatch(&self, tracer: &SdkTracer) -> Option<tracing::Dispatch> {
        use tracing_subscriber::layer::SubscriberExt as _;
        self.cfg.tracing_subscribers.then(|| {
            tracing::Dispatch::new(
                tracing_subscriber::registry()
                    .with(tracing_opentelemetry::layer().with_tracer(tracer.clone())),
            )
        })
    }

    #[cfg(not(feature = "tracing"))]
    fn dispatch(&self, _tracer: &SdkTracer) -> Option<tracing::Dispatch> {
        None
    }

    /// [`Cluster::run`] on a new multi-threaded tokio runtime (two worker threads).
    ///
    /// # Errors
    /// As [`Cluster::run`], and [`Error::Config`] when the runtime cannot be built.
    pub fn run_blocking<F, Fut, T>(&self, f: F) -> Result<Report<T>>
    where
        F: Fn(RankCtx) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::config(format!("cannot build a tokio runtime: {e}")))?;
        rt.block_on(self.run(f))
    }
}

/// One rank's part of a [`Report`].
#[derive(Debug)]
pub struct RankReport<T> {
    /// The rank.
    pub rank: usize,
    /// What its closure returned; `None` for an absent rank.
    pub outcome: Option<Result<T>>,
    /// Its finished spans, in the order they ended.
    pub spans: Vec<SpanData>,
}

/// A failed check over a [`Report`], with a message saying what was expected and found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CheckError(pub String);

/// Every rank's outcome and spans after a [`Cluster::run`].
#[derive(Debug)]
pub struct Report<T> {
    /// One entry per rank, index = rank.
    pub ranks: Vec<RankReport<T>>,
}

impl<T> Report<T> {
    /// The spans of `rank`.
    pub fn spans(&self, rank: usize) -> &[SpanData] {
        self.ranks.get(rank).map_or(&[], |r| r.spans.as_slice())
    }

    /// The spans of `rank` named `name`.
    pub fn named(&self, rank: usize, name: &str) -> Vec<&SpanData> {
        self.spans(rank).iter().filter(|s| s.name == name).collect()
    }

    /// Every rank's outcome, in rank order.
    ///
    /// # Errors
    /// The first rank that failed or was absent, with its error.
    pub fn outcomes(&self) -> std::result::Result<Vec<&T>, CheckError> {
        self.ranks
            .iter()
            .map(|r| match &r.outcome {
                Some(Ok(v)) => Ok(v),
                Some(Err(e)) => Err(CheckError(format!("rank {} failed: {e}", r.rank))),
                None => Err(CheckError(format!("rank {} did not run", r.rank))),
            })
            .collect()
    }

    /// The errors of the ranks that failed, by rank.
    pub fn errors(&self) -> Vec<(usize, &Error)> {
        self.ranks
            .iter()
            .filter_map(|r| match &r.outcome {
                Some(Err(e)) => Some((r.rank, e)),
                _ => None,
            })
            .collect()
    }

    /// Checks that every span of every rank has the same trace id, and returns it.
    ///
    /// # Errors
    /// When there are no spans or more than one trace id.
    pub fn check_single_trace(&self) -> std::result::Result<TraceId, CheckError> {
        let mut ids: BTreeSet<String> = BTreeSet::new();
        let mut first = None;
        for r in &self.ranks {
            for s in &r.spans {
                let id = s.span_context.trace_id();
                first.get_or_insert(id);
                ids.insert(format!("{id} (rank {})", r.rank));
            }
        }
        let first = first.ok_or_else(|| CheckError("no spans were recorded".into()))?;
        let distinct: std::collections::HashSet<TraceId> = self
            .ranks
            .iter()
            .flat_map(|r| r.spans.iter().map(|s| s.span_context.trace_id()))
            .collect();
        if distinct.len() == 1 {
            Ok(first)
        } else {
            Err(CheckError(format!(
                "expected one trace id, found {}: {ids:?}",
                distinct.len()
            )))
        }
    }

    /// Checks that every span named `name` on `rank` (there must be at least one) links to a
    /// span named `src_name` on `src_rank`, with the link attribute
    /// `lens.link.source_rank = src_rank`.
    ///
    /// # Errors
    /// Naming the first span that does not.
    pub fn check_links(
        &self,
        rank: usize,
        name: &str,
        src_rank: usize,
        src_name: &str,
    ) -> std::result::Result<(), CheckError> {
        let sources: Vec<_> = self
            .named(src_rank, src_name)
            .into_iter()
            .map(|s| (s.span_context.trace_id(), s.span_context.span_id()))
            .collect();
        let spans = self.named(rank, name);
        if spans.is_empty() {
            return Err(CheckError(format!(
                "rank {rank} has no span named {name:?}"
            )));
        }
        let want_rank = Value::I64(i64::try_from(src_rank).unwrap_or(i64::MAX));
        for span in spans {
            let ok = span.links.iter().any(|link| {
                let sc = &link.span_context;
                sources.contains(&(sc.trace_id(), sc.span_id()))
                    && link
                        .attributes
                        .iter()
                        .any(|kv| kv.key.as_str() == LINK_SOURCE_RANK && kv.value == want_rank)
            });
            if !ok {
                return Err(CheckError(format!(
                    "rank {rank}'s span {name:?} ({}) does not link to a {src_name:?} span of rank {src_rank} \
                     with {LINK_SOURCE_RANK}={src_rank}; its links: {:?}",
                    span.span_context.span_id(),
                    span.links
                        .iter()
                        .map(|l| l.span_context.span_id().to_string())
                        .collect::<Vec<_>>()
                )));
            }
        }
        Ok(())
    }
}
