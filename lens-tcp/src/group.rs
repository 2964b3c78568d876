//! The TCP group: rank 0 is the hub (a ROUTER bound at the rendezvous address); every
//! other rank is a DEALER connected to it. A round goes root -> hub -> every rank, each
//! rank acknowledges to the hub, and the hub tells the root when all have it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lens_core::{Broadcaster, Error, Result, check_broadcast_args};

use crate::config::TcpConfig;
use crate::frame::{Codec, Frame, HEADER, Kind, TAG};

const BACKEND: &str = "tcp";
/// Frames for later rounds kept while a round is in progress, per group member.
const PENDING_PER_RANK: usize = 4;

fn zmq_err(what: &str) -> impl FnOnce(zmq::Error) -> Error + '_ {
    move |e| Error::transport(BACKEND, what.to_owned(), e)
}

/// A frame and the connection it came from (the hub's routing id; empty on a DEALER).
struct Incoming {
    from: Vec<u8>,
    frame: Frame,
}

struct Link {
    _ctx: zmq::Context,
    socket: zmq::Socket,
    codec: Codec,
    rank: u32,
    world_size: usize,
    session: u64,
    round: u64,
    /// Hub only: each rank's routing id, once it has joined.
    peers: Vec<Option<Vec<u8>>>,
    pending: VecDeque<Incoming>,
}

impl Link {
    fn is_hub(&self) -> bool {
        self.rank == 0
    }

    fn send_to(&self, to: Option<&[u8]>, bytes: &[u8]) -> Result<()> {
        match to {
            Some(id) => self
                .socket
                .send_multipart([id, bytes], 0)
                .map_err(zmq_err("send to a rank")),
            None => self
                .socket
                .send(bytes, 0)
                .map_err(zmq_err("send to the hub")),
        }
    }

    fn send_to_rank(&self, rank: usize, bytes: &[u8]) -> Result<()> {
        match self.peers.get(rank).and_then(Option::as_deref) {
            Some(id) => self.send_to(Some(id), bytes),
            None => Err(Error::Closed {
                backend: BACKEND,
                reason: format!("rank {rank} has not joined"),
            }),
        }
    }

    fn frame(&self, kind: Kind, round: u64, root: u32, payload: &[u8]) -> Vec<u8> {
        self.codec
            .encode(kind, self.rank, self.session, round, root, payload)
    }

    /// The next authenticated frame of this session, or `None` at the deadline. Frames
    /// that fail authentication or belong to another session are logged and dropped.
    fn recv(&mut self, deadline: Instant) -> Result<Option<Incoming>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let ms = i64::try_from(left.as_millis().max(1)).unwrap_or(i64::MAX);
            let ready = self.socket.poll(zmq::POLLIN, ms).map_err(zmq_err("poll"))?;
            if ready == 0 {
                continue;
            }
            let mut parts = self.socket.recv_multipart(0).map_err(zmq_err("receive"))?;
            let (from, bytes) = match (self.is_hub(), parts.len()) {
                (true, 2) => {
                    let bytes = parts.pop().unwrap_or_default();
                    (parts.pop().unwrap_or_default(), bytes)
                }
                (false, 1) => (Vec::new(), parts.pop().unwrap_or_default()),
                (_, n) => {
                    tracing::warn!(parts = n, "dropped a message with an unexpected shape");
                    continue;
                }
            };
            let frame = match self.codec.decode(&bytes) {
                Ok(f) => f,
                Err(why) => {
                    tracing::warn!(%why, bytes = bytes.len(), "dropped an unauthenticated frame");
                    continue;
                }
            };
            // Joining frames carry no session yet (HELLO) or bring it (WELCOME, REJECT).
            let joining = matches!(frame.kind, Kind::Hello | Kind::Welcome | Kind::Reject);
            if !joining && frame.session != self.session {
                tracing::warn!(
                    session = frame.session,
                    "dropped a frame of another session (replayed or stale)"
                );
                continue;
            }
            if self.is_hub() && frame.kind != Kind::Hello {
                let known = self
                    .peers
                    .get(frame.sender as usize)
                    .and_then(Option::as_deref);
                if known != Some(from.as_slice()) {
                    tracing::warn!(
                        sender = frame.sender,
                        "dropped a frame whose sender rank is not its connection's"
                    );
                    continue;
                }
            }
            return Ok(Some(Incoming { from, frame }));
        }
    }

    /// Waits for a frame of the current round that `want` accepts. Later rounds' frames
    /// are kept for later; earlier rounds' are dropped (a late acknowledgement, a replay).
    fn wait(
        &mut self,
        deadline: Instant,
        mut want: impl FnMut(&Frame) -> bool,
    ) -> Result<Option<Incoming>> {
        if let Some(at) = self
            .pending
            .iter()
            .position(|i| i.frame.round == self.round && want(&i.frame))
        {
            return Ok(self.pending.remove(at));
        }
        while let Some(incoming) = self.recv(deadline)? {
            let f = &incoming.frame;
            if f.kind == Kind::Hello {
                self.turn_away(&incoming);
                continue;
            }
            if f.round < self.round {
                tracing::debug!(round = f.round, now = self.round, kind = ?f.kind, "dropped a frame of an earlier round");
                continue;
            }
            if f.round > self.round || !want(f) {
                if f.round > self.round && self.pending.len() < PENDING_PER_RANK * self.world_size {
                    self.pending.push_back(incoming);
                } else {
                    tracing::warn!(round = f.round, now = self.round, kind = ?f.kind, "dropped an unexpected frame");
                }
                continue;
            }
            return Ok(Some(incoming));
        }
        Ok(None)
    }

    /// A HELLO after the group formed: a duplicate rank or a stranger with the key.
    fn turn_away(&self, incoming: &Incoming) {
        let rank = incoming.frame.sender;
        tracing::warn!(
            rank,
            "rejected a join after the group formed (duplicate rank?)"
        );
        let reject = self.codec.encode(
            Kind::Reject,
            0,
            0,
            0,
            0,
            format!("rank {rank} is already in the group").as_bytes(),
        );
        if self.is_hub() {
            let _ = self.send_to(Some(&incoming.from), &reject);
        }
    }

    fn fail_payload(missing: &[usize]) -> Vec<u8> {
        missing
            .iter()
            .flat_map(|&r| (r as u32).to_le_bytes())
            .collect()
    }

    fn missing_from(payload: &[u8]) -> Vec<usize> {
        payload
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
            .collect()
    }

    /// The hub's part of a round.
    fn hub_round(
        &mut self,
        root: usize,
        payload: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let start = Instant::now();
        let deadline = start + timeout;
        let n = self.world_size;
        let round = self.round;
        let (data, forward) = match payload {
            Some(p) => (p.to_vec(), self.frame(Kind::Data, round, 0, p)),
            None => {
                let got = self.wait(deadline, |f| {
                    f.kind == Kind::Data && f.sender as usize == root
                })?;
                let Some(got) = got else {
                    self.fail_all(round, &[root], Some(root));
                    return Err(Error::Timeout {
                        after: start.elapsed(),
                        missing: vec![root],
                    });
                };
                // Re-signed by the hub, with the root as sender.
                let bytes = self.codec.encode(
                    Kind::Data,
                    root as u32,
                    self.session,
                    round,
                    root as u32,
                    &got.frame.payload,
                );
                (got.frame.payload, bytes)
            }
        };
        // A rank whose connection is gone cannot be sent to (router_mandatory): the round
        // fails at once, naming it, instead of waiting for its acknowledgement.
        let mut gone = Vec::new();
        for r in 1..n {
            if r != root {
                if let Err(e) = self.send_to_rank(r, &forward) {
                    tracing::warn!(rank = r, error = %e, "cannot reach a rank");
                    gone.push(r);
                }
            }
        }
        if !gone.is_empty() {
            if root != 0 {
                let fail = self.frame(Kind::Fail, round, root as u32, &Self::fail_payload(&gone));
                let _ = self.send_to_rank(root, &fail);
            }
            return Err(Error::Timeout {
                after: start.elapsed(),
                missing: gone,
            });
        }
        let mut acked = vec![false; n];
        acked[0] = true;
        acked[root] = true;
        while acked.iter().any(|a| !a) {
            match self.wait(deadline, |f| f.kind == Kind::Ack)? {
                Some(i) => {
                    if let Some(a) = acked.get_mut(i.frame.sender as usize) {
                        *a = true;
                    }
                }
                None => {
                    let missing: Vec<usize> = (0..n).filter(|&r| !acked[r]).collect();
                    if root != 0 {
                        let fail = self.frame(
                            Kind::Fail,
                            round,
                            root as u32,
                            &Self::fail_payload(&missing),
                        );
                        let _ = self.send_to_rank(root, &fail);
                    }
                    return Err(Error::Timeout {
                        after: start.elapsed(),
                        missing,
                    });
                }
            }
        }
        if root != 0 {
            let done = self.frame(Kind::Done, round, root as u32, &[]);
            if let Err(e) = self.send_to_rank(root, &done) {
                // Every rank has the data; only the root will not hear so.
                tracing::warn!(rank = root, error = %e, "cannot tell the root its round completed");
            }
        }
        Ok(data)
    }

    /// Tells every other rank that the round failed for want of `missing`.
    fn fail_all(&self, round: u64, missing: &[usize], except: Option<usize>) {
        let fail = self.frame(Kind::Fail, round, 0, &Self::fail_payload(missing));
        for r in 1..self.world_size {
            if Some(r) != except {
                let _ = self.send_to_rank(r, &fail);
            }
        }
    }

    /// A non-hub rank's part of a round.
    fn member_round(
        &mut self,
        root: usize,
        payload: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let start = Instant::now();
        // The hub reports failures within its own deadline; wait a little longer for that.
        let deadline = start + timeout + timeout / 4;
        let round = self.round;
        let me = self.rank as usize;
        let timeout_err = |missing: Vec<usize>| Error::Timeout {
            after: start.elapsed(),
            missing,
        };
        if let Some(p) = payload {
            let data = self.frame(Kind::Data, round, me as u32, p);
            self.send_to(None, &data)?;
            return match self.wait(deadline, |f| matches!(f.kind, Kind::Done | Kind::Fail))? {
                Some(i) if i.frame.kind == Kind::Done => Ok(p.to_vec()),
                Some(i) => Err(timeout_err(Self::missing_from(&i.frame.payload))),
                None => Err(timeout_err(vec![0])),
            };
        }
        match self.wait(deadline, |f| matches!(f.kind, Kind::Data | Kind::Fail))? {
            Some(i) if i.frame.kind == Kind::Data => {
                if i.frame.root as usize != root {
                    return Err(Error::Mismatch {
                        reason: format!(
                            "round {round}: this rank expected root {root}, the data came from root {}",
                            i.frame.root
                        ),
                    });
                }
                let ack = self.frame(Kind::Ack, round, root as u32, &[]);
                self.send_to(None, &ack)?;
                Ok(i.frame.payload)
            }
            Some(i) => Err(timeout_err(Self::missing_from(&i.frame.payload))),
            None => Err(timeout_err(if root == 0 { vec![0] } else { vec![root] })),
        }
    }
}

/// A TCP group in formation; see [`TcpBroadcaster::start`].
pub struct Rendezvous {
    link: Link,
    config: TcpConfig,
    local_addr: Option<SocketAddr>,
}

impl Rendezvous {
    /// Rank 0: the address it listens on (useful with port 0). `None` on other ranks.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Waits until the whole group has joined.
    ///
    /// # Errors
    /// [`Error::Timeout`] naming the ranks that never joined (on rank 0; the others name
    /// rank 0), [`Error::Closed`] when rank 0 turned this rank away (its rank is taken),
    /// or a transport error.
    pub fn finish(mut self) -> Result<TcpBroadcaster> {
        let start = Instant::now();
        let deadline = start + self.config.join_timeout;
        let n = self.config.world_size;
        if self.link.is_hub() {
            self.link.peers[0] = Some(Vec::new());
            while self.link.peers.iter().any(Option::is_none) {
                let Some(i) = self.link.recv(deadline)? else {
                    let missing: Vec<usize> =
                        (0..n).filter(|&r| self.link.peers[r].is_none()).collect();
                    return Err(Error::Timeout {
                        after: start.elapsed(),
                        missing,
                    });
                };
                let f = &i.frame;
                let size = f
                    .payload
                    .get(..4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
                let reason = match (f.kind, self.link.peers.get(f.sender as usize)) {
                    (Kind::Hello, _) if size != Some(n) => {
                        Some(format!("world size {size:?} is not {n}"))
                    }
                    (Kind::Hello, Some(None)) => None,
                    (Kind::Hello, Some(Some(_))) => {
                        Some(format!("rank {} is already in the group", f.sender))
                    }
                    (Kind::Hello, None) => {
                        Some(format!("rank {} is out of range for {n}", f.sender))
                    }
                    _ => {
                        tracing::warn!(kind = ?f.kind, "dropped a frame before the group formed");
                        continue;
                    }
                };
                match reason {
                    None => self.link.peers[f.sender as usize] = Some(i.from.clone()),
                    Some(why) => {
                        tracing::warn!(rank = f.sender, %why, "rejected a join");
                        let reject =
                            self.link
                                .codec
                                .encode(Kind::Reject, 0, 0, 0, 0, why.as_bytes());
                        let _ = self.link.send_to(Some(&i.from), &reject);
                    }
                }
            }
            let mut session = [0u8; 8];
            getrandom::fill(&mut session).map_err(|e| {
                Error::transport(BACKEND, "no randomness for the session id", e.to_string())
            })?;
            // Zero means "no session" in a HELLO.
            self.link.session = u64::from_le_bytes(session) | 1;
            let welcome = self.link.frame(Kind::Welcome, 0, 0, &[]);
            for r in 1..n {
                self.link.send_to_rank(r, &welcome)?;
            }
        } else {
            loop {
                let Some(i) = self.link.recv(deadline)? else {
                    return Err(Error::Timeout {
                        after: start.elapsed(),
                        missing: vec![0],
                    });
                };
                match i.frame.kind {
                    Kind::Welcome => {
                        self.link.session = i.frame.session;
                        break;
                    }
                    Kind::Reject => {
                        return Err(Error::Closed {
                            backend: BACKEND,
                            reason: format!(
                                "rank 0 turned this rank away: {}",
                                String::from_utf8_lossy(&i.frame.payload)
                            ),
                        });
                    }
                    other => tracing::warn!(kind = ?other, "dropped a frame before admission"),
                }
            }
        }
        tracing::debug!(rank = self.config.rank, world = n, "TCP group formed");
        Ok(TcpBroadcaster {
            rank: self.config.rank,
            world_size: n,
            timeout: self.config.timeout,
            max_payload: self.config.max_payload,
            link: Mutex::new(self.link),
        })
    }
}

/// One rank of a group that broadcasts over ZeroMQ on TCP.
///
/// Rank 0 binds the rendezvous address; the others connect to it and may join in any order
/// and at any time within the join timeout (slow joiners wait in the queue until the group
/// is complete). Every frame is signed with the job key (HMAC-SHA256) and carries the
/// session and round number, so frames from strangers, other jobs, earlier rounds or with
/// a wrong key are dropped and logged, and never become a payload.
///
/// `broadcast` blocks the calling thread until its round completes or its deadline passes:
/// with several ranks in one process give each its own thread (with
/// [`lens_core::blocking`]) or a blocking task.
pub struct TcpBroadcaster {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    max_payload: usize,
    link: Mutex<Link>,
}

impl std::fmt::Debug for TcpBroadcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpBroadcaster")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
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

    /// Binds (rank 0) or connects and says hello (other ranks), without waiting.
    ///
    /// # Errors
    /// [`Error::Transport`] when the address cannot be bound or connected.
    pub fn start(config: TcpConfig) -> Result<Rendezvous> {
        let codec = Codec::new(&config.key)?;
        let ctx = zmq::Context::new();
        let is_hub = config.rank == 0;
        let socket = ctx
            .socket(if is_hub { zmq::ROUTER } else { zmq::DEALER })
            .map_err(zmq_err("create a socket"))?;
        socket.set_linger(0).map_err(zmq_err("set linger"))?;
        // Bounded memory per peer: at most this many queued messages of at most this size;
        // libzmq drops a peer that sends a larger one.
        let max_msg = (config.max_payload + HEADER + TAG) as i64;
        socket
            .set_maxmsgsize(max_msg)
            .map_err(zmq_err("set the message size limit"))?;
        socket
            .set_rcvhwm(10_000)
            .map_err(zmq_err("set the receive queue limit"))?;
        socket
            .set_sndhwm(10_000)
            .map_err(zmq_err("set the send queue limit"))?;
        let endpoint = format!("tcp://{}", config.addr);
        let mut local_addr = None;
        if is_hub {
            socket
                .set_router_mandatory(true)
                .map_err(zmq_err("set router_mandatory"))?;
            socket
                .bind(&endpoint)
                .map_err(|e| Error::transport(BACKEND, format!("cannot bind {endpoint}"), e))?;
            let bound = socket
                .get_last_endpoint()
                .map_err(zmq_err("read the bound address"))?
                .unwrap_or_default();
            local_addr = bound.trim_start_matches("tcp://").parse().ok();
        } else {
            socket
                .set_reconnect_ivl(50)
                .map_err(zmq_err("set the reconnect interval"))?;
            socket.connect(&endpoint).map_err(|e| {
                Error::transport(BACKEND, format!("cannot connect to {endpoint}"), e)
            })?;
        }
        let mut link = Link {
            _ctx: ctx,
            socket,
            codec,
            rank: config.rank as u32,
            world_size: config.world_size,
            session: 0,
            round: 0,
            peers: vec![None; if is_hub { config.world_size } else { 0 }],
            pending: VecDeque::new(),
        };
        if !is_hub {
            let mut hello = (config.world_size as u32).to_le_bytes().to_vec();
            let mut nonce = [0u8; 16];
            getrandom::fill(&mut nonce).map_err(|e| {
                Error::transport(BACKEND, "no randomness for the hello", e.to_string())
            })?;
            hello.extend_from_slice(&nonce);
            let bytes = link.frame(Kind::Hello, 0, 0, &hello);
            // A DEALER queues this until the connection is up: slow starts are fine.
            link.send_to(None, &bytes)?;
        }
        link.round = 0;
        Ok(Rendezvous {
            link,
            config,
            local_addr,
        })
    }

    fn link(&self) -> MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|e| e.into_inner())
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

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let payload = check_broadcast_args(self, root, payload)?;
        if self.world_size == 1 {
            return Ok(payload.map(<[u8]>::to_vec).unwrap_or_default());
        }
        let mut link = self.link();
        link.round += 1;
        if link.is_hub() {
            link.hub_round(root, payload, self.timeout)
        } else {
            link.member_round(root, payload, self.timeout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TcpConfig;

    fn pair() -> (TcpBroadcaster, TcpBroadcaster) {
        let cfg = |rank, addr: &str| {
            TcpConfig::builder()
                .rank(rank)
                .world_size(2)
                .addr(addr)
                .key(b"replay test key, long enough....")
                .timeout(Duration::from_secs(2))
                .build()
                .expect("config")
        };
        let hub = TcpBroadcaster::start(cfg(0, "127.0.0.1:0")).expect("bind");
        let addr = hub.local_addr().expect("addr").to_string();
        let member = TcpBroadcaster::start(cfg(1, &addr)).expect("connect");
        std::thread::scope(|s| {
            let h = s.spawn(|| hub.finish());
            let m = member.finish().expect("member");
            (h.join().expect("thread").expect("hub"), m)
        })
    }

    fn round(
        hub: &TcpBroadcaster,
        member: &TcpBroadcaster,
        root: usize,
        data: &[u8],
    ) -> (Vec<u8>, Vec<u8>) {
        std::thread::scope(|s| {
            let h =
                s.spawn(|| lens_core::blocking::broadcast(hub, root, (root == 0).then_some(data)));
            let m = lens_core::blocking::broadcast(member, root, (root == 1).then_some(data))
                .expect("member");
            (h.join().expect("thread").expect("hub"), m)
        })
    }

    /// Frames replayed on a live connection (an earlier round's data, an ack for a round not
    /// yet run, a frame of another session) never become a payload.
    #[test]
    fn replayed_frames_are_dropped() {
        let (hub, member) = pair();
        for r in 0..3u8 {
            assert_eq!(round(&hub, &member, 1, &[r; 8]), (vec![r; 8], vec![r; 8]));
        }
        {
            let link = member.link();
            let session = link.session;
            // Round 2's data again, word for word, and a frame of an older session.
            let old = link.codec.encode(Kind::Data, 1, session, 2, 1, &[2; 8]);
            let other_session = link
                .codec
                .encode(Kind::Data, 1, session ^ 0xff, 4, 1, b"evil");
            link.send_to(None, &old).expect("send");
            link.send_to(None, &other_session).expect("send");
        }
        for r in 3..6u8 {
            assert_eq!(
                round(&hub, &member, 1, &[r; 8]),
                (vec![r; 8], vec![r; 8]),
                "round {r}"
            );
        }
        assert_eq!(
            round(&hub, &member, 0, b"from the hub"),
            (b"from the hub".to_vec(), b"from the hub".to_vec())
        );
    }
}
