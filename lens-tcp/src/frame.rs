//! The wire: frames, their payload layouts, and how frames travel on a TCP byte stream.
//!
//! On a connection every frame is preceded by its length (u32 LE). A frame is a fixed
//! header, a payload, and an HMAC-SHA256 tag over both:
//!
//! ```text
//! 0..4   magic "LNS3"      17..25 round (u64 LE)
//! 4      kind              25..29 root (u32 LE)
//! 5..9   sender (u32 LE)   29..33 payload length (u32 LE)
//! 9..17  session (u64 LE)  33..   payload, then 32 bytes of HMAC-SHA256(key, all before)
//! ```
//!
//! Payloads (`message.rs` encodes and decodes them; all integers little-endian; a nonce is
//! 16 random bytes):
//!
//! | kind | payload |
//! |---|---|
//! | KNOCK | world size (u32), the joiner's nonce |
//! | CHALLENGE | the joiner's nonce (echoed), the server's nonce |
//! | HELLO | world size (u32), the server's nonce (echoed), endpoint length (u16), endpoint |
//! | WELCOME | the joiner's nonce, endpoint length (u16), the endpoint of its tree parent (empty when that is rank 0) |
//! | REJECT | the joiner's nonce, the reason (UTF-8) |
//! | DATA | the round's payload |
//! | ACK | the count (u32) and ranks (u32 each) missing below the sender; the count (u8, at most 8) and ranks of its subtree that voted to keep the step; then arrivals, 16 bytes each (rank u32, ns i64, the rank it is shown as u32: itself, or the rank of an enclosing group it stands for), at most 8 |
//! | FAIL | ranks (u32 each) missing in the round |
//! | JOIN FAIL | the joiner's nonce, then the ranks that never joined (u32 each) |
//! | DONE | voters as in ACK, then arrivals as in ACK (both empty unless the root is not rank 0) |
//! | KEY MISMATCH | empty, and its tag is not checked: a hint to a peer whose key differs |
//!
//! Checks run cheapest first (length, magic, kind, what the connection may send) so a
//! stranger's bytes cost no HMAC unless they look like a frame this connection may send.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub(crate) use crate::message::{Kind, MAX_ENDPOINT, Message, NONCE, Nonce};

/// The wire's version: "LNS3" since arrivals name the rank they are shown as (a lens of
/// another layout fails every frame's first check instead of misreading an ack).
pub(crate) const MAGIC: &[u8; 4] = b"LNS3";
pub(crate) const FRAME_HEADER: usize = 33;
pub(crate) const TAG: usize = 32;
/// The length prefix before each frame on a connection.
pub(crate) const PREFIX: usize = 4;
/// Largest frame a connection may send before it proves the key: a KNOCK or a HELLO.
pub(crate) const JOIN_FRAME_MAX: usize = FRAME_HEADER + 4 + NONCE + 2 + MAX_ENDPOINT + TAG;

/// A verified frame: its header, and its message (`message.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub sender: u32,
    pub session: u64,
    pub round: u64,
    pub root: u32,
    pub msg: Message<'static>,
}

impl Frame {
    pub(crate) fn kind(&self) -> Kind {
        self.msg.kind()
    }
}

/// Why a frame was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reject {
    /// Too short, a bad magic or kind, or a length field that disagrees with its size.
    Malformed(&'static str),
    /// A kind this connection may not send (yet).
    NotAllowed(Kind),
    /// The tag does not match: no key, a wrong key, or altered bytes.
    BadTag(Kind),
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reject::Malformed(why) => write!(f, "malformed frame: {why}"),
            Reject::NotAllowed(kind) => write!(f, "a {kind:?} frame is not allowed here"),
            Reject::BadTag(kind) => write!(
                f,
                "authentication tag of a {kind:?} frame does not match (no key or a wrong key)"
            ),
        }
    }
}

/// A frame's header fields.
struct Head {
    kind: Kind,
    sender: u32,
    session: u64,
    round: u64,
    root: u32,
}

/// Signs and checks frames with the job key.
#[derive(Clone)]
pub(crate) struct Codec {
    mac: Hmac<Sha256>,
}

impl Codec {
    pub(crate) fn new(key: &[u8]) -> lens_core::Result<Self> {
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(key)
            .map_err(|e| lens_core::Error::config(format!("unusable TCP job key: {e}")))?;
        Ok(Codec { mac })
    }

    /// A frame carrying `msg`, with its length prefix, ready for the stream.
    pub(crate) fn encode(
        &self,
        msg: &Message<'_>,
        sender: u32,
        session: u64,
        round: u64,
        root: u32,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out, msg, sender, (session, round, root));
        out
    }

    /// As [`Codec::encode`], into `out` (cleared first): a buffer kept from frame to frame
    /// costs no allocation once it is large enough. `at` is the session, round and root.
    pub(crate) fn encode_into(
        &self,
        out: &mut Vec<u8>,
        msg: &Message<'_>,
        sender: u32,
        at: (u64, u64, u32),
    ) {
        let (session, round, root) = at;
        let head = Head {
            kind: msg.kind(),
            sender,
            session,
            round,
            root,
        };
        // The payload is written into the frame itself.
        self.write_frame(out, head, msg.payload_len_hint(), |out| {
            msg.write_payload(out);
        });
    }

    /// A frame of `kind` around `payload` as it is (tests: payloads no message writes).
    #[cfg(test)]
    pub(crate) fn encode_raw(
        &self,
        kind: Kind,
        sender: u32,
        session: u64,
        round: u64,
        root: u32,
        payload: &[u8],
    ) -> Vec<u8> {
        let head = Head {
            kind,
            sender,
            session,
            round,
            root,
        };
        self.encode_with(head, payload.len(), |out| out.extend_from_slice(payload))
    }

    /// The unsigned hint that a KNOCK failed authentication here.
    pub(crate) fn key_mismatch_hint(&self) -> Vec<u8> {
        let head = Head {
            kind: Kind::KeyMismatch,
            sender: 0,
            session: 0,
            round: 0,
            root: 0,
        };
        self.encode_with(head, 0, |_| {})
    }

    /// A frame of `head` around what `payload` writes (about `hint` bytes). Payloads are
    /// bounded by the configuration (far below 4 GiB), so the length fields cannot
    /// overflow.
    fn encode_with(&self, head: Head, hint: usize, payload: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_frame(&mut out, head, hint, payload);
        out
    }

    /// [`Codec::encode_with`] into `out`, cleared first.
    fn write_frame(
        &self,
        out: &mut Vec<u8>,
        head: Head,
        hint: usize,
        payload: impl FnOnce(&mut Vec<u8>),
    ) {
        out.clear();
        out.reserve(PREFIX + FRAME_HEADER + hint + TAG);
        out.extend_from_slice(&[0; PREFIX]);
        out.extend_from_slice(MAGIC);
        out.push(head.kind as u8);
        out.extend_from_slice(&head.sender.to_le_bytes());
        out.extend_from_slice(&head.session.to_le_bytes());
        out.extend_from_slice(&head.round.to_le_bytes());
        out.extend_from_slice(&head.root.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        payload(out);
        let payload_len = out.len() - PREFIX - FRAME_HEADER;
        let len = out.len() - PREFIX + TAG;
        out[..PREFIX].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
        out[PREFIX + FRAME_HEADER - 4..PREFIX + FRAME_HEADER]
            .copy_from_slice(&u32::try_from(payload_len).unwrap_or(u32::MAX).to_le_bytes());
        if head.kind == Kind::KeyMismatch {
            out.extend_from_slice(&[0; TAG]);
        } else {
            let mut mac = self.mac.clone();
            mac.update(&out[PREFIX..]);
            out.extend_from_slice(&mac.finalize().into_bytes());
        }
    }

    /// The kind of a frame (without its prefix), from its header alone: no tag check.
    pub(crate) fn peek(bytes: &[u8]) -> Result<Kind, Reject> {
        if bytes.len() < FRAME_HEADER + TAG {
            return Err(Reject::Malformed("too short"));
        }
        if &bytes[..4] != MAGIC {
            return Err(Reject::Malformed("bad magic"));
        }
        let kind = Kind::from_u8(bytes[4]).ok_or(Reject::Malformed("unknown kind"))?;
        if u32_at(bytes, 29) as usize != bytes.len() - FRAME_HEADER - TAG {
            return Err(Reject::Malformed(
                "length field disagrees with the frame size",
            ));
        }
        Ok(kind)
    }

    /// Checks a frame (without its prefix): cheap checks first, then `allowed(kind)`, then
    /// the tag.
    pub(crate) fn decode(
        &self,
        bytes: &[u8],
        allowed: impl Fn(Kind) -> bool,
    ) -> Result<Frame, Reject> {
        let kind = Self::peek(bytes)?;
        if !allowed(kind) || kind == Kind::KeyMismatch {
            return Err(Reject::NotAllowed(kind));
        }
        let (body, tag) = bytes.split_at(bytes.len() - TAG);
        let mut mac = self.mac.clone();
        mac.update(body);
        mac.verify_slice(tag).map_err(|_| Reject::BadTag(kind))?;
        let msg = Message::decode(kind, &body[FRAME_HEADER..])
            .ok_or(Reject::Malformed("a payload that does not fit its kind"))?;
        Ok(Frame {
            sender: u32_at(body, 5),
            session: u64_at(body, 9),
            round: u64_at(body, 17),
            root: u32_at(body, 25),
            msg,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// How many bytes the complete frames at the start of `bytes` take; a length over `limit`
/// anywhere among them is refused before any frame is used.
fn complete(bytes: &[u8], limit: usize) -> Result<usize, TooLarge> {
    let mut at = 0;
    while bytes.len() - at >= PREFIX {
        let len = u32_at(bytes, at) as usize;
        if len > limit {
            return Err(TooLarge { len, limit });
        }
        if bytes.len() - at - PREFIX < len {
            break;
        }
        at += PREFIX + len;
    }
    Ok(at)
}

/// Calls `each` with every frame (prefix removed) of `bytes`, which holds whole frames,
/// until it returns false.
fn each_frame(bytes: &[u8], mut each: impl FnMut(&[u8]) -> bool) {
    let mut at = 0;
    while at < bytes.len() {
        let len = u32_at(bytes, at) as usize;
        if !each(&bytes[at + PREFIX..at + PREFIX + len]) {
            return;
        }
        at += PREFIX + len;
    }
}

/// Reassembles length-prefixed frames from the chunks a stream delivers.
#[derive(Debug, Default)]
pub(crate) struct Reassembler {
    buf: Vec<u8>,
}

/// A reason to give up on a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLarge {
    pub len: usize,
    pub limit: usize,
}

impl Reassembler {
    pub(crate) fn reset(&mut self) {
        self.buf = Vec::new();
    }

    /// Appends `chunk` and calls `each` with every complete frame (prefix removed), in
    /// place, until it returns false (the stream is given up: what is left does not
    /// matter). A length over `limit` is refused before any frame of the chunk is used or
    /// its bytes kept.
    pub(crate) fn push(
        &mut self,
        chunk: &[u8],
        limit: usize,
        each: impl FnMut(&[u8]) -> bool,
    ) -> Result<(), TooLarge> {
        if self.buf.is_empty() {
            // The usual case: whole frames in one chunk, read where they lie; only a tail
            // is kept.
            let used = complete(chunk, limit).inspect_err(|_| self.reset())?;
            each_frame(&chunk[..used], each);
            self.buf.extend_from_slice(&chunk[used..]);
            return Ok(());
        }
        self.buf.extend_from_slice(chunk);
        let used = complete(&self.buf, limit).inspect_err(|_| self.reset())?;
        each_frame(&self.buf[..used], each);
        self.buf.drain(..used);
        Ok(())
    }

    /// Whether no part of a frame is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes held for an incomplete frame.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests;
