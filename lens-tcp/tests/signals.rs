//! A storm of signals at a process whose ranks wait in poll: with a handler installed (as
//! training jobs do), every wait is interrupted (`EINTR`) again and again, and rounds must
//! neither fail nor hang. In a binary of its own, so the signals hit no other test.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lens_core::{Broadcaster as _, blocking};

#[test]
fn signal_storm_does_not_fail_a_round() {
    let caught = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, caught.clone())
        .expect("install a handler");
    let ranks = common::group(3, Duration::from_secs(5));
    let stop = AtomicBool::new(false);
    let sent = AtomicUsize::new(0);
    let pid = std::process::id().to_string();
    std::thread::scope(|s| {
        s.spawn(|| {
            // Bounded: at most 3,000 signals or until the rounds are done.
            while !stop.load(Ordering::Relaxed) && sent.load(Ordering::Relaxed) < 3000 {
                let ok = std::process::Command::new("kill")
                    .args(["-USR1", &pid])
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "kill -USR1 failed");
                sent.fetch_add(1, Ordering::Relaxed);
            }
        });
        let started = Instant::now();
        // Every rank runs the same number of rounds (a collective); the signals fly
        // meanwhile.
        let results = lens_testkit::on_each_rank(&ranks, |b| {
            for round in 0..ROUNDS {
                let root = round % 3;
                let want = [u8::try_from(round % 251).unwrap_or(0); 64];
                let got = blocking::broadcast(b, root, (b.rank() == root).then_some(&want[..]))?;
                assert_eq!(got, want);
            }
            Ok::<_, lens_core::Error>(())
        });
        stop.store(true, Ordering::Relaxed);
        for (rank, r) in results.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("rank {rank} failed under signals: {e}"));
        }
        assert!(started.elapsed() < Duration::from_secs(60));
    });
    assert!(caught.load(Ordering::Relaxed), "the signals arrived");
    let sent = sent.load(Ordering::Relaxed);
    assert!(
        sent >= 50,
        "only {sent} signals were sent during the rounds"
    );
}

const ROUNDS: usize = 2000;
