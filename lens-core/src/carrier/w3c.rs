//! Strict W3C Trace Context parsing.
//!
//! `opentelemetry_sdk`'s propagator accepts headers the W3C rules reject (short ids, a
//! leading `+`, one-digit fields) and keeps only the sampled bit of the flags, so lens parses
//! `traceparent` and `tracestate` itself and hands the SDK only what the rules allow.

use opentelemetry::baggage::Baggage;

use super::scan;
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// A parsed, valid `traceparent` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The header's version; `0x00` today, `0xff` is never valid.
    pub version: u8,
    /// The trace id (never all zeros).
    pub trace_id: TraceId,
    /// The parent span id (never all zeros).
    pub span_id: SpanId,
    /// All eight flag bits as received (`0x01` sampled, `0x02` random).
    pub flags: TraceFlags,
}

/// Why a `traceparent` header was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceParentError {
    /// Shorter than the 55 characters of version 00.
    #[error("too short: {0} characters, at least 55 are needed")]
    TooShort(usize),
    /// A field is not separated by `-`.
    #[error("missing '-' separator at offset {0}")]
    Separator(usize),
    /// A field holds something other than lowercase hex digits.
    #[error("{0} is not lowercase hex")]
    NotLowerHex(&'static str),
    /// Version `ff` is forbidden.
    #[error("version ff is forbidden")]
    ForbiddenVersion,
    /// Version 00 with anything after the flags.
    #[error("version 00 must be exactly 55 characters, got {0}")]
    TrailingData(usize),
    /// The trace id is all zeros.
    #[error("trace id is all zeros")]
    ZeroTraceId,
    /// The parent id is all zeros.
    #[error("parent id is all zeros")]
    ZeroSpanId,
}

/// Why a `tracestate` header was rejected (W3C: drop the whole header, keep traceparent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceStateError {
    /// More than 32 list members.
    #[error("{0} list members, at most 32 are allowed")]
    TooManyMembers(usize),
    /// A member without `=`.
    #[error("list member {0:?} has no '='")]
    MissingEquals(String),
    /// A key outside the key grammar.
    #[error("invalid key {0:?}")]
    InvalidKey(String),
    /// A value outside the value grammar.
    #[error("invalid value {0:?}")]
    InvalidValue(String),
    /// The same key twice.
    #[error("duplicate key {0:?}")]
    DuplicateKey(String),
}

const OWS: &[char] = &[' ', '\t'];

/// The value of each lowercase hex digit; `0xff` for every other byte.
const LOWER_HEX: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// Decodes lowercase hex into `out` (`hex` is twice as long): a table lookup per digit,
/// since the SDK's `from_hex` (a radix parse of a `u128`) was most of a receiver's decode.
fn decode_lower_hex(
    hex: &[u8],
    out: &mut [u8],
    what: &'static str,
) -> Result<(), TraceParentError> {
    let mut bad = 0u8;
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let (hi, lo) = (
            LOWER_HEX[usize::from(pair[0])],
            LOWER_HEX[usize::from(pair[1])],
        );
        bad |= (hi | lo) & 0xf0;
        *o = (hi << 4) | (lo & 0x0f);
    }
    if bad == 0 {
        Ok(())
    } else {
        Err(TraceParentError::NotLowerHex(what))
    }
}

/// Parses a `traceparent` header by the W3C rules (surrounding spaces and tabs allowed).
///
/// # Errors
/// A [`TraceParentError`] naming the first rule broken.
pub fn parse_traceparent(header: &str) -> Result<TraceParent, TraceParentError> {
    let padded = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    let bytes = header.as_bytes();
    let h = if padded(bytes.first()) || padded(bytes.last()) {
        header.trim_matches(OWS).as_bytes()
    } else {
        bytes
    };
    if h.len() < 55 {
        return Err(TraceParentError::TooShort(h.len()));
    }
    for at in [2, 35, 52] {
        if h[at] != b'-' {
            return Err(TraceParentError::Separator(at));
        }
    }
    let mut version = [0u8; 1];
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    let mut flags = [0u8; 1];
    decode_lower_hex(&h[0..2], &mut version, "version")?;
    decode_lower_hex(&h[3..35], &mut trace_id, "trace id")?;
    decode_lower_hex(&h[36..52], &mut span_id, "parent id")?;
    decode_lower_hex(&h[53..55], &mut flags, "flags")?;
    let version = version[0];
    if version == 0xff {
        return Err(TraceParentError::ForbiddenVersion);
    }
    if version == 0 && h.len() != 55 {
        return Err(TraceParentError::TrailingData(h.len()));
    }
    // A later version may append fields, each after a '-'.
    if h.len() > 55 && h[55] != b'-' {
        return Err(TraceParentError::Separator(55));
    }
    let trace_id = TraceId::from_bytes(trace_id);
    let span_id = SpanId::from_bytes(span_id);
    if trace_id == TraceId::INVALID {
        return Err(TraceParentError::ZeroTraceId);
    }
    if span_id == SpanId::INVALID {
        return Err(TraceParentError::ZeroSpanId);
    }
    Ok(TraceParent {
        version,
        trace_id,
        span_id,
        flags: TraceFlags::new(flags[0]),
    })
}

fn key_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'*' | b'/')
}

fn valid_key(key: &str) -> bool {
    let b = key.as_bytes();
    match key.split_once('@') {
        None => {
            // simple-key = lcalpha 0*255(lcalpha / DIGIT / "_" / "-" / "*" / "/")
            !b.is_empty()
                && b.len() <= 256
                && b[0].is_ascii_lowercase()
                && b.iter().all(|&c| key_char(c))
        }
        Some((tenant, system)) => {
            // tenant-id "@" system-id
            let (t, s) = (tenant.as_bytes(), system.as_bytes());
            !t.is_empty()
                && t.len() <= 241
                && (t[0].is_ascii_lowercase() || t[0].is_ascii_digit())
                && t.iter().all(|&c| key_char(c))
                && !s.is_empty()
                && s.len() <= 14
                && s[0].is_ascii_lowercase()
                && s.iter().all(|&c| key_char(c))
        }
    }
}

fn valid_value(value: &str) -> bool {
    // value = 0*255(chr) nblk-chr; chr = %x20 / nblk-chr; nblk-chr = %x21-7E minus ',' and '='
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && b.iter()
            .all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
        && b[b.len() - 1] != b' '
}

/// Parses a `tracestate` header by the W3C rules: at most 32 members, no duplicate keys,
/// keys and values within their grammar, empty members and spaces around members allowed.
///
/// # Errors
/// A [`TraceStateError`] naming the first rule broken.
pub fn parse_tracestate(header: &str) -> Result<TraceState, TraceStateError> {
    let mut members: Vec<(&str, &str)> = Vec::new();
    for member in header.split(',') {
        let member = member.trim_matches(OWS);
        if member.is_empty() {
            continue;
        }
        let (key, value) = member
            .split_once('=')
            .ok_or_else(|| TraceStateError::MissingEquals(member.to_owned()))?;
        if !valid_key(key) {
            return Err(TraceStateError::InvalidKey(key.to_owned()));
        }
        if !valid_value(value) {
            return Err(TraceStateError::InvalidValue(value.to_owned()));
        }
        if members.iter().any(|(k, _)| *k == key) {
            return Err(TraceStateError::DuplicateKey(key.to_owned()));
        }
        members.push((key, value));
        if members.len() > 32 {
            let total = header
                .split(',')
                .filter(|m| !m.trim_matches(OWS).is_empty())
                .count();
            return Err(TraceStateError::TooManyMembers(total));
        }
    }
    // Every member passed the stricter W3C checks above, so the SDK accepts them all.
    TraceState::from_key_value(members).map_err(|e| TraceStateError::InvalidKey(e.to_string()))
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends a version-00 `traceparent` with all eight flag bits of `sc`.
pub(crate) fn write_traceparent(out: &mut Vec<u8>, sc: &SpanContext) {
    let mut buf = *b"00-................................-................-..";
    for (i, b) in sc.trace_id().to_bytes().into_iter().enumerate() {
        [buf[3 + 2 * i], buf[4 + 2 * i]] = HEX_PAIRS[usize::from(b)];
    }
    for (i, b) in sc.span_id().to_bytes().into_iter().enumerate() {
        [buf[36 + 2 * i], buf[37 + 2 * i]] = HEX_PAIRS[usize::from(b)];
    }
    [buf[53], buf[54]] = HEX_PAIRS[usize::from(sc.trace_flags().to_u8())];
    out.extend_from_slice(&buf);
}

/// Text the writers made from valid UTF-8 pieces.
pub(crate) fn into_string(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A version-00 `traceparent` with all eight flag bits of `sc`.
pub fn format_traceparent(sc: &SpanContext) -> String {
    let mut out = Vec::with_capacity(55);
    write_traceparent(&mut out, sc);
    into_string(out)
}

fn push_baggage_text(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    if scan::baggage_plain(bytes) {
        out.extend_from_slice(bytes);
        return;
    }
    for &b in bytes {
        if scan::baggage_plain_byte(b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[
                b'%',
                HEX_UPPER[usize::from(b >> 4)],
                HEX_UPPER[usize::from(b & 0xf)],
            ]);
        }
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Lowercase hex of every byte value.
const HEX_PAIRS: [[u8; 2]; 256] = {
    let mut t = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [HEX[b >> 4], HEX[b & 0xf]];
        b += 1;
    }
    t
};

/// A W3C `baggage` header: `name=value[;metadata]` members joined by `,`, names and
/// values percent-encoded.
pub fn format_baggage(baggage: &Baggage) -> String {
    let mut out = Vec::with_capacity(64);
    write_baggage(&mut out, baggage);
    into_string(out)
}

/// Appends [`format_baggage`]'s header to `out`; true when all of it is printable ASCII
/// without `"` or `\` (names and values always are, once percent-encoded; metadata is
/// written as given).
pub(crate) fn write_baggage(out: &mut Vec<u8>, baggage: &Baggage) -> bool {
    let mut plain = true;
    for (i, (name, (value, metadata))) in baggage.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_baggage_text(out, name.as_str());
        out.push(b'=');
        push_baggage_text(out, value.as_str());
        let metadata = metadata.as_str().trim();
        if !metadata.is_empty() {
            out.push(b';');
            out.extend_from_slice(metadata.as_bytes());
            plain &= scan::json_plain(metadata.as_bytes());
        }
    }
    plain
}
