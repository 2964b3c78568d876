//! The carrier's wire format: a flat JSON object of strings, byte-compatible with Python's
//! `json.dumps(carrier).encode()`.
//!
//! A hand-written codec rather than serde_json because the output must match Python's
//! separators (`", "`, `": "`) and ASCII escaping byte for byte, and the decoder must
//! reject everything that is not an object of strings with a precise error.

use std::borrow::Cow;

use super::{BAGGAGE, CarrierError, TRACEPARENT, TRACESTATE};

/// A carrier key: the three W3C keys are shared statics, others are owned.
pub(crate) type Key = Cow<'static, str>;

/// Returns the static copy of a well-known key, so decoding allocates only values.
pub(crate) fn intern(key: String) -> Key {
    match key.as_str() {
        TRACEPARENT => Cow::Borrowed(TRACEPARENT),
        TRACESTATE => Cow::Borrowed(TRACESTATE),
        BAGGAGE => Cow::Borrowed(BAGGAGE),
        _ => Cow::Owned(key),
    }
}

/// Appends `s` as a JSON string literal the way Python's `json.dumps` writes it with its
/// default `ensure_ascii=True`: every character outside `' '..='~'` is escaped.
pub(crate) fn write_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    // Carriers are almost always plain ASCII: copy them in one go.
    if super::scan::json_plain(bytes) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut plain_from = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            continue;
        }
        if b >= 0x80 && !s.is_char_boundary(i) {
            continue; // continuation byte: the character was handled at its first byte
        }
        out.extend_from_slice(&bytes[plain_from..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                // `i` is a char boundary here, so `s[i..]` starts with a whole character.
                let c = s[i..].chars().next().unwrap_or('\u{fffd}');
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let u = *unit;
                    out.extend_from_slice(&[
                        b'\\',
                        b'u',
                        HEX[usize::from(u >> 12)],
                        HEX[usize::from((u >> 8) & 0xf)],
                        HEX[usize::from((u >> 4) & 0xf)],
                        HEX[usize::from(u & 0xf)],
                    ]);
                }
            }
        }
        plain_from = i + if b < 0x80 { 1 } else { utf8_len(b) };
    }
    out.extend_from_slice(&bytes[plain_from..]);
    out.push(b'"');
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0.. => 4,
        0xe0.. => 3,
        _ => 2,
    }
}

/// Encodes ordered pairs as Python's `json.dumps(dict)` does.
pub(crate) fn encode<'a>(entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + entries.len() * 100);
    out.push(b'{');
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        write_string(&mut out, k);
        out.extend_from_slice(b": ");
        write_string(&mut out, v);
    }
    out.push(b'}');
    out
}

/// Decodes a JSON object whose values are all strings, keeping the order of its members.
pub(crate) fn decode(input: &[u8], limit: usize) -> Result<Vec<(Key, String)>, CarrierError> {
    if input.len() > limit {
        return Err(CarrierError::TooLarge {
            len: input.len(),
            limit,
        });
    }
    let text = std::str::from_utf8(input).map_err(|e| CarrierError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        pos: 0,
    };
    p.skip_ws();
    match p.peek() {
        None => return Err(CarrierError::UnexpectedEnd),
        Some(b'{') => p.pos += 1,
        Some(_) => return Err(CarrierError::NotAnObject),
    }
    let mut entries: Vec<(Key, String)> = Vec::with_capacity(3);
    p.skip_ws();
    if p.peek() == Some(b'}') {
        p.pos += 1;
    } else {
        loop {
            p.skip_ws();
            let key = intern(p.string("a string key")?);
            p.skip_ws();
            p.eat(b':', "':' after a key")?;
            p.skip_ws();
            match p.peek() {
                None => return Err(CarrierError::UnexpectedEnd),
                Some(b'"') => {}
                Some(_) => {
                    return Err(CarrierError::NonStringValue {
                        key: key.into_owned(),
                    });
                }
            }
            let value = p.string("a string value")?;
            if entries.iter().any(|(k, _)| *k == key) {
                return Err(CarrierError::DuplicateKey {
                    key: key.into_owned(),
                });
            }
            entries.push((key, value));
            p.skip_ws();
            match p.peek() {
                None => return Err(CarrierError::UnexpectedEnd),
                Some(b',') => p.pos += 1,
                Some(b'}') => {
                    p.pos += 1;
                    break;
                }
                Some(_) => {
                    return Err(CarrierError::Syntax {
                        offset: p.pos,
                        expected: "',' or '}'",
                    });
                }
            }
        }
    }
    p.skip_ws();
    if p.pos != p.s.len() {
        return Err(CarrierError::TrailingData { offset: p.pos });
    }
    Ok(entries)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8, expected: &'static str) -> Result<(), CarrierError> {
        match self.peek() {
            None => Err(CarrierError::UnexpectedEnd),
            Some(b) if b == byte => {
                self.pos += 1;
                Ok(())
            }
            Some(_) => Err(CarrierError::Syntax {
                offset: self.pos,
                expected,
            }),
        }
    }

    fn string(&mut self, expected: &'static str) -> Result<String, CarrierError> {
        self.eat(b'"', expected)?;
        let start = self.pos;
        // Fast path: up to the next quote there is no escape and no control character, so
        // the run is the string.
        if let Some(len) = memchr::memchr(b'"', &self.s[start..]) {
            if super::scan::json_unescaped(&self.s[start..start + len]) {
                self.pos = start + len + 1;
                return Ok(self.text[start..start + len].to_owned());
            }
        }
        let mut out = String::new();
        let mut plain_from = self.pos;
        loop {
            let Some(b) = self.peek() else {
                return Err(CarrierError::UnexpectedEnd);
            };
            match b {
                b'"' => {
                    out.push_str(&self.text[plain_from..self.pos]);
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => {
                    out.push_str(&self.text[plain_from..self.pos]);
                    self.escape(&mut out)?;
                    plain_from = self.pos;
                }
                0x00..=0x1f => {
                    return Err(CarrierError::Syntax {
                        offset: self.pos,
                        expected: "no raw control character inside a string",
                    });
                }
                _ => self.pos += 1,
            }
        }
    }

    fn escape(&mut self, out: &mut String) -> Result<(), CarrierError> {
        let at = self.pos;
        self.pos += 1; // the backslash
        let Some(kind) = self.peek() else {
            return Err(CarrierError::UnexpectedEnd);
        };
        self.pos += 1;
        let c = match kind {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let first = self.hex4()?;
                match first {
                    0xd800..=0xdbff => {
                        if self.s.get(self.pos..self.pos + 2) != Some(b"\\u") {
                            if self.pos + 2 > self.s.len() {
                                return Err(CarrierError::UnexpectedEnd);
                            }
                            return Err(CarrierError::InvalidEscape { offset: at });
                        }
                        self.pos += 2;
                        let second = self.hex4()?;
                        if !(0xdc00..=0xdfff).contains(&second) {
                            return Err(CarrierError::InvalidEscape { offset: at });
                        }
                        let code = 0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00);
                        char::from_u32(code).ok_or(CarrierError::InvalidEscape { offset: at })?
                    }
                    0xdc00..=0xdfff => return Err(CarrierError::InvalidEscape { offset: at }),
                    _ => char::from_u32(first).ok_or(CarrierError::InvalidEscape { offset: at })?,
                }
            }
            _ => return Err(CarrierError::InvalidEscape { offset: at }),
        };
        out.push(c);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, CarrierError> {
        let Some(digits) = self.s.get(self.pos..self.pos + 4) else {
            return Err(CarrierError::UnexpectedEnd);
        };
        let mut v = 0u32;
        for &d in digits {
            let n = (d as char)
                .to_digit(16)
                .ok_or(CarrierError::InvalidEscape { offset: self.pos })?;
            v = v * 16 + n;
        }
        self.pos += 4;
        Ok(v)
    }
}
