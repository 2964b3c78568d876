//! A certificate authority made on the spot, for TLS tests: a CA, a server certificate for
//! `localhost`, `127.0.0.1` and `::1`, and a client certificate, each written as a PEM file
//! in a directory of its own that is removed on drop.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A test certificate authority and what it signed.
///
/// ```
/// use lens_testkit::otlp::TestCa;
///
/// let ca = TestCa::new()?;
/// assert!(std::fs::read_to_string(ca.ca_file())?.contains("BEGIN CERTIFICATE"));
/// assert!(std::fs::read_to_string(ca.client_key_file())?.contains("PRIVATE KEY"));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
    server_cert_pem: String,
    server_key_pem: String,
    ca_pem: String,
}

fn other(e: rcgen::Error) -> io::Error {
    io::Error::other(e)
}

impl TestCa {
    /// A new CA with its server and client certificates, in a fresh temporary directory.
    ///
    /// # Errors
    /// When a key cannot be made or a file cannot be written.
    pub fn new() -> io::Result<TestCa> {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lens-test-ca-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;

        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(other)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "lens test CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(other)?)
            .map_err(other)?;

        let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose, cn: &str| {
            let mut p = CertificateParams::new(names).map_err(other)?;
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = vec![usage];
            let key = KeyPair::generate().map_err(other)?;
            let cert = p.signed_by(&key, &ca).map_err(other)?;
            Ok::<_, io::Error>((cert.pem(), key.serialize_pem()))
        };
        let (server_cert_pem, server_key_pem) = leaf(
            vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
            "lens test receiver",
        )?;
        let (client_cert_pem, client_key_pem) = leaf(
            vec!["lens-rank".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
            "lens test rank",
        )?;
        let ca_pem = ca.pem();
        let made = TestCa {
            dir,
            server_cert_pem,
            server_key_pem,
            ca_pem,
        };
        std::fs::write(made.ca_file(), &made.ca_pem)?;
        std::fs::write(made.client_cert_file(), client_cert_pem)?;
        std::fs::write(made.client_key_file(), client_key_pem)?;
        Ok(made)
    }

    /// The receiver's certificate and key (PEM).
    pub(super) fn server_identity(&self) -> (&str, &str) {
        (&self.server_cert_pem, &self.server_key_pem)
    }

    /// The CA's certificate (PEM text).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA's certificate (PEM): what a client trusts.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A client certificate signed by the CA (PEM), for mutual TLS.
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    /// The client certificate's private key (PEM).
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The rustls configuration of the HTTP receiver serving TLS with `ca`'s server
/// certificate, asking every client for a certificate signed by `ca` when `client_auth`.
pub(super) fn http_server_config(
    ca: &TestCa,
    client_auth: bool,
) -> io::Result<std::sync::Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |e: &dyn std::fmt::Display| io::Error::other(e.to_string());
    let (cert, key) = ca.server_identity();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&e))?;
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| bad(&e))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(std::sync::Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?;
    let builder = if client_auth {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca.ca_pem().as_bytes()) {
            roots.add(c.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .map_err(|e| bad(&e))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| bad(&e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(std::sync::Arc::new(config))
}
