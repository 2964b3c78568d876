//! A whole group in one process on 127.0.0.1, for tests and benchmarks.

use std::net::SocketAddr;

use lens_core::{Broadcaster, Error, Result};

use crate::{TcpBroadcaster, TcpConfig, TcpConfigBuilder};

/// The ranks of [`loopback_group`] and the address rank 0 listens on.
#[derive(Debug)]
#[non_exhaustive]
pub struct LoopbackGroup {
    /// Every rank, in rank order.
    pub ranks: Vec<TcpBroadcaster>,
    /// Rank 0's rendezvous address (an ephemeral port), where a stranger would knock.
    pub addr: SocketAddr,
}

/// Forms a group of `world_size` ranks in this process: rank 0 on an ephemeral port of 127.0.0.1,
/// the others joining it, each on a thread of its own. `configure` gets each rank's builder
/// with its rank, the world size and the address set, and adds the rest (a key, at least).
///
/// ```
/// use std::time::Duration;
/// use lens_core::Broadcaster;
///
/// let group = lens_tcp::loopback_group(3, |b| {
///     b.key("a job key of at least 16 bytes").timeout(Duration::from_secs(10))
/// })?;
/// assert_eq!(group.ranks.len(), 3);
/// assert_eq!(group.ranks[2].rank(), 2);
/// assert!(group.addr.ip().is_loopback());
/// # Ok::<(), lens_core::Error>(())
/// ```
///
/// # Errors
/// A configuration error from `configure`'s builder, or the join's error of any rank.
pub fn loopback_group(
    world_size: usize,
    configure: impl Fn(TcpConfigBuilder) -> TcpConfigBuilder,
) -> Result<LoopbackGroup> {
    let config = |rank: usize, addr: &str| -> Result<TcpConfig> {
        configure(
            TcpConfig::builder()
                .rank(rank)
                .world_size(world_size)
                .addr(addr),
        )
        .build()
    };
    let hub = TcpBroadcaster::start(config(0, "127.0.0.1:0")?)?;
    let addr = hub
        .local_addr()
        .ok_or_else(|| Error::config("rank 0 has no address"))?;
    let others = (1..world_size)
        .map(|r| TcpBroadcaster::start(config(r, &addr.to_string())?))
        .collect::<Result<Vec<_>>>()?;
    let mut ranks = std::thread::scope(|s| {
        let handles: Vec<_> = std::iter::once(hub)
            .chain(others)
            .map(|r| s.spawn(move || r.finish()))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Closed {
                        backend: "tcp",
                        reason: "a rank's thread panicked while joining".into(),
                    })
                })
            })
            .collect::<Result<Vec<_>>>()
    })?;
    ranks.sort_by_key(Broadcaster::rank);
    Ok(LoopbackGroup { ranks, addr })
}
