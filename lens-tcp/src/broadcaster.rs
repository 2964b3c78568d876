//! [`TcpBroadcaster`]: start (bind or connect), the rendezvous, and the `Broadcaster` impl.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lens_core::arrivals::Arrivals;
use lens_core::backend::check_broadcast_args;
use lens_core::{Broadcaster, Error, Result};

use crate::addr::{is_loopback, resolve};
use crate::budget::{Descriptors, listen_queue, unproven_cap};
use crate::config::{SourceReturns, TcpConfig, split_host_port};
use crate::frame::{Codec, FRAME_HEADER, MAX_ENDPOINT, NONCE, TAG};
use crate::join::{form_as_hub, join_as_member};
use crate::keeper::{Keeper, lock};
use crate::net::{Limits, Net, Side};
use crate::state::RankState;
use crate::tree::Tree;

/// How long an accepted connection may take to prove the key before it is closed.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Frames a connection may send before it proves the key (a KNOCK and a HELLO, with room
/// for retries).
const UNPROVEN_FRAMES: u32 = 16;
/// What a connection may hold queued to send beyond what the kernel took: 64 × 64 KiB.
const QUEUE: usize = 64;
/// Ranks of a tree that rank 0 may hold while they wait for their parent to join.
const FORMING: usize = 32;

/// One rank of a group that broadcasts over TCP, on sockets it reads and writes itself.
///
/// Rank 0 binds the rendezvous address; the others connect to it and may join in any order
/// and at any time within the join timeout. Joining is a mutual challenge-response over
/// the job key, and every frame is signed (HMAC-SHA256) and carries the session and round
/// number, so frames from strangers, other jobs, earlier rounds or with a wrong key are
/// dropped and never become a payload. Rounds go down a star from rank 0, or a tree of
/// configurable arity ([`crate::TcpConfigBuilder::fan_out`]). See the crate docs for the
/// threat model.
///
/// `broadcast` blocks the calling thread until its round completes or its deadline passes
/// (a source with [`SourceReturns::Queued`] returns once its data is queued and ends the
/// round at its next call, [`TcpBroadcaster::flush`] or drop): with several ranks in one process give each its own thread (with
/// [`lens_core::blocking`]) or a blocking task. Between rounds a thread of the rank's own
/// (`lens-tcp-keeper-<rank>`, asleep while nothing arrives) serves its connections: a peer
/// that reconnects is admitted again, and strangers are held to the same limits as during
/// a round.
pub struct TcpBroadcaster {
    rank: usize,
    world_size: usize,
    local_rank: Option<usize>,
    timeout: Duration,
    max_payload: usize,
    queued: bool,
    // Stopped (and joined) before the group is dropped.
    keeper: Keeper,
    state: Arc<Mutex<RankState>>,
}

impl std::fmt::Debug for TcpBroadcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpBroadcaster")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

/// A TCP group in formation; see [`TcpBroadcaster::start`].
pub struct Rendezvous {
    state: RankState,
    config: TcpConfig,
    local_addr: Option<SocketAddr>,
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendezvous")
            .field("rank", &self.config.rank)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// The largest frame a proven peer may send in a group of `n`: a payload, a WELCOME, or
/// an ACK or FAIL naming ranks.
fn max_frame(config: &TcpConfig) -> usize {
    let welcome = NONCE + 2 + MAX_ENDPOINT;
    FRAME_HEADER + TAG + config.max_payload.max(welcome).max(4 * config.world_size)
}

impl TcpBroadcaster {
    /// Joins the group and waits until it is complete: [`TcpBroadcaster::start`] then
    /// [`Rendezvous::finish`].
    ///
    /// # Errors
    /// As those two.
    pub fn connect(config: TcpConfig) -> Result<Self> {
        Self::start(config)?.finish()
    }

    /// Binds (rank 0: every address the rendezvous host resolves to) or connects (other
    /// ranks), without waiting for the group.
    ///
    /// # Errors
    /// [`Error::Transport`] when the address cannot be resolved, bound or connected;
    /// [`Error::Config`] when this rank has tree children and no address to offer them.
    pub fn start(config: TcpConfig) -> Result<Rendezvous> {
        let codec = Codec::new(&config.key)?;
        let n = config.world_size;
        let rank = config.rank;
        let tree = Tree::new(n, config.fan_out);
        let max_unproven = unproven_cap(
            Descriptors::of_this_process(),
            rank,
            tree,
            peer_connections(tree, rank),
        )?;
        let joiners = if rank == 0 {
            n - 1
        } else {
            tree.children(rank).len()
        };
        let limits = Limits {
            max_frame: max_frame(&config),
            handshake: HANDSHAKE_TIMEOUT,
            max_unproven,
            unproven_frames: UNPROVEN_FRAMES,
            queue: QUEUE,
            backlog: listen_queue(max_unproven, joiners),
        };
        let mut net = Net::new(
            codec,
            limits,
            spin_for(
                &config,
                std::thread::available_parallelism().map_or(1, usize::from),
            ),
        )?;
        let addrs = resolve(&config.addr)?;
        let mut local_addr = None;
        let mut endpoint = String::new();
        if rank == 0 {
            local_addr = net
                .listen(&addrs)
                .map_err(|e| rendezvous_bind_error(&config.addr, e))?
                .first()
                .copied();
        } else {
            if !tree.children(rank).is_empty() {
                // A rank with tree children listens for them on a port of its own.
                let rendezvous_host = split_host_port(&config.addr).map_or("", |(h, _)| h);
                let host = match &config.advertise_host {
                    Some(h) => h.clone(),
                    None if is_loopback(rendezvous_host) => rendezvous_host.to_owned(),
                    None => {
                        return Err(Error::config(format!(
                            "rank {rank} forwards to tree children and needs an address they can reach: \
                             set advertise_host (LENS_TCP_HOST)"
                        )));
                    }
                };
                let bind: Vec<SocketAddr> = if is_loopback(&host) {
                    resolve(&format!("{host}:0"))?
                } else {
                    vec![SocketAddr::from(([0, 0, 0, 0], 0))]
                };
                let bound = net.listen(&bind)?;
                let port = bound.first().map_or(0, SocketAddr::port);
                endpoint = if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                if endpoint.len() > MAX_ENDPOINT {
                    return Err(Error::config(format!(
                        "the tree endpoint {endpoint:?} is over {MAX_ENDPOINT} bytes"
                    )));
                }
            }
            net.dial(Side::Hub, addrs[0])?;
        }
        Ok(Rendezvous {
            state: RankState::new(net, rank, n, tree, endpoint),
            config,
            local_addr,
        })
    }

    fn state(&self) -> MutexGuard<'_, RankState> {
        lock(&self.state)
    }

    /// With [`SourceReturns::Queued`]: waits until the last round this rank was the source
    /// of is over (every rank acknowledged it, or its deadline passed), and returns its
    /// failure. Returns at once when no such round is open (always, with the default
    /// [`SourceReturns::Delivered`]). Dropping the broadcaster does the same and logs a
    /// failure.
    ///
    /// # Errors
    /// As [`Broadcaster::broadcast`] for that round: [`Error::Timeout`] naming the ranks
    /// that did not acknowledge it.
    pub fn flush(&self) -> Result<()> {
        self.state().finish_open()
    }
}

impl Drop for TcpBroadcaster {
    fn drop(&mut self) {
        // The last queued round's data must reach the ranks before the sockets close.
        if let Err(e) = self.state().finish_open() {
            tracing::warn!(rank = self.rank, error = %e, "the last round this rank was the source of failed");
        }
    }
}

/// How long a round's waits poll: none where the group's ranks on this host outnumber the
/// CPUs this process may use (`net/spin.rs`).
fn spin_for(config: &TcpConfig, cpus: usize) -> Duration {
    if config.local_world_size > cpus {
        tracing::debug!(
            local_world_size = config.local_world_size,
            cpus,
            "more ranks on this host than CPUs: rounds sleep without polling"
        );
        return Duration::ZERO;
    }
    config.spin
}

/// Rank 0 cannot bind the rendezvous address: say which variables choose it, since under
/// torchrun `MASTER_PORT` is held by torch's own store.
fn rendezvous_bind_error(addr: &str, e: Error) -> Error {
    match e {
        Error::Transport {
            backend,
            message,
            source,
        } => Error::Transport {
            backend,
            message: format!(
                "{message}: rank 0 binds the rendezvous address {addr}; if another program holds \
                 it (under torchrun, torch's store holds MASTER_PORT), choose a free port with {} \
                 (host:port) or TcpConfigBuilder::addr",
                crate::env::ADDR
            ),
            source,
        },
        other => other,
    }
}

/// The connections rank `rank` keeps to proven peers. In a star, rank 0 one per rank and
/// the others one to rank 0. In a tree, each rank one per tree child and one to its parent;
/// while the group forms, rank 0 also holds ranks whose parent has not joined yet (counted
/// as [`FORMING`]), and a rank also its first connection to rank 0.
fn peer_connections(tree: Tree, rank: usize) -> usize {
    if tree.is_star() {
        return if rank == 0 {
            tree.n.saturating_sub(1)
        } else {
            1
        };
    }
    if rank == 0 {
        return tree.children(0).len() + FORMING;
    }
    let hub = usize::from(tree.parent(rank).is_some_and(|p| p != 0));
    1 + hub + tree.children(rank).len()
}

impl Rendezvous {
    /// Rank 0: the address it listens on (useful with port 0). `None` on other ranks.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Waits until the whole group has joined.
    ///
    /// # Errors
    /// - [`Error::Timeout`] naming the ranks that never joined (rank 0 tells the ranks
    ///   already admitted, so they name the same ranks; a rank that hears nothing from
    ///   rank 0 names rank 0);
    /// - [`Error::Unauthenticated`] when rank 0 says this rank's key is not the group's,
    ///   or (on rank 0) when the join failed and a peer with another key knocked;
    /// - [`Error::Mismatch`] (rank 0) when the join failed and a rank disagreed about the
    ///   world size or tried to join a group already formed;
    /// - [`Error::Closed`] when rank 0 turned this rank away (with its reason), or a
    ///   transport error.
    pub fn finish(mut self) -> Result<TcpBroadcaster> {
        let start = Instant::now();
        let join = self.config.join_timeout;
        let g = &mut self.state;
        if g.n > 1 {
            if g.is_hub() {
                form_as_hub(g, start, join)?;
            } else {
                join_as_member(g, start, join)?;
            }
        }
        tracing::debug!(rank = self.config.rank, world = g.n, "TCP group formed");
        let state = Arc::new(Mutex::new(self.state));
        Ok(TcpBroadcaster {
            rank: self.config.rank,
            world_size: self.config.world_size,
            local_rank: self.config.local_rank,
            timeout: self.config.timeout,
            max_payload: self.config.max_payload,
            queued: self.config.source_returns == SourceReturns::Queued,
            keeper: Keeper::start(Arc::clone(&state), self.config.rank)?,
            state,
        })
    }
}

#[async_trait::async_trait]
impl Broadcaster for TcpBroadcaster {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn max_payload(&self) -> usize {
        self.max_payload
    }

    fn local_rank(&self) -> Option<usize> {
        self.local_rank
    }

    fn rounds_started(&self) -> Option<u64> {
        Some(self.state().round)
    }

    /// Every acknowledgement says how long before it was sent each rank of its sender's
    /// subtree came, so rank 0 places every rank on its own clock within a network hop per
    /// tree level, with no clock offsets needed; a root other than 0 hears it in rank 0's
    /// DONE. In a tree an ack (and a DONE) carries the earliest and the latest few.
    /// The ranks that voted come the same way: each ack names voters of its subtree (a
    /// few: the source needs one), rank 0's DONE names them to another root.
    fn take_arrivals(&self) -> Option<Arrivals> {
        let mut g = self.state();
        let times = std::mem::take(&mut g.arrivals);
        let voted = std::mem::take(&mut g.voted);
        Arrivals::from_times(times).map(|a| a.with_voted(voted))
    }

    /// When the data came, where this rank then forwarded it and waited for acks (and,
    /// on the path to another root, rank 0's verdict) before the round returned.
    fn received_at(&self) -> Option<std::time::Instant> {
        self.state().received_at
    }

    /// Carried in this rank's ack of its next round.
    /// Carried on the round's acks (and rank 0's DONE to another root): the root finds
    /// `rank`, at `came`, in this rank's place.
    fn stand_for(&self, rank: usize, came: std::time::Instant) -> bool {
        self.state().stands_for = Some((rank, came));
        true
    }

    fn carry_vote(&self, vote: bool) -> bool {
        self.state().vote = vote;
        true
    }

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        self.round_here(root, payload)
    }

    /// The round blocks the calling thread anyway: no boxed future, no executor.
    fn broadcast_sync(&self, root: usize, payload: Option<&[u8]>) -> Option<Result<Vec<u8>>> {
        Some(self.round_here(root, payload))
    }
}

impl TcpBroadcaster {
    /// One round on the calling thread ([`Broadcaster::broadcast`] and
    /// [`Broadcaster::broadcast_sync`] alike).
    fn round_here(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let payload = check_broadcast_args(self, root, payload)?;
        if self.world_size == 1 {
            return Ok(payload.map(<[u8]>::to_vec).unwrap_or_default());
        }
        let mut g = self.state();
        let result = g.run_round(root, payload, self.timeout, self.queued);
        if result.is_err() && self.rank != 0 {
            // The connection may have been reset without a read seeing it yet: prove the key
            // again, so that the next round finds this rank (a no-op when nothing broke).
            let up = g.up_side();
            g.knock(up)?;
        }
        // While strangers are connected the keeper sleeps on the sockets' descriptors,
        // which signal again only once nothing is queued: leave nothing queued, and if more
        // is queued than a moment serves, the keeper goes on.
        if g.net.unsettled() {
            g.serve_idle(Duration::ZERO)?;
            if !g.net.drained() {
                self.keeper.poke();
            }
        }
        result
    }
}

#[cfg(test)]
mod tests;
