//! TLS for `https://` endpoints on both transports (rustls with ring): which authorities the
//! receiver's certificate is checked against, and the certificate this rank shows (mutual
//! TLS), from code or `OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`, `…_CLIENT_CERTIFICATE`
//! and `…_CLIENT_KEY`.
//!
//! As the other OTel SDKs read it, a certificate file *replaces* the system's trust store
//! (a private collector's authority); without one the system's roots are used.

use std::path::PathBuf;
use std::sync::Arc;

use lens_core::{Error, Result};
use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A file and where it was named (a variable, or code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct File {
    pub(crate) path: PathBuf,
    pub(crate) from: &'static str,
}

/// The TLS files as configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// Authorities to trust instead of the system's.
    pub(crate) certificate: Option<File>,
    /// This rank's certificate chain (mutual TLS).
    pub(crate) client_certificate: Option<File>,
    /// Its private key.
    pub(crate) client_key: Option<File>,
}

impl TlsFiles {
    /// The files read and checked, for an `https://` endpoint.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable (or setter) and the path: a file that cannot
    /// be read or holds no certificate or key, a client certificate without its key or
    /// the other way round, no trusted authority at all (no system roots and no file).
    pub(crate) fn load(&self) -> Result<Tls> {
        let authorities = match &self.certificate {
            Some(f) => {
                let pem = read(f)?;
                let certs = certificates(f, &pem)?;
                Authorities::File { pem, certs }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                if found.certs.is_empty() {
                    return Err(Error::config(format!(
                        "an https:// endpoint needs trusted certificate authorities, and the \
                         system has none ({}): install the ca-certificates package, or name \
                         the receiver's authority in {}",
                        found
                            .errors
                            .first()
                            .map_or_else(|| "no certificate found".to_owned(), |e| e.to_string()),
                        crate::env::OTEL_EXPORTER_OTLP_CERTIFICATE
                    )));
                }
                Authorities::System(found.certs)
            }
        };
        let identity = match (&self.client_certificate, &self.client_key) {
            (None, None) => None,
            (Some(c), Some(k)) => {
                let cert_pem = read(c)?;
                let key_pem = read(k)?;
                let chain = certificates(c, &cert_pem)?;
                let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                    Error::config(format!(
                        "{}: {} holds no private key in PEM ({e})",
                        k.from,
                        k.path.display()
                    ))
                })?;
                Some(Client {
                    cert_pem,
                    key_pem,
                    chain,
                    key,
                })
            }
            (Some(one), None) | (None, Some(one)) => {
                return Err(Error::config(format!(
                    "{}: {} is set without its pair: mutual TLS needs both the client \
                     certificate and its key ({} and {})",
                    one.from,
                    one.path.display(),
                    crate::env::OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
                    crate::env::OTEL_EXPORTER_OTLP_CLIENT_KEY
                )));
            }
        };
        Ok(Tls {
            authorities,
            identity,
        })
    }

    /// The first file set, to name when the endpoint is not `https://`.
    pub(crate) fn first(&self) -> Option<&File> {
        self.certificate
            .as_ref()
            .or(self.client_certificate.as_ref())
            .or(self.client_key.as_ref())
    }
}

fn read(f: &File) -> Result<Vec<u8>> {
    std::fs::read(&f.path)
        .map_err(|e| Error::config(format!("{}: cannot read {}: {e}", f.from, f.path.display())))
}

fn certificates(f: &File, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            Error::config(format!(
                "{}: {} is not PEM certificates ({e})",
                f.from,
                f.path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(Error::config(format!(
            "{}: {} holds no certificate",
            f.from,
            f.path.display()
        )));
    }
    Ok(certs)
}

#[derive(Debug)]
enum Authorities {
    /// The system's trust store.
    System(Vec<CertificateDer<'static>>),
    /// A file's, instead.
    File {
        pem: Vec<u8>,
        certs: Vec<CertificateDer<'static>>,
    },
}

#[derive(Debug)]
struct Client {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

/// What TLS needs, read and checked.
#[derive(Debug)]
pub(crate) struct Tls {
    authorities: Authorities,
    identity: Option<Client>,
}

impl Tls {
    /// For the HTTP exporter's client.
    pub(crate) fn rustls_config(&self) -> Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        let certs = match &self.authorities {
            Authorities::System(certs) | Authorities::File { certs, .. } => certs,
        };
        // A system store may hold a certificate rustls cannot use; skip it as browsers do.
        let (_added, _skipped) = roots.add_parsable_certificates(certs.iter().cloned());
        if roots.is_empty() {
            return Err(Error::config(
                "none of the trusted certificates can be used by rustls",
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::config(format!("TLS: {e}")))?
            .with_root_certificates(roots);
        match &self.identity {
            None => Ok(builder.with_no_client_auth()),
            Some(c) => builder
                .with_client_auth_cert(c.chain.clone(), c.key.clone_key())
                .map_err(|e| {
                    Error::config(format!(
                        "the client certificate and key do not make an identity: {e}"
                    ))
                }),
        }
    }

    /// For the gRPC exporter's channel.
    pub(crate) fn tonic_config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        config = match &self.authorities {
            Authorities::System(_) => config.with_native_roots(),
            Authorities::File { pem, .. } => config.ca_certificate(Certificate::from_pem(pem)),
        };
        if let Some(c) = &self.identity {
            config = config.identity(Identity::from_pem(&c.cert_pem, &c.key_pem));
        }
        config
    }
}
