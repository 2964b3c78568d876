//! The rank's provider and the guard that flushes it and reports what was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lens_core::sample::StepSampler;
use lens_core::{Error, RankInfo, Result};
use opentelemetry::InstrumentationScope;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use crate::clock::ClockShift;
use crate::counted::{Counts, ExportStats};
use crate::endpoint::Protocol;

/// A rank's tracer provider, exporting over OTLP when this rank was chosen to.
///
/// Dropping it (or calling [`OtlpGuard::shutdown`]) flushes the queue within the shutdown
/// timeout and reports through `tracing` how many spans did not reach the receiver: an
/// `info` event when all did, a `warn` event naming the count and the last error when some
/// did not. [`OtlpGuard::shutdown`] also returns that count.
pub struct OtlpGuard {
    provider: SdkTracerProvider,
    info: RankInfo,
    counts: Arc<Counts>,
    runtime: Option<tokio::runtime::Runtime>,
    target: Option<(Protocol, String)>,
    shutdown_timeout: Duration,
    done: bool,
    /// The id of the hang-report flush this guard set ([`OtlpGuard::set_global`]); 0: none.
    hang_flush: AtomicU64,
    /// The offset exported spans are moved by, where timestamps are corrected.
    clock: Option<Arc<ClockShift>>,
    /// The step sampler in front of the export, with `OtlpBuilder::sample`.
    sampler: Option<StepSampler>,
}

impl std::fmt::Debug for OtlpGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpGuard")
            .field("rank", &self.info.rank)
            .field("target", &self.target)
            .field("stats", &self.counts.stats())
            .finish_non_exhaustive()
    }
}

impl OtlpGuard {
    pub(crate) fn new(
        provider: SdkTracerProvider,
        info: RankInfo,
        counts: Arc<Counts>,
        runtime: Option<tokio::runtime::Runtime>,
        target: Option<(Protocol, String)>,
        shutdown_timeout: Duration,
        clock: Option<Arc<ClockShift>>,
    ) -> Self {
        OtlpGuard {
            provider,
            info,
            counts,
            runtime,
            target,
            shutdown_timeout,
            done: false,
            hang_flush: AtomicU64::new(0),
            clock,
            sampler: None,
        }
    }

    /// With the step sampler in front of the export.
    pub(crate) fn with_sampler(mut self, sampler: Option<StepSampler>) -> Self {
        self.sampler = sampler;
        self
    }

    /// The step sampler in front of this rank's export, when rules were given
    /// (`OtlpBuilder::sample`, `LENS_SAMPLE`) and this rank exports: wrap the rank's group
    /// with it (`sampler.group(b)`).
    pub fn sampler(&self) -> Option<&StepSampler> {
        self.sampler.as_ref()
    }

    /// This rank's clock offset measured again (a `lens_core::ClockTracker` step, or
    /// `lens_core::measure_clock_offsets`): spans that end from now on are moved onto the
    /// reference clock by it; each span is moved as it ends, so one that ended before
    /// keeps the figure of its time, whenever its batch is sent. The resource keeps the
    /// offset given at build (`OtlpBuilder::clock_offset`): a provider's resource is fixed
    /// for its life, so a span moved by another figure carries it as its own
    /// `lens.clock.offset_ns` and `lens.clock.error_ns`. Does nothing where timestamps are
    /// not corrected (`OtlpBuilder::correct_timestamps(false)`).
    pub fn set_clock_offset(&self, clock: lens_core::ClockOffset) {
        if let Some(shift) = &self.clock {
            shift.set(clock);
        }
    }

    /// A tracer of this rank's provider.
    pub fn tracer(&self, name: &'static str) -> SdkTracer {
        self.provider.tracer(name)
    }

    /// A tracer with a full instrumentation scope.
    pub fn tracer_with_scope(&self, scope: InstrumentationScope) -> SdkTracer {
        self.provider.tracer_with_scope(scope)
    }

    /// The provider (cheap to clone; all clones share the exporter).
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Makes this provider the global one, for code that calls
    /// `opentelemetry::global::tracer(..)`. The guard still owns the shutdown. A round that
    /// times out then reports through it (`lens_core::hang`): the `lens.hang` span is
    /// flushed before the error returns, until the guard shuts down.
    pub fn set_global(&self) {
        opentelemetry::global::set_tracer_provider(self.provider.clone());
        let provider = self.provider.clone();
        let id = lens_core::hang::set_flush(Box::new(move || {
            if let Err(e) = provider.force_flush() {
                tracing::warn!(error = %e, "lens-otlp: the hang report was not flushed");
            }
        }));
        self.hang_flush.store(id, Ordering::Relaxed);
    }

    /// The rank this provider describes.
    pub fn rank_info(&self) -> &RankInfo {
        &self.info
    }

    /// Whether this rank sends its spans (see [`crate::ExportRanks`]).
    pub fn exporting(&self) -> bool {
        self.target.is_some()
    }

    /// The URL spans are sent to, when this rank exports.
    pub fn endpoint(&self) -> Option<&str> {
        self.target.as_ref().map(|(_, url)| url.as_str())
    }

    /// The protocol spans are sent with, when this rank exports.
    pub fn protocol(&self) -> Option<Protocol> {
        self.target.as_ref().map(|(p, _)| *p)
    }

    /// What became of this rank's spans so far.
    pub fn stats(&self) -> ExportStats {
        self.counts.stats()
    }

    /// Sends what is queued now and waits for it (bounded by the batch processor).
    ///
    /// # Errors
    /// [`Error::Export`] when spans ended so far have not all reached the receiver.
    pub fn force_flush(&self) -> Result<ExportStats> {
        let flushed = self.provider.force_flush();
        let stats = self.counts.stats();
        self.verdict(stats, flushed.err().map(|e| e.to_string()))
    }

    /// Flushes and shuts the provider down within the shutdown timeout, and says how many
    /// spans were lost. Spans ended after this are not recorded.
    ///
    /// # Errors
    /// [`Error::Export`] naming how many spans did not reach the receiver, and why.
    pub fn shutdown(mut self) -> Result<ExportStats> {
        self.finish()
    }

    fn finish(&mut self) -> Result<ExportStats> {
        self.done = true;
        let id = self.hang_flush.swap(0, Ordering::Relaxed);
        if id != 0 {
            lens_core::hang::clear_flush(id);
        }
        let shut = self.provider.shutdown_with_timeout(self.shutdown_timeout);
        // tonic's tasks stop with the runtime; never block here (we may be inside async code).
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        let stats = self.counts.stats();
        let outcome = self.verdict(stats, shut.err().map(|e| e.to_string()));
        match &outcome {
            Ok(stats) if self.exporting() => tracing::info!(
                rank = self.info.rank,
                exported = stats.exported,
                endpoint = self.endpoint().unwrap_or_default(),
                "lens-otlp: every span was exported"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(rank = self.info.rank, error = %e, "lens-otlp: spans were lost")
            }
        }
        outcome
    }

    fn verdict(&self, stats: ExportStats, sdk_error: Option<String>) -> Result<ExportStats> {
        if !self.exporting() || stats.lost() == 0 {
            return Ok(stats);
        }
        let mut reason = format!(
            "rank {}: {} of {} span(s) reached {}",
            self.info.rank,
            stats.exported,
            stats.ended,
            self.endpoint().unwrap_or_default()
        );
        if stats.failed > 0 {
            reason.push_str(&format!("; {} in failed exports", stats.failed));
        }
        if let Some(e) = &stats.last_error {
            reason.push_str(&format!("; last export error: {e}"));
        }
        if let Some(e) = sdk_error {
            reason.push_str(&format!("; flush: {e}"));
        }
        Err(Error::Export {
            lost: stats.lost(),
            reason,
        })
    }
}

impl Drop for OtlpGuard {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.finish();
        }
    }
}
