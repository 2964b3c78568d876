//! Where spans go and how: the protocol and the receiver's URL, from code or the standard
//! `OTEL_EXPORTER_OTLP_*` variables.

use lens_core::{Error, Result};

use crate::env;

/// How spans are sent to the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Protocol {
    /// OTLP over gRPC (port 4317 by convention).
    Grpc,
    /// OTLP protobuf over HTTP POST to `/v1/traces` (port 4318): the OTel default.
    #[default]
    HttpProtobuf,
}

impl Protocol {
    /// Parses an `OTEL_EXPORTER_OTLP_PROTOCOL` value: `grpc` or `http/protobuf`, in any case.
    ///
    /// # Errors
    /// [`Error::Config`] for anything else; `http/json` is named as unsupported.
    pub fn parse(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "http/json" => Err(Error::config(
                "OTLP protocol http/json is not supported by lens: use grpc or http/protobuf",
            )),
            other => Err(Error::config(format!(
                "OTLP protocol {other:?} is not one of grpc, http/protobuf"
            ))),
        }
    }

    /// The receiver OTel SDKs send to when nothing is configured.
    pub fn default_endpoint(self) -> &'static str {
        match self {
            Protocol::Grpc => "http://localhost:4317",
            Protocol::HttpProtobuf => "http://localhost:4318",
        }
    }

    /// The spec's name of the protocol.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An endpoint as configured: a base URL (to which HTTP adds `/v1/traces`) or a full URL
/// for traces (used as given), as the OTel specification distinguishes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Base(String),
    Traces(String),
}

/// The protocol from code, else the traces variable, else the generic one, else the default.
pub(crate) fn protocol_from(
    code: Option<Protocol>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Protocol> {
    if let Some(p) = code {
        return Ok(p);
    }
    for name in [
        env::OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
        env::OTEL_EXPORTER_OTLP_PROTOCOL,
    ] {
        if let Some(v) = lookup(name).filter(|v| !v.trim().is_empty()) {
            return Protocol::parse(&v).map_err(|e| Error::config_of(name, e));
        }
    }
    Ok(Protocol::default())
}

/// The endpoint from the variables, when set (code overrides it later).
pub(crate) fn endpoint_from_vars(lookup: &dyn Fn(&str) -> Option<String>) -> Option<Endpoint> {
    let set = |name| lookup(name).filter(|v: &String| !v.trim().is_empty());
    set(env::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
        .map(Endpoint::Traces)
        .or_else(|| set(env::OTEL_EXPORTER_OTLP_ENDPOINT).map(Endpoint::Base))
}

/// The URL the exporter is given: gRPC takes the base; HTTP takes the full traces URL. A
/// gRPC endpoint without a scheme is `https://`, or `http://` when `insecure` (the OTLP
/// variable) says so.
pub(crate) fn url_for(
    endpoint: Option<&Endpoint>,
    protocol: Protocol,
    insecure: bool,
) -> Result<String> {
    let mut url = match (endpoint, protocol) {
        (Some(Endpoint::Traces(url)), _) => url.trim().to_owned(),
        (Some(Endpoint::Base(url)), Protocol::Grpc) => url.trim().to_owned(),
        (Some(Endpoint::Base(url)), Protocol::HttpProtobuf) => {
            format!("{}/v1/traces", url.trim().trim_end_matches('/'))
        }
        (None, Protocol::Grpc) => Protocol::Grpc.default_endpoint().to_owned(),
        (None, Protocol::HttpProtobuf) => format!("{}/v1/traces", protocol.default_endpoint()),
    };
    let schemeless = !url.contains("://");
    if protocol == Protocol::Grpc && schemeless && !url.is_empty() {
        // The specification: a gRPC endpoint without a scheme is TLS unless INSECURE says not.
        let scheme = if insecure { "http" } else { "https" };
        url = format!("{scheme}://{url}");
    }
    if !url.starts_with("http://") && !url.starts_with("https://") {
        return Err(Error::config(format!(
            "OTLP endpoint {url:?} is not an http:// or https:// URL"
        )));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_table() {
        use Endpoint::{Base, Traces};
        // (endpoint, protocol, insecure, the URL or an error, why)
        let rows: &[(Option<Endpoint>, Protocol, bool, Result<&str, ()>, &str)] = &[
            (
                None,
                Protocol::Grpc,
                false,
                Ok("http://localhost:4317"),
                "gRPC default",
            ),
            (
                None,
                Protocol::HttpProtobuf,
                false,
                Ok("http://localhost:4318/v1/traces"),
                "HTTP default",
            ),
            (
                Some(Base("http://h:4318/".into())),
                Protocol::HttpProtobuf,
                false,
                Ok("http://h:4318/v1/traces"),
                "HTTP adds the path once",
            ),
            (
                Some(Base("http://h:4317".into())),
                Protocol::Grpc,
                false,
                Ok("http://h:4317"),
                "gRPC keeps the base",
            ),
            (
                Some(Traces("http://h:9/x".into())),
                Protocol::HttpProtobuf,
                false,
                Ok("http://h:9/x"),
                "a traces URL is used as given",
            ),
            (
                Some(Base("h:4317".into())),
                Protocol::Grpc,
                false,
                Ok("https://h:4317"),
                "no scheme means TLS",
            ),
            (
                Some(Base("h:4317".into())),
                Protocol::Grpc,
                true,
                Ok("http://h:4317"),
                "no scheme and insecure: plain gRPC",
            ),
            (
                Some(Base("h:4318".into())),
                Protocol::HttpProtobuf,
                true,
                Err(()),
                "HTTP always needs a scheme",
            ),
            (
                Some(Base("https://h:4317".into())),
                Protocol::Grpc,
                false,
                Ok("https://h:4317"),
                "https gRPC",
            ),
            (
                Some(Traces("https://h:4318/v1/traces".into())),
                Protocol::HttpProtobuf,
                true,
                Ok("https://h:4318/v1/traces"),
                "https HTTP, insecure or not",
            ),
            (
                Some(Base("ftp://h:4318".into())),
                Protocol::HttpProtobuf,
                false,
                Err(()),
                "another scheme",
            ),
        ];
        for (endpoint, protocol, insecure, want, why) in rows {
            let got = url_for(endpoint.as_ref(), *protocol, *insecure).map_err(|_| ());
            assert_eq!(got.as_deref(), want.as_deref().map_err(|_| &()), "{why}");
        }
    }

    #[test]
    fn protocol_table() {
        let rows: &[(
            Option<Protocol>,
            &[(&str, &str)],
            Result<Protocol, ()>,
            &str,
        )] = &[
            (None, &[], Ok(Protocol::HttpProtobuf), "the OTel default"),
            (
                None,
                &[(env::OTEL_EXPORTER_OTLP_PROTOCOL, "grpc")],
                Ok(Protocol::Grpc),
                "generic variable",
            ),
            (
                None,
                &[
                    (env::OTEL_EXPORTER_OTLP_PROTOCOL, "grpc"),
                    (env::OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "http/protobuf"),
                ],
                Ok(Protocol::HttpProtobuf),
                "the traces variable wins",
            ),
            (
                Some(Protocol::Grpc),
                &[(env::OTEL_EXPORTER_OTLP_PROTOCOL, "http/protobuf")],
                Ok(Protocol::Grpc),
                "code wins",
            ),
            (
                None,
                &[(env::OTEL_EXPORTER_OTLP_PROTOCOL, "http/json")],
                Err(()),
                "JSON is refused",
            ),
            (
                None,
                &[(env::OTEL_EXPORTER_OTLP_PROTOCOL, "udp")],
                Err(()),
                "unknown",
            ),
            (
                None,
                &[(env::OTEL_EXPORTER_OTLP_PROTOCOL, "GRPC")],
                Ok(Protocol::Grpc),
                "any case, as opentelemetry-otlp reads it",
            ),
            (
                None,
                &[(env::OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, " HTTP/Protobuf ")],
                Ok(Protocol::HttpProtobuf),
                "any case, trimmed",
            ),
        ];
        for (code, vars, want, why) in rows {
            let lookup = |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            };
            let got = protocol_from(*code, &lookup).map_err(|_| ());
            assert_eq!(&got, want, "{why}");
        }
    }
}
