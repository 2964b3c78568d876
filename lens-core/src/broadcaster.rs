//! The transport trait every backend implements.

use std::sync::Arc;
use std::time::Duration;

use crate::arrivals::Arrivals;
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

    /// This rank's index among the group's ranks on its host, when the backend knows it
    /// (MPI asks the library; the in-process backend's ranks share one host; lens-tcp
    /// keeps the launcher's). `None`, the default, means unknown:
    /// [`crate::RankInfo::of_group`] then takes the launcher's variables.
    fn local_rank(&self) -> Option<usize> {
        None
    }

    /// Collective: broadcasts `payload` from `root` to every rank of the group.
    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>>;

    /// The same round as [`Broadcaster::broadcast`], run on the calling thread with no
    /// future, for backends whose broadcast blocks anyway (MPI, NCCL): lens's trace-context
    /// broadcasts and [`crate::blocking`] try it first, which spares a boxed future per round
    /// (a tenth of a 2-rank MPI round). `None`, the default, means no such path: callers then
    /// use `broadcast`. A backend that returns `Some` must behave exactly as `broadcast`.
    fn broadcast_sync(&self, root: usize, payload: Option<&[u8]>) -> Option<Result<Vec<u8>>> {
        let _ = (root, payload);
        None
    }

    /// How the ranks arrived at the last round this rank was the root of, taken (asked
    /// once), where the backend tracks it: the in-process backend and TCP do. `None`, the
    /// default, where it does not. lens's trace-context broadcasts write it on the source's
    /// span ([`crate::arrivals`]).
    fn take_arrivals(&self) -> Option<Arrivals> {
        None
    }

    /// When the root's bytes reached this rank in its last round, where the backend knows
    /// it and that was before the round returned: a relay that forwards them and waits for
    /// acknowledgements (TCP's rank 0 in a round of another root, a tree's inner ranks)
    /// returns a network round trip or more after it had them. Measuring clock offsets
    /// ([`crate::clock`]) takes this instant, not the return, as the time the bytes came.
    /// `None`, the default, where a round returns when the bytes come (collectives, the
    /// in-process backend), on the root, and after a failed round.
    fn received_at(&self) -> Option<std::time::Instant> {
        None
    }

    /// How many rounds this rank has started, the one running included, where the backend
    /// counts them: a hang report names the round that timed out by it.
    fn rounds_started(&self) -> Option<u64> {
        None
    }

    /// Carries this rank's vote (the step sampler's, [`crate::sample`]) on its next round
    /// to the round's root, which finds the ranks that voted in [`Arrivals::voted`];
    /// returns whether the backend carries votes. The default, `false`, carries nothing:
    /// the sampler's source then decides from what it sees itself.
    fn carry_vote(&self, vote: bool) -> bool {
        let _ = vote;
        false
    }

    /// The step sampler whose steps this group's trace-context broadcasts end and begin
    /// ([`crate::sample::StepSampler::group`]); `None`, the default, for none.
    fn step_sampler(&self) -> Option<&crate::sample::StepSampler> {
        None
    }

    /// In this rank's next round, reports that `rank` came at `came` (on this process's
    /// clock) in place of this rank's own arrival: the root of that round finds `rank`, not
    /// this rank, in its [`Arrivals`]. For a group that stands for others: a
    /// [`crate::Hierarchical`] group's node leader stands, in the leaders' round, for the
    /// rank of its node that came last. `rank` belongs to the enclosing group and is not
    /// checked against this one. Returns whether the backend carries it (the in-process
    /// backend and TCP do); the default, `false`, carries nothing and the round reports
    /// this rank as it came.
    fn stand_for(&self, rank: usize, came: std::time::Instant) -> bool {
        let _ = (rank, came);
        false
    }
}

/// Longest deadline any lens backend accepts (one year). Deadlines are added to the clock,
/// so a larger one (say `--timeout 1e19`) would overflow it.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// Checks a deadline the way every backend must: positive and at most [`MAX_TIMEOUT`].
/// `what` names the setting in the error (for example `"LENS_TCP_TIMEOUT"`).
///
/// # Errors
/// [`Error::Config`] naming `what`.
pub fn check_timeout(what: &str, d: Duration) -> Result<Duration> {
    if d.is_zero() {
        return Err(Error::config_for(what, format!("{what} must be positive")));
    }
    if d > MAX_TIMEOUT {
        return Err(Error::config_for(
            what,
            format!("{what} of {d:?} is over the largest supported deadline of {MAX_TIMEOUT:?}"),
        ));
    }
    Ok(d)
}

/// Parses a number of seconds (a setting such as `--timeout` or `LENS_TCP_TIMEOUT`) and
/// checks it with [`check_timeout`].
///
/// # Errors
/// [`Error::Config`] naming `what` when `text` is not a positive number of seconds within
/// [`MAX_TIMEOUT`].
pub fn parse_timeout_secs(what: &str, text: &str) -> Result<Duration> {
    let secs: f64 = text.trim().parse().map_err(|_| {
        Error::config_for(what, format!("{what}={text:?} is not a number of seconds"))
    })?;
    let d = Duration::try_from_secs_f64(secs)
        .map_err(|_| Error::config_for(what, format!("{what}={text:?} is out of range")))?;
    check_timeout(what, d)
}

// Every method is forwarded, so that a new defaulted trait method cannot silently fall back
// to its default for `&T`, `Box<T>` or `Arc<T>` (the lint fails the build instead).
macro_rules! forward_broadcaster {
    ($($ty:ty),*) => {$(
        #[deny(clippy::missing_trait_methods)]
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
            fn local_rank(&self) -> Option<usize> {
                (**self).local_rank()
            }
            async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
                (**self).broadcast(root, payload).await
            }
            fn broadcast_sync(
                &self,
                root: usize,
                payload: Option<&[u8]>,
            ) -> Option<Result<Vec<u8>>> {
                (**self).broadcast_sync(root, payload)
            }
            fn take_arrivals(&self) -> Option<Arrivals> {
                (**self).take_arrivals()
            }
            fn received_at(&self) -> Option<std::time::Instant> {
                (**self).received_at()
            }
            fn rounds_started(&self) -> Option<u64> {
                (**self).rounds_started()
            }
            fn carry_vote(&self, vote: bool) -> bool {
                (**self).carry_vote(vote)
            }
            fn step_sampler(&self) -> Option<&crate::sample::StepSampler> {
                (**self).step_sampler()
            }
            fn stand_for(&self, rank: usize, came: std::time::Instant) -> bool {
                (**self).stand_for(rank, came)
            }
        }
    )*};
}

forward_broadcaster!(&T, Box<T>, Arc<T>);

mod sampled;
