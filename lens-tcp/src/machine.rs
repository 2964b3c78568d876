//! One round on one rank as a state machine: no sockets, no clock, no group. It is fed what
//! arrived (a frame of this round and where it came from, a rank that proved the key
//! again, this rank's own connection proven again, the time) and sends through [`Links`],
//! which says whether a frame could be queued. The socket layer (`round.rs`) drives it
//! for real; `machine/sim.rs` drives many of them over an in-memory network in tests.
//!
//! The round: a root other than 0 sends its payload up the tree to rank 0 (each rank on
//! the way relays it), rank 0 sends it down the tree (the star is the tree with
//! k = n - 1), each rank forwards it to its children, and acknowledgements, each naming the
//! ranks missing below its sender, flow back up. Rank 0 tells the root how the round ended
//! (DONE or FAIL, down the path to it: the ranks on the way relay it before they finish),
//! and tells the children it could not reach that the round failed; a FAIL also goes to
//! every other child, whose part of the round is over, so that a later round that waits
//! for rank 0 in vain names the root cause (`round.rs` keeps it and passes it down). Whatever a reset may
//! have cut off is sent again: the data to a child that proves the key again within the
//! round, the root's data once its parent answers its knock, an ack to a parent that sends
//! the data again, the verdict to the rank on the path that sends the root's data again.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use crate::message::{MAX_ARRIVALS, MAX_VOTERS, Message};

use crate::message::Came;
use crate::tree::Tree;
pub(crate) use acks::leaf_ack;
use arrivals::{Arrived, ns_between};
pub(crate) use io::{Answer, From, Heard, Links, Outcome, Plan, To};
use owed::Owed;

/// Ranks other than 0 wait this fraction of a timeout longer than rank 0, so that they
/// hear rank 0's verdict rather than time out on their own.
const MEMBER_GRACE: u32 = 4; // timeout / 4
/// The root waits this much longer again for rank 0's DONE or FAIL.
const ROOT_GRACE: u32 = 2; // timeout / 2

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Rank 0: waiting for the root's data.
    RootData,
    /// A member: waiting for the data from its parent (or rank 0's FAIL).
    Data,
    /// Forwarded; waiting for the children's acks.
    Acks,
    /// The root or a rank on the path from rank 0 to it: acked; waiting for rank 0's DONE or
    /// FAIL (to relay it towards the root).
    Verdict,
    Over,
}

/// One round on one rank.
#[derive(Debug)]
pub(crate) struct RoundMachine {
    me: usize,
    tree: Tree,
    root: usize,
    round: u64,
    start: Instant,
    timeout: Duration,
    step: Step,
    /// The root's own payload (a root other than 0), sent to rank 0 again when its
    /// connection is proven again.
    mine: Option<Vec<u8>>,
    sent_mine: bool,
    data: Vec<u8>,
    /// Children sent the data whose ack has not come (a set: rank 0 of a star has N - 1,
    /// and each ack takes one out).
    waiting: Owed,
    unreached: Vec<usize>,
    missing: Vec<usize>,
    ack_deadline: Instant,
    /// What to say again when a finished part of the round comes again (an ack up; a
    /// verdict towards the root).
    answers: Vec<Answer>,
    /// The root's data this rank relayed up, sent again when its parent proves itself
    /// again.
    relayed: Option<Vec<u8>>,
    /// When ranks of this rank's subtree came to the round, on this rank's clock: its own
    /// start, and what its children's acks said (each ack says how long before it was sent
    /// its ranks came; the hop back is not counted, so each is late by at most one network
    /// delay per tree level).
    arrivals: Vec<Arrived>,
    /// A root other than 0: the arrivals rank 0's DONE carried (ns after rank 0 came).
    told_arrivals: Vec<Came>,
    /// Who this rank is in the arrivals, and when it came: itself at the round's start,
    /// or the rank it stands for.
    own: (usize, Instant),
    /// A rank other than the root: when the root's data reached it (it may wait for acks
    /// and a verdict after that).
    received_at: Option<Instant>,
    /// Ranks of this rank's subtree that voted (this rank's own vote, its children's acks);
    /// at a root other than 0, what rank 0's DONE named.
    voted: Vec<usize>,
    outcome: Option<Outcome>,
}

/// When a rank other than 0 that started a round at `start` stops waiting for its data.
pub(crate) fn data_deadline(start: Instant, timeout: Duration) -> Instant {
    start + timeout + timeout / MEMBER_GRACE
}

/// The bytes of a DATA message the machine uses, moved out of it (the frame is dropped
/// once used): a copy per round on every rank otherwise.
pub(crate) fn take_data(msg: &mut Message<'static>) -> Vec<u8> {
    match msg {
        Message::Data(body) => std::mem::take(body).into_owned(),
        _ => Vec::new(),
    }
}

impl RoundMachine {
    /// Starts the round `plan` says at `now`; `mine` is the payload when this rank is the
    /// root.
    pub(crate) fn start(
        links: &mut impl Links,
        plan: Plan,
        mine: Option<&[u8]>,
        now: Instant,
    ) -> RoundMachine {
        let Plan {
            me,
            tree,
            round,
            root,
            timeout,
            vote,
            stands_for,
        } = plan;
        let mut m = RoundMachine {
            me,
            tree,
            root,
            round,
            start: now,
            timeout,
            step: Step::Data,
            mine: None,
            sent_mine: true,
            data: Vec::new(),
            waiting: Owed::over(tree.children(me)),
            unreached: Vec::new(),
            missing: Vec::new(),
            ack_deadline: now,
            answers: Vec::new(),
            relayed: None,
            arrivals: Vec::new(),
            told_arrivals: Vec::new(),
            own: stands_for.unwrap_or((me, now)),
            received_at: None,
            voted: if vote { vec![me] } else { Vec::new() },
            outcome: None,
        };
        match (me, mine) {
            (0, Some(p)) => m.forward(links, p.to_vec(), now),
            (0, None) => m.step = Step::RootData,
            (_, Some(p)) => {
                // Up towards rank 0. Not reachable now (a connection being made again): sent
                // again when the parent answers this rank's knock.
                m.sent_mine = links.send(To::Up, &Message::Data(Cow::Borrowed(p)));
                m.mine = Some(p.to_vec());
            }
            (_, None) => {}
        }
        m
    }

    /// Whether the round is over on this rank.
    pub(crate) fn is_over(&self) -> bool {
        self.outcome.is_some()
    }

    /// The outcome, once the round is over on this rank (taken: asked once).
    pub(crate) fn take_outcome(&mut self) -> Option<Outcome> {
        self.outcome.take()
    }

    /// When the root's data reached this rank (not the root), once the round delivered.
    pub(crate) fn received_at(&self) -> Option<Instant> {
        self.received_at
            .filter(|_| matches!(self.outcome, Some(Outcome::Delivered(_))))
    }

    /// The root, once every rank has the data: when each came to the round, in ns after
    /// rank 0 did (rank 0 as the root: every rank its acks named; another root: what rank
    /// 0's DONE carried); empty otherwise (taken). Each is named as it is shown: the rank
    /// itself, or the rank it stood for.
    pub(crate) fn take_arrivals(&mut self) -> Vec<(usize, i64)> {
        if self.me != self.root || !matches!(self.outcome, Some(Outcome::Delivered(_))) {
            return Vec::new();
        }
        let told = if self.me == 0 {
            self.arrivals_after_start()
        } else {
            std::mem::take(&mut self.told_arrivals)
        };
        told.into_iter().map(|c| (c.shown, c.ns)).collect()
    }

    /// The root, once every rank has the data: the ranks that voted (rank 0 as the root:
    /// those its acks named; another root: those rank 0's DONE named); empty otherwise
    /// (taken).
    pub(crate) fn take_voted(&mut self) -> Vec<usize> {
        if self.me != self.root || !matches!(self.outcome, Some(Outcome::Delivered(_))) {
            return Vec::new();
        }
        let mut v = std::mem::take(&mut self.voted);
        v.sort_unstable();
        v.dedup();
        v
    }

    /// What an ack or a DONE names of the voters: a few, the source needs one.
    fn few_voters(&self) -> Vec<usize> {
        let mut v = self.voted.clone();
        v.sort_unstable();
        v.dedup();
        v.truncate(MAX_VOTERS);
        v
    }

    /// Rank 0: the arrivals it knows, in ns after its own start.
    fn arrivals_after_start(&mut self) -> Vec<Came> {
        let start = self.start;
        std::mem::take(&mut self.arrivals)
            .into_iter()
            .map(|a| Came {
                rank: a.rank,
                ns: -ns_between(a.at, start),
                shown: a.shown,
            })
            .collect()
    }

    /// What to say again when the same frame comes again, once the round is over.
    #[cfg(test)]
    pub(crate) fn answers(&self) -> &[Answer] {
        &self.answers
    }

    /// What to say again, taken once the round is over here (moved, not copied).
    pub(crate) fn take_answers(&mut self) -> Vec<Answer> {
        std::mem::take(&mut self.answers)
    }

    /// How long this rank has been in the round.
    pub(crate) fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.start)
    }

    /// The connection this rank's data comes in on.
    pub(crate) fn up(tree: Tree, me: usize) -> From {
        match tree.parent(me) {
            Some(p) if p != 0 => From::Parent,
            _ => From::Hub,
        }
    }

    fn member_deadline(&self) -> Instant {
        data_deadline(self.start, self.timeout)
    }

    /// When the step the machine is at gives up; [`RoundMachine::on_time`] then ends it.
    pub(crate) fn deadline(&self) -> Instant {
        match self.step {
            Step::RootData => self.start + self.timeout,
            Step::Data => self.member_deadline(),
            Step::Acks => self.ack_deadline,
            Step::Verdict => self.member_deadline() + self.timeout / ROOT_GRACE,
            Step::Over => self.start,
        }
    }

    /// A frame of this round. Returns whether the machine used it.
    pub(crate) fn on_frame(
        &mut self,
        links: &mut impl Links,
        heard: Heard<'_>,
        now: Instant,
    ) -> bool {
        let Heard {
            from,
            sender,
            root,
            msg,
        } = heard;
        let up = Self::up(self.tree, self.me);
        // The root's data on its way up, from the child whose subtree holds the root.
        let from_root_side = matches!(msg, Message::Data(_))
            && from == From::Rank(sender)
            && self.tree.parent(sender) == Some(self.me)
            && self.tree.is_below(self.root, sender)
            && root == self.root;
        match (self.step, &*msg) {
            (Step::RootData, Message::Data(_)) if from_root_side => {
                self.forward(links, take_data(msg), now);
            }
            (Step::Data | Step::Acks | Step::Verdict, Message::Data(_))
                if self.me != 0 && from_root_side =>
            {
                links.send(To::Up, msg);
                self.relayed = Some(take_data(msg));
            }
            (Step::Data, Message::Data(_)) if from == up => {
                if root != self.root {
                    self.end(Outcome::WrongRoot(root));
                } else {
                    self.forward(links, take_data(msg), now);
                }
            }
            (Step::Data, Message::Fail { missing }) if from == up => {
                // Rank 0 never got the root's data: tell the children too.
                for c in self.tree.children(self.me) {
                    links.send(To::Rank(c), msg);
                }
                self.end(Outcome::Missing(missing.clone()));
            }
            (
                Step::Acks,
                Message::Ack {
                    missing: below,
                    voted,
                    arrivals,
                },
            ) if from == From::Rank(sender) => {
                if !self.waiting.remove(sender) {
                    return false;
                }
                // An ack may only speak for the sender's own subtree.
                let tree = self.tree;
                if below.iter().any(|&r| !tree.is_below(r, sender)) {
                    tracing::warn!(
                        rank = sender,
                        "an ack named ranks outside its subtree; ignored them"
                    );
                }
                self.missing
                    .extend(below.iter().copied().filter(|&r| tree.is_below(r, sender)));
                self.voted.extend(
                    voted
                        .iter()
                        .copied()
                        .filter(|&r| tree.is_below(r, sender))
                        .take(MAX_VOTERS),
                );
                self.arrivals.extend(
                    arrivals
                        .iter()
                        .filter(|c| tree.is_below(c.rank, sender))
                        .take(MAX_ARRIVALS)
                        .map(|c| Arrived::heard(c, now)),
                );
                self.acks_done(links, now);
            }
            (Step::Verdict, Message::Done { .. } | Message::Fail { .. }) if from == up => {
                if self.me != self.root {
                    // On the path to the root: relay, and finish (this rank has the data). The
                    // root's data again (after a reset below) asks for the verdict again.
                    if let Some(c) = self.towards_root() {
                        self.answers.push(Answer {
                            round: self.round,
                            root: self.root,
                            asker: Some(c),
                            to: To::Rank(c),
                            msg: msg.clone().into_owned(),
                        });
                        links.send(To::Rank(c), msg);
                    }
                    let data = std::mem::take(&mut self.data);
                    self.end(Outcome::Delivered(data));
                } else if let Message::Fail { missing } = msg {
                    self.end(Outcome::Missing(missing.clone()));
                } else {
                    if let Message::Done { voted, arrivals } = msg {
                        // Rank 0's account of how the ranks came, for the root's span, and
                        // of who voted, for its step sampler.
                        self.told_arrivals.clone_from(arrivals);
                        self.voted.clone_from(voted);
                    }
                    let data = std::mem::take(&mut self.data);
                    self.end(Outcome::Delivered(data));
                }
            }
            (Step::Verdict, Message::Data(_)) if from == up => {
                // The parent sends the data again (this rank proved the key again): the
                // ack may have died with the old connection.
                self.ack_again(links);
            }
            _ => return false,
        }
        true
    }

    /// Rank `r` proved the key again on a new connection to this rank: what went on its old
    /// one may be lost, so a child still owed the data gets it again.
    pub(crate) fn on_admitted(&mut self, links: &mut impl Links, r: usize) {
        if self.step != Step::Acks {
            return;
        }
        let before = self.waiting.len() + self.unreached.len();
        self.waiting.remove(r);
        self.unreached.retain(|&u| u != r);
        if self.waiting.len() + self.unreached.len() < before {
            if links.send(To::Rank(r), &Message::Data(Cow::Borrowed(&self.data))) {
                self.waiting.insert(r);
            } else {
                self.unreached.push(r);
            }
        }
    }

    /// This rank's connection to rank 0 (`From::Hub`) or its parent proved the key again.
    pub(crate) fn on_proven(&mut self, links: &mut impl Links, side: From) {
        if side != Self::up(self.tree, self.me) || self.step == Step::Over {
            return;
        }
        // The root's data, or rank 0's verdict on it, may have died with the old
        // connection: the data again makes rank 0 carry on or say the verdict again.
        if let Some(p) = &self.mine {
            self.sent_mine = links.send(To::Up, &Message::Data(Cow::Borrowed(p)));
        } else if let Some(p) = &self.relayed {
            links.send(To::Up, &Message::Data(Cow::Borrowed(p)));
        }
    }

    /// The child of this rank whose subtree holds the root, when one does.
    fn towards_root(&self) -> Option<usize> {
        let tree = self.tree;
        tree.children(self.me)
            .find(|&c| tree.is_below(self.root, c))
    }

    /// Ends the step the machine is at when its deadline has passed.
    pub(crate) fn on_time(&mut self, links: &mut impl Links, now: Instant) {
        if self.step == Step::Over || now < self.deadline() {
            return;
        }
        match self.step {
            Step::RootData => {
                let fail = Message::Fail {
                    missing: vec![self.root],
                };
                for r in 1..self.tree.n {
                    links.send(To::Rank(r), &fail);
                }
                self.end(Outcome::Missing(vec![self.root]));
            }
            Step::Data => {
                // Silence: rank 0 relays every round and names any other missing rank, so
                // it is rank 0 (or, in a tree, the parent) that is gone.
                let gone = if self.sent_mine {
                    self.tree.parent(self.me).unwrap_or(0)
                } else {
                    0
                };
                self.end(Outcome::Missing(vec![gone]));
            }
            Step::Acks => {
                let tree = self.tree;
                // Emptied over the same children, as a set still able to take them.
                let owed = std::mem::replace(&mut self.waiting, Owed::over(tree.children(self.me)));
                for c in owed.into_ranks().chain(self.unreached.drain(..)) {
                    self.missing.extend(tree.subtree(c));
                }
                self.acks_done(links, now);
            }
            Step::Verdict if self.me != self.root => {
                // On the path: the verdict never came, but this rank has the data.
                let data = std::mem::take(&mut self.data);
                self.end(Outcome::Delivered(data));
            }
            Step::Verdict => self.end(Outcome::Missing(vec![0])),
            Step::Over => {}
        }
    }

    /// Down to the children.
    fn forward(&mut self, links: &mut impl Links, data: Vec<u8>, now: Instant) {
        self.arrivals.push(Arrived {
            rank: self.me,
            shown: self.own.0,
            at: self.own.1,
        });
        if self.me != self.root {
            self.received_at = Some(now);
        }
        let children: Vec<usize> = self.tree.children(self.me).collect();
        let sent = links.send_each(&children, &Message::Data(Cow::Borrowed(&data)));
        for (c, queued) in children.into_iter().zip(sent) {
            if queued {
                self.waiting.insert(c);
            } else {
                tracing::warn!(rank = c, "cannot reach a rank (yet)");
                self.unreached.push(c);
            }
        }
        self.data = data;
        // Deeper ranks give up sooner, so that their parents still hear what they found.
        // Counted from when this rank got the data, so a rank reached late still gives its
        // children their share of the time; capped so that a root waiting for the outcome
        // hears it.
        let max_depth = self.tree.depth(self.tree.n - 1);
        let depth = self.tree.depth(self.me);
        let share = u32::try_from(max_depth + 1 - depth.min(max_depth)).unwrap_or(1);
        let levels = u32::try_from(max_depth + 1).unwrap_or(1);
        self.ack_deadline = (now + self.timeout * share / levels).min(self.member_deadline());
        self.step = Step::Acks;
        self.acks_done(links, now);
    }

    fn end(&mut self, outcome: Outcome) {
        self.step = Step::Over;
        self.outcome = Some(outcome);
    }
}

mod acks;
mod arrivals;
mod io;
mod owed;

#[cfg(test)]
mod sim;
