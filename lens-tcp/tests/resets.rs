//! The network resets connections: a reset must cost no round. Rank 1 reaches rank 0
//! through a relay (loopback) that resets both of its connections at a random round of a
//! 1,500-round job; rank 1 proves the key again on its new connection, and whatever the
//! reset cut off (rank 0's data, rank 1's acknowledgement, the root's data, rank 0's
//! verdict to the root) is sent again. Twenty runs, each at another point.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::attacker::Relay;
use lens_core::{Broadcaster as _, blocking};
use lens_tcp::{TcpBroadcaster, TcpConfig};

const ROUNDS: usize = 1500;
const RUNS: usize = 20;

fn cfg(rank: usize, addr: &str) -> TcpConfig {
    TcpConfig::builder()
        .rank(rank)
        .world_size(2)
        .addr(addr)
        .key(common::KEY)
        // Longer than a reconnection takes (a lost connection is made again after 50 ms).
        .timeout(Duration::from_secs(5))
        .join_timeout(Duration::from_secs(10))
        .build()
        .expect("config")
}

fn pair_through_relay() -> (Vec<TcpBroadcaster>, Relay) {
    let hub = TcpBroadcaster::start(cfg(0, "127.0.0.1:0")).expect("bind");
    let addr = hub.local_addr().expect("addr").to_string();
    let relay = Relay::new(&addr);
    let one = TcpBroadcaster::start(cfg(1, &relay.addr)).expect("connect");
    let ranks = std::thread::scope(|s| {
        let h = s.spawn(|| hub.finish());
        let o = one.finish().expect("rank 1");
        vec![h.join().expect("thread").expect("rank 0"), o]
    });
    (ranks, relay)
}

fn random_below(n: usize) -> usize {
    let x = getrandom::u64().expect("randomness");
    usize::try_from(x % n as u64).unwrap_or(0)
}

#[test]
#[allow(clippy::print_stderr)]
fn a_reset_at_any_point_costs_no_round() {
    for run in 0..RUNS {
        let (ranks, relay) = pair_through_relay();
        // The reset comes when rank 1 has finished `at` rounds, plus a random delay of up
        // to 300 µs, so that it lands anywhere in a round (sending, acknowledging, idle).
        let at = 1 + random_below(ROUNDS - 2);
        let delay = Duration::from_micros(random_below(300) as u64);
        let done = AtomicUsize::new(0);
        let started = Instant::now();
        let failures = std::thread::scope(|s| {
            s.spawn(|| {
                while done.load(Ordering::Relaxed) < at {
                    std::thread::yield_now();
                    if started.elapsed() > Duration::from_secs(60) {
                        return;
                    }
                }
                std::thread::sleep(delay);
                relay.reset();
            });
            lens_testkit::on_each_rank(&ranks, |b| {
                let mut failed = Vec::new();
                for round in 0..ROUNDS {
                    let root = round % 2;
                    let want = format!("round {round} of run {run}").into_bytes();
                    let mine = (b.rank() == root).then_some(want.as_slice());
                    match blocking::broadcast(b, root, mine) {
                        Ok(got) => assert_eq!(got, want, "rank {} round {round}", b.rank()),
                        Err(e) => failed.push((round, e.to_string())),
                    }
                    if b.rank() == 1 {
                        done.store(round + 1, Ordering::Relaxed);
                    }
                }
                failed
            })
        });
        // A reset after the last rounds (a late `at` on a busy machine) is mended after
        // them: wait for the new connection rather than race it.
        let mended = Instant::now() + Duration::from_secs(5);
        while relay.up.lock().expect("lock").len() < 2 && Instant::now() < mended {
            std::thread::sleep(Duration::from_millis(10));
        }
        let reconnected = relay.up.lock().expect("lock").len();
        eprintln!(
            "run {run}: reset after round {at} (+{delay:?}), {ROUNDS} rounds in {:.2} s, \
             {reconnected} connection(s) through the relay",
            started.elapsed().as_secs_f64()
        );
        for (rank, failed) in failures.iter().enumerate() {
            assert!(
                failed.is_empty(),
                "run {run} (reset after round {at}): rank {rank} lost {} round(s): {:?}",
                failed.len(),
                &failed[..failed.len().min(3)]
            );
        }
        assert!(
            reconnected >= 2,
            "run {run}: rank 1 reconnected after the reset"
        );
    }
}

/// A reset while no round runs is mended between rounds: each rank's keeper notices the
/// lost connection, rank 1 connects again and proves the key before anyone calls
/// `broadcast` again, and the next rounds succeed.
#[test]
fn a_reset_between_rounds_is_mended_before_the_next_round() {
    let (ranks, relay) = pair_through_relay();
    let round = |n: usize| {
        lens_testkit::on_each_rank(&ranks, |b| {
            let want = format!("round {n}").into_bytes();
            let mine = (b.rank() == 0).then_some(want.as_slice());
            blocking::broadcast(b, 0, mine).map(|got| assert_eq!(got, want))
        })
    };
    for r in round(0) {
        r.expect("the first round");
    }
    relay.reset();
    // No round runs: only the keepers can notice and mend the reset.
    let deadline = Instant::now() + Duration::from_secs(5);
    while relay.up.lock().expect("lock").len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        relay.up.lock().expect("lock").len() >= 2,
        "rank 1 did not connect again within 5 s while no round ran"
    );
    // Let the new connection prove the key (a KNOCK and its answers), still between rounds.
    std::thread::sleep(Duration::from_millis(500));
    for n in 1..20 {
        for r in round(n) {
            r.unwrap_or_else(|e| panic!("round {n} after the reset: {e}"));
        }
    }
}
