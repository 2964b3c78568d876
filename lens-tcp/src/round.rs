//! One round: the state machine (`machine.rs`) driven by this rank's connections. Between
//! rounds the rank serves what arrives ([`RankState::serve_idle`]): joins, strangers, frames of
//! later rounds (kept), repeats of a finished round (answered again), and the frames of a
//! round this rank returned from early as a queued source (`OpenRound`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use lens_core::{Disagreement, Error, Result};

use crate::frame::{Frame, Kind};
use crate::message::Message;
use crate::net::{ConnId, Side};
use crate::state::{Input, OpenRound, RankState, wire};

use crate::machine::{From, Heard, Links, Outcome, Plan, RoundMachine, To};
use leaf::Began;

mod leaf;

/// Frames for later rounds kept while a round is in progress, per group member.
const PENDING_PER_RANK: usize = 4;
/// The longest a queued source's next call spends on what has already arrived for its
/// open round before that round's deadline applies.
const DRAIN: Duration = Duration::from_millis(50);

/// The machine's links over this rank's connections, for one round's frames.
struct GroupLinks<'a> {
    g: &'a mut RankState,
    round: u64,
    root: usize,
}

impl Links for GroupLinks<'_> {
    fn send(&mut self, to: To, msg: &Message<'_>) -> bool {
        self.g.encode_out(msg, self.round, self.root);
        self.g.send_out(to)
    }

    fn send_each(&mut self, ranks: &[usize], msg: &Message<'_>) -> Vec<bool> {
        if ranks.is_empty() {
            return Vec::new(); // a leaf: nothing to sign
        }
        // One frame, signed once, for every rank.
        self.g.encode_out(msg, self.round, self.root);
        ranks
            .iter()
            .map(|&r| self.g.send_out(To::Rank(r)))
            .collect()
    }
}

fn from_of(conn: &ConnId, sender: u32) -> From {
    match conn.side {
        Side::Hub => From::Hub,
        Side::Parent => From::Parent,
        Side::Listen => From::Rank(sender as usize),
    }
}

impl RankState {
    fn links(&mut self, root: usize) -> GroupLinks<'_> {
        let round = self.round;
        GroupLinks {
            g: self,
            round,
            root,
        }
    }

    /// Signs a frame of this rank carrying `msg` into the kept buffer [`RankState::out`].
    fn encode_out(&mut self, msg: &Message<'_>, round: u64, root: usize) {
        let at = (self.session(), round, wire(root));
        let codec = self.net.codec();
        codec.encode_into(&mut self.out, msg, wire(self.rank), at);
    }

    /// Sends the kept frame ([`RankState::encode_out`]) to `to`; whether it was queued.
    fn send_out(&mut self, to: To) -> bool {
        let out = std::mem::take(&mut self.out);
        let sent = self.send_to(to, &out);
        self.out = out;
        sent
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

    /// One round on this rank, once the round this rank returned from early (as a queued
    /// source) is over: that round's failure is returned after this round took part, so
    /// the other ranks carry on. With `queued`, a source returns once its data is queued.
    pub(crate) fn run_round(
        &mut self,
        root: usize,
        payload: Option<&[u8]>,
        timeout: Duration,
        queued: bool,
    ) -> Result<Vec<u8>> {
        self.net.set_round_waits(true);
        let result = self.round_body(root, payload, timeout, queued);
        self.net.set_round_waits(false);
        result
    }

    fn round_body(
        &mut self,
        root: usize,
        payload: Option<&[u8]>,
        timeout: Duration,
        queued: bool,
    ) -> Result<Vec<u8>> {
        let earlier = self.finish_open();
        self.round += 1;
        let round = self.round;
        let start = Instant::now();
        let plan = Plan {
            me: self.rank,
            tree: self.tree,
            round,
            root,
            timeout,
            vote: std::mem::take(&mut self.vote),
            stands_for: self.stands_for.take(),
        };
        let mut first = None;
        if self.is_steady_leaf(root) {
            match self.leaf_round(&plan, start)? {
                Began::Delivered(data) => return earlier.and(Ok(data)),
                Began::Other(input) => first = input,
            }
        }
        let mut m = RoundMachine::start(&mut self.links(root), plan, payload, start);
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
        if let Some(input) = first {
            self.take_input(&mut m, root, input);
        }
        if queued && root == self.rank && !m.is_over() {
            self.open = Some(OpenRound { m, root });
            earlier?;
            return Ok(payload.map(<[u8]>::to_vec).unwrap_or_default());
        }
        self.drive(&mut m, root)?;
        let result = self.conclude(m, root);
        earlier.and(result)
    }

    /// Ends the round this rank returned from as a queued source, if one is open: what has
    /// arrived counts even past its deadline (the caller may come back later than that),
    /// then the round runs to its end. Its failure, if any.
    pub(crate) fn finish_open(&mut self) -> Result<()> {
        let Some(OpenRound { mut m, root }) = self.open.take() else {
            return Ok(());
        };
        let until = Instant::now() + DRAIN;
        while !m.is_over() {
            match self.next_ready(until)? {
                Some(input) => self.take_input(&mut m, root, input),
                None => break,
            }
        }
        self.drive(&mut m, root)?;
        let result = self.conclude(m, root);
        // Its arrivals (and voters) would be taken for a later round's.
        self.arrivals.clear();
        self.voted.clear();
        if let Err(e) = &result {
            tracing::warn!(round = self.round, error = %e, "a round this rank returned from early (queued) failed");
        }
        result.map(drop)
    }

    /// When the open round (a queued source's) gives up, for the keeper's sleep.
    pub(crate) fn open_deadline(&self) -> Option<Instant> {
        self.open
            .as_ref()
            .filter(|o| !o.m.is_over())
            .map(|o| o.m.deadline())
    }

    /// Feeds the machine until its round is over on this rank.
    fn drive(&mut self, m: &mut RoundMachine, root: usize) -> Result<()> {
        while !m.is_over() {
            if let Some(input) = self.next(m.deadline())? {
                self.take_input(m, root, input);
            }
            // Also when frames keep coming: the round ends by its deadline whatever arrives.
            m.on_time(&mut self.links(root), Instant::now());
        }
        Ok(())
    }

    /// One input for the machine of the round in progress.
    fn take_input(&mut self, m: &mut RoundMachine, root: usize, input: Input) {
        match input {
            Input::Frame(conn, f) => self.feed(m, root, conn, f),
            Input::Admitted(r) => m.on_admitted(&mut self.links(root), r),
            Input::Proven(side) => {
                let side = if side == Side::Hub {
                    From::Hub
                } else {
                    From::Parent
                };
                m.on_proven(&mut self.links(root), side);
            }
            Input::KeyHint => {}
        }
    }

    /// The round's result once it is over on this rank.
    fn conclude(&mut self, mut m: RoundMachine, root: usize) -> Result<Vec<u8>> {
        let round = self.round;
        self.last_answers = m.take_answers();
        self.arrivals = m.take_arrivals();
        self.voted = m.take_voted();
        self.received_at = m.received_at();
        let after = m.elapsed(Instant::now());
        let outcome = m.take_outcome();
        if let Some(o) = &outcome {
            self.note_seen(round, o);
        }
        match outcome {
            Some(Outcome::Delivered(data)) => {
                self.upstream_missing.clear();
                Ok(data)
            }
            Some(Outcome::Missing(missing)) => {
                if let Some(e) = self.missing_upstream(&missing, after) {
                    return Err(e);
                }
                Err(Error::Timeout {
                    after,
                    last_seen: missing
                        .iter()
                        .filter_map(|&r| Some((r, *self.last_seen.get(r)?)))
                        .collect(),
                    missing,
                    via: Vec::new(),
                })
            }
            Some(Outcome::WrongRoot(other)) => Err(Error::mismatch(
                Disagreement::Root,
                format!(
                    "round {round}: this rank expected root {root}, the data came from root {other}"
                ),
            )),
            None => Err(Error::timeout(after, Vec::new())),
        }
    }

    /// A member whose round found only the rank above it missing (its parent, or rank 0),
    /// when rank 0 said its last failed round waited for other ranks: those ranks, the root
    /// cause, through the path from this rank up to rank 0.
    fn missing_upstream(&self, missing: &[usize], after: Duration) -> Option<Error> {
        let parent = self.tree.parent(self.rank)?;
        let only_above = matches!(missing, [r] if *r == parent || *r == 0);
        if !only_above
            || self.upstream_missing.is_empty()
            || self.upstream_missing.contains(&self.rank)
        {
            return None;
        }
        let mut via = vec![parent];
        while let Some(p) = via.last().and_then(|&r| self.tree.parent(r)) {
            via.push(p);
        }
        Some(Error::Timeout {
            after,
            missing: self.upstream_missing.clone(),
            last_seen: Vec::new(),
            via,
        })
    }

    /// Rank 0's word that one of its rounds failed, for want of `missing`, heard from the
    /// rank above this one after this rank's part of that round was over: kept for a later
    /// round that waits for rank 0 in vain, and passed on to this rank's children.
    fn upstream_failed(&mut self, f: &Frame) {
        let Message::Fail { missing } = &f.msg else {
            return;
        };
        self.upstream_missing.clone_from(missing);
        let bytes = self.frame(&f.msg, f.round, f.root as usize);
        for c in self.tree.children(self.rank) {
            if !self.send_to(To::Rank(c), &bytes) {
                tracing::debug!(rank = c, "cannot pass rank 0's failed round on (yet)");
            }
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
    fn feed(&mut self, m: &mut RoundMachine, root: usize, conn: ConnId, mut f: Frame) {
        if f.round == self.round
            && !matches!(f.kind(), Kind::Welcome | Kind::Reject | Kind::JoinFail)
        {
            let heard = Heard {
                from: from_of(&conn, f.sender),
                sender: f.sender as usize,
                root: f.root as usize,
                msg: &mut f.msg,
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
        let mut open = self.open.take();
        let served = self.serve_ready(until, open.as_mut());
        if let Some(o) = open.as_mut() {
            o.m.on_time(&mut self.links(o.root), Instant::now());
        }
        self.open = open;
        served
    }

    fn serve_ready(&mut self, until: Instant, mut open: Option<&mut OpenRound>) -> Result<()> {
        while let Some(input) = self.next_ready(until)? {
            match (open.as_deref_mut(), input) {
                (Some(o), input) => self.take_input(&mut o.m, o.root, input),
                (None, Input::Frame(conn, f)) => self.keep_for_later(conn, f),
                (None, _) => {}
            }
        }
        Ok(())
    }

    /// A frame that is not for the step of the round this rank is at.
    fn keep_for_later(&mut self, conn: ConnId, f: Frame) {
        if self.answer_repeat(&conn, &f) {
            return;
        }
        let from_above =
            !self.is_hub() && from_of(&conn, f.sender) == RoundMachine::up(self.tree, self.rank);
        match f.kind() {
            Kind::Fail if from_above && f.round <= self.round => self.upstream_failed(&f),
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
