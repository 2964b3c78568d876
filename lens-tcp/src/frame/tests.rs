//! Table tests and properties of the wire format.

use std::borrow::Cow;

use super::*;
use proptest::prelude::*;

fn data(p: &[u8]) -> Message<'_> {
    Message::Data(Cow::Borrowed(p))
}

const KEY: &[u8] = b"property test key";

fn strip(bytes: &[u8]) -> &[u8] {
    &bytes[PREFIX..]
}

/// Every frame `push` hands out for `chunk`, copied.
fn push_all(r: &mut Reassembler, chunk: &[u8], limit: usize) -> Result<Vec<Vec<u8>>, TooLarge> {
    let mut got = Vec::new();
    r.push(chunk, limit, |f| {
        got.push(f.to_vec());
        true
    })?;
    Ok(got)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any bytes: decoding never panics, and without the key nothing is accepted.
    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let codec = Codec::new(KEY).expect("HMAC takes a key of any length");
        prop_assert!(codec.decode(&bytes, |_| true).is_err());
    }

    /// Every field survives encode then decode; any single changed byte is rejected.
    #[test]
    fn round_trip_and_tamper(sender: u32, session: u64, round: u64, root: u32,
                             payload in proptest::collection::vec(any::<u8>(), 0..300), flip: usize) {
        let codec = Codec::new(KEY).expect("HMAC takes a key of any length");
        let bytes = codec.encode(&data(&payload), sender, session, round, root);
        let f = codec.decode(strip(&bytes), |_| true).expect("a frame this codec encoded decodes");
        prop_assert_eq!((f.sender, f.session, f.round, f.root, &f.msg), (sender, session, round, root, &data(&payload)));
        let mut tampered = strip(&bytes).to_vec();
        let at = flip % tampered.len();
        tampered[at] ^= 0x01;
        prop_assert!(codec.decode(&tampered, |_| true).is_err());
    }

    /// Frames cut into any chunks come out whole and in order.
    #[test]
    fn reassembly_of_any_chunking(sizes in proptest::collection::vec(0usize..400, 1..6),
                                  cut in proptest::collection::vec(1usize..97, 1..40)) {
        let codec = Codec::new(KEY).expect("HMAC takes a key of any length");
        let frames: Vec<Vec<u8>> = sizes.iter().map(|&s| codec.encode(&data(&vec![7; s]), 1, 2, 3, 0)).collect();
        let stream = frames.concat();
        let mut r = Reassembler::default();
        let mut got = Vec::new();
        let (mut at, mut i) = (0, 0);
        while at < stream.len() {
            let end = (at + cut[i % cut.len()]).min(stream.len());
            got.extend(push_all(&mut r, &stream[at..end], 1 << 20).expect("within the limit"));
            at = end;
            i += 1;
        }
        prop_assert_eq!(r.held(), 0);
        let want: Vec<Vec<u8>> = frames.iter().map(|f| strip(f).to_vec()).collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn frame_table() {
    let codec = Codec::new(b"job key").expect("HMAC takes a key of any length");
    let other = Codec::new(b"other key").expect("HMAC takes a key of any length");
    let good = strip(&codec.encode(&data(b"payload"), 3, 77, 9, 3)).to_vec();
    let mut flipped = good.clone();
    flipped[20] ^= 1;
    let mut short = good.clone();
    short.truncate(good.len() - 1);
    let mut magic = good.clone();
    magic[0] = b'X';
    let mut kind = good.clone();
    kind[4] = 200;
    let hint = strip(&codec.key_mismatch_hint()).to_vec();
    let knock = Message::Knock {
        world: 2,
        joiner: [0; NONCE],
    };
    let knock = strip(&other.encode(&knock, 1, 0, 0, 0)).to_vec();
    let unfit = strip(&codec.encode_raw(Kind::Ack, 1, 2, 3, 0, &[0; 6])).to_vec();
    let only_joins = |k: Kind| matches!(k, Kind::Knock | Kind::Hello);
    let rows: Vec<(&str, Vec<u8>, bool, Result<(), Reject>)> = vec![
        ("well-formed", good.clone(), false, Ok(())),
        ("empty", vec![], false, Err(Reject::Malformed("too short"))),
        (
            "garbage",
            vec![0xab; 100],
            false,
            Err(Reject::Malformed("bad magic")),
        ),
        (
            "unknown kind",
            kind,
            false,
            Err(Reject::Malformed("unknown kind")),
        ),
        (
            "bad magic",
            magic,
            false,
            Err(Reject::Malformed("bad magic")),
        ),
        (
            "wrong key",
            strip(&other.encode(&data(b"payload"), 3, 77, 9, 3)).to_vec(),
            false,
            Err(Reject::BadTag(Kind::Data)),
        ),
        (
            "one bit flipped",
            flipped,
            false,
            Err(Reject::BadTag(Kind::Data)),
        ),
        (
            "truncated",
            short,
            false,
            Err(Reject::Malformed(
                "length field disagrees with the frame size",
            )),
        ),
        (
            "data before the key is proven",
            good.clone(),
            true,
            Err(Reject::NotAllowed(Kind::Data)),
        ),
        (
            "a knock with a wrong key",
            knock,
            true,
            Err(Reject::BadTag(Kind::Knock)),
        ),
        (
            "a signed payload that does not fit its kind",
            unfit,
            false,
            Err(Reject::Malformed("a payload that does not fit its kind")),
        ),
        (
            "the unsigned hint is never a frame",
            hint,
            false,
            Err(Reject::NotAllowed(Kind::KeyMismatch)),
        ),
    ];
    for (why, bytes, joining, want) in rows {
        let got = codec
            .decode(&bytes, |k| !joining || only_joins(k))
            .map(|_| ());
        assert_eq!(got, want, "{why}");
    }
    let f = codec
        .decode(&good, |_| true)
        .expect("a frame this codec encoded decodes");
    assert_eq!(
        (f.kind(), f.sender, f.session, f.round, f.root, &f.msg),
        (Kind::Data, 3, 77, 9, 3, &data(b"payload"))
    );
}

#[test]
fn reassembler_refuses_an_oversized_length_before_keeping_it() {
    let mut r = Reassembler::default();
    let err = push_all(&mut r, &(1u32 << 30).to_le_bytes(), 1000).expect_err("too large");
    assert_eq!(
        err,
        TooLarge {
            len: 1 << 30,
            limit: 1000
        }
    );
    assert_eq!(r.held(), 0);
}

#[test]
fn a_chunk_with_an_oversized_length_gives_no_frame_even_before_it() {
    let codec = Codec::new(KEY).expect("HMAC takes a key of any length");
    let mut chunk = codec.encode(&data(b"whole"), 1, 2, 3, 0);
    chunk.extend_from_slice(&(1u32 << 30).to_le_bytes());
    let mut r = Reassembler::default();
    let mut used = 0;
    let err = r.push(&chunk, 1000, |_| {
        used += 1;
        true
    });
    assert!(err.is_err(), "the length over the limit is refused");
    assert_eq!(used, 0, "no frame of the chunk is used");
    assert_eq!(r.held(), 0);
}

#[test]
fn frames_stop_being_handed_out_once_the_stream_is_given_up() {
    let codec = Codec::new(KEY).expect("HMAC takes a key of any length");
    let chunk = [b"one".as_slice(), b"two", b"three"]
        .map(|p| codec.encode(&data(p), 1, 2, 3, 0))
        .concat();
    let mut r = Reassembler::default();
    let mut seen = 0;
    r.push(&chunk, 1000, |_| {
        seen += 1;
        seen < 2
    })
    .expect("within the limit");
    assert_eq!(seen, 2, "the second frame said stop");
}
