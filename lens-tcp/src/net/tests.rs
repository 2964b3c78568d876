//! The limits on unproven connections, each one alone, against raw TCP peers on loopback.
//! These back the threat model's figures (docs/guide/tcp.md).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;

use super::*;
use crate::frame::JOIN_FRAME_MAX;
use crate::frame::PREFIX;
use std::time::Duration;

const KEY: &[u8] = b"net limits test key, 32 bytes!!!";

/// Limits that no test here reaches by accident (each test changes the one it tests).
pub(super) fn limits() -> Limits {
    Limits {
        max_frame: 1 << 16,
        handshake: Duration::from_secs(30),
        max_unproven: 64,
        unproven_frames: 16,
        queue: 64,
        backlog: 64,
    }
}

fn server(limits: Limits) -> (Net, SocketAddr) {
    let mut net = Net::new(
        Codec::new(KEY).expect("HMAC takes a key of any length"),
        limits,
        Duration::ZERO,
    )
    .expect("an epoll instance is made");
    let addr = net
        .listen(&[SocketAddr::from(([127, 0, 0, 1], 0))])
        .expect("loopback port 0 binds")[0];
    (net, addr)
}

/// Runs the event loop for `d`, returning what happened.
fn pump(net: &mut Net, d: Duration) -> Vec<Event> {
    let deadline = Instant::now() + d;
    let mut out = Vec::new();
    while let Some(e) = net.recv(deadline).expect("the loop polls without error") {
        out.push(e);
    }
    out
}

fn opened(events: &[Event]) -> Vec<ConnId> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Opened(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

/// Whether the server closed `s` (end of stream or a reset) within a short wait.
fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("a non-zero read timeout is accepted");
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {} // an answer; keep reading
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

fn knock(codec: &Codec) -> Vec<u8> {
    let knock = crate::message::Message::Knock {
        world: 2,
        joiner: [0; 16],
    };
    codec.encode(&knock, 1, 0, 0, 0)
}

#[test]
fn a_silent_connection_is_closed_at_the_handshake_deadline() {
    let (mut net, addr) = server(Limits {
        handshake: Duration::from_millis(300),
        ..limits()
    });
    let mut silent = TcpStream::connect(addr).expect("the server listens on loopback");
    pump(&mut net, Duration::from_millis(100));
    assert!(!closed(&mut silent), "open before the deadline");
    pump(&mut net, Duration::from_millis(500));
    assert!(closed(&mut silent), "closed after the deadline");
}

#[test]
fn past_the_cap_the_oldest_unproven_connection_is_closed() {
    let (mut net, addr) = server(Limits {
        max_unproven: 2,
        ..limits()
    });
    let mut peers = Vec::new();
    for _ in 0..3 {
        peers.push(TcpStream::connect(addr).expect("the server listens on loopback"));
        pump(&mut net, Duration::from_millis(100));
    }
    assert!(closed(&mut peers[0]), "the oldest goes");
    assert!(
        !closed(&mut peers[1]) && !closed(&mut peers[2]),
        "the newer stay"
    );
}

#[test]
fn a_proven_connection_does_not_count_against_the_cap_or_the_deadline() {
    let (mut net, addr) = server(Limits {
        max_unproven: 1,
        handshake: Duration::from_millis(300),
        ..limits()
    });
    let mut proven = TcpStream::connect(addr).expect("the server listens on loopback");
    let conn = opened(&pump(&mut net, Duration::from_millis(100)))
        .pop()
        .expect("the server saw the connection open");
    net.set_verified(&conn, Some(1));
    let mut stranger = TcpStream::connect(addr).expect("the server listens on loopback");
    pump(&mut net, Duration::from_millis(600));
    assert!(closed(&mut stranger), "the stranger missed its deadline");
    assert!(!closed(&mut proven), "the proven peer stays");
}

#[test]
fn an_unproven_connection_may_send_only_so_many_frames() {
    let (mut net, addr) = server(Limits {
        unproven_frames: 3,
        ..limits()
    });
    let codec = Codec::new(KEY).expect("HMAC takes a key of any length");
    let mut peer = TcpStream::connect(addr).expect("the server listens on loopback");
    for _ in 0..6 {
        peer.write_all(&knock(&codec))
            .expect("the server has not closed this connection yet");
    }
    let events = pump(&mut net, Duration::from_millis(300));
    let frames = events
        .iter()
        .filter(|e| matches!(e, Event::Frame(..)))
        .count();
    assert_eq!(frames, 3, "{events:?}");
    assert!(closed(&mut peer));
}

#[test]
fn an_unproven_connection_cannot_announce_a_large_frame() {
    let (mut net, addr) = server(limits());
    let mut peer = TcpStream::connect(addr).expect("the server listens on loopback");
    // One byte over the join frame limit: refused on the length alone.
    let len = u32::try_from(JOIN_FRAME_MAX + 1).expect("JOIN_FRAME_MAX is far below 4 GiB");
    peer.write_all(&len.to_le_bytes())
        .expect("the server has not closed this connection yet");
    let events = pump(&mut net, Duration::from_millis(300));
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Rejected {
                why: Reject::Malformed("frame over the size limit"),
                ..
            }
        )),
        "{events:?}"
    );
    assert!(closed(&mut peer));
    assert_eq!(JOIN_FRAME_MAX, 342, "docs/guide/tcp.md says 342 bytes");
    assert_eq!(PREFIX, 4);
}

/// Sends to a peer that never reads until its queue is full; how the send failed.
fn fill(net: &mut Net, conn: &ConnId) -> SendFail {
    let big = vec![7u8; 1 << 16];
    for _ in 0..10_000 {
        if let Err(e) = net.send(conn, &big) {
            return e;
        }
    }
    panic!("10,000 sends of 64 KiB to a peer that never reads all succeeded");
}

#[test]
fn a_peer_that_never_reads_never_blocks_a_send() {
    let (mut net, addr) = server(Limits {
        queue: 4,
        ..limits()
    });
    let _stranger = TcpStream::connect(addr).expect("the server listens on loopback");
    let mut conns = opened(&pump(&mut net, Duration::from_millis(100)));
    let _member = TcpStream::connect(addr).expect("the server listens on loopback");
    conns.extend(opened(&pump(&mut net, Duration::from_millis(200))));
    assert_eq!(conns.len(), 2);
    net.set_verified(&conns[1], Some(1));
    // The stranger is dropped at a full queue; the proven peer is kept (and reported
    // missing by the round that could not reach it).
    assert_eq!(fill(&mut net, &conns[0]), SendFail::Full);
    assert_eq!(net.send(&conns[0], b"x"), Err(SendFail::Gone));
    assert_eq!(fill(&mut net, &conns[1]), SendFail::Full);
    assert_eq!(net.verified(&conns[1]), Some(1));
}

#[test]
fn every_socket_keeps_tcp_keepalive_and_no_delay_on() {
    let (mut net, addr) = server(limits());
    net.dial(Side::Hub, addr)
        .expect("dialing starts (the connection is made in the background)");
    let _ = pump(&mut net, Duration::from_millis(200));
    let out = net
        .hub
        .as_ref()
        .and_then(socket::Outbound::sock)
        .expect("the hub connection is made");
    let accepted: Vec<&socket::Stream> = net.accepted.values().collect();
    assert_eq!(
        accepted.len(),
        1,
        "the server accepted its own rank's connection"
    );
    for (why, s) in [("outbound", out), ("accepted", accepted[0].sock())] {
        let s = socket2::SockRef::from(s);
        assert!(
            s.keepalive().expect("a live socket reports its options"),
            "{why}"
        );
        assert_eq!(
            s.tcp_keepalive_time()
                .expect("a live socket reports its options"),
            Duration::from_secs(30),
            "{why}"
        );
        assert!(
            s.tcp_nodelay().expect("a live socket reports its options"),
            "{why}"
        );
    }
}

#[test]
fn what_the_socket_does_not_take_at_once_arrives_whole_and_in_order() {
    let (mut net, addr) = server(limits());
    let mut peer = TcpStream::connect(addr).expect("the server listens on loopback");
    let conns = opened(&pump(&mut net, Duration::from_millis(200)));
    assert_eq!(conns.len(), 1);
    net.set_verified(&conns[0], Some(1));
    // Three frames of 1 MiB each, more than the socket's buffers take at once (its send
    // buffer made small) while the peer is not reading: the rest waits in the queue.
    for s in net.accepted.values() {
        socket2::SockRef::from(s.sock())
            .set_send_buffer_size(64 << 10)
            .expect("a live socket takes a buffer size");
    }
    let frames: Vec<Vec<u8>> = (0..3u8)
        .map(|i| {
            (0..1 << 20)
                .map(|j: u32| (j as u8) ^ i.wrapping_mul(77))
                .collect()
        })
        .collect();
    for f in &frames {
        assert_eq!(
            net.send(&conns[0], f),
            Ok(()),
            "a frame within the queue's room is taken"
        );
    }
    let queued: usize = net.accepted.values().map(socket::Stream::pending).sum();
    assert!(
        queued > 0,
        "the socket took all 3 MiB at once: nothing tested the queue"
    );
    let want: Vec<u8> = frames.concat();
    let reader = std::thread::spawn(move || {
        peer.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("a non-zero read timeout is accepted");
        let mut got = vec![0u8; 3 << 20];
        peer.read_exact(&mut got).map(|()| got)
    });
    // The queue is written as the socket drains, while the rank waits for events.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !reader.is_finished() && Instant::now() < deadline {
        let _ = pump(&mut net, Duration::from_millis(10));
    }
    let got = reader
        .join()
        .expect("the reader thread does not panic")
        .expect("every byte arrives within 20 s");
    assert!(got == want, "the bytes arrived changed or out of order");
}

/// A peer's last frame and its end can signal as one (edge-triggered epoll signals once):
/// the read that takes the frame does not see the end, and the connection must still be
/// found closed, not wait for a signal that never comes. Before this was handled, a rank
/// whose connection was cut right behind a frame waited out its round's deadline.
#[test]
fn a_frame_and_the_end_behind_it_are_both_seen() {
    let (mut net, addr) = server(limits());
    let mut peer = TcpStream::connect(addr).expect("loopback connect");
    let conn = opened(&pump(&mut net, Duration::from_millis(200)))
        .pop()
        .expect("the connection is accepted");
    let codec = Codec::new(KEY).expect("HMAC takes a key of any length");
    peer.write_all(&knock(&codec))
        .expect("the knock is written");
    drop(peer); // its end, right behind the frame
    // Both are in the socket before the loop looks: one signal for the two.
    std::thread::sleep(Duration::from_millis(100));
    let events = pump(&mut net, Duration::from_millis(300));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Frame(c, _) if *c == conn)),
        "the frame is read: {events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Closed(c) if *c == conn)),
        "the end behind it is seen: {events:?}"
    );
}
