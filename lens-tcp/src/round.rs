//! One round: the state machine (`machine.rs`) driven by this rank's connections. Between
//! rounds the rank serves what arrives ([`Group::serve_idle`]): joins, strangers, frames of
//! later rounds (kept), and repeats of a finished round (answered again).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use lens_core::{Error, Result};

use crate::frame::{Frame, Kind};
use crate::group::{Group, Input};
use crate::message::Message;
use crate::net::{ConnId, Side};

use crate::machine::{From, Heard, Links, Outcome, Plan, RoundMachine, To};

/// Frames for later rounds kept while a round is in progress, per group member.
const PENDING_PER_RANK: usize = 4;

/// The machine's links over this rank's connections, for one round's frames.
struct GroupLinks<'a> {
    g: &'a mut Group,
    round: u64,
    root: usize,
}

impl Links for GroupLinks<'_> {
    fn send(&mut self, to: To, msg: &Message<'_>) -> bool {
        let bytes = self.g.frame(msg, self.round, self.root);
        self.g.send_to(to, &bytes)
    }
}

fn from_of(conn: &ConnId, sender: u32) -> From {
    match conn.side {
        Side::Hub => From::Hub,
        Side::Parent => From::Parent,
        Side::Listen => From::Rank(sender as usize),
    }
}

impl Group {
    fn links(&mut self, root: usize) -> GroupLinks<'_> {
        let round = self.round;
        GroupLinks {
            g: self,
            round,
            root,
        }
    }

    /// Sends over the connection `to` names; whether it was queued.
    fn send_to(&mut self, to: To, bytes: &[u8]) -> bool {
        let conn = match to {
            To::Up => ConnId::outbound(self.up_side()),
            To::Rank(r) => match self.join.peer(r).cloned() {
                Some(conn) => conn,
                None => return false,
            },
        };
        self.send(&conn, bytes).is_ok()
    }

    /// One round on this rank.
    pub(crate) fn run_round(
        &mut self,
        root: usize,
        payload: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let round = self.round;
        let plan = Plan {
            me: self.rank,
            tree: self.tree,
            round,
            root,
            timeout,
        };
        let mut m = RoundMachine::start(&mut self.links(root), plan, payload, Instant::now());
        // Frames of this round that came before it started here.
        if self.pending.iter().any(|(_, f)| f.round == round) {
            let (early, later): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.pending)
                .into_iter()
                .partition(|(_, f)| f.round == round);
            self.pending = later;
            for (conn, f) in early {
                self.feed(&mut m, root, conn, f);
            }
        }
        while !m.is_over() {
            match self.next(m.deadline())? {
                Some(Input::Frame(conn, f)) => self.feed(&mut m, root, conn, f),
                Some(Input::Admitted(r)) => m.on_admitted(&mut self.links(root), r),
                Some(Input::Proven(side)) => {
                    let side = if side == Side::Hub {
                        From::Hub
                    } else {
                        From::Parent
                    };
                    m.on_proven(&mut self.links(root), side);
                }
                Some(Input::KeyHint) | None => {}
            }
            // Also when frames keep coming: the round ends by its deadline whatever arrives.
            m.on_time(&mut self.links(root), Instant::now());
        }
        self.last_answers = m.answers().to_vec();
        self.arrivals = m.take_arrivals();
        let after = m.elapsed(Instant::now());
        let outcome = m.take_outcome();
        if let Some(o) = &outcome {
            self.note_seen(round, o);
        }
        match outcome {
            Some(Outcome::Delivered(data)) => Ok(data),
            Some(Outcome::Missing(missing)) => Err(Error::Timeout {
                after,
                last_seen: missing
                    .iter()
                    .filter_map(|&r| Some((r, *self.last_seen.get(r)?)))
                    .collect(),
                missing,
            }),
            Some(Outcome::WrongRoot(other)) => Err(Error::Mismatch {
                reason: format!(
                    "round {round}: this rank expected root {root}, the data came from root {other}"
                ),
            }),
            None => Err(Error::timeout(after, Vec::new())),
        }
    }

    /// Rank 0 records who took part in `round`: it hears from every rank in every round
    /// (their acks, or the root's data), so its record is complete. Other ranks hear from
    /// a part of the group in some rounds only and keep none (their record is empty),
    /// rather than name a stale round.
    fn note_seen(&mut self, round: u64, outcome: &Outcome) {
        let missing: &[usize] = match outcome {
            Outcome::Delivered(_) => &[],
            Outcome::Missing(m) => m,
            Outcome::WrongRoot(_) => return,
        };
        for (r, seen) in self.last_seen.iter_mut().enumerate() {
            if !missing.contains(&r) {
                *seen = round;
            }
        }
    }

    /// A frame that arrived during a round: the machine's if it is of this round and the
    /// machine takes it, else kept for later (or answered, or dropped).
    fn feed(&mut self, m: &mut RoundMachine, root: usize, conn: ConnId, f: Frame) {
        if f.round == self.round
            && !matches!(f.kind(), Kind::Welcome | Kind::Reject | Kind::JoinFail)
        {
            let heard = Heard {
                from: from_of(&conn, f.sender),
                sender: f.sender as usize,
                root: f.root as usize,
                msg: &f.msg,
            };
            let used = m.on_frame(&mut self.links(root), heard, Instant::now());
            if used {
                return;
            }
        }
        self.keep_for_later(conn, f);
    }

    /// Answers a DATA frame that repeats a finished round with what this rank said then,
    /// and says whether it was one: a peer that proved the key again after a reset sends
    /// again what may have died with its old connection. A member acknowledges again; rank
    /// 0 tells the root its verdict again.
    fn answer_repeat(&mut self, conn: &ConnId, f: &Frame) -> bool {
        if f.kind() != Kind::Data {
            return false;
        }
        let up = RoundMachine::up(self.tree, self.rank);
        let from = from_of(conn, f.sender);
        let Some(a) = self
            .last_answers
            .iter()
            .find(|a| a.answers(f.round, from, f.sender as usize, up))
        else {
            return false;
        };
        let bytes = self.frame(&a.msg, a.round, a.root);
        let to = a.to;
        tracing::debug!(
            round = f.round,
            "a finished round's data came again: answered again"
        );
        if !self.send_to(to, &bytes) {
            tracing::debug!("the answer waits for a reconnection");
        }
        true
    }

    /// Between rounds (the keeper, and a round before it returns): serves what has arrived
    /// for at most `budget`, without sleeping. Frames of later rounds are kept for them.
    pub(crate) fn serve_idle(&mut self, budget: Duration) -> Result<()> {
        let until = Instant::now() + budget;
        while let Some(input) = self.next_ready(until)? {
            if let Input::Frame(conn, f) = input {
                self.keep_for_later(conn, f);
            }
        }
        Ok(())
    }

    /// A frame that is not for the step of the round this rank is at.
    fn keep_for_later(&mut self, conn: ConnId, f: Frame) {
        if self.answer_repeat(&conn, &f) {
            return;
        }
        match f.kind() {
            Kind::Welcome | Kind::JoinFail => {} // answers to a knock after a reconnection
            Kind::Reject => {
                tracing::error!(message = ?f.msg, "rank 0 turned this rank's new connection away");
            }
            _ if f.round > self.round && self.pending.len() < PENDING_PER_RANK * self.n => {
                self.pending.push_back((conn, f));
            }
            _ => {
                tracing::debug!(round = f.round, now = self.round, kind = ?f.kind(), "dropped a frame of another round");
            }
        }
    }
}
