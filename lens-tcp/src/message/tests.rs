//! Table tests of the messages' encoding.

use super::*;

fn round_trip(m: Message<'_>) -> Option<Message<'static>> {
    Message::decode(m.kind(), &m.payload())
}

#[test]
fn every_message_survives_its_encoding() {
    let (a, b) = ([1u8; 16], [2u8; 16]);
    let rows: Vec<Message<'_>> = vec![
        Message::Knock {
            world: 7,
            joiner: a,
        },
        Message::Challenge {
            joiner: a,
            server: b,
        },
        Message::Hello {
            world: 3,
            server: b,
            endpoint: "h:1".into(),
        },
        Message::Hello {
            world: 3,
            server: b,
            endpoint: "".into(),
        },
        Message::Welcome {
            joiner: a,
            parent: "x:9".into(),
        },
        Message::Welcome {
            joiner: a,
            parent: "".into(),
        },
        Message::Reject {
            joiner: a,
            reason: "the group formed already".into(),
        },
        Message::JoinFail {
            joiner: a,
            missing: vec![2, 9],
        },
        Message::Data(Cow::Borrowed(b"a carrier")),
        Message::Data(Cow::Borrowed(b"")),
        Message::Ack {
            missing: vec![],
            voted: vec![],
            arrivals: vec![],
        },
        Message::Ack {
            missing: vec![1, 5],
            voted: vec![4],
            arrivals: vec![
                Came::itself(3, -12),
                Came::itself(4, i64::MAX),
                Came {
                    rank: 9,
                    ns: 0,
                    shown: 4_000_000,
                },
            ],
        },
        Message::Ack {
            missing: vec![],
            voted: (0..MAX_VOTERS).collect(),
            arrivals: vec![Came::itself(1, 2)],
        },
        Message::Done {
            voted: vec![],
            arrivals: vec![],
        },
        Message::Done {
            voted: vec![2, 7],
            arrivals: vec![
                Came::itself(2, 0),
                Came {
                    rank: 0,
                    ns: 7_000,
                    shown: 17,
                },
            ],
        },
        Message::Fail { missing: vec![3] },
    ];
    for m in rows {
        assert_eq!(round_trip(m.clone()).as_ref(), Some(&m), "{m:?}");
    }
}

#[test]
fn payloads_that_do_not_fit_their_kind_are_refused() {
    let a = [1u8; 16];
    let welcome = Message::Welcome {
        joiner: a,
        parent: "x:9".into(),
    }
    .payload()
    .into_owned();
    let hello = Message::Hello {
        world: 3,
        server: a,
        endpoint: "abc".into(),
    }
    .payload()
    .into_owned();
    let rows: Vec<(&str, Kind, Vec<u8>)> = vec![
        ("knock too short", Kind::Knock, vec![0; 19]),
        ("knock too long", Kind::Knock, vec![0; 21]),
        ("challenge short", Kind::Challenge, vec![0; 31]),
        ("hello cut", Kind::Hello, hello[..22].to_vec()),
        (
            "welcome with a byte too many",
            Kind::Welcome,
            [welcome, vec![0]].concat(),
        ),
        ("welcome without its endpoint", Kind::Welcome, a.to_vec()),
        ("ranks not a multiple of 4", Kind::Fail, vec![0; 5]),
        ("an ack without its count", Kind::Ack, vec![0; 3]),
        (
            "an ack counting more ranks than it holds",
            Kind::Ack,
            [2u32.to_le_bytes().to_vec(), vec![0; 4]].concat(),
        ),
        ("an ack without its voters' count", Kind::Ack, vec![0; 4]),
        (
            "an arrival cut short",
            Kind::Ack,
            [vec![0; 5], vec![0; 15]].concat(),
        ),
        (
            "more arrivals than an ack may carry",
            Kind::Ack,
            [vec![0; 5], vec![0; 16 * 9]].concat(),
        ),
        (
            "arrivals of the earlier layout (12 bytes each)",
            Kind::Ack,
            [vec![0; 5], vec![0; 12 * 3]].concat(),
        ),
        (
            "more voters than an ack may name",
            Kind::Ack,
            [vec![0; 4], vec![9], vec![0; 36]].concat(),
        ),
        (
            "an ack counting more voters than it holds",
            Kind::Ack,
            [vec![0; 4], vec![2], vec![0; 4]].concat(),
        ),
        ("join failure too short", Kind::JoinFail, vec![0; 15]),
        ("reject too short", Kind::Reject, vec![0; 15]),
        ("done without its voters' count", Kind::Done, vec![]),
        ("done with a cut arrival", Kind::Done, vec![0, 0]),
        (
            "done with too many arrivals",
            Kind::Done,
            vec![0; 1 + 16 * 9],
        ),
        ("an endpoint over the limit", Kind::Welcome, {
            let mut p = a.to_vec();
            p.extend_from_slice(&300u16.to_le_bytes());
            p.extend(std::iter::repeat_n(b'x', 300));
            p
        }),
        ("the key hint carries no message", Kind::KeyMismatch, vec![]),
    ];
    for (why, kind, p) in rows {
        assert_eq!(Message::decode(kind, &p), None, "{why}");
    }
}
