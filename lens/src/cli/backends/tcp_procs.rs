//! `lens bench --backend tcp --processes`: every rank its own process of this program, as
//! in a job. The threads of one process share its I/O and its scheduler's view; a job's
//! ranks do not, so only this mode measures what a job of processes costs: per round the
//! slowest rank's time, rank 0's CPU and the CPU of all ranks together (on a machine with
//! fewer cores than ranks, that sum is the floor under the round's time).
//!
//! The baselines have lens's layout: the same tree (a star unless `--fan-out`), each
//! parent sending the bytes to its children and acknowledging up once its children have:
//! `raw` over bare TCP sockets (the transport lens's group runs on), `raw_zmq` over bare
//! ZeroMQ ROUTER/DEALER sockets (no framing, no authentication; what lens's group ran on
//! until December 2026), in a ZeroMQ context of its own: one I/O thread. (Until 5 December
//! 2026 the ZeroMQ baseline shared the barrier's context, so the I/O thread that had just
//! carried the barrier carried the raw round too, while lens's round woke a second one:
//! with 64 to 1,024 processes on 2 cores, about a third more wake-ups per rank and round,
//! and most of lens's 1.3-1.4 times raw in docs/SCALING.md.)
//!
//! The ranks meet twice: lens's group (rank 0's address, a fresh job key), and a
//! directory over ZeroMQ at rank 0, whose address rank 0 sends with one lens broadcast.
//! Every rank binds its baselines' sockets and its barrier's on ephemeral ports of its
//! address and tells rank 0 their endpoints; rank 0 sends the table back, and each rank
//! connects to its parents. The barrier before each round is a tree of fan-out 8 over bare
//! sockets of its own, so that rank 0, whose CPU is the figure that carries to separate
//! hosts, hears from at most 8 ranks' barrier messages while its round is timed (a star
//! barrier charged it for every rank's). Until 6 December 2026 it ran over ZeroMQ: at 256
//! processes its I/O threads cost the machine more CPU than the round it separated and
//! stretched every timed round (the raw round took 19-21 ms there, 7-8 ms behind bare
//! sockets), which made lens/raw look closer to 1 than it is (docs/SCALING.md).

use std::io::{BufRead as _, BufReader, Read};
use std::time::Duration;

use lens::blocking;
use lens::tcp::{TcpBroadcaster, TcpConfigBuilder};
use serde_json::json;

use super::super::args::BenchArgs;
use super::super::backend::BenchReport;
use super::super::hosts::Placement;
use super::super::launcher::{reason_of, run_collect};
use super::super::measure::{Measured, Plan, Timed, run_rank, slowest};
use super::job_key::{KeyFile, random_hex};
use super::tcp_raw::{
    RawTree, TcpRank, bound, children, greeted, id, parent, rank_of, socket, up_to, wait_in, zerr,
};
use super::tcp_raw_sockets;

/// What a rank process prints: its round times and CPU per round, as JSON.
const RANK_LINE: &str = "lens-bench-rank ";

/// Fan-out of the barrier's tree: whatever lens's layout, rank 0 hears from at most this
/// many ranks between rounds, so the barrier adds little to the CPU its round is charged.
const BARRIER_FAN_OUT: usize = 8;

/// Rank `rank`'s sockets of a tree of fan-out `k` over `n` ranks: `down` is already bound,
/// `endpoint(p)` is parent `p`'s address.
fn tree_of(
    ctx: &zmq::Context,
    (rank, n, k): (usize, usize, usize),
    down: zmq::Socket,
    endpoint: impl Fn(usize) -> Option<String>,
) -> Result<RawTree, String> {
    let up = match rank {
        0 => None,
        r => {
            let ep = endpoint(parent(r, k)).ok_or("no parent in the directory")?;
            Some(up_to(ctx, r, &ep)?)
        }
    };
    let kids: Vec<usize> = children(rank, n, k).collect();
    greeted(&down, &kids)?;
    Ok(RawTree {
        up,
        down,
        children: kids,
    })
}

/// This process's rank: joins lens's group and the raw tree, runs `plan`, prints its
/// figures on one line for the process that started it.
pub(crate) fn rank_main(args: &BenchArgs, plan: &Plan, rank: usize) -> Result<(), String> {
    let (Some(n), Some(addr)) = (args.spawned.world, &args.spawned.addr) else {
        return Err("a bench rank needs --world and --addr".into());
    };
    let k = args.fan_out.unwrap_or(n.saturating_sub(1).max(1));
    let mut b = TcpConfigBuilder::from_env()
        .rank(rank)
        .world_size(n)
        .addr(addr.clone())
        .timeout(Duration::from_secs(60));
    if let Some(k) = args.fan_out {
        b = b.fan_out(k);
    }
    let lens = b
        .build()
        .and_then(TcpBroadcaster::connect)
        .map_err(|e| format!("rank {rank}: {e}"))?;
    let ctx = zmq::Context::new();
    let raw_ctx = zmq::Context::new();
    let down = socket(&raw_ctx, zmq::ROUTER)?;
    // This rank's line of the directory: its raw ZeroMQ tree's address, its raw sockets',
    // its barrier's. Where the other ranks reach this one: its simulated host's address,
    // else loopback.
    let host = std::env::var(lens::tcp::env::HOST).unwrap_or_else(|_| "127.0.0.1".into());
    let (listener, sockets_at) = tcp_raw_sockets::listen(&host)?;
    let (bar_listener, barrier_at) = tcp_raw_sockets::listen(&host)?;
    let mine = format!("{} {sockets_at} {barrier_at}", bound(&down, &host)?);
    // The directory: every rank's line, through rank 0 (a star used once).
    // The directory's socket lives as long as the rank: dropped at once (linger 0), it could
    // take the table with it before it left.
    let (table, _directory): (Vec<String>, zmq::Socket) = if rank == 0 {
        let socket = socket(&ctx, zmq::ROUTER)?;
        let at = bound(&socket, &host)?;
        blocking::broadcast(&lens, 0, Some(at.as_bytes())).map_err(|e| e.to_string())?;
        let mut table = vec![String::new(); n];
        table[0] = mine;
        for _ in 1..n {
            wait_in(&socket, "the directory")?;
            let m = socket.recv_multipart(0).map_err(zerr)?;
            let (Some(who), Some(ep)) = (m.first().and_then(|i| rank_of(i)), m.get(1)) else {
                return Err("a malformed directory entry".into());
            };
            if let Some(slot) = table.get_mut(who) {
                *slot = String::from_utf8_lossy(ep).into_owned();
            }
        }
        let all = table.join("\n").into_bytes();
        for r in 1..n {
            socket
                .send_multipart([id(r), all.clone()], 0)
                .map_err(zerr)?;
        }
        (table, socket)
    } else {
        let at = blocking::broadcast(&lens, 0, None).map_err(|e| e.to_string())?;
        let socket = socket(&ctx, zmq::DEALER)?;
        socket.set_identity(&id(rank)).map_err(zerr)?;
        socket
            .connect(&String::from_utf8_lossy(&at))
            .map_err(zerr)?;
        socket.send(mine.as_bytes(), 0).map_err(zerr)?;
        wait_in(&socket, "the directory")?;
        let all = socket.recv_bytes(0).map_err(zerr)?;
        let table = String::from_utf8_lossy(&all)
            .lines()
            .map(str::to_owned)
            .collect();
        (table, socket)
    };
    let field = |r: usize, i: usize| {
        table
            .get(r)
            .and_then(|l| l.split(' ').nth(i))
            .map(str::to_owned)
    };
    // The raw tree in lens's layout, and the barrier's tree: each rank greets its parent,
    // each parent waits for its children.
    let raw_zmq = tree_of(&raw_ctx, (rank, n, k), down, |p| field(p, 0))?;
    // The raw sockets: each rank connects to its parent, then accepts its children (the
    // kernel holds a connection until it is accepted).
    let up_at = |fan_out: usize, i: usize| match rank {
        0 => Ok(None),
        r => {
            let at = field(parent(r, fan_out), i).ok_or("no parent in the directory")?;
            tcp_raw_sockets::up_to(r, &at).map(Some)
        }
    };
    let raw = tcp_raw_sockets::tree((rank, n, k), &listener, up_at(k, 1)?)?;
    // The barrier: bare sockets too, so that the rounds it separates share the machine
    // with as little of it as can be.
    let mut barrier = tcp_raw_sockets::tree(
        (rank, n, BARRIER_FAN_OUT),
        &bar_listener,
        up_at(BARRIER_FAN_OUT, 2)?,
    )?;
    let mut me = TcpRank { lens, raw, raw_zmq };
    let timed = run_rank(&mut me, &mut || barrier.barrier(), plan)?;
    println!(
        "{RANK_LINE}{}",
        json!({"times": timed.times, "cpu_us": timed.cpu_us})
    );
    Ok(())
}

/// What a rank process printed: its times per operation and CPU per round.
type Printed = Option<(Vec<Vec<f64>>, Vec<f64>)>;

fn read_rank_line(r: BufReader<Box<dyn Read + Send>>) -> Printed {
    let line = r
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix(RANK_LINE).map(str::to_owned))?;
    let v: serde_json::Value = serde_json::from_str(&line).ok()?;
    let times = serde_json::from_value(v.get("times")?.clone()).ok()?;
    let cpu = serde_json::from_value(v.get("cpu_us")?.clone()).ok()?;
    Some((times, cpu))
}

/// Starts `n` rank processes per group size and gathers their figures.
pub(crate) fn bench(args: &BenchArgs, baselines: &[&'static str]) -> Result<BenchReport, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut groups = Vec::new();
    let mut places = Vec::new();
    for &n in &args.ranks {
        let place = Placement::new(&args.hosts, n)?;
        let addr = place.rendezvous();
        let key = KeyFile::new(&random_hex(32)?)?;
        let command = |rank: usize| {
            let mut c = place.command(rank, &exe);
            c.args([
                "bench",
                "--backend",
                "tcp",
                "--iters",
                &args.iters.to_string(),
            ])
            .args(["--rank", &rank.to_string(), "--world", &n.to_string()])
            .args(["--addr", &addr])
            .env(lens::tcp::env::KEY_FILE, &key.0)
            .env_remove(lens::tcp::env::KEY);
            if let Some(k) = args.fan_out {
                c.args(["--fan-out", &k.to_string()]);
            }
            if let Some(op) = &args.only {
                c.args(["--only", op]);
            }
            c
        };
        // Generous: four operations, each round up to about a millisecond per rank.
        let rounds = 4 * (args.iters + 200);
        let deadline = Duration::from_secs(120)
            + Duration::from_micros(u64::try_from(rounds * n * 1000).unwrap_or(u64::MAX));
        let exited = run_collect(n, command, deadline, read_rank_line)?;
        let mut per_rank = Vec::with_capacity(n);
        let mut cpu = Vec::with_capacity(n);
        for (rank, e) in exited.into_iter().enumerate() {
            match e.out {
                Some((times, c)) if e.ok => {
                    per_rank.push(times);
                    cpu.push(c);
                }
                _ => return Err(format!("rank {rank}: {}", reason_of(rank, &e.stderr))),
            }
        }
        let ops = cpu.first().map_or(0, Vec::len);
        let cpu_all_us = (0..ops)
            .map(|op| cpu.iter().filter_map(|c| c.get(op)).sum())
            .collect();
        let mut m = Measured::new(
            n,
            baselines,
            Timed {
                times: slowest(per_rank),
                cpu_us: cpu.first().cloned().unwrap_or_default(),
            },
        );
        m.cpu_all_us = cpu_all_us;
        groups.push(m);
        places.push(place.describe());
    }
    let shape = args
        .fan_out
        .map_or("a star".to_owned(), |k| format!("a tree of fan-out {k}"));
    Ok(BenchReport {
        setting: format!(
            "{}, one process per rank, lens and raw as {shape}; cpu_us is rank 0's, cpu_all every rank's together",
            places.join("; ")
        ),
        groups,
    })
}
