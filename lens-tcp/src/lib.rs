//! TCP backend for **lens**.
//!
//! [`TcpBroadcaster`] joins a group of N ranks that may live in different processes on
//! different hosts. Rank 0 binds the rendezvous address (torchrun's `MASTER_ADDR` and
//! `MASTER_PORT`, or `LENS_TCP_ADDR`); every rank may be the root of any round.
//! Joins are a mutual challenge-response over a pre-shared job key, frames are
//! authenticated (HMAC-SHA256; nothing is encrypted),
//! numbered by round, and acknowledged, so a missing rank becomes
//! [`lens_core::Error::Timeout`] naming it and a stranger's bytes never become a payload.
//! The threat model (what a stranger, the network and a buggy insider can and cannot do,
//! and what travels in clear) is in the guide, `docs/guide/tcp.md`, section "Threat model".
//!
//! A socket, thread or resolver call that fails is a [`lens_core::Error::Transport`] whose
//! source is a [`TcpError`] (which kind of call, and the system's answer).
//!
//! Each rank has a thread of its own (`lens-tcp-keeper-<rank>`) that serves its connections
//! while no round runs, so the limits on strangers hold between rounds too. A round runs on
//! the calling thread, which reads and writes the rank's sockets itself (non-blocking, in
//! epoll): one hop of a round wakes one thread. Each wait of a round first polls for up to
//! [`TcpConfigBuilder::spin`] (100 µs) where the host's ranks have a CPU each, which saves
//! the wake-up after a frame came. Unix only.
//!
//! ```no_run
//! use std::time::Duration;
//! use lens_tcp::{TcpBroadcaster, TcpConfigBuilder};
//!
//! // Each rank of the job, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and
//! // LENS_TCP_KEY_FILE set; code may override any field.
//! let config = TcpConfigBuilder::from_env()
//!     .timeout(Duration::from_secs(10))
//!     .build()?;
//! let group = TcpBroadcaster::connect(config)?;
//! let carrier = lens_core::blocking::broadcast_trace_context(&group, 0)?;
//! # Ok::<(), lens_core::Error>(())
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod addr;
mod broadcaster;
mod budget;
mod config;
mod diag;
pub mod env;
mod error;
mod frame;
mod handshake;
mod idhash;
mod join;
mod keeper;
mod key;
mod loopback;
mod machine;
mod message;
mod net;
mod round;
mod state;
mod tree;

pub use broadcaster::{Rendezvous, TcpBroadcaster};
pub use config::{
    DEFAULT_JOIN_TIMEOUT, DEFAULT_ROUND_TIMEOUT, DEFAULT_SPIN, MAX_SPIN, MAX_WORLD, MIN_KEY_LEN,
    SourceReturns, TcpConfig, TcpConfigBuilder,
};
pub use error::TcpError;
pub use loopback::{LoopbackGroup, loopback_group};

/// For the fuzz target: whether the frame decoder accepts `bytes` under `key`.
#[doc(hidden)]
pub mod fuzzing {
    /// True when `bytes` decode as a frame authenticated with `key`.
    pub fn accepts(key: &[u8], bytes: &[u8]) -> bool {
        crate::frame::Codec::new(key).is_ok_and(|c| c.decode(bytes, |_| true).is_ok())
    }
}
