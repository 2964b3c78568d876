//! The environment variables lens-otlp reads. The `OTEL_*` ones are OpenTelemetry's own, with
//! the meaning the OTel specification gives them.

/// `grpc` or `http/protobuf` (the default): how spans are sent. `http/json` is refused.
pub const OTEL_EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
/// As [`OTEL_EXPORTER_OTLP_PROTOCOL`], for traces only; wins over it.
pub const OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
/// The receiver's base URL (`http://host:4317` for gRPC, `http://host:4318` for HTTP, to
/// which `/v1/traces` is added).
pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The full URL for traces, used as given; wins over [`OTEL_EXPORTER_OTLP_ENDPOINT`].
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// `service.name` of every rank's resource (read by the OpenTelemetry SDK).
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// Which ranks export: `all` (the default), `first-per-node`, `ranks:0,4,8` or
/// `fraction:0.25` (see [`crate::ExportRanks`]).
pub const LENS_OTLP_EXPORT_RANKS: &str = "LENS_OTLP_EXPORT_RANKS";
/// Seconds one export may take, and the bound on the guard's shutdown (default 10).
pub const LENS_OTLP_TIMEOUT: &str = "LENS_OTLP_TIMEOUT";
