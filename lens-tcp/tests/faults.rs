//! Slow joiners, dead ranks, strangers and long runs, all on loopback.

mod common;

use std::io::Write as _;
use std::time::{Duration, Instant};

use lens_core::{Broadcaster, Error, blocking};
use lens_tcp::TcpBroadcaster;

fn payload(round: usize, root: usize) -> Vec<u8> {
    lens_testkit::conformance::pattern(round, root, 40 + round % 300)
}

/// Every rank runs `rounds` rounds with rotating roots and checks every payload.
fn rounds(ranks: &[TcpBroadcaster], rounds: usize) {
    let n = ranks.len();
    let results = lens_testkit::on_each_rank(ranks, |b| {
        for round in 0..rounds {
            let root = round % n;
            let want = payload(round, root);
            let got = blocking::broadcast(b, root, (b.rank() == root).then_some(want.as_slice()))?;
            if got != want {
                return Err(Error::Corrupt {
                    reason: format!("rank {} round {round}: wrong payload", b.rank()),
                });
            }
        }
        Ok::<_, Error>(())
    });
    for (rank, r) in results.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
}

#[test]
fn slow_joiner_is_waited_for() {
    let timeout = Duration::from_secs(5);
    let (hub, addr) = common::hub(3, timeout);
    let early = TcpBroadcaster::start(common::config(1, 3, &addr, timeout)).expect("connect");
    let ranks = std::thread::scope(|s| {
        let hub = s.spawn(|| hub.finish());
        let early = s.spawn(|| early.finish());
        let late = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1500));
            TcpBroadcaster::connect(common::config(2, 3, &addr, timeout))
        });
        let mut v = vec![
            hub.join().expect("t").expect("hub"),
            early.join().expect("t").expect("early"),
            late.join().expect("t").expect("late"),
        ];
        v.sort_by_key(Broadcaster::rank);
        v
    });
    rounds(&ranks, 20);
}

/// Members that start before rank 0 listens (connection refused) keep trying, and join once
/// it does.
#[test]
fn members_that_start_before_rank_0_join_when_it_listens() {
    let timeout = Duration::from_secs(10);
    // A port nothing listens on until rank 0 binds it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("loopback port 0 binds")
        .to_string();
    let ranks = std::thread::scope(|s| {
        let early: Vec<_> = (1..3)
            .map(|r| {
                let addr = addr.clone();
                s.spawn(move || TcpBroadcaster::connect(common::config(r, 3, &addr, timeout)))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        let hub = TcpBroadcaster::connect(common::config(0, 3, &addr, timeout))
            .expect("rank 0 binds the port and forms the group");
        let mut v = vec![hub];
        for (r, h) in early.into_iter().enumerate() {
            v.push(
                h.join()
                    .expect("thread")
                    .unwrap_or_else(|e| panic!("rank {} that started first: {e}", r + 1)),
            );
        }
        v
    });
    rounds(&ranks, 20);
}

#[test]
fn rank_that_never_joins_is_named() {
    let cfg = |rank: usize, addr: &str, join: Duration| {
        lens_tcp::TcpConfig::builder()
            .rank(rank)
            .world_size(3)
            .addr(addr)
            .key(common::KEY)
            .join_timeout(join)
            .build()
            .expect("config")
    };
    let hub =
        TcpBroadcaster::start(cfg(0, "127.0.0.1:0", Duration::from_millis(500))).expect("bind");
    let addr = hub.local_addr().expect("addr").to_string();
    let one = TcpBroadcaster::start(cfg(1, &addr, Duration::from_secs(2))).expect("connect");
    let started = Instant::now();
    std::thread::scope(|s| {
        // Rank 1 joins; rank 2 never does.
        let one = s.spawn(|| one.finish());
        match hub.finish() {
            Err(Error::Timeout { missing, .. }) => assert_eq!(missing, vec![2]),
            other => panic!("expected a timeout naming rank 2, got {other:?}"),
        }
        // Rank 1 waits for rank 2 too: rank 0 tells it who is missing.
        match one.join().expect("thread") {
            Err(Error::Timeout { missing, .. }) => assert_eq!(missing, vec![2]),
            other => panic!("rank 1: expected a timeout, got {other:?}"),
        }
    });
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn killed_rank_is_named_and_others_are_unharmed() {
    let timeout = Duration::from_secs(1);
    let mut ranks = common::group(4, timeout);
    rounds(&ranks, 10);
    drop(ranks.remove(2)); // rank 2 dies
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let results = lens_testkit::on_each_rank(&ranks, |b| {
        blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"after"[..]))
    });
    assert!(started.elapsed() < timeout * 3, "bounded by the timeout");
    match &results[0] {
        Err(Error::Timeout {
            missing, last_seen, ..
        }) => {
            assert_eq!(missing, &vec![2]);
            // Rank 0 heard from rank 2 in each of the ten rounds before it died.
            assert_eq!(last_seen, &vec![(2, 10)]);
        }
        other => panic!("hub should name rank 2, got {other:?}"),
    }
    for r in &results[1..] {
        assert_eq!(r.as_deref().expect("live ranks get the data"), b"after");
    }
    // A later round, after that failure: the live ranks took part in round 11 and 12,
    // rank 2 still last in round 10.
    let results = lens_testkit::on_each_rank(&ranks, |b| {
        blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"later"[..]))
    });
    match &results[0] {
        Err(Error::Timeout {
            missing, last_seen, ..
        }) => {
            assert_eq!(missing, &vec![2]);
            assert_eq!(last_seen, &vec![(2, 10)], "not the failed round 11");
        }
        other => panic!("hub should name rank 2 again, got {other:?}"),
    }
    assert_eq!(ranks[0].rounds_started(), Some(12));
}

#[test]
fn rank_that_skips_a_step_is_named_with_its_last_round() {
    let timeout = Duration::from_millis(600);
    let ranks = common::group(3, timeout);
    rounds(&ranks, 4);
    // Rank 2 skips step 5; rank 0 names it, and the last round rank 2 took part in.
    let results = lens_testkit::on_each_rank(&ranks, |b| {
        if b.rank() == 2 {
            return None;
        }
        Some(blocking::broadcast(
            b,
            0,
            (b.rank() == 0).then_some(&b"five"[..]),
        ))
    });
    match &results[0] {
        Some(Err(
            e @ Error::Timeout {
                missing, last_seen, ..
            },
        )) => {
            assert_eq!(missing, &vec![2]);
            assert_eq!(last_seen, &vec![(2, 4)]);
            assert!(e.to_string().contains("rank 2 in round 4"), "{e}");
        }
        other => panic!("rank 0: expected a timeout naming rank 2, got {other:?}"),
    }
    assert_eq!(ranks[0].rounds_started(), Some(5));
}

#[test]
fn killed_root_is_named_by_everyone() {
    let timeout = Duration::from_secs(1);
    let mut ranks = common::group(4, timeout);
    rounds(&ranks, 8);
    drop(ranks.remove(3)); // the next root dies
    let started = Instant::now();
    let results = lens_testkit::on_each_rank(&ranks, |b| blocking::broadcast(b, 3, None));
    assert!(
        started.elapsed() < timeout * 3,
        "bounded by the timeout: {:?}",
        started.elapsed()
    );
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(Error::Timeout { missing, .. }) => assert_eq!(missing, &vec![3], "rank {rank}"),
            other => panic!("rank {rank}: expected a timeout naming rank 3, got {other:?}"),
        }
    }
}

/// Rank 3 leaves; rank 0's next round fails naming it. The other ranks had the data of
/// that round, so they fail in the round after, waiting for rank 0: each names rank 3, the
/// root cause, with the path to it (`via`), not rank 0 (star) or its parent (tree).
fn a_rank_that_leaves_is_named_by_every_rank(fan_out: Option<usize>, paths: &[Vec<usize>]) {
    let timeout = Duration::from_millis(800);
    let mut ranks = common::group_with(4, timeout, fan_out);
    rounds(&ranks, 4);
    drop(ranks.remove(3));
    let results = lens_testkit::on_each_rank(&ranks, |b| {
        let first = blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"five"[..]));
        if b.rank() == 0 {
            // The source stops here, as a training loop does on an error.
            return first.map(drop);
        }
        first?;
        blocking::broadcast(b, 0, None).map(drop)
    });
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(e @ Error::Timeout { missing, via, .. }) => {
                assert_eq!(missing, &vec![3], "rank {rank}: {e}");
                assert_eq!(via, &paths[rank], "rank {rank}: {e}");
                if let Some(first) = via.first() {
                    let words = format!("waiting for rank {first}, which is ");
                    assert!(e.to_string().contains(&words), "{e}");
                }
            }
            other => panic!("rank {rank}: expected a timeout naming rank 3, got {other:?}"),
        }
    }
}

#[test]
fn a_rank_that_leaves_is_named_by_every_rank_of_a_star() {
    a_rank_that_leaves_is_named_by_every_rank(None, &[vec![], vec![0], vec![0]]);
}

#[test]
fn a_rank_that_leaves_is_named_by_every_rank_of_a_tree() {
    // 0 → 1 → 2 → 3: rank 2 waits for rank 1, which waits for rank 0.
    a_rank_that_leaves_is_named_by_every_rank(Some(1), &[vec![], vec![0], vec![1, 0]]);
}

#[test]
fn duplicate_rank_is_turned_away() {
    let timeout = Duration::from_secs(5);
    let lens_tcp::LoopbackGroup { ranks, addr, .. } = common::group_at(3, timeout, None);
    let addr = addr.to_string();
    // Rank 0 reads joins while it takes part in a collective, so run rounds meanwhile.
    std::thread::scope(|s| {
        let dup = s.spawn(|| TcpBroadcaster::connect(common::config(1, 3, &addr, timeout)));
        let started = Instant::now();
        while !dup.is_finished() && started.elapsed() < Duration::from_secs(15) {
            rounds(&ranks, 5);
        }
        match dup.join().expect("thread") {
            Err(Error::Closed { reason, .. }) => assert!(reason.contains("already"), "{reason}"),
            other => panic!("expected the duplicate to be turned away, got {other:?}"),
        }
    });
    rounds(&ranks, 20);
}

#[test]
fn strangers_cannot_disturb_the_group() {
    let timeout = Duration::from_secs(5);
    let lens_tcp::LoopbackGroup { ranks, addr, .. } = common::group_at(3, timeout, None);
    let addr = addr.to_string();
    let ctx = zmq::Context::new();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let attacker = s.spawn(|| {
            let endpoint = format!("tcp://{addr}");
            let mut sent = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && sent < 400 {
                // No key: garbage, and a frame-shaped message signed with the wrong key.
                let d = ctx.socket(zmq::DEALER).expect("socket");
                d.set_linger(0).expect("linger");
                d.connect(&endpoint).expect("connect");
                d.send(&b"garbage bytes, no header, no tag"[..], 0)
                    .expect("send");
                let mut fake = b"LNS1".to_vec();
                fake.extend_from_slice(&[4; 29]);
                fake.extend_from_slice(&[0x55; 32]);
                d.send(fake, 0).expect("send");
                // Oversized: lens drops the connection of a peer that announces this.
                d.send(vec![0u8; 2 << 20], 0).expect("send");
                // Raw TCP that is not even ZMTP.
                if let Ok(mut t) = std::net::TcpStream::connect(&addr) {
                    let _ = t.write_all(b"GET / HTTP/1.1\r\n\r\n");
                }
                sent += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            sent
        });
        rounds(&ranks, 300);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(attacker.join().expect("attacker") > 0);
    });
    rounds(&ranks, 10);
}

#[test]
fn ten_thousand_rounds_without_cross_talk() {
    let ranks = common::group(3, Duration::from_secs(10));
    rounds(&ranks, 10_000);
}

#[test]
fn sixty_four_ranks() {
    let ranks = common::group(64, Duration::from_secs(20));
    rounds(&ranks, 130);
}

#[test]
fn tree_fan_out_at_sixty_four_ranks() {
    let ranks = common::group_with(64, Duration::from_secs(20), Some(4));
    rounds(&ranks, 130);
}

#[test]
fn killed_interior_rank_is_named_with_its_subtree() {
    // Fan-out 2 over 7 ranks: 0 -> {1, 2}, 1 -> {3, 4}, 2 -> {5, 6}.
    let timeout = Duration::from_secs(1);
    let mut ranks = common::group_with(7, timeout, Some(2));
    rounds(&ranks, 14);
    drop(ranks.remove(1));
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let results = lens_testkit::on_each_rank(&ranks, |b| {
        blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"after"[..]))
    });
    assert!(
        started.elapsed() < timeout * 3,
        "bounded by the timeout: {:?}",
        started.elapsed()
    );
    for (b, r) in ranks.iter().zip(&results) {
        match (b.rank(), r) {
            // Rank 0 names the dead rank's subtree; the dead rank's children hear from no
            // one (in a tree they keep no connection to rank 0) and name their parent.
            (
                0,
                Err(Error::Timeout {
                    missing, last_seen, ..
                }),
            ) => {
                assert_eq!(missing, &vec![1, 3, 4]);
                assert_eq!(last_seen, &vec![(1, 14), (3, 14), (4, 14)]);
            }
            (3 | 4, Err(Error::Timeout { missing, .. })) => {
                assert_eq!(missing, &vec![1], "rank {}", b.rank())
            }
            (2 | 5 | 6, Ok(data)) => assert_eq!(data, b"after"),
            (rank, other) => panic!("rank {rank}: unexpected {other:?}"),
        }
    }
}
