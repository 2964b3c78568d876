//! Broadcasting one rank's trace context to every rank.

use std::borrow::Cow;
use std::future::Future;

use opentelemetry::Context;
use opentelemetry::trace::TraceContextExt;

use crate::arrivals::late_threshold;

use crate::broadcaster::Broadcaster;
use crate::carrier::w3c::parse_traceparent;
use crate::carrier::{Carrier, TRACEPARENT};
use crate::error::{Error, Result};
use crate::round::round;
use crate::sample::StepSampler;

/// Broadcasts the source rank's *current* trace context to every rank of `b`.
///
/// Collective: every rank calls it with the same `src_rank`. The source injects
/// [`Context::current`] as it is **when this function is called** (not when the future is
/// first polled), encodes it and broadcasts it; every rank decodes it.
///
/// Returns `Ok(Some(carrier))` on every rank when the source had a valid span context
/// (the carrier knows its [`Carrier::source_rank`]), `Ok(None)` on every rank when it had
/// none (Python returns `{}` there and silently produces unlinked spans), and `Err` for every
/// transport failure or corrupt payload.
///
/// # Errors
/// [`Error::InvalidRoot`]; [`Error::PayloadTooLarge`] on the source when the carrier is over
/// the codec's or the backend's limit, and then [`Error::SourceFailed`] on the others (the
/// source tells them instead of leaving them to time out); [`Error::Decode`] for a corrupt
/// carrier; any transport error of the backend.
///
/// # Example
///
/// ```
/// use lens_core::{broadcast_trace_context, Broadcaster};
/// use lens_testkit::LocalCluster;
/// use opentelemetry::trace::{Tracer, TracerProvider as _, TraceContextExt};
/// use opentelemetry::Context;
/// use opentelemetry_sdk::trace::SdkTracerProvider;
///
/// # futures::executor::block_on(async {
/// let ranks = LocalCluster::new(2).broadcasters();
/// let tracer = SdkTracerProvider::builder().build().tracer("doc");
/// let span = tracer.start("train_step");
/// let cx = Context::current_with_span(span);
/// let _guard = cx.clone().attach();
///
/// let (root, other) = futures::join!(
///     broadcast_trace_context(&ranks[0], 0),
///     broadcast_trace_context(&ranks[1], 0),
/// );
/// let (root, other) = (root?, other?); // `None`: the source had no span
/// assert_eq!(root, other);
/// assert_eq!(other.as_ref().and_then(|c| c.source_rank()), Some(0));
/// assert_eq!(
///     other.and_then(|c| c.span_context()).map(|sc| sc.trace_id()),
///     Some(cx.span().span_context().trace_id()),
/// );
/// # Ok::<(), lens_core::Error>(())
/// # })?;
/// # Ok::<(), lens_core::Error>(())
/// ```
pub fn broadcast_trace_context<'a>(
    b: &'a dyn Broadcaster,
    src_rank: usize,
) -> impl Future<Output = Result<Option<Carrier>>> + Send + 'a {
    // Taken now: an `async fn` would read the current context at its first poll instead.
    let cx = (b.rank() == src_rank).then(Context::current);
    async move { broadcast_impl(b, src_rank, cx.as_ref()).await }
}

/// Like [`broadcast_trace_context`], with an explicit context `cx` on the source rank
/// (ignored elsewhere).
///
/// # Errors
/// As [`broadcast_trace_context`].
pub async fn broadcast_context(
    b: &dyn Broadcaster,
    src_rank: usize,
    cx: &Context,
) -> Result<Option<Carrier>> {
    broadcast_impl(b, src_rank, Some(cx)).await
}

/// Like [`broadcast_context`], with the source's carrier already made (by another
/// language's propagators, say: the Python package sends what the Python SDK injected).
/// The source sends `carrier` as it is (`None` is an empty carrier); the others pass `None`.
///
/// # Errors
/// As [`broadcast_trace_context`], and on the source [`Error::Config`] for a carrier whose
/// `traceparent` is not valid W3C (the others then get [`Error::SourceFailed`]).
pub async fn broadcast_carrier(
    b: &dyn Broadcaster,
    src_rank: usize,
    carrier: Option<&Carrier>,
) -> Result<Option<Carrier>> {
    check_root(b, src_rank)?;
    if b.rank() != src_rank {
        member_begins(b);
        return received(b, round(b, src_rank, None).await?, src_rank);
    }
    match foreign_carrier(carrier) {
        Ok(carrier) => send(b, src_rank, carrier, &Context::current()).await,
        Err(e) => {
            fail_source(b, src_rank).await;
            Err(e)
        }
    }
}

async fn broadcast_impl(
    b: &dyn Broadcaster,
    src_rank: usize,
    cx: Option<&Context>,
) -> Result<Option<Carrier>> {
    check_root(b, src_rank)?;
    if b.rank() == src_rank {
        let current;
        let cx = match cx {
            Some(cx) => cx,
            None => {
                current = Context::current();
                &current
            }
        };
        send(b, src_rank, Carrier::from_context(cx), cx).await
    } else {
        member_begins(b);
        received(b, round(b, src_rank, None).await?, src_rank)
    }
}

/// The source's half of a round; how the ranks arrived goes on `cx`'s span.
async fn send(
    b: &dyn Broadcaster,
    src_rank: usize,
    carrier: Carrier,
    cx: &Context,
) -> Result<Option<Carrier>> {
    let word = source_begins(b);
    let bytes = match outgoing(b, &carrier, word.as_deref()) {
        Ok(bytes) => bytes,
        Err(e) => {
            fail_source(b, src_rank).await;
            return Err(e);
        }
    };
    round(b, src_rank, Some(&bytes)).await?;
    drop(bytes);
    record_arrivals(b, cx, &carrier);
    Ok(sent(carrier, src_rank))
}

/// The source, after its round: how the ranks arrived, on its span, where the backend knows;
/// the step sampler learns it too and begins the next step. Left with the backend when
/// neither needs it (a caller in another language takes it for its own span: the Python
/// package does).
pub(crate) fn record_arrivals(b: &dyn Broadcaster, cx: &Context, carrier: &Carrier) {
    let span = cx.span();
    let sampler = b.step_sampler();
    if !span.is_recording() && sampler.is_none() {
        return;
    }
    let arrivals = b.take_arrivals();
    if let Some(a) = &arrivals
        && span.is_recording()
    {
        a.record(&span, late_threshold());
    }
    if let Some(s) = sampler {
        s.after_source_round(arrivals.as_ref(), carrier);
        if !span.is_recording() {
            s.stash_arrivals(arrivals);
        }
    }
}

/// The source enters its round: the step sampler's step ends, and its word for the other
/// ranks is made, to go in the carrier sent ([`outgoing`]).
pub(crate) fn source_begins(b: &dyn Broadcaster) -> Option<String> {
    let s = b.step_sampler()?;
    // An earlier round's arrivals, left for a caller that never took them, are stale now.
    s.stash_arrivals(None);
    step_ends(b, s);
    s.word()
}

/// Another rank enters the round: the step sampler's step ends, its vote goes with it.
pub(crate) fn member_begins(b: &dyn Broadcaster) {
    if let Some(s) = b.step_sampler() {
        step_ends(b, s);
    }
}

/// The sampler's step ends as this rank enters a round; the group carries its vote.
fn step_ends(b: &dyn Broadcaster, s: &StepSampler) {
    if s.before_round() && !b.carry_vote(true) {
        tracing::debug!(
            rank = b.rank(),
            "step sampler: this backend does not carry votes to the source"
        );
    }
}

async fn fail_source(b: &dyn Broadcaster, src_rank: usize) {
    if let Err(e) = round(b, src_rank, Some(SOURCE_FAILED)).await {
        source_not_told(&e);
    }
}

// The steps of a round that do not touch the transport, shared by the async functions above
// and their blocking twins in `blocking.rs`.

/// What the source sends when it cannot send its carrier. An empty payload is never a
/// carrier ("{}" is the smallest): the other ranks return at once instead of timing out.
pub(crate) const SOURCE_FAILED: &[u8] = &[];

pub(crate) fn source_not_told(e: &Error) {
    tracing::warn!(error = %e, "could not tell the other ranks that the source failed");
}

pub(crate) fn check_root(b: &dyn Broadcaster, src_rank: usize) -> Result<()> {
    let world_size = b.world_size();
    if src_rank >= world_size {
        return Err(Error::InvalidRoot {
            root: src_rank,
            world_size,
        });
    }
    Ok(())
}

/// A carrier made elsewhere, checked before it is sent (`None` is an empty carrier).
pub(crate) fn foreign_carrier(carrier: Option<&Carrier>) -> Result<Carrier> {
    let carrier = carrier.cloned().unwrap_or_default();
    if let Some(tp) = carrier.get(TRACEPARENT)
        && let Err(e) = parse_traceparent(tp)
    {
        return Err(Error::config(format!(
            "the source's carrier has an invalid traceparent {tp:?}: {e}"
        )));
    }
    Ok(carrier)
}

/// The bytes the source sends for `carrier`, or why it cannot (the others must then be told
/// with [`SOURCE_FAILED`]).
/// With the step sampler's `word`, it goes last (where every rank cuts it off).
pub(crate) fn outgoing<'c>(
    b: &dyn Broadcaster,
    carrier: &'c Carrier,
    word: Option<&str>,
) -> Result<Cow<'c, [u8]>> {
    let bytes = match word {
        None => carrier.to_bytes(),
        Some(w) => Cow::Owned(crate::sample::with_word(carrier, w)),
    };
    let limit = Carrier::DEFAULT_MAX_LEN.min(b.max_payload());
    if bytes.len() > limit {
        return Err(Error::PayloadTooLarge {
            len: bytes.len(),
            limit,
        });
    }
    Ok(bytes)
}

/// What the source returns once its carrier went out: the carrier when it holds a span
/// context (its traceparent, when present, is valid: `from_context` writes only valid ones,
/// and [`foreign_carrier`] checks the others).
pub(crate) fn sent(carrier: Carrier, src_rank: usize) -> Option<Carrier> {
    let valid = carrier.get(TRACEPARENT).is_some();
    valid.then(|| carrier.with_source_rank(src_rank))
}

/// What another rank returns for the round's bytes.
pub(crate) fn received(
    b: &dyn Broadcaster,
    bytes: Vec<u8>,
    src_rank: usize,
) -> Result<Option<Carrier>> {
    let carrier = received_whole(b, bytes, src_rank)?;
    Ok(carrier.get(TRACEPARENT).is_some().then_some(carrier))
}

/// The carrier the round's bytes hold, whatever it holds, with the step sampler's word
/// taken out (and given to the rank's sampler, where it has one); its traceparent, when
/// present, is checked.
pub(crate) fn received_whole(
    b: &dyn Broadcaster,
    bytes: Vec<u8>,
    src_rank: usize,
) -> Result<Carrier> {
    let mut bytes = bytes;
    // The word, where the source put it (last): cut off the bytes, so that the carrier
    // decodes as it was sent, without a copy.
    let cut = crate::sample::cut_word(&mut bytes);
    let mut carrier = match checked(bytes, src_rank) {
        Ok(c) => c,
        Err(e) => {
            if let Some(s) = b.step_sampler() {
                s.on_round_error();
            }
            return Err(e);
        }
    };
    // Anywhere else (a carrier another program wrote), taken out of the carrier.
    let word = cut.or_else(|| crate::sample::take_word(&mut carrier));
    if let Some(s) = b.step_sampler() {
        s.after_member_round(word);
    }
    Ok(carrier)
}

fn checked(bytes: Vec<u8>, src_rank: usize) -> Result<Carrier> {
    if bytes.is_empty() {
        return Err(Error::SourceFailed { root: src_rank });
    }
    let carrier = Carrier::decode_vec(bytes, Carrier::DEFAULT_MAX_LEN)?;
    match carrier.get(TRACEPARENT) {
        None => Ok(carrier.with_source_rank(src_rank)),
        // Checked, not kept: the span context is parsed when a span first links to it.
        Some(tp) if parse_traceparent(tp).is_ok() => Ok(carrier.with_source_rank(src_rank)),
        // The source only ever sends a valid traceparent, so this one was damaged.
        Some(tp) => Err(Error::Corrupt {
            reason: format!("received an invalid traceparent {tp:?}"),
        }),
    }
}
