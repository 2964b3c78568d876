//! Backend-neutral span records: what the demo checks and draws, from the in-process
//! report or from ranks in other processes (one JSON line per span on their stdout).

use std::time::{SystemTime, UNIX_EPOCH};

use lens::link::attributes::LINK_SOURCE_RANK;
use lens::{ClockOffset, arrivals, hang};

use opentelemetry::{Array, Value};
use opentelemetry_sdk::trace::SpanData;
use serde_json::{Value as Json, json};

/// Prefix of a span line a rank process prints.
pub(crate) const SPAN_LINE: &str = "lens-span ";

/// A link of a [`SpanRecord`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LinkRecord {
    pub(crate) trace_id: String,
    pub(crate) span_id: String,
    pub(crate) source_rank: Option<i64>,
}

/// A finished span, reduced to what the demo needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SpanRecord {
    pub(crate) rank: usize,
    pub(crate) name: String,
    pub(crate) trace_id: String,
    pub(crate) span_id: String,
    pub(crate) parent_span_id: String,
    pub(crate) step: Option<i64>,
    /// Microseconds since the Unix epoch.
    pub(crate) start_us: f64,
    pub(crate) end_us: f64,
    pub(crate) links: Vec<LinkRecord>,
    /// On the source's step span: the rank that came last to the step's broadcast, and how
    /// far apart the ranks came (ns), where the backend knows.
    pub(crate) last_rank: Option<i64>,
    pub(crate) spread_ns: Option<i64>,
    /// On a `lens.hang` span: the round that timed out, the ranks it waited for, and the
    /// spans open then (name, age in ns).
    pub(crate) hang: Option<HangRecord>,
}

/// What a rank's hang report says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HangRecord {
    pub(crate) round: Option<i64>,
    pub(crate) missing: Vec<i64>,
    /// Where the rank learnt of `missing` when another rank found them missing.
    pub(crate) via: Vec<i64>,
    pub(crate) open: Vec<(String, i64)>,
}

impl HangRecord {
    fn from_span(s: &SpanData) -> Option<HangRecord> {
        if s.name != hang::keys::SPAN {
            return None;
        }
        let ints = |key: &str| {
            s.attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .and_then(|kv| match &kv.value {
                    Value::Array(Array::I64(v)) => Some(v.clone()),
                    _ => None,
                })
                .unwrap_or_default()
        };
        let (missing, via) = (ints(hang::keys::MISSING_RANKS), ints(hang::keys::VIA));
        let open = s
            .events
            .iter()
            .filter(|e| e.name == hang::keys::OPEN_SPAN_EVENT)
            .map(|e| {
                let name = e
                    .attributes
                    .iter()
                    .find(|kv| kv.key.as_str() == hang::keys::SPAN_NAME)
                    .map(|kv| kv.value.as_str().into_owned())
                    .unwrap_or_default();
                let age = e
                    .attributes
                    .iter()
                    .find(|kv| kv.key.as_str() == hang::keys::SPAN_AGE_NS)
                    .and_then(|kv| match kv.value {
                        Value::I64(v) => Some(v),
                        _ => None,
                    })
                    .unwrap_or(0);
                (name, age)
            })
            .collect();
        Some(HangRecord {
            round: int_attr(s, hang::keys::ROUND),
            missing,
            via,
            open,
        })
    }

    fn to_json(&self) -> Json {
        json!({"round": self.round, "missing": self.missing, "via": self.via, "open": self.open})
    }

    fn from_json(v: &Json) -> Option<HangRecord> {
        let ints = |key: &str| -> Option<Vec<i64>> {
            Some(
                v.get(key)?
                    .as_array()?
                    .iter()
                    .filter_map(Json::as_i64)
                    .collect(),
            )
        };
        Some(HangRecord {
            round: v.get("round").and_then(Json::as_i64),
            missing: ints("missing")?,
            via: ints("via").unwrap_or_default(),
            open: v
                .get("open")?
                .as_array()?
                .iter()
                .filter_map(|o| Some((o.get(0)?.as_str()?.to_owned(), o.get(1)?.as_i64()?)))
                .collect(),
        })
    }
}

fn int_attr(s: &SpanData, key: &str) -> Option<i64> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .and_then(|kv| match kv.value {
            Value::I64(v) => Some(v),
            _ => None,
        })
}

fn unix_us(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

impl SpanRecord {
    pub(crate) fn from_span(rank: usize, s: &SpanData, step_key: &str) -> Self {
        let step = int_attr(s, step_key);
        SpanRecord {
            rank,
            name: s.name.to_string(),
            trace_id: s.span_context.trace_id().to_string(),
            span_id: s.span_context.span_id().to_string(),
            parent_span_id: s.parent_span_id.to_string(),
            step,
            start_us: unix_us(s.start_time),
            end_us: unix_us(s.end_time),
            links: s
                .links
                .iter()
                .map(|l| LinkRecord {
                    trace_id: l.span_context.trace_id().to_string(),
                    span_id: l.span_context.span_id().to_string(),
                    source_rank: l
                        .attributes
                        .iter()
                        .find(|kv| kv.key.as_str() == LINK_SOURCE_RANK)
                        .and_then(|kv| match kv.value {
                            Value::I64(v) => Some(v),
                            _ => None,
                        }),
                })
                .collect(),
            last_rank: int_attr(s, arrivals::keys::LAST_RANK),
            spread_ns: int_attr(s, arrivals::keys::SPREAD_NS),
            hang: HangRecord::from_span(s),
        }
    }

    /// This span on a clock `ns` nanoseconds behind the one it was recorded on (a rank's
    /// measured offset from rank 0 takes it onto rank 0's clock).
    pub(crate) fn moved_back(mut self, ns: i64) -> Self {
        let us = ns as f64 / 1000.0;
        self.start_us -= us;
        self.end_us -= us;
        self
    }

    pub(crate) fn to_json(&self) -> Json {
        json!({
            "rank": self.rank, "name": self.name, "trace_id": self.trace_id, "span_id": self.span_id,
            "parent_span_id": self.parent_span_id, "step": self.step, "start_us": self.start_us,
            "end_us": self.end_us, "last_rank": self.last_rank, "spread_ns": self.spread_ns,
            "hang": self.hang.as_ref().map(HangRecord::to_json),
            "links": self.links.iter().map(|l| json!({
                "trace_id": l.trace_id, "span_id": l.span_id, "source_rank": l.source_rank,
            })).collect::<Vec<_>>(),
        })
    }

    #[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
    pub(crate) fn from_json(v: &Json) -> Option<Self> {
        let s = |k: &str| v.get(k).and_then(Json::as_str).map(str::to_owned);
        Some(SpanRecord {
            rank: usize::try_from(v.get("rank")?.as_u64()?).ok()?,
            name: s("name")?,
            trace_id: s("trace_id")?,
            span_id: s("span_id")?,
            parent_span_id: s("parent_span_id")?,
            step: v.get("step").and_then(Json::as_i64),
            start_us: v.get("start_us")?.as_f64()?,
            end_us: v.get("end_us")?.as_f64()?,
            links: v
                .get("links")?
                .as_array()?
                .iter()
                .map(|l| {
                    Some(LinkRecord {
                        trace_id: l.get("trace_id")?.as_str()?.to_owned(),
                        span_id: l.get("span_id")?.as_str()?.to_owned(),
                        source_rank: l.get("source_rank").and_then(Json::as_i64),
                    })
                })
                .collect::<Option<Vec<_>>>()?,
            last_rank: v.get("last_rank").and_then(Json::as_i64),
            spread_ns: v.get("spread_ns").and_then(Json::as_i64),
            hang: v.get("hang").and_then(HangRecord::from_json),
        })
    }
}

/// Every rank's spans and failures after a demo run, whatever the backend.
#[derive(Debug, Default)]
pub(crate) struct Job {
    /// Spans by rank.
    pub(crate) ranks: Vec<Vec<SpanRecord>>,
    /// `(rank, reason, is a timeout)` for each rank that failed.
    pub(crate) failures: Vec<(usize, String, bool)>,
    /// Ranks that never ran.
    pub(crate) absent: Vec<usize>,
    /// With `--otlp`: what became of each rank's exported spans.
    pub(crate) exports: Vec<super::export::ExportRecord>,
    /// Each rank's clock against rank 0's, where the ranks measured it (processes); their
    /// spans are already on rank 0's clock.
    pub(crate) clocks: Vec<Option<ClockOffset>>,
    /// With `--sample`, by rank: the steps its sampler decided, and why each was kept.
    pub(crate) kept: Vec<Option<Vec<Decided>>>,
}

/// Prefix of the line a rank process prints with the steps its sampler decided.
pub(crate) const KEPT_LINE: &str = "lens-kept ";

pub(crate) fn kept_json(kept: &[Decided]) -> Json {
    Json::Array(kept.iter().map(|(s, r)| json!([s, r])).collect())
}

#[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
pub(crate) fn kept_from_json(v: &Json) -> Option<Vec<Decided>> {
    v.as_array()?
        .iter()
        .map(|d| {
            let pair = d.as_array()?;
            let step = pair.first()?.as_i64()?;
            let reason = pair.get(1)?.as_str().map(str::to_owned);
            Some((step, reason))
        })
        .collect()
}

/// Prefix of the line a rank process prints with its clock offset from rank 0.
pub(crate) const CLOCK_LINE: &str = "lens-clock ";

pub(crate) fn clock_json(c: &ClockOffset) -> Json {
    json!({"offset_ns": c.offset_ns, "error_ns": c.error_ns})
}

#[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
pub(crate) fn clock_from_json(v: &Json) -> Option<ClockOffset> {
    Some(ClockOffset {
        offset_ns: v.get("offset_ns")?.as_i64()?,
        error_ns: v.get("error_ns")?.as_u64()?,
    })
}

impl Job {
    pub(crate) fn named(&self, rank: usize, name: &str) -> Vec<&SpanRecord> {
        self.ranks.get(rank).map_or(Vec::new(), |v| {
            v.iter().filter(|s| s.name == name).collect()
        })
    }
}

/// A step the sampler decided: the demo's step (from 0) and why it was kept (`None`:
/// dropped).
pub(crate) type Decided = (i64, Option<String>);

#[cfg(test)]
mod tests {
    use super::*;

    fn span(rank: usize, start_us: f64) -> SpanRecord {
        SpanRecord {
            rank,
            name: "s".into(),
            trace_id: String::new(),
            span_id: String::new(),
            parent_span_id: String::new(),
            step: Some(0),
            start_us,
            end_us: start_us + 10.0,
            links: Vec::new(),
            last_rank: None,
            spread_ns: None,
            hang: None,
        }
    }

    /// A span of a rank 2.5 s ahead is moved back by its offset; the clock's JSON line
    /// round-trips.
    #[test]
    fn spans_move_onto_rank_0s_clock() {
        let ahead = ClockOffset {
            offset_ns: 2_500_000_000,
            error_ns: 100_000,
        };
        let moved = span(1, 2_501_000.0).moved_back(ahead.offset_ns);
        assert_eq!((moved.start_us, moved.end_us), (1_000.0, 1_010.0));
        assert_eq!(span(2, 7.0).moved_back(0).start_us, 7.0);
        assert_eq!(clock_from_json(&clock_json(&ahead)), Some(ahead));
    }
}
