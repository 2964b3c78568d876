//! Configuring a rank's OTLP export: code first, then the standard variables.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use lens_core::backend::{EnvErrors, parse_timeout_secs};
use lens_core::sample::{LENS_SAMPLE, SampleRules, StepSampler};
use lens_core::{Error, RankInfo, Result};
use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfig, BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
    SpanExporter as SdkSpanExporter, TracerProviderBuilder,
};

use crate::clock::ClockShift;
use crate::counted::{CountingExporter, CountingProcessor, Counts};
use crate::endpoint::{Endpoint, Protocol, endpoint_from_vars, protocol_from, url_for};
use crate::env;
use crate::exporter::{self, Settings};
use crate::guard::OtlpGuard;
use crate::headers::Fixed;
use crate::resource::process_attributes;
use crate::select::ExportRanks;
use crate::tls::{File, TlsFiles};
use crate::vars;

/// Extra exporters for every span ([`OtlpBuilder::also_export_to`]).
struct AlsoExport(Vec<Box<dyn FnOnce(TracerProviderBuilder) -> TracerProviderBuilder + Send>>);

impl std::fmt::Debug for AlsoExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} extra exporter(s)", self.0.len())
    }
}

/// The key the protocol variables' error is kept under (either of the two variables).
const PROTOCOL: &str = "protocol";

/// The variables resource detection reads, as `lookup` has them.
fn detected(lookup: &dyn Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    crate::resource::DETECTED
        .iter()
        .filter_map(|k| lookup(k).map(|v| (*k, v)))
        .collect()
}

/// Default bound on one export and on the guard's shutdown.
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Headers on every request: the variables', then code's (which win by name).
    headers: Vec<(HeaderName, HeaderValue)>,
    /// TLS files for `https://` endpoints.
    tls: TlsFiles,
    /// This rank's measured clock offset, for the resource and the timestamps.
    clock: Option<lens_core::ClockOffset>,
    /// Whether exported timestamps are moved onto the reference clock (default on).
    correct_timestamps: bool,
    /// Whether the provider keeps its open spans for hang reports (default on).
    open_spans: bool,
    /// What resource detection reads (Slurm's ids, `CUDA_VISIBLE_DEVICES`, `HOSTNAME`), read
    /// when the builder is made: from the process, or from `from_vars`'s lookup.
    detect: Vec<(&'static str, String)>,
    /// A variable that did not parse, or that lens cannot honour; reported by `build`
    /// unless code set the field.
    env_errors: EnvErrors,
    /// The protocol the variables chose, when they chose one.
    env_protocol: Option<Protocol>,
    /// The step sampler's rules (off unless set, in code or by `LENS_SAMPLE`).
    sample: SampleRules,
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
            timeout: DEFAULT_EXPORT_TIMEOUT,
            shutdown_timeout: None,
            service_name: None,
            service_version: None,
            batch: None,
            resource: Vec::new(),
            also: AlsoExport(Vec::new()),
            insecure: false,
            disabled: false,
            gzip: false,
            headers: Vec::new(),
            tls: TlsFiles::default(),
            clock: None,
            open_spans: true,
            correct_timestamps: true,
            detect: detected(&|k| std::env::var(k).ok()),
            env_errors: EnvErrors::default(),
            env_protocol: None,
            sample: SampleRules::default(),
        }
    }

    /// A builder that reads the standard variables of [`crate::env`]: the protocol,
    /// endpoint, headers, timeout, compression, `INSECURE` and the TLS files
    /// (`OTEL_EXPORTER_OTLP_*`, the traces variable first), `OTEL_SDK_DISABLED`,
    /// `OTEL_SERVICE_NAME`, which ranks export (`LENS_OTLP_EXPORT_RANKS`),
    /// `LENS_OTLP_TIMEOUT` and the step sampler's `LENS_SAMPLE*` ([`OtlpBuilder::sample`]).
    /// The batch processor reads `OTEL_BSP_*`. A value that does not parse, or that lens
    /// cannot honour, is reported by [`OtlpBuilder::build`] naming the variable, unless code
    /// sets that field.
    pub fn from_env(info: RankInfo) -> Self {
        Self::from_vars(info, |k| std::env::var(k).ok())
    }

    /// [`OtlpBuilder::from_env`] with a custom lookup.
    pub fn from_vars(info: RankInfo, lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut b = Self::new(info);
        match protocol_from(None, &lookup) {
            Ok(p) => b.env_protocol = Some(p),
            Err(e) => b.env_errors.note_error(PROTOCOL, e),
        }
        b.endpoint = endpoint_from_vars(&lookup);
        b.service_name = lookup(env::OTEL_SERVICE_NAME).filter(|s| !s.trim().is_empty());
        if let Some(text) = lookup(env::LENS_OTLP_EXPORT_RANKS) {
            match ExportRanks::parse(&text) {
                Ok(r) => b.export_ranks = r,
                Err(e) => b.note(env::LENS_OTLP_EXPORT_RANKS, e),
            }
        }
        b.detect = detected(&lookup);
        let v = vars::read(&lookup);
        b.timeout = v.timeout.unwrap_or(b.timeout);
        b.insecure = v.insecure.unwrap_or(b.insecure);
        b.disabled = v.disabled.unwrap_or(b.disabled);
        b.gzip = v.gzip.unwrap_or(b.gzip);
        b.headers = v.headers;
        b.tls = v.tls;
        for (var, e) in v.errors {
            b.note(var, e);
        }
        if let Some(text) = lookup(env::LENS_OTLP_TIMEOUT) {
            match parse_timeout_secs(env::LENS_OTLP_TIMEOUT, &text) {
                Ok(t) => b.timeout = t,
                Err(e) => b.note(env::LENS_OTLP_TIMEOUT, e),
            }
        }
        match SampleRules::from_env_with(&lookup) {
            Ok(rules) => b.sample = rules,
            // The error names its variable already.
            Err(e) => b.env_errors.note_error(LENS_SAMPLE, e),
        }
        b
    }

    /// Keeps or drops each step whole on every rank ([`lens_core::sample`]): exported spans
    /// wait in a step sampler until their step is decided, and the guard's
    /// [`OtlpGuard::sampler`] wraps the rank's group (`sampler.group(b)`), whose
    /// trace-context broadcasts end the steps. Variables `LENS_SAMPLE`,
    /// `LENS_SAMPLE_MAX_SPANS`, `LENS_SAMPLE_MAX_BYTES`. Only the export waits: spans
    /// handed to [`OtlpBuilder::also_export_to`] pass as they end.
    pub fn sample(mut self, rules: SampleRules) -> Self {
        self.code_sets(&[LENS_SAMPLE]);
        self.sample = rules;
        self
    }

    /// Code set the field these variables configure: their errors no longer count.
    fn code_sets(&mut self, vars: &[&'static str]) {
        for var in vars {
            self.env_errors.clear(var);
        }
    }

    /// The variable `var` did not parse: kept (named) until code sets its field.
    fn note(&mut self, var: &'static str, e: Error) {
        self.env_errors.note_error(var, Error::config_of(var, e));
    }

    /// The protocol (`grpc` or `http/protobuf`); variable
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.env_errors.clear(PROTOCOL);
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

    /// A header on every export request (an API key, say), winning over a header of the
    /// same name from the variables `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else
    /// `OTEL_EXPORTER_OTLP_HEADERS`. A name or value that is not a valid header is an error
    /// at [`OtlpBuilder::build`].
    pub fn header(mut self, name: impl AsRef<str>, value: impl AsRef<str>) -> Self {
        let name = name.as_ref().trim().to_ascii_lowercase();
        let parsed = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| "name")
            .and_then(|n| {
                HeaderValue::from_str(value.as_ref())
                    .map(|v| (n, v))
                    .map_err(|_| "value")
            });
        match parsed {
            Ok((n, v)) => {
                self.headers.retain(|(have, _)| *have != n);
                self.headers.push((n, v));
            }
            Err(what) => self.env_errors.note(
                "OtlpBuilder::header",
                format!("OtlpBuilder::header: the {what} of header {name:?} is not valid"),
            ),
        }
        self
    }

    /// A PEM file of the certificate authorities to check the receiver's certificate
    /// against, instead of the system's (`https://` endpoints); variables
    /// `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`, else `OTEL_EXPORTER_OTLP_CERTIFICATE`.
    pub fn certificate(mut self, pem_file: impl Into<PathBuf>) -> Self {
        self.tls.certificate = Some(File {
            path: pem_file.into(),
            from: "OtlpBuilder::certificate",
        });
        self
    }

    /// A PEM file of this process's certificate chain, shown to receivers that require
    /// mutual TLS, with [`OtlpBuilder::client_key`]; variables
    /// `OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE`, else
    /// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`.
    pub fn client_certificate(mut self, pem_file: impl Into<PathBuf>) -> Self {
        self.tls.client_certificate = Some(File {
            path: pem_file.into(),
            from: "OtlpBuilder::client_certificate",
        });
        self
    }

    /// A PEM file of the private key of [`OtlpBuilder::client_certificate`]; variables
    /// `OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY`, else `OTEL_EXPORTER_OTLP_CLIENT_KEY`.
    pub fn client_key(mut self, pem_file: impl Into<PathBuf>) -> Self {
        self.tls.client_key = Some(File {
            path: pem_file.into(),
            from: "OtlpBuilder::client_key",
        });
        self
    }

    /// The bound on the guard's shutdown (flushing what is queued; no variable).
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

    /// This rank's clock against the job's reference rank
    /// ([`lens_core::measure_clock_offsets`]), as the resource attributes
    /// `lens.clock.offset_ns` and `lens.clock.error_ns`; exported spans' timestamps (start,
    /// end, events) are moved onto the reference clock by the offset, so the ranks line up in
    /// the backend, unless [`OtlpBuilder::correct_timestamps`] says not to. No variable: the
    /// offset is measured at run time.
    pub fn clock_offset(mut self, clock: lens_core::ClockOffset) -> Self {
        self.clock = Some(clock);
        self.resource.push(KeyValue::new(
            lens_core::clock::keys::OFFSET_NS,
            clock.offset_ns,
        ));
        self.resource.push(KeyValue::new(
            lens_core::clock::keys::ERROR_NS,
            i64::try_from(clock.error_ns).unwrap_or(i64::MAX),
        ));
        self
    }

    /// Whether exported timestamps are moved by the [`OtlpBuilder::clock_offset`] (default
    /// on; off keeps each rank's own clock, the offset still in the resource; no variable).
    pub fn correct_timestamps(mut self, on: bool) -> Self {
        self.correct_timestamps = on;
        self
    }

    /// Whether the provider keeps its open spans (`lens_core::hang::OpenSpans`), so that a
    /// hang report names what each rank was in when a round timed out (default on; the
    /// cost is a copy of each span's data at its start; no variable).
    pub fn track_open_spans(mut self, on: bool) -> Self {
        self.open_spans = on;
        self
    }

    /// More resource attributes, besides the rank's (the SDK adds those of
    /// `OTEL_RESOURCE_ATTRIBUTES`).
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
        self.env_errors.check()?;
        let protocol = self.protocol.or(self.env_protocol).unwrap_or_default();
        let timeout = lens_core::backend::check_timeout("OTLP export timeout", self.timeout)?;
        let shutdown_timeout = self.shutdown_timeout.unwrap_or(timeout);
        let exporting = !self.disabled && self.export_ranks.selects(&self.info)?;

        let mut resource = Resource::builder()
            .with_attributes(self.info.attributes())
            .with_attributes(process_attributes(&self.info, &|k| {
                self.detect
                    .iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| v.clone())
            }))
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
        if self.open_spans && !self.disabled {
            provider = provider.with_span_processor(lens_core::hang::OpenSpans);
        }
        for add in self.also.0 {
            provider = add(provider);
        }
        let counts = Arc::new(Counts::default());
        let clock = self
            .correct_timestamps
            .then(|| Arc::new(ClockShift::new(self.clock)));
        let mut runtime = None;
        let mut target = None;
        let mut sampler = None;
        if exporting {
            let url = url_for(self.endpoint.as_ref(), protocol, self.insecure)?;
            let tls = if url.starts_with("https://") {
                Some(self.tls.load()?)
            } else if let Some(f) = self.tls.first() {
                return Err(Error::config(format!(
                    "{}: {} is set, but the endpoint {url} is not https://",
                    f.from,
                    f.path.display()
                )));
            } else {
                None
            };
            let (exporter, rt) = exporter::make(Settings {
                protocol,
                url: url.clone(),
                timeout,
                gzip: self.gzip,
                tls,
                headers: Fixed::new(self.headers),
            })?;
            runtime = rt;
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
                clock: clock.clone(),
            };
            if self.sample.is_off() {
                provider = provider.with_span_processor(processor);
            } else {
                let s = StepSampler::new(self.sample, processor);
                provider = provider.with_span_processor(s.processor());
                sampler = Some(s);
            }
            target = Some((protocol, url));
        }
        Ok(OtlpGuard::new(
            provider.build(),
            self.info,
            counts,
            runtime,
            target,
            shutdown_timeout,
            clock,
        )
        .with_sampler(sampler))
    }
}
