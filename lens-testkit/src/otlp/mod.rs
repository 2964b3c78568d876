//! A real OTLP trace receiver for tests: gRPC (the `opentelemetry-proto` service) and
//! HTTP/protobuf at `/v1/traces`, both on 127.0.0.1 with ephemeral ports, decoding with the
//! official protobuf definitions. It can be told to refuse or to answer slowly.
//!
//! ```
//! use lens_testkit::otlp::Receiver;
//!
//! let receiver = Receiver::start()?;
//! assert!(receiver.grpc_endpoint().starts_with("http://127.0.0.1:"));
//! assert!(receiver.spans().is_empty());
//! # Ok::<(), std::io::Error>(())
//! ```

mod http;
mod span;
mod tls;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;

pub use span::{ReceivedLink, ReceivedSpan, Value, Via};
pub use tls::TestCa;

/// What the receiver holds, shared with its servers.
#[derive(Debug, Default)]
struct Store {
    spans: Mutex<Vec<ReceivedSpan>>,
    arrived: Condvar,
    requests: AtomicU64,
    refused: AtomicU64,
    compressed: AtomicU64,
    refusing: AtomicBool,
    delay_ms: AtomicU64,
    /// The last request's headers (gRPC metadata), names lowercased.
    headers: Mutex<Vec<(String, String)>>,
}

impl Store {
    fn note_headers(&self, headers: Vec<(String, String)>) {
        if let Ok(mut h) = self.headers.lock() {
            *h = headers;
        }
    }

    /// A request arrived gzip-compressed.
    fn note_compressed(&self) {
        self.compressed.fetch_add(1, Ordering::AcqRel);
    }

    /// Waits as told, then takes the request (`true`) or refuses it (`false`).
    fn take(&self, via: Via, request: &[ResourceSpans]) -> bool {
        let delay = self.delay_ms.load(Ordering::Acquire);
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        self.requests.fetch_add(1, Ordering::AcqRel);
        if self.refusing.load(Ordering::Acquire) {
            self.refused.fetch_add(1, Ordering::AcqRel);
            return false;
        }
        let spans = span::flatten(via, request);
        if let Ok(mut all) = self.spans.lock() {
            all.extend(spans);
        }
        self.arrived.notify_all();
        true
    }
}

#[derive(Debug)]
struct Grpc(Arc<Store>);

#[async_trait::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let store = Arc::clone(&self.0);
        store.note_headers(
            request
                .metadata()
                .clone()
                .into_headers()
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
        );
        if request
            .metadata()
            .get("grpc-encoding")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"))
        {
            store.note_compressed();
        }
        let request = request.into_inner();
        // The delay sleeps a thread: keep it off the runtime's workers.
        let taken =
            tokio::task::spawn_blocking(move || store.take(Via::Grpc, &request.resource_spans))
                .await
                .unwrap_or(false);
        if taken {
            Ok(tonic::Response::new(ExportTraceServiceResponse {
                partial_success: None,
            }))
        } else {
            Err(tonic::Status::unavailable("the test receiver is refusing"))
        }
    }
}

/// An OTLP receiver on 127.0.0.1 (gRPC and HTTP), stopped on drop.
#[derive(Debug)]
pub struct Receiver {
    /// `http` or `https`.
    scheme: &'static str,
    store: Arc<Store>,
    grpc: SocketAddr,
    http: http::Server,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    /// Starts both servers on ephemeral ports.
    ///
    /// # Errors
    /// When a port cannot be bound or the runtime cannot start.
    pub fn start() -> std::io::Result<Receiver> {
        Self::start_with(None)
    }

    /// Starts both servers serving TLS with `ca`'s server certificate (for `localhost`,
    /// `127.0.0.1` and `::1`); with `client_auth`, a client must show a certificate signed
    /// by `ca` (mutual TLS), or its handshake fails. The endpoints are `https://`.
    ///
    /// # Errors
    /// As [`Receiver::start`], and when the TLS configuration cannot be made.
    pub fn start_tls(ca: &TestCa, client_auth: bool) -> std::io::Result<Receiver> {
        Self::start_with(Some((ca, client_auth)))
    }

    fn start_with(tls: Option<(&TestCa, bool)>) -> std::io::Result<Receiver> {
        let store = Arc::new(Store::default());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("otlp-receiver")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let grpc = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let incoming = {
            let _enter = runtime.enter();
            tonic::transport::server::TcpIncoming::from(tokio::net::TcpListener::from_std(
                listener,
            )?)
        };
        // Collectors compress by default (rotel, the OTel Collector): take gzip as they do.
        let service = TraceServiceServer::new(Grpc(Arc::clone(&store)))
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        let mut server = tonic::transport::Server::builder();
        if let Some((ca, client_auth)) = tls {
            use tonic::transport::{Certificate, Identity, ServerTlsConfig};
            let (cert, key) = ca.server_identity();
            let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
            if client_auth {
                config = config.client_ca_root(Certificate::from_pem(ca.ca_pem()));
            }
            server = server.tls_config(config).map_err(std::io::Error::other)?;
        }
        runtime.spawn(async move {
            let served = server
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "test OTLP receiver: gRPC server stopped");
            }
        });
        let http_tls = match tls {
            Some((ca, client_auth)) => Some(tls::http_server_config(ca, client_auth)?),
            None => None,
        };
        let http = http::Server::start(Arc::clone(&store), http_tls)?;
        Ok(Receiver {
            scheme: if tls.is_some() { "https" } else { "http" },
            store,
            grpc,
            http,
            runtime: Some(runtime),
            stop: Some(stop),
        })
    }

    /// The gRPC endpoint, `http://127.0.0.1:PORT` (`https://` when serving TLS).
    pub fn grpc_endpoint(&self) -> String {
        format!("{}://{}", self.scheme, self.grpc)
    }

    /// The HTTP base URL, `http://127.0.0.1:PORT` (`https://` when serving TLS; exporters
    /// add `/v1/traces`).
    pub fn http_endpoint(&self) -> String {
        format!("{}://{}", self.scheme, self.http.addr())
    }

    /// The endpoint of the server that takes `via`: [`Receiver::grpc_endpoint`] or
    /// [`Receiver::http_endpoint`].
    pub fn endpoint(&self, via: Via) -> String {
        match via {
            Via::Grpc => self.grpc_endpoint(),
            Via::Http => self.http_endpoint(),
        }
    }

    /// The gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// The HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http.addr()
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store
            .spans
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Waits until at least `n` spans arrived or `timeout` passed; returns what arrived.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        let Ok(mut spans) = self.store.spans.lock() else {
            return Vec::new();
        };
        while spans.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.store.arrived.wait_timeout(spans, left) {
                Ok((s, _)) => spans = s,
                Err(_) => return Vec::new(),
            }
        }
        spans.clone()
    }

    /// Export requests received (taken or refused), over both protocols.
    pub fn requests(&self) -> u64 {
        self.store.requests.load(Ordering::Acquire)
    }

    /// Export requests that arrived gzip-compressed, over both protocols.
    pub fn compressed(&self) -> u64 {
        self.store.compressed.load(Ordering::Acquire)
    }

    /// The headers of the last export request (gRPC metadata), names lowercased, in the
    /// order they came.
    pub fn last_headers(&self) -> Vec<(String, String)> {
        self.store
            .headers
            .lock()
            .map(|h| h.clone())
            .unwrap_or_default()
    }

    /// Export requests refused.
    pub fn refused(&self) -> u64 {
        self.store.refused.load(Ordering::Acquire)
    }

    /// Refuse every export from now on (gRPC `UNAVAILABLE`, HTTP 503), or stop refusing.
    pub fn set_refusing(&self, refusing: bool) {
        self.store.refusing.store(refusing, Ordering::Release);
    }

    /// Answer every export only after `delay` (a slow receiver).
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.store.delay_ms.store(ms, Ordering::Release);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// A port on 127.0.0.1 where nothing listens (bound, then released): for "receiver down".
///
/// # Errors
/// When no port can be bound.
pub fn closed_port_endpoint() -> std::io::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    drop(l);
    Ok(format!("http://{addr}"))
}
