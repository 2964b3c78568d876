//! Configuration of a TCP group: a builder that can start from the environment.

use std::fmt;
use std::time::Duration;

use lens_core::backend::{EnvErrors, check_timeout, parse_timeout_secs};
use lens_core::{Error, RankInfo, Result};

use crate::{env, key};

/// Shortest job key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;
/// Largest world a TCP group supports: ranks travel as u32 and rank 0 keeps a table of
/// every rank, so the limit keeps join frames and memory bounded.
pub const MAX_WORLD: usize = 1 << 20;
/// Default deadline of each collective.
pub const DEFAULT_ROUND_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time rank 0 waits for every rank to join (and the others for admission).
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Default busy-polling of a round's wait before it sleeps ([`TcpConfigBuilder::spin`]).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);
/// Longest busy-polling a configuration may set: longer is no longer a wait for a frame on
/// its way but a core spent.
pub const MAX_SPIN: Duration = Duration::from_millis(10);

/// The whole number in environment variable `var`'s text, or an error naming it that says
/// it is not `what`.
fn whole(var: &str, text: &str, what: &str) -> Result<usize> {
    text.trim().parse().map_err(|_| not_a(var, text, what))
}

/// Environment variable `var`'s `text` is not `what`.
fn not_a(var: &str, text: &str, what: &str) -> Error {
    Error::config_for(var, format!("{var}={text:?} is not {what}"))
}

/// `host:port` split, an IPv6 host without its brackets.
pub(crate) fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((
        host.trim_start_matches('[').trim_end_matches(']'),
        port.parse().ok()?,
    ))
}

/// How one rank joins a TCP group. Built with [`TcpConfig::builder`] or
/// [`TcpConfigBuilder::from_env`].
#[derive(Clone)]
pub struct TcpConfig {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) local_rank: Option<usize>,
    pub(crate) addr: String,
    pub(crate) key: Vec<u8>,
    pub(crate) timeout: Duration,
    pub(crate) join_timeout: Duration,
    pub(crate) max_payload: usize,
    pub(crate) fan_out: Option<usize>,
    pub(crate) advertise_host: Option<String>,
    pub(crate) source_returns: SourceReturns,
    pub(crate) spin: Duration,
    pub(crate) local_world_size: usize,
}

/// When the source's `broadcast` returns ([`TcpConfigBuilder::source_returns`]).
///
/// The frames on the wire are the same either way, so ranks of one group may differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceReturns {
    /// Once every rank has acknowledged the payload (the default): a missing rank fails the
    /// round it misses on the source too, and the source's span names the round's
    /// straggler ([`lens_core::Broadcaster::take_arrivals`]).
    #[default]
    Delivered,
    /// Once the payload is queued to the first hop, as `MPI_Bcast`'s root does (the
    /// members still wait for it). The source checks the acknowledgements at its next call,
    /// at [`TcpBroadcaster::flush`](crate::TcpBroadcaster::flush), or when it is dropped,
    /// and that call returns the error of a round that failed (its own round still takes
    /// place, so the other ranks carry on). The price: a missing rank is named one call
    /// late on the source, and the source's span gets no straggler attributes (the acks
    /// that carry them come after it returned).
    Queued,
}

impl SourceReturns {
    /// Parses `delivered` or `queued` (the value of [`env::SOURCE_RETURNS`]).
    ///
    /// # Errors
    /// [`Error::Config`] naming the two values.
    pub fn parse(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "delivered" => Ok(SourceReturns::Delivered),
            "queued" => Ok(SourceReturns::Queued),
            _ => Err(Error::config_for(
                env::SOURCE_RETURNS,
                format!(
                    "{}={text:?}: expected \"delivered\" or \"queued\"",
                    env::SOURCE_RETURNS
                ),
            )),
        }
    }
}

impl fmt::Debug for TcpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpConfig")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("addr", &self.addr)
            .field("key", &"<redacted>")
            .field("timeout", &self.timeout)
            .field("join_timeout", &self.join_timeout)
            .field("max_payload", &self.max_payload)
            .field("fan_out", &self.fan_out)
            .field("advertise_host", &self.advertise_host)
            .field("source_returns", &self.source_returns)
            .field("spin", &self.spin)
            .field("local_world_size", &self.local_world_size)
            .finish()
    }
}

impl TcpConfig {
    /// A builder; rank, world size, address and key are required.
    pub fn builder() -> TcpConfigBuilder {
        TcpConfigBuilder::default()
    }

    /// `TcpConfigBuilder::from_env().build()`.
    ///
    /// # Errors
    /// As [`TcpConfigBuilder::build`].
    pub fn from_env() -> Result<Self> {
        TcpConfigBuilder::from_env().build()
    }

    /// `TcpConfigBuilder::from_vars(lookup).build()`.
    ///
    /// # Errors
    /// As [`TcpConfigBuilder::build`].
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        TcpConfigBuilder::from_vars(lookup).build()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The group size.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// This rank's index among the ranks on its host, when known.
    pub fn local_rank(&self) -> Option<usize> {
        self.local_rank
    }

    /// The rendezvous address (`host:port`; rank 0 binds it).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The deadline of one round.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// When the source's `broadcast` returns.
    pub fn source_returns(&self) -> SourceReturns {
        self.source_returns
    }

    /// How long a round's wait polls before it sleeps ([`TcpConfigBuilder::spin`]).
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// The group's ranks on this rank's host ([`TcpConfigBuilder::local_world_size`]; the
    /// world size when not given).
    pub fn local_world_size(&self) -> usize {
        self.local_world_size
    }
}

/// Builds a [`TcpConfig`]. Settings made in code override the environment.
#[derive(Default)]
#[must_use]
pub struct TcpConfigBuilder {
    rank: Option<usize>,
    world_size: Option<usize>,
    local_rank: Option<usize>,
    addr: Option<String>,
    key: Option<Vec<u8>>,
    timeout: Option<Duration>,
    join_timeout: Option<Duration>,
    max_payload: Option<usize>,
    fan_out: Option<usize>,
    advertise_host: Option<String>,
    source_returns: Option<SourceReturns>,
    spin: Option<Duration>,
    local_world_size: Option<usize>,
    /// The launcher's local world size (a hint: a group smaller than the launcher's world
    /// may have fewer ranks on the host).
    launcher_local: Option<usize>,
    /// Malformed environment settings, by field; a setter for the field clears its entry.
    env_errors: EnvErrors,
}

impl fmt::Debug for TcpConfigBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpConfigBuilder")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("addr", &self.addr)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("join_timeout", &self.join_timeout)
            .field("fan_out", &self.fan_out)
            .field("advertise_host", &self.advertise_host)
            .field("source_returns", &self.source_returns)
            .field("spin", &self.spin)
            .field("local_world_size", &self.local_world_size)
            .field("launcher_local", &self.launcher_local)
            .finish_non_exhaustive()
    }
}

impl TcpConfigBuilder {
    /// A builder filled from the environment, as torchrun and friends set it:
    /// - address: [`env::ADDR`] (`host:port`), else [`env::MASTER_ADDR`] and
    ///   [`env::MASTER_PORT`];
    /// - rank and world size: [`RankInfo::from_env`];
    /// - key: [`env::KEY`], else the file named by [`env::KEY_FILE`] (see the crate docs
    ///   for the encodings);
    /// - optional [`env::TIMEOUT`] and [`env::JOIN_TIMEOUT`] (seconds), [`env::FAN_OUT`],
    ///   [`env::HOST`], [`env::SOURCE_RETURNS`] and [`env::SPIN_US`] (microseconds);
    /// - the local world size: the first of [`env::LOCAL_WORLD_SIZE`] that is set.
    ///
    /// Nothing fails here: a missing or malformed variable is reported by
    /// [`TcpConfigBuilder::build`], naming the variable, unless code sets that field.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var_os(k))
    }

    /// [`TcpConfigBuilder::from_env`] with a custom lookup.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Self {
        Self::from_lookup(|k| lookup(k).map(Into::into))
    }

    fn from_lookup(lookup: impl Fn(&str) -> Option<std::ffi::OsString>) -> Self {
        let text = |k: &str| lookup(k).map(|v| v.to_string_lossy().into_owned());
        let mut b = TcpConfigBuilder::default();
        match RankInfo::from_vars(text) {
            Ok(info) => {
                b.rank = Some(info.rank);
                b.world_size = Some(info.world_size);
                b.local_rank = info.local_rank;
            }
            Err(e) => {
                b.env_errors.note_error("rank", e);
            }
        }
        match (
            text(env::ADDR),
            text(env::MASTER_ADDR),
            text(env::MASTER_PORT),
        ) {
            (Some(a), _, _) => b.addr = Some(a),
            (None, Some(h), Some(p)) => {
                b.addr = Some(if h.contains(':') && !h.starts_with('[') {
                    format!("[{h}]:{p}")
                } else {
                    format!("{h}:{p}")
                });
            }
            _ => {}
        }
        match key::from_env(&lookup) {
            Ok(Some(k)) => b.key = Some(k),
            Ok(None) => {}
            Err(e) => {
                b.env_errors.note_error("key", e);
            }
        }
        let mut secs = |var: &'static str, field: &'static str| match text(var) {
            Some(t) => match parse_timeout_secs(var, &t) {
                Ok(d) => Some(d),
                Err(e) => {
                    b.env_errors.note_error(field, e);
                    None
                }
            },
            None => None,
        };
        let timeout = secs(env::TIMEOUT, "timeout");
        let join_timeout = secs(env::JOIN_TIMEOUT, "join_timeout");
        b.timeout = timeout;
        b.join_timeout = join_timeout;
        if let Some(t) = text(env::FAN_OUT) {
            match whole(env::FAN_OUT, &t, "a whole number") {
                Ok(k) => b.fan_out = Some(k),
                Err(e) => b.env_errors.note_error("fan_out", e),
            }
        }
        b.advertise_host = text(env::HOST);
        if let Some(t) = text(env::SOURCE_RETURNS) {
            match SourceReturns::parse(&t) {
                Ok(s) => b.source_returns = Some(s),
                Err(e) => b.env_errors.note_error("source_returns", e),
            }
        }
        if let Some((var, t)) = env::LOCAL_WORLD_SIZE
            .iter()
            .find_map(|&var| text(var).map(|t| (var, t)))
        {
            let what = "a whole number of at least 1";
            match whole(var, &t, what).ok().filter(|&n| n > 0) {
                Some(n) => b.launcher_local = Some(n),
                None => b
                    .env_errors
                    .note_error("local_world_size", not_a(var, &t, what)),
            }
        }
        if let Some(t) = text(env::SPIN_US) {
            match whole(env::SPIN_US, &t, "a whole number of microseconds") {
                Ok(us) => {
                    b.spin = Some(Duration::from_micros(u64::try_from(us).unwrap_or(u64::MAX)));
                }
                Err(e) => b.env_errors.note_error("spin", e),
            }
        }
        b
    }

    /// This rank (environment: `RANK`, `SLURM_PROCID`, … via [`RankInfo::from_env`]).
    pub fn rank(mut self, rank: usize) -> Self {
        self.rank = Some(rank);
        self.env_errors.clear("rank");
        self
    }

    /// This rank's index among the ranks on its host, for the trace's `nv.dl.local_rank`
    /// (environment: `LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`,
    /// `SLURM_LOCALID`).
    pub fn local_rank(mut self, local_rank: usize) -> Self {
        self.local_rank = Some(local_rank);
        self
    }

    /// The group size (environment: `WORLD_SIZE`, `SLURM_NTASKS`, …).
    pub fn world_size(mut self, world_size: usize) -> Self {
        self.world_size = Some(world_size);
        self.env_errors.clear("rank");
        self
    }

    /// The rendezvous address, `host:port` (environment: [`env::ADDR`], or
    /// [`env::MASTER_ADDR`] and [`env::MASTER_PORT`]). The host may be a name, an IPv4 or
    /// an IPv6 address (in brackets); rank 0 binds every address the name resolves to
    /// (port 0: any free port, see [`crate::Rendezvous::local_addr`]), the others connect.
    pub fn addr(mut self, addr: impl Into<String>) -> Self {
        self.addr = Some(addr.into());
        self
    }

    /// The pre-shared job key, at least [`MIN_KEY_LEN`] bytes, used as given (environment:
    /// [`env::KEY`] or [`env::KEY_FILE`]).
    pub fn key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.key = Some(key.as_ref().to_vec());
        self.env_errors.clear("key");
        self
    }

    /// Deadline of each collective (default [`DEFAULT_ROUND_TIMEOUT`]; environment:
    /// [`env::TIMEOUT`]).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self.env_errors.clear("timeout");
        self
    }

    /// How long rank 0 waits for every rank to join, and the others for admission (default
    /// [`DEFAULT_JOIN_TIMEOUT`]; environment: [`env::JOIN_TIMEOUT`]).
    pub fn join_timeout(mut self, d: Duration) -> Self {
        self.join_timeout = Some(d);
        self.env_errors.clear("join_timeout");
        self
    }

    /// Largest payload (default [`lens_core::DEFAULT_MAX_PAYLOAD`]; no variable: the
    /// limit is the program's, not the job's).
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = Some(bytes);
        self
    }

    /// Tree fan-out (environment: [`env::FAN_OUT`]): each rank forwards a round to at most
    /// `k` others (rank 0 to ranks 1..=k, rank r to ranks k*r+1..=k*r+k), so no socket
    /// serves the whole group. The default is a star from rank 0. Every rank of a group
    /// must use the same value.
    pub fn fan_out(mut self, k: usize) -> Self {
        self.fan_out = Some(k);
        self.env_errors.clear("fan_out");
        self
    }

    /// The host other ranks reach this rank at (environment: [`env::HOST`]; tree fan-out:
    /// ranks with children listen for them). Defaults to the rendezvous host when that is a
    /// loopback address.
    pub fn advertise_host(mut self, host: impl Into<String>) -> Self {
        self.advertise_host = Some(host.into());
        self
    }

    /// When the source's `broadcast` returns (environment: [`env::SOURCE_RETURNS`];
    /// default [`SourceReturns::Delivered`]): see [`SourceReturns`].
    pub fn source_returns(mut self, when: SourceReturns) -> Self {
        self.source_returns = Some(when);
        self.env_errors.clear("source_returns");
        self
    }

    /// How long each wait of a round polls for its frame before it sleeps (environment:
    /// [`env::SPIN_US`], in microseconds; default [`DEFAULT_SPIN`]; at most [`MAX_SPIN`];
    /// zero: never). Sleeping, a rank pays a wake-up after its frame came (tens of µs on a
    /// VM); polling, it pays the CPU it polls on. Only a round's waits poll; none poll
    /// where the group has more ranks on this host ([`TcpConfigBuilder::local_world_size`])
    /// than the CPUs this process may use, and a rank whose waits keep outlasting twice
    /// the spin stops polling until one ends sooner (a member waiting for a slow source).
    pub fn spin(mut self, d: Duration) -> Self {
        self.spin = Some(d);
        self.env_errors.clear("spin");
        self
    }

    /// How many of the group's ranks run on this rank's host (environment: the first of
    /// [`env::LOCAL_WORLD_SIZE`] set, as torchrun, Open MPI, MPICH and Slurm set them, taken
    /// as at most the world size, since a group may be smaller than the launcher's world;
    /// default: the world size, as if every rank shared the host). Used only to decide
    /// whether a round's waits may poll ([`TcpConfigBuilder::spin`]).
    pub fn local_world_size(mut self, n: usize) -> Self {
        self.local_world_size = Some(n);
        self.env_errors.clear("local_world_size");
        self
    }

    /// The configuration.
    ///
    /// # Errors
    /// [`Error::Config`] for a missing field or a malformed environment variable (named), a
    /// rank not below the world size, a world over [`MAX_WORLD`], a short key, an address
    /// that is not `host:port`, a timeout that is zero or over
    /// [`lens_core::backend::MAX_TIMEOUT`], a spin over [`MAX_SPIN`], or a local world size
    /// set in code of 0 or over the world size.
    pub fn build(self) -> Result<TcpConfig> {
        self.env_errors.check()?;
        let world_size = self
            .world_size
            .ok_or_else(|| Error::config("world size is required (WORLD_SIZE or world_size)"))?;
        let rank = self
            .rank
            .ok_or_else(|| Error::config("rank is required (RANK or rank)"))?;
        if world_size == 0 || rank >= world_size {
            return Err(Error::config(format!(
                "rank {rank} of {world_size} is not a valid place"
            )));
        }
        if world_size > MAX_WORLD {
            return Err(Error::config(format!(
                "a world of {world_size} ranks is over the largest TCP group supported ({MAX_WORLD})"
            )));
        }
        let addr = self.addr.ok_or_else(|| {
            Error::config(format!(
                "rendezvous address is required: set {} (host:port), or {} and {}",
                env::ADDR,
                env::MASTER_ADDR,
                env::MASTER_PORT
            ))
        })?;
        if split_host_port(&addr).is_none_or(|(host, _)| host.is_empty()) {
            return Err(Error::config(format!("address {addr:?} is not host:port")));
        }
        let key = self.key.ok_or_else(|| {
            Error::config(format!(
                "a job key is required: set {} or {}",
                env::KEY,
                env::KEY_FILE
            ))
        })?;
        if key.len() < MIN_KEY_LEN {
            return Err(Error::config(format!(
                "the job key has {} bytes; at least {MIN_KEY_LEN} are required",
                key.len()
            )));
        }
        let timeout = check_timeout(
            "the TCP timeout",
            self.timeout.unwrap_or(DEFAULT_ROUND_TIMEOUT),
        )?;
        let join_timeout = check_timeout(
            "the TCP join timeout",
            self.join_timeout.unwrap_or(DEFAULT_JOIN_TIMEOUT),
        )?;
        if self.fan_out == Some(0) {
            return Err(Error::config("fan-out must be at least 1"));
        }
        let local_world_size = self.local_world_size.unwrap_or_else(|| {
            self.launcher_local
                .map_or(world_size, |n| n.min(world_size))
        });
        if local_world_size == 0 || local_world_size > world_size {
            return Err(Error::config(format!(
                "a local world size of {local_world_size} is not between 1 and the world size, {world_size}"
            )));
        }
        let spin = self.spin.unwrap_or(DEFAULT_SPIN);
        if spin > MAX_SPIN {
            return Err(Error::config(format!(
                "a spin of {} µs (spin, {}) is over the most allowed, {} µs: a longer one spends a core, not a wait",
                spin.as_micros(),
                env::SPIN_US,
                MAX_SPIN.as_micros()
            )));
        }
        Ok(TcpConfig {
            rank,
            world_size,
            local_rank: self.local_rank,
            addr,
            key,
            timeout,
            join_timeout,
            max_payload: self.max_payload.unwrap_or(lens_core::DEFAULT_MAX_PAYLOAD),
            fan_out: self.fan_out,
            advertise_host: self.advertise_host,
            source_returns: self.source_returns.unwrap_or_default(),
            spin,
            local_world_size,
        })
    }
}
