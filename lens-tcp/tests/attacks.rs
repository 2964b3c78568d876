//! lens-tcp tried as an attacker would (the threat model in the crate docs): strangers who
//! play ZeroMQ routing-id games, never read, replay recorded join frames (within a job and
//! from an earlier job with the same key), pose as rank 0, or flood; peers with a wrong
//! key or world size; a network that resets connections; ranks that restart. Loopback only.

mod common;

use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

use common::attacker::{Relay, never_reading, replaying_server};
use lens_core::{Broadcaster, Disagreement, Error, blocking};
use lens_tcp::{TcpBroadcaster, TcpConfig};

fn cfg(rank: usize, n: usize, addr: &str, join: Duration) -> TcpConfig {
    TcpConfig::builder()
        .rank(rank)
        .world_size(n)
        .addr(addr)
        .key(common::KEY)
        .timeout(Duration::from_secs(2))
        .join_timeout(join)
        .build()
        .expect("config")
}

/// Every rank runs `rounds` rounds from rotating roots; returns how many failed anywhere.
fn rounds(ranks: &[TcpBroadcaster], rounds: usize) -> usize {
    let n = ranks.len();
    let results = lens_testkit::on_each_rank(ranks, |b| {
        let mut failed = 0;
        for round in 0..rounds {
            let root = round % n;
            let want = format!("round {round} from {root}").into_bytes();
            match blocking::broadcast(b, root, (b.rank() == root).then_some(want.as_slice())) {
                Ok(got) => assert_eq!(got, want, "rank {} round {round}: wrong payload", b.rank()),
                Err(_) => failed += 1,
            }
        }
        failed
    });
    results.into_iter().max().unwrap_or(0)
}

/// The first frame (with its length prefix) in a recorded byte stream.
fn first_frame(stream: &[u8]) -> Vec<u8> {
    let len = u32::from_le_bytes(stream[..4].try_into().expect("prefix")) as usize;
    stream[..4 + len].to_vec()
}

/// A pair whose rank 1 reaches rank 0 through a relay that records both directions.
fn pair_through_relay(join: Duration) -> (Vec<TcpBroadcaster>, Relay) {
    let hub = TcpBroadcaster::start(cfg(0, 2, "127.0.0.1:0", join)).expect("bind");
    let addr = hub.local_addr().expect("addr").to_string();
    let relay = Relay::new(&addr);
    let one = TcpBroadcaster::start(cfg(1, 2, &relay.addr, join)).expect("connect");
    let ranks = std::thread::scope(|s| {
        let h = s.spawn(|| hub.finish());
        let o = one.finish().expect("rank 1");
        vec![h.join().expect("thread").expect("rank 0"), o]
    });
    (ranks, relay)
}

/// libzmq aborts a ROUTER whose automatic routing id (predictable: unseeded `rand()`) was
/// already claimed by another peer. lens-tcp has no ROUTER: the claim and the plain peer are
/// just bytes that fail the checks, and the job goes on.
#[test]
fn routing_id_claims_cannot_crash_a_rank() {
    let lens_tcp::LoopbackGroup { ranks, addr, .. } =
        common::group_at(3, Duration::from_secs(5), None);
    let addr = addr.to_string();
    let ctx = zmq::Context::new();
    let mut sockets = Vec::new();
    for id in [
        [0u8, 0x6b, 0x8b, 0x45, 0x67],
        [0, 0x6b, 0x8b, 0x45, 0x68],
        [0, 0, 0, 0, 1],
    ] {
        let claim = ctx.socket(zmq::DEALER).expect("socket");
        claim.set_linger(0).expect("linger");
        claim.set_identity(&id).expect("claim an id");
        claim.connect(&format!("tcp://{addr}")).expect("connect");
        claim.send(&b"hello"[..], 0).expect("send");
        sockets.push(claim);
        let plain = ctx.socket(zmq::DEALER).expect("socket");
        plain.set_linger(0).expect("linger");
        plain.connect(&format!("tcp://{addr}")).expect("connect");
        plain.send(&b"hello"[..], 0).expect("send");
        sockets.push(plain);
    }
    assert_eq!(rounds(&ranks, 30), 0, "no round fails");
}

/// A stranger replays a recorded KNOCK thousands of times and never reads: the answers it
/// does not read never block rank 0, which closes the connection; rounds go on.
#[test]
fn never_reading_replayer_cannot_stall_rank_0() {
    let (ranks, relay) = pair_through_relay(Duration::from_secs(10));
    let knock = first_frame(&relay.up.lock().expect("lock")[0]);
    let hub_addr = relay.upstream();
    let started = Instant::now();
    let _a = never_reading(&hub_addr, &knock, 5_000);
    let _b = never_reading(&hub_addr, &knock, 5_000);
    assert_eq!(rounds(&ranks, 40), 0, "no round fails");
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// Hundreds of connections replaying a recorded KNOCK during formation cannot crowd out
/// an honest rank: challenges are per connection and expire with it.
#[test]
fn knock_flood_does_not_crowd_out_an_honest_rank() {
    // Record a KNOCK of this key from one job...
    let (_old, relay) = pair_through_relay(Duration::from_secs(10));
    let knock = first_frame(&relay.up.lock().expect("lock")[0]);
    drop(_old);
    // ...and replay it at a new job's rank 0 from 200 connections before rank 1 knocks.
    let hub =
        TcpBroadcaster::start(cfg(0, 2, "127.0.0.1:0", Duration::from_secs(20))).expect("bind");
    let addr = hub.local_addr().expect("addr").to_string();
    let flood: Vec<_> = (0..200).map(|_| never_reading(&addr, &knock, 3)).collect();
    let started = Instant::now();
    let ranks = std::thread::scope(|s| {
        let h = s.spawn(|| hub.finish());
        let one = TcpBroadcaster::connect(cfg(1, 2, &addr, Duration::from_secs(20)))
            .expect("the honest rank joins");
        vec![h.join().expect("thread").expect("rank 0"), one]
    });
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(rounds(&ranks, 10), 0);
    drop(flood);
}

/// A fake rank 0 on the rendezvous port replays what the real rank 0 said in an earlier job
/// with the same key (CHALLENGE, WELCOME, DATA): the joiner's nonce is not in it, so the new
/// rank 1 never joins and never takes the old job's data as its own.
#[test]
fn fake_rank_0_replaying_an_earlier_job_is_not_believed() {
    let (old, relay) = pair_through_relay(Duration::from_secs(10));
    assert_eq!(rounds(&old, 4), 0);
    drop(old);
    let recorded = relay.down.lock().expect("lock")[0].clone();
    assert!(
        recorded.len() > 200,
        "recorded the old job's answers and rounds"
    );
    let fake = replaying_server(recorded);
    let started = Instant::now();
    match TcpBroadcaster::connect(cfg(1, 2, &fake, Duration::from_secs(2))) {
        Ok(_) => panic!("rank 1 joined a replayed job"),
        Err(Error::Timeout { missing, .. }) => assert_eq!(missing, vec![0]),
        Err(other) => panic!("expected a timeout naming rank 0, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A stranger replays a frame of the live session (rank 1's data, recorded on the wire) on
/// a new connection of its own: rank 0 answers nothing (it used to ask such a connection to
/// prove the key again, a signed frame of the session for anyone who asked), and the job
/// goes on.
#[test]
fn an_in_session_frame_on_a_new_connection_gets_no_answer() {
    let (ranks, relay) = pair_through_relay(Duration::from_secs(10));
    assert_eq!(rounds(&ranks, 4), 0);
    // Rank 1's stream: KNOCK, HELLO, then its rounds' DATA and ACK frames.
    let up = relay.up.lock().expect("lock")[0].clone();
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 4 <= up.len() {
        let len = u32::from_le_bytes(up[at..at + 4].try_into().expect("prefix")) as usize;
        frames.push(up[at..at + 4 + len].to_vec());
        at += 4 + len;
    }
    assert!(frames.len() >= 4, "recorded rank 1's frames");
    // Rounds run meanwhile, so rank 0 reads the stranger's frames whatever else it serves.
    let answered = std::thread::scope(|s| {
        let busy = s.spawn(|| rounds(&ranks, 300));
        let mut stranger = std::net::TcpStream::connect(relay.upstream()).expect("connect");
        for f in &frames[2..] {
            stranger.write_all(f).expect("replay");
        }
        stranger
            .set_read_timeout(Some(Duration::from_millis(700)))
            .expect("timeout");
        let mut buf = [0u8; 256];
        let answered = match stranger.read(&mut buf) {
            Ok(n) => n, // 0: closed, which is fine
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::ConnectionReset
                    ),
                    "{e}"
                );
                0
            }
        };
        assert_eq!(busy.join().expect("rounds"), 0, "no round fails");
        answered
    });
    assert_eq!(answered, 0, "rank 0 answered a stranger");
}

/// A stranger's KNOCK signed with some other key (anyone can send one) does not turn a
/// formation that fails for want of a rank into a key error: rank 0 names the missing rank
/// in an `Error::Timeout`, and the rank that joined hears the same.
#[test]
fn a_forged_knock_does_not_hide_the_missing_rank() {
    let hub =
        TcpBroadcaster::start(cfg(0, 3, "127.0.0.1:0", Duration::from_millis(800))).expect("bind");
    let addr = hub.local_addr().expect("addr").to_string();
    let forged = {
        // A KNOCK of another key, as a stranger would make it.
        let other = TcpBroadcaster::start(
            TcpConfig::builder()
                .rank(0)
                .world_size(3)
                .addr("127.0.0.1:0")
                .key(b"some other key, not the job's one")
                .join_timeout(Duration::from_millis(300))
                .build()
                .expect("config"),
        )
        .expect("bind");
        let relay = Relay::new(&other.local_addr().expect("addr").to_string());
        let knocker = TcpBroadcaster::start(
            TcpConfig::builder()
                .rank(1)
                .world_size(3)
                .addr(&relay.addr)
                .key(b"some other key, not the job's one")
                .join_timeout(Duration::from_millis(300))
                .build()
                .expect("config"),
        )
        .expect("connect");
        let _ = std::thread::scope(|s| {
            let o = s.spawn(|| other.finish());
            let _ = knocker.finish();
            o.join()
        });
        first_frame(&relay.up.lock().expect("lock")[0])
    };
    let one = TcpBroadcaster::start(cfg(1, 3, &addr, Duration::from_secs(3))).expect("connect");
    std::thread::scope(|s| {
        let one = s.spawn(|| one.finish());
        let mut stranger = std::net::TcpStream::connect(&addr).expect("connect");
        stranger.write_all(&forged).expect("forged knock");
        match hub.finish() {
            Err(Error::Timeout { missing, .. }) => assert_eq!(missing, vec![2]),
            other => panic!("expected a timeout naming rank 2, got {other:?}"),
        }
        match one.join().expect("thread") {
            Err(Error::Timeout { missing, .. }) => assert_eq!(missing, vec![2]),
            other => panic!("rank 1: expected a timeout naming rank 2, got {other:?}"),
        }
    });
}

/// A rank that crashes while the group forms and is restarted is admitted in place of its
/// dead connection once it proves the key.
#[test]
fn restart_during_formation_is_admitted() {
    let join = Duration::from_secs(20);
    let hub = TcpBroadcaster::start(cfg(0, 3, "127.0.0.1:0", join)).expect("bind");
    let addr = hub.local_addr().expect("addr").to_string();
    std::thread::scope(|s| {
        let h = s.spawn(|| hub.finish());
        // The first life of rank 1 joins, then dies before the group is complete.
        let first =
            TcpBroadcaster::start(cfg(1, 3, &addr, Duration::from_millis(800))).expect("connect");
        assert!(first.finish().is_err(), "rank 2 is not there yet");
        // Its second life, and rank 2.
        let one = s.spawn(|| TcpBroadcaster::connect(cfg(1, 3, &addr, join)));
        let two = TcpBroadcaster::connect(cfg(2, 3, &addr, join)).expect("rank 2");
        let ranks = vec![
            h.join().expect("thread").expect("rank 0"),
            one.join().expect("thread").expect("rank 1 again"),
            two,
        ];
        assert_eq!(rounds(&ranks, 9), 0);
    });
}

/// A rank with another key is told so at once (`Error::Unauthenticated`); rank 0's own
/// error names the rank that never joined.
#[test]
fn wrong_key_fails_fast_and_is_named() {
    let hub =
        TcpBroadcaster::start(cfg(0, 2, "127.0.0.1:0", Duration::from_secs(2))).expect("bind");
    let addr = hub.local_addr().expect("addr").to_string();
    std::thread::scope(|s| {
        let h = s.spawn(|| hub.finish());
        let wrong = TcpConfig::builder()
            .rank(1)
            .world_size(2)
            .addr(&addr)
            .key(b"a different key of 32 bytes!!!!!")
            .join_timeout(Duration::from_secs(30))
            .build()
            .expect("config");
        let started = Instant::now();
        match TcpBroadcaster::connect(wrong) {
            Err(Error::Unauthenticated { reason }) => assert!(reason.contains("key"), "{reason}"),
            other => panic!("expected Unauthenticated, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "fast: {:?}",
            started.elapsed()
        );
        // Rank 0 cannot tell a rank with another key from a stranger (anyone can send a
        // KNOCK with a wrong tag): its error names the rank that never joined.
        match h.join().expect("thread") {
            Err(Error::Timeout { missing, .. }) => assert_eq!(missing, vec![1]),
            other => panic!("rank 0: expected a timeout naming rank 1, got {other:?}"),
        }
    });
}

/// A world-size disagreement is reported at once with both sizes.
#[test]
fn world_size_disagreement_names_both_sizes() {
    let hub =
        TcpBroadcaster::start(cfg(0, 2, "127.0.0.1:0", Duration::from_secs(2))).expect("bind");
    let addr = hub.local_addr().expect("addr").to_string();
    std::thread::scope(|s| {
        let h = s.spawn(|| hub.finish());
        let started = Instant::now();
        match TcpBroadcaster::connect(cfg(1, 3, &addr, Duration::from_secs(30))) {
            Err(Error::Closed { reason, .. }) => {
                assert!(
                    reason.contains("world size 3") && reason.contains("has 2"),
                    "{reason}"
                )
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        match h.join().expect("thread") {
            Err(Error::Mismatch {
                about: Disagreement::Group,
                reason,
            }) => {
                assert!(reason.contains("world size 3"), "{reason}")
            }
            other => panic!("rank 0: expected Mismatch, got {other:?}"),
        }
    });
}

/// Rank 0 binds the name it is given: `localhost` (IPv4 and IPv6) and `[::1]` (skipped,
/// with a line on stderr, where the machine has no IPv6 loopback).
#[test]
#[allow(clippy::print_stderr)]
fn rank_0_binds_names_and_ipv6() {
    for host in ["localhost", "[::1]"] {
        let hub =
            match TcpBroadcaster::start(cfg(0, 2, &format!("{host}:0"), Duration::from_secs(10))) {
                Ok(h) => h,
                Err(e) if host == "[::1]" => {
                    eprintln!("skipping {host}: no IPv6 loopback here ({e})");
                    continue;
                }
                Err(e) => panic!("{host}: {e}"),
            };
        let port = hub.local_addr().expect("addr").port();
        let ranks = std::thread::scope(|s| {
            let h = s.spawn(|| hub.finish());
            let one = TcpBroadcaster::connect(cfg(
                1,
                2,
                &format!("{host}:{port}"),
                Duration::from_secs(10),
            ))
            .unwrap_or_else(|e| panic!("{host}: {e}"));
            vec![h.join().expect("thread").expect("rank 0"), one]
        });
        assert_eq!(rounds(&ranks, 4), 0, "{host}");
    }
}

/// Deadlines that would overflow the clock are configuration errors, not panics.
#[test]
fn huge_durations_are_config_errors() {
    let b = || {
        TcpConfig::builder()
            .rank(0)
            .world_size(2)
            .addr("127.0.0.1:0")
            .key(common::KEY)
    };
    for d in [
        Duration::MAX,
        Duration::from_secs(u64::MAX / 2),
        lens_core::backend::MAX_TIMEOUT * 2,
    ] {
        assert!(
            matches!(b().timeout(d).build(), Err(Error::Config { .. })),
            "{d:?}"
        );
        assert!(
            matches!(b().join_timeout(d).build(), Err(Error::Config { .. })),
            "{d:?}"
        );
    }
    for v in ["1e19", "inf", "NaN", "-1", "0"] {
        let env = |k: &str| match k {
            "RANK" => Some("0".to_owned()),
            "WORLD_SIZE" => Some("2".to_owned()),
            "LENS_TCP_ADDR" => Some("127.0.0.1:0".to_owned()),
            "LENS_TCP_KEY" => Some("a job key of at least sixteen bytes".to_owned()),
            "LENS_TCP_TIMEOUT" => Some(v.to_owned()),
            _ => None,
        };
        match TcpConfig::from_vars(env) {
            Err(Error::Config { setting, reason }) => {
                assert!(reason.contains("LENS_TCP_TIMEOUT"), "{v}: {reason}");
                assert_eq!(
                    setting.as_deref(),
                    Some("LENS_TCP_TIMEOUT"),
                    "{v}: {reason}"
                );
            }
            other => panic!("{v}: expected a Config error, got {other:?}"),
        }
    }
}

/// Another program on the rendezvous port (here one that answers with an SSH banner) is
/// named as such in the joiner's error, not reported as a bare timeout.
#[test]
fn a_foreign_listener_on_the_rendezvous_port_is_named() {
    let foreign = replaying_server(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n".to_vec());
    match TcpBroadcaster::connect(cfg(1, 2, &foreign, Duration::from_millis(800))) {
        Err(Error::Closed { reason, .. }) => {
            assert!(reason.contains("another program"), "{reason}")
        }
        other => panic!("expected an error naming another program, got {other:?}"),
    }
}
