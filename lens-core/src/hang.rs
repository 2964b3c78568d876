//! Where every rank was when a round timed out: a **`lens.hang`** span, emitted by each
//! live rank before the timeout error returns, so the backend shows where every rank was.
//!
//! Each of lens-core's broadcasts (and [`crate::blocking::broadcast`]) that fails with
//! [`Error::Timeout`] starts a span named [`keys::SPAN`] through the global tracer provider
//! (`opentelemetry::global`), as a child of the rank's current context, with
//! [`keys::ROUND`] (the round's number on this rank, where the backend counts rounds),
//! [`keys::MISSING_RANKS`] (with [`keys::MISSING_LAST_SEEN`] where the transport knows the
//! last round each took part in, and [`keys::VIA`] where another rank found them missing:
//! every rank names the root cause, not only the rank it waited for) and [`keys::RANK`], and one [`keys::OPEN_SPAN_EVENT`] event per
//! span still open in the process (its name and age), as far as an [`OpenSpans`] processor
//! has seen them. Then the flush hook ([`set_flush`]) runs, so the report is exported before
//! the error reaches the caller: lens-otlp's guard sets both up when it is made global
//! (`OtlpGuard::set_global`).
//!
//! ```
//! use lens_core::hang::OpenSpans;
//! use opentelemetry_sdk::trace::SdkTracerProvider;
//!
//! // Spans started on this provider are known to hang reports while they are open.
//! let provider = SdkTracerProvider::builder().with_span_processor(OpenSpans).build();
//! opentelemetry::global::set_tracer_provider(provider.clone());
//! let id = lens_core::hang::set_flush(Box::new(move || {
//!     let _ = provider.force_flush();
//! }));
//! // ... and when the provider shuts down:
//! lens_core::hang::clear_flush(id);
//! ```
//!
//! Limits: the open spans are the process's (in a process with several ranks, all of
//! theirs); at most [`MAX_OPEN`] are kept, and a report names at most [`MAX_EVENTS`], the
//! oldest first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

use opentelemetry::trace::{Span as _, SpanBuilder, SpanId, Status, Tracer as _};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};

use crate::broadcaster::Broadcaster;
use crate::error::Error;

/// The names of the report.
pub mod keys {
    /// The report's span.
    pub const SPAN: &str = "lens.hang";
    /// The number of the round that timed out on this rank (1 for its first round).
    pub const ROUND: &str = "lens.hang.round";
    /// The ranks the round waited for (an integer array).
    pub const MISSING_RANKS: &str = "lens.hang.missing_ranks";
    /// For each of [`MISSING_RANKS`], the last round the reporting rank knows it took part
    /// in (an integer array in the same order; 0: none yet, -1: the transport cannot tell).
    pub const MISSING_LAST_SEEN: &str = "lens.hang.missing_last_seen";
    /// Where the reporting rank learnt of [`MISSING_RANKS`] when another rank found them
    /// missing: the rank it waited for, then the rank that one waits for, and so on (an
    /// integer array; `[0]` reads "waiting for rank 0, which is waiting for the missing
    /// ranks"). Absent when the reporting rank found them missing itself.
    pub const VIA: &str = "lens.hang.via";
    /// The rank that reports.
    pub const RANK: &str = "lens.hang.rank";
    /// How long the round waited, in nanoseconds.
    pub const WAITED_NS: &str = "lens.hang.waited_ns";
    /// The event for each span still open, with [`SPAN_NAME`] and [`SPAN_AGE_NS`].
    pub const OPEN_SPAN_EVENT: &str = "lens.hang.open_span";
    /// The open span's name.
    pub const SPAN_NAME: &str = "lens.hang.span_name";
    /// How long the open span has been open, in nanoseconds.
    pub const SPAN_AGE_NS: &str = "lens.hang.span_age_ns";
}

/// Open spans kept at most; past it, new ones are not kept (a leak elsewhere must not grow
/// this without bound).
pub const MAX_OPEN: usize = 4096;
/// Open spans a report names at most, the oldest first.
pub const MAX_EVENTS: usize = 64;

type Flush = Box<dyn Fn() + Send + Sync>;

static OPEN: Mutex<Option<HashMap<SpanId, (String, SystemTime)>>> = Mutex::new(None);
static FLUSH: RwLock<Option<(u64, Flush)>> = RwLock::new(None);
static FLUSH_IDS: AtomicU64 = AtomicU64::new(1);

fn open() -> MutexGuard<'static, Option<HashMap<SpanId, (String, SystemTime)>>> {
    OPEN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A span processor that keeps the spans open in this process (name and start), for hang
/// reports (but the reports themselves). Add it to every provider whose open spans a report
/// should name. Cost: a copy of the span's data at its start (the SDK lends no cheaper view)
/// and a map entry.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenSpans;

impl SpanProcessor for OpenSpans {
    fn on_start(&self, span: &mut Span, _cx: &Context) {
        let Some(data) = span.exported_data() else {
            return; // not recording
        };
        if data.name == keys::SPAN {
            // Another rank's report, open for a moment in the same process: not what a
            // report is for.
            return;
        }
        let mut open = open();
        let map = open.get_or_insert_with(HashMap::new);
        if map.len() < MAX_OPEN {
            map.insert(
                data.span_context.span_id(),
                (data.name.into_owned(), data.start_time),
            );
        }
    }

    fn on_end(&self, span: SpanData) {
        if let Some(map) = open().as_mut() {
            map.remove(&span.span_context.span_id());
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: std::time::Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The spans open in this process now, oldest first: name and when each started.
pub fn open_spans() -> Vec<(String, SystemTime)> {
    let mut v: Vec<(String, SystemTime)> = open()
        .as_ref()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    v.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// Sets what runs after a report has ended, so that it is exported before the error
/// returns (a provider's `force_flush`), in place of any before; returns its id for
/// [`clear_flush`].
pub fn set_flush(flush: Flush) -> u64 {
    let id = FLUSH_IDS.fetch_add(1, Ordering::Relaxed);
    *FLUSH.write().unwrap_or_else(|e| e.into_inner()) = Some((id, flush));
    id
}

/// Removes the flush hook [`set_flush`] returned `id` for, unless another replaced it.
pub fn clear_flush(id: u64) {
    let mut flush = FLUSH.write().unwrap_or_else(|e| e.into_inner());
    if flush.as_ref().is_some_and(|(current, _)| *current == id) {
        *flush = None;
    }
}

fn as_i64(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

/// Reports `e` when it is a timeout (see the module docs); returns it unchanged.
pub(crate) fn on_error(b: &dyn Broadcaster, e: Error) -> Error {
    if let Error::Timeout {
        after,
        missing,
        last_seen,
        via,
    } = &e
    {
        report(b, after.as_nanos(), missing, last_seen, via);
    }
    e
}

fn ints(ranks: &[usize]) -> Value {
    Value::Array(
        ranks
            .iter()
            .map(|&r| as_i64(r))
            .collect::<Vec<i64>>()
            .into(),
    )
}

fn report(
    b: &dyn Broadcaster,
    waited_ns: u128,
    missing: &[usize],
    last_seen: &[(usize, u64)],
    via: &[usize],
) {
    let mut attributes = vec![
        KeyValue::new(keys::RANK, as_i64(b.rank())),
        KeyValue::new(keys::MISSING_RANKS, ints(missing)),
        KeyValue::new(keys::WAITED_NS, as_i64(waited_ns)),
    ];
    if !via.is_empty() {
        attributes.push(KeyValue::new(keys::VIA, ints(via)));
    }
    if !last_seen.is_empty() {
        let rounds: Vec<i64> = missing
            .iter()
            .map(|m| {
                last_seen
                    .iter()
                    .find(|(r, _)| r == m)
                    .map_or(-1, |&(_, round)| as_i64(round))
            })
            .collect();
        attributes.push(KeyValue::new(
            keys::MISSING_LAST_SEEN,
            Value::Array(rounds.into()),
        ));
    }
    if let Some(round) = b.rounds_started() {
        attributes.push(KeyValue::new(keys::ROUND, as_i64(round)));
    }
    // Taken before the report's own span opens.
    let open = open_spans();
    let tracer = opentelemetry::global::tracer("lens");
    let mut span = tracer.build_with_context(
        SpanBuilder::from_name(keys::SPAN).with_attributes(attributes),
        &Context::current(),
    );
    let now = SystemTime::now();
    for (name, started) in open.into_iter().take(MAX_EVENTS) {
        let age = now.duration_since(started).unwrap_or_default();
        span.add_event(
            keys::OPEN_SPAN_EVENT,
            vec![
                KeyValue::new(keys::SPAN_NAME, name),
                KeyValue::new(keys::SPAN_AGE_NS, as_i64(age.as_nanos())),
            ],
        );
    }
    span.set_status(Status::error(format!(
        "timed out {}waiting for rank(s) {missing:?}",
        crate::error::through(via)
    )));
    span.end();
    flush_now();
}

/// Runs the flush hook, if one is set.
fn flush_now() {
    if let Some((_, flush)) = FLUSH.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        flush();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{clear_flush, flush_now, set_flush};

    /// Two guards in turn: the later hook replaces the earlier, the earlier one's shutdown
    /// (its `clear_flush`) leaves the later in place, and after the later shuts down no
    /// hook runs (a report then flushes nothing that is gone).
    #[test]
    fn a_flush_hook_outlives_only_its_own_guard() {
        let (first, second) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let counter = |c: &Arc<AtomicUsize>| {
            let c = Arc::clone(c);
            Box::new(move || {
                c.fetch_add(1, Ordering::Relaxed);
            })
        };
        let a = set_flush(counter(&first));
        flush_now();
        let b = set_flush(counter(&second));
        clear_flush(a);
        flush_now();
        clear_flush(b);
        flush_now();
        assert_eq!(first.load(Ordering::Relaxed), 1);
        assert_eq!(second.load(Ordering::Relaxed), 1);
    }

    /// A report open at the moment another rank of the same process takes its list (two
    /// ranks timing out together) is not among the open spans; a span of the user's is.
    #[test]
    fn another_report_is_not_an_open_span() {
        use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(super::OpenSpans)
            .build();
        let tracer = provider.tracer("test");
        let mut report = tracer.start(super::keys::SPAN);
        let mut step = tracer.start("step of another_report_is_not_an_open_span");
        let names: Vec<String> = super::open_spans().into_iter().map(|(n, _)| n).collect();
        step.end();
        report.end();
        assert!(
            names
                .iter()
                .any(|n| n == "step of another_report_is_not_an_open_span"),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n == super::keys::SPAN), "{names:?}");
    }
}
