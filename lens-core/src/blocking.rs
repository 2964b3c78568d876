//! Synchronous twins of the async API, for training loops without an async runtime.
//!
//! Each call blocks the calling thread until the collective completes or fails (every
//! backend has a deadline, so it never blocks forever). Do not call these from inside an
//! async task: they would block the executor's thread.
//!
//! ```
//! use lens_core::blocking;
//! use lens_testkit::LocalCluster;
//!
//! let ranks = LocalCluster::new(2).broadcasters();
//! std::thread::scope(|s| {
//!     let other = s.spawn(|| blocking::broadcast(&ranks[1], 0, None));
//!     let mine = blocking::broadcast(&ranks[0], 0, Some(b"step 7"))?;
//!     assert_eq!(mine, b"step 7");
//!     // `join` fails only when the thread panicked: pass that panic on.
//!     assert_eq!(other.join().expect("rank 1's thread")?, b"step 7");
//!     Ok::<(), lens_core::Error>(())
//! })?;
//! # Ok::<(), lens_core::Error>(())
//! ```

use opentelemetry::Context;

use crate::broadcast::{
    SOURCE_FAILED, check_root, foreign_carrier, member_begins, outgoing, received, received_whole,
    record_arrivals, sent, source_begins, source_not_told,
};
use crate::broadcaster::Broadcaster;
use crate::carrier::Carrier;
use crate::error::Result;

/// Blocking [`Broadcaster::broadcast`]; a timeout is reported as a `lens.hang` span
/// ([`crate::hang`]).
///
/// # Errors
/// As the backend's `broadcast`.
pub fn broadcast(b: &dyn Broadcaster, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
    let done = match b.broadcast_sync(root, payload) {
        Some(done) => done,
        None => futures::executor::block_on(b.broadcast(root, payload)),
    };
    done.map_err(|e| crate::round::failed(b, e))
}

/// Blocking [`crate::broadcast_trace_context`]; the source injects this thread's current
/// context.
///
/// # Errors
/// As [`crate::broadcast_trace_context`].
pub fn broadcast_trace_context(b: &dyn Broadcaster, src_rank: usize) -> Result<Option<Carrier>> {
    check_root(b, src_rank)?;
    if b.rank() != src_rank {
        return receive(b, src_rank);
    }
    let cx = Context::current();
    send(b, src_rank, Carrier::from_context(&cx), &cx)
}

/// Blocking [`crate::broadcast_context`].
///
/// # Errors
/// As [`crate::broadcast_context`].
pub fn broadcast_context(
    b: &dyn Broadcaster,
    src_rank: usize,
    cx: &Context,
) -> Result<Option<Carrier>> {
    check_root(b, src_rank)?;
    if b.rank() != src_rank {
        return receive(b, src_rank);
    }
    send(b, src_rank, Carrier::from_context(cx), cx)
}

/// Blocking [`crate::broadcast_carrier`].
///
/// # Errors
/// As [`crate::broadcast_carrier`].
pub fn broadcast_carrier(
    b: &dyn Broadcaster,
    src_rank: usize,
    carrier: Option<&Carrier>,
) -> Result<Option<Carrier>> {
    check_root(b, src_rank)?;
    if b.rank() != src_rank {
        return receive(b, src_rank);
    }
    match foreign_carrier(carrier) {
        Ok(carrier) => send(b, src_rank, carrier, &Context::current()),
        Err(e) => {
            fail_source(b, src_rank);
            Err(e)
        }
    }
}

/// As [`broadcast_carrier`], but every rank gets the source's carrier whatever it holds:
/// baggage alone, another propagator's headers (B3, Jaeger), or nothing (an empty
/// carrier). For callers that hand the carrier to a propagator of their own, as the Python
/// drop-in does. One round; a traceparent, when present, is checked as there.
///
/// # Errors
/// As [`broadcast_carrier`].
pub fn broadcast_carrier_whole(
    b: &dyn Broadcaster,
    src_rank: usize,
    carrier: Option<&Carrier>,
) -> Result<Carrier> {
    check_root(b, src_rank)?;
    if b.rank() != src_rank {
        member_begins(b);
        return received_whole(b, broadcast(b, src_rank, None)?, src_rank);
    }
    match foreign_carrier(carrier) {
        Ok(carrier) => send_whole(b, src_rank, carrier, &Context::current()),
        Err(e) => {
            fail_source(b, src_rank);
            Err(e)
        }
    }
}

// The same steps as the async functions' (`broadcast.rs`), each round through `broadcast`:
// no future at all where the backend has `broadcast_sync` (a 1-rank slab round with the
// codec went from 361 to 302 ns without the future: `cargo bench -p lens-core --bench round`).

fn send(
    b: &dyn Broadcaster,
    src_rank: usize,
    carrier: Carrier,
    cx: &Context,
) -> Result<Option<Carrier>> {
    send_whole(b, src_rank, carrier, cx).map(|c| sent(c, src_rank))
}

/// The source's round: its carrier's bytes out (or, when they cannot go, the failure
/// marker, so the others do not wait), and the carrier back as sent; how the ranks arrived
/// goes on `cx`'s span.
fn send_whole(
    b: &dyn Broadcaster,
    src_rank: usize,
    carrier: Carrier,
    cx: &Context,
) -> Result<Carrier> {
    let word = source_begins(b);
    let bytes = match outgoing(b, &carrier, word.as_deref()) {
        Ok(bytes) => bytes,
        Err(e) => {
            fail_source(b, src_rank);
            return Err(e);
        }
    };
    broadcast(b, src_rank, Some(&bytes))?;
    drop(bytes);
    record_arrivals(b, cx, &carrier);
    Ok(carrier.with_source_rank(src_rank))
}

fn receive(b: &dyn Broadcaster, src_rank: usize) -> Result<Option<Carrier>> {
    member_begins(b);
    received(b, broadcast(b, src_rank, None)?, src_rank)
}

fn fail_source(b: &dyn Broadcaster, src_rank: usize) {
    if let Err(e) = broadcast(b, src_rank, Some(SOURCE_FAILED)) {
        source_not_told(&e);
    }
}
