//! `tracing` spans into a rank's OTLP export, in one call.

use lens_otlp::OtlpGuard;
use opentelemetry_sdk::trace::SdkTracer;
use tracing_subscriber::registry::LookupSpan;

/// The `tracing` layer that records `tracing` spans through `guard`'s provider (its rank's
/// resource, its exporter, its loss counts), with instrumentation scope `name`. Features
/// `otlp` and `tracing`.
///
/// ```
/// use lens::otlp::OtlpBuilder;
/// use lens::testkit::otlp::Receiver;
/// use tracing_subscriber::layer::SubscriberExt as _;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let receiver = Receiver::start()?; // an OTLP receiver on 127.0.0.1, for this example
/// let guard = OtlpBuilder::new(lens::RankInfo::new(2, 4)?)
///     .endpoint(receiver.http_endpoint())
///     .build()?;
/// let subscriber = tracing_subscriber::registry().with(lens::otlp_layer(&guard, "trainer"));
/// tracing::subscriber::with_default(subscriber, || {
///     tracing::info_span!("train_step").in_scope(|| {});
/// });
/// guard.shutdown()?;
/// let spans = receiver.spans();
/// assert_eq!(spans[0].name, "train_step");
/// assert_eq!(spans[0].resource_int("nv.dl.rank"), Some(2));
/// # Ok(()) }
/// ```
pub fn otlp_layer<S>(
    guard: &OtlpGuard,
    name: &'static str,
) -> lens_tracing::tracing_opentelemetry::OpenTelemetryLayer<S, SdkTracer>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    lens_tracing::tracing_opentelemetry::layer().with_tracer(guard.tracer(name))
}
