//! `SourceReturns::Queued`: the source returns once its data is queued, and learns how the
//! round ended at its next call, at `flush`, or when dropped.

mod common;

use std::time::{Duration, Instant};

use lens_core::{Broadcaster, Error, blocking};
use lens_tcp::{SourceReturns, TcpBroadcaster, loopback_group};
use lens_testkit::conformance::{Options, run_threads};

fn queued_group(n: usize, timeout: Duration, fan_out: Option<usize>) -> Vec<TcpBroadcaster> {
    loopback_group(n, |b| {
        let b = b
            .key(common::KEY)
            .timeout(timeout)
            .join_timeout(Duration::from_secs(20))
            .source_returns(SourceReturns::Queued);
        match fan_out {
            Some(k) => b.fan_out(k),
            None => b,
        }
    })
    .expect("group")
    .ranks
}

#[test]
fn queued_sources_pass_conformance_in_a_star_and_a_tree() {
    for (n, k) in [(2, None), (3, None), (5, None), (7, Some(2)), (4, Some(1))] {
        let ranks = queued_group(n, Duration::from_secs(10), k);
        if let Err(f) = run_threads(&ranks, &Options::default().rounds(200)) {
            panic!("n={n}, fan-out {k:?}: {f:#?}");
        }
        for b in &ranks {
            b.flush()
                .unwrap_or_else(|e| panic!("n={n}: rank {}: {e}", b.rank()));
        }
    }
}

/// A member that comes 400 ms late: the queued source returns at once, a delivered one
/// waits for it; both members get the payload.
#[test]
fn queued_source_returns_before_a_late_member_comes() {
    for when in [SourceReturns::Queued, SourceReturns::Delivered] {
        let group = loopback_group(3, |b| {
            b.key(common::KEY)
                .timeout(Duration::from_secs(10))
                .source_returns(when)
        })
        .expect("group");
        let ranks = &group.ranks;
        let late = Duration::from_millis(400);
        let (source_took, got) = std::thread::scope(|s| {
            let members: Vec<_> = ranks[1..]
                .iter()
                .map(|b| {
                    s.spawn(move || {
                        if b.rank() == 2 {
                            std::thread::sleep(late);
                        }
                        blocking::broadcast(b, 0, None)
                    })
                })
                .collect();
            let t = Instant::now();
            blocking::broadcast(&ranks[0], 0, Some(b"payload")).expect("source");
            let took = t.elapsed();
            let got: Vec<_> = members
                .into_iter()
                .map(|h| h.join().expect("thread").expect("member"))
                .collect();
            (took, got)
        });
        assert!(got.iter().all(|p| p == b"payload"), "{when:?}: {got:?}");
        match when {
            SourceReturns::Queued => assert!(
                source_took < Duration::from_millis(200),
                "a queued source waited {source_took:?} for a member 400 ms late"
            ),
            _ => assert!(
                source_took >= late - Duration::from_millis(50),
                "a delivered source returned after {source_took:?}, before the late member came"
            ),
        }
        ranks[0].flush().expect("the round was delivered");
    }
}

/// A rank that misses a queued round is named by the source's next call, with the round it
/// last took part in; that call's own round still reaches the ranks that are there.
#[test]
fn missed_queued_round_is_named_at_the_next_call_and_by_flush() {
    let timeout = Duration::from_millis(600);
    let mut ranks = queued_group(3, timeout, None);
    let gone = ranks.pop().expect("rank 2");
    // Round 1 with every rank.
    std::thread::scope(|s| {
        let two = s.spawn(|| blocking::broadcast(&gone, 0, None));
        let one = s.spawn(|| blocking::broadcast(&ranks[1], 0, None));
        blocking::broadcast(&ranks[0], 0, Some(b"one")).expect("source");
        assert_eq!(one.join().expect("t").expect("rank 1"), b"one");
        assert_eq!(two.join().expect("t").expect("rank 2"), b"one");
    });
    drop(gone);
    // Round 2: rank 2 is gone, and the source does not wait to find out.
    std::thread::scope(|s| {
        let one = s.spawn(|| blocking::broadcast(&ranks[1], 0, None));
        let t = Instant::now();
        blocking::broadcast(&ranks[0], 0, Some(b"two")).expect("queued: returns at once");
        assert!(t.elapsed() < timeout / 2, "waited {:?}", t.elapsed());
        assert_eq!(one.join().expect("t").expect("rank 1"), b"two");
    });
    // Round 3: the call reports round 2's failure, and rank 1 still gets round 3's data.
    std::thread::scope(|s| {
        let one = s.spawn(|| blocking::broadcast(&ranks[1], 0, None));
        match blocking::broadcast(&ranks[0], 0, Some(b"three")) {
            Err(Error::Timeout {
                missing, last_seen, ..
            }) => {
                assert_eq!(missing, vec![2]);
                assert_eq!(last_seen, vec![(2, 1)], "rank 2 last took part in round 1");
            }
            other => panic!("round 2's failure was not reported: {other:?}"),
        }
        assert_eq!(one.join().expect("t").expect("rank 1"), b"three");
    });
    // Round 3 is open and fails too: flush waits for it, bounded by its deadline.
    let t = Instant::now();
    match ranks[0].flush() {
        Err(Error::Timeout { missing, .. }) => assert_eq!(missing, vec![2]),
        other => panic!("flush did not report round 3: {other:?}"),
    }
    assert!(t.elapsed() < timeout * 2, "flush took {:?}", t.elapsed());
    // Nothing is open any more.
    ranks[0]
        .flush()
        .expect("a second flush has nothing to report");
}

/// The keeper serves the sockets while the source is away (it wakes at least every
/// 250 ms): the open round's acks must reach its machine, not be dropped as another
/// round's; a step longer than the timeout must not fail a round whose acks came in time.
#[test]
fn acks_that_come_while_the_source_is_away_count() {
    let ranks = queued_group(4, Duration::from_millis(300), None);
    for step in 0..3 {
        std::thread::scope(|s| {
            let members: Vec<_> = ranks[1..]
                .iter()
                .map(|b| s.spawn(move || blocking::broadcast(b, 0, None)))
                .collect();
            blocking::broadcast(&ranks[0], 0, Some(b"step")).expect("source");
            for m in members {
                assert_eq!(m.join().expect("t").expect("member"), b"step");
            }
        });
        // Longer than the timeout, and long enough for the keeper to wake.
        std::thread::sleep(Duration::from_millis(700));
        ranks[0]
            .flush()
            .unwrap_or_else(|e| panic!("step {step}: the acks came in time: {e}"));
    }
}

/// A queued source that is dropped right after its call still delivers the round: the
/// drop waits for the acks before the sockets close.
#[test]
fn dropping_a_queued_source_delivers_its_last_round() {
    let mut ranks = queued_group(3, Duration::from_secs(5), None);
    let source = ranks.remove(0);
    std::thread::scope(|s| {
        let members: Vec<_> = ranks
            .iter()
            .map(|b| {
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(200));
                    blocking::broadcast(b, 0, None)
                })
            })
            .collect();
        blocking::broadcast(&source, 0, Some(b"last")).expect("source");
        drop(source);
        for m in members {
            assert_eq!(m.join().expect("t").expect("member"), b"last");
        }
    });
}

/// A root other than rank 0 hears rank 0's verdict on its queued round at its next call,
/// and its span gets no straggler attributes (they come after it returned).
#[test]
fn queued_root_other_than_zero_and_no_arrivals() {
    let ranks = queued_group(3, Duration::from_secs(5), Some(1));
    for round in 0..20 {
        let root = 1 + round % 2;
        let got = lens_testkit::on_each_rank(&ranks, |b| {
            let p = (b.rank() == root).then_some(b"from a root".as_slice());
            blocking::broadcast(b, root, p)
        });
        for (r, g) in got.into_iter().enumerate() {
            assert_eq!(
                g.unwrap_or_else(|e| panic!("rank {r}: {e}")),
                b"from a root"
            );
        }
        assert!(ranks[root].take_arrivals().is_none());
    }
    for b in &ranks {
        b.flush().expect("delivered");
    }
}
