//! One round as every broadcast in lens-core runs it: the backend's broadcast, and what a
//! failed round sets off (the step sampler keeps what it holds; a timeout leaves a hang
//! report). Kept apart from the trait's file so that the trait depends on nothing that
//! depends on it.

use crate::broadcaster::Broadcaster;
use crate::error::{Error, Result};

/// One round through [`Broadcaster::broadcast_sync`] where the backend has it, else
/// [`Broadcaster::broadcast`].
pub(crate) async fn round(
    b: &dyn Broadcaster,
    root: usize,
    payload: Option<&[u8]>,
) -> Result<Vec<u8>> {
    let done = match b.broadcast_sync(root, payload) {
        Some(done) => done,
        None => b.broadcast(root, payload).await,
    };
    done.map_err(|e| failed(b, e))
}

/// A round failed: the step sampler keeps what it holds, then a timeout is reported.
pub(crate) fn failed(b: &dyn Broadcaster, e: Error) -> Error {
    if let Some(s) = b.step_sampler() {
        s.on_round_error();
    }
    crate::hang::on_error(b, e)
}
