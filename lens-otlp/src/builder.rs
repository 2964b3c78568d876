//! Configuring a rank's OTLP export: code first, then the standard variables.

use std::sync::Arc;
use std::time::Duration;

use lens_core::{Error, RankInfo, Result, parse_timeout_secs};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{
    Compression, SpanExporter, WithExportConfig, WithHttpConfig as _, WithTonicConfig as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfig, BatchConfigBuilder, BatchSpanProcessor, IdGenerator as _, RandomIdGenerator,
    Sampler, SdkTracerProvider, SpanExporter as SdkSpanExporter, TracerProviderBuilder,
};

use crate::counted::{CountingExporter, CountingProcessor, Counts};
use crate::endpoint::{Endpoint, Protocol, endpoint_from_vars, protocol_from, url_for};
use crate::env;
use crate::guard::OtlpGuard;
use crate::select::ExportRanks;

/// Extra exporters for every span ([`OtlpBuilder::also_export_to`]).
struct AlsoExport(Vec<Box<dyn FnOnce(TracerProviderBuilder) -> TracerProviderBuilder + Send>>);

impl std::fmt::Debug for AlsoExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} extra exporter(s)", self.0.len())
    }
}

/// The process's own resource attributes (semantic conventions): `host.name` (where the
/// kernel says), `process.pid`, and a `service.instance.id` unique per rank and per run:
/// the rank's (`<job id>/rank-<r>`) with `run-<16 hex digits>` chosen at random when the
/// provider is built, before the rank (`job-7/run-3f9c…/rank-2`), so a requeued job's
/// ranks are told apart from their earlier lives.
fn process_attributes(info: &RankInfo) -> Vec<KeyValue> {
    let run = RandomIdGenerator::default().new_span_id();
    let rank = format!("rank-{}", info.rank);
    let base = info.service_instance_id();
    let job = base.strip_suffix(&rank).unwrap_or("");
    let mut kvs = vec![
        KeyValue::new("process.pid", i64::from(std::process::id())),
        KeyValue::new(
            lens_core::rank::resource_keys::SERVICE_INSTANCE_ID,
            format!("{job}run-{run}/{rank}"),
        ),
    ];
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty());
    if let Some(host) = host {
        kvs.push(KeyValue::new("host.name", host));
    }
    kvs
}

/// Default bound on one export and on the guard's shutdown.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a rank's [`OtlpGuard`]: its tracer provider with the rank resource, an OTLP
/// exporter behind a batch processor when this rank exports, and the counts of what was lost.
///
/// Settings made in code win over the environment read by [`OtlpBuilder::from_env`].
#[derive(Debug)]
#[must_use]
pub struct OtlpBuilder {
    info: RankInfo,
    protocol: Option<Protocol>,
    endpoint: Option<Endpoint>,
    export_ranks: ExportRanks,
    timeout: Duration,
    shutdown_timeout: Option<Duration>,
    service_name: Option<String>,
    service_version: Option<String>,
    batch: Option<BatchConfig>,
    resource: Vec<KeyValue>,
    also: AlsoExport,
    /// A gRPC endpoint without a scheme is plain `http://`.
    insecure: bool,
    /// No export and no recording (`OTEL_SDK_DISABLED`).
    disabled: bool,
    /// Export requests are gzip-compressed (`OTEL_EXPORTER_OTLP_COMPRESSION`).
    gzip: bool,
    /// A variable that did not parse, or that lens cannot honour; reported by `build`
    /// unless code set the field.
    env_errors: Vec<(&'static str, Error)>,
    lookup_protocol: Option<Result<Protocol, String>>,
}

impl OtlpBuilder {
    /// A builder for `info`'s rank that reads no OTLP variable: protocol `http/protobuf`
    /// to `http://localhost:4318`, every rank exports. (The SDK still reads
    /// `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, as every OTel SDK does.)
    pub fn new(info: RankInfo) -> Self {
        OtlpBuilder {
            info,
            protocol: None,
            endpoint: None,
            export_ranks: ExportRanks::All,
            timeout: DEFAULT_TIMEOUT,
            shutdown_timeout: None,
            service_name: None,
            service_version: None,
            batch: None,
            resource: Vec::new(),
            also: AlsoExport(Vec::new()),
            insecure: false,
            disabled: false,
            gzip: false,
            env_errors: Vec::new(),
            lookup_protocol: Some(Ok(Protocol::default())),
        }
    }

    /// A builder that reads the standard variables of [`crate::env`]: the protocol,
    /// endpoint, timeout, compression and `INSECURE` (`OTEL_EXPORTER_OTLP_*`, the traces
    /// variable first), `OTEL_SDK_DISABLED`, `OTEL_SERVICE_NAME`, which ranks export
    /// (`LENS_OTLP_EXPORT_RANKS`) and `LENS_OTLP_TIMEOUT`. The batch processor reads
    /// `OTEL_BSP_*`. A value that does not parse, or that lens cannot honour (the TLS
    /// files), is reported by [`OtlpBuilder::build`] naming the variable, unless code sets
    /// that field.
    pub fn from_env(info: RankInfo) -> Self {
        Self::from_vars(info, |k| std::env::var(k).ok())
    }

    /// [`OtlpBuilder::from_env`] with a custom lookup.
    pub fn from_vars(info: RankInfo, lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut b = Self::new(info);
        b.lookup_protocol = Some(protocol_from(None, &lookup).map_err(|e| e.to_string()));
        b.endpoint = endpoint_from_vars(&lookup);
        b.service_name = lookup(env::OTEL_SERVICE_NAME).filter(|s| !s.trim().is_empty());
        if let Some(text) = lookup(env::LENS_OTLP_EXPORT_RANKS) {
            match ExportRanks::parse(&text) {
                Ok(r) => b.export_ranks = r,
                Err(e) => b.env_errors.push((env::LENS_OTLP_EXPORT_RANKS, e)),
            }
        }
        b.read_otlp_variables(&lookup);
        if let Some(text) = lookup(env::LENS_OTLP_TIMEOUT) {
            match parse_timeout_secs(env::LENS_OTLP_TIMEOUT, &text) {
                Ok(t) => b.timeout = t,
                Err(e) => b.env_errors.push((env::LENS_OTLP_TIMEOUT, e)),
            }
        }
        b
    }

    /// The specification's variables beyond protocol and endpoint: the timeout and the
    /// compression (the traces variable, then the generic one), `INSECURE`,
    /// `OTEL_SDK_DISABLED`, and the ones lens cannot honour yet (the TLS files), each an
    /// error naming it.
    fn read_otlp_variables(&mut self, lookup: &dyn Fn(&str) -> Option<String>) {
        let set = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        for name in [
            env::OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
            env::OTEL_EXPORTER_OTLP_TIMEOUT,
        ] {
            if let Some(text) = set(name) {
                match text.trim().parse::<u64>() {
                    Ok(ms) if ms > 0 => self.timeout = Duration::from_millis(ms),
                    _ => self.env_errors.push((
                        name,
                        Error::config(format!(
                            "{text:?} is not a whole, positive number of milliseconds"
                        )),
                    )),
                }
                break;
            }
        }
        let boolean = |name: &'static str, errors: &mut Vec<(&'static str, Error)>| {
            let text = set(name)?;
            match text.trim().to_ascii_lowercase().as_str() {
                "true" => Some(true),
                "false" => Some(false),
                _ => {
                    errors.push((
                        name,
                        Error::config(format!("{text:?} is not true or false")),
                    ));
                    None
                }
            }
        };
        if let Some(v) = boolean(
            env::OTEL_EXPORTER_OTLP_TRACES_INSECURE,
            &mut self.env_errors,
        )
        .or_else(|| boolean(env::OTEL_EXPORTER_OTLP_INSECURE, &mut self.env_errors))
        {
            self.insecure = v;
        }
        if let Some(v) = boolean(env::OTEL_SDK_DISABLED, &mut self.env_errors) {
            self.disabled = v;
        }
        for name in [
            env::OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
            env::OTEL_EXPORTER_OTLP_COMPRESSION,
        ] {
            if let Some(text) = set(name) {
                match text.trim().to_ascii_lowercase().as_str() {
                    "gzip" => self.gzip = true,
                    "none" => self.gzip = false,
                    _ => self.env_errors.push((
                        name,
                        Error::config(format!(
                            "compression {text:?} is not one lens-otlp has: gzip or none"
                        )),
                    )),
                }
                break;
            }
        }
        for name in env::TLS_VARIABLES {
            if set(name).is_some() {
                self.env_errors.push((
                    name,
                    Error::config(
                        "TLS is not built into lens-otlp yet, so this file cannot be used: \
                         send to a collector over http:// that forwards over TLS",
                    ),
                ));
            }
        }
    }

    /// Code set the field these variables configure: their errors no longer count.
    fn code_sets(&mut self, vars: &[&str]) {
        self.env_errors.retain(|(v, _)| !vars.contains(v));
    }

    /// The protocol (`grpc` or `http/protobuf`); variable
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = Some(protocol);
        self
    }

    /// The receiver's base URL, such as `http://collector:4317` (gRPC) or
    /// `http://collector:4318` (HTTP, which adds `/v1/traces`); variable
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, a full URL).
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(Endpoint::Base(url.into()));
        self
    }

    /// The full URL for traces, used as given (`http://collector:4318/v1/traces`; for gRPC
    /// the same as [`OtlpBuilder::endpoint`]); variable `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`.
    pub fn traces_endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(Endpoint::Traces(url.into()));
        self
    }

    /// Which ranks export; variable `LENS_OTLP_EXPORT_RANKS`.
    pub fn export_ranks(mut self, ranks: ExportRanks) -> Self {
        self.code_sets(&[env::LENS_OTLP_EXPORT_RANKS]);
        self.export_ranks = ranks;
        self
    }

    /// The bound on one export attempt and, unless [`OtlpBuilder::shutdown_timeout`] is
    /// set, on the guard's shutdown; variables `LENS_OTLP_TIMEOUT` (seconds), else
    /// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds,
    /// as the specification says); default 10 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.code_sets(&[
            env::LENS_OTLP_TIMEOUT,
            env::OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
            env::OTEL_EXPORTER_OTLP_TIMEOUT,
        ]);
        self.timeout = timeout;
        self
    }

    /// Whether a gRPC endpoint without a scheme is plain `http://`; variables
    /// `OTEL_EXPORTER_OTLP_TRACES_INSECURE`, else `OTEL_EXPORTER_OTLP_INSECURE`.
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.code_sets(&[
            env::OTEL_EXPORTER_OTLP_TRACES_INSECURE,
            env::OTEL_EXPORTER_OTLP_INSECURE,
        ]);
        self.insecure = insecure;
        self
    }

    /// No export at all, and a provider that records nothing (spans are non-recording;
    /// broadcasts and links still work); variable `OTEL_SDK_DISABLED`.
    pub fn disabled(mut self, disabled: bool) -> Self {
        self.code_sets(&[env::OTEL_SDK_DISABLED]);
        self.disabled = disabled;
        self
    }

    /// Whether export requests are gzip-compressed; variables
    /// `OTEL_EXPORTER_OTLP_TRACES_COMPRESSION`, else `OTEL_EXPORTER_OTLP_COMPRESSION`
    /// (`gzip` or `none`, the default).
    pub fn gzip(mut self, gzip: bool) -> Self {
        self.code_sets(&[
            env::OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
            env::OTEL_EXPORTER_OTLP_COMPRESSION,
        ]);
        self.gzip = gzip;
        self
    }

    /// The bound on the guard's shutdown (flushing what is queued).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = Some(timeout);
        self
    }

    /// `service.name`; variable `OTEL_SERVICE_NAME`.
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = Some(name.into());
        self
    }

    /// `service.version` (the version of the program, say its release or git commit); also
    /// from `OTEL_RESOURCE_ATTRIBUTES=service.version=…`, which code overrides.
    pub fn service_version(mut self, version: impl Into<String>) -> Self {
        self.service_version = Some(version.into());
        self
    }

    /// The batch processor's settings (queue size, delay, batch size); by default the
    /// SDK's, which read `OTEL_BSP_*`.
    pub fn batch_config(mut self, config: BatchConfig) -> Self {
        self.batch = Some(config);
        self
    }

    /// More resource attributes, besides the rank's.
    pub fn resource_attributes(mut self, attrs: impl IntoIterator<Item = KeyValue>) -> Self {
        self.resource.extend(attrs);
        self
    }

    /// Also hands every span of this rank, exporting or not, to `exporter` as it ends (a
    /// simple processor): for a local view of the spans beside the OTLP export, as
    /// `lens demo --otlp` keeps its waterfall.
    pub fn also_export_to<E: SdkSpanExporter + 'static>(mut self, exporter: E) -> Self {
        self.also.0.push(Box::new(move |b: TracerProviderBuilder| {
            b.with_simple_exporter(exporter)
        }));
        self
    }

    /// The provider and its guard. Nothing is sent until a span ends; a receiver that is
    /// down shows up as lost spans in the guard's report, not as an error here.
    ///
    /// # Errors
    /// [`Error::Config`] for a variable that did not parse, an export selection this rank
    /// cannot decide, or a bad endpoint; [`Error::Transport`] when the exporter cannot be
    /// built.
    pub fn build(self) -> Result<OtlpGuard> {
        if let Some((var, e)) = self.env_errors.into_iter().next() {
            return Err(Error::config(format!("{var}: {e}")));
        }
        let protocol = match (self.protocol, self.lookup_protocol) {
            (Some(p), _) => p,
            (None, Some(Ok(p))) => p,
            (None, Some(Err(e))) => return Err(Error::config(e)),
            (None, None) => Protocol::default(),
        };
        let timeout = lens_core::check_timeout("OTLP export timeout", self.timeout)?;
        let shutdown_timeout = self.shutdown_timeout.unwrap_or(timeout);
        let exporting = !self.disabled && self.export_ranks.selects(&self.info)?;

        let mut resource = Resource::builder()
            .with_attributes(self.info.attributes())
            .with_attributes(process_attributes(&self.info))
            .with_attributes(self.resource);
        if let Some(name) = self.service_name {
            resource = resource.with_service_name(name);
        }
        if let Some(version) = self.service_version {
            resource = resource.with_attribute(KeyValue::new("service.version", version));
        }
        let mut provider = SdkTracerProvider::builder().with_resource(resource.build());
        if self.disabled {
            // The specification's disabled SDK: nothing recorded, nothing exported. Spans
            // still carry a context, so broadcasts and links work.
            provider = provider.with_sampler(Sampler::AlwaysOff);
        }
        for add in self.also.0 {
            provider = add(provider);
        }
        let counts = Arc::new(Counts::default());
        let mut runtime = None;
        let mut target = None;
        if exporting {
            let url = url_for(self.endpoint.as_ref(), protocol, self.insecure)?;
            let exporter = match protocol {
                Protocol::Grpc => {
                    // tonic's channel runs on tokio: the guard owns a one-thread runtime for it,
                    // so the application needs none.
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(1)
                        .thread_name("lens-otlp-grpc")
                        .enable_all()
                        .build()
                        .map_err(|e| {
                            Error::transport("otlp", "cannot start the gRPC runtime", e)
                        })?;
                    let built = {
                        let _enter = rt.enter();
                        let b = SpanExporter::builder()
                            .with_tonic()
                            .with_endpoint(url.clone())
                            .with_timeout(timeout);
                        if self.gzip {
                            b.with_compression(Compression::Gzip).build()
                        } else {
                            b.build()
                        }
                    };
                    if built.is_ok() {
                        runtime = Some(rt);
                    } else {
                        // Dropping a runtime blocks until its threads end, which panics
                        // inside the caller's async code: let it go in the background.
                        rt.shutdown_background();
                    }
                    built
                }
                Protocol::HttpProtobuf => {
                    let b = SpanExporter::builder()
                        .with_http()
                        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                        .with_endpoint(url.clone())
                        .with_timeout(timeout);
                    if self.gzip {
                        b.with_compression(Compression::Gzip).build()
                    } else {
                        b.build()
                    }
                }
            }
            .map_err(|e| {
                Error::transport("otlp", format!("cannot build the exporter for {url}"), e)
            })?;
            let exporter = CountingExporter {
                inner: exporter,
                counts: Arc::clone(&counts),
            };
            let config = self
                .batch
                .unwrap_or_else(|| BatchConfigBuilder::default().build());
            let processor = CountingProcessor {
                inner: BatchSpanProcessor::new(exporter, config),
                counts: Arc::clone(&counts),
            };
            provider = provider.with_span_processor(processor);
            target = Some((protocol, url));
        }
        Ok(OtlpGuard::new(
            provider.build(),
            self.info,
            counts,
            runtime,
            target,
            shutdown_timeout,
        ))
    }
}
