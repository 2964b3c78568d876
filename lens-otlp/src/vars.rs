//! Reading the specification's OTLP variables beyond protocol and endpoint, each once: the
//! traces variable first, then the generic one. A value that does not parse is kept as an
//! error naming the variable, for [`crate::OtlpBuilder::build`] to report unless code sets
//! that field.

use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use lens_core::Error;

use crate::env;
use crate::headers;
use crate::tls::{File, TlsFiles};

/// What the variables say; `None` where they say nothing.
#[derive(Debug, Default)]
pub(crate) struct Vars {
    pub(crate) timeout: Option<Duration>,
    pub(crate) insecure: Option<bool>,
    pub(crate) disabled: Option<bool>,
    pub(crate) gzip: Option<bool>,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) tls: TlsFiles,
    pub(crate) errors: Vec<(&'static str, Error)>,
}

/// The traces variable of a pair if set (not blank), else the generic one: its name and value.
fn first_set(
    lookup: &dyn Fn(&str) -> Option<String>,
    pair: [&'static str; 2],
) -> Option<(&'static str, String)> {
    pair.into_iter().find_map(|name| {
        lookup(name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (name, v))
    })
}

pub(crate) fn read(lookup: &dyn Fn(&str) -> Option<String>) -> Vars {
    let mut v = Vars::default();
    if let Some((name, text)) = first_set(
        lookup,
        [
            env::OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
            env::OTEL_EXPORTER_OTLP_TIMEOUT,
        ],
    ) {
        match text.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => v.timeout = Some(Duration::from_millis(ms)),
            _ => v.errors.push((
                name,
                Error::config(format!(
                    "{text:?} is not a whole, positive number of milliseconds"
                )),
            )),
        }
    }
    let boolean = |pair: [&'static str; 2], errors: &mut Vec<(&'static str, Error)>| {
        let (name, text) = first_set(lookup, pair)?;
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
    v.insecure = boolean(
        [
            env::OTEL_EXPORTER_OTLP_TRACES_INSECURE,
            env::OTEL_EXPORTER_OTLP_INSECURE,
        ],
        &mut v.errors,
    );
    v.disabled = boolean(
        [env::OTEL_SDK_DISABLED, env::OTEL_SDK_DISABLED],
        &mut v.errors,
    );
    if let Some((name, text)) = first_set(
        lookup,
        [
            env::OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
            env::OTEL_EXPORTER_OTLP_COMPRESSION,
        ],
    ) {
        match text.trim().to_ascii_lowercase().as_str() {
            "gzip" => v.gzip = Some(true),
            "none" => v.gzip = Some(false),
            _ => v.errors.push((
                name,
                Error::config(format!(
                    "compression {text:?} is not one lens-otlp has: gzip or none"
                )),
            )),
        }
    }
    if let Some((name, text)) = first_set(
        lookup,
        [
            env::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
            env::OTEL_EXPORTER_OTLP_HEADERS,
        ],
    ) {
        match headers::parse(name, &text) {
            Ok(h) => v.headers = h,
            Err(e) => v.errors.push((name, e)),
        }
    }
    let file = |pair: [&'static str; 2]| {
        first_set(lookup, pair).map(|(from, path)| File {
            path: PathBuf::from(path.trim()),
            from,
        })
    };
    v.tls = TlsFiles {
        certificate: file([
            env::OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE,
            env::OTEL_EXPORTER_OTLP_CERTIFICATE,
        ]),
        client_certificate: file([
            env::OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE,
            env::OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
        ]),
        client_key: file([
            env::OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY,
            env::OTEL_EXPORTER_OTLP_CLIENT_KEY,
        ]),
    };
    v
}
