//! The TCP group. Rank 0 is the hub: a ROUTER bound at the rendezvous address that every
//! other rank's DEALER connects to (the star). Rounds travel down a tree laid over the ranks
//! (rank r's children are k*r+1..=k*r+k; the star is the tree with k = n - 1): a root other
//! than 0 first hands its payload to the hub, the hub sends it to its children, each rank
//! forwards it to its own children, and acknowledgements (each naming the ranks missing
//! below it) flow back up. The hub tells the root when the round is complete or failed.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ops::Range;
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

/// The fan-out tree over ranks `0..n`.
#[derive(Debug, Clone, Copy)]
struct Tree {
    n: usize,
    k: usize,
}

impl Tree {
    fn parent(self, r: usize) -> Option<usize> {
        (r > 0).then(|| (r - 1) / self.k)
    }

    fn children(self, r: usize) -> Range<usize> {
        let first = r.saturating_mul(self.k).saturating_add(1).min(self.n);
        let end = r
            .saturating_mul(self.k)
            .saturating_add(self.k + 1)
            .min(self.n);
        first..end
    }

    fn depth(self, mut r: usize) -> usize {
        let mut d = 0;
        while let Some(p) = self.parent(r) {
            r = p;
            d += 1;
        }
        d
    }

    /// `r` and every rank below it.
    fn subtree(self, r: usize) -> Vec<usize> {
        let mut out = vec![r];
        let mut i = 0;
        while i < out.len() {
            out.extend(self.children(out[i]));
            i += 1;
        }
        out
    }
}

/// Which socket a frame came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The star: rank 0's ROUTER, or another rank's DEALER to it.
    Hub,
    /// A rank's ROUTER for its tree children.
    Kids,
    /// A rank's DEALER to its tree parent (when that is not rank 0).
    Up,
}

/// A frame and the connection it came from (a routing id on a ROUTER; empty on a DEALER).
struct Incoming {
    via: Via,
    from: Vec<u8>,
    frame: Frame,
}

struct Link {
    _ctx: zmq::Context,
    hub: zmq::Socket,
    kids: Option<zmq::Socket>,
    up: Option<zmq::Socket>,
    codec: Codec,
    rank: u32,
    world_size: usize,
    tree: Tree,
    session: u64,
    round: u64,
    /// Rank 0: each rank's routing id on the hub socket. Others: their children's routing
    /// ids on the kids socket.
    peers: Vec<Option<Vec<u8>>>,
    pending: VecDeque<Incoming>,
}

fn fail_payload(missing: &[usize]) -> Vec<u8> {
    missing
        .iter()
        .flat_map(|&r| (r as u32).to_le_bytes())
        .collect()
}

fn ranks_in(payload: &[u8]) -> Vec<usize> {
    payload
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect()
}

impl Link {
    fn me(&self) -> usize {
        self.rank as usize
    }

    fn is_hub(&self) -> bool {
        self.rank == 0
    }

    fn frame(&self, kind: Kind, round: u64, root: u32, payload: &[u8]) -> Vec<u8> {
        self.codec
            .encode(kind, self.rank, self.session, round, root, payload)
    }

    /// Rank != 0: to rank 0 over the star.
    fn to_hub(&self, bytes: &[u8]) -> Result<()> {
        self.hub.send(bytes, 0).map_err(zmq_err("send to rank 0"))
    }

    /// Rank 0: to rank `r` over the star.
    fn star_to(&self, r: usize, bytes: &[u8]) -> Result<()> {
        let id = self
            .peers
            .get(r)
            .and_then(Option::as_deref)
            .ok_or_else(|| Error::Closed {
                backend: BACKEND,
                reason: format!("rank {r} has not joined"),
            })?;
        self.hub
            .send_multipart([id, bytes], 0)
            .map_err(zmq_err("send to a rank"))
    }

    fn to_parent(&self, bytes: &[u8]) -> Result<()> {
        match &self.up {
            Some(up) => up
                .send(bytes, 0)
                .map_err(zmq_err("send to the tree parent")),
            None => self.to_hub(bytes),
        }
    }

    fn to_child(&self, c: usize, bytes: &[u8]) -> Result<()> {
        if self.is_hub() {
            return self.star_to(c, bytes);
        }
        let kids = self.kids.as_ref().ok_or_else(|| Error::Closed {
            backend: BACKEND,
            reason: "this rank has no children".into(),
        })?;
        let id = self
            .peers
            .get(c)
            .and_then(Option::as_deref)
            .ok_or_else(|| Error::Closed {
                backend: BACKEND,
                reason: format!("rank {c} has not joined its parent"),
            })?;
        kids.send_multipart([id, bytes], 0)
            .map_err(zmq_err("send to a tree child"))
    }

    fn parent_via(&self) -> Via {
        if self.up.is_some() { Via::Up } else { Via::Hub }
    }

    /// The next authenticated frame of this session from any socket, or `None` at the
    /// deadline. Frames that fail authentication, belong to another session, or claim a
    /// rank other than their connection's are logged and dropped.
    fn recv(&mut self, deadline: Instant) -> Result<Option<Incoming>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let ms = i64::try_from(left.as_millis().max(1)).unwrap_or(i64::MAX);
            let (via, socket) = if self.kids.is_none() && self.up.is_none() {
                // One socket (every rank of a star): poll it without building a poll set.
                if self.hub.poll(zmq::POLLIN, ms).map_err(zmq_err("poll"))? == 0 {
                    continue;
                }
                (Via::Hub, &self.hub)
            } else {
                let mut order = vec![(Via::Hub, &self.hub)];
                if let Some(k) = &self.kids {
                    order.push((Via::Kids, k));
                }
                if let Some(u) = &self.up {
                    order.push((Via::Up, u));
                }
                let mut items: Vec<zmq::PollItem<'_>> = order
                    .iter()
                    .map(|(_, s)| s.as_poll_item(zmq::POLLIN))
                    .collect();
                if zmq::poll(&mut items, ms).map_err(zmq_err("poll"))? == 0 {
                    continue;
                }
                let Some(at) = items.iter().position(zmq::PollItem::is_readable) else {
                    continue;
                };
                order[at]
            };
            let routed = (via == Via::Hub && self.is_hub()) || via == Via::Kids;
            let mut parts = socket.recv_multipart(0).map_err(zmq_err("receive"))?;
            let (from, bytes) = match (routed, parts.len()) {
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
            // Joining frames carry no session yet (HELLO) or bring it (WELCOME, REJECT). A
            // child's JOIN may arrive before this rank's own WELCOME: its session is checked
            // once this rank has one (`Rendezvous::finish`).
            let joining = matches!(
                frame.kind,
                Kind::Knock | Kind::Challenge | Kind::Hello | Kind::Welcome | Kind::Reject
            ) || (frame.kind == Kind::Join && self.session == 0);
            if !joining && frame.session != self.session {
                tracing::warn!(
                    session = frame.session,
                    "dropped a frame of another session (replayed or stale)"
                );
                continue;
            }
            if routed && !matches!(frame.kind, Kind::Knock | Kind::Hello | Kind::Join) {
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
            return Ok(Some(Incoming { via, from, frame }));
        }
    }

    /// Waits for a frame of the current round that `want` accepts. Later rounds' frames
    /// are kept for later; earlier rounds' are dropped (a late acknowledgement, a replay).
    fn wait(
        &mut self,
        deadline: Instant,
        mut want: impl FnMut(Via, &Frame) -> bool,
    ) -> Result<Option<Incoming>> {
        if let Some(at) = self
            .pending
            .iter()
            .position(|i| i.frame.round == self.round && want(i.via, &i.frame))
        {
            return Ok(self.pending.remove(at));
        }
        while let Some(incoming) = self.recv(deadline)? {
            let f = &incoming.frame;
            if matches!(f.kind, Kind::Knock | Kind::Hello | Kind::Join)
                && f.round == 0
                && self.round > 0
            {
                self.turn_away(&incoming);
                continue;
            }
            if f.round < self.round {
                tracing::debug!(round = f.round, now = self.round, kind = ?f.kind, "dropped a frame of an earlier round");
                continue;
            }
            if f.round > self.round || !want(incoming.via, f) {
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

    /// A join after the group formed: a duplicate rank, or a stranger with the key.
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
        let socket = match incoming.via {
            Via::Hub if self.is_hub() => &self.hub,
            Via::Kids => match &self.kids {
                Some(k) => k,
                None => return,
            },
            _ => return,
        };
        let _ = socket.send_multipart([incoming.from.as_slice(), &reject], 0);
    }

    /// Rank 0: tells `ranks` over the star that the round failed for want of `missing`.
    fn fail_to(
        &self,
        ranks: impl IntoIterator<Item = usize>,
        round: u64,
        root: usize,
        missing: &[usize],
    ) {
        let fail = self.frame(Kind::Fail, round, root as u32, &fail_payload(missing));
        for r in ranks {
            if r != 0 {
                let _ = self.star_to(r, &fail);
            }
        }
    }

    /// One round on this rank.
    fn round(&mut self, root: usize, payload: Option<&[u8]>, timeout: Duration) -> Result<Vec<u8>> {
        let start = Instant::now();
        let me = self.me();
        let round = self.round;
        let tree = self.tree;
        let max_depth = tree.depth(tree.n - 1);
        let timed_out = |missing: Vec<usize>| Error::Timeout {
            after: start.elapsed(),
            missing,
        };

        // 1. The payload reaches this rank: at the hub from the root over the star, elsewhere
        //    from the tree parent. Failures come over the star.
        let data = if me == 0 {
            match payload {
                Some(p) => p.to_vec(),
                None => {
                    let got = self.wait(start + timeout, |via, f| {
                        via == Via::Hub && f.kind == Kind::Data && f.sender as usize == root
                    })?;
                    match got {
                        Some(i) => i.frame.payload,
                        None => {
                            self.fail_to(1..tree.n, round, root, &[root]);
                            return Err(timed_out(vec![root]));
                        }
                    }
                }
            }
        } else {
            if let Some(p) = payload {
                let data = self.frame(Kind::Data, round, me as u32, p);
                self.to_hub(&data)?;
            }
            let from_parent = self.parent_via();
            let got = self.wait(start + timeout + timeout / 4, |via, f| {
                (f.kind == Kind::Data && via == from_parent)
                    || (f.kind == Kind::Fail && via == Via::Hub)
            })?;
            match got {
                Some(i) if i.frame.kind == Kind::Fail => {
                    return Err(timed_out(ranks_in(&i.frame.payload)));
                }
                Some(i) => {
                    if i.frame.root as usize != root {
                        return Err(Error::Mismatch {
                            reason: format!(
                                "round {round}: this rank expected root {root}, the data came from root {}",
                                i.frame.root
                            ),
                        });
                    }
                    i.frame.payload
                }
                None => return Err(timed_out(vec![root])),
            }
        };

        let got_data = Instant::now();

        // 2. Down to the children; a child that cannot be reached is missing with its subtree.
        let forward = self.codec.encode(
            Kind::Data,
            self.rank,
            self.session,
            round,
            root as u32,
            &data,
        );
        let mut missing = Vec::new();
        let mut waiting: Vec<usize> = Vec::new();
        for c in tree.children(me) {
            match self.to_child(c, &forward) {
                Ok(()) => waiting.push(c),
                Err(e) => {
                    tracing::warn!(rank = c, error = %e, "cannot reach a rank");
                    missing.extend(tree.subtree(c));
                }
            }
        }

        // 3. Acknowledgements from the children, each naming what is missing below it. Deeper
        //    ranks give up sooner, so that their parents still hear what they found.
        let depth = tree.depth(me);
        let share = (max_depth + 1 - depth.min(max_depth)) as u32;
        // Counted from when this rank got the data, so a rank reached late still gives its
        // children their share of the time; capped so that a root waiting for the outcome
        // (until 1.5 timeouts) hears it.
        let ack_deadline = (got_data + timeout * share / (max_depth as u32 + 1))
            .min(start + timeout + timeout / 4);
        while !waiting.is_empty() {
            let got = self.wait(ack_deadline, |via, f| {
                f.kind == Kind::Ack && via == if me == 0 { Via::Hub } else { Via::Kids }
            })?;
            match got {
                Some(i) => {
                    let child = i.frame.sender as usize;
                    if let Some(at) = waiting.iter().position(|&c| c == child) {
                        waiting.remove(at);
                        missing.extend(ranks_in(&i.frame.payload));
                    }
                }
                None => {
                    for c in waiting.drain(..) {
                        missing.extend(tree.subtree(c));
                    }
                }
            }
        }
        missing.sort_unstable();
        missing.dedup();

        // 4. Report up; the hub tells the root (and the ranks it could not reach).
        if me != 0 {
            let ack = self.frame(Kind::Ack, round, root as u32, &fail_payload(&missing));
            self.to_parent(&ack)?;
            if me == root {
                return match self.wait(start + timeout + timeout / 2, |via, f| {
                    via == Via::Hub && matches!(f.kind, Kind::Done | Kind::Fail)
                })? {
                    Some(i) if i.frame.kind == Kind::Done => Ok(data),
                    Some(i) => Err(timed_out(ranks_in(&i.frame.payload))),
                    None => Err(timed_out(vec![0])),
                };
            }
            return Ok(data);
        }
        if missing.is_empty() {
            if root != 0 {
                let done = self.frame(Kind::Done, round, root as u32, &[]);
                if let Err(e) = self.star_to(root, &done) {
                    // Every rank has the data; only the root will not hear so.
                    tracing::warn!(rank = root, error = %e, "cannot tell the root its round completed");
                }
            }
            return Ok(data);
        }
        let mut tell = missing.clone();
        tell.push(root);
        self.fail_to(tell, round, root, &missing);
        Err(timed_out(missing))
    }
}

/// A TCP group in formation; see [`TcpBroadcaster::start`].
pub struct Rendezvous {
    link: Link,
    config: TcpConfig,
    local_addr: Option<SocketAddr>,
    /// Where this rank listens for its tree children (sent in its HELLO).
    kids_endpoint: String,
}

fn read_endpoints(payload: &[u8], n: usize) -> Option<Vec<String>> {
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for _ in 0..n {
        let len = usize::from(u16::from_le_bytes([
            *payload.get(at)?,
            *payload.get(at + 1)?,
        ]));
        let s = payload.get(at + 2..at + 2 + len)?;
        out.push(String::from_utf8(s.to_vec()).ok()?);
        at += 2 + len;
    }
    (at == payload.len()).then_some(out)
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
    /// rank 0 or their tree children), [`Error::Closed`] when rank 0 turned this rank away
    /// (its rank is taken), or a transport error.
    pub fn finish(mut self) -> Result<TcpBroadcaster> {
        let start = Instant::now();
        let deadline = start + self.config.join_timeout;
        let n = self.config.world_size;
        let link = &mut self.link;
        if link.is_hub() {
            let mut endpoints = vec![String::new(); n];
            // Fresh nonces handed out, by connection: a HELLO must carry its connection's,
            // so a join recorded from an earlier job cannot be replayed.
            let mut challenges: std::collections::HashMap<Vec<u8>, [u8; 16]> =
                std::collections::HashMap::new();
            link.peers[0] = Some(Vec::new());
            while link.peers.iter().any(Option::is_none) {
                let Some(i) = link.recv(deadline)? else {
                    let missing: Vec<usize> = (0..n).filter(|&r| link.peers[r].is_none()).collect();
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
                if f.kind == Kind::Knock {
                    if size != Some(n) || challenges.len() >= 4 * n {
                        tracing::warn!(
                            rank = f.sender,
                            "ignored a knock (wrong world size or too many)"
                        );
                        continue;
                    }
                    let mut nonce = [0u8; 16];
                    getrandom::fill(&mut nonce).map_err(|e| {
                        Error::transport(BACKEND, "no randomness for a challenge", e.to_string())
                    })?;
                    challenges.insert(i.from.clone(), nonce);
                    let challenge = link.codec.encode(Kind::Challenge, 0, 0, 0, 0, &nonce);
                    let _ = link.hub.send_multipart([i.from.as_slice(), &challenge], 0);
                    continue;
                }
                let fresh = f.kind == Kind::Hello
                    && challenges
                        .remove(&i.from)
                        .is_some_and(|c| f.payload.get(4..20) == Some(&c[..]));
                let reason = match (f.kind, link.peers.get(f.sender as usize)) {
                    (Kind::Hello, _) if size != Some(n) => {
                        Some(format!("world size {size:?} is not {n}"))
                    }
                    (Kind::Hello, _) if !fresh => Some(
                        "the join does not answer this connection's challenge (replayed?)"
                            .to_owned(),
                    ),
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
                    None => {
                        let sender = f.sender as usize;
                        endpoints[sender] =
                            String::from_utf8_lossy(f.payload.get(20..).unwrap_or_default())
                                .into_owned();
                        link.peers[sender] = Some(i.from.clone());
                    }
                    Some(why) => {
                        tracing::warn!(rank = f.sender, %why, "rejected a join");
                        let reject = link.codec.encode(Kind::Reject, 0, 0, 0, 0, why.as_bytes());
                        let _ = link.hub.send_multipart([i.from.as_slice(), &reject], 0);
                    }
                }
            }
            let mut session = [0u8; 8];
            getrandom::fill(&mut session).map_err(|e| {
                Error::transport(BACKEND, "no randomness for the session id", e.to_string())
            })?;
            // Zero means "no session" in a HELLO.
            link.session = u64::from_le_bytes(session) | 1;
            let mut table = Vec::new();
            for e in &endpoints {
                table.extend_from_slice(&(e.len() as u16).to_le_bytes());
                table.extend_from_slice(e.as_bytes());
            }
            let welcome = link.frame(Kind::Welcome, 0, 0, &table);
            for r in 1..n {
                link.star_to(r, &welcome)?;
            }
        } else {
            let mut early_joins: Vec<Incoming> = Vec::new();
            let endpoints = loop {
                let Some(i) = link.recv(deadline)? else {
                    return Err(Error::Timeout {
                        after: start.elapsed(),
                        missing: vec![0],
                    });
                };
                match i.frame.kind {
                    Kind::Welcome => {
                        link.session = i.frame.session;
                        break read_endpoints(&i.frame.payload, n).ok_or_else(|| {
                            Error::Corrupt {
                                reason: "rank 0's welcome has a malformed endpoint table".into(),
                            }
                        })?;
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
                    Kind::Challenge if i.frame.payload.len() == 16 => {
                        let mut hello = (n as u32).to_le_bytes().to_vec();
                        hello.extend_from_slice(&i.frame.payload);
                        hello.extend_from_slice(self.kids_endpoint.as_bytes());
                        let bytes = link.frame(Kind::Hello, 0, 0, &hello);
                        link.to_hub(&bytes)?;
                    }
                    Kind::Join => early_joins.push(i),
                    other => tracing::warn!(kind = ?other, "dropped a frame before admission"),
                }
            };
            // Children that joined before this rank was admitted, now that the session is known.
            for i in early_joins {
                let c = i.frame.sender as usize;
                let mine = link.tree.parent(c) == Some(link.me());
                if i.via == Via::Kids && i.frame.session == link.session && mine {
                    link.peers[c] = Some(i.from);
                } else {
                    tracing::warn!(sender = c, "dropped a join of another session");
                }
            }
            let me = link.me();
            // Join the tree parent when it is not rank 0 (rank 0's children use the star).
            if let Some(p) = link.tree.parent(me).filter(|&p| p != 0) {
                let endpoint =
                    endpoints
                        .get(p)
                        .filter(|e| !e.is_empty())
                        .ok_or_else(|| Error::Corrupt {
                            reason: format!("rank {p} announced no address for its tree children"),
                        })?;
                let up = link
                    ._ctx
                    .socket(zmq::DEALER)
                    .map_err(zmq_err("create a socket"))?;
                up.set_linger(0).map_err(zmq_err("set linger"))?;
                up.set_reconnect_ivl(50)
                    .map_err(zmq_err("set the reconnect interval"))?;
                up.connect(endpoint).map_err(|e| {
                    Error::transport(BACKEND, format!("cannot connect to {endpoint}"), e)
                })?;
                let join = link.frame(Kind::Join, 0, 0, &[]);
                up.send(join, 0).map_err(zmq_err("join the tree parent"))?;
                link.up = Some(up);
            }
            // Wait for this rank's own tree children.
            let kids: Vec<usize> = link.tree.children(me).collect();
            while kids.iter().any(|&c| link.peers[c].is_none()) {
                let Some(i) = link.recv(deadline)? else {
                    return Err(Error::Timeout {
                        after: start.elapsed(),
                        missing: kids
                            .iter()
                            .copied()
                            .filter(|&c| link.peers[c].is_none())
                            .collect(),
                    });
                };
                let c = i.frame.sender as usize;
                if i.via == Via::Kids
                    && i.frame.kind == Kind::Join
                    && kids.contains(&c)
                    && link.peers[c].is_none()
                {
                    link.peers[c] = Some(i.from);
                } else if i.frame.round > 0 {
                    link.pending.push_back(i); // a round started before this rank finished joining
                } else {
                    tracing::warn!(kind = ?i.frame.kind, sender = c, "dropped an unexpected frame while joining");
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
/// a wrong key are dropped and logged, and never become a payload. Rounds go down a star
/// from rank 0, or a tree of configurable arity ([`crate::TcpConfigBuilder::fan_out`]).
///
/// `broadcast` blocks the calling thread until its round completes or its deadline passes:
/// with several ranks in one process give each its own thread (with
/// [`lens_core::blocking`]) or a blocking task. Rank 0 reads late joins while it takes part
/// in a collective, so a duplicate rank is turned away at the next round.
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

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
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
    /// [`Error::Transport`] when the address cannot be bound or connected;
    /// [`Error::Config`] when this rank has tree children and no address to offer them.
    pub fn start(config: TcpConfig) -> Result<Rendezvous> {
        let codec = Codec::new(&config.key)?;
        let ctx = zmq::Context::new();
        let n = config.world_size;
        let tree = Tree {
            n,
            k: config
                .fan_out
                .unwrap_or(n.saturating_sub(1))
                .clamp(1, n.max(2) - 1),
        };
        let is_hub = config.rank == 0;
        // Bounded memory per peer: at most this many queued messages of at most this size;
        // libzmq drops a peer that sends a larger one.
        let max_msg = (config.max_payload + HEADER + TAG) as i64;
        let socket = |kind| -> Result<zmq::Socket> {
            let s = ctx.socket(kind).map_err(zmq_err("create a socket"))?;
            s.set_linger(0).map_err(zmq_err("set linger"))?;
            s.set_maxmsgsize(max_msg)
                .map_err(zmq_err("set the message size limit"))?;
            s.set_rcvhwm(10_000)
                .map_err(zmq_err("set the receive queue limit"))?;
            s.set_sndhwm(10_000)
                .map_err(zmq_err("set the send queue limit"))?;
            if kind == zmq::ROUTER {
                s.set_router_mandatory(true)
                    .map_err(zmq_err("set router_mandatory"))?;
            } else {
                s.set_reconnect_ivl(50)
                    .map_err(zmq_err("set the reconnect interval"))?;
            }
            Ok(s)
        };
        let hub = socket(if is_hub { zmq::ROUTER } else { zmq::DEALER })?;
        let endpoint = format!("tcp://{}", config.addr);
        let mut local_addr = None;
        if is_hub {
            hub.bind(&endpoint)
                .map_err(|e| Error::transport(BACKEND, format!("cannot bind {endpoint}"), e))?;
            let bound = hub
                .get_last_endpoint()
                .map_err(zmq_err("read the bound address"))?
                .unwrap_or_default();
            local_addr = bound.trim_start_matches("tcp://").parse().ok();
        } else {
            hub.connect(&endpoint).map_err(|e| {
                Error::transport(BACKEND, format!("cannot connect to {endpoint}"), e)
            })?;
        }
        // A rank other than 0 with tree children listens for them on a port of its own.
        let mut kids = None;
        let mut kids_endpoint = String::new();
        if !is_hub && !tree.children(config.rank).is_empty() {
            let rendezvous_host = config.addr.rsplit_once(':').map_or("", |(h, _)| h);
            let host = match &config.advertise_host {
                Some(h) => h.clone(),
                None if is_loopback(rendezvous_host) => rendezvous_host.to_owned(),
                None => {
                    return Err(Error::config(format!(
                        "rank {} forwards to tree children and needs an address they can reach: \
                         set advertise_host (LENS_TCP_HOST)",
                        config.rank
                    )));
                }
            };
            let k = socket(zmq::ROUTER)?;
            let bind_host = if is_loopback(&host) {
                host.as_str()
            } else {
                "*"
            };
            k.bind(&format!("tcp://{bind_host}:0"))
                .map_err(|e| Error::transport(BACKEND, "cannot listen for tree children", e))?;
            let bound = k
                .get_last_endpoint()
                .map_err(zmq_err("read the bound address"))?
                .unwrap_or_default();
            let port = bound.rsplit_once(':').map_or("", |(_, p)| p).to_owned();
            kids_endpoint = format!("tcp://{host}:{port}");
            kids = Some(k);
        }
        let link = Link {
            _ctx: ctx,
            hub,
            kids,
            up: None,
            codec,
            rank: config.rank as u32,
            world_size: n,
            tree,
            session: 0,
            round: 0,
            peers: vec![None; n],
            pending: VecDeque::new(),
        };
        if !is_hub {
            let knock = link.frame(Kind::Knock, 0, 0, &(n as u32).to_le_bytes());
            // A DEALER queues this until the connection is up: slow starts are fine.
            link.to_hub(&knock)?;
        }
        Ok(Rendezvous {
            link,
            config,
            local_addr,
            kids_endpoint,
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
        link.round(root, payload, self.timeout)
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
            link.to_hub(&old).expect("send");
            link.to_hub(&other_session).expect("send");
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

#[cfg(test)]
mod join_tests {
    use super::*;
    use crate::config::TcpConfig;

    const KEY: &[u8] = b"join replay test key, long enough";

    fn cfg(rank: usize, addr: &str) -> TcpConfig {
        TcpConfig::builder()
            .rank(rank)
            .world_size(2)
            .addr(addr)
            .key(KEY)
            .join_timeout(Duration::from_secs(10))
            .build()
            .expect("config")
    }

    /// A HELLO recorded from an earlier job (signed with the same key, answering an old
    /// challenge) or sent without a challenge is turned away; the real rank still joins.
    #[test]
    fn replayed_join_is_turned_away() {
        let hub = TcpBroadcaster::start(cfg(0, "127.0.0.1:0")).expect("bind");
        let addr = hub.local_addr().expect("addr").to_string();
        let codec = Codec::new(KEY).expect("key");
        let ctx = zmq::Context::new();
        let attacker = ctx.socket(zmq::DEALER).expect("socket");
        attacker.set_linger(0).expect("linger");
        attacker.connect(&format!("tcp://{addr}")).expect("connect");
        let mut replayed = 2u32.to_le_bytes().to_vec();
        replayed.extend_from_slice(&[7u8; 16]); // an old challenge
        attacker
            .send(codec.encode(Kind::Hello, 1, 0, 0, 0, &replayed), 0)
            .expect("send");
        std::thread::scope(|s| {
            let h = s.spawn(|| hub.finish());
            // The attacker is told no, and gets no session.
            assert_eq!(attacker.poll(zmq::POLLIN, 5_000).expect("poll"), 1);
            let reply = codec
                .decode(&attacker.recv_bytes(0).expect("recv"))
                .expect("signed");
            assert_eq!(reply.kind, Kind::Reject);
            assert!(String::from_utf8_lossy(&reply.payload).contains("challenge"));
            // The real rank 1 joins after it.
            let member = TcpBroadcaster::connect(cfg(1, &addr)).expect("the real rank joins");
            let hub = h.join().expect("thread").expect("hub");
            assert_eq!((hub.world_size(), member.rank()), (2, 1));
        });
    }
}
