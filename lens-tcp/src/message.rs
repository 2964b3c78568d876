//! What frames say: one typed message per kind, with its one encoding and its one decoding
//! (the payload layouts; the frame's header and tag are `frame.rs`'s). All integers are
//! little-endian; a nonce is 16 random bytes; ranks travel as u32 each; an endpoint is its
//! length (u16) and at most [`MAX_ENDPOINT`] bytes of UTF-8.

use std::borrow::Cow;

/// Bytes in a nonce.
pub(crate) const NONCE: usize = 16;
/// Longest endpoint a rank may announce for its tree children.
pub(crate) const MAX_ENDPOINT: usize = 255;

pub(crate) type Nonce = [u8; NONCE];

/// What a frame is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A joiner asks for a challenge.
    Knock = 1,
    /// The server's answer to a KNOCK: proves it holds the key and is live.
    Challenge = 2,
    /// The joiner's answer to a CHALLENGE: proves it holds the key and is live.
    Hello = 3,
    /// Rank 0 admits a joiner (with where its tree parent listens, and the session).
    Welcome = 4,
    /// The server turns a joiner away.
    Reject = 5,
    /// A round's payload.
    Data = 6,
    /// A rank received a round.
    Ack = 7,
    /// Every rank received the round (rank 0 to the root).
    Done = 8,
    /// The round failed.
    Fail = 9,
    /// Rank 0 gave up forming the group.
    JoinFail = 10,
    /// Unsigned hint: a KNOCK failed authentication here.
    KeyMismatch = 12,
}

impl Kind {
    pub(crate) fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Knock,
            2 => Kind::Challenge,
            3 => Kind::Hello,
            4 => Kind::Welcome,
            5 => Kind::Reject,
            6 => Kind::Data,
            7 => Kind::Ack,
            8 => Kind::Done,
            9 => Kind::Fail,
            10 => Kind::JoinFail,
            // 11 was a request to join again; a rank that reconnects knocks by itself.
            12 => Kind::KeyMismatch,
            _ => return None,
        })
    }
}

/// A frame's message. Decoded messages own their bytes (`'static`); messages being sent
/// borrow them, so a round's data is never copied to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    /// A joiner asks for a challenge: its world size and a fresh nonce.
    Knock { world: u32, joiner: Nonce },
    /// The server's answer to a KNOCK: the joiner's nonce, and one of its own.
    Challenge { joiner: Nonce, server: Nonce },
    /// The joiner's answer to a CHALLENGE: its world size, the server's nonce, and where it
    /// listens for its tree children (empty when it has none).
    Hello {
        world: u32,
        server: Nonce,
        endpoint: Cow<'a, str>,
    },
    /// Rank 0 admits a joiner: its nonce, and where its tree parent listens (empty when that
    /// is rank 0); the session is in the header.
    Welcome { joiner: Nonce, parent: Cow<'a, str> },
    /// The server turns a joiner away, saying why.
    Reject { joiner: Nonce, reason: Cow<'a, str> },
    /// Rank 0 gave up forming the group: the ranks that never joined.
    JoinFail { joiner: Nonce, missing: Vec<usize> },
    /// A round's payload.
    Data(Cow<'a, [u8]>),
    /// A rank received a round: the ranks missing below it, and when ranks of its subtree
    /// came to the round (the earliest and the latest few, at most [`MAX_ARRIVALS`]), each
    /// in nanoseconds after the data reached that rank (negative: it came first and waited).
    /// It also names ranks of its subtree that voted to keep the step the round ends (the
    /// step sampler's; at most [`MAX_VOTERS`]).
    Ack {
        missing: Vec<usize>,
        voted: Vec<usize>,
        arrivals: Vec<Came>,
    },
    /// Every rank received the round (rank 0 to a root other than itself), with when the
    /// ranks came to it, in ns after the first (the earliest and the latest few, at most
    /// [`MAX_ARRIVALS`]), and ranks that voted (at most [`MAX_VOTERS`]).
    Done {
        voted: Vec<usize>,
        arrivals: Vec<Came>,
    },
    /// The round failed for want of these ranks.
    Fail { missing: Vec<usize> },
}

impl Message<'_> {
    /// The kind of frame that carries it.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Message::Knock { .. } => Kind::Knock,
            Message::Challenge { .. } => Kind::Challenge,
            Message::Hello { .. } => Kind::Hello,
            Message::Welcome { .. } => Kind::Welcome,
            Message::Reject { .. } => Kind::Reject,
            Message::JoinFail { .. } => Kind::JoinFail,
            Message::Data(_) => Kind::Data,
            Message::Ack { .. } => Kind::Ack,
            Message::Done { .. } => Kind::Done,
            Message::Fail { .. } => Kind::Fail,
        }
    }

    /// The payload bytes (a round's data as it is).
    #[cfg(test)]
    pub(crate) fn payload(&self) -> Cow<'_, [u8]> {
        if let Message::Data(d) = self {
            return Cow::Borrowed(d);
        }
        let mut p = Vec::new();
        self.write_payload(&mut p);
        Cow::Owned(p)
    }

    /// About how many bytes [`Message::write_payload`] writes (exact for the messages of a
    /// round), to size a frame once.
    pub(crate) fn payload_len_hint(&self) -> usize {
        match self {
            Message::Data(d) => d.len(),
            Message::Ack {
                missing,
                voted,
                arrivals,
            } => {
                4 + 4 * missing.len()
                    + 1
                    + 4 * voted.len().min(MAX_VOTERS)
                    + CAME_LEN * arrivals.len().min(MAX_ARRIVALS)
            }
            Message::Done { voted, arrivals } => {
                1 + 4 * voted.len().min(MAX_VOTERS) + CAME_LEN * arrivals.len().min(MAX_ARRIVALS)
            }
            Message::Fail { missing } => 4 * missing.len(),
            _ => 64,
        }
    }

    /// Appends the payload bytes to `p`.
    pub(crate) fn write_payload(&self, p: &mut Vec<u8>) {
        match self {
            Message::Data(d) => p.extend_from_slice(d),
            Message::Done { voted, arrivals } => {
                push_voters(p, voted);
                push_arrivals(p, arrivals);
            }
            Message::Knock { world, joiner } => {
                p.extend_from_slice(&world.to_le_bytes());
                p.extend_from_slice(joiner);
            }
            Message::Challenge { joiner, server } => {
                p.extend_from_slice(joiner);
                p.extend_from_slice(server);
            }
            Message::Hello {
                world,
                server,
                endpoint,
            } => {
                p.extend_from_slice(&world.to_le_bytes());
                p.extend_from_slice(server);
                push_str(p, endpoint);
            }
            Message::Welcome { joiner, parent } => {
                p.extend_from_slice(joiner);
                push_str(p, parent);
            }
            Message::Reject { joiner, reason } => {
                p.extend_from_slice(joiner);
                p.extend_from_slice(reason.as_bytes());
            }
            Message::JoinFail { joiner, missing } => {
                p.extend_from_slice(joiner);
                push_ranks(p, missing);
            }
            Message::Ack {
                missing,
                voted,
                arrivals,
            } => {
                p.extend_from_slice(&u32::try_from(missing.len()).unwrap_or(0).to_le_bytes());
                push_ranks(p, missing);
                push_voters(p, voted);
                push_arrivals(p, arrivals);
            }
            Message::Fail { missing } => push_ranks(p, missing),
        }
    }

    /// The message with bytes of its own.
    pub(crate) fn into_owned(self) -> Message<'static> {
        match self {
            Message::Knock { world, joiner } => Message::Knock { world, joiner },
            Message::Challenge { joiner, server } => Message::Challenge { joiner, server },
            Message::Hello {
                world,
                server,
                endpoint,
            } => Message::Hello {
                world,
                server,
                endpoint: Cow::Owned(endpoint.into_owned()),
            },
            Message::Welcome { joiner, parent } => Message::Welcome {
                joiner,
                parent: Cow::Owned(parent.into_owned()),
            },
            Message::Reject { joiner, reason } => Message::Reject {
                joiner,
                reason: Cow::Owned(reason.into_owned()),
            },
            Message::JoinFail { joiner, missing } => Message::JoinFail { joiner, missing },
            Message::Data(d) => Message::Data(Cow::Owned(d.into_owned())),
            Message::Ack {
                missing,
                voted,
                arrivals,
            } => Message::Ack {
                missing,
                voted,
                arrivals,
            },
            Message::Done { voted, arrivals } => Message::Done { voted, arrivals },
            Message::Fail { missing } => Message::Fail { missing },
        }
    }
}

impl Message<'static> {
    /// The message a frame of `kind` carries in `p`; `None` when the payload does not fit
    /// its kind (or the kind carries no message: the unsigned key hint).
    pub(crate) fn decode(kind: Kind, p: &[u8]) -> Option<Message<'static>> {
        Some(match kind {
            Kind::Knock => {
                (p.len() == 4 + NONCE).then_some(())?;
                Message::Knock {
                    world: u32_at(p, 0)?,
                    joiner: nonce_at(p, 4)?,
                }
            }
            Kind::Challenge => {
                (p.len() == 2 * NONCE).then_some(())?;
                Message::Challenge {
                    joiner: nonce_at(p, 0)?,
                    server: nonce_at(p, NONCE)?,
                }
            }
            Kind::Hello => {
                let (endpoint, end) = read_str(p, 4 + NONCE)?;
                (end == p.len()).then_some(())?;
                Message::Hello {
                    world: u32_at(p, 0)?,
                    server: nonce_at(p, 4)?,
                    endpoint: Cow::Owned(endpoint),
                }
            }
            Kind::Welcome => {
                let (parent, end) = read_str(p, NONCE)?;
                (end == p.len()).then_some(())?;
                Message::Welcome {
                    joiner: nonce_at(p, 0)?,
                    parent: Cow::Owned(parent),
                }
            }
            Kind::Reject => Message::Reject {
                joiner: nonce_at(p, 0)?,
                reason: Cow::Owned(String::from_utf8_lossy(p.get(NONCE..)?).into_owned()),
            },
            Kind::JoinFail => Message::JoinFail {
                joiner: nonce_at(p, 0)?,
                missing: read_ranks(p.get(NONCE..)?)?,
            },
            // Only the data is kept as bytes: other kinds are read into their fields.
            Kind::Data => Message::Data(Cow::Owned(p.to_vec())),
            Kind::Ack => {
                let count = usize::try_from(u32_at(p, 0)?).ok()?;
                let end = count.checked_mul(4)?.checked_add(4)?;
                let missing = read_ranks(p.get(4..end)?)?;
                let (voted, end) = read_voters(p, end)?;
                let arrivals = read_arrivals(p.get(end..)?)?;
                Message::Ack {
                    missing,
                    voted,
                    arrivals,
                }
            }
            Kind::Done => {
                let (voted, end) = read_voters(p, 0)?;
                Message::Done {
                    voted,
                    arrivals: read_arrivals(p.get(end..)?)?,
                }
            }
            Kind::Fail => Message::Fail {
                missing: read_ranks(p)?,
            },
            Kind::KeyMismatch => return None,
        })
    }
}

fn nonce_at(p: &[u8], at: usize) -> Option<Nonce> {
    p.get(at..at + NONCE)?.try_into().ok()
}

fn u32_at(p: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(p.get(at..at + 4)?.try_into().ok()?))
}

/// `s` cut to [`MAX_ENDPOINT`] bytes (endpoints are checked when they are made).
fn push_str(p: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..s.len().min(MAX_ENDPOINT)];
    p.extend_from_slice(&u16::try_from(s.len()).unwrap_or(0).to_le_bytes());
    p.extend_from_slice(s);
}

fn read_str(p: &[u8], at: usize) -> Option<(String, usize)> {
    let len = usize::from(u16::from_le_bytes(p.get(at..at + 2)?.try_into().ok()?));
    if len > MAX_ENDPOINT {
        return None;
    }
    let s = p.get(at + 2..at + 2 + len)?;
    Some((String::from_utf8(s.to_vec()).ok()?, at + 2 + len))
}

/// Voters an ACK or DONE names at most: the source needs one to keep the step.
pub(crate) const MAX_VOTERS: usize = 8;

/// A count byte, then the ranks.
fn push_voters(p: &mut Vec<u8>, voted: &[usize]) {
    let voted = &voted[..voted.len().min(MAX_VOTERS)];
    p.push(u8::try_from(voted.len()).unwrap_or(0));
    push_ranks(p, voted);
}

/// The voters at `at`, and where they end.
fn read_voters(p: &[u8], at: usize) -> Option<(Vec<usize>, usize)> {
    let count = usize::from(*p.get(at)?);
    if count > MAX_VOTERS {
        return None;
    }
    let end = at + 1 + 4 * count;
    Some((read_ranks(p.get(at + 1..end)?)?, end))
}

/// Arrivals an ACK carries at most: the earliest of its subtree and the latest ones.
pub(crate) const MAX_ARRIVALS: usize = 8;

/// One rank's arrival as an ACK or a DONE carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Came {
    /// The rank of this group it is about (an ack speaks for its sender's subtree only).
    pub rank: usize,
    /// In ns: before the ack was sent (ACK), or after rank 0 came (DONE).
    pub ns: i64,
    /// The rank the root reports: `rank` itself, or the rank of an enclosing group that
    /// `rank` stands for (`Broadcaster::stand_for`).
    pub shown: usize,
}

impl Came {
    /// A rank that stands for itself.
    #[cfg(test)]
    pub(crate) fn itself(rank: usize, ns: i64) -> Came {
        Came {
            rank,
            ns,
            shown: rank,
        }
    }
}

/// Bytes of one arrival on the wire: rank (u32), ns (i64), shown (u32).
const CAME_LEN: usize = 16;

fn push_arrivals(p: &mut Vec<u8>, arrivals: &[Came]) {
    for c in arrivals.iter().take(MAX_ARRIVALS) {
        push_ranks(p, &[c.rank]);
        p.extend_from_slice(&c.ns.to_le_bytes());
        push_ranks(p, &[c.shown]);
    }
}

fn read_arrivals(p: &[u8]) -> Option<Vec<Came>> {
    if p.len() % CAME_LEN != 0 || p.len() / CAME_LEN > MAX_ARRIVALS {
        return None;
    }
    Some(
        p.chunks_exact(CAME_LEN)
            .map(|c| {
                let rank = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
                let mut ns = [0u8; 8];
                ns.copy_from_slice(&c[4..12]);
                let shown = u32::from_le_bytes([c[12], c[13], c[14], c[15]]) as usize;
                Came {
                    rank,
                    ns: i64::from_le_bytes(ns),
                    shown,
                }
            })
            .collect(),
    )
}

/// Ranks are below the world size, which the configuration keeps within u32.
fn push_ranks(p: &mut Vec<u8>, ranks: &[usize]) {
    for &r in ranks {
        p.extend_from_slice(&u32::try_from(r).unwrap_or(u32::MAX).to_le_bytes());
    }
}

fn read_ranks(p: &[u8]) -> Option<Vec<usize>> {
    (p.len() % 4 == 0).then(|| {
        p.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
            .collect()
    })
}

#[cfg(test)]
mod tests;
