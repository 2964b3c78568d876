//! One rank's step sampler, without locks or I/O: the steps it holds, what it counts, and
//! on the source the facts each decision is made of. The rounds drive it (`mod.rs`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanContext, Status};
use opentelemetry_sdk::trace::SpanData;

use super::keys;
use super::rules::{MIN_QUANTILE_STEPS, SampleRules};
use super::threshold::Threshold;
use super::wire::{Decision, Reason, Word};
use crate::arrivals::Arrivals;

/// What a step sampler has done so far, on one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SampleStats {
    /// Steps whose spans were passed on (decided or kept early).
    pub steps_kept: u64,
    /// Steps whose spans were dropped.
    pub steps_dropped: u64,
    /// Spans passed on from held steps.
    pub spans_kept: u64,
    /// Spans dropped with their steps.
    pub spans_dropped: u64,
    /// Spans held now.
    pub held_spans: usize,
    /// Bytes held now (an estimate).
    pub held_bytes: usize,
    /// The most spans held at once.
    pub peak_spans: usize,
    /// The most bytes held at once.
    pub peak_bytes: usize,
}

struct Held {
    step: u64,
    spans: Vec<SpanData>,
    bytes: usize,
}

/// The step the coming round ends, as the source saw it.
struct Ended {
    step: u64,
    vote: bool,
    randomness: Option<u64>,
}

pub(crate) struct State {
    rules: SampleRules,
    /// The current step in the source's count; 0 before the first round (spans then pass).
    step: u64,
    held: VecDeque<Held>,
    /// The current step was kept early (a cap, an error, the end): its spans pass, kept so.
    passing: Option<Reason>,
    /// This rank's vote for the current step.
    vote: bool,
    /// When the current step began here.
    began: Option<Instant>,
    dropped_steps: u64,
    dropped_spans: u64,
    stats: SampleStats,
    // The source's side.
    ended: Option<Ended>,
    randomness: Option<u64>,
    pending: Option<Decision>,
    sent: Option<Word>,
    round_end: Option<Instant>,
    window: VecDeque<u64>,
    rng: u64,
    /// The latest decisions, oldest first (at most [`DECISIONS_KEPT`]).
    decisions: VecDeque<(u64, Option<Reason>, Threshold)>,
    /// Arrivals the source's sampler took that no span recorded, for the caller to take.
    stashed: Option<Arrivals>,
}

/// Decisions a sampler remembers for [`super::StepSampler::decisions`].
pub(crate) const DECISIONS_KEPT: usize = 4096;

/// Spans to pass on, decided outside the lock.
pub(crate) type Release = Vec<SpanData>;

impl State {
    pub(crate) fn new(rules: SampleRules, seed: u64) -> Self {
        State {
            rules,
            step: 0,
            held: VecDeque::new(),
            passing: None,
            vote: false,
            began: None,
            dropped_steps: 0,
            dropped_spans: 0,
            stats: SampleStats::default(),
            ended: None,
            randomness: None,
            pending: None,
            sent: None,
            round_end: None,
            window: VecDeque::new(),
            rng: seed | 1,
            decisions: VecDeque::new(),
            stashed: None,
        }
    }

    pub(crate) fn rules(&self) -> &SampleRules {
        &self.rules
    }

    pub(crate) fn stats(&self) -> SampleStats {
        self.stats
    }

    pub(crate) fn decisions(&self) -> Vec<(u64, Option<Reason>, Threshold)> {
        self.decisions.iter().copied().collect()
    }

    /// The newest decisions, back to the first at or before `after`.
    pub(crate) fn decisions_after(&self, after: u64) -> Vec<(u64, Option<Reason>, Threshold)> {
        let newer = self
            .decisions
            .iter()
            .rev()
            .take_while(|&&(s, _, _)| s > after);
        let mut v: Vec<_> = newer.copied().collect();
        v.reverse();
        v
    }

    pub(crate) fn step(&self) -> u64 {
        self.step
    }

    pub(crate) fn stash(&mut self, a: Option<Arrivals>) {
        self.stashed = a;
    }

    pub(crate) fn take_stashed(&mut self) -> Option<Arrivals> {
        self.stashed.take()
    }

    fn note(&mut self, step: u64, keep: Option<Reason>, t: Threshold) {
        // The first word on a step stands (kept early, then decided). Steps are noted in
        // order, but for a few at the end of a failure: the last few entries suffice.
        if self
            .decisions
            .iter()
            .rev()
            .take(4)
            .any(|&(s, _, _)| s == step)
        {
            return;
        }
        if self.decisions.len() == DECISIONS_KEPT {
            self.decisions.pop_front();
        }
        self.decisions.push_back((step, keep, t));
    }

    pub(crate) fn vote(&mut self) {
        self.vote = true;
    }

    /// A span ended on this rank.
    pub(crate) fn on_end(&mut self, span: SpanData, out: &mut Release) {
        if self.step == 0 || self.rules.is_off() {
            out.push(span);
            return;
        }
        if let Some(reason) = self.passing {
            let step = self.step;
            self.keep_span(span, step, reason, Threshold::ALWAYS, false, out);
            return;
        }
        if matches!(span.status, Status::Error { .. }) {
            self.vote = true;
        }
        let bytes = approx_bytes(&span);
        let step = self.step;
        match self.held.back_mut() {
            Some(h) if h.step == step => {
                h.spans.push(span);
                h.bytes += bytes;
            }
            _ => self.held.push_back(Held {
                step,
                spans: vec![span],
                bytes,
            }),
        }
        self.stats.held_spans += 1;
        self.stats.held_bytes += bytes;
        self.stats.peak_spans = self.stats.peak_spans.max(self.stats.held_spans);
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.stats.held_bytes);
        if self.stats.held_spans > self.rules.max_spans()
            || self.stats.held_bytes > self.rules.max_bytes()
        {
            // Over the cap: the current step is kept at once, and this rank votes for it
            // so that every rank keeps it.
            tracing::debug!(step, "step sampler over its cap: step kept early");
            self.vote = true;
            self.passing = Some(Reason::Cap);
            self.release(step, Some(Reason::Cap), Threshold::ALWAYS, out);
            self.note(step, Some(Reason::Cap), Threshold::ALWAYS);
        }
    }

    /// The rank enters a round, which ends its current step: its vote for that step (a
    /// slow step is a vote too).
    pub(crate) fn before_round(&mut self, now: Instant) -> bool {
        if self.rules.is_off() {
            return false;
        }
        let slow = match (self.rules.slower_than(), self.began) {
            (Some(limit), Some(began)) => now.saturating_duration_since(began) > limit,
            _ => false,
        };
        let vote = (self.vote && self.rules.votes()) || slow;
        self.vote = false;
        self.ended = Some(Ended {
            step: self.step,
            vote,
            randomness: self.randomness,
        });
        vote && self.step > 0
    }

    /// The source's word for the round it is about to send.
    pub(crate) fn word(&mut self) -> Option<Word> {
        if self.rules.is_off() {
            return None;
        }
        let word = Word {
            step: self.step + 1,
            decision: self.pending.take(),
        };
        self.sent = Some(word);
        Some(word)
    }

    /// The source's round went out: what it learnt of the step the round ended decides
    /// that step (sent with the next round); the word it sent is applied here as on
    /// every rank.
    pub(crate) fn after_source_round(
        &mut self,
        arrivals: Option<&Arrivals>,
        randomness: Option<u64>,
        now: Instant,
        out: &mut Release,
    ) {
        if self.rules.is_off() {
            return;
        }
        let duration = self.round_end.map(|t| now.saturating_duration_since(t));
        if let Some(ended) = self.ended.take()
            && ended.step > 0
        {
            self.pending = Some(self.decide(&ended, duration, arrivals));
        }
        if let Some(d) = duration {
            let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            self.window.push_back(ns);
            while self.window.len() > self.rules.window() {
                self.window.pop_front();
            }
        }
        self.round_end = Some(now);
        let word = self.sent.take();
        self.advance(word.map(Some), now, out);
        self.randomness = randomness;
    }

    /// Another rank's round came in, with the source's word in its carrier (`None`: no
    /// word; `Some(None)`: one that did not read).
    pub(crate) fn after_member_round(
        &mut self,
        word: Option<Option<Word>>,
        randomness: Option<u64>,
        now: Instant,
        out: &mut Release,
    ) {
        if self.rules.is_off() {
            return;
        }
        self.advance(word, now, out);
        self.randomness = randomness;
    }

    /// A round failed: everything held is kept, and the rest of the step with it. On the
    /// source, the decision it sent in that round is applied first: ranks that had the
    /// round applied it too.
    pub(crate) fn on_error(&mut self, out: &mut Release) {
        if let Some(d) = self.sent.take().and_then(|w| w.decision) {
            self.release(d.step, d.keep, d.threshold, out);
        }
        self.keep_all(Reason::Error, out);
    }

    /// The group or the provider ends: everything held is kept, and what still ends.
    pub(crate) fn on_exit(&mut self, out: &mut Release) {
        self.keep_all(Reason::Exit, out);
    }

    fn keep_all(&mut self, reason: Reason, out: &mut Release) {
        if self.step == 0 || self.rules.is_off() {
            return;
        }
        let steps: Vec<u64> = self.held.iter().map(|h| h.step).collect();
        for step in steps {
            self.release(step, Some(reason), Threshold::ALWAYS, out);
        }
        self.passing = Some(reason);
    }

    fn decide(
        &mut self,
        ended: &Ended,
        duration: Option<Duration>,
        arrivals: Option<&Arrivals>,
    ) -> Decision {
        let r = &self.rules;
        let voted = r.votes() && arrivals.is_some_and(|a| !a.voted.is_empty());
        let slow = matches!((r.slower_than(), duration), (Some(t), Some(d)) if d > t);
        let quantile = match (r.quantile(), duration) {
            (Some(q), Some(d)) if self.window.len() >= MIN_QUANTILE_STEPS => {
                let mut sorted: Vec<u64> = self.window.iter().copied().collect();
                sorted.sort_unstable();
                let at = ((sorted.len() - 1) as f64 * q).round() as usize;
                let limit = sorted.get(at).copied().unwrap_or(u64::MAX);
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX) > limit
            }
            _ => false,
        };
        let spread = match (r.spread_over(), arrivals) {
            (Some(t), Some(a)) => u128::from(a.spread_ns) > t.as_nanos(),
            _ => false,
        };
        let keep = |reason| Decision {
            step: ended.step,
            keep: Some(reason),
            threshold: Threshold::ALWAYS,
        };
        if slow {
            return keep(Reason::Slow);
        }
        if quantile {
            return keep(Reason::Quantile);
        }
        if spread {
            return keep(Reason::Spread);
        }
        if ended.vote || voted {
            return keep(Reason::Vote);
        }
        if let Some(k) = r.baseline() {
            let t = Threshold::one_in(k);
            let random = ended.randomness.unwrap_or_else(|| self.next_random());
            if t.keeps(random) {
                return Decision {
                    step: ended.step,
                    keep: Some(Reason::Baseline),
                    threshold: t,
                };
            }
        }
        Decision {
            step: ended.step,
            keep: None,
            threshold: Threshold::ALWAYS,
        }
    }

    /// 56 random bits (xorshift64*), for a step without a trace id.
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 8
    }

    /// A round ended: the decision it carries is applied, steps too old for one are kept,
    /// and the next step begins.
    fn advance(&mut self, word: Option<Option<Word>>, now: Instant, out: &mut Release) {
        let word = match word {
            Some(Some(w)) => Some(w),
            Some(None) => {
                tracing::debug!("step sampler: a word it cannot read; what it holds is kept");
                None
            }
            None => None,
        };
        if let Some(d) = word.and_then(|w| w.decision) {
            self.note(d.step, d.keep, d.threshold);
            if self.held.iter().any(|h| h.step == d.step) {
                self.release(d.step, d.keep, d.threshold, out);
            }
        }
        let next = word.map_or(self.step + 1, |w| w.step);
        let stale: Vec<u64> = self
            .held
            .iter()
            .map(|h| h.step)
            .filter(|&s| s + 1 < next || s >= next)
            .collect();
        for step in stale {
            self.release(step, Some(Reason::Undecided), Threshold::ALWAYS, out);
        }
        self.step = next;
        self.passing = None;
        self.began = Some(now);
    }

    /// Passes on (or drops, for `keep: None`) the held step `step`.
    fn release(&mut self, step: u64, keep: Option<Reason>, t: Threshold, out: &mut Release) {
        let Some(at) = self.held.iter().position(|h| h.step == step) else {
            return;
        };
        let Some(h) = self.held.remove(at) else {
            return;
        };
        self.note(step, keep, t);
        self.stats.held_spans -= h.spans.len();
        self.stats.held_bytes -= h.bytes;
        match keep {
            None => {
                self.stats.steps_dropped += 1;
                self.stats.spans_dropped += h.spans.len() as u64;
                self.dropped_steps += 1;
                self.dropped_spans += h.spans.len() as u64;
            }
            Some(reason) => {
                self.stats.steps_kept += 1;
                for (i, span) in h.spans.into_iter().enumerate() {
                    self.keep_span(span, step, reason, t, i == 0, out);
                }
            }
        }
    }

    fn keep_span(
        &mut self,
        mut span: SpanData,
        step: u64,
        reason: Reason,
        t: Threshold,
        first: bool,
        out: &mut Release,
    ) {
        self.stats.spans_kept += 1;
        span.attributes
            .push(KeyValue::new(keys::REASON, reason.as_str()));
        span.attributes.push(KeyValue::new(
            keys::STEP,
            i64::try_from(step).unwrap_or(i64::MAX),
        ));
        if first && self.dropped_steps > 0 {
            span.attributes.push(KeyValue::new(
                keys::DROPPED_STEPS,
                i64::try_from(self.dropped_steps).unwrap_or(i64::MAX),
            ));
            span.attributes.push(KeyValue::new(
                keys::DROPPED_SPANS,
                i64::try_from(self.dropped_spans).unwrap_or(i64::MAX),
            ));
            self.dropped_steps = 0;
            self.dropped_spans = 0;
        }
        let sc = &span.span_context;
        span.span_context = SpanContext::new(
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags(),
            sc.is_remote(),
            t.stamp(sc.trace_state()),
        );
        out.push(span);
    }
}

/// A rough size of a span in memory: its strings and a fixed part per item.
fn approx_bytes(span: &SpanData) -> usize {
    // Strings by their length; other values at a fixed guess (`Value::as_str` would
    // format them, an allocation per attribute of every span held).
    fn kv(kv: &KeyValue) -> usize {
        let value = match &kv.value {
            opentelemetry::Value::String(s) => s.as_str().len(),
            _ => 16,
        };
        32 + kv.key.as_str().len() + value
    }
    let attributes: usize = span.attributes.iter().map(kv).sum();
    let events: usize = span
        .events
        .iter()
        .map(|e| 48 + e.name.len() + e.attributes.iter().map(kv).sum::<usize>())
        .sum();
    let links: usize = span
        .links
        .iter()
        .map(|l| 64 + l.attributes.iter().map(kv).sum::<usize>())
        .sum();
    std::mem::size_of::<SpanData>() + span.name.len() + attributes + events + links
}
