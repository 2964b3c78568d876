//! Export over TLS to a real receiver (gRPC and HTTP/protobuf) serving a certificate from
//! a certificate authority the test makes: both transports, mutual TLS, gzip and headers
//! over TLS, receivers signed by another authority, async callers, and files that are
//! missing or unpaired.

use std::process::Command;
use std::time::Duration;

use lens_core::RankInfo;
use lens_otlp::{OtlpBuilder, Protocol, env};
use lens_testkit::otlp::{Receiver, TestCa};
use lens_testkit::process::Supervised;
use opentelemetry::trace::{Span as _, Tracer as _};

const PROTOCOLS: [Protocol; 2] = [Protocol::Grpc, Protocol::HttpProtobuf];

fn endpoint(r: &Receiver, p: Protocol) -> String {
    match p {
        Protocol::Grpc => r.grpc_endpoint(),
        _ => r.http_endpoint(),
    }
}

/// Ends `n` spans and shuts the guard down: `Ok` when every span was exported.
fn send(builder: OtlpBuilder, n: usize) -> Result<(), String> {
    let guard = builder
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    for _ in 0..n {
        guard.tracer("tls").start("over TLS").end();
    }
    guard.shutdown().map(|_| ()).map_err(|e| e.to_string())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The variables alone: an `https://` endpoint, the CA file, gzip and headers (one value
/// percent-encoded). Every span arrives, compressed, with the headers, on both transports.
#[test]
fn both_transports_export_over_tls_with_the_variables() {
    let ca = TestCa::new().expect("a CA");
    let receiver = Receiver::start_tls(&ca, false).expect("a TLS receiver");
    for protocol in PROTOCOLS {
        let before = receiver.spans().len();
        let url = endpoint(&receiver, protocol);
        assert!(url.starts_with("https://"), "{url}");
        let ca_file = ca.ca_file().display().to_string();
        let lookup = |k: &str| match k {
            env::OTEL_EXPORTER_OTLP_PROTOCOL => Some(protocol.as_str().to_owned()),
            env::OTEL_EXPORTER_OTLP_ENDPOINT => Some(url.clone()),
            env::OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE => Some(ca_file.clone()),
            env::OTEL_EXPORTER_OTLP_COMPRESSION => Some("gzip".to_owned()),
            env::OTEL_EXPORTER_OTLP_HEADERS => {
                Some("api-key=secret%20one,X-Tenant=lens".to_owned())
            }
            _ => None,
        };
        send(OtlpBuilder::from_vars(RankInfo::single(), lookup), 10)
            .unwrap_or_else(|e| panic!("{protocol} over TLS: {e}"));
        assert_eq!(
            receiver
                .wait_for(before + 10, Duration::from_secs(10))
                .len(),
            before + 10,
            "{protocol}"
        );
        let headers = receiver.last_headers();
        assert_eq!(
            header(&headers, "api-key"),
            ["secret one"],
            "{protocol}: {headers:?}"
        );
        assert_eq!(
            header(&headers, "x-tenant"),
            ["lens"],
            "{protocol}: {headers:?}"
        );
    }
    assert!(receiver.requests() >= 2);
    assert_eq!(receiver.compressed(), receiver.requests(), "gzip over TLS");
}

/// A receiver that requires client certificates takes spans only from a rank that shows
/// one signed by its authority (code setters); without one, the spans are lost and the
/// guard says so, on both transports.
#[test]
fn mutual_tls_needs_the_client_certificate() {
    let ca = TestCa::new().expect("a CA");
    for protocol in PROTOCOLS {
        let receiver = Receiver::start_tls(&ca, true).expect("a receiver requiring client certs");
        let builder = || {
            OtlpBuilder::new(RankInfo::single())
                .protocol(protocol)
                .endpoint(endpoint(&receiver, protocol))
                .certificate(ca.ca_file())
        };
        let refused = send(builder(), 3);
        assert!(
            refused.is_err(),
            "{protocol}: no client certificate, yet exported"
        );
        assert!(
            receiver.spans().is_empty(),
            "{protocol}: spans without a client certificate"
        );

        send(
            builder()
                .client_certificate(ca.client_cert_file())
                .client_key(ca.client_key_file()),
            3,
        )
        .unwrap_or_else(|e| panic!("{protocol} with a client certificate: {e}"));
        assert_eq!(
            receiver.wait_for(3, Duration::from_secs(10)).len(),
            3,
            "{protocol}"
        );
    }
}

/// A receiver whose certificate another authority signed is refused: with the wrong CA
/// file, and with the system's roots (which do not hold the test's authority). Spans are
/// lost and reported, nothing panics, nothing arrives.
#[test]
fn a_receiver_signed_by_another_authority_is_refused() {
    let ca = TestCa::new().expect("a CA");
    let stranger = TestCa::new().expect("another CA");
    let receiver = Receiver::start_tls(&ca, false).expect("a TLS receiver");
    for protocol in PROTOCOLS {
        let wrong_ca = OtlpBuilder::new(RankInfo::single())
            .protocol(protocol)
            .endpoint(endpoint(&receiver, protocol))
            .certificate(stranger.ca_file());
        assert!(
            send(wrong_ca, 2).is_err(),
            "{protocol}: the wrong CA was trusted"
        );
        let system = OtlpBuilder::new(RankInfo::single())
            .protocol(protocol)
            .endpoint(endpoint(&receiver, protocol));
        match send(system, 2) {
            Ok(()) => panic!("{protocol}: the system's roots trusted the test CA"),
            // A machine without a trust store says so, naming the variable to set.
            Err(e) if e.contains("ca-certificates") => {
                assert!(e.contains(env::OTEL_EXPORTER_OTLP_CERTIFICATE), "{e}");
            }
            Err(_) => {}
        }
    }
    assert!(receiver.spans().is_empty());
}

/// TLS files that cannot be used are `Error::Config` at build, naming the variable or
/// setter and the path: a missing file, a file without a certificate, a client certificate
/// without its key, and TLS files beside a plain `http://` endpoint.
#[test]
fn unusable_tls_files_are_named() {
    let ca = TestCa::new().expect("a CA");
    let not_pem = ca.dir().join("not.pem");
    std::fs::write(&not_pem, "not a certificate").expect("write");
    let missing = ca.dir().join("missing.pem");
    let https = "https://127.0.0.1:1";
    let rows: Vec<(&str, OtlpBuilder, Vec<String>)> = vec![
        (
            "a missing CA file (variable)",
            OtlpBuilder::from_vars(RankInfo::single(), |k| match k {
                env::OTEL_EXPORTER_OTLP_ENDPOINT => Some(https.to_owned()),
                env::OTEL_EXPORTER_OTLP_CERTIFICATE => Some(missing.display().to_string()),
                _ => None,
            }),
            vec![
                env::OTEL_EXPORTER_OTLP_CERTIFICATE.to_owned(),
                missing.display().to_string(),
            ],
        ),
        (
            "a CA file without a certificate (setter)",
            OtlpBuilder::new(RankInfo::single())
                .endpoint(https)
                .certificate(&not_pem),
            vec![
                "OtlpBuilder::certificate".to_owned(),
                not_pem.display().to_string(),
            ],
        ),
        (
            "a client certificate without its key",
            OtlpBuilder::from_vars(RankInfo::single(), |k| match k {
                env::OTEL_EXPORTER_OTLP_ENDPOINT => Some(https.to_owned()),
                env::OTEL_EXPORTER_OTLP_CERTIFICATE => Some(ca.ca_file().display().to_string()),
                env::OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE => {
                    Some(ca.client_cert_file().display().to_string())
                }
                _ => None,
            }),
            vec![
                env::OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE.to_owned(),
                env::OTEL_EXPORTER_OTLP_CLIENT_KEY.to_owned(),
            ],
        ),
        (
            "a key that is not a key",
            OtlpBuilder::new(RankInfo::single())
                .endpoint(https)
                .certificate(ca.ca_file())
                .client_certificate(ca.client_cert_file())
                .client_key(&not_pem),
            vec!["OtlpBuilder::client_key".to_owned()],
        ),
        (
            "a CA file beside an http:// endpoint",
            OtlpBuilder::from_vars(RankInfo::single(), |k| match k {
                env::OTEL_EXPORTER_OTLP_ENDPOINT => Some("http://127.0.0.1:1".to_owned()),
                env::OTEL_EXPORTER_OTLP_CERTIFICATE => Some(ca.ca_file().display().to_string()),
                _ => None,
            }),
            vec![
                env::OTEL_EXPORTER_OTLP_CERTIFICATE.to_owned(),
                "not https".to_owned(),
            ],
        ),
    ];
    for (why, builder, named) in rows {
        let err = builder.build().expect_err(why);
        assert!(
            matches!(err, lens_core::Error::Config { .. }),
            "{why}: {err}"
        );
        let err = err.to_string();
        for n in &named {
            assert!(
                err.contains(n.as_str()),
                "{why}: {err:?} does not name {n:?}"
            );
        }
    }
}

/// Built and used inside async code (both runtime flavours), an https gRPC or HTTP
/// exporter exports; nothing panics when the guard is dropped there either.
#[test]
fn https_export_works_inside_async_code() {
    let ca = TestCa::new().expect("a CA");
    let receiver = Receiver::start_tls(&ca, false).expect("a TLS receiver");
    let mut want = 0;
    for protocol in PROTOCOLS {
        for multi_thread in [true, false] {
            let rt = if multi_thread {
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
            } else {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
            }
            .expect("runtime");
            let builder = OtlpBuilder::new(RankInfo::single())
                .protocol(protocol)
                .endpoint(endpoint(&receiver, protocol))
                .certificate(ca.ca_file());
            rt.block_on(async { send(builder, 2) })
                .unwrap_or_else(|e| panic!("{protocol}, multi-thread {multi_thread}: {e}"));
            want += 2;
            assert_eq!(receiver.wait_for(want, Duration::from_secs(10)).len(), want);
        }
    }
}

/// opentelemetry-otlp reads `OTEL_EXPORTER_OTLP_HEADERS` from the process itself and lets
/// it win over code. lens sets the headers as requests leave: a header from code wins over
/// the process's value, and [`OtlpBuilder::from_vars`] with a lookup that has no headers
/// sends none of the process's. Run in a child process whose environment has the variable.
#[test]
fn headers_from_code_win_and_a_custom_lookup_is_the_only_source() {
    let from_env = Receiver::start().expect("receiver");
    let from_vars = Receiver::start().expect("receiver");
    for protocol in PROTOCOLS {
        let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
        cmd.args(["--exact", "headers_child", "--ignored", "--test-threads=1"])
            .env(
                env::OTEL_EXPORTER_OTLP_HEADERS,
                "api-key=from-env,x-env-only=1",
            )
            .env("LENS_TEST_PROTOCOL", protocol.as_str())
            .env("LENS_TEST_FROM_ENV", endpoint(&from_env, protocol))
            .env("LENS_TEST_FROM_VARS", endpoint(&from_vars, protocol))
            .env("LENS_TEST_CHILD", "1");
        // Killed at its deadline; its pipes drained as it runs.
        let done = Supervised::spawn(&mut cmd, Duration::from_secs(60))
            .expect("start the child")
            .wait();
        assert!(
            done.success() && done.stdout.contains("1 passed"),
            "{protocol}: {}",
            done.output()
        );

        let env_headers = from_env.last_headers();
        assert_eq!(
            header(&env_headers, "api-key"),
            ["from-code"],
            "{protocol}: {env_headers:?}"
        );
        assert_eq!(
            header(&env_headers, "x-env-only"),
            ["1"],
            "{protocol}: {env_headers:?}"
        );
        let vars_headers = from_vars.last_headers();
        assert_eq!(
            header(&vars_headers, "api-key"),
            ["from-code"],
            "{protocol}: {vars_headers:?}"
        );
        assert!(
            header(&vars_headers, "x-env-only").is_empty(),
            "{protocol}: {vars_headers:?}"
        );
    }
}

/// The child of `headers_from_code_win_and_a_custom_lookup_is_the_only_source`.
#[test]
#[ignore = "a child process of headers_from_code_win_and_a_custom_lookup_is_the_only_source, not a test on its own"]
fn headers_child() {
    assert_eq!(std::env::var("LENS_TEST_CHILD").as_deref(), Ok("1"));
    let var = |k: &str| std::env::var(k).expect(k);
    let protocol = Protocol::parse(&var("LENS_TEST_PROTOCOL")).expect("protocol");
    let from_env = OtlpBuilder::from_env(RankInfo::single())
        .protocol(protocol)
        .endpoint(var("LENS_TEST_FROM_ENV"))
        .header("API-Key", "from-code");
    send(from_env, 1).expect("export (from_env)");
    let from_vars = OtlpBuilder::from_vars(RankInfo::single(), |_| None)
        .protocol(protocol)
        .endpoint(var("LENS_TEST_FROM_VARS"))
        .header("api-key", "from-code");
    send(from_vars, 1).expect("export (from_vars)");
}

/// A header from code that is not a valid header is an error at build, not dropped.
#[test]
fn a_bad_header_from_code_is_an_error() {
    for (name, value) in [("bad name", "v"), ("ok", "line\nbreak")] {
        let err = OtlpBuilder::new(RankInfo::single())
            .header(name, value)
            .build()
            .expect_err("a bad header is refused");
        assert!(err.to_string().contains("OtlpBuilder::header"), "{err}");
    }
}
