//! OTLP/HTTP protobuf: a small HTTP/1.1 server that decodes `ExportTraceServiceRequest`
//! posted to `/v1/traces` with the official definitions.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;

use super::{Store, Via};

/// Bound on one request body: far above any batch a test sends.
const MAX_BODY: usize = 64 << 20;
/// An idle keep-alive connection is closed after this.
const IDLE: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(super) struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves plain HTTP, or HTTPS with `tls`.
    pub(super) fn start(
        store: Arc<Store>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<Server> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let accept = std::thread::Builder::new()
            .name("otlp-http-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stopping.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let store = Arc::clone(&store);
                    let tls = tls.clone();
                    let _ = std::thread::Builder::new()
                        .name("otlp-http-conn".into())
                        .spawn(move || {
                            let _ = serve_conn(conn, &store, tls);
                        });
                }
            })?;
        Ok(Server {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// Serves one connection, over TLS when `tls` is given (a failed handshake ends it).
fn serve_conn(
    conn: TcpStream,
    store: &Store,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IDLE))?;
    match tls {
        None => serve(conn, store),
        Some(config) => {
            let session = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
            serve(rustls::StreamOwned::new(session, conn), store)
        }
    }
}

/// Serves requests on one connection until the peer closes it or stays idle.
fn serve<S: Read + Write>(conn: S, store: &Store) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        let mut close = false;
        let mut gzip = false;
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
                headers.push((name.clone(), value.to_owned()));
                if name == "content-length" {
                    length = value.parse().unwrap_or(usize::MAX);
                } else if name == "content-encoding" {
                    gzip = value.eq_ignore_ascii_case("gzip");
                } else if name == "connection" && value.eq_ignore_ascii_case("close") {
                    close = true;
                }
            }
        }
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if length > MAX_BODY {
            respond(reader.get_mut(), "413 Payload Too Large", &[])?;
            return Ok(());
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        store.note_headers(headers);
        let out = reader.get_mut();
        if gzip {
            store.note_compressed();
            let mut plain = Vec::new();
            let inflated = flate2::read::GzDecoder::new(body.as_slice())
                .take(MAX_BODY as u64)
                .read_to_end(&mut plain);
            if inflated.is_err() {
                respond(out, "400 Bad Request", &[])?;
                continue;
            }
            body = plain;
        }
        if method != "POST" || path != "/v1/traces" {
            respond(out, "404 Not Found", &[])?;
        } else {
            match ExportTraceServiceRequest::decode(body.as_slice()) {
                Err(_) => respond(out, "400 Bad Request", &[])?,
                Ok(req) => {
                    if store.take(Via::Http, &req.resource_spans) {
                        let reply = ExportTraceServiceResponse {
                            partial_success: None,
                        }
                        .encode_to_vec();
                        respond(out, "200 OK", &reply)?;
                    } else {
                        respond(out, "503 Service Unavailable", &[])?;
                    }
                }
            }
        }
        if close {
            return Ok(());
        }
    }
}

fn respond(out: &mut impl Write, status: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    out.write_all(head.as_bytes())?;
    out.write_all(body)?;
    out.flush()
}
