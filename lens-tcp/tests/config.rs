//! Configuration from code and from the environment, one row per case.

use std::time::Duration;

use lens_core::Error;
use lens_tcp::TcpConfig;

fn from(vars: &[(&str, &str)]) -> Result<TcpConfig, Error> {
    TcpConfig::from_vars(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    })
}

const KEY: &str = "sixteen-byte-key-or-longer";

#[test]
fn environment_table() {
    let key_file = std::env::temp_dir().join(format!("lens-tcp-key-{}", std::process::id()));
    std::fs::write(&key_file, format!("{KEY}\n")).expect("write key file");
    let key_path = key_file.to_str().expect("utf-8").to_owned();
    let base = [
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("LENS_TCP_KEY", KEY),
    ];
    let with =
        |extra: &[(&'static str, &'static str)], drop: &[&str]| -> Vec<(&'static str, String)> {
            let mut v: Vec<(&'static str, String)> = base
                .iter()
                .filter(|(k, _)| !drop.contains(k))
                .map(|(k, v)| (*k, (*v).to_owned()))
                .collect();
            v.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
            v
        };
    let rows: Vec<(
        &str,
        Vec<(&str, String)>,
        Result<(usize, usize, &str), &str>,
    )> = vec![
        (
            "torchrun variables",
            with(&[], &[]),
            Ok((2, 4, "10.0.0.1:29500")),
        ),
        (
            "LENS_TCP_ADDR wins",
            with(&[("LENS_TCP_ADDR", "127.0.0.1:4000")], &[]),
            Ok((2, 4, "127.0.0.1:4000")),
        ),
        (
            "key from a file",
            {
                let mut v = with(&[], &["LENS_TCP_KEY"]);
                v.push(("LENS_TCP_KEY_FILE", key_path.clone()));
                v
            },
            Ok((2, 4, "10.0.0.1:29500")),
        ),
        (
            "no address",
            with(&[], &["MASTER_ADDR"]),
            Err("MASTER_ADDR"),
        ),
        ("no key", with(&[], &["LENS_TCP_KEY"]), Err("LENS_TCP_KEY")),
        (
            "missing key file",
            {
                let mut v = with(&[], &["LENS_TCP_KEY"]);
                v.push(("LENS_TCP_KEY_FILE", "/nonexistent/lens-key".to_owned()));
                v
            },
            Err("cannot read"),
        ),
        (
            "short key",
            with(&[("LENS_TCP_KEY", "short")], &["LENS_TCP_KEY"]),
            Err("at least 16"),
        ),
        (
            "bad port",
            with(&[("MASTER_PORT", "http")], &["MASTER_PORT"]),
            Err("host:port"),
        ),
        (
            "bad timeout",
            with(&[("LENS_TCP_TIMEOUT", "soon")], &[]),
            Err("LENS_TCP_TIMEOUT"),
        ),
        (
            "bad fan-out",
            with(&[("LENS_TCP_FAN_OUT", "wide")], &[]),
            Err("LENS_TCP_FAN_OUT"),
        ),
        (
            "zero fan-out",
            with(&[("LENS_TCP_FAN_OUT", "0")], &[]),
            Err("fan-out"),
        ),
        (
            "no rank",
            with(&[], &["RANK", "WORLD_SIZE"]),
            Err("no launcher variables"),
        ),
        (
            "source returns queued",
            with(&[("LENS_TCP_SOURCE_RETURNS", "Queued")], &[]),
            Ok((2, 4, "10.0.0.1:29500")),
        ),
        (
            "unknown source_returns",
            with(&[("LENS_TCP_SOURCE_RETURNS", "later")], &[]),
            Err("LENS_TCP_SOURCE_RETURNS=\"later\": expected \"delivered\" or \"queued\""),
        ),
    ];
    for (why, vars, want) in rows {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        match (from(&vars), want) {
            (Ok(c), Ok((rank, world, addr))) => {
                assert_eq!(
                    (c.rank(), c.world_size(), c.addr()),
                    (rank, world, addr),
                    "{why}"
                );
                assert!(
                    !format!("{c:?}").contains(KEY),
                    "{why}: Debug must not show the key"
                );
            }
            (Err(Error::Config { reason, .. }), Err(needle)) => assert!(
                reason.contains(needle),
                "{why}: {reason:?} should mention {needle:?}"
            ),
            (got, want) => panic!("{why}: got {got:?}, expected {want:?}"),
        }
    }
    let _ = std::fs::remove_file(&key_file);
}

/// `LENS_TCP_SOURCE_RETURNS` sets the default; code overrides it, and a setter clears a
/// malformed value.
#[test]
fn source_returns_from_the_environment_and_from_code() {
    use lens_tcp::{SourceReturns, TcpConfigBuilder};
    let vars = |v: &'static str| {
        move |k: &str| match k {
            "RANK" => Some("0".to_owned()),
            "WORLD_SIZE" => Some("2".to_owned()),
            "LENS_TCP_ADDR" => Some("127.0.0.1:1".to_owned()),
            "LENS_TCP_KEY" => Some(KEY.to_owned()),
            "LENS_TCP_SOURCE_RETURNS" => Some(v.to_owned()),
            _ => None,
        }
    };
    let built = |b: TcpConfigBuilder| b.build().expect("config").source_returns();
    assert_eq!(
        TcpConfig::builder()
            .rank(0)
            .world_size(2)
            .addr("127.0.0.1:1")
            .key(KEY)
            .build()
            .expect("config")
            .source_returns(),
        SourceReturns::Delivered,
        "the default"
    );
    assert_eq!(
        built(TcpConfigBuilder::from_vars(vars(" queued "))),
        SourceReturns::Queued
    );
    assert_eq!(
        built(TcpConfigBuilder::from_vars(vars("queued")).source_returns(SourceReturns::Delivered)),
        SourceReturns::Delivered,
        "code wins over the environment"
    );
    assert_eq!(
        built(TcpConfigBuilder::from_vars(vars("soon")).source_returns(SourceReturns::Queued)),
        SourceReturns::Queued,
        "the setter clears a malformed variable"
    );
}

#[test]
fn builder_rejects_bad_values() {
    let ok = || {
        TcpConfig::builder()
            .rank(0)
            .world_size(2)
            .addr("127.0.0.1:0")
            .key(KEY)
    };
    assert!(ok().build().is_ok());
    assert!(ok().rank(2).build().is_err(), "rank not below world size");
    assert!(ok().world_size(0).build().is_err());
    assert!(ok().timeout(Duration::ZERO).build().is_err());
    assert!(ok().addr("no-port").build().is_err());
    assert!(ok().addr(":29500").build().is_err(), "empty host");
    assert!(ok().addr("[::1]:29500").build().is_ok(), "IPv6 in brackets");
    assert!(
        ok().world_size(lens_tcp::MAX_WORLD).build().is_ok(),
        "the largest world"
    );
    match ok().world_size(lens_tcp::MAX_WORLD + 1).build() {
        Err(lens_core::Error::Config { reason, .. }) => {
            assert!(
                reason.contains(&lens_tcp::MAX_WORLD.to_string()),
                "{reason}"
            )
        }
        other => panic!("a world over MAX_WORLD: {other:?}"),
    }
    assert!(
        TcpConfig::builder()
            .rank(0)
            .world_size(2)
            .key(KEY)
            .build()
            .is_err(),
        "address required"
    );
    assert!(
        TcpConfig::builder()
            .rank(0)
            .world_size(2)
            .addr("h:1")
            .build()
            .is_err(),
        "key required"
    );
}

/// The launcher's local rank is kept (the trace's `nv.dl.local_rank`), code can set it, and
/// a one-rank group reports it through `Broadcaster::local_rank`.
#[test]
fn the_local_rank_is_kept() {
    let base = [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LENS_TCP_ADDR", "127.0.0.1:0"),
        ("LENS_TCP_KEY", KEY),
    ];
    let config = from(&base).expect("config");
    assert_eq!(config.local_rank(), None, "torchrun without LOCAL_RANK");
    let mut vars = base.to_vec();
    vars.push(("LOCAL_RANK", "0"));
    assert_eq!(from(&vars).expect("config").local_rank(), Some(0));
    let config = lens_tcp::TcpConfigBuilder::from_vars(|k| {
        base.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    })
    .local_rank(0)
    .build()
    .expect("config");
    assert_eq!(config.local_rank(), Some(0));
    let group = lens_tcp::TcpBroadcaster::connect(config).expect("a group of one");
    assert_eq!(lens_core::Broadcaster::local_rank(&group), Some(0));
}

/// Rank 0 finding its rendezvous port taken (under torchrun, torch's store holds
/// MASTER_PORT) is told which variable picks another.
#[test]
fn a_taken_rendezvous_port_names_lens_tcp_addr() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = taken.local_addr().expect("addr").to_string();
    let config = TcpConfig::builder()
        .rank(0)
        .world_size(2)
        .addr(addr.clone())
        .key(KEY)
        .build()
        .expect("config");
    let err = lens_tcp::TcpBroadcaster::start(config).expect_err("the port is taken");
    let text = err.to_string();
    assert!(
        text.contains("LENS_TCP_ADDR") && text.contains(&addr),
        "{text}"
    );
}

/// `LENS_TCP_SPIN_US` and the launchers' local world size: one row per case, the spin and
/// local world size built, or the words the error must hold.
#[test]
fn spin_and_local_world_size_from_the_environment_and_from_code() {
    use lens_tcp::{DEFAULT_SPIN, MAX_SPIN, TcpConfigBuilder};
    type Want = Result<(Duration, usize), &'static [&'static str]>;
    let us = Duration::from_micros;
    let rows: Vec<(
        &str,
        Vec<(&str, &str)>,
        Option<fn(TcpConfigBuilder) -> TcpConfigBuilder>,
        Want,
    )> = vec![
        (
            "the defaults: 100 µs, the whole world local",
            vec![],
            None,
            Ok((DEFAULT_SPIN, 8)),
        ),
        (
            "a spin from the environment",
            vec![("LENS_TCP_SPIN_US", " 250 ")],
            None,
            Ok((us(250), 8)),
        ),
        (
            "0 turns polling off",
            vec![("LENS_TCP_SPIN_US", "0")],
            None,
            Ok((Duration::ZERO, 8)),
        ),
        (
            "a malformed spin names its variable",
            vec![("LENS_TCP_SPIN_US", "50us")],
            None,
            Err(&["LENS_TCP_SPIN_US=\"50us\"", "microseconds"]),
        ),
        (
            "code fixes a malformed spin",
            vec![("LENS_TCP_SPIN_US", "fast")],
            Some(|b| b.spin(Duration::from_micros(30))),
            Ok((us(30), 8)),
        ),
        (
            "a spin over the most allowed",
            vec![("LENS_TCP_SPIN_US", "10001")],
            None,
            Err(&["10001 µs", "LENS_TCP_SPIN_US", "10000 µs"]),
        ),
        (
            "the most allowed",
            vec![("LENS_TCP_SPIN_US", "10000")],
            None,
            Ok((MAX_SPIN, 8)),
        ),
        (
            "torchrun's local world size",
            vec![("LOCAL_WORLD_SIZE", "4")],
            None,
            Ok((DEFAULT_SPIN, 4)),
        ),
        (
            "torchrun's comes before Open MPI's",
            vec![
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                ("LOCAL_WORLD_SIZE", "4"),
            ],
            None,
            Ok((DEFAULT_SPIN, 4)),
        ),
        (
            "Open MPI's",
            vec![("OMPI_COMM_WORLD_LOCAL_SIZE", "2")],
            None,
            Ok((DEFAULT_SPIN, 2)),
        ),
        (
            "MPICH's",
            vec![("MPI_LOCALNRANKS", "3")],
            None,
            Ok((DEFAULT_SPIN, 3)),
        ),
        (
            "Slurm's",
            vec![("SLURM_NTASKS_PER_NODE", "1")],
            None,
            Ok((DEFAULT_SPIN, 1)),
        ),
        (
            "a malformed local world size names its variable",
            vec![("OMPI_COMM_WORLD_LOCAL_SIZE", "two")],
            None,
            Err(&["OMPI_COMM_WORLD_LOCAL_SIZE=\"two\""]),
        ),
        (
            "a launcher's local world larger than this group: the group may be a part of its job",
            vec![("LOCAL_WORLD_SIZE", "9")],
            None,
            Ok((DEFAULT_SPIN, 8)),
        ),
        (
            "a launcher that says no rank is on this host",
            vec![("LOCAL_WORLD_SIZE", "0")],
            None,
            Err(&["LOCAL_WORLD_SIZE=\"0\"", "at least 1"]),
        ),
        (
            "a local world set in code larger than the world",
            vec![],
            Some(|b| b.local_world_size(9)),
            Err(&["local world size of 9", "world size, 8"]),
        ),
        (
            "no rank on this host, in code",
            vec![],
            Some(|b| b.local_world_size(0)),
            Err(&["local world size of 0"]),
        ),
        (
            "code wins over the launcher",
            vec![("LOCAL_WORLD_SIZE", "4")],
            Some(|b| b.local_world_size(1)),
            Ok((DEFAULT_SPIN, 1)),
        ),
    ];
    for (why, extra, code, want) in rows {
        let lookup = |k: &str| {
            let base = [
                ("RANK", "0"),
                ("WORLD_SIZE", "8"),
                ("LENS_TCP_ADDR", "127.0.0.1:1"),
                ("LENS_TCP_KEY", KEY),
            ];
            extra
                .iter()
                .chain(base.iter())
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        let mut b = TcpConfigBuilder::from_vars(lookup);
        if let Some(code) = code {
            b = code(b);
        }
        match (b.build(), want) {
            (Ok(c), Ok(want)) => assert_eq!((c.spin(), c.local_world_size()), want, "{why}"),
            (Err(e), Err(words)) => {
                let text = e.to_string();
                for w in words {
                    assert!(text.contains(w), "{why}: {text:?} lacks {w:?}");
                }
            }
            (got, want) => panic!("{why}: got {got:?}, want {want:?}"),
        }
    }
}
