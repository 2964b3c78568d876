//! What the keeper (`keeper.rs`) sleeps on while no round runs: the listening sockets, and,
//! while some connection has not proven the key, everything (the epoll instance itself).

use std::os::fd::{AsRawFd as _, RawFd};
use std::time::Instant;

use super::Net;

impl Net {
    /// The listening sockets' descriptors: they signal when a connection waits to be
    /// accepted. Messages on the connections are not signalled here, so a keeper that
    /// sleeps on these alone is not woken by every round.
    pub(crate) fn listen_fds(&self) -> Vec<RawFd> {
        self.listeners.iter().map(|l| l.as_raw_fd()).collect()
    }

    /// The epoll instance's descriptor: it signals when any socket of this rank does. It
    /// signals edges: only after a pass that left the sockets [`Net::drained`] does a later
    /// arrival signal again.
    pub(crate) fn wake_fd(&self) -> RawFd {
        self.poll.as_raw_fd()
    }

    /// Whether a connection has not proven the key (a stranger, a joiner, this rank's own
    /// connection made again): until it does or goes, its frames need serving as they come.
    pub(crate) fn unsettled(&self) -> bool {
        self.conns.values().any(|c| c.verified.is_none())
    }

    /// When something is due without a signal: the oldest unproven connection's handshake
    /// deadline, or an outbound connection to be made again.
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        let handshake = self
            .unproven
            .front()
            .map(|(opened, _)| *opened + self.limits.handshake);
        let dial = [&self.hub, &self.parent]
            .into_iter()
            .filter_map(|o| o.as_ref().and_then(|o| o.due()))
            .min();
        match (handshake, dial) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
