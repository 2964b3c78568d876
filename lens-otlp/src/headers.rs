//! Headers sent with every export request (an API key, a tenant): from code or
//! `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`, the same on both transports.
//!
//! opentelemetry-otlp also reads those variables from the process environment and lets
//! them win over headers given in code. So that code wins and a custom lookup
//! ([`crate::OtlpBuilder::from_vars`]) is the only source, lens sets the headers itself as
//! each request leaves: the names the process's variables give are removed, then lens's
//! headers are inserted.

use http::{HeaderMap, HeaderName, HeaderValue};
use lens_core::{Error, Result};

use crate::env;

/// Parses the specification's format, `key=value,key2=value2`, each value percent-encoded
/// (`%20` is a space). Names are lowercased (gRPC metadata and HTTP/2 want them so).
///
/// # Errors
/// [`Error::Config`] naming `var` for an entry without `=`, an empty or invalid name, or a
/// value that is not a valid header value once decoded.
pub(crate) fn parse(var: &str, text: &str) -> Result<Vec<(HeaderName, HeaderValue)>> {
    let mut out = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, value)) = entry.split_once('=') else {
            return Err(Error::config_for(
                var,
                format!("{var}: {entry:?} is not name=value"),
            ));
        };
        let name = HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
            .map_err(|_| Error::config(format!("{var}: {:?} is not a header name", name.trim())))?;
        let decoded = percent_decode(value.trim()).ok_or_else(|| {
            Error::config(format!("{var}: the value of {name} has a bad %-escape"))
        })?;
        let value = HeaderValue::from_bytes(&decoded).map_err(|_| {
            Error::config(format!(
                "{var}: the value of {name} is not a valid header value"
            ))
        })?;
        out.push((name, value));
    }
    Ok(out)
}

/// `%XX` escapes decoded; `None` for a `%` not followed by two hex digits.
fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Exactly these headers on every request, whatever opentelemetry-otlp read from the process.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fixed {
    /// Names opentelemetry-otlp adds from the process's variables.
    from_process: Vec<HeaderName>,
    /// lens's headers.
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Fixed {
    pub(crate) fn new(headers: Vec<(HeaderName, HeaderValue)>) -> Fixed {
        // opentelemetry-otlp reads the traces variable, else the generic one; it skips
        // entries it cannot parse, so a loose reading finds every name it may have added.
        let text = [
            env::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
            env::OTEL_EXPORTER_OTLP_HEADERS,
        ]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .unwrap_or_default();
        let from_process = text
            .split(',')
            .filter_map(|e| e.split_once('='))
            .filter_map(|(n, _)| {
                HeaderName::from_bytes(n.trim().to_ascii_lowercase().as_bytes()).ok()
            })
            .collect();
        Fixed {
            from_process,
            headers,
        }
    }

    /// Whether requests need touching at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.from_process.is_empty() && self.headers.is_empty()
    }

    pub(crate) fn apply(&self, map: &mut HeaderMap) {
        for name in &self.from_process {
            map.remove(name);
        }
        for (name, value) in &self.headers {
            map.insert(name.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_table() {
        // (text, the headers or None for an error, why)
        let rows: &[(&str, Option<&[(&str, &str)]>, &str)] = &[
            ("", Some(&[]), "empty"),
            (
                "api-key=secret",
                Some(&[("api-key", "secret")]),
                "one header",
            ),
            (
                " A=1 , b = two ",
                Some(&[("a", "1"), ("b", "two")]),
                "trimmed, names lowercased",
            ),
            (
                "authorization=Bearer%20tok%3Den",
                Some(&[("authorization", "Bearer tok=en")]),
                "percent-decoded",
            ),
            ("x=a=b", Some(&[("x", "a=b")]), "the first = splits"),
            (
                "a=1,,b=2,",
                Some(&[("a", "1"), ("b", "2")]),
                "empty entries skipped",
            ),
            ("novalue", None, "no ="),
            ("=v", None, "empty name"),
            ("bad name=v", None, "a space in the name"),
            ("a=%zz", None, "bad escape"),
            ("a=%4", None, "short escape"),
            ("a=line%0Abreak", None, "a newline in the value"),
        ];
        for (text, want, why) in rows {
            let got = parse("VAR", text);
            match (want, got) {
                (Some(want), Ok(got)) => {
                    let got: Vec<(String, String)> = got
                        .iter()
                        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_owned()))
                        .collect();
                    let want: Vec<(String, String)> = want
                        .iter()
                        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                        .collect();
                    assert_eq!(got, want, "{why}: {text:?}");
                }
                (None, Err(e)) => assert!(e.to_string().contains("VAR"), "{why}: {e}"),
                (want, got) => panic!("{why}: {text:?}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn fixed_headers_replace_and_remove() {
        let fixed = Fixed {
            from_process: vec![HeaderName::from_static("x-env")],
            headers: vec![(
                HeaderName::from_static("api-key"),
                HeaderValue::from_static("code"),
            )],
        };
        let mut map = HeaderMap::new();
        map.insert("x-env", HeaderValue::from_static("from the process"));
        map.insert("api-key", HeaderValue::from_static("from the process"));
        map.insert(
            "content-type",
            HeaderValue::from_static("application/x-protobuf"),
        );
        fixed.apply(&mut map);
        assert_eq!(map.get("x-env"), None);
        assert_eq!(map.get_all("api-key").iter().count(), 1);
        assert_eq!(
            map.get("api-key").map(HeaderValue::as_bytes),
            Some(&b"code"[..])
        );
        assert!(map.contains_key("content-type"), "other headers stay");
    }
}
