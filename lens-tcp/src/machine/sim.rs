//! The round machine of every rank of a group over an in-memory network, with no sockets
//! and no clock: property tests over random interleavings of deliveries, duplicates,
//! drops, resets (with and without the rank proving the key again), frames that claim
//! another sender or another root, and time passing.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::{From, Heard, Links, Outcome, Plan, RoundMachine, To};
use std::borrow::Cow;

use crate::message::{Came, Message};
use crate::tree::Tree;

const TIMEOUT: Duration = Duration::from_secs(10);
const ROUND: u64 = 7;

#[derive(Debug, Clone)]
struct Msg {
    sender: usize,
    root: usize,
    msg: Message<'static>,
}

/// One connection between a member and rank 0 or its tree parent, with a queue each way.
#[derive(Debug)]
struct Conn {
    /// The member (the side that connected).
    member: usize,
    /// Rank 0 or the member's tree parent (the side that accepted).
    server: usize,
    up: bool,
    to_server: VecDeque<Msg>,
    to_member: VecDeque<Msg>,
}

#[derive(Debug)]
struct Net {
    conns: Vec<Conn>,
}

impl Net {
    fn new(tree: Tree) -> Net {
        let mut conns = Vec::new();
        // Once a group has formed, a rank keeps one connection up the tree: to rank 0 in a
        // star or when rank 0 is its parent, else to its parent.
        for r in 1..tree.n {
            conns.push(Conn::new(r, tree.parent(r).unwrap_or(0)));
        }
        Net { conns }
    }

    fn conn(&mut self, member: usize, server: usize) -> Option<&mut Conn> {
        self.conns
            .iter_mut()
            .find(|c| c.member == member && c.server == server)
    }
}

impl Conn {
    fn new(member: usize, server: usize) -> Conn {
        Conn {
            member,
            server,
            up: true,
            to_server: VecDeque::new(),
            to_member: VecDeque::new(),
        }
    }
}

/// One rank's links in the simulated network.
struct SimLinks<'a> {
    me: usize,
    tree: Tree,
    net: &'a mut Net,
    root: usize,
}

impl Links for SimLinks<'_> {
    fn send(&mut self, to: To, msg: &Message<'_>) -> bool {
        let msg = Msg {
            sender: self.me,
            root: self.root,
            msg: msg.clone().into_owned(),
        };
        let (member, server, upward) = match to {
            To::Up => (self.me, self.tree.parent(self.me).unwrap_or(0), true),
            To::Rank(r) => (r, self.me, false),
        };
        let Some(c) = self.net.conn(member, server) else {
            return false;
        };
        if !c.up {
            return false;
        }
        if upward {
            c.to_server.push_back(msg);
        } else {
            c.to_member.push_back(msg);
        }
        true
    }
}

/// What happens next in the network.
#[derive(Debug, Clone)]
enum Event {
    /// The next frame on connection `c % len`, towards the server or the member.
    Deliver(usize, bool),
    /// The same, delivered twice.
    Duplicate(usize, bool),
    /// The next frame is lost (the connection stays up: nothing tells either side).
    Drop(usize, bool),
    /// The connection resets: frames in flight are lost, nothing goes through until it is
    /// made again.
    Reset(usize),
    /// A reset connection is made again and the member proves the key on it.
    Reconnect(usize),
    /// A frame on a member's connection that claims to come from another rank.
    Forged(usize, usize),
    /// Time passes.
    Tick(u64),
    /// Rank `r % n` (not 0) dies: its connections go and never come back.
    Kill(usize),
    /// The member of connection `c` (an insider with the key) acks this round before it
    /// has the data, naming every rank outside its own subtree as missing.
    RogueAck(usize),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        8 => (any::<usize>(), any::<bool>()).prop_map(|(c, d)| Event::Deliver(c, d)),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(c, d)| Event::Duplicate(c, d)),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(c, d)| Event::Drop(c, d)),
        1 => any::<usize>().prop_map(Event::Reset),
        2 => any::<usize>().prop_map(Event::Reconnect),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(c, x)| Event::Forged(c, x)),
        1 => (0u64..4000).prop_map(Event::Tick),
    ]
}

/// Which ranks vote to keep the step (the step sampler's vote, in their acks).
fn votes(r: usize) -> bool {
    r % 3 == 1
}

struct Sim {
    tree: Tree,
    root: usize,
    payload: Vec<u8>,
    net: Net,
    machines: Vec<RoundMachine>,
    outcomes: Vec<Option<Outcome>>,
    /// What each machine's `take_voted` said as its round ended.
    voted: Vec<Vec<usize>>,
    /// What each machine's `received_at` said as its round ended.
    received: Vec<Option<Instant>>,
    dead: Vec<bool>,
    now: Instant,
}

impl Sim {
    fn new(n: usize, k: Option<usize>, root: usize, payload: Vec<u8>) -> Sim {
        let tree = Tree::new(n, k);
        let mut net = Net::new(tree);
        let now = Instant::now();
        let machines = (0..n)
            .map(|me| {
                let mut links = SimLinks {
                    me,
                    tree,
                    net: &mut net,
                    root,
                };
                let mine = (me == root).then_some(payload.as_slice());
                let plan = Plan {
                    me,
                    tree,
                    round: ROUND,
                    root,
                    timeout: TIMEOUT,
                    vote: votes(me),
                    stands_for: None,
                };
                RoundMachine::start(&mut links, plan, mine, now)
            })
            .collect();
        let mut sim = Sim {
            tree,
            root,
            payload,
            net,
            machines,
            outcomes: vec![None; n],
            voted: vec![Vec::new(); n],
            received: vec![None; n],
            dead: vec![false; n],
            now,
        };
        sim.collect();
        sim
    }

    fn links(&mut self, me: usize) -> (&mut RoundMachine, SimLinks<'_>) {
        let links = SimLinks {
            me,
            tree: self.tree,
            net: &mut self.net,
            root: self.root,
        };
        (&mut self.machines[me], links)
    }

    fn collect(&mut self) {
        for (((m, o), v), r) in self
            .machines
            .iter_mut()
            .zip(&mut self.outcomes)
            .zip(&mut self.voted)
            .zip(&mut self.received)
        {
            if o.is_none() {
                *v = m.take_voted();
                *r = m.received_at();
                *o = m.take_outcome();
            }
        }
    }

    /// What the root heard of the voters: only ranks that voted, and one at least when
    /// any did and every rank had the data.
    fn check_voters(&self) -> Result<(), TestCaseError> {
        let n = self.tree.n;
        let heard = &self.voted[self.root];
        prop_assert!(
            heard.iter().all(|&r| votes(r) && r < n),
            "root {}: {heard:?}",
            self.root
        );
        let delivered = self
            .outcomes
            .iter()
            .all(|o| matches!(o, Some(Outcome::Delivered(_))));
        let any = (0..n).any(|r| votes(r) && r != self.root);
        if delivered && any {
            prop_assert!(!heard.is_empty(), "root {} heard no voter", self.root);
        }
        Ok(())
    }

    /// Hands `msg` to rank `to`, which hears it on `from`; as the socket layer does, a rank
    /// whose round is over answers a repeat of what it answered.
    fn hand(&mut self, to: usize, from: From, mut msg: Msg) {
        if self.dead[to] {
            return;
        }
        let now = self.now;
        let over = self.outcomes[to].is_some();
        let up = RoundMachine::up(self.tree, to);
        let (m, mut links) = self.links(to);
        if !over {
            let heard = Heard {
                from,
                sender: msg.sender,
                root: msg.root,
                msg: &mut msg.msg,
            };
            m.on_frame(&mut links, heard, now);
        } else if matches!(msg.msg, Message::Data(_)) {
            if let Some(a) = m
                .answers()
                .iter()
                .find(|a| a.answers(ROUND, from, msg.sender, up))
                .cloned()
            {
                links.send(a.to, &a.msg);
            }
        }
        self.collect();
    }

    /// The label a frame towards `to` carries on connection `c`.
    fn from_label(c: &Conn, to_server: bool) -> From {
        if to_server {
            From::Rank(c.member)
        } else if c.server == 0 {
            From::Hub
        } else {
            From::Parent
        }
    }

    fn pop(&mut self, c: usize, to_server: bool) -> Option<(usize, From, Msg)> {
        let conn = &mut self.net.conns[c];
        let msg = if to_server {
            conn.to_server.pop_front()?
        } else {
            conn.to_member.pop_front()?
        };
        let to = if to_server { conn.server } else { conn.member };
        Some((to, Self::from_label(conn, to_server), msg))
    }

    fn apply(&mut self, e: &Event) {
        let len = self.net.conns.len();
        if len == 0 {
            return;
        }
        match *e {
            Event::Deliver(c, d) => {
                if let Some((to, from, msg)) = self.pop(c % len, d) {
                    self.hand(to, from, msg);
                }
            }
            Event::Duplicate(c, d) => {
                if let Some((to, from, msg)) = self.pop(c % len, d) {
                    self.hand(to, from, msg.clone());
                    self.hand(to, from, msg);
                }
            }
            Event::Drop(c, d) => {
                let _ = self.pop(c % len, d);
            }
            Event::Reset(c) => {
                let conn = &mut self.net.conns[c % len];
                conn.up = false;
                conn.to_server.clear();
                conn.to_member.clear();
            }
            Event::Reconnect(c) => {
                let conn = &mut self.net.conns[c % len];
                if conn.up {
                    return;
                }
                let (member, server) = (conn.member, conn.server);
                if self.dead[member] || self.dead[server] {
                    return;
                }
                let conn = &mut self.net.conns[c % len];
                conn.up = true;
                let now = self.now;
                // The member proves the key first (it hears the CHALLENGE), then the server
                // admits it (it hears the HELLO).
                let side = if server == 0 { From::Hub } else { From::Parent };
                let (m, mut links) = self.links(member);
                m.on_proven(&mut links, side);
                m.on_time(&mut links, now);
                let (m, mut links) = self.links(server);
                m.on_admitted(&mut links, member);
                self.collect();
            }
            Event::Forged(c, x) => {
                let conn = &self.net.conns[c % len];
                let (to, from) = (conn.server, From::Rank(conn.member));
                let n = self.tree.n;
                // Claims to be another rank, with another payload.
                let msg = Msg {
                    sender: x % n,
                    root: (self.root + x) % n,
                    msg: match x % 4 {
                        0 => Message::Data(Cow::Borrowed(b"forged")),
                        1 => Message::Ack {
                            missing: vec![x % n],
                            voted: vec![x % n],
                            arrivals: vec![Came::itself(x % n, -1)],
                        },
                        2 => Message::Done {
                            voted: vec![x % n],
                            arrivals: Vec::new(),
                        },
                        _ => Message::Fail {
                            missing: vec![x % n],
                        },
                    },
                };
                // The socket layer drops such a frame (a connection speaks only for the rank
                // that proved the key on it); the machine must not be fooled either.
                if msg.sender != conn.member {
                    self.hand(to, from, msg);
                }
            }
            Event::Kill(r) => {
                let r = 1 + r % (self.tree.n - 1);
                self.dead[r] = true;
                for conn in &mut self.net.conns {
                    if conn.member == r || conn.server == r {
                        conn.up = false;
                        conn.to_server.clear();
                        conn.to_member.clear();
                    }
                }
            }
            Event::RogueAck(c) => {
                let conn = &self.net.conns[c % len];
                let (member, server) = (conn.member, conn.server);
                let tree = self.tree;
                let outside: Vec<usize> =
                    (0..tree.n).filter(|&r| !tree.is_below(r, member)).collect();
                let msg = Msg {
                    sender: member,
                    root: self.root,
                    msg: Message::Ack {
                        missing: outside.clone(),
                        voted: outside,
                        arrivals: Vec::new(),
                    },
                };
                self.hand(server, From::Rank(member), msg);
            }
            Event::Tick(ms) => {
                self.now += Duration::from_millis(ms);
                self.on_time();
            }
        }
    }

    fn on_time(&mut self) {
        let now = self.now;
        for me in 0..self.tree.n {
            let (m, mut links) = self.links(me);
            m.on_time(&mut links, now);
        }
        self.collect();
    }

    /// Delivers everything in flight on live connections and lets time pass until every
    /// rank's round is over; returns how many steps it took.
    fn settle(&mut self) -> usize {
        for step in 0..100_000 {
            if self
                .outcomes
                .iter()
                .zip(&self.dead)
                .all(|(o, d)| o.is_some() || *d)
            {
                return step;
            }
            let next = (0..self.net.conns.len()).find_map(|c| {
                let conn = &self.net.conns[c];
                if !conn.to_server.is_empty() {
                    Some((c, true))
                } else if !conn.to_member.is_empty() {
                    Some((c, false))
                } else {
                    None
                }
            });
            match next {
                Some((c, d)) => {
                    if let Some((to, from, msg)) = self.pop(c, d) {
                        self.hand(to, from, msg);
                    }
                }
                None => {
                    let soonest = self
                        .machines
                        .iter()
                        .zip(self.outcomes.iter().zip(&self.dead))
                        .filter(|(_, (o, d))| o.is_none() && !**d)
                        .map(|(m, _)| m.deadline())
                        .min()
                        .unwrap_or(self.now);
                    self.now = self.now.max(soonest);
                    self.on_time();
                }
            }
        }
        panic!("the round did not settle");
    }
}

fn shapes() -> impl Strategy<Value = (usize, Option<usize>, usize)> {
    (
        2usize..12,
        prop_oneof![Just(None), (1usize..4).prop_map(Some)],
    )
        .prop_flat_map(|(n, k)| (Just(n), Just(k), 0..n))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// Whatever the network does: no rank ever delivers anything but the root's payload,
    /// every rank's round ends (by its deadline), and a rank that fails names ranks.
    #[test]
    fn no_rank_delivers_another_payload_and_every_round_ends(
        (n, k, root) in shapes(),
        events in proptest::collection::vec(event(), 0..120),
    ) {
        let mut sim = Sim::new(n, k, root, format!("from {root}").into_bytes());
        for e in &events {
            sim.apply(e);
        }
        // Reconnect everything that was reset, as libzmq does, then let it settle.
        for c in 0..sim.net.conns.len() {
            sim.apply(&Event::Reconnect(c));
        }
        sim.settle();
        let end = Instant::now() + Duration::from_secs(3600);
        for (rank, o) in sim.outcomes.iter().enumerate() {
            match o {
                Some(Outcome::Delivered(p)) => {
                    prop_assert_eq!(p, &sim.payload, "rank {}", rank);
                    // When the data came, for the clock measurement: every rank but the
                    // root knows it.
                    prop_assert_eq!(sim.received[rank].is_some(), rank != root, "rank {}", rank);
                }
                Some(Outcome::Missing(m)) => prop_assert!(m.iter().all(|&r| r < n), "rank {rank}: {m:?}"),
                Some(Outcome::WrongRoot(_)) => prop_assert!(false, "rank {rank}: a forged root ended the round"),
                None => prop_assert!(false, "rank {rank} never finished"),
            }
            prop_assert!(sim.machines[rank].deadline() < end);
        }
        sim.check_voters()?;
    }

    /// Resets (each followed, at any later point, by the member proving the key again),
    /// duplicates and any order of delivery, with no frame otherwise lost and no deadline
    /// passing: every rank delivers the root's payload. This is the promise that a reset
    /// costs no round.
    #[test]
    fn resets_and_duplicates_cost_no_round(
        (n, k, root) in shapes(),
        events in proptest::collection::vec(event(), 0..160),
    ) {
        let mut sim = Sim::new(n, k, root, vec![u8::try_from(root).unwrap_or(0); 40]);
        for e in &events {
            if !matches!(e, Event::Drop(..) | Event::Tick(_)) {
                sim.apply(e);
            }
        }
        for c in 0..sim.net.conns.len() {
            sim.apply(&Event::Reconnect(c));
        }
        // Deliver what is in flight before any deadline: no time passes here.
        let start = sim.now;
        while let Some((c, d)) = (0..sim.net.conns.len()).find_map(|c| {
            let conn = &sim.net.conns[c];
            (!conn.to_server.is_empty()).then_some((c, true))
                .or_else(|| (!conn.to_member.is_empty()).then_some((c, false)))
        }) {
            if let Some((to, from, msg)) = sim.pop(c, d) {
                sim.hand(to, from, msg);
            }
        }
        let waited = sim.now - start;
        let payload = sim.payload.clone();
        for (rank, o) in sim.outcomes.iter().enumerate() {
            prop_assert_eq!(o.as_ref(), Some(&Outcome::Delivered(payload.clone())), "rank {} of {} (k {:?}, root {})", rank, n, k, root);
        }
        prop_assert_eq!(waited, Duration::ZERO);
        sim.check_voters()?;
    }
}

mod table;
