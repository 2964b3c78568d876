//! The wire frame: a fixed header, the payload, and an HMAC-SHA256 tag over both.
//!
//! ```text
//! 0..4   magic "LNS1"      17..25 round (u64 LE)
//! 4      kind              25..29 root (u32 LE)
//! 5..9   sender (u32 LE)   29..33 payload length (u32 LE)
//! 9..17  session (u64 LE)  33..   payload, then 32 bytes of HMAC-SHA256(key, all before)
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub(crate) const MAGIC: &[u8; 4] = b"LNS1";
pub(crate) const HEADER: usize = 33;
pub(crate) const TAG: usize = 32;

/// What a frame is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A rank joins: payload = world size (u32) + rank 0's challenge (16 bytes) + the
    /// address this rank listens on for tree children (may be empty).
    Hello = 1,
    /// The hub admits every rank at once; `session` names the job's session.
    Welcome = 2,
    /// The hub turns a joiner away; payload = reason (UTF-8).
    Reject = 3,
    /// A round's payload from its root.
    Data = 4,
    /// A rank received a round.
    Ack = 5,
    /// Every rank received the round (hub to root).
    Done = 6,
    /// The round failed; payload = the missing ranks (u32 LE each).
    Fail = 7,
    /// A rank joins its tree parent (tree fan-out only).
    Join = 8,
    /// A rank asks rank 0 for a challenge; payload = world size (u32).
    Knock = 9,
    /// Rank 0's fresh nonce (16 bytes), which the HELLO must carry back.
    Challenge = 10,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Reject,
            4 => Kind::Data,
            5 => Kind::Ack,
            6 => Kind::Done,
            7 => Kind::Fail,
            8 => Kind::Join,
            9 => Kind::Knock,
            10 => Kind::Challenge,
            _ => return None,
        })
    }
}

/// A verified frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub kind: Kind,
    pub sender: u32,
    pub session: u64,
    pub round: u64,
    pub root: u32,
    pub payload: Vec<u8>,
}

/// Why a frame was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reject {
    /// Shorter than a header and a tag, or its length field disagrees with its size.
    Malformed(&'static str),
    /// The tag does not match: no key, a wrong key, or altered bytes.
    BadTag,
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reject::Malformed(why) => write!(f, "malformed frame: {why}"),
            Reject::BadTag => {
                f.write_str("authentication tag does not match (no key or a wrong key)")
            }
        }
    }
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

    pub(crate) fn encode(
        &self,
        kind: Kind,
        sender: u32,
        session: u64,
        round: u64,
        root: u32,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + payload.len() + TAG);
        out.extend_from_slice(MAGIC);
        out.push(kind as u8);
        out.extend_from_slice(&sender.to_le_bytes());
        out.extend_from_slice(&session.to_le_bytes());
        out.extend_from_slice(&round.to_le_bytes());
        out.extend_from_slice(&root.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(payload);
        let mut mac = self.mac.clone();
        mac.update(&out);
        out.extend_from_slice(&mac.finalize().into_bytes());
        out
    }

    pub(crate) fn decode(&self, bytes: &[u8]) -> Result<Frame, Reject> {
        if bytes.len() < HEADER + TAG {
            return Err(Reject::Malformed("too short"));
        }
        let (body, tag) = bytes.split_at(bytes.len() - TAG);
        // Check the tag before reading any field: unauthenticated bytes are not parsed.
        let mut mac = self.mac.clone();
        mac.update(body);
        mac.verify_slice(tag).map_err(|_| Reject::BadTag)?;
        if &body[..4] != MAGIC {
            return Err(Reject::Malformed("bad magic"));
        }
        let kind = Kind::from_u8(body[4]).ok_or(Reject::Malformed("unknown kind"))?;
        let u32_at =
            |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let len = u32_at(29) as usize;
        if len != body.len() - HEADER {
            return Err(Reject::Malformed(
                "length field disagrees with the frame size",
            ));
        }
        Ok(Frame {
            kind,
            sender: u32_at(5),
            session: u64_at(9),
            round: u64_at(17),
            root: u32_at(25),
            payload: body[HEADER..].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any bytes: decoding never panics, and without the key nothing is accepted.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let codec = Codec::new(b"property test key").expect("key");
            prop_assert!(codec.decode(&bytes).is_err());
        }

        /// Every field survives encode then decode; any single changed byte is rejected.
        #[test]
        fn round_trip_and_tamper(kind in 1u8..=10, sender: u32, session: u64, round: u64, root: u32,
                                 payload in proptest::collection::vec(any::<u8>(), 0..300), flip: usize) {
            let codec = Codec::new(b"property test key").expect("key");
            let kind = Kind::from_u8(kind).expect("kind");
            let bytes = codec.encode(kind, sender, session, round, root, &payload);
            let f = codec.decode(&bytes).expect("decodes");
            prop_assert_eq!((f.kind, f.sender, f.session, f.round, f.root, &f.payload), (kind, sender, session, round, root, &payload));
            let mut tampered = bytes.clone();
            let at = flip % tampered.len();
            tampered[at] ^= 0x01;
            prop_assert!(codec.decode(&tampered).is_err());
        }
    }

    #[test]
    fn frame_table() {
        let codec = Codec::new(b"job key").expect("key");
        let other = Codec::new(b"other key").expect("key");
        let good = codec.encode(Kind::Data, 3, 77, 9, 3, b"payload");
        let mut flipped = good.clone();
        flipped[20] ^= 1;
        let mut bad_len = good.clone();
        bad_len.truncate(good.len() - 1);
        let rows: Vec<(&str, Vec<u8>, Result<(), Reject>)> = vec![
            ("well-formed", good.clone(), Ok(())),
            ("empty", vec![], Err(Reject::Malformed("too short"))),
            ("garbage", vec![0xab; 100], Err(Reject::BadTag)),
            (
                "wrong key",
                other.encode(Kind::Data, 3, 77, 9, 3, b"payload"),
                Err(Reject::BadTag),
            ),
            ("one bit flipped", flipped, Err(Reject::BadTag)),
            ("truncated", bad_len, Err(Reject::BadTag)),
        ];
        for (why, bytes, want) in rows {
            let got = codec.decode(&bytes).map(|_| ());
            assert_eq!(got, want, "{why}");
        }
        let f = codec.decode(&good).expect("decodes");
        assert_eq!(
            (
                f.kind,
                f.sender,
                f.session,
                f.round,
                f.root,
                f.payload.as_slice()
            ),
            (Kind::Data, 3, 77, 9, 3, &b"payload"[..])
        );
    }
}
