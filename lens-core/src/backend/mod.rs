//! For those who write a backend: the checks every backend makes, and the slab round that
//! collective backends (MPI, NCCL) share. Users of lens do not need this module.
//!
//! A new backend implements [`Broadcaster`], calls
//! [`check_broadcast_args`] before any communication, and passes the conformance suite of
//! `lens-testkit` (`lens_testkit::conformance`). A backend whose transport is one collective
//! of a buffer from a root implements [`slab::SlabTransport`] and gets the round, the
//! deadline, the spill and the refusal after a failure from [`slab::SlabBroadcaster`].

use crate::broadcaster::Broadcaster;
use crate::error::{Error, Result};

mod settings;
pub mod slab;

pub use settings::EnvErrors;

pub use crate::broadcaster::{MAX_TIMEOUT, check_timeout, parse_timeout_secs};
/// The W3C header parsers and writers the carrier codec uses (`traceparent`, `tracestate`,
/// `baggage`), for a backend or a tool that checks headers itself.
pub mod w3c {
    pub use crate::carrier::w3c::{
        TraceParent, TraceParentError, TraceStateError, format_baggage, format_traceparent,
        parse_traceparent, parse_tracestate,
    };
}

/// Checks a broadcast's arguments the way every backend must, before any communication.
///
/// Returns the root's payload on the root and `None` elsewhere.
///
/// # Errors
/// [`Error::InvalidRoot`], [`Error::MissingPayload`] or [`Error::PayloadTooLarge`].
pub fn check_broadcast_args<'a>(
    b: &(impl Broadcaster + ?Sized),
    root: usize,
    payload: Option<&'a [u8]>,
) -> Result<Option<&'a [u8]>> {
    let world_size = b.world_size();
    if root >= world_size {
        return Err(Error::InvalidRoot { root, world_size });
    }
    if b.rank() != root {
        return Ok(None);
    }
    let payload = payload.ok_or(Error::MissingPayload { rank: root })?;
    let limit = b.max_payload();
    if payload.len() > limit {
        return Err(Error::PayloadTooLarge {
            len: payload.len(),
            limit,
        });
    }
    Ok(Some(payload))
}
