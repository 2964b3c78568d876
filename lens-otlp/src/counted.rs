//! Counting what happens to each span, so the guard can say how many never arrived.
//!
//! The batch processor drops spans silently when its queue is full and an exporter's
//! failure reaches only the SDK's internal log; lens counts spans at both ends instead.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};

/// Counts shared by the processor, the exporter and the guard.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    ended: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Counts {
    pub(crate) fn stats(&self) -> ExportStats {
        ExportStats {
            ended: self.ended.load(Ordering::Acquire),
            exported: self.exported.load(Ordering::Acquire),
            failed: self.failed.load(Ordering::Acquire),
            last_error: self.last_error.lock().ok().and_then(|e| e.clone()),
        }
    }
}

/// What became of the spans one rank ended, as counted by lens.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ExportStats {
    /// Spans ended on this rank and handed to the batch processor.
    pub ended: u64,
    /// Spans the receiver accepted.
    pub exported: u64,
    /// Spans in batches the exporter gave up on (receiver down, refusing or too slow).
    pub failed: u64,
    /// The exporter's last error, if any.
    pub last_error: Option<String>,
}

impl ExportStats {
    /// Spans that did not reach the receiver: failed, dropped by a full queue, or still
    /// queued when shutdown gave up.
    pub fn lost(&self) -> u64 {
        self.ended.saturating_sub(self.exported)
    }
}

/// The batch processor, counting the spans it is handed.
#[derive(Debug)]
pub(crate) struct CountingProcessor<P> {
    pub(crate) inner: P,
    pub(crate) counts: Arc<Counts>,
}

impl<P: SpanProcessor> SpanProcessor for CountingProcessor<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.counts.ended.fetch_add(1, Ordering::AcqRel);
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.inner.shutdown()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting the spans of each batch by outcome.
#[derive(Debug)]
pub(crate) struct CountingExporter<E> {
    pub(crate) inner: E,
    pub(crate) counts: Arc<Counts>,
    /// Nanoseconds subtracted from every timestamp (this rank's clock offset from the
    /// reference rank's), so that the ranks line up in the backend; zero for none. Shared
    /// with the guard, which moves it when the offset is measured again.
    pub(crate) shift_ns: Arc<AtomicI64>,
}

/// `t` moved back by `ns` nanoseconds (forward when negative).
fn shifted(t: std::time::SystemTime, ns: i64) -> std::time::SystemTime {
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        t.checked_sub(d).unwrap_or(t)
    } else {
        t.checked_add(d).unwrap_or(t)
    }
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, mut batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        // One reading per batch: a batch is moved by one offset.
        let shift = self.shift_ns.load(Ordering::Relaxed);
        if shift != 0 {
            for s in &mut batch {
                s.start_time = shifted(s.start_time, shift);
                s.end_time = shifted(s.end_time, shift);
                for e in &mut s.events.events {
                    e.timestamp = shifted(e.timestamp, shift);
                }
            }
        }
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                self.counts.exported.fetch_add(n, Ordering::AcqRel);
            }
            Err(e) => {
                self.counts.failed.fetch_add(n, Ordering::AcqRel);
                tracing::warn!(spans = n, error = %e, "lens-otlp: a batch of spans was not exported");
                if let Ok(mut last) = self.counts.last_error.lock() {
                    *last = Some(e.to_string());
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.inner.shutdown()
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
