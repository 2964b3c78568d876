//! Making the OTLP exporter once the settings are decided: the transport, TLS, compression,
//! headers and timeout, the same on gRPC and HTTP.

use std::time::Duration;

use lens_core::{Error, Result};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{
    Compression, SpanExporter, WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _,
};

use crate::endpoint::Protocol;
use crate::headers::Fixed;
use crate::tls::Tls;

/// Everything the exporter is made from.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) protocol: Protocol,
    pub(crate) url: String,
    pub(crate) timeout: Duration,
    pub(crate) gzip: bool,
    /// For an `https://` URL.
    pub(crate) tls: Option<Tls>,
    pub(crate) headers: Fixed,
}

/// The exporter, and for gRPC the runtime its channel lives on (owned by the guard).
pub(crate) fn make(s: Settings) -> Result<(SpanExporter, Option<tokio::runtime::Runtime>)> {
    let url = s.url.clone();
    let cannot = |e: opentelemetry_otlp::ExporterBuildError| {
        Error::transport("otlp", format!("cannot build the exporter for {url}"), e)
    };
    match s.protocol {
        Protocol::Grpc => {
            // tonic's channel runs on tokio: the guard owns a one-thread runtime for it, so
            // the application needs none.
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("lens-otlp-grpc")
                .enable_all()
                .build()
                .map_err(|e| Error::transport("otlp", "cannot start the gRPC runtime", e))?;
            let built = {
                let _enter = rt.enter();
                let mut b = SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(s.url.clone())
                    .with_timeout(s.timeout);
                if s.gzip {
                    b = b.with_compression(Compression::Gzip);
                }
                if let Some(tls) = &s.tls {
                    b = b.with_tls_config(tls.tonic_config());
                }
                if !s.headers.is_empty() {
                    let headers = s.headers;
                    b = b.with_interceptor(move |mut req: tonic::Request<()>| {
                        let mut map = std::mem::take(req.metadata_mut()).into_headers();
                        headers.apply(&mut map);
                        *req.metadata_mut() = tonic::metadata::MetadataMap::from_headers(map);
                        Ok(req)
                    });
                }
                b.build()
            };
            match built {
                Ok(exporter) => Ok((exporter, Some(rt))),
                Err(e) => {
                    // Dropping a runtime blocks until its threads end, which panics inside
                    // the caller's async code: let it go in the background.
                    rt.shutdown_background();
                    Err(cannot(e))
                }
            }
        }
        Protocol::HttpProtobuf => {
            let client = http_client(s.timeout, s.tls.as_ref(), s.headers)?;
            let mut b = SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(s.url.clone())
                .with_timeout(s.timeout)
                .with_http_client(client);
            if s.gzip {
                b = b.with_compression(Compression::Gzip);
            }
            Ok((b.build().map_err(cannot)?, None))
        }
    }
}

/// The HTTP exporter's client: reqwest's blocking client with lens's TLS configuration,
/// setting lens's headers on every request.
#[derive(Debug)]
struct ExportClient {
    inner: reqwest::blocking::Client,
    headers: Fixed,
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, mut request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        self.headers.apply(request.headers_mut());
        self.inner.send_bytes(request).await
    }
}

fn http_client(timeout: Duration, tls: Option<&Tls>, headers: Fixed) -> Result<ExportClient> {
    // Always a configuration of lens's own: reqwest has no crypto provider of its own here.
    let tls = match tls {
        Some(tls) => tls.rustls_config()?,
        None => rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config(format!("TLS: {e}")))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth(),
    };
    // The blocking client starts a runtime of its own: build it off the caller's thread,
    // which may be inside async code.
    let built = std::thread::Builder::new()
        .name("lens-otlp-http-client".into())
        .spawn(move || {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .tls_backend_preconfigured(tls)
                .build()
        })
        .map_err(|e| Error::transport("otlp", "cannot start a thread", e))?
        .join()
        .map_err(|_| Error::config("building the HTTP client panicked"))?
        .map_err(|e| Error::transport("otlp", "cannot build the HTTP client", e))?;
    Ok(ExportClient {
        inner: built,
        headers,
    })
}
