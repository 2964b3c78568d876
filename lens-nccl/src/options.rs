//! The settings of an NCCL broadcaster, from code or from the environment.

use std::time::Duration;

use lens_core::Result;
use lens_core::backend::EnvErrors;
use lens_core::backend::slab::{SlabOptions, SlabVars};

/// Names of the variables [`NcclOptions::from_env`] reads.
pub mod env {
    /// Slab size in bytes, header included; the same on every rank.
    pub const SLAB_SIZE: &str = "LENS_NCCL_SLAB_SIZE";
    /// Deadline of a round, in seconds.
    pub const TIMEOUT: &str = "LENS_NCCL_TIMEOUT";
    /// Largest payload, in bytes.
    pub const MAX_PAYLOAD: &str = "LENS_NCCL_MAX_PAYLOAD";
    /// Deadline of the NCCL init in `NcclBroadcaster::bootstrap`, in seconds.
    pub const INIT_TIMEOUT: &str = "LENS_NCCL_INIT_TIMEOUT";
    /// Gather every rank's arrival time at the root every this many rounds (`0`: never);
    /// see [`crate::NcclOptions::arrivals_every`]. The same on every rank.
    pub const ARRIVALS_EVERY: &str = "LENS_NCCL_ARRIVALS_EVERY";
}

/// Default deadline of the NCCL init in [`crate::NcclBroadcaster::bootstrap`].
pub const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(120);

/// Settings of an [`crate::NcclBroadcaster`]; every rank of a group must use the same slab
/// size.
///
/// ```
/// use std::time::Duration;
/// let opts = lens_nccl::NcclOptions::default()
///     .slab_size(1024)
///     .timeout(Duration::from_secs(5));
/// assert_eq!(opts.slab.slab_size, 1024);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NcclOptions {
    /// Slab size, round deadline and payload limit (the slab round is
    /// `lens_core::backend::slab`, shared with the MPI backend).
    pub slab: SlabOptions,
    /// Deadline of `ncclCommInitRank` in [`crate::NcclBroadcaster::bootstrap_with`] (default
    /// [`DEFAULT_INIT_TIMEOUT`]): NCCL's init waits for every rank with no deadline of its own.
    pub init_timeout: Duration,
    /// An [`env::INIT_TIMEOUT`] that did not parse, reported by `check` unless code set it.
    env_errors: EnvErrors,
}

/// The setting its variable's error is kept under.
const INIT_TIMEOUT: &str = "init_timeout";

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions {
            slab: SlabOptions::default(),
            init_timeout: DEFAULT_INIT_TIMEOUT,
            env_errors: EnvErrors::default(),
        }
    }
}

impl NcclOptions {
    /// The defaults overridden by the variables of [`mod@env`] where set. A value that does not
    /// parse is reported when the options are used, unless code sets that field first.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`NcclOptions::from_env`] with a custom lookup of the variables (a map, a job's
    /// launcher file).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let vars = SlabVars {
            slab_size: env::SLAB_SIZE,
            timeout: env::TIMEOUT,
            max_payload: env::MAX_PAYLOAD,
            arrivals_every: env::ARRIVALS_EVERY,
        };
        let mut opts = NcclOptions {
            slab: SlabOptions::from_vars(&vars, &get),
            ..NcclOptions::default()
        };
        if let Some(text) = get(env::INIT_TIMEOUT) {
            match lens_core::backend::parse_timeout_secs(env::INIT_TIMEOUT, &text) {
                Ok(d) => opts.init_timeout = d,
                Err(e) => opts.env_errors.note_error(INIT_TIMEOUT, e),
            }
        }
        opts
    }

    /// Sets the slab size (header included; over 16 bytes; variable [`env::SLAB_SIZE`]).
    #[must_use]
    pub fn slab_size(mut self, bytes: usize) -> Self {
        self.slab = self.slab.slab_size(bytes);
        self
    }

    /// Sets the deadline of one round (positive; variable [`env::TIMEOUT`]).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.slab = self.slab.timeout(timeout);
        self
    }

    /// Sets the largest payload (default [`lens_core::DEFAULT_MAX_PAYLOAD`]; variable
    /// [`env::MAX_PAYLOAD`]).
    #[must_use]
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.slab = self.slab.max_payload(bytes);
        self
    }

    /// Every `rounds` rounds (`0`, the default: never), gathers each rank's arrival time
    /// (wall clock, less [`crate::NcclBroadcaster::set_clock_offset`]) at the root with one
    /// `ncclAllGather` of 8 bytes per rank, after the broadcast and under the round's
    /// deadline, so that `take_arrivals` names the straggler. Such a round waits for every
    /// rank on every rank (a broadcast's root does not). Variable [`env::ARRIVALS_EVERY`].
    #[must_use]
    pub fn arrivals_every(mut self, rounds: u64) -> Self {
        self.slab = self.slab.arrivals_every(rounds);
        self
    }

    /// Sets the deadline of the NCCL init (positive; variable [`env::INIT_TIMEOUT`]).
    #[must_use]
    pub fn init_timeout(mut self, timeout: Duration) -> Self {
        self.init_timeout = timeout;
        self.env_errors.clear(INIT_TIMEOUT);
        self
    }

    pub(crate) fn check(&self) -> Result<()> {
        self.env_errors.check()?;
        self.slab.check(crate::probe::BACKEND)?;
        lens_core::backend::check_timeout("the NCCL init timeout", self.init_timeout)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_vars_reads_every_setting_and_code_overrides_a_bad_one() {
        let vars = [
            (env::SLAB_SIZE, "1024"),
            (env::TIMEOUT, "2"),
            (env::MAX_PAYLOAD, "4096"),
            (env::INIT_TIMEOUT, "7"),
            (env::ARRIVALS_EVERY, "10"),
        ];
        let get = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let opts = NcclOptions::from_vars(get);
        assert_eq!(
            (
                opts.slab.slab_size,
                opts.slab.timeout,
                opts.slab.max_payload,
                opts.init_timeout
            ),
            (1024, Duration::from_secs(2), 4096, Duration::from_secs(7))
        );
        assert_eq!(opts.slab.arrivals_every, 10);
        assert!(opts.check().is_ok());
        let bad = NcclOptions::from_vars(|k| (k == env::INIT_TIMEOUT).then(|| "soon".to_string()));
        let e = bad.check().unwrap_err();
        assert!(e.to_string().contains(env::INIT_TIMEOUT), "{e}");
        assert!(bad.init_timeout(Duration::from_secs(1)).check().is_ok());
        let bad = NcclOptions::from_vars(|k| (k == env::ARRIVALS_EVERY).then(|| "often".into()));
        let e = bad.check().unwrap_err();
        assert!(e.to_string().contains(env::ARRIVALS_EVERY), "{e}");
        assert!(bad.arrivals_every(2).check().is_ok());
    }
}
