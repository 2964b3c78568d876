//! Configuration of a TCP group.

use std::fmt;
use std::time::Duration;

use lens_core::{Error, RankInfo, Result};

/// Shortest job key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;

/// How one rank joins a TCP group. Built with [`TcpConfig::builder`] or [`TcpConfig::from_env`].
#[derive(Clone)]
pub struct TcpConfig {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) addr: String,
    pub(crate) key: Vec<u8>,
    pub(crate) timeout: Duration,
    pub(crate) join_timeout: Duration,
    pub(crate) max_payload: usize,
    pub(crate) fan_out: Option<usize>,
    pub(crate) advertise_host: Option<String>,
}

impl fmt::Debug for TcpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpConfig")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("addr", &self.addr)
            .field("key", &"<redacted>")
            .field("timeout", &self.timeout)
            .field("join_timeout", &self.join_timeout)
            .field("max_payload", &self.max_payload)
            .field("fan_out", &self.fan_out)
            .field("advertise_host", &self.advertise_host)
            .finish()
    }
}

impl TcpConfig {
    /// A builder; rank, world size, address and key are required.
    pub fn builder() -> TcpConfigBuilder {
        TcpConfigBuilder::default()
    }

    /// From the environment, as torchrun and friends set it:
    /// - address: `LENS_TCP_ADDR` (`host:port`), else `MASTER_ADDR` and `MASTER_PORT`;
    /// - rank and world size: [`RankInfo::from_env`];
    /// - key: `LENS_TCP_KEY`, else the contents of the file `LENS_TCP_KEY_FILE`;
    /// - optional `LENS_TCP_TIMEOUT` (seconds), `LENS_TCP_FAN_OUT` (tree arity) and
    ///   `LENS_TCP_HOST` (the address other ranks reach this host at, for tree fan-out).
    ///
    /// # Errors
    /// [`Error::Config`] naming the missing or malformed variable.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`TcpConfig::from_env`] with a custom lookup.
    ///
    /// # Errors
    /// As [`TcpConfig::from_env`].
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let info = RankInfo::from_vars(&lookup)?;
        let addr = match lookup("LENS_TCP_ADDR") {
            Some(a) => a,
            None => match (lookup("MASTER_ADDR"), lookup("MASTER_PORT")) {
                (Some(h), Some(p)) => format!("{h}:{p}"),
                _ => {
                    return Err(Error::config(
                        "set LENS_TCP_ADDR (host:port) or MASTER_ADDR and MASTER_PORT",
                    ));
                }
            },
        };
        let key = match (lookup("LENS_TCP_KEY"), lookup("LENS_TCP_KEY_FILE")) {
            (Some(k), _) => k.into_bytes(),
            (None, Some(path)) => std::fs::read(&path)
                .map(|mut k| {
                    while k.last().is_some_and(u8::is_ascii_whitespace) {
                        k.pop();
                    }
                    k
                })
                .map_err(|e| Error::config(format!("cannot read LENS_TCP_KEY_FILE={path}: {e}")))?,
            (None, None) => return Err(Error::config("set LENS_TCP_KEY or LENS_TCP_KEY_FILE")),
        };
        let mut b = TcpConfig::builder()
            .rank(info.rank)
            .world_size(info.world_size)
            .addr(addr)
            .key(key);
        if let Some(k) = lookup("LENS_TCP_FAN_OUT") {
            let k: usize = k
                .parse()
                .map_err(|_| Error::config(format!("LENS_TCP_FAN_OUT={k:?} is not a number")))?;
            b = b.fan_out(k);
        }
        if let Some(h) = lookup("LENS_TCP_HOST") {
            b = b.advertise_host(h);
        }
        if let Some(t) = lookup("LENS_TCP_TIMEOUT") {
            let secs: f64 = t.parse().map_err(|_| {
                Error::config(format!("LENS_TCP_TIMEOUT={t:?} is not a number of seconds"))
            })?;
            let d = Duration::try_from_secs_f64(secs)
                .map_err(|_| Error::config(format!("LENS_TCP_TIMEOUT={t:?} is out of range")))?;
            b = b.timeout(d);
        }
        b.build()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The group size.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The rendezvous address (`host:port`; rank 0 binds it).
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

/// Builds a [`TcpConfig`].
#[derive(Default)]
#[must_use]
pub struct TcpConfigBuilder {
    rank: Option<usize>,
    world_size: Option<usize>,
    addr: Option<String>,
    key: Option<Vec<u8>>,
    timeout: Option<Duration>,
    join_timeout: Option<Duration>,
    max_payload: Option<usize>,
    fan_out: Option<usize>,
    advertise_host: Option<String>,
}

impl TcpConfigBuilder {
    /// This rank.
    pub fn rank(mut self, rank: usize) -> Self {
        self.rank = Some(rank);
        self
    }

    /// The group size.
    pub fn world_size(mut self, n: usize) -> Self {
        self.world_size = Some(n);
        self
    }

    /// The rendezvous address, `host:port`; rank 0 binds it (port 0: any free port, see
    /// [`crate::Rendezvous::local_addr`]), the others connect to it.
    pub fn addr(mut self, addr: impl Into<String>) -> Self {
        self.addr = Some(addr.into());
        self
    }

    /// The pre-shared job key (at least [`MIN_KEY_LEN`] bytes) that authenticates frames.
    pub fn key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.key = Some(key.as_ref().to_vec());
        self
    }

    /// Deadline of each collective (default 30 s).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// How long rank 0 waits for every rank to join, and the others for admission
    /// (default 60 s).
    pub fn join_timeout(mut self, d: Duration) -> Self {
        self.join_timeout = Some(d);
        self
    }

    /// Largest payload (default [`lens_core::DEFAULT_MAX_PAYLOAD`]).
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = Some(bytes);
        self
    }

    /// Tree fan-out: each rank forwards a round to at most `k` others (rank 0 to ranks
    /// 1..=k, rank r to ranks k*r+1..=k*r+k), so no socket serves the whole group. The
    /// default is a star from rank 0. Every rank of a group must use the same value.
    pub fn fan_out(mut self, k: usize) -> Self {
        self.fan_out = Some(k);
        self
    }

    /// The host other ranks reach this rank at (tree fan-out: ranks with children listen
    /// for them). Defaults to the rendezvous host when that is a loopback address.
    pub fn advertise_host(mut self, host: impl Into<String>) -> Self {
        self.advertise_host = Some(host.into());
        self
    }

    /// The configuration.
    ///
    /// # Errors
    /// [`Error::Config`] for a missing field, a rank not below the world size, a short key,
    /// or an address that is not `host:port`.
    pub fn build(self) -> Result<TcpConfig> {
        let world_size = self
            .world_size
            .ok_or_else(|| Error::config("world size is required"))?;
        let rank = self.rank.ok_or_else(|| Error::config("rank is required"))?;
        if world_size == 0 || rank >= world_size || world_size > u32::MAX as usize {
            return Err(Error::config(format!(
                "rank {rank} of {world_size} is not a valid place"
            )));
        }
        let addr = self
            .addr
            .ok_or_else(|| Error::config("rendezvous address is required"))?;
        match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => return Err(Error::config(format!("address {addr:?} is not host:port"))),
        }
        let key = self
            .key
            .ok_or_else(|| Error::config("a job key is required"))?;
        if key.len() < MIN_KEY_LEN {
            return Err(Error::config(format!(
                "the job key has {} bytes; at least {MIN_KEY_LEN} are required",
                key.len()
            )));
        }
        let timeout = self.timeout.unwrap_or(Duration::from_secs(30));
        let join_timeout = self.join_timeout.unwrap_or(Duration::from_secs(60));
        if timeout.is_zero() || join_timeout.is_zero() {
            return Err(Error::config("timeouts must be positive"));
        }
        if self.fan_out == Some(0) {
            return Err(Error::config("fan-out must be at least 1"));
        }
        Ok(TcpConfig {
            rank,
            world_size,
            addr,
            key,
            timeout,
            join_timeout,
            max_payload: self.max_payload.unwrap_or(lens_core::DEFAULT_MAX_PAYLOAD),
            fan_out: self.fan_out,
            advertise_host: self.advertise_host,
        })
    }
}
