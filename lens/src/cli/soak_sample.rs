//! What a rank of `lens soak` reports each sample period, as one JSON line, and what the
//! soak's table and plot are made of.

use serde_json::json;

/// One rank's report for one sample period.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sample {
    pub(crate) rounds: u64,
    pub(crate) failed: u64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) rss_kib: f64,
    pub(crate) fds: f64,
    pub(crate) threads: f64,
}

impl Sample {
    pub(crate) fn to_json(self) -> String {
        json!({
            "rounds": self.rounds, "failed": self.failed, "p50_us": self.p50_us,
            "p99_us": self.p99_us, "rss_kib": self.rss_kib, "fds": self.fds,
            "threads": self.threads,
        })
        .to_string()
    }

    pub(crate) fn from_json(text: &str) -> Option<Sample> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let f = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
        Some(Sample {
            rounds: v.get("rounds")?.as_u64()?,
            failed: v.get("failed")?.as_u64()?,
            p50_us: f("p50_us")?,
            p99_us: f("p99_us")?,
            rss_kib: f("rss_kib")?,
            fds: f("fds")?,
            threads: f("threads")?,
        })
    }
}
