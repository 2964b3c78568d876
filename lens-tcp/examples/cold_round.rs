//! A member's round from cold caches, for a cache simulator: two ranks on loopback (threads),
//! rank 1 sweeping a buffer larger than the last-level cache before each round, as hundreds
//! of processes sharing a few cores leave each other's caches. Under callgrind's cache
//! model the member thread's last-level misses per round are what a round costs a process
//! that runs it cold (docs/SCALING.md); `raw` runs the bench's bare-socket baseline the same
//! way (a length-prefixed frame down, one byte back).
//!
//! ```text
//! cargo build --release -p lens-tcp --example cold_round
//! valgrind --tool=callgrind --cache-sim=yes --LL=8388608,16,64 --separate-threads=yes \
//!     target/release/examples/cold_round lens 300 16
//! ```
//!
//! Arguments: `lens` or `raw`, the rounds (300), the sweep in MiB (16: twice the simulated
//! last-level cache).

use std::error::Error;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use lens_core::{Broadcaster as _, blocking};

/// The carrier's size in the bench.
const CARRIER: usize = 116;

/// Touches one byte of every cache line of `buf`, so that what the round touches next is
/// no longer cached.
fn sweep(buf: &mut [u8]) {
    let mut s = 0u8;
    for i in (0..buf.len()).step_by(64) {
        s = s.wrapping_add(buf[i]);
        buf[i] = s;
    }
    std::hint::black_box(s);
}

/// Rank 0 lets the member reach its wait before each round, as the bench's barrier does.
fn pause() {
    std::thread::sleep(Duration::from_micros(200));
}

fn raw(rounds: usize, sweep_bytes: usize) -> Result<(), Box<dyn Error>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::scope(|s| {
        let member = s.spawn(move || -> std::io::Result<()> {
            let mut up = TcpStream::connect(addr)?;
            up.set_nodelay(true)?;
            let mut cold = vec![0u8; sweep_bytes];
            let mut frame = [0u8; CARRIER];
            for _ in 0..rounds {
                sweep(&mut cold);
                let mut len = [0u8; 4];
                up.read_exact(&mut len)?;
                let n = (u32::from_le_bytes(len) as usize).min(CARRIER);
                up.read_exact(&mut frame[..n])?;
                up.write_all(&[1])?;
            }
            Ok(())
        });
        let (mut down, _) = listener.accept()?;
        down.set_nodelay(true)?;
        let mut frame = u32::try_from(CARRIER)?.to_le_bytes().to_vec();
        frame.extend_from_slice(&[7; CARRIER]);
        for _ in 0..rounds {
            pause();
            down.write_all(&frame)?;
            down.read_exact(&mut [0u8])?;
        }
        member.join().map_err(|_| "the member panicked")??;
        Ok(())
    })
}

fn lens(rounds: usize, sweep_bytes: usize) -> Result<(), Box<dyn Error>> {
    let group = lens_tcp::loopback_group(2, |b| {
        b.key("a job key of at least 16 bytes")
            .timeout(Duration::from_secs(30))
    })?;
    let payload = [7u8; CARRIER];
    std::thread::scope(|s| {
        let ranks: Vec<_> = group
            .ranks
            .iter()
            .map(|b| {
                s.spawn(move || -> lens_core::Result<()> {
                    let mine = (b.rank() == 0).then_some(&payload[..]);
                    let mut cold = vec![0u8; if b.rank() == 0 { 0 } else { sweep_bytes }];
                    for _ in 0..rounds {
                        if b.rank() == 0 {
                            pause();
                        } else {
                            sweep(&mut cold);
                        }
                        std::hint::black_box(blocking::broadcast(b, 0, mine)?);
                    }
                    Ok(())
                })
            })
            .collect();
        for r in ranks {
            r.join().map_err(|_| "a rank panicked")??;
        }
        Ok(())
    })
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "lens".into());
    let rounds = args.next().map_or(Ok(300), |a| a.parse())?;
    let sweep_mib: usize = args.next().map_or(Ok(16), |a| a.parse())?;
    match which.as_str() {
        "raw" => raw(rounds, sweep_mib << 20),
        "lens" => lens(rounds, sweep_mib << 20),
        other => Err(format!("{other}: `lens` or `raw`").into()),
    }
}
