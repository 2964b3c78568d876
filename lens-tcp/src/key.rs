//! Reading the job key from the environment.
//!
//! - `LENS_TCP_KEY`: UTF-8 text, taken as its bytes (nothing trimmed); or `hex:` followed
//!   by hex digits, or `base64:` followed by standard base64, for a binary key (an
//!   environment variable cannot carry arbitrary bytes).
//! - `LENS_TCP_KEY_FILE`: the file's bytes as they are, so a binary key is never cut.
//!   The one exception: a file that is UTF-8 text without control characters, ending in a
//!   single line break (`\n` or `\r\n`), loses that line break, since `echo key > file`
//!   writes one.

use std::ffi::OsString;

use lens_core::{Error, Result};

use crate::env;

/// The key from the environment: `Ok(None)` when neither variable is set.
pub(crate) fn from_env(lookup: &impl Fn(&str) -> Option<OsString>) -> Result<Option<Vec<u8>>> {
    if let Some(v) = lookup(env::KEY) {
        let Some(text) = v.to_str() else {
            return Err(Error::config_for(
                env::KEY,
                format!(
                    "{} is not valid UTF-8: an environment variable carries text; give a binary key as hex:… or base64:…, or put it in {}",
                    env::KEY,
                    env::KEY_FILE
                ),
            ));
        };
        return parse_var(text).map(Some);
    }
    if let Some(path) = lookup(env::KEY_FILE) {
        let shown = path.to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).map_err(|e| {
            Error::config_for(
                env::KEY_FILE,
                format!("cannot read {}={shown}: {e}", env::KEY_FILE),
            )
        })?;
        if bytes.is_empty() {
            return Err(Error::config_for(
                env::KEY_FILE,
                format!("{}={shown} is empty", env::KEY_FILE),
            ));
        }
        return Ok(Some(from_file(bytes)));
    }
    Ok(None)
}

/// The value of `LENS_TCP_KEY`.
pub(crate) fn parse_var(text: &str) -> Result<Vec<u8>> {
    if text.is_empty() {
        return Err(Error::config_for(
            env::KEY,
            format!("{} is set but empty", env::KEY),
        ));
    }
    if let Some(h) = text.strip_prefix("hex:") {
        return hex(h.trim()).ok_or_else(|| {
            Error::config_for(
                env::KEY,
                format!(
                    "{} starts with hex: but the rest is not an even number of hex digits",
                    env::KEY
                ),
            )
        });
    }
    if let Some(b) = text.strip_prefix("base64:") {
        return base64(b.trim()).ok_or_else(|| {
            Error::config_for(
                env::KEY,
                format!(
                    "{} starts with base64: but the rest is not standard base64",
                    env::KEY
                ),
            )
        });
    }
    Ok(text.as_bytes().to_vec())
}

/// A key file's bytes, less the line break a text editor or `echo` adds to a text key.
pub(crate) fn from_file(mut bytes: Vec<u8>) -> Vec<u8> {
    let body_len = if bytes.ends_with(b"\r\n") {
        bytes.len() - 2
    } else if bytes.ends_with(b"\n") {
        bytes.len() - 1
    } else {
        return bytes;
    };
    let is_text = std::str::from_utf8(&bytes[..body_len])
        .is_ok_and(|s| !s.is_empty() && !s.chars().any(char::is_control));
    if is_text {
        bytes.truncate(body_len);
    }
    bytes
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.is_empty() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn base64(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    if s.is_empty() {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        acc = (acc << 6) | value(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // Leftover bits must be padding zeros, and a single leftover character is no byte.
    (acc == 0 && s.len() % 4 != 1).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_table() {
        let rows: Vec<(&str, &str, Option<&[u8]>)> = vec![
            ("text", "a job key of text", Some(b"a job key of text")),
            ("text keeps spaces", " key ", Some(b" key ")),
            ("hex", "hex:00ff10", Some(&[0, 255, 16])),
            ("hex upper", "hex:ABCD", Some(&[0xab, 0xcd])),
            ("hex odd", "hex:abc", None),
            ("hex bad digit", "hex:zz", None),
            ("base64", "base64:AP8Q", Some(&[0, 255, 16])),
            ("base64 padded", "base64:AQ==", Some(&[1])),
            ("base64 bad char", "base64:A*==", None),
            ("base64 one char", "base64:A", None),
            ("empty", "", None),
        ];
        for (why, text, want) in rows {
            let got = parse_var(text).ok();
            assert_eq!(got.as_deref(), want, "{why}");
        }
    }

    #[test]
    fn file_table() {
        let binary_with_newline = [0x00u8, 0xff, 0x0a, 0x20, 0x0a].to_vec();
        let rows: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
            (
                "text with newline",
                b"secret key\n".to_vec(),
                b"secret key".to_vec(),
            ),
            (
                "text with CRLF",
                b"secret key\r\n".to_vec(),
                b"secret key".to_vec(),
            ),
            (
                "text without newline",
                b"secret key".to_vec(),
                b"secret key".to_vec(),
            ),
            (
                "only one newline goes",
                b"key\n\n".to_vec(),
                b"key\n\n".to_vec(),
            ),
            (
                "binary ending in a newline",
                binary_with_newline.clone(),
                binary_with_newline,
            ),
            (
                "binary ending in a space",
                vec![1, 2, 3, b' '],
                vec![1, 2, 3, b' '],
            ),
        ];
        for (why, bytes, want) in rows {
            assert_eq!(from_file(bytes), want, "{why}");
        }
    }

    #[test]
    fn non_utf8_variable_is_named() {
        use std::os::unix::ffi::OsStringExt as _;
        let bad = OsString::from_vec(vec![0xff, 0xfe, 0x41]);
        let lookup = |k: &str| (k == env::KEY).then(|| bad.clone());
        let err = from_env(&lookup).expect_err("not UTF-8");
        assert!(err.to_string().contains("not valid UTF-8"), "{err}");
    }
}
