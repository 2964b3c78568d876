//! Counting what happens to each span, so the guard can say how many never arrived.
//!
//! The batch processor drops spans silently when its queue is full and an exporter's
//! failure reaches only the SDK's internal log; lens counts spans at both ends instead.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};

use crate::clock::ClockShift;

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

/// The batch processor, counting the spans it is handed and moving each onto the
/// reference clock as it ends (where timestamps are corrected).
#[derive(Debug)]
pub(crate) struct CountingProcessor<P> {
    pub(crate) inner: P,
    pub(crate) counts: Arc<Counts>,
    pub(crate) clock: Option<Arc<ClockShift>>,
}

impl<P: SpanProcessor> SpanProcessor for CountingProcessor<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        self.counts.ended.fetch_add(1, Ordering::AcqRel);
        if let Some(clock) = &self.clock {
            clock.apply(&mut span);
        }
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
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
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
