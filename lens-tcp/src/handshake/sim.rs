//! The join machine of every rank over an in-memory network, with strangers and no
//! sockets, clock or randomness: property tests over random interleavings of deliveries,
//! duplicates, resets and reconnections, knocks sent again, handshake deadlines, and
//! strangers that open connections to any listening rank and replay frames recorded from
//! this job or from an earlier one. Whatever happens, no stranger's connection is ever
//! admitted and a machine holds state only for connections that are open; once the
//! network heals, every rank has formed the group under rank 0's session, with its tree
//! children connected, and rank 0 keeps only its own children.

use std::collections::VecDeque;

use proptest::prelude::*;

use super::{Answer, Dest, Join, Sender, Unsent, Up, Wire};
use crate::message::{Message, Nonce};
use crate::tree::Tree;

/// Frames kept for strangers to replay.
const HEARD: usize = 512;

#[derive(Debug, Clone)]
struct Frame {
    sender: usize,
    session: u64,
    msg: Message<'static>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    /// Rank r's connection on `Up`.
    Rank(usize, Up),
    Stranger,
}

#[derive(Debug)]
struct Link {
    client: Client,
    server: usize,
    open: bool,
    to_server: VecDeque<Frame>,
    to_client: VecDeque<Frame>,
}

#[derive(Debug, Default)]
struct Net {
    links: Vec<Link>,
    /// Frames sent in this job, for strangers to replay.
    heard: Vec<Frame>,
}

impl Net {
    /// Closes a link; true when it was open.
    fn cut(&mut self, l: usize) -> bool {
        let link = &mut self.links[l];
        let was = link.open;
        link.open = false;
        link.to_server.clear();
        link.to_client.clear();
        was
    }
}

/// One rank's connections in the simulated network.
struct SimWire<'a> {
    me: usize,
    out: [Option<usize>; 2],
    net: &'a mut Net,
    /// Links this rank closed: the socket layer reports each as closed.
    closed: Vec<usize>,
}

impl Wire<usize> for SimWire<'_> {
    fn send(&mut self, to: Dest<'_, usize>, session: u64, msg: &Message<'_>) -> Result<(), Unsent> {
        let (l, upward) = match to {
            Dest::Up(up) => (self.out[up.at()], true),
            Dest::Conn(c) => (Some(*c), false),
        };
        let Some(link) = l.and_then(|l| self.net.links.get_mut(l)) else {
            return Err(Unsent::Gone);
        };
        if !link.open {
            return Err(Unsent::Gone);
        }
        let f = Frame {
            sender: self.me,
            session,
            msg: msg.clone().into_owned(),
        };
        if upward {
            link.to_server.push_back(f.clone());
        } else {
            link.to_client.push_back(f.clone());
        }
        if self.net.heard.len() < HEARD {
            self.net.heard.push(f);
        }
        Ok(())
    }

    fn close(&mut self, conn: &usize) {
        if self.net.cut(*conn) {
            self.closed.push(*conn);
        }
    }

    fn proven(&mut self, _to: Dest<'_, usize>, _rank: usize) {}
}

#[derive(Debug)]
struct Node {
    join: Join<usize>,
    /// This rank's current link on each [`Up`] side; `None` when it does not (or no longer)
    /// use that side.
    out: [Option<usize>; 2],
    /// A member: rank 0's WELCOME came. Rank 0: the formation finished.
    joined: bool,
    /// How the rank's join failed, as its driver would return it.
    failed: Option<String>,
}

/// What happens next.
#[derive(Debug, Clone)]
enum Event {
    /// The next frame on link `l % len`, towards the server or the client.
    Deliver(usize, bool),
    /// The same, handed over twice.
    Duplicate(usize, bool),
    /// The link resets: frames in flight are lost; both ends hear it closed.
    Reset(usize),
    /// Rank `r % n` (not 0) connects again where its connection is gone (libzmq does).
    Reconnect(usize),
    /// Rank `r % n`'s knock timer: it knocks again where it has no answer.
    Retry(usize),
    /// A stranger connects to rank `t % n` (when it listens) and replays frame `x` of what
    /// it recorded (this job's frames, then an earlier job's).
    Replay(usize, usize),
    /// The handshake deadline: every link whose client has not proven the key is closed.
    Expire,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        12 => (any::<usize>(), any::<bool>()).prop_map(|(l, d)| Event::Deliver(l, d)),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(l, d)| Event::Duplicate(l, d)),
        1 => any::<usize>().prop_map(Event::Reset),
        2 => any::<usize>().prop_map(Event::Reconnect),
        1 => any::<usize>().prop_map(Event::Retry),
        3 => (any::<usize>(), any::<usize>()).prop_map(|(x, t)| Event::Replay(x, t)),
        1 => Just(Event::Expire),
    ]
}

fn sender<'a>(l: &'a usize, f: &Frame) -> Sender<'a, usize> {
    Sender {
        conn: l,
        rank: f.sender,
        session: f.session,
    }
}

fn endpoint_of(r: usize) -> String {
    format!("rank-{r}")
}

struct Sim {
    tree: Tree,
    net: Net,
    nodes: Vec<Node>,
    /// Tells this job's nonces from an earlier job's.
    job: u8,
    nonces: u64,
    earlier: Vec<Frame>,
}

impl Sim {
    fn new(n: usize, k: Option<usize>, job: u8, earlier: Vec<Frame>) -> Sim {
        let tree = Tree::new(n, k);
        let nodes = (0..n)
            .map(|r| {
                let listens = r == 0 || tree.children(r).next().is_some();
                let endpoint = if listens && r != 0 {
                    endpoint_of(r)
                } else {
                    String::new()
                };
                Node {
                    join: Join::new(r, n, tree, endpoint),
                    out: [None; 2],
                    joined: false,
                    failed: None,
                }
            })
            .collect();
        let mut sim = Sim {
            tree,
            net: Net::default(),
            nodes,
            job,
            nonces: 0,
            earlier,
        };
        sim.nodes[0].join.begin(0x5e55_1000 + u64::from(job));
        for r in 1..n {
            sim.connect(r, Up::Hub);
        }
        sim
    }

    fn fresh(&mut self) -> Nonce {
        self.nonces += 1;
        let mut n = [0u8; 16];
        n[..8].copy_from_slice(&self.nonces.to_le_bytes());
        n[15] = self.job;
        n
    }

    /// Runs `f` on rank `me`'s machine with its wire, then reports the links it closed to
    /// their servers (this rank itself) as the socket layer does.
    fn with<T>(&mut self, me: usize, f: impl FnOnce(&mut Join<usize>, &mut SimWire<'_>) -> T) -> T {
        let node = &mut self.nodes[me];
        let mut w = SimWire {
            me,
            out: node.out,
            net: &mut self.net,
            closed: Vec::new(),
        };
        let t = f(&mut node.join, &mut w);
        for l in w.closed {
            node.join.closed(&l);
        }
        t
    }

    fn server_of(&self, r: usize, up: Up) -> usize {
        match up {
            Up::Hub => 0,
            Up::Parent => self.tree.parent(r).unwrap_or(0),
        }
    }

    fn listens(&self, r: usize) -> bool {
        r == 0 || self.tree.children(r).next().is_some()
    }

    /// Rank `r` opens a connection on `up` and knocks on it.
    fn connect(&mut self, r: usize, up: Up) {
        let server = self.server_of(r, up);
        self.net.links.push(Link {
            client: Client::Rank(r, up),
            server,
            open: true,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
        });
        self.nodes[r].out[up.at()] = Some(self.net.links.len() - 1);
        let j = self.fresh();
        self.with(r, |m, w| {
            m.reopened(up);
            m.knock(w, up, j);
        });
    }

    /// A link closes: its server forgets it; a rank's link is made again later.
    fn reset(&mut self, l: usize) {
        if self.net.cut(l) {
            let server = self.net.links[l].server;
            self.nodes[server].join.closed(&l);
        }
    }

    fn pop(&mut self, l: usize, to_server: bool) -> Option<Frame> {
        let link = &mut self.net.links[l];
        if to_server {
            link.to_server.pop_front()
        } else {
            link.to_client.pop_front()
        }
    }

    fn hand(&mut self, l: usize, to_server: bool, f: Frame) {
        if !self.net.links[l].open {
            return;
        }
        if to_server {
            self.at_server(l, f);
        } else if let Client::Rank(r, up) = self.net.links[l].client {
            self.at_client(r, up, f);
        }
    }

    /// A frame reaches the server of link `l`, as `group.rs` feeds it: join frames to the
    /// machine, others only from a connection that proved the key (none in a join).
    fn at_server(&mut self, l: usize, f: Frame) {
        let s = self.net.links[l].server;
        match f.msg {
            Message::Knock { world, joiner } => {
                let fresh = self.fresh();
                self.with(s, |m, w| {
                    m.on_knock(w, sender(&l, &f), world, joiner, fresh);
                });
            }
            Message::Hello {
                world,
                server,
                ref endpoint,
            } => {
                let tree = !self.tree.is_star() && !self.nodes[0].joined;
                self.with(s, |m, w| {
                    let admitted = m.on_hello(w, sender(&l, &f), world, &server, endpoint);
                    if let (0, Some(r), true) = (s, admitted, tree) {
                        m.admitted_in_tree(w, r);
                    }
                });
            }
            _ => {}
        }
        self.settle_hub();
    }

    /// Rank 0's driver: the formation ends once every rank has joined.
    fn settle_hub(&mut self) {
        if self.nodes[0].joined || !self.nodes[0].join.all_joined() {
            return;
        }
        let star = self.tree.is_star();
        let result = self.with(0, |m, w| {
            let sent = if star { m.welcome_all(w) } else { Ok(()) };
            m.finish();
            sent
        });
        if let Err((r, e)) = result {
            self.nodes[0].failed = Some(format!("rank {r} left before the group formed ({e:?})"));
        }
        self.nodes[0].joined = true;
    }

    /// A frame reaches rank `r` on its connection `up`, as `group.rs` and `join.rs` feed it.
    fn at_client(&mut self, r: usize, up: Up, f: Frame) {
        match f.msg {
            Message::Challenge { joiner, server } => {
                self.with(r, |m, w| {
                    m.on_challenge(w, up, &joiner, &server);
                });
            }
            Message::Welcome { .. } | Message::Reject { .. } | Message::JoinFail { .. }
                if up == Up::Hub && !self.nodes[r].joined && self.nodes[r].failed.is_none() =>
            {
                match self.with(r, |m, w| m.on_answer(w, up, f.session, &f.msg)) {
                    Some(Answer::Welcome(parent)) => self.welcomed(r, &parent),
                    Some(Answer::Rejected(why)) => self.nodes[r].failed = Some(why),
                    Some(Answer::Failed(missing)) => {
                        self.nodes[r].failed = Some(format!("missing {missing:?}"));
                    }
                    None => {}
                }
            }
            _ => {}
        }
    }

    /// Rank `r` was welcomed: in a tree it leaves rank 0 for its parent.
    fn welcomed(&mut self, r: usize, parent: &str) {
        self.nodes[r].joined = true;
        let Some(p) = self.tree.parent(r).filter(|&p| p != 0) else {
            return;
        };
        assert_eq!(parent, endpoint_of(p), "rank {r} was sent to its parent");
        if let Some(l) = self.nodes[r].out[Up::Hub.at()].take() {
            self.reset(l);
        }
        self.nodes[r].join.leave(Up::Hub);
        self.connect(r, Up::Parent);
    }

    fn apply(&mut self, e: &Event) {
        let n = self.tree.n;
        let len = self.net.links.len();
        match *e {
            Event::Deliver(l, d) if len > 0 => {
                if let Some(f) = self.pop(l % len, d) {
                    self.hand(l % len, d, f);
                }
            }
            Event::Duplicate(l, d) if len > 0 => {
                if let Some(f) = self.pop(l % len, d) {
                    self.hand(l % len, d, f.clone());
                    self.hand(l % len, d, f);
                }
            }
            Event::Reset(l) if len > 0 => self.reset(l % len),
            Event::Reconnect(r) => self.reconnect(1 + r % (n - 1)),
            Event::Retry(r) => self.retry(1 + r % (n - 1)),
            Event::Replay(x, t) => {
                let t = t % n;
                let pool = self.net.heard.len() + self.earlier.len();
                if !self.listens(t) || pool == 0 {
                    return;
                }
                let x = x % pool;
                let f = match self.net.heard.get(x) {
                    Some(f) => f.clone(),
                    None => self.earlier[x - self.net.heard.len()].clone(),
                };
                self.net.links.push(Link {
                    client: Client::Stranger,
                    server: t,
                    open: true,
                    to_server: VecDeque::from([f]),
                    to_client: VecDeque::new(),
                });
            }
            Event::Expire => {
                for l in 0..len {
                    let s = self.net.links[l].server;
                    if self.net.links[l].open && self.nodes[s].join.rank_of(&l).is_none() {
                        self.reset(l);
                    }
                }
            }
            _ => {}
        }
    }

    fn reconnect(&mut self, r: usize) {
        for up in [Up::Hub, Up::Parent] {
            if let Some(l) = self.nodes[r].out[up.at()] {
                if !self.net.links[l].open && self.nodes[r].failed.is_none() {
                    self.connect(r, up);
                }
            }
        }
    }

    fn retry(&mut self, r: usize) {
        for up in [Up::Hub, Up::Parent] {
            if self.nodes[r].out[up.at()].is_some() && !self.nodes[r].join.up_proven(up) {
                let j = self.fresh();
                self.with(r, |m, w| m.knock(w, up, j));
            }
        }
    }

    /// No more faults or strangers: connections are made again, everything queued is
    /// delivered, and ranks without an answer knock again, until nothing moves.
    fn heal(&mut self) {
        let n = self.tree.n;
        for _ in 0..200 {
            for r in 1..n {
                self.reconnect(r);
            }
            let mut moved = false;
            for _ in 0..10_000 {
                let mut any = false;
                for l in 0..self.net.links.len() {
                    for d in [true, false] {
                        if let Some(f) = self.pop(l, d) {
                            self.hand(l, d, f);
                            any = true;
                        }
                    }
                }
                moved |= any;
                if !any {
                    break;
                }
            }
            let unanswered = (1..n).any(|r| {
                let node = &self.nodes[r];
                [Up::Hub, Up::Parent]
                    .iter()
                    .any(|&up| node.out[up.at()].is_some() && !node.join.up_proven(up))
            });
            if !moved && !unanswered {
                return;
            }
            for r in 1..n {
                self.retry(r);
            }
        }
    }

    /// Safety, after every step: no stranger is admitted anywhere, and every machine
    /// holds state only for open connections to it.
    fn check_safe(&self) -> Result<(), TestCaseError> {
        for (s, node) in self.nodes.iter().enumerate() {
            let open = self
                .net
                .links
                .iter()
                .filter(|k| k.open && k.server == s)
                .count();
            prop_assert!(
                node.join.tracked() <= open,
                "rank {s} tracks {} connections, {open} open",
                node.join.tracked()
            );
            for (l, link) in self.net.links.iter().enumerate() {
                if link.client == Client::Stranger && link.server == s {
                    prop_assert_eq!(
                        node.join.rank_of(&l),
                        None,
                        "rank {} admitted a stranger",
                        s
                    );
                }
            }
            for r in 0..self.tree.n {
                if let Some(&l) = node.join.peer(r) {
                    let link = &self.net.links[l];
                    prop_assert!(
                        matches!(link.client, Client::Rank(c, _) if c == r) && link.server == s,
                        "rank {}'s peer {} is another's connection: {:?}",
                        s,
                        r,
                        link
                    );
                }
            }
        }
        Ok(())
    }

    fn up_of(&self, r: usize) -> Up {
        match self.tree.parent(r) {
            Some(p) if p != 0 && self.nodes[r].joined => Up::Parent,
            _ => Up::Hub,
        }
    }

    /// Liveness, once healed: the group formed on every rank, as a tree of live links.
    fn check_formed(&self) -> Result<(), TestCaseError> {
        let session = self.nodes[0].join.session();
        for (r, node) in self.nodes.iter().enumerate() {
            prop_assert_eq!(&node.failed, &None, "rank {} failed to join", r);
            prop_assert!(
                node.joined && node.join.formed(),
                "rank {} has not formed",
                r
            );
            prop_assert_eq!(node.join.session(), session, "rank {}'s session", r);
            prop_assert!(
                node.join.children_missing().is_empty(),
                "rank {}'s children",
                r
            );
            if r != 0 {
                let up = self.up_of(r);
                prop_assert!(node.join.up_proven(up), "rank {} has no proven parent", r);
                let l = node.out[up.at()].expect("a live link up");
                let p = self.server_of(r, up);
                prop_assert_eq!(self.nodes[p].join.peer(r), Some(&l), "rank {}'s parent", r);
            }
        }
        // Rank 0 keeps its own tree children only.
        for r in 1..self.tree.n {
            let child = self.tree.parent(r) == Some(0);
            prop_assert_eq!(
                self.nodes[0].join.peer(r).is_some(),
                child,
                "rank 0 and rank {}",
                r
            );
        }
        Ok(())
    }
}

/// Frames of an earlier job (another session, other nonces) under the same key.
fn earlier_job(n: usize, k: Option<usize>) -> Vec<Frame> {
    let mut sim = Sim::new(n, k, 2, Vec::new());
    sim.heal();
    assert!(sim.check_formed().is_ok(), "the earlier job formed");
    sim.net.heard
}

fn shape() -> impl Strategy<Value = (usize, Option<usize>)> {
    (
        2usize..8,
        prop_oneof![Just(None), Just(Some(2)), Just(Some(3))],
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn strangers_and_faults_never_admit_a_stranger_and_never_stop_the_join(
        (n, k) in shape(),
        events in proptest::collection::vec(event(), 0..120),
    ) {
        let mut sim = Sim::new(n, k, 1, earlier_job(n, k));
        for e in &events {
            sim.apply(e);
            sim.check_safe()?;
        }
        sim.heal();
        sim.check_safe()?;
        sim.check_formed()?;
    }
}

#[test]
fn a_quiet_network_forms_every_shape() {
    for n in 2..12 {
        for k in [None, Some(2), Some(3)] {
            let mut sim = Sim::new(n, k, 1, Vec::new());
            sim.heal();
            if let Err(e) = sim.check_formed() {
                panic!("n {n}, k {k:?}: {e}");
            }
        }
    }
}

mod table;
