//! The settings every slab backend shares, and reading them from the environment.

use std::time::Duration;

use crate::backend::EnvErrors;
use crate::broadcaster::{DEFAULT_MAX_PAYLOAD, check_timeout, parse_timeout_secs};
use crate::error::{Error, Result};

use super::format::HEADER_LEN;

/// Default slab size in bytes, header included: room for a traceparent, a short tracestate
/// and a little baggage (240 payload bytes); a longer carrier sends its rest in a second
/// collective. Not larger: Open MPI's shared-memory transport sends up to 256 bytes in its
/// fast path, and 512-byte slabs measured twice as slow at 2 ranks and ten times as slow at
/// 4 oversubscribed ranks.
pub const DEFAULT_SLAB_SIZE: usize = 256;
/// Default deadline of a round.
pub const DEFAULT_ROUND_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest slab or payload the header can describe and MPI can count (`i32::MAX` bytes).
pub const MAX_SLAB_BYTES: usize = i32::MAX as usize;

/// Slab size, round deadline and payload limit of a slab backend; every rank of a group
/// must use the same slab size.
///
/// ```
/// use std::time::Duration;
/// use lens_core::backend::slab::SlabOptions;
///
/// let opts = SlabOptions::default().slab_size(1024).timeout(Duration::from_secs(5));
/// assert_eq!((opts.slab_size, opts.timeout), (1024, Duration::from_secs(5)));
/// assert!(opts.check("the MPI").is_ok());
/// assert!(SlabOptions::default().slab_size(16).check("the MPI").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlabOptions {
    /// Slab size in bytes, header included (default [`DEFAULT_SLAB_SIZE`]).
    pub slab_size: usize,
    /// Deadline of one round (default [`DEFAULT_ROUND_TIMEOUT`]).
    pub timeout: Duration,
    /// Largest payload (default [`DEFAULT_MAX_PAYLOAD`]).
    pub max_payload: usize,
    /// Every this many rounds, the ranks' arrival times are gathered at the root, for the
    /// source's step span ([`crate::arrivals`]); 0 (the default): never. Each gather is one
    /// more exchange, of 8 bytes from each rank, after the round.
    pub arrivals_every: u64,
    /// Variables that could not be read, reported by [`SlabOptions::check`] unless code set
    /// the field since.
    env_errors: EnvErrors,
}

impl Default for SlabOptions {
    fn default() -> Self {
        SlabOptions {
            slab_size: DEFAULT_SLAB_SIZE,
            timeout: DEFAULT_ROUND_TIMEOUT,
            max_payload: DEFAULT_MAX_PAYLOAD,
            arrivals_every: 0,
            env_errors: EnvErrors::default(),
        }
    }
}

const SLAB_SIZE: &str = "slab_size";
const TIMEOUT: &str = "timeout";
const MAX_PAYLOAD: &str = "max_payload";
const ARRIVALS_EVERY: &str = "arrivals_every";

/// The names of a backend's variables for [`SlabOptions::from_vars`].
#[derive(Debug, Clone, Copy)]
pub struct SlabVars {
    /// Slab size in bytes.
    pub slab_size: &'static str,
    /// Deadline of a round in seconds.
    pub timeout: &'static str,
    /// Largest payload in bytes.
    pub max_payload: &'static str,
    /// Rounds between gathers of the ranks' arrival times (`0`: never).
    pub arrivals_every: &'static str,
}

impl SlabOptions {
    /// Sets the slab size in bytes, header included (over the 16-byte header, at most
    /// [`MAX_SLAB_BYTES`]; variable: the backend's [`SlabVars::slab_size`], such as
    /// `LENS_MPI_SLAB_SIZE`).
    #[must_use]
    pub fn slab_size(mut self, bytes: usize) -> Self {
        self.slab_size = bytes;
        self.env_errors.clear(SLAB_SIZE);
        self
    }

    /// Sets the deadline of one round (positive, at most [`crate::backend::MAX_TIMEOUT`];
    /// variable: the backend's [`SlabVars::timeout`], such as `LENS_MPI_TIMEOUT`).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.env_errors.clear(TIMEOUT);
        self
    }

    /// Sets the largest payload in bytes (at most [`MAX_SLAB_BYTES`]; variable: the
    /// backend's [`SlabVars::max_payload`], such as `LENS_MPI_MAX_PAYLOAD`).
    #[must_use]
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self.env_errors.clear(MAX_PAYLOAD);
        self
    }

    /// Gathers the ranks' arrival times at the root every `rounds` rounds (0: never), where
    /// the transport can gather; the root's [`crate::Broadcaster::take_arrivals`] then
    /// names the rank that came last (variable: the backend's [`SlabVars::arrivals_every`],
    /// such as `LENS_MPI_ARRIVALS_EVERY`).
    #[must_use]
    pub fn arrivals_every(mut self, rounds: u64) -> Self {
        self.arrivals_every = rounds;
        self.env_errors.clear(ARRIVALS_EVERY);
        self
    }

    /// The defaults, overridden by the variables `vars` names where `get` finds them. A
    /// value that does not parse is kept as an error for [`SlabOptions::check`], so that code
    /// may still override the setting.
    pub fn from_vars(vars: &SlabVars, get: impl Fn(&str) -> Option<String>) -> Self {
        let mut opts = SlabOptions::default();
        let mut errors = EnvErrors::default();
        let mut bytes = |setting: &'static str, name: &str, into: &mut usize| {
            if let Some(text) = get(name) {
                match text.trim().parse() {
                    Ok(v) => *into = v,
                    Err(_) => {
                        errors.note(setting, format!("{name}={text:?} is not a number of bytes"))
                    }
                }
            }
        };
        bytes(SLAB_SIZE, vars.slab_size, &mut opts.slab_size);
        bytes(MAX_PAYLOAD, vars.max_payload, &mut opts.max_payload);
        if let Some(text) = get(vars.arrivals_every) {
            match text.trim().parse() {
                Ok(n) => opts.arrivals_every = n,
                Err(_) => errors.note(
                    ARRIVALS_EVERY,
                    format!("{}={text:?} is not a number of rounds", vars.arrivals_every),
                ),
            }
        }
        if let Some(text) = get(vars.timeout) {
            match parse_timeout_secs(vars.timeout, &text) {
                Ok(d) => opts.timeout = d,
                Err(e) => errors.note_error(TIMEOUT, e),
            }
        }
        opts.env_errors = errors;
        opts
    }

    /// Checks the options; `what` names the backend in the error ("the MPI").
    ///
    /// # Errors
    /// [`Error::Config`] for a slab no larger than its header or over [`MAX_SLAB_BYTES`], a
    /// payload limit over [`MAX_SLAB_BYTES`], a timeout that is zero or over
    /// [`crate::backend::MAX_TIMEOUT`], or a variable of [`SlabOptions::from_vars`] that did not parse.
    pub fn check(&self, what: &str) -> Result<()> {
        self.env_errors.check()?;
        if self.slab_size <= HEADER_LEN || self.slab_size > MAX_SLAB_BYTES {
            return Err(Error::config(format!(
                "{what} slab size {} must be over the {HEADER_LEN}-byte header and at most {MAX_SLAB_BYTES}",
                self.slab_size
            )));
        }
        if self.max_payload > MAX_SLAB_BYTES {
            return Err(Error::config(format!(
                "{what} payload limit {} is over {MAX_SLAB_BYTES} bytes",
                self.max_payload
            )));
        }
        check_timeout(&format!("{what} timeout"), self.timeout)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VARS: SlabVars = SlabVars {
        slab_size: "SLAB",
        timeout: "TIMEOUT",
        max_payload: "MAX",
        arrivals_every: "EVERY",
    };

    fn from(vars: &[(&str, &str)]) -> SlabOptions {
        SlabOptions::from_vars(&VARS, |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    /// One row per case: (why, variables, the options' check passes, slab size).
    #[test]
    fn from_vars_table() {
        let rows: [(&str, &[(&str, &str)], bool, usize); 9] = [
            (
                "arrivals every 4 rounds",
                &[("EVERY", "4")],
                true,
                DEFAULT_SLAB_SIZE,
            ),
            (
                "arrivals: not a number",
                &[("EVERY", "often")],
                false,
                DEFAULT_SLAB_SIZE,
            ),
            ("nothing set: the defaults", &[], true, DEFAULT_SLAB_SIZE),
            ("a slab size", &[("SLAB", "1024")], true, 1024),
            ("spaces around it", &[("SLAB", " 64 ")], true, 64),
            ("not a number", &[("SLAB", "big")], false, DEFAULT_SLAB_SIZE),
            (
                "a slab no larger than the header",
                &[("SLAB", "16")],
                false,
                16,
            ),
            (
                "a zero timeout",
                &[("TIMEOUT", "0")],
                false,
                DEFAULT_SLAB_SIZE,
            ),
            (
                "a huge payload limit",
                &[("MAX", "99999999999")],
                false,
                DEFAULT_SLAB_SIZE,
            ),
        ];
        for (why, vars, ok, slab) in rows {
            let opts = from(vars);
            assert_eq!(opts.check("the test").is_ok(), ok, "{why}: {opts:?}");
            assert_eq!(opts.slab_size, slab, "{why}");
        }
        assert_eq!(
            from(&[("TIMEOUT", "2.5")]).timeout,
            Duration::from_millis(2500)
        );
        let err = from(&[("SLAB", "big")]).check("the test").unwrap_err();
        assert!(err.to_string().contains("SLAB=\"big\""), "{err}");
        // Code that sets the field overrides the bad variable.
        assert!(
            from(&[("SLAB", "big")])
                .slab_size(64)
                .check("the test")
                .is_ok()
        );
    }
}
