//! The W3C carrier: what travels between ranks.

mod json;
mod scan;
pub(crate) mod w3c;
mod wire;

use std::borrow::Cow;
use std::fmt;
use std::sync::OnceLock;

use opentelemetry::Context;
use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt, TraceState};
use opentelemetry_sdk::propagation::BaggagePropagator;

/// The `traceparent` key.
pub const TRACEPARENT: &str = "traceparent";
/// The `tracestate` key.
pub const TRACESTATE: &str = "tracestate";
/// The `baggage` key.
pub const BAGGAGE: &str = "baggage";

/// The environment variables of OpenTelemetry's environment-variable carrier, by key.
const ENV_VARS: [(&str, &str); 3] = [
    (TRACEPARENT, "TRACEPARENT"),
    (TRACESTATE, "TRACESTATE"),
    (BAGGAGE, "BAGGAGE"),
];

/// Why bytes could not be decoded into a [`Carrier`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CarrierError {
    /// The input is larger than the limit.
    #[error("{len} bytes is over the carrier limit of {limit} bytes")]
    TooLarge {
        /// Input length.
        len: usize,
        /// Limit in force.
        limit: usize,
    },
    /// The input is not UTF-8.
    #[error("invalid UTF-8 at byte {offset}")]
    InvalidUtf8 {
        /// First byte that is not valid UTF-8.
        offset: usize,
    },
    /// The input ends early (truncated).
    #[error("input ends early (truncated)")]
    UnexpectedEnd,
    /// The top-level JSON value is not an object.
    #[error("top-level JSON value is not an object")]
    NotAnObject,
    /// A member's value is not a string.
    #[error("value of {key:?} is not a string")]
    NonStringValue {
        /// The member's key.
        key: String,
    },
    /// A key appears twice (ambiguous: which `traceparent` is meant?).
    #[error("duplicate key {key:?}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// A malformed escape sequence (lone surrogates included).
    #[error("invalid escape sequence at byte {offset}")]
    InvalidEscape {
        /// Where the escape starts.
        offset: usize,
    },
    /// Something other than what JSON allows at this point.
    #[error("syntax error at byte {offset}: expected {expected}")]
    Syntax {
        /// Where.
        offset: usize,
        /// What would have been valid.
        expected: &'static str,
    },
    /// Bytes after the object.
    #[error("trailing data at byte {offset}")]
    TrailingData {
        /// Where the trailing data starts.
        offset: usize,
    },
}

/// A W3C trace-context carrier: an insertion-ordered map of strings (`traceparent`,
/// `tracestate`, `baggage`), the same dictionary NeMo Lens's Python module broadcasts.
///
/// It implements OpenTelemetry's [`Injector`] and [`Extractor`], encodes to the exact bytes
/// of Python's `json.dumps(carrier).encode()`, and decodes any JSON object of strings.
///
/// Equality compares the entries only, not [`Carrier::source_rank`].
///
/// ```
/// use lens_core::Carrier;
///
/// let bytes = br#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03"}"#;
/// let carrier = Carrier::decode(bytes)?;
/// // `None` only for a missing or malformed traceparent; this one is well formed.
/// let sc = carrier.span_context().expect("a well-formed traceparent");
/// assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(sc.trace_flags().to_u8(), 0x03); // all flag bits kept
/// assert_eq!(carrier.encode(), bytes); // passed on exactly as received
/// # Ok::<(), lens_core::CarrierError>(())
/// ```
#[derive(Clone, Default)]
pub struct Carrier {
    repr: Repr,
    source_rank: Option<usize>,
    // The parsed span context, computed on first use: one broadcast carrier typically
    // feeds many linked spans (one per micro-batch). Reset by every mutation.
    parsed: OnceLock<Option<SpanContext>>,
}

/// How the entries are held.
#[derive(Clone, Debug)]
enum Repr {
    /// Canonical JSON text with the entries' positions: what decoding and injecting produce
    /// in the usual case, with no allocation per entry.
    Wire(wire::Wire),
    /// Separate strings: carriers with escapes, non-ASCII text, many entries, or edits.
    Owned(Vec<(json::Key, String)>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Owned(Vec::new())
    }
}

/// The entries of a [`Carrier`] in insertion order; see [`Carrier::iter`].
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    carrier: &'a Carrier,
    next: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.carrier.entry(self.next)?;
        self.next += 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.carrier.len().saturating_sub(self.next);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl PartialEq for Carrier {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Carrier {}

impl fmt::Debug for Carrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in self.iter() {
            m.entry(&k, &v);
        }
        m.finish()
    }
}

impl Carrier {
    /// The carrier codec's default size limit: 16 KiB (W3C baggage alone may need 8 KiB).
    pub const DEFAULT_MAX_LEN: usize = 16 * 1024;

    /// An empty carrier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Injects `cx`'s span context (W3C Trace Context) and baggage (W3C Baggage).
    ///
    /// This writes the W3C formats directly, not through the global propagator (a no-op
    /// unless an application installed one). All eight trace-flag bits are written as the
    /// span context holds them, and an empty `tracestate` is left out, as Python does.
    /// Baggage names and values are percent-encoded per W3C Baggage (every octet outside
    /// `baggage-octet`, plus `%` and `=`), so any string survives the round trip.
    pub fn from_context(cx: &Context) -> Self {
        let span = cx.span();
        let sc = span.span_context();
        let baggage = cx.baggage();
        let state = if sc.is_valid() {
            sc.trace_state().header()
        } else {
            String::new()
        };
        // Written straight into canonical JSON; values that would need escaping (odd
        // tracestate or baggage metadata) take the general path below.
        let mut w = wire::WireWriter::new();
        let mut plain = true;
        if sc.is_valid() {
            plain &= w.entry(TRACEPARENT, |out| {
                w3c::write_traceparent(out, sc);
                true // lowercase hex and dashes
            });
            if !state.is_empty() {
                plain &= w.entry(TRACESTATE, |out| {
                    out.extend_from_slice(state.as_bytes());
                    scan::json_plain(state.as_bytes())
                });
            }
        }
        if !baggage.is_empty() {
            plain &= w.entry(BAGGAGE, |out| w3c::write_baggage(out, baggage));
        }
        let repr = match plain.then(|| w.finish()).flatten() {
            Some(wire) => Repr::Wire(wire),
            None => {
                let mut entries = Vec::with_capacity(3);
                if sc.is_valid() {
                    entries.push((TRACEPARENT.into(), w3c::format_traceparent(sc)));
                    if !state.is_empty() {
                        entries.push((TRACESTATE.into(), state));
                    }
                }
                if !baggage.is_empty() {
                    entries.push((BAGGAGE.into(), w3c::format_baggage(baggage)));
                }
                Repr::Owned(entries)
            }
        };
        Carrier {
            repr,
            source_rank: None,
            parsed: OnceLock::new(),
        }
    }

    /// Extracts a [`Context`] holding the remote span context (when valid) and the baggage.
    ///
    /// Baggage is decoded per W3C: percent-decoding, where `+` is a plus sign. Python's
    /// propagator writes a space as `+` (form encoding), so `team+a` from Python reads as
    /// `team+a` here; use `%20` for spaces when both sides must agree.
    pub fn context(&self) -> Context {
        self.context_with(&Context::new())
    }

    /// Like [`Carrier::context`], on top of `base` instead of an empty context.
    pub fn context_with(&self, base: &Context) -> Context {
        let cx = match self.span_context() {
            Some(sc) => base.with_remote_span_context(sc),
            None => base.clone(),
        };
        if self.get(BAGGAGE).is_some() {
            BaggagePropagator::new().extract_with_context(&cx, self)
        } else {
            cx
        }
    }

    /// The remote span context, `Some` only when `traceparent` is valid by the W3C rules.
    ///
    /// An invalid `tracestate` is dropped (as the W3C rules say) and the span context kept.
    pub fn span_context(&self) -> Option<SpanContext> {
        self.parsed
            .get_or_init(|| self.parse_span_context())
            .clone()
    }

    fn parse_span_context(&self) -> Option<SpanContext> {
        let parent = w3c::parse_traceparent(self.get(TRACEPARENT)?).ok()?;
        let state = self
            .get(TRACESTATE)
            .and_then(|h| w3c::parse_tracestate(h).ok())
            .unwrap_or(TraceState::NONE);
        Some(SpanContext::new(
            parent.trace_id,
            parent.span_id,
            parent.flags,
            true,
            state,
        ))
    }

    /// True when [`Carrier::span_context`] is `Some` (checks `traceparent` only).
    pub fn has_span_context(&self) -> bool {
        self.get(TRACEPARENT)
            .is_some_and(|tp| w3c::parse_traceparent(tp).is_ok())
    }

    /// Encodes as Python's `json.dumps(carrier).encode()` does: `", "` and `": "` separators,
    /// non-ASCII and control characters as `\uXXXX`, insertion order kept.
    pub fn encode(&self) -> Vec<u8> {
        self.to_bytes().into_owned()
    }

    /// [`Carrier::encode`] without a copy when the carrier already holds its canonical
    /// bytes (as decoded and injected carriers usually do).
    pub fn to_bytes(&self) -> Cow<'_, [u8]> {
        match &self.repr {
            Repr::Wire(w) => Cow::Borrowed(w.json().as_bytes()),
            Repr::Owned(entries) => Cow::Owned(json::encode(
                entries.iter().map(|(k, v)| (k.as_ref(), v.as_str())),
            )),
        }
    }

    /// Decodes a JSON object of string values, at most [`Carrier::DEFAULT_MAX_LEN`] bytes.
    ///
    /// # Errors
    /// A [`CarrierError`] for anything else; it never panics, whatever the input.
    pub fn decode(bytes: &[u8]) -> Result<Self, CarrierError> {
        Self::decode_with_limit(bytes, Self::DEFAULT_MAX_LEN)
    }

    /// [`Carrier::decode`] taking the bytes by value: a carrier in the usual form keeps them
    /// as its text, with no copy (what lens's receivers do with the buffer a broadcast
    /// returns).
    ///
    /// ```
    /// use lens_core::Carrier;
    ///
    /// let bytes = br#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#;
    /// let carrier = Carrier::decode_owned(bytes.to_vec())?;
    /// assert_eq!(carrier, Carrier::decode(bytes)?);
    /// # Ok::<(), lens_core::CarrierError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Carrier::decode`].
    pub fn decode_owned(bytes: Vec<u8>) -> Result<Self, CarrierError> {
        Self::decode_vec(bytes, Self::DEFAULT_MAX_LEN)
    }

    /// [`Carrier::decode`] with a size limit of `limit` bytes.
    ///
    /// # Errors
    /// As [`Carrier::decode`].
    pub fn decode_with_limit(bytes: &[u8], limit: usize) -> Result<Self, CarrierError> {
        Self::decode_vec(bytes.to_vec(), limit)
    }

    /// Decodes bytes the caller no longer needs, keeping them as the carrier's text when
    /// they are canonical (no copy).
    pub(crate) fn decode_vec(bytes: Vec<u8>, limit: usize) -> Result<Self, CarrierError> {
        if bytes.len() > limit {
            return Err(CarrierError::TooLarge {
                len: bytes.len(),
                limit,
            });
        }
        let repr = match wire::Wire::parse(bytes) {
            Ok(w) => Repr::Wire(w),
            Err(bytes) => Repr::Owned(json::decode(&bytes, limit)?),
        };
        Ok(Carrier {
            repr,
            source_rank: None,
            parsed: OnceLock::new(),
        })
    }

    fn entry(&self, i: usize) -> Option<(&str, &str)> {
        match &self.repr {
            Repr::Wire(w) => w.entry(i),
            Repr::Owned(e) => e.get(i).map(|(k, v)| (k.as_ref(), v.as_str())),
        }
    }

    /// The entries as separate strings, converting the compact form first.
    fn owned_entries(&mut self) -> &mut Vec<(json::Key, String)> {
        if let Repr::Wire(w) = &self.repr {
            let entries = (0..w.len())
                .filter_map(|i| w.entry(i))
                .map(|(k, v)| (json::intern(k.to_owned()), v.to_owned()))
                .collect();
            self.repr = Repr::Owned(entries);
        }
        self.parsed = OnceLock::new();
        match &mut self.repr {
            Repr::Owned(e) => e,
            Repr::Wire(_) => unreachable!("converted above"),
        }
    }

    /// Reads `TRACEPARENT`, `TRACESTATE` and `BAGGAGE` from the process environment
    /// (OpenTelemetry's environment-variable carrier), so a launcher can start every rank
    /// inside one trace without any collective. Unset or non-UTF-8 variables are skipped.
    pub fn from_env() -> Self {
        Self::from_env_with(|name| std::env::var(name).ok())
    }

    /// [`Carrier::from_env`] with a custom variable lookup (for tests, or a launcher that
    /// holds the child's environment in a map).
    pub fn from_env_with(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut carrier = Carrier::new();
        for (key, var) in ENV_VARS {
            if let Some(value) = lookup(var) {
                carrier.insert(key, value);
            }
        }
        carrier
    }

    /// The environment variables that carry this carrier into a child process:
    /// `TRACEPARENT`, `TRACESTATE`, `BAGGAGE` for the keys present.
    ///
    /// ```
    /// # use lens_core::Carrier;
    /// let mut carrier = Carrier::new();
    /// carrier.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    /// let mut cmd = std::process::Command::new("true");
    /// cmd.envs(carrier.to_env());
    /// ```
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        ENV_VARS
            .iter()
            .filter_map(|(key, var)| self.get(key).map(|v| (*var, v.to_owned())))
            .collect()
    }

    /// The value stored under `key` (exact match first, then ASCII case-insensitive, as
    /// header names are).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| *k == key)
            .or_else(|| self.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)))
            .map(|(_, v)| v)
    }

    /// Sets `key` to `value`, in place if present, else at the end.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) {
        let (key, value) = (json::intern(key.into()), value.into());
        let entries = self.owned_entries();
        match entries.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => entries.push((key, value)),
        }
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let at = self.iter().position(|(k, _)| k == key)?;
        Some(self.owned_entries().remove(at).1)
    }

    /// The entries in insertion order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            carrier: self,
            next: 0,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Wire(w) => w.len(),
            Repr::Owned(e) => e.len(),
        }
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rank this carrier was broadcast from, when it came from a broadcast.
    pub fn source_rank(&self) -> Option<usize> {
        self.source_rank
    }

    /// Records the rank this carrier came from (used for link attributes).
    pub fn with_source_rank(mut self, rank: usize) -> Self {
        self.source_rank = Some(rank);
        self
    }
}

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        self.insert(key, value);
    }
}

impl Extractor for Carrier {
    fn get(&self, key: &str) -> Option<&str> {
        Carrier::get(self, key)
    }

    fn keys(&self) -> Vec<&str> {
        self.iter().map(|(k, _)| k).collect()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Carrier {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut carrier = Carrier::new();
        for (k, v) in iter {
            carrier.insert(k, v);
        }
        carrier
    }
}
