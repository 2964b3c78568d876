//! OpenTelemetry's rejection threshold (`ot=th:` in the tracestate), so a backend can weigh
//! what the step sampler kept: a span kept with probability p counts 1/p.

use opentelemetry::trace::TraceState;

/// 2^56: thresholds and trace randomness are 56-bit numbers.
const MAX: u128 = 1 << 56;

/// The digits a threshold is written with (before the ones added for small
/// probabilities), as the specification recommends.
const PRECISION: u32 = 4;

/// A rejection threshold: a span is kept when its randomness (the low 56 bits of a random
/// trace id) is at least this.
///
/// ```
/// use lens_core::sample::Threshold;
///
/// assert_eq!(Threshold::ALWAYS.th(), "0");
/// assert_eq!(Threshold::one_in(4).th(), "c");
/// assert_eq!(Threshold::one_in(100).th(), "fd70a");
/// assert!(Threshold::one_in(2).keeps(0x80_0000_0000_0000));
/// assert!(!Threshold::one_in(2).keeps(0x7f_ffff_ffff_ffff));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Threshold(u64);

impl Threshold {
    /// Probability 1: every span kept (`th:0`).
    pub const ALWAYS: Threshold = Threshold(0);

    /// The threshold for probability 1/`k`, rounded as the specification's algorithm does
    /// (4 hexadecimal digits, one more for each factor of 16 below probability 1):
    /// `one_in(0)` is taken as `one_in(1)`; past 2^56 as 2^56.
    pub fn one_in(k: u64) -> Threshold {
        let k = u128::from(k.clamp(1, 1 << 56));
        if k == 1 {
            return Threshold::ALWAYS;
        }
        // frexp's exponent of 1/k is 1 - ceil(log2 k); precision grows by a digit for
        // every 4 of it below zero, up to 12.
        let ceil_log2 = 128 - (k - 1).leading_zeros();
        let exp_below = ceil_log2.saturating_sub(1);
        let digits = (PRECISION + exp_below / 4).clamp(1, 12);
        // Round (1 - 1/k) * 2^56 to `digits` hexadecimal digits of 14, exactly.
        let unit = 1u128 << (4 * (14 - digits));
        let numerator = MAX * (k - 1) * 2 + k * unit;
        let t = numerator / (2 * k * unit) * unit;
        // Rounding up to 2^56 would reject everything: keep the largest threshold instead.
        let t = t.min(MAX - unit);
        Threshold(u64::try_from(t).unwrap_or(u64::MAX))
    }

    /// The 56-bit value.
    pub fn value(self) -> u64 {
        self.0
    }

    /// Whether a span of randomness `r` (56 bits) is kept: `r >= threshold`.
    pub fn keeps(self, r: u64) -> bool {
        r >= self.0
    }

    /// The `th` value: 14 hexadecimal digits with trailing zeros left out, `0` for
    /// probability 1.
    pub fn th(self) -> String {
        if self.0 == 0 {
            return "0".to_owned();
        }
        let s = format!("{:014x}", self.0);
        s.trim_end_matches('0').to_owned()
    }

    /// Reads a `th` value (1 to 14 hexadecimal digits, trailing zeros implied); `None` for
    /// anything else.
    pub fn from_th(th: &str) -> Option<Threshold> {
        if th.is_empty() || th.len() > 14 || !th.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let v = u64::from_str_radix(th, 16).ok()?;
        let shift = 4 * u32::try_from(14 - th.len()).ok()?;
        Some(Threshold(v << shift))
    }

    /// `state` with its `ot` entry's `th` set to this threshold (the entry's other
    /// sub-keys, such as `rv`, kept after it), or `state` unchanged if the result would not
    /// be a valid tracestate.
    pub fn stamp(self, state: &TraceState) -> TraceState {
        let mut value = format!("th:{}", self.th());
        if let Some(ot) = state.get("ot") {
            for part in ot
                .split(';')
                .filter(|p| !p.starts_with("th:") && !p.is_empty())
            {
                value.push(';');
                value.push_str(part);
            }
        }
        state.insert("ot", value).unwrap_or_else(|_| state.clone())
    }
}

/// The 56 random bits of a trace id (its low 7 bytes, per W3C Trace Context Level 2).
pub(crate) fn randomness(trace_id: opentelemetry::trace::TraceId) -> u64 {
    let bytes = trace_id.to_bytes();
    let mut low = [0u8; 8];
    low[1..].copy_from_slice(&bytes[9..]);
    u64::from_be_bytes(low)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's table of 1-in-N thresholds at precision 4
    /// (tracestate-probability-sampling.md, "Converting floating-point probability to
    /// threshold value").
    #[test]
    fn thresholds_match_the_specification() {
        let rows: &[(u64, &str)] = &[
            (1, "0"),
            (2, "8"),
            (3, "aaab"),
            (4, "c"),
            (5, "cccd"),
            (8, "e"),
            (10, "e666"),
            (16, "f"),
            (100, "fd70a"),
            (1000, "ffbe77"),
            (10_000, "fff9724"),
            (100_000, "ffff583a"),
            (1_000_000, "ffffef39"),
        ];
        for &(k, th) in rows {
            assert_eq!(Threshold::one_in(k).th(), th, "1 in {k}");
        }
        // The specification's worked example of 1% (written with 6 digits).
        assert_eq!(
            Threshold(0xfd70a4_00000000).th(),
            "fd70a4",
            "trailing zeros are left out"
        );
        assert_eq!(Threshold::one_in(0), Threshold::ALWAYS, "0 is taken as 1");
        for &(k, th) in rows {
            assert_eq!(
                Threshold::from_th(th),
                Some(Threshold::one_in(k)),
                "read back 1 in {k}"
            );
        }
        for bad in ["", "g", "+1", "123456789abcdef"] {
            assert_eq!(Threshold::from_th(bad), None, "{bad:?}");
        }
        assert!(
            Threshold::one_in(u64::MAX).value() < 1 << 56,
            "never rejects all"
        );
    }

    #[test]
    fn the_ot_entry_keeps_its_other_keys() {
        let t = Threshold::one_in(2);
        let rows: &[(&str, &str, &str)] = &[
            ("no tracestate", "", "ot=th:8"),
            ("another vendor's", "vendor=x", "ot=th:8,vendor=x"),
            (
                "an rv is kept",
                "ot=rv:0123456789abcd",
                "ot=th:8;rv:0123456789abcd",
            ),
            (
                "an older th is replaced",
                "ot=th:c;rv:01,a=b",
                "ot=th:8;rv:01,a=b",
            ),
        ];
        for &(why, before, after) in rows {
            let state: TraceState = before.parse().expect(why);
            assert_eq!(t.stamp(&state).header(), after, "{why}");
        }
    }

    #[test]
    fn randomness_is_the_low_56_bits() {
        let id = opentelemetry::trace::TraceId::from_hex("0123456789abcdef0123456789abcdef")
            .expect("hex");
        assert_eq!(randomness(id), 0x23_4567_89ab_cdef);
    }
}
