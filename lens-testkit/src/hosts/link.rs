//! What a simulated host's link to the switch does to its packets: delay each way, jitter,
//! loss, and whether it is cut.

use std::time::Duration;

use lens_core::{Error, Result};

/// One host's link to the switch of a [`Network`](super::Network).
///
/// A packet from host A to host B waits A's [`send`](Link::send) delay, then B's
/// [`recv`](Link::recv) delay, each with up to ± [`jitter`](Link::jitter) added, and is lost
/// with A's and B's [`loss`](Link::loss) rates; packets of one pair of hosts keep their
/// order (a later one never overtakes an earlier one, as on one path through a switch).
/// So between two hosts with the same link the round trip is `2·(send + recv)`.
///
/// ```
/// use std::time::Duration;
/// use lens_testkit::hosts::Link;
///
/// // 1 ms out, 3 ms back: an asymmetric path.
/// let asym = Link::new().send(Duration::from_millis(1)).recv(Duration::from_millis(3));
/// assert_eq!(Link::parse("send=1ms,recv=3ms")?, asym);
/// # Ok::<(), lens_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct Link {
    /// Delay of the packets this host sends.
    pub send: Duration,
    /// Delay of the packets this host receives.
    pub recv: Duration,
    /// Up to this much more or less on each of the two delays, uniformly, per packet.
    pub jitter: Duration,
    /// The chance that a packet is lost on this link, each way (0 to 1).
    pub loss: f64,
    /// The chance that a TCP segment with data, sent or received on this link, resets its
    /// connection instead of arriving (0 to 1): both ends get a reset they accept.
    pub reset: f64,
}

impl Link {
    /// A link that adds nothing: the switch's own latency only.
    pub fn new() -> Self {
        Link::default()
    }

    /// The same delay both ways.
    #[must_use]
    pub fn delay(self, each_way: Duration) -> Self {
        self.send(each_way).recv(each_way)
    }

    /// The delay of the packets this host sends.
    #[must_use]
    pub fn send(mut self, d: Duration) -> Self {
        self.send = d;
        self
    }

    /// The delay of the packets this host receives.
    #[must_use]
    pub fn recv(mut self, d: Duration) -> Self {
        self.recv = d;
        self
    }

    /// Jitter on each of the two delays.
    #[must_use]
    pub fn jitter(mut self, d: Duration) -> Self {
        self.jitter = d;
        self
    }

    /// The chance that a packet is lost on this link, each way.
    #[must_use]
    pub fn loss(mut self, p: f64) -> Self {
        self.loss = p;
        self
    }

    /// The chance that a TCP segment with data resets its connection.
    #[must_use]
    pub fn reset(mut self, p: f64) -> Self {
        self.reset = p;
        self
    }

    /// Parses `key=value` pairs separated by commas: `delay=` (both ways), `send=`, `recv=`,
    /// `jitter=` (durations: `250us`, `1ms`, `0.5ms`, `2s`), `rtt=` (the round trip between
    /// two hosts with this link: `delay = rtt / 4`), `loss=` and `reset=` (0 to 1). Empty text is
    /// [`Link::new`]. A bad pair is an [`Error::Config`] naming it.
    pub fn parse(text: &str) -> Result<Self> {
        let mut link = Link::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = |why: &str| Error::config(format!("link setting {pair:?}: {why}"));
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| bad("expected key=value"))?;
            let duration = || {
                parse_duration(value.trim())
                    .ok_or_else(|| bad("not a duration such as 250us, 1ms or 2s"))
            };
            let chance = || {
                value
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| bad("not a probability from 0 to 1"))
            };
            match key.trim() {
                "delay" => link = link.delay(duration()?),
                "send" => link.send = duration()?,
                "recv" => link.recv = duration()?,
                "jitter" => link.jitter = duration()?,
                "rtt" => link = link.delay(duration()? / 4),
                "loss" => link.loss = chance()?,
                "reset" => link.reset = chance()?,
                _ => {
                    return Err(bad(
                        "keys are delay, send, recv, jitter, rtt, loss and reset",
                    ));
                }
            }
        }
        Ok(link)
    }
}

/// `250us`, `1ms`, `0.5ms`, `2s`, `100ns`.
fn parse_duration(text: &str) -> Option<Duration> {
    let at = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(at);
    let n: f64 = number
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(n * scale).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn links_parse_or_say_why_not() {
        let ok: &[(&str, Link, &str)] = &[
            ("", Link::new(), "empty is no impairment"),
            ("delay=1ms", Link::new().delay(MS), "both ways"),
            (
                "send=1ms, recv=3ms",
                Link::new().send(MS).recv(3 * MS),
                "asymmetric, spaces",
            ),
            (
                "rtt=4ms",
                Link::new().delay(MS),
                "a round trip crosses two links twice",
            ),
            (
                "delay=2ms,jitter=200us",
                Link::new().delay(2 * MS).jitter(MS / 5),
                "jitter",
            ),
            ("delay=0.5ms", Link::new().delay(MS / 2), "fractions"),
            ("loss=0.01", Link::new().loss(0.01), "loss"),
            ("reset=0.5,loss=0", Link::new().reset(0.5), "resets"),
        ];
        for (text, want, why) in ok {
            assert_eq!(Link::parse(text).ok(), Some(*want), "{text:?}: {why}");
        }
        let bad: &[(&str, &str)] = &[
            ("delay", "key=value"),
            ("delay=1", "duration"),
            ("delay=-1ms", "duration"),
            ("delay=1h", "duration"),
            ("loss=2", "probability"),
            ("loss=x", "probability"),
            ("reset=-0.1", "probability"),
            ("speed=1ms", "keys are"),
        ];
        for (text, says) in bad {
            let e = Link::parse(text).expect_err(text).to_string();
            assert!(e.contains(says) && e.contains(text), "{text:?}: {e}");
        }
    }
}
