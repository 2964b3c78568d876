//! What the keeper (`keeper.rs`) sleeps on while no round runs: libzmq's reports of
//! connections opening and closing, and the sockets' own descriptors.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use lens_core::Result;

use super::{Net, SIDES};
use crate::error::socket_err;

/// Names each socket monitor's endpoint uniquely in the process.
static MONITORS: AtomicU64 = AtomicU64::new(0);

impl Net {
    /// The descriptors libzmq signals when something may have arrived on one of this
    /// rank's sockets (`ZMQ_FD`): another thread may sleep in `poll(2)` on them while no
    /// round runs. They signal edges: only after a pass that left the sockets
    /// [`Net::drained`] does a later arrival signal again.
    pub(crate) fn wait_fds(&self) -> Vec<RawFd> {
        SIDES
            .iter()
            .filter_map(|s| self.sock(*s).and_then(|k| k.get_fd().ok()))
            .collect()
    }

    /// Asks libzmq to report when a connection is accepted (or cannot be), made or lost on
    /// any of this rank's sockets; returns a socket per monitored socket on which the
    /// reports arrive. Messages on the connections are not reported, so a keeper that
    /// sleeps on these alone is not woken by every round.
    pub(crate) fn watch(&self) -> Result<Vec<zmq::Socket>> {
        let events = [
            zmq::SocketEvent::ACCEPTED,
            zmq::SocketEvent::ACCEPT_FAILED,
            zmq::SocketEvent::CONNECTED,
            zmq::SocketEvent::DISCONNECTED,
        ]
        .iter()
        .fold(0i32, |m, e| m | i32::from(e.to_raw()));
        let mut watchers = Vec::new();
        for side in SIDES {
            let Some(sock) = self.sock(side) else {
                continue;
            };
            let endpoint = format!(
                "inproc://lens-tcp-monitor-{}",
                MONITORS.fetch_add(1, Ordering::Relaxed)
            );
            sock.monitor(&endpoint, events)
                .map_err(socket_err("monitor a socket"))?;
            let pair = self
                .ctx
                .socket(zmq::PAIR)
                .map_err(socket_err("create a monitor socket"))?;
            pair.set_linger(0).map_err(socket_err("set linger"))?;
            pair.connect(&endpoint)
                .map_err(socket_err("connect a monitor socket"))?;
            watchers.push(pair);
        }
        Ok(watchers)
    }

    /// Whether a connection has not proven the key (a stranger, a joiner, this rank's own
    /// connection made again): until it does or goes, its frames need serving as they come.
    pub(crate) fn unsettled(&self) -> bool {
        self.conns.values().any(|c| c.verified.is_none())
    }

    /// When the oldest unproven connection's handshake deadline passes, if one waits.
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        self.unproven
            .front()
            .map(|(opened, _)| *opened + self.limits.handshake)
    }
}
