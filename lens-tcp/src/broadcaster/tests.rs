use super::*;
use std::borrow::Cow;

use crate::message::Message;
use crate::net::ConnId;

const KEY: &[u8] = b"replay test key, long enough....";

fn cfg(rank: usize, addr: &str) -> TcpConfig {
    TcpConfig::builder()
        .rank(rank)
        .world_size(2)
        .addr(addr)
        .key(KEY)
        .timeout(Duration::from_secs(2))
        .join_timeout(Duration::from_secs(10))
        .build()
        .expect("every setting is given and valid")
}

fn pair() -> (TcpBroadcaster, TcpBroadcaster) {
    let hub = TcpBroadcaster::start(cfg(0, "127.0.0.1:0")).expect("rank 0 binds loopback port 0");
    let addr = hub
        .local_addr()
        .expect("a started rank 0 is bound")
        .to_string();
    let member =
        TcpBroadcaster::start(cfg(1, &addr)).expect("the member reaches rank 0 on loopback");
    std::thread::scope(|s| {
        let h = s.spawn(|| hub.finish());
        let m = member.finish().expect("the member is admitted");
        (
            h.join()
                .expect("the rank thread does not panic")
                .expect("rank 0 forms the group"),
            m,
        )
    })
}

fn round(
    hub: &TcpBroadcaster,
    member: &TcpBroadcaster,
    root: usize,
    data: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    std::thread::scope(|s| {
        let h = s.spawn(|| lens_core::blocking::broadcast(hub, root, (root == 0).then_some(data)));
        let m = lens_core::blocking::broadcast(member, root, (root == 1).then_some(data))
            .expect("the member is admitted");
        (
            h.join()
                .expect("the rank thread does not panic")
                .expect("rank 0 forms the group"),
            m,
        )
    })
}

/// Frames replayed on a live connection (an earlier round's data, a frame of another
/// session) never become a payload.
#[test]
fn replayed_frames_are_dropped() {
    let (hub, member) = pair();
    for r in 0..3u8 {
        assert_eq!(round(&hub, &member, 1, &[r; 8]), (vec![r; 8], vec![r; 8]));
    }
    {
        let mut g = member.state();
        let session = g.session();
        let codec = g.net.codec().clone();
        // Round 2's data again, word for word, and a frame of another session.
        let old = codec.encode(&Message::Data(Cow::Borrowed(&[2; 8])), 1, session, 2, 1);
        let other = codec.encode(
            &Message::Data(Cow::Borrowed(b"evil")),
            1,
            session ^ 0xff,
            4,
            1,
        );
        let hub_conn = ConnId::outbound(Side::Hub);
        g.send(&hub_conn, &old).expect("the connection is open");
        g.send(&hub_conn, &other).expect("the connection is open");
    }
    for r in 3..6u8 {
        assert_eq!(
            round(&hub, &member, 1, &[r; 8]),
            (vec![r; 8], vec![r; 8]),
            "round {r}"
        );
    }
    assert_eq!(
        round(&hub, &member, 0, b"from the hub"),
        (b"from the hub".to_vec(), b"from the hub".to_vec())
    );
}

/// Knocking again on a live connection (what a rank does after a failed round) is
/// harmless: the rank is admitted again on the same connection and rounds go on.
#[test]
fn knocking_again_is_harmless() {
    let (hub, member) = pair();
    assert_eq!(
        round(&hub, &member, 0, b"one"),
        (b"one".to_vec(), b"one".to_vec())
    );
    member
        .state()
        .knock(Side::Hub)
        .expect("the member can knock again");
    for r in 0..5u8 {
        assert_eq!(
            round(&hub, &member, usize::from(r % 2), &[r; 3]),
            (vec![r; 3], vec![r; 3])
        );
    }
}

/// A buggy insider's ack that names ranks outside its own subtree (here rank 1 blaming
/// rank 2 in a star) is not believed: the round completes on every rank.
#[test]
fn an_ack_may_only_speak_for_its_own_subtree() {
    let cfg3 = |rank: usize, addr: &str| {
        TcpConfig::builder()
            .rank(rank)
            .world_size(3)
            .addr(addr)
            .key(KEY)
            .timeout(Duration::from_secs(2))
            .build()
            .expect("every setting is given and valid")
    };
    let hub = TcpBroadcaster::start(cfg3(0, "127.0.0.1:0")).expect("rank 0 binds loopback port 0");
    let addr = hub
        .local_addr()
        .expect("a started rank 0 is bound")
        .to_string();
    let others: Vec<_> = (1..3)
        .map(|r| {
            TcpBroadcaster::start(cfg3(r, &addr)).expect("the member reaches rank 0 on loopback")
        })
        .collect();
    let ranks: Vec<TcpBroadcaster> = std::thread::scope(|s| {
        let h = s.spawn(|| hub.finish());
        let o: Vec<_> = others.into_iter().map(|r| s.spawn(|| r.finish())).collect();
        std::iter::once(h)
            .chain(o)
            .map(|t| {
                t.join()
                    .expect("the rank thread does not panic")
                    .expect("the rank is admitted")
            })
            .collect()
    });
    {
        // Rank 1's ack for the next round, sent early, naming rank 2 as missing.
        let mut g = ranks[1].state();
        let forged = g.frame(
            &Message::Ack {
                missing: vec![2],
                voted: Vec::new(),
                arrivals: Vec::new(),
            },
            1,
            0,
        );
        g.send(&ConnId::outbound(Side::Hub), &forged)
            .expect("the connection is open");
    }
    let results = lens_testkit::on_each_rank(&ranks, |b| {
        lens_core::blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"step"[..]))
    });
    for (rank, r) in results.into_iter().enumerate() {
        assert_eq!(r.expect("no rank fails").as_slice(), b"step", "rank {rank}");
    }
}

#[test]
fn rounds_poll_only_where_the_hosts_ranks_have_a_cpu_each() {
    let with = |world: usize, local: Option<usize>| {
        let mut b = TcpConfig::builder()
            .rank(0)
            .world_size(world)
            .addr("127.0.0.1:0")
            .key(KEY)
            .spin(Duration::from_micros(80));
        if let Some(l) = local {
            b = b.local_world_size(l);
        }
        b.build().expect("every setting is given and valid")
    };
    let rows = [
        (
            with(2, None),
            2,
            80,
            "2 ranks, 2 CPUs: the whole group counts as local",
        ),
        (
            with(4, None),
            2,
            0,
            "4 ranks, 2 CPUs, no launcher size: assumed all on this host",
        ),
        (
            with(64, Some(8)),
            16,
            80,
            "8 of 64 ranks on a host with 16 CPUs",
        ),
        (with(64, Some(8)), 4, 0, "8 ranks on a host with 4 CPUs"),
    ];
    for (config, cpus, want_us, why) in rows {
        assert_eq!(
            spin_for(&config, cpus),
            Duration::from_micros(want_us),
            "{why}"
        );
    }
}
