//! The transport trait every backend implements.

use std::sync::Arc;

use crate::error::{Error, Result};

/// Default largest payload a backend accepts, in bytes.
///
/// Four times the carrier codec's limit ([`crate::Carrier::DEFAULT_MAX_LEN`]), so any carrier
/// that decodes also travels, with room for backend framing.
pub const DEFAULT_MAX_PAYLOAD: usize = 64 * 1024;

/// A group of ranks that can broadcast bytes from one rank to all of them.
///
/// `broadcast` is a *collective*: every rank of the group calls it, in the same order, with
/// the same `root`. The root passes `Some(bytes)`; every other rank passes `None` (a `Some`
/// there is ignored). Every rank, root included, gets the root's bytes back.
///
/// A call rejected before any communication (an out-of-range root, a root without payload,
/// an oversized payload) returns its error at once and does not count as a round: the group
/// stays usable. Failures after that point (a missing rank, a corrupt frame) are errors too;
/// no backend waits forever, each has a deadline that turns into [`Error::Timeout`].
///
/// Blocking backends (MPI, NCCL) may do their work inside `poll`; their docs say so.
///
/// # Example
///
/// ```
/// use lens_core::{Broadcaster, Result};
///
/// /// Every rank learns the root's step number.
/// async fn share_step(group: &dyn Broadcaster, step: u64) -> Result<u64> {
///     let mine = step.to_le_bytes();
///     let payload = (group.rank() == 0).then_some(&mine[..]);
///     let bytes = group.broadcast(0, payload).await?;
///     let array: [u8; 8] = bytes.try_into().map_err(|_| lens_core::Error::Corrupt {
///         reason: "expected 8 bytes".into(),
///     })?;
///     Ok(u64::from_le_bytes(array))
/// }
/// ```
#[async_trait::async_trait]
pub trait Broadcaster: Send + Sync {
    /// This rank's index in the group, `0..world_size()`.
    fn rank(&self) -> usize;

    /// How many ranks the group has.
    fn world_size(&self) -> usize;

    /// The largest payload this backend accepts, in bytes.
    fn max_payload(&self) -> usize {
        DEFAULT_MAX_PAYLOAD
    }

    /// Collective: broadcasts `payload` from `root` to every rank of the group.
    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>>;
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

macro_rules! forward_broadcaster {
    ($($ty:ty),*) => {$(
        #[async_trait::async_trait]
        impl<T: Broadcaster + ?Sized> Broadcaster for $ty {
            fn rank(&self) -> usize {
                (**self).rank()
            }
            fn world_size(&self) -> usize {
                (**self).world_size()
            }
            fn max_payload(&self) -> usize {
                (**self).max_payload()
            }
            async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
                (**self).broadcast(root, payload).await
            }
        }
    )*};
}

forward_broadcaster!(&T, Box<T>, Arc<T>);
