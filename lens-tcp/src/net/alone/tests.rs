//! A leaf's frame read where it lies, against a raw TCP server on loopback: one DATA frame
//! alone comes out of `recv_alone`; whatever else comes is handed out by `recv` as it would
//! have been, nothing lost, nothing twice, in order.

use std::borrow::Cow;
use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::super::{ConnId, Event, Net, Side};
use crate::frame::{Codec, Kind};
use crate::message::Message;

const KEY: &[u8] = b"recv alone test key, 32 bytes!!!";

fn codec() -> Codec {
    Codec::new(KEY).expect("HMAC takes a key of any length")
}

/// A rank's `Net` whose connection to rank 0 is made and proven, and rank 0's end of it.
fn proven_client() -> (Net, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("loopback port 0 binds");
    let mut net = Net::new(codec(), super::super::tests::limits(), Duration::ZERO)
        .expect("an epoll instance is made");
    net.dial(
        Side::Hub,
        listener
            .local_addr()
            .expect("a bound listener has an address"),
    )
    .expect("a loopback connection starts");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut made = false;
    while !made && Instant::now() < deadline {
        while let Some(e) = net
            .recv(Instant::now() + Duration::from_millis(20))
            .expect("the loop polls")
        {
            made |= matches!(e, Event::Opened(c) if c.side == Side::Hub);
        }
    }
    assert!(made, "the connection to rank 0 is made within 5 s");
    let (server, _) = listener.accept().expect("the connection is accepted");
    net.set_verified(&ConnId::outbound(Side::Hub), Some(0));
    (net, server)
}

fn data(round: u64) -> Vec<u8> {
    let body = format!("the data of round {round}");
    codec().encode(
        &Message::Data(Cow::Borrowed(body.as_bytes())),
        0,
        7,
        round,
        0,
    )
}

fn fail(round: u64) -> Vec<u8> {
    codec().encode(&Message::Fail { missing: vec![3] }, 0, 7, round, 0)
}

/// What a frame or an event says, to compare what came out with what was sent.
fn said(kind: Kind, round: u64) -> String {
    format!("{kind:?} {round}")
}

/// Everything that comes out of the connection within `d`: first `recv_alone`, then the
/// loop's events.
fn all_out(net: &mut Net, d: Duration) -> (bool, Vec<String>) {
    let deadline = Instant::now() + d;
    let mut out = Vec::new();
    let alone = net
        .recv_alone(Side::Hub, deadline)
        .expect("the wait polls without error");
    let took = alone.is_some();
    if let Some(f) = alone {
        out.push(said(f.kind(), f.round));
    }
    while let Some(e) = net.recv(deadline).expect("the loop polls without error") {
        match e {
            Event::Frame(_, f) => out.push(said(f.kind(), f.round)),
            Event::Rejected { why, .. } => out.push(format!("rejected: {why}")),
            Event::Opened(c) => out.push(format!("opened {:?}", c.side)),
            other => out.push(format!("{other:?}")),
        }
    }
    (took, out)
}

#[test]
fn one_data_frame_alone_is_read_where_it_lies() {
    let (mut net, mut server) = proven_client();
    server.write_all(&data(1)).expect("rank 0 writes");
    let (took, out) = all_out(&mut net, Duration::from_millis(300));
    assert!(took, "the frame came alone: {out:?}");
    assert_eq!(out, [said(Kind::Data, 1)], "once, and nothing else");
}

#[test]
fn whatever_else_comes_is_left_for_the_loop() {
    let mut bad = data(4);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    // (why, what rank 0 writes in one go, what comes out, in order)
    let rows: [(&str, Vec<u8>, Vec<String>); 4] = [
        (
            "two frames in one read",
            [data(1), data(2)].concat(),
            vec![said(Kind::Data, 1), said(Kind::Data, 2)],
        ),
        (
            "a frame of another kind",
            fail(3),
            vec![said(Kind::Fail, 3)],
        ),
        (
            "a frame whose tag does not match",
            bad,
            vec!["rejected: authentication tag of a Data frame does not match (no key or a wrong key)".into()],
        ),
        (
            "a frame and half of the next",
            [data(5), data(6)[..20].to_vec()].concat(),
            vec![said(Kind::Data, 5)],
        ),
    ];
    for (why, bytes, want) in rows {
        let (mut net, mut server) = proven_client();
        server.write_all(&bytes).expect("rank 0 writes");
        std::thread::sleep(Duration::from_millis(50)); // all of it in one read
        let (took, out) = all_out(&mut net, Duration::from_millis(300));
        assert!(!took, "{why}: read as if alone: {out:?}");
        assert_eq!(out, want, "{why}: what came out");
    }
}

#[test]
fn a_frame_split_across_reads_comes_out_once_whole() {
    let (mut net, mut server) = proven_client();
    let mut head = data(1);
    let tail = head.split_off(10);
    server.write_all(&head).expect("rank 0 writes");
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        server.write_all(&tail).map(|()| server)
    });
    let (took, out) = all_out(&mut net, Duration::from_millis(500));
    let _server = writer.join().expect("the writer does not panic");
    assert!(!took, "a part of a frame is not a frame: {out:?}");
    assert_eq!(out, [said(Kind::Data, 1)], "once, whole");
}

#[test]
fn the_end_behind_a_frame_is_seen_after_it() {
    let (mut net, mut server) = proven_client();
    server.write_all(&data(1)).expect("rank 0 writes");
    drop(server);
    std::thread::sleep(Duration::from_millis(50));
    let (_, out) = all_out(&mut net, Duration::from_millis(300));
    assert_eq!(
        out,
        [said(Kind::Data, 1), "opened Hub".into()],
        "the frame, then the connection made again"
    );
}

#[test]
fn nothing_by_the_deadline_is_none_at_the_deadline() {
    let (mut net, _server) = proven_client();
    let start = Instant::now();
    let got = net
        .recv_alone(Side::Hub, start + Duration::from_millis(100))
        .expect("the wait polls without error");
    let waited = start.elapsed();
    assert!(got.is_none());
    assert!(
        waited >= Duration::from_millis(100) && waited < Duration::from_secs(2),
        "waited {waited:?} for a deadline 100 ms away"
    );
}

/// Between rounds nobody waits on the connection: a frame that comes then, after the last
/// read left it dry, is what the next round's wait finds at once (the wait reads a dry
/// connection only once it signalled, so the signal must not be lost in between).
#[test]
fn a_frame_that_came_between_rounds_is_found_at_once() {
    let (mut net, mut server) = proven_client();
    for round in 1..=3 {
        server.write_all(&data(round)).expect("rank 0 writes");
        let got = net
            .recv_alone(Side::Hub, Instant::now() + Duration::from_secs(5))
            .expect("the wait polls without error");
        assert_eq!(got.map(|f| f.round), Some(round), "round {round}'s frame");
        // Dry now: a short wait finds nothing, and leaves it marked so.
        let none = net
            .recv_alone(Side::Hub, Instant::now() + Duration::from_millis(20))
            .expect("the wait polls without error");
        assert!(none.is_none(), "nothing more came in round {round}");
    }
    // The next frame comes while nobody waits.
    server.write_all(&data(4)).expect("rank 0 writes");
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    let got = net
        .recv_alone(Side::Hub, start + Duration::from_secs(5))
        .expect("the wait polls without error");
    assert_eq!(
        got.map(|f| f.round),
        Some(4),
        "the frame that came between rounds"
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "found at once, not at the deadline: {:?}",
        start.elapsed()
    );
}
