//! The conformance suite every backend runs.
//!
//! [`run_rank`] is the script of one rank: every rank of a group calls it at the same time
//! (threads, tasks or processes: MPI and multi-process TCP tests run it once per process).
//! [`run_group`] runs it on every rank of an in-process group. Each case is deterministic
//! and checks the exact bytes every rank receives, so cross-talk between rounds, a wrong
//! root or a truncated payload all fail.

use std::sync::Arc;

use lens_core::{Broadcaster, Carrier, Error, broadcast_context};
use opentelemetry::Context;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};

/// Which cases to run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// Rounds of the "many rounds" case (default 1,000).
    pub rounds: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { rounds: 1000 }
    }
}

impl Options {
    /// Sets the rounds of the "many rounds" case.
    pub fn rounds(mut self, rounds: usize) -> Self {
        self.rounds = rounds;
        self
    }
}

/// A failed conformance case.
#[derive(Debug, thiserror::Error)]
#[error("conformance case {case:?} failed on rank {rank}: {detail}")]
pub struct Failure {
    /// The case.
    pub case: &'static str,
    /// The rank that saw it.
    pub rank: usize,
    /// What went wrong.
    pub detail: String,
}

/// The payload of round `round` from `root`: its size and bytes depend on both, so a payload
/// delivered in the wrong round or from the wrong root is caught.
pub fn pattern(round: usize, root: usize, len: usize) -> Vec<u8> {
    let seed = (round as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (root as u64).wrapping_mul(0xff51_afd7);
    (0..len)
        .map(|i| (seed.rotate_left((i % 64) as u32) as u8) ^ (i as u8))
        .collect()
}

fn round_len(round: usize, max: usize) -> usize {
    let len = match round % 50 {
        0 => 0,
        7 => 4096 + round % 977,
        _ => (round * 37) % 700,
    };
    len.min(max)
}

struct Case<'a> {
    b: &'a dyn Broadcaster,
    name: &'static str,
}

impl Case<'_> {
    fn fail(&self, detail: impl Into<String>) -> Failure {
        Failure {
            case: self.name,
            rank: self.b.rank(),
            detail: detail.into(),
        }
    }

    /// One round from `root` of `want`; checks every rank gets exactly `want`.
    async fn round(&self, root: usize, want: &[u8], extra: Option<&[u8]>) -> Result<(), Failure> {
        let payload = if self.b.rank() == root {
            Some(want)
        } else {
            extra
        };
        // Rounds of odd length go through `broadcast_sync` where the backend has one: it
        // must behave exactly as `broadcast`.
        let sync = (want.len() % 2 == 1)
            .then(|| self.b.broadcast_sync(root, payload))
            .flatten();
        let got = match sync {
            Some(done) => done,
            None => self.b.broadcast(root, payload).await,
        }
        .map_err(|e| self.fail(format!("broadcast from root {root} failed: {e}")))?;
        if got != want {
            return Err(self.fail(format!(
                "from root {root}: expected {} bytes, got {} bytes{}",
                want.len(),
                got.len(),
                if got.len() == want.len() {
                    " with different content"
                } else {
                    ""
                }
            )));
        }
        Ok(())
    }
}

/// The carrier the "trace context" case broadcasts.
pub fn sample_context() -> Context {
    let sc = SpanContext::new(
        TraceId::from_bytes(*b"lens-conformance"),
        SpanId::from_bytes(*b"span-id!"),
        TraceFlags::new(0x03),
        false,
        TraceState::from_key_value([("lens", "conformance")]).unwrap_or_default(),
    );
    Context::new().with_remote_span_context(sc)
}

/// Runs the suite as one rank of `b`'s group. Every rank must call it at the same time.
///
/// # Errors
/// The first case that failed on this rank.
pub async fn run_rank(b: &dyn Broadcaster, opts: &Options) -> Result<(), Failure> {
    let n = b.world_size();
    let me = b.rank();
    let max = b.max_payload();

    let case = Case {
        b,
        name: "identity",
    };
    if me >= n || n == 0 {
        return Err(case.fail(format!("rank {me} of {n}")));
    }
    if max < Carrier::DEFAULT_MAX_LEN {
        return Err(case.fail(format!(
            "max_payload {max} is below the carrier limit {}",
            Carrier::DEFAULT_MAX_LEN
        )));
    }

    // Rejected calls come first: they must not consume a round, which the later cases check.
    let case = Case {
        b,
        name: "invalid root",
    };
    match b.broadcast(n, Some(b"x")).await {
        Err(Error::InvalidRoot { root, world_size }) if root == n && world_size == n => {}
        other => return Err(case.fail(format!("expected InvalidRoot, got {other:?}"))),
    }
    if me == 0 {
        let case = Case {
            b,
            name: "root without payload",
        };
        match b.broadcast(0, None).await {
            Err(Error::MissingPayload { rank: 0 }) => {}
            other => return Err(case.fail(format!("expected MissingPayload, got {other:?}"))),
        }
        let case = Case {
            b,
            name: "oversized payload",
        };
        let big = vec![0u8; max + 1];
        match b.broadcast(0, Some(&big)).await {
            Err(Error::PayloadTooLarge { len, limit }) if len == max + 1 && limit == max => {}
            other => return Err(case.fail(format!("expected PayloadTooLarge, got {other:?}"))),
        }
    }

    let case = Case {
        b,
        name: "every root",
    };
    for root in 0..n {
        case.round(root, &pattern(root, root, 64 + root), None)
            .await?;
    }

    let case = Case {
        b,
        name: "empty payload",
    };
    case.round(0, &[], None).await?;

    let case = Case {
        b,
        name: "maximum payload",
    };
    case.round(n - 1, &pattern(1, n - 1, max), None).await?;

    let case = Case {
        b,
        name: "non-root payload ignored",
    };
    case.round(0, &pattern(2, 0, 100), Some(b"not the root's bytes"))
        .await?;

    let case = Case {
        b,
        name: "many rounds",
    };
    for round in 0..opts.rounds {
        let root = (round * 7 + round / n) % n;
        let want = pattern(round, root, round_len(round, max));
        case.round(root, &want, None).await?;
    }

    let case = Case {
        b,
        name: "rounds counted",
    };
    if let Some(before) = b.rounds_started().filter(|_| n > 1) {
        case.round(0, &pattern(3, 0, 10), None).await?;
        match b.rounds_started() {
            Some(after) if after == before + 1 => {}
            other => {
                return Err(case.fail(format!(
                    "rounds_started went from {before} to {other:?} over one round"
                )));
            }
        }
    }

    let case = Case {
        b,
        name: "clock offsets",
    };
    if n > 1 {
        // One host, one clock: every offset is within its bound of zero, every rank has
        // the same table, and the reference's own is exact.
        let table = lens_core::clock::measure_clock_offsets_async(b, n - 1, 3)
            .await
            .map_err(|e| case.fail(format!("measuring failed: {e}")))?;
        if table.len() != n || table[n - 1].offset_ns != 0 || table[n - 1].error_ns != 0 {
            return Err(case.fail(format!("table {table:?}")));
        }
        if let Some((r, c)) = table
            .iter()
            .enumerate()
            .find(|(_, c)| c.offset_ns.unsigned_abs() > c.error_ns)
        {
            return Err(case.fail(format!(
                "rank {r}'s offset {} ns is outside its bound {} ns on one clock",
                c.offset_ns, c.error_ns
            )));
        }
    }

    let case = Case {
        b,
        name: "straggler named",
    };
    if n > 1 {
        // The last rank comes 30 ms late; a backend that tracks arrivals names it.
        let _ = b.take_arrivals();
        if me == n - 1 {
            futures_timer::Delay::new(std::time::Duration::from_millis(30)).await;
        }
        case.round(0, &pattern(4, 0, 20), None).await?;
        if me == 0
            && let Some(a) = b.take_arrivals()
            && (a.last_rank != n - 1 || a.spread_ns < 25_000_000)
        {
            return Err(case.fail(format!("rank {} came 30 ms late, got {a:?}", n - 1)));
        }
    }

    let case = Case {
        b,
        name: "trace context",
    };
    let cx = sample_context();
    let got = broadcast_context(b, n / 2, &cx)
        .await
        .map_err(|e| case.fail(format!("broadcast_context failed: {e}")))?
        .ok_or_else(|| case.fail("no carrier"))?;
    let sc = got
        .span_context()
        .ok_or_else(|| case.fail("carrier without span context"))?;
    let want = cx.span().span_context().clone();
    if (
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags(),
        sc.trace_state().header(),
    ) != (
        want.trace_id(),
        want.span_id(),
        want.trace_flags(),
        want.trace_state().header(),
    ) {
        return Err(case.fail(format!("got {sc:?}, expected {want:?}")));
    }
    if got.source_rank() != Some(n / 2) {
        return Err(case.fail(format!(
            "source rank {:?}, expected {}",
            got.source_rank(),
            n / 2
        )));
    }
    Ok(())
}

/// Runs [`run_rank`] on every rank at once, one thread per rank: for backends whose
/// `broadcast` blocks its thread until the round is done (TCP, NCCL). [`run_group`] polls
/// every rank from one thread and suits only backends that never block.
///
/// # Errors
/// Every failure, one per failing rank (a rank whose thread panicked included).
pub fn run_threads<B: Broadcaster>(ranks: &[B], opts: &Options) -> Result<(), Vec<Failure>> {
    let outcomes = crate::on_each_rank(ranks, |b| {
        // A panic on a rank is a failure of that rank, not of the caller's thread.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            futures::executor::block_on(run_rank(b, opts))
        }))
    });
    let failures: Vec<Failure> = outcomes
        .into_iter()
        .enumerate()
        .filter_map(|(rank, outcome)| match outcome {
            Ok(r) => r.err(),
            Err(_) => Some(Failure {
                case: "thread",
                rank,
                detail: "the rank's thread panicked".into(),
            }),
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}

/// Runs [`run_rank`] on every rank of an in-process group at once.
///
/// # Errors
/// Every failure, one per failing rank.
pub async fn run_group(
    group: Vec<Arc<dyn Broadcaster>>,
    opts: &Options,
) -> Result<(), Vec<Failure>> {
    let runs = group.iter().map(|b| run_rank(&**b, opts));
    let failures: Vec<Failure> = futures::future::join_all(runs)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}
