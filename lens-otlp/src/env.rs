//! The environment variables lens-otlp reads. The `OTEL_*` ones are OpenTelemetry's own, with
//! the meaning the OTel specification gives them; a value lens cannot honour is an error
//! naming the variable, never ignored. The guide's configuration reference (`docs/guide/configuration.md`) lists them all.

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
/// Seconds one export may take, and the bound on the guard's shutdown (default 10). When
/// set, it wins over [`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`] and
/// [`OTEL_EXPORTER_OTLP_TIMEOUT`].
pub const LENS_OTLP_TIMEOUT: &str = "LENS_OTLP_TIMEOUT";
/// Milliseconds one export may take (the specification's unit).
pub const OTEL_EXPORTER_OTLP_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
/// As [`OTEL_EXPORTER_OTLP_TIMEOUT`], for traces only; wins over it.
pub const OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT";
/// `gzip` or `none` (the default): how export requests are compressed. Anything else is an
/// error naming this variable.
pub const OTEL_EXPORTER_OTLP_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_COMPRESSION";
/// As [`OTEL_EXPORTER_OTLP_COMPRESSION`], for traces only.
pub const OTEL_EXPORTER_OTLP_TRACES_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION";
/// `true`: a gRPC endpoint without a scheme is plain `http://`; `false` (the default): it
/// is `https://`.
pub const OTEL_EXPORTER_OTLP_INSECURE: &str = "OTEL_EXPORTER_OTLP_INSECURE";
/// As [`OTEL_EXPORTER_OTLP_INSECURE`], for traces only.
pub const OTEL_EXPORTER_OTLP_TRACES_INSECURE: &str = "OTEL_EXPORTER_OTLP_TRACES_INSECURE";
/// `true` (any case): no span is exported and the provider records nothing, while
/// broadcasts and links still work.
pub const OTEL_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
/// Request headers for every export, `name=value,name2=value2` with percent-encoded values
/// (an API key, a tenant). A header set in code wins over the same name here.
pub const OTEL_EXPORTER_OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
/// As [`OTEL_EXPORTER_OTLP_HEADERS`], for traces only; wins over it.
pub const OTEL_EXPORTER_OTLP_TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";
/// A PEM file of the certificate authorities that sign the receiver's certificate
/// (`https://` endpoints); it replaces the system's trust store, as in the other OTel SDKs.
pub const OTEL_EXPORTER_OTLP_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
/// As [`OTEL_EXPORTER_OTLP_CERTIFICATE`], for traces only; wins over it.
pub const OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE";
/// A PEM file of this process's certificate chain, for receivers that require mutual TLS;
/// needs [`OTEL_EXPORTER_OTLP_CLIENT_KEY`].
pub const OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE";
/// As [`OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`], for traces only; wins over it.
pub const OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE: &str =
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE";
/// A PEM file of the private key of [`OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`].
pub const OTEL_EXPORTER_OTLP_CLIENT_KEY: &str = "OTEL_EXPORTER_OTLP_CLIENT_KEY";
/// As [`OTEL_EXPORTER_OTLP_CLIENT_KEY`], for traces only; wins over it.
pub const OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY: &str = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY";
