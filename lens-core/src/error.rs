//! The error type every lens API returns.

use std::time::Duration;

use crate::carrier::CarrierError;

/// A boxed error kept as the source of a backend failure.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a broadcast, a decode or a backend.
///
/// Errors are values: no lens API panics on bad input or a failed peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The root rank is not a rank of this group.
    #[error("root rank {root} is out of range for a group of {world_size} rank(s)")]
    InvalidRoot {
        /// The root that was asked for.
        root: usize,
        /// The size of the group.
        world_size: usize,
    },

    /// The root of a broadcast passed no payload.
    #[error("rank {rank} is the root of this broadcast but passed no payload")]
    MissingPayload {
        /// The root rank.
        rank: usize,
    },

    /// The payload is larger than the backend (or the carrier codec) accepts.
    #[error("payload of {len} bytes is over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The payload's length.
        len: usize,
        /// The limit in force.
        limit: usize,
    },

    /// Some ranks did not take part in a collective within the deadline.
    #[error(
        "timed out after {after:?} {}{}{}",
        through(via),
        waiting_for(missing),
        last_seen_of(last_seen)
    )]
    Timeout {
        /// How long this rank waited.
        after: Duration,
        /// The ranks that had not shown up when the deadline passed; empty where the
        /// transport cannot tell (an NCCL collective; MPI finds out by a roll call after
        /// the timeout).
        missing: Vec<usize>,
        /// For the missing ranks this rank has news of: `(rank, round)`, the last round
        /// this rank knows that rank took part in, counted as
        /// [`Broadcaster::rounds_started`](crate::Broadcaster::rounds_started) counts
        /// them (0: none yet). A rank stuck since an earlier step shows an older round than
        /// the others. Empty where the transport cannot tell.
        last_seen: Vec<(usize, u64)>,
        /// How this rank knows of `missing` when it did not find them missing itself: the
        /// rank it waited for, then the rank that one waits for, and so on to the rank
        /// that found `missing` absent (`[0]`: "waiting for rank 0, which waits for
        /// `missing`"). Empty when this rank itself waited for `missing`. The root cause
        /// is `missing`, whichever rank reports it.
        via: Vec<usize>,
    },

    /// The bytes received are not a valid carrier.
    #[error("received carrier is corrupt: {0}")]
    Decode(#[from] CarrierError),

    /// A frame failed a backend's integrity or protocol checks.
    #[error("corrupt frame: {reason}")]
    Corrupt {
        /// What was wrong with it.
        reason: String,
    },

    /// A frame failed authentication.
    ///
    /// Here rather than in lens-tcp (its only user today) because a caller acts on it the
    /// same way whatever the transport: the job key is wrong or a peer is not of this job.
    /// Code that matches on `lens_core::Error` handles it once, not per backend.
    #[error("unauthenticated frame: {reason}")]
    Unauthenticated {
        /// Why it was rejected.
        reason: String,
    },

    /// The ranks of a group disagree about a collective (different roots, say).
    #[error("ranks disagree about the collective: {reason}")]
    Mismatch {
        /// What they disagree about, for a caller to act on: a bug in the calling code
        /// ([`Disagreement::Root`]), a setting to make the same everywhere
        /// ([`Disagreement::SlabSize`]), the job's launch ([`Disagreement::Group`]) or
        /// the versions deployed ([`Disagreement::Format`]).
        about: Disagreement,
        /// The details, for a person: which ranks, which values.
        reason: String,
    },

    /// The source rank failed before it could send its trace context; every other rank
    /// gets this instead of waiting for a timeout.
    #[error("source rank {root} failed to send its trace context")]
    SourceFailed {
        /// The source rank.
        root: usize,
    },

    /// A backend cannot run on this machine (a library or a device is missing).
    #[error("{backend} backend is unavailable: {reason}")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// Why it cannot run.
        reason: String,
    },

    /// Configuration or environment is invalid.
    #[error("invalid configuration: {reason}")]
    Config {
        /// The setting at fault where there is one: the environment variable that did not
        /// parse (`LENS_TCP_TIMEOUT`), or the name the caller gave a setting. `None` for an
        /// argument of a call or a conflict between settings.
        setting: Option<String>,
        /// What is wrong, naming the setting.
        reason: String,
    },

    /// The group was shut down or one of its members went away.
    #[error("{backend} group is closed: {reason}")]
    Closed {
        /// The backend's name.
        backend: &'static str,
        /// Why.
        reason: String,
    },

    /// Spans did not reach the trace backend (OTLP export): the receiver was down, slow or
    /// refused them, or the export queue was full.
    ///
    /// Here rather than in lens-otlp because the guard's report is the job's, not a
    /// transport's: a rank's result type stays `lens_core::Result` whether the failure was a
    /// broadcast or the export, as the demo and the Python package report them.
    #[error("{lost} span(s) were not exported: {reason}")]
    Export {
        /// How many spans were lost.
        lost: u64,
        /// Why.
        reason: String,
    },

    /// A transport failed; the backend's own error is kept as the source.
    #[error("{backend} transport error: {message}")]
    Transport {
        /// The backend's name.
        backend: &'static str,
        /// What failed.
        message: String,
        /// The backend's own error.
        #[source]
        source: Option<BoxError>,
    },
}

/// What the ranks of a group disagree about ([`Error::Mismatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disagreement {
    /// The root of a round: the calling code did not call the same collective on every
    /// rank (a bug to fix there).
    Root,
    /// The slab size, a setting every rank must share (`LENS_MPI_SLAB_SIZE`,
    /// `LENS_NCCL_SLAB_SIZE`, `slab_size`).
    SlabSize,
    /// The group itself: its size, or a group already formed, as ranks that proved the key
    /// said while joining (the job was launched with different world sizes, or twice).
    Group,
    /// Not a lens message of this backend and version: another program's collective on
    /// the same group, or ranks running different versions of lens.
    Format,
}

impl Error {
    /// Builds a [`Error::Timeout`] with no news of the missing ranks' last rounds.
    pub fn timeout(after: Duration, missing: Vec<usize>) -> Self {
        Error::Timeout {
            after,
            missing,
            last_seen: Vec::new(),
            via: Vec::new(),
        }
    }

    /// Builds a [`Error::Config`] about no one setting (an argument, a conflict).
    pub fn config(reason: impl Into<String>) -> Self {
        Error::Config {
            setting: None,
            reason: reason.into(),
        }
    }

    /// Builds a [`Error::Config`] about `setting` (an environment variable, a named
    /// setting); `reason` should name it too, for a person reading only the message.
    pub fn config_for(setting: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Config {
            setting: Some(setting.into()),
            reason: reason.into(),
        }
    }

    /// `e` as a configuration error about `what` (a variable, a setting), which becomes
    /// its `setting`: a [`Error::Config`] gets `what` in front of its reason, so the chain
    /// reads "invalid configuration: WHAT: reason" once, never nested; any other error
    /// keeps its text after `what`.
    pub fn config_of(what: impl std::fmt::Display, e: Error) -> Self {
        let reason = match e {
            Error::Config { reason, .. } => format!("{what}: {reason}"),
            other => format!("{what}: {other}"),
        };
        Error::Config {
            setting: Some(what.to_string()),
            reason,
        }
    }

    /// Builds a [`Error::Mismatch`].
    pub fn mismatch(about: Disagreement, reason: impl Into<String>) -> Self {
        Error::Mismatch {
            about,
            reason: reason.into(),
        }
    }

    /// Builds a [`Error::Transport`] that keeps `source`.
    pub fn transport(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Transport {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// True for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }
}

/// The end of a timeout's message: the missing ranks, or that the transport cannot tell.
fn waiting_for(missing: &[usize]) -> String {
    if missing.is_empty() {
        "(the transport cannot tell which ranks are missing)".to_owned()
    } else {
        format!("waiting for rank(s) {missing:?}")
    }
}

/// The path to the missing ranks, when another rank found them missing: "waiting for
/// rank 0, which is ", before [`waiting_for`]'s words.
pub(crate) fn through(via: &[usize]) -> String {
    via.iter()
        .map(|r| format!("waiting for rank {r}, which is "))
        .collect()
}

/// What the message says of the missing ranks' last rounds, where known.
fn last_seen_of(last_seen: &[(usize, u64)]) -> String {
    if last_seen.is_empty() {
        return String::new();
    }
    let each: Vec<String> = last_seen
        .iter()
        .map(|(rank, round)| match round {
            0 => format!("rank {rank} in none yet"),
            r => format!("rank {rank} in round {r}"),
        })
        .collect();
    format!("; last seen: {}", each.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_names_the_missing_ranks_or_says_it_cannot() {
        let named = Error::timeout(Duration::from_secs(1), vec![2, 5]);
        assert_eq!(
            named.to_string(),
            "timed out after 1s waiting for rank(s) [2, 5]"
        );
        let seen = Error::Timeout {
            after: Duration::from_secs(1),
            missing: vec![2, 5],
            last_seen: vec![(2, 40), (5, 0)],
            via: Vec::new(),
        };
        assert_eq!(
            seen.to_string(),
            "timed out after 1s waiting for rank(s) [2, 5]; last seen: rank 2 in round 40, rank 5 in none yet"
        );
        let through = Error::Timeout {
            after: Duration::from_secs(2),
            missing: vec![3],
            last_seen: Vec::new(),
            via: vec![1, 0],
        };
        assert_eq!(
            through.to_string(),
            "timed out after 2s waiting for rank 1, which is waiting for rank 0, which is waiting for rank(s) [3]"
        );
        let unknown = Error::timeout(Duration::from_secs(1), Vec::new());
        assert!(
            unknown.to_string().contains("cannot tell which ranks"),
            "{unknown}"
        );
    }
}
