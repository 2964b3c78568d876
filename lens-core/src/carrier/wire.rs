//! The compact form of a carrier: its canonical JSON text plus where each key and value sit
//! in it. Decoding a canonical carrier (what Python and lens write) then costs no allocation
//! beyond the text itself, and encoding it costs none.

use std::ops::Range;

use super::scan;

/// Entries kept inline; carriers with more fall back to the general form.
pub(crate) const MAX_FIELDS: usize = 4;

#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Field {
    key: (u32, u32),
    value: (u32, u32),
}

/// Canonical JSON (`{"k": "v", "k2": "v2"}`, every string printable ASCII without `"` or
/// `\`) and the byte ranges of its keys and values. Encoding it gives `json` as it is.
#[derive(Clone, Debug)]
pub(crate) struct Wire {
    json: String,
    fields: [Field; MAX_FIELDS],
    len: u8,
}

fn range(r: (u32, u32)) -> Range<usize> {
    r.0 as usize..r.1 as usize
}

impl Wire {
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub(crate) fn json(&self) -> &str {
        &self.json
    }

    /// Entry `i` (`i < len`).
    pub(crate) fn entry(&self, i: usize) -> Option<(&str, &str)> {
        let f = self.fields.get(i).filter(|_| i < self.len())?;
        Some((self.json.get(range(f.key))?, self.json.get(range(f.value))?))
    }

    /// Parses `bytes` when they are canonical; gives them back otherwise (the general
    /// decoder then decides whether they are valid at all).
    #[allow(unsafe_code)]
    pub(crate) fn parse(bytes: Vec<u8>) -> Result<Wire, Vec<u8>> {
        let Some((fields, len)) = Self::positions(&bytes) else {
            return Err(bytes);
        };
        debug_assert!(bytes.is_ascii());
        // SAFETY: `positions` accepted every byte as `{`, `}`, `": "`, `", "` or a plain
        // string (printable ASCII): ASCII is valid UTF-8. (A second check cost about 8 % of
        // decoding a traceparent carrier.)
        let json = unsafe { String::from_utf8_unchecked(bytes) };
        Ok(Wire { json, fields, len })
    }

    fn positions(b: &[u8]) -> Option<([Field; MAX_FIELDS], u8)> {
        let mut fields = [Field::default(); MAX_FIELDS];
        let mut len = 0usize;
        if b.len() > u32::MAX as usize || b.first() != Some(&b'{') {
            return None;
        }
        let mut pos = 1;
        if b.get(pos) != Some(&b'}') {
            loop {
                let key = plain_string(b, pos)?;
                pos = key.1 as usize + 1;
                if b.get(pos..pos + 2)? != b": " {
                    return None;
                }
                let value = plain_string(b, pos + 2)?;
                pos = value.1 as usize + 1;
                let this = &b[range(key)];
                if len == MAX_FIELDS || fields[..len].iter().any(|f| &b[range(f.key)] == this) {
                    return None; // too many for inline storage, or a duplicate key
                }
                fields[len] = Field { key, value };
                len += 1;
                match b.get(pos..pos + 2) {
                    Some(b", ") => pos += 2,
                    _ => break,
                }
            }
        }
        if b.get(pos) != Some(&b'}') || pos + 1 != b.len() {
            return None;
        }
        Some((fields, len as u8))
    }
}

/// The content range of the plain JSON string starting at `at` (which must be `"`).
fn plain_string(b: &[u8], at: usize) -> Option<(u32, u32)> {
    if b.get(at) != Some(&b'"') {
        return None;
    }
    let start = at + 1;
    let len = scan::plain_prefix_to_quote(b.get(start..)?)?;
    let end = start + len;
    Some((start as u32, end as u32))
}

/// Writes a canonical carrier entry by entry.
pub(crate) struct WireWriter {
    json: Vec<u8>,
    fields: [Field; MAX_FIELDS],
    len: usize,
}

impl WireWriter {
    pub(crate) fn new() -> Self {
        let mut json = Vec::with_capacity(160);
        json.push(b'{');
        WireWriter {
            json,
            fields: [Field::default(); MAX_FIELDS],
            len: 0,
        }
    }

    /// Adds `key` (plain ASCII) with the value `write` appends; `write` says whether what
    /// it wrote is plain (printable ASCII without `"` or `\`). `false` (and the writer is
    /// then unusable) when it is not, or there are too many entries.
    pub(crate) fn entry(&mut self, key: &str, write: impl FnOnce(&mut Vec<u8>) -> bool) -> bool {
        if self.len == MAX_FIELDS {
            return false;
        }
        if self.len > 0 {
            self.json.extend_from_slice(b", ");
        }
        self.json.push(b'"');
        let k0 = self.json.len();
        self.json.extend_from_slice(key.as_bytes());
        let k1 = self.json.len();
        self.json.extend_from_slice(b"\": \"");
        let v0 = self.json.len();
        let plain = write(&mut self.json);
        let v1 = self.json.len();
        self.json.push(b'"');
        if !plain {
            return false;
        }
        self.fields[self.len] = Field {
            key: (k0 as u32, k1 as u32),
            value: (v0 as u32, v1 as u32),
        };
        self.len += 1;
        true
    }

    /// The carrier; `None` only if a writer produced invalid UTF-8, which they never do.
    pub(crate) fn finish(mut self) -> Option<Wire> {
        self.json.push(b'}');
        Some(Wire {
            json: String::from_utf8(self.json).ok()?,
            fields: self.fields,
            len: self.len as u8,
        })
    }
}
