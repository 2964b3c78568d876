//! Word-at-a-time byte scans for the codec's fast paths (carriers are short ASCII strings,
//! and these checks run on every encode and decode).

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Some byte of `x` is below `n` (`n <= 128`).
#[inline]
fn has_less(x: u64, n: u8) -> bool {
    x.wrapping_sub(LO * u64::from(n)) & !x & HI != 0
}

/// Some byte of `x` equals `b`.
#[inline]
fn has_byte(x: u64, b: u8) -> bool {
    let y = x ^ (LO * u64::from(b));
    y.wrapping_sub(LO) & !y & HI != 0
}

/// True when `pred` holds for every 8-byte word (`word`) and every leftover byte (`byte`).
#[inline]
fn all(bytes: &[u8], word: impl Fn(u64) -> bool, byte: impl Fn(u8) -> bool) -> bool {
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        if !word(u64::from_le_bytes(w)) {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| byte(b))
}

/// Every byte is printable ASCII other than `"` and `\`: JSON with `ensure_ascii` writes
/// such a string as it is.
pub(crate) fn json_plain(bytes: &[u8]) -> bool {
    all(
        bytes,
        |x| {
            x & HI == 0
                && !has_less(x, 0x20)
                && !has_byte(x, 0x7f)
                && !has_byte(x, b'"')
                && !has_byte(x, b'\\')
        },
        |b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\',
    )
}

/// The high bit of each byte of `x` that is not plain (as [`json_plain`]). Exact for the
/// lowest such byte; bytes above it may be flagged too (borrows), so only the lowest flag
/// may be used.
#[inline]
fn not_plain(x: u64) -> u64 {
    let zero = |y: u64| y.wrapping_sub(LO) & !y;
    let below_space = x.wrapping_sub(LO * 0x20) & !x;
    (x | below_space
        | zero(x ^ (LO * 0x7f))
        | zero(x ^ (LO * u64::from(b'"')))
        | zero(x ^ (LO * u64::from(b'\\'))))
        & HI
}

/// The length of the plain string (as [`json_plain`]) that `bytes` start with, when a `"`
/// ends it; `None` when a byte that is not plain comes first, or no `"` does. One pass, a
/// word at a time, the last word padded with zeros (which are not plain): carrier strings
/// are short: a search for the quote followed by a second scan of what it passed cost
/// twice as much, and a byte loop over the tail cost decoding a traceparent carrier 13 %.
pub(crate) fn plain_prefix_to_quote(bytes: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        let mut w = [0u8; 8];
        let full = match bytes.get(i..i + 8) {
            Some(c) => {
                w.copy_from_slice(c);
                true
            }
            None => {
                let rest = bytes.get(i..)?;
                w[..rest.len()].copy_from_slice(rest);
                false
            }
        };
        let bad = not_plain(u64::from_le_bytes(w));
        if bad != 0 {
            let at = i + (bad.trailing_zeros() / 8) as usize;
            return (bytes.get(at) == Some(&b'"')).then_some(at);
        }
        if !full {
            return None; // unreachable: a padded word holds a zero byte
        }
        i += 8;
    }
}

/// No byte is a control character or `\`: a JSON string body that needs no unescaping.
pub(crate) fn json_unescaped(bytes: &[u8]) -> bool {
    all(
        bytes,
        |x| !has_less(x, 0x20) && !has_byte(x, b'\\'),
        |b| b >= 0x20 && b != b'\\',
    )
}

/// W3C `baggage-octet`, less `%` (so that decoding is exact) and `=` (the separator).
const BAGGAGE_PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0x21;
    while b < 0x7f {
        t[b] = !matches!(b as u8, b'"' | b',' | b';' | b'\\' | b'%' | b'=');
        b += 1;
    }
    t
};

/// A byte written as is in a W3C baggage header.
pub(crate) fn baggage_plain_byte(b: u8) -> bool {
    BAGGAGE_PLAIN[usize::from(b)]
}

/// Every byte is a [`baggage_plain_byte`] (baggage names and values are short: a table
/// lookup per byte beats word tricks here).
pub(crate) fn baggage_plain(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| BAGGAGE_PLAIN[usize::from(b)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass quote search agrees with "find the first quote, then check what came
    /// before it", for a bad byte and a quote at every position of words and leftovers.
    #[test]
    fn plain_prefix_to_quote_agrees_with_two_passes() {
        let reference = |s: &[u8]| {
            let end = s.iter().position(|&b| b == b'"')?;
            json_plain(&s[..end]).then_some(end)
        };
        for len in [0usize, 1, 7, 8, 9, 16, 17, 30] {
            for quote in 0..=len {
                for bad_at in 0..=len {
                    for bad in [0x00u8, 0x1f, 0x7f, 0x80, 0xff, b'\\', b'a'] {
                        let mut s = vec![b'x'; len];
                        if bad_at < len {
                            s[bad_at] = bad;
                        }
                        if quote < len {
                            s[quote] = b'"';
                        }
                        assert_eq!(plain_prefix_to_quote(&s), reference(&s), "{s:?}");
                    }
                }
            }
        }
    }

    /// The word-at-a-time checks agree with the byte-at-a-time ones, for every byte value
    /// in every position of a word and in the leftover.
    #[test]
    fn word_and_byte_checks_agree() {
        let json_plain_byte = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
        let unescaped_byte = |b: u8| b >= 0x20 && b != b'\\';
        for len in [1usize, 7, 8, 9, 16, 23] {
            for pos in 0..len {
                for v in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    s[pos] = v;
                    assert_eq!(
                        json_plain(&s),
                        json_plain_byte(v),
                        "json_plain {v:#x} at {pos}/{len}"
                    );
                    assert_eq!(
                        json_unescaped(&s),
                        unescaped_byte(v),
                        "json_unescaped {v:#x} at {pos}/{len}"
                    );
                    let want = matches!(v, 0x21 | 0x23..=0x2b | 0x2d..=0x3a | 0x3c..=0x5b | 0x5d..=0x7e)
                        && v != b'%'
                        && v != b'=';
                    assert_eq!(
                        baggage_plain(&s),
                        want,
                        "baggage_plain {v:#x} at {pos}/{len}"
                    );
                }
            }
        }
    }
}
