//! The step sampler: keeps or drops each step **whole, on every rank**, decided after the
//! step, so that a large job can afford its traces and still has the steps that matter
//! (the slow one, the one where a rank failed, the one before a hang).
//!
//! A *step* is what a rank records between two trace-context broadcasts of its group
//! ([`crate::broadcast_trace_context`] and its twins). Each rank holds the spans that end in
//! a step; the source rank decides the step once the round that ends it is over (how long
//! it took, how far apart the ranks came, whether a rank voted) and its decision travels in
//! the carrier of the round after that: no extra collective. Every rank then passes the
//! step's spans on to the exporter, or drops them. Kept spans say why
//! ([`keys::REASON`]) and carry OpenTelemetry's rejection threshold in their tracestate
//! (`ot=th:0` for a rule, the threshold of 1/K for the baseline), so a backend can weigh
//! them; the first kept span of a rank after dropped steps counts them
//! ([`keys::DROPPED_STEPS`], [`keys::DROPPED_SPANS`]).
//!
//! Nothing is lost where it matters: a round that fails (a timeout with its hang report, any
//! other error) keeps what the rank holds, as does the end of its group or provider; a rank
//! over its cap ([`SampleRules::with_max_spans`], [`SampleRules::with_max_bytes`]) keeps its
//! current step at once and votes for it.
//!
//! ```
//! use lens_core::sample::{SampleRules, StepSampler};
//! use lens_core::{Broadcaster, blocking};
//! use lens_testkit::LocalCluster;
//! use opentelemetry::trace::{Tracer as _, TracerProvider as _};
//! use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
//!
//! let exporter = InMemorySpanExporter::default();
//! let rules = SampleRules::parse("slower-than=20ms")?;
//! // One rank of one (a real job has a sampler, a provider and a group per rank).
//! let sampler = StepSampler::new(rules, SimpleSpanProcessor::new(exporter.clone()));
//! let provider = SdkTracerProvider::builder()
//!     .with_span_processor(sampler.processor())
//!     .build();
//! let tracer = provider.tracer("train");
//! let group = sampler.group(LocalCluster::new(1).broadcasters().remove(0));
//! for step in 0..4 {
//!     tracer.in_span("train_step", |_| {
//!         blocking::broadcast_trace_context(&group, 0)?;
//!         if step == 1 {
//!             std::thread::sleep(std::time::Duration::from_millis(30)); // the slow one
//!         }
//!         Ok::<(), lens_core::Error>(())
//!     })?;
//! }
//! drop(group); // the end: what is still undecided is kept
//! // Fails only when a thread panicked holding the exporter's lock; none did.
//! let kept: Vec<_> = exporter.get_finished_spans().expect("spans");
//! assert_eq!(kept.len(), 3, "the slow step, and the last two, kept as the group ended");
//! # Ok::<(), lens_core::Error>(())
//! ```
//!
//! Limits: a rank's vote reaches the source only where the backend carries it
//! ([`crate::Broadcaster::carry_vote`]: the in-process backend does); elsewhere the source
//! decides from what it sees itself. The decision for a step comes two rounds after it
//! began, so a rank holds up to two steps. A step ends at each trace-context broadcast of
//! the group; one that broadcasts several times a step makes as many steps.

mod rules;
mod state;
mod threshold;
mod wire;

use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};

pub use rules::{
    DEFAULT_MAX_BYTES, DEFAULT_MAX_SPANS, DEFAULT_WINDOW, LENS_SAMPLE, LENS_SAMPLE_MAX_BYTES,
    LENS_SAMPLE_MAX_SPANS, MAX_BASELINE, MIN_QUANTILE_STEPS, SampleRules,
};
pub use state::SampleStats;
pub use threshold::Threshold;
pub use wire::{CARRIER_KEY, Reason};

use crate::arrivals::Arrivals;
use crate::carrier::Carrier;
use crate::error::Result;
use state::{Release, State};
use wire::Word;

/// The names the sampler writes on the spans it passes on.
pub mod keys {
    /// Why the step was kept ([`super::Reason`]'s name: `slow`, `vote`, `baseline`, ...).
    pub const REASON: &str = "lens.sample.reason";
    /// The step, in the source's count (an integer).
    pub const STEP: &str = "lens.sample.step";
    /// On the first kept span of a rank after dropped steps: how many steps it dropped
    /// since its last kept one.
    pub const DROPPED_STEPS: &str = "lens.sample.dropped_steps";
    /// With [`DROPPED_STEPS`]: how many spans those steps held on this rank.
    pub const DROPPED_SPANS: &str = "lens.sample.dropped_spans";
}

struct Inner {
    state: Mutex<State>,
    next: RwLock<Box<dyn SpanProcessor>>,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The processor kept spans go to.
    fn next(&self) -> std::sync::RwLockReadGuard<'_, Box<dyn SpanProcessor>> {
        self.next.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Passes `spans` on, outside the state's lock.
    fn pass(&self, spans: Release) {
        if spans.is_empty() {
            return;
        }
        let next = self.next();
        for span in spans {
            next.on_end(span);
        }
    }

    fn with(&self, f: impl FnOnce(&mut State, &mut Release)) {
        let mut out = Release::new();
        f(&mut self.state(), &mut out);
        self.pass(out);
    }
}

/// One rank's step sampler: its [`StepSampler::processor`] goes in the rank's tracer
/// provider, in front of the processor that exports, and its [`StepSampler::group`] wraps
/// the rank's broadcaster. Cloning gives another handle on the same sampler.
#[derive(Clone)]
pub struct StepSampler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for StepSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepSampler")
            .field("rules", self.inner.state().rules())
            .finish_non_exhaustive()
    }
}

impl StepSampler {
    /// A sampler with `rules` that passes the spans it keeps to `next` (a batch or simple
    /// processor with the rank's exporter). With rules that are off, every span passes as
    /// it ends.
    pub fn new(rules: SampleRules, next: impl SpanProcessor + 'static) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64);
        StepSampler {
            inner: Arc::new(Inner {
                state: Mutex::new(State::new(rules, seed)),
                next: RwLock::new(Box::new(next)),
            }),
        }
    }

    /// A sampler that only decides: no span passes through it. For a rank whose spans are
    /// held elsewhere (another language's SDK: the Python package's processor) and follow
    /// its [`StepSampler::decision_log`]; its group and votes work as any sampler's.
    pub fn deciding_only(rules: SampleRules) -> Self {
        Self::new(rules, Discard)
    }

    /// A sampler with the rules of the environment ([`SampleRules::from_env`]).
    ///
    /// # Errors
    /// As [`SampleRules::from_env`].
    pub fn from_env(next: impl SpanProcessor + 'static) -> Result<Self> {
        Ok(Self::new(SampleRules::from_env()?, next))
    }

    /// The span processor to give the rank's tracer provider.
    pub fn processor(&self) -> StepProcessor {
        StepProcessor {
            sampler: self.clone(),
        }
    }

    /// `group` with this sampler: its trace-context broadcasts end and begin steps (it is a
    /// [`Broadcaster`](crate::Broadcaster) where `group` is one). When it is dropped, what
    /// the sampler still holds is kept.
    pub fn group<B>(&self, group: B) -> Sampled<B> {
        Sampled {
            group,
            sampler: self.clone(),
        }
    }

    /// Votes to keep this rank's current step (on every rank): say, when the step hit
    /// something worth a look. A span that ends with an error status votes too.
    pub fn keep_this_step(&self) {
        self.inner.state().vote();
    }

    /// What the sampler has done so far.
    pub fn stats(&self) -> SampleStats {
        self.inner.state().stats()
    }

    /// The latest steps decided on this rank, oldest first, with why each was kept
    /// (`None`: dropped): the decisions the source sent, and the steps this rank kept
    /// without one (a cap, an error, the end). At most the last 4,096.
    pub fn decisions(&self) -> Vec<(u64, Option<Reason>)> {
        let log = self.inner.state().decisions();
        log.into_iter().map(|(s, r, _)| (s, r)).collect()
    }

    /// The steps decided after step `after` (of the last 4,096), with the threshold each
    /// kept step's spans carry: for a sampler that holds spans of its own (another
    /// language's SDK, as the Python package does) and applies what this one decided, once
    /// a round. Only the newest entries are read: a sampler that only decides
    /// ([`StepSampler::deciding_only`]) notes its steps in order.
    pub fn decision_log(&self, after: u64) -> Vec<(u64, Option<Reason>, Threshold)> {
        self.inner.state().decisions_after(after)
    }

    /// The current step, in the source's count: 0 before the group's first trace-context
    /// broadcast, then the step that broadcast began.
    pub fn current_step(&self) -> u64 {
        self.inner.state().step()
    }

    /// The rules.
    pub fn rules(&self) -> SampleRules {
        self.inner.state().rules().clone()
    }

    /// Keeps everything held now and what ends before the next round: the end of the
    /// rank's group or provider.
    pub fn finish(&self) {
        self.inner.with(State::on_exit);
    }

    // The rounds' hooks (`broadcast.rs`, `blocking.rs`).

    /// The rank enters a round: its vote for the step that ends goes with it, where the
    /// backend carries votes.
    /// This rank enters a round: whether it votes to keep the step that ends (the group
    /// carries the vote).
    pub(crate) fn before_round(&self) -> bool {
        self.inner.state().before_round(Instant::now())
    }

    /// The source's word for the round it is about to send, encoded.
    pub(crate) fn word(&self) -> Option<String> {
        let word = self.inner.state().word()?;
        Some(word.encode())
    }

    /// Arrivals the source's round took for the sampler that no span recorded: given back
    /// by the group's `take_arrivals`, for a caller that records them on a span of its own.
    pub(crate) fn stash_arrivals(&self, a: Option<Arrivals>) {
        self.inner.state().stash(a);
    }

    pub(crate) fn after_source_round(&self, arrivals: Option<&Arrivals>, carrier: &Carrier) {
        let randomness = step_randomness(carrier);
        let now = Instant::now();
        self.inner
            .with(|s, out| s.after_source_round(arrivals, randomness, now, out));
    }

    /// Another rank's round came in: the word, already taken out of the carrier, is
    /// applied. (Only the source decides, so the step's randomness is not needed here.)
    pub(crate) fn after_member_round(&self, word: Option<Option<Word>>) {
        let now = Instant::now();
        self.inner
            .with(|s, out| s.after_member_round(word, None, now, out));
    }

    pub(crate) fn on_round_error(&self) {
        self.inner.with(State::on_error);
    }
}

/// The bytes of `carrier` with the word `w` last, as every rank cuts it off: written into
/// the carrier's own JSON (no copy of the carrier), or, where the carrier holds the key
/// already (one passed on), set in a copy.
pub(crate) fn with_word(carrier: &Carrier, w: &str) -> Vec<u8> {
    if carrier.get(CARRIER_KEY).is_some() {
        let mut c = carrier.clone();
        c.insert(CARRIER_KEY, w);
        return c.encode();
    }
    let bytes = carrier.to_bytes();
    let mut out = Vec::with_capacity(bytes.len() + CARRIER_KEY.len() + w.len() + 8);
    // A carrier's JSON is an object: everything before its closing brace, then the word.
    let body = bytes.strip_suffix(b"}").unwrap_or(&bytes);
    out.extend_from_slice(body);
    if body.len() > 1 {
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(b"\"");
    out.extend_from_slice(CARRIER_KEY.as_bytes());
    out.extend_from_slice(b"\": \"");
    out.extend_from_slice(w.as_bytes());
    out.extend_from_slice(b"\"}");
    out
}

/// The word cut off the end of a round's bytes ([`Word::cut`]).
pub(crate) fn cut_word(bytes: &mut Vec<u8>) -> Option<Option<Word>> {
    Word::cut(bytes)
}

/// The word taken out of a carrier, wherever it is in it.
pub(crate) fn take_word(carrier: &mut Carrier) -> Option<Option<Word>> {
    Word::take(carrier)
}

/// The processor behind a sampler that only decides.
#[derive(Debug)]
struct Discard;

impl SpanProcessor for Discard {
    fn on_start(&self, _: &mut Span, _: &Context) {}

    fn on_end(&self, _: SpanData) {}

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The 56 random bits of the step's trace id, where the carrier has one.
fn step_randomness(carrier: &Carrier) -> Option<u64> {
    carrier
        .span_context()
        .map(|sc| threshold::randomness(sc.trace_id()))
}

/// The span processor of a [`StepSampler`]: holds each span until its step is decided,
/// then passes it on or drops it.
#[derive(Debug, Clone)]
pub struct StepProcessor {
    sampler: StepSampler,
}

impl SpanProcessor for StepProcessor {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        let next = self.sampler.inner.next();
        next.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.sampler.inner.with(|s, out| s.on_end(span, out));
    }

    /// Flushes the next processor; held steps stay held (their decision is to come).
    fn force_flush(&self) -> OTelSdkResult {
        let next = self.sampler.inner.next();
        next.force_flush()
    }

    /// Keeps what is held, then shuts the next processor down.
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.sampler.finish();
        let next = self.sampler.inner.next();
        next.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        let mut next = self
            .sampler
            .inner
            .next
            .write()
            .unwrap_or_else(|e| e.into_inner());
        next.set_resource(resource);
    }
}

/// A rank's group with its [`StepSampler`] ([`StepSampler::group`]): a
/// [`Broadcaster`](crate::Broadcaster) like the one it wraps.
pub struct Sampled<B> {
    group: B,
    sampler: StepSampler,
}

impl<B> Sampled<B> {
    /// The group it wraps.
    pub fn inner(&self) -> &B {
        &self.group
    }

    /// Its sampler.
    pub fn sampler(&self) -> &StepSampler {
        &self.sampler
    }

    /// Those the sampler took for a round whose span did not record them (a caller in
    /// another language), else none.
    pub(crate) fn take_stashed(&self) -> Option<Arrivals> {
        self.sampler.inner.state().take_stashed()
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for Sampled<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampled")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl<B> Drop for Sampled<B> {
    fn drop(&mut self) {
        self.sampler.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::{CARRIER_KEY, Carrier, Word, with_word};

    /// The word goes last in the carrier's own JSON, and every rank cuts it off again,
    /// leaving the bytes the carrier had.
    #[test]
    fn a_word_written_last_is_cut_off_whole() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut full = Carrier::new();
        full.insert("traceparent", tp);
        full.insert("baggage", "a=1");
        let mut passed_on = full.clone();
        passed_on.insert(CARRIER_KEY, "step=1");
        // (why, carrier)
        let rows = [
            ("a traceparent and baggage", full),
            ("empty", Carrier::new()),
        ];
        for (why, c) in rows {
            let mut bytes = with_word(&c, "step=12;decided=10;drop");
            assert!(
                bytes.ends_with(b"\"lens-sample\": \"step=12;decided=10;drop\"}"),
                "{why}"
            );
            let word = Word::cut(&mut bytes).expect(why).expect(why);
            assert_eq!(word.step, 12, "{why}");
            assert_eq!(bytes, c.encode(), "{why}: the carrier's own bytes are left");
        }
        // A carrier that holds the key already (passed on from another job) gets the new
        // word in its place.
        let bytes = with_word(&passed_on, "step=2");
        let c = Carrier::decode(&bytes).expect("json");
        assert_eq!(c.get(CARRIER_KEY), Some("step=2"));
    }
}
