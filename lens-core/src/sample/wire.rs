//! The source's word on the steps, as it travels in the carrier of the next round: the
//! source's step number and, once known, the decision for an earlier step.

use crate::carrier::Carrier;

/// The carrier entry the decision travels in; every rank takes it out of the carrier
/// before the caller sees it.
pub const CARRIER_KEY: &str = "lens-sample";

/// Why a step was kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// A rank voted: [`super::StepSampler::keep_this_step`], or a span with an error status.
    Vote,
    /// It took a rank longer than `slower-than`.
    Slow,
    /// It took the source longer than the `slower-than=pQ` quantile of recent steps.
    Quantile,
    /// Its ranks came to its end further apart than `spread-over`.
    Spread,
    /// The 1-in-K baseline picked it.
    Baseline,
    /// A round failed (a timeout, with its hang report, or another error): what the rank
    /// held is kept.
    Error,
    /// The rank's group or provider ended before the decision came.
    Exit,
    /// The rank held more than its cap: it kept the step at once and voted for it.
    Cap,
    /// No decision came for it (a source without a sampler, a lost decision).
    Undecided,
}

impl Reason {
    /// The name written in `lens.sample.reason` and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Vote => "vote",
            Reason::Slow => "slow",
            Reason::Quantile => "quantile",
            Reason::Spread => "spread",
            Reason::Baseline => "baseline",
            Reason::Error => "error",
            Reason::Exit => "exit",
            Reason::Cap => "cap",
            Reason::Undecided => "undecided",
        }
    }

    fn parse(s: &str) -> Option<Reason> {
        [
            Reason::Vote,
            Reason::Slow,
            Reason::Quantile,
            Reason::Spread,
            Reason::Baseline,
            Reason::Error,
            Reason::Exit,
            Reason::Cap,
            Reason::Undecided,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the source decided for one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    pub step: u64,
    /// `None`: dropped.
    pub keep: Option<Reason>,
    /// The threshold the kept spans carry (`ALWAYS` but for the baseline).
    pub threshold: super::Threshold,
}

/// What one round's carrier says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word {
    /// The step the round begins, in the source's count.
    pub step: u64,
    pub decision: Option<Decision>,
}

impl Word {
    pub(crate) fn encode(&self) -> String {
        let mut s = String::with_capacity(48);
        s.push_str("step=");
        push_u64(&mut s, self.step);
        if let Some(d) = &self.decision {
            s.push_str(";decided=");
            push_u64(&mut s, d.step);
            match d.keep {
                Some(r) => {
                    s.push_str(";keep=");
                    s.push_str(r.as_str());
                    if d.threshold != super::Threshold::ALWAYS {
                        s.push_str(";th=");
                        s.push_str(&d.threshold.th());
                    }
                }
                None => s.push_str(";drop"),
            }
        }
        s
    }

    /// `None` for anything that is not a word lens wrote (the rank then keeps what it
    /// holds rather than guess).
    pub(crate) fn decode(s: &str) -> Option<Word> {
        let mut step = None;
        let mut decided = None;
        let mut keep = None;
        let mut drop = false;
        let mut threshold = super::Threshold::ALWAYS;
        for part in s.split(';') {
            match part.split_once('=') {
                Some(("step", v)) => step = Some(v.parse().ok()?),
                Some(("decided", v)) => decided = Some(v.parse().ok()?),
                Some(("keep", v)) => keep = Some(Reason::parse(v)?),
                Some(("th", v)) => threshold = super::Threshold::from_th(v)?,
                None if part == "drop" => drop = true,
                _ => return None,
            }
        }
        let decision = match (decided, keep, drop) {
            (None, None, false) => None,
            (Some(step), Some(r), false) => Some(Decision {
                step,
                keep: Some(r),
                threshold,
            }),
            (Some(step), None, true) => Some(Decision {
                step,
                keep: None,
                threshold,
            }),
            _ => return None,
        };
        Some(Word {
            step: step?,
            decision,
        })
    }

    /// Takes the word out of `carrier`, if it holds one.
    pub(crate) fn take(carrier: &mut Carrier) -> Option<Option<Word>> {
        carrier.remove(CARRIER_KEY).map(|v| Word::decode(&v))
    }

    /// Cuts the word off the end of a carrier's JSON bytes, where the source writes it
    /// (`, "lens-sample": "..."}`, or `{"lens-sample": "..."}` alone), so that the rest
    /// decodes as the carrier it was, with no copy; `None` when the bytes do not end so.
    pub(crate) fn cut(bytes: &mut Vec<u8>) -> Option<Option<Word>> {
        const KEY: &[u8] = b"\"lens-sample\": \"";
        let end = bytes.len().checked_sub(2)?;
        if bytes.get(end..)? != b"\"}" {
            return None;
        }
        // The last value's opening quote, found from the end: a word is short, and every
        // carrier's last value is looked at (this runs on every rank, sampling or not).
        let open = memchr::memrchr(b'"', bytes.get(..end)?)?;
        if !bytes.get(..=open)?.ends_with(KEY) {
            return None;
        }
        let at = open + 1 - KEY.len();
        let value = bytes.get(open + 1..end)?;
        // A word is plain ASCII: no quote, no escape; anything else is not lens's.
        if value
            .iter()
            .any(|&b| b == b'"' || b == b'\\' || !b.is_ascii_graphic())
        {
            return None;
        }
        let word = std::str::from_utf8(value).ok().map(Word::decode)?;
        let before = bytes.get(..at)?;
        let cut = if before.ends_with(b", ") {
            at - 2
        } else if before == b"{" {
            at
        } else {
            return None;
        };
        bytes.truncate(cut);
        bytes.push(b'}');
        Some(word)
    }
}

/// `n` in decimal, without the formatting machinery (this runs once a round).
fn push_u64(s: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.extend(digits[i..].iter().map(|&d| char::from(d)));
}

#[cfg(test)]
mod tests {
    use super::super::Threshold;
    use super::*;

    #[test]
    fn a_word_is_cut_off_the_bytes_it_ends() {
        let word = Word {
            step: 4,
            decision: None,
        };
        // (why, carrier bytes, what is left, the word)
        let rows: &[(&str, &str, &str, Option<Option<Word>>)] = &[
            (
                "after a traceparent",
                r#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "lens-sample": "step=4"}"#,
                r#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
                Some(Some(word)),
            ),
            (
                "alone",
                r#"{"lens-sample": "step=4"}"#,
                "{}",
                Some(Some(word)),
            ),
            (
                "a word that does not read",
                r#"{"a": "b", "lens-sample": "step=x"}"#,
                r#"{"a": "b"}"#,
                Some(None),
            ),
            ("no word", r#"{"a": "b"}"#, r#"{"a": "b"}"#, None),
            (
                "not at the end",
                r#"{"lens-sample": "step=4", "a": "b"}"#,
                r#"{"lens-sample": "step=4", "a": "b"}"#,
                None,
            ),
            (
                "an escape in it",
                r#"{"a": "b", "lens-sample": "step=4\u0041"}"#,
                r#"{"a": "b", "lens-sample": "step=4\u0041"}"#,
                None,
            ),
            (
                "the key inside another value",
                r#"{"a": "x\"lens-sample\": \"step=4"}"#,
                r#"{"a": "x\"lens-sample\": \"step=4"}"#,
                None,
            ),
        ];
        for &(why, bytes, left, want) in rows {
            let mut b = bytes.as_bytes().to_vec();
            assert_eq!(Word::cut(&mut b), want, "{why}");
            assert_eq!(std::str::from_utf8(&b).expect("utf-8"), left, "{why}");
        }
    }

    #[test]
    fn words_table() {
        let keep = |step, r, t| Decision {
            step,
            keep: Some(r),
            threshold: t,
        };
        // (why, text, word; None: refused)
        let rows: Vec<(&str, &str, Option<Word>)> = vec![
            (
                "a step alone",
                "step=1",
                Some(Word {
                    step: 1,
                    decision: None,
                }),
            ),
            (
                "a slow step kept",
                "step=9;decided=7;keep=slow",
                Some(Word {
                    step: 9,
                    decision: Some(keep(7, Reason::Slow, Threshold::ALWAYS)),
                }),
            ),
            (
                "a baseline step with its threshold",
                "step=9;decided=7;keep=baseline;th=fd70a",
                Some(Word {
                    step: 9,
                    decision: Some(keep(7, Reason::Baseline, Threshold::one_in(100))),
                }),
            ),
            (
                "a dropped step",
                "step=3;decided=1;drop",
                Some(Word {
                    step: 3,
                    decision: Some(Decision {
                        step: 1,
                        keep: None,
                        threshold: Threshold::ALWAYS,
                    }),
                }),
            ),
            ("no step", "decided=1;drop", None),
            ("kept and dropped", "step=3;decided=1;drop;keep=slow", None),
            ("a decision without its step", "step=3;keep=slow", None),
            ("an unknown reason", "step=3;decided=1;keep=whim", None),
            ("an unknown part", "step=3;x=1", None),
            (
                "a bad threshold",
                "step=3;decided=1;keep=baseline;th=zz",
                None,
            ),
            ("a negative step", "step=-3", None),
            ("empty", "", None),
        ];
        for (why, text, want) in rows {
            let got = Word::decode(text);
            assert_eq!(got, want, "{why}");
            if let Some(w) = got {
                assert_eq!(w.encode(), text, "{why}: written back the same");
            }
        }
    }
}
