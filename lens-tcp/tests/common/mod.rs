//! Helpers: an in-process TCP group on loopback, one thread per rank.
#![allow(dead_code)]

pub(crate) mod attacker;

use std::time::Duration;

use lens_tcp::{TcpBroadcaster, TcpConfig};

pub(crate) const KEY: &[u8] = b"a test job key, 32 bytes long!!!";

pub(crate) fn config(rank: usize, n: usize, addr: &str, timeout: Duration) -> TcpConfig {
    config_with(rank, n, addr, timeout, None)
}

pub(crate) fn config_with(
    rank: usize,
    n: usize,
    addr: &str,
    timeout: Duration,
    fan_out: Option<usize>,
) -> TcpConfig {
    let mut b = TcpConfig::builder()
        .rank(rank)
        .world_size(n)
        .addr(addr)
        .key(KEY)
        .timeout(timeout)
        .join_timeout(Duration::from_secs(20));
    if let Some(k) = fan_out {
        b = b.fan_out(k);
    }
    b.build().expect("config")
}

/// Rank 0 on an ephemeral loopback port; returns its rendezvous and the address.
pub(crate) fn hub(n: usize, timeout: Duration) -> (lens_tcp::Rendezvous, String) {
    hub_with(n, timeout, None)
}

pub(crate) fn hub_with(
    n: usize,
    timeout: Duration,
    fan_out: Option<usize>,
) -> (lens_tcp::Rendezvous, String) {
    let hub =
        TcpBroadcaster::start(config_with(0, n, "127.0.0.1:0", timeout, fan_out)).expect("bind");
    let addr = hub.local_addr().expect("bound address").to_string();
    (hub, addr)
}

/// A whole group of `n` ranks in this process.
pub(crate) fn group(n: usize, timeout: Duration) -> Vec<TcpBroadcaster> {
    group_with(n, timeout, None)
}

/// A whole group with tree fan-out `k` (`None`: the star).
pub(crate) fn group_with(
    n: usize,
    timeout: Duration,
    fan_out: Option<usize>,
) -> Vec<TcpBroadcaster> {
    group_at(n, timeout, fan_out).ranks
}

/// A whole group and rank 0's address, where a stranger would knock.
pub(crate) fn group_at(
    n: usize,
    timeout: Duration,
    fan_out: Option<usize>,
) -> lens_tcp::LoopbackGroup {
    lens_tcp::loopback_group(n, |b| {
        let b = b
            .key(KEY)
            .timeout(timeout)
            .join_timeout(Duration::from_secs(20));
        match fan_out {
            Some(k) => b.fan_out(k),
            None => b,
        }
    })
    .expect("group forms")
}
