//! What a round machine is fed and what it gives: where a frame came from and goes, the
//! links it sends through, the round's plan, a frame as heard, how the round ended, and
//! what it says again when the same frame comes again.

use crate::message::Message;
use crate::tree::Tree;
use std::time::{Duration, Instant};

/// The connection a frame came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum From {
    /// A member's connection to rank 0.
    Hub,
    /// A member's connection to its tree parent, when that is not rank 0.
    Parent,
    /// A connection this rank accepted, on which rank `r` proved the key.
    Rank(usize),
}

/// Where a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum To {
    /// A member's connection to its tree parent (rank 0's connection when that is it).
    Up,
    /// Rank `r` over the connection it proved the key on here.
    Rank(usize),
}

/// What the machine needs from the connections.
pub(crate) trait Links {
    /// Queues a frame of this round (with the round's root) carrying `msg` for `to`; false
    /// when there is no live connection to it now.
    fn send(&mut self, to: To, msg: &Message<'_>) -> bool;

    /// Queues one frame carrying `msg` for each of `ranks`; whether each was queued, in
    /// order. The frame is the same for all of them (sender, round, root and message), so
    /// a link layer may make it once: a star's rank 0 sends the data to every rank.
    fn send_each(&mut self, ranks: &[usize], msg: &Message<'_>) -> Vec<bool> {
        ranks.iter().map(|&r| self.send(To::Rank(r), msg)).collect()
    }
}

/// Who this rank is in a round, and the round.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub me: usize,
    pub tree: Tree,
    pub round: u64,
    pub root: usize,
    pub timeout: Duration,
    /// This rank votes to keep the step the round ends (the step sampler's).
    pub vote: bool,
    /// The rank (of an enclosing group) this rank stands for in the round's arrivals, and
    /// when it came (`Broadcaster::stand_for`); `None`: this rank, at the round's start.
    pub stands_for: Option<(usize, Instant)>,
}

/// A frame of this round as the machine hears it: already authenticated and of this
/// session, its sender the rank that proved the key on the connection it came in on.
#[derive(Debug)]
pub(crate) struct Heard<'a> {
    pub from: From,
    pub sender: usize,
    /// The root the frame names.
    pub root: usize,
    /// Mutable so that the machine can take a DATA message's bytes rather than copy them;
    /// a frame the machine used is not looked at again.
    pub msg: &'a mut Message<'static>,
}

/// How a round ended on this rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every rank below this one has the payload (on rank 0 and the root: every rank).
    Delivered(Vec<u8>),
    /// The round failed for want of these ranks.
    Missing(Vec<usize>),
    /// The data came from another root than this rank was told.
    WrongRoot(usize),
}

/// What this rank said last in a finished round, to say again when the same frame comes
/// again: a member's ack to its parent, rank 0's verdict to a root other than itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub round: u64,
    /// The root of that round (the frame carries it).
    pub root: usize,
    /// The rank whose repeated DATA is answered (the parent: `None`; rank 0: its child on
    /// the path to the root).
    pub asker: Option<usize>,
    pub to: To,
    pub msg: Message<'static>,
}

impl Answer {
    /// Whether a DATA frame of `round` from `from` (sent by `sender`) repeats what this
    /// answer answered.
    pub(crate) fn answers(&self, round: u64, from: From, sender: usize, up: From) -> bool {
        round == self.round
            && match self.asker {
                None => from == up,
                Some(child) => from == From::Rank(child) && sender == child,
            }
    }
}
