//! Which steps the step sampler keeps: the rules, written in code or as text
//! (`slower-than=25ms,baseline=50`, the syntax of [`LENS_SAMPLE`] and `lens demo --sample`).

use std::time::Duration;

use crate::error::{Error, Result};

/// The rules, as text: a comma-separated list of `name=value` (see [`SampleRules::parse`]).
/// Unset or empty: the sampler is off.
pub const LENS_SAMPLE: &str = "LENS_SAMPLE";

/// Most spans a rank holds for steps not yet decided (default [`DEFAULT_MAX_SPANS`]).
pub const LENS_SAMPLE_MAX_SPANS: &str = "LENS_SAMPLE_MAX_SPANS";

/// Most bytes (an estimate of the spans' size) a rank holds for steps not yet decided
/// (default [`DEFAULT_MAX_BYTES`]).
pub const LENS_SAMPLE_MAX_BYTES: &str = "LENS_SAMPLE_MAX_BYTES";

/// Default cap on the spans a rank holds: 65,536.
pub const DEFAULT_MAX_SPANS: usize = 65_536;

/// Default cap on the bytes a rank holds: 64 MiB.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// Default number of recent steps a quantile rule (`slower-than=p99`) looks at.
pub const DEFAULT_WINDOW: usize = 1000;

/// A quantile rule decides nothing until it has seen this many steps.
pub const MIN_QUANTILE_STEPS: usize = 20;

/// Largest K of `baseline=K`: the smallest probability OpenTelemetry's thresholds express
/// is 2^-56.
pub const MAX_BASELINE: u64 = 1 << 56;

/// The rules of a step sampler: a step is kept, on every rank, when one of them holds;
/// every other step is dropped. No rule at all means the sampler is off.
///
/// ```
/// use std::time::Duration;
/// use lens_core::sample::SampleRules;
///
/// let rules = SampleRules::parse("slower-than=25ms,baseline=50")?;
/// assert_eq!(rules.slower_than(), Some(Duration::from_millis(25)));
/// assert_eq!(rules.baseline(), Some(50));
/// assert!(SampleRules::default().is_off());
/// // In code, the same:
/// let same = SampleRules::default()
///     .with_slower_than(Duration::from_millis(25))
///     .with_baseline(50)?;
/// assert_eq!(rules, same);
/// # Ok::<(), lens_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRules {
    slower_than: Option<Duration>,
    quantile: Option<f64>,
    window: usize,
    spread_over: Option<Duration>,
    votes: bool,
    baseline: Option<u64>,
    max_spans: usize,
    max_bytes: usize,
}

impl Default for SampleRules {
    fn default() -> Self {
        SampleRules {
            slower_than: None,
            quantile: None,
            window: DEFAULT_WINDOW,
            spread_over: None,
            votes: true,
            baseline: None,
            max_spans: DEFAULT_MAX_SPANS,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

impl SampleRules {
    /// The rules the environment sets: [`LENS_SAMPLE`] (parsed as [`SampleRules::parse`]),
    /// [`LENS_SAMPLE_MAX_SPANS`] and [`LENS_SAMPLE_MAX_BYTES`]; the `with_` setters then
    /// override them.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable and what is wrong with its value.
    pub fn from_env() -> Result<Self> {
        Self::from_env_with(|k| std::env::var(k).ok())
    }

    /// [`SampleRules::from_env`] with another source of variables (a test's, a launcher's).
    ///
    /// # Errors
    /// As [`SampleRules::from_env`].
    pub fn from_env_with(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut rules = match lookup(LENS_SAMPLE) {
            Some(text) => Self::parse(&text).map_err(|e| Error::config_of(LENS_SAMPLE, e))?,
            None => Self::default(),
        };
        if let Some(v) = lookup(LENS_SAMPLE_MAX_SPANS) {
            rules.max_spans = count(LENS_SAMPLE_MAX_SPANS, &v)?;
        }
        if let Some(v) = lookup(LENS_SAMPLE_MAX_BYTES) {
            rules.max_bytes = count(LENS_SAMPLE_MAX_BYTES, &v)?;
        }
        Ok(rules)
    }

    /// Parses rules written as a comma-separated list of `name=value`:
    ///
    /// | rule | keeps a step |
    /// |---|---|
    /// | `slower-than=25ms` | that took a rank longer than 25 ms (units `ns`, `us`, `ms`, `s`) |
    /// | `slower-than=p99` | that took the source longer than the 99th percentile of recent steps |
    /// | `window=1000` | (the recent steps of a quantile rule: default 1000) |
    /// | `spread-over=5ms` | whose ranks came to its end more than 5 ms apart |
    /// | `votes=off` | (default `on`: a step a rank voted for, by [`super::StepSampler::keep_this_step`] or a span with an error status) |
    /// | `baseline=50` | one in 50 of the others, at random |
    /// | `max-spans=N`, `max-bytes=N` | (the caps, as [`LENS_SAMPLE_MAX_SPANS`] and [`LENS_SAMPLE_MAX_BYTES`]) |
    ///
    /// An empty text is no rule (the sampler off).
    ///
    /// # Errors
    /// [`Error::Config`] naming the rule and what is wrong with it: an unknown name, a
    /// value that does not parse, a baseline of 0 or over 2^56, a quantile outside (0, 100).
    pub fn parse(text: &str) -> Result<Self> {
        let mut rules = Self::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((name, value)) = item.split_once('=') else {
                return Err(Error::config(format!(
                    "{item:?} is not name=value (rules: {NAMES})"
                )));
            };
            let (name, value) = (name.trim(), value.trim());
            match name {
                "slower-than" => match value.strip_prefix('p') {
                    Some(q) => rules = rules.with_quantile(percent(item, q)?)?,
                    None => rules.slower_than = Some(duration(item, value)?),
                },
                "window" => rules.window = count(item, value)?,
                "spread-over" => rules.spread_over = Some(duration(item, value)?),
                "votes" => {
                    rules.votes = match value {
                        "on" | "true" | "1" => true,
                        "off" | "false" | "0" => false,
                        _ => return Err(Error::config(format!("{item:?}: votes is on or off"))),
                    }
                }
                "baseline" => {
                    let k = value.parse::<u64>().map_err(|_| {
                        Error::config(format!("{item:?}: baseline is a whole number K (1 in K)"))
                    })?;
                    rules = rules.with_baseline(k)?;
                }
                "max-spans" => rules.max_spans = count(item, value)?,
                "max-bytes" => rules.max_bytes = count(item, value)?,
                _ => {
                    return Err(Error::config(format!(
                        "{name:?} is not a sampling rule (rules: {NAMES})"
                    )));
                }
            }
        }
        Ok(rules)
    }

    /// Keeps a step that took a rank longer than `d` (each rank measures its own part,
    /// from the end of the round that began the step to its entry into the next).
    #[must_use]
    pub fn with_slower_than(mut self, d: Duration) -> Self {
        self.slower_than = Some(d);
        self
    }

    /// Keeps a step that took the source (round to round) longer than the `q` quantile
    /// (0 < q < 1, say 0.99) of the last [`SampleRules::with_window`] steps.
    ///
    /// # Errors
    /// [`Error::Config`] for a `q` outside (0, 1).
    pub fn with_quantile(mut self, q: f64) -> Result<Self> {
        if !(q > 0.0 && q < 1.0) {
            return Err(Error::config(format!(
                "a quantile of {q} is outside (0, 1): write p99 for 0.99"
            )));
        }
        self.quantile = Some(q);
        Ok(self)
    }

    /// How many recent steps a quantile rule looks at (default [`DEFAULT_WINDOW`]; at
    /// least [`MIN_QUANTILE_STEPS`] are taken).
    #[must_use]
    pub fn with_window(mut self, steps: usize) -> Self {
        self.window = steps;
        self
    }

    /// Keeps a step whose ranks came to the round that ended it more than `d` apart (where
    /// the backend tells the source how the ranks arrived: in process, TCP).
    #[must_use]
    pub fn with_spread_over(mut self, d: Duration) -> Self {
        self.spread_over = Some(d);
        self
    }

    /// Whether a rank's vote keeps a step (default on).
    #[must_use]
    pub fn with_votes(mut self, on: bool) -> Self {
        self.votes = on;
        self
    }

    /// Keeps one in `k` of the steps no other rule keeps, at random (consistently with the
    /// step's trace id where it has one); those carry the threshold of probability 1/k.
    ///
    /// # Errors
    /// [`Error::Config`] for 0 or more than [`MAX_BASELINE`].
    pub fn with_baseline(mut self, k: u64) -> Result<Self> {
        if k == 0 || k > MAX_BASELINE {
            return Err(Error::config(format!(
                "a baseline of 1 in {k} is outside 1 to 2^56"
            )));
        }
        self.baseline = Some(k);
        Ok(self)
    }

    /// The cap on the spans a rank holds ([`LENS_SAMPLE_MAX_SPANS`]).
    #[must_use]
    pub fn with_max_spans(mut self, spans: usize) -> Self {
        self.max_spans = spans;
        self
    }

    /// The cap on the bytes a rank holds ([`LENS_SAMPLE_MAX_BYTES`]).
    #[must_use]
    pub fn with_max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// No rule is set: the sampler passes every span on as it ends.
    pub fn is_off(&self) -> bool {
        self.slower_than.is_none()
            && self.quantile.is_none()
            && self.spread_over.is_none()
            && self.baseline.is_none()
    }

    /// The `slower-than` duration.
    pub fn slower_than(&self) -> Option<Duration> {
        self.slower_than
    }

    /// The `slower-than=pQ` quantile, as a fraction.
    pub fn quantile(&self) -> Option<f64> {
        self.quantile
    }

    /// The steps a quantile looks at.
    pub fn window(&self) -> usize {
        self.window.max(MIN_QUANTILE_STEPS)
    }

    /// The `spread-over` duration.
    pub fn spread_over(&self) -> Option<Duration> {
        self.spread_over
    }

    /// Whether votes keep steps.
    pub fn votes(&self) -> bool {
        self.votes
    }

    /// The `baseline` K (1 in K).
    pub fn baseline(&self) -> Option<u64> {
        self.baseline
    }

    /// The cap on held spans.
    pub fn max_spans(&self) -> usize {
        self.max_spans
    }

    /// The cap on held bytes.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}

const NAMES: &str = "slower-than, window, spread-over, votes, baseline, max-spans, max-bytes";

fn count(what: &str, value: &str) -> Result<usize> {
    value
        .trim()
        .parse::<usize>()
        .map_err(|_| Error::config(format!("{what}={value:?} is not a whole number")))
}

fn percent(item: &str, q: &str) -> Result<f64> {
    let p: f64 = q
        .parse()
        .map_err(|_| Error::config(format!("{item:?}: write a percentile as p99 or p99.9")))?;
    if !(p > 0.0 && p < 100.0) {
        return Err(Error::config(format!(
            "{item:?}: a percentile is between 0 and 100"
        )));
    }
    Ok(p / 100.0)
}

/// `25ms`, `1.5s`, `300us`, `40000ns`.
pub(crate) fn duration(item: &str, value: &str) -> Result<Duration> {
    let bad = || {
        Error::config(format!(
            "{item:?}: a duration is a number with ns, us, ms or s (say 25ms)"
        ))
    };
    let split = value
        .find(|c: char| c.is_ascii_alphabetic())
        .ok_or_else(bad)?;
    let (number, unit) = value.split_at(split);
    let n: f64 = number.trim().parse().map_err(|_| bad())?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(n * scale).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_table() {
        // (why, text, what it gives or the words its error holds)
        let ms = Duration::from_millis;
        let rows: Vec<(&str, &str, std::result::Result<SampleRules, &str>)> = vec![
            ("empty is off", "", Ok(SampleRules::default())),
            (
                "the issue's example",
                "slower-than=25ms,baseline=50",
                Ok(SampleRules {
                    slower_than: Some(ms(25)),
                    baseline: Some(50),
                    ..SampleRules::default()
                }),
            ),
            (
                "spaces and every rule",
                " slower-than = p99.5 , window=200, spread-over=1.5ms,votes=off,baseline=1, max-spans=10,max-bytes=4096 ",
                Ok(SampleRules {
                    quantile: Some(0.995),
                    window: 200,
                    spread_over: Some(Duration::from_micros(1500)),
                    votes: false,
                    baseline: Some(1),
                    max_spans: 10,
                    max_bytes: 4096,
                    ..SampleRules::default()
                }),
            ),
            (
                "a threshold and a quantile together",
                "slower-than=2s,slower-than=p90",
                Ok(SampleRules {
                    slower_than: Some(Duration::from_secs(2)),
                    quantile: Some(0.9),
                    ..SampleRules::default()
                }),
            ),
            ("no unit", "slower-than=25", Err("a duration is a number")),
            (
                "an unknown unit",
                "slower-than=25h",
                Err("a duration is a number"),
            ),
            ("a negative duration", "spread-over=-1ms", Err("a duration")),
            (
                "an unknown rule",
                "faster-than=1ms",
                Err("is not a sampling rule"),
            ),
            ("no value", "baseline", Err("is not name=value")),
            ("a zero baseline", "baseline=0", Err("outside 1 to 2^56")),
            (
                "a huge baseline",
                "baseline=72057594037927937",
                Err("outside 1 to 2^56"),
            ),
            (
                "a fractional baseline",
                "baseline=1.5",
                Err("whole number K"),
            ),
            ("p100", "slower-than=p100", Err("between 0 and 100")),
            ("p0", "slower-than=p0", Err("between 0 and 100")),
            ("votes maybe", "votes=maybe", Err("on or off")),
            (
                "a cap that is no number",
                "max-spans=lots",
                Err("not a whole number"),
            ),
        ];
        for (why, text, want) in rows {
            match (SampleRules::parse(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{why}"),
                (Err(e), Err(words)) => {
                    assert!(e.to_string().contains(words), "{why}: {e}");
                }
                (got, want) => panic!("{why}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_environment_sets_rules_and_caps() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let r = SampleRules::from_env_with(env(&[
            (LENS_SAMPLE, "spread-over=5ms"),
            (LENS_SAMPLE_MAX_SPANS, "100"),
            (LENS_SAMPLE_MAX_BYTES, "2048"),
        ]))
        .expect("valid");
        assert_eq!(r.spread_over(), Some(Duration::from_millis(5)));
        assert_eq!((r.max_spans(), r.max_bytes()), (100, 2048));
        assert!(SampleRules::from_env_with(env(&[])).expect("none").is_off());
        let e = SampleRules::from_env_with(env(&[(LENS_SAMPLE, "baseline=x")]))
            .expect_err("bad baseline");
        assert!(e.to_string().contains(LENS_SAMPLE), "{e}");
        let e =
            SampleRules::from_env_with(env(&[(LENS_SAMPLE_MAX_BYTES, "-1")])).expect_err("bad cap");
        assert!(e.to_string().contains(LENS_SAMPLE_MAX_BYTES), "{e}");
    }
}
