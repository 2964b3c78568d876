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
//! Arguments: `lens`, `lens_cx` (a trace context's round: the carrier's codec as well) or
//! `raw`, the rounds (300), the sweep in MiB (16: twice the simulated last-level cache).
//!
//! Run natively it prints the member thread's CPU time per round (its round only, the sweep
//! left out: user and system time, so waiting costs nothing), median and mean: what the
//! round costs a member on this CPU when it starts cold, as in a large group.

// An example's report is what it prints.
#![allow(clippy::print_stdout)]

use std::error::Error;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

#[allow(unsafe_code)]
mod clock {
    /// CPU time the calling thread has used, in ns (user and system).
    pub(super) fn thread_cpu_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write; the clock id is one every Linux has.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc != 0 {
            return 0;
        }
        u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(ts.tv_nsec).unwrap_or(0)
    }

    /// User and system time the calling thread has used, in µs.
    pub(super) fn thread_user_sys_us() -> (u64, u64) {
        // SAFETY: an all-zero rusage is a valid value to overwrite.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid rusage to write.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        if rc != 0 {
            return (0, 0);
        }
        let us = |t: libc::timeval| {
            u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0)
        };
        (us(ru.ru_utime), us(ru.ru_stime))
    }
}

/// The member's CPU per round: one sample a round, its round only.
#[derive(Default)]
struct Cpu(Vec<u64>);

impl Cpu {
    fn time<T>(&mut self, round: impl FnOnce() -> T) -> T {
        let from = clock::thread_cpu_ns();
        let out = round();
        self.0.push(clock::thread_cpu_ns().saturating_sub(from));
        out
    }

    fn print(mut self, which: &str, since: (u64, u64)) {
        let (u, s) = clock::thread_user_sys_us();
        println!(
            "{which}: user {} µs, system {} µs in all",
            u.saturating_sub(since.0),
            s.saturating_sub(since.1)
        );
        self.0.sort_unstable();
        let n = self.0.len().max(1);
        let mean = self.0.iter().sum::<u64>() as f64 / n as f64;
        let median = self.0.get(n / 2).copied().unwrap_or(0);
        println!(
            "{which}: member CPU per round: median {:.2} µs, mean {:.2} µs ({} rounds)",
            median as f64 / 1e3,
            mean / 1e3,
            self.0.len()
        );
    }
}

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
            let mut cpu = Cpu::default();
            let since = clock::thread_user_sys_us();
            for _ in 0..rounds {
                sweep(&mut cold);
                cpu.time(|| -> std::io::Result<()> {
                    let mut len = [0u8; 4];
                    up.read_exact(&mut len)?;
                    let n = (u32::from_le_bytes(len) as usize).min(CARRIER);
                    up.read_exact(&mut frame[..n])?;
                    up.write_all(&[1])
                })?;
            }
            cpu.print("raw", since);
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

/// A context with a sampled span, as a training step's.
fn source_context() -> opentelemetry::Context {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId};
    let span = SpanContext::new(
        TraceId::from(7u128),
        SpanId::from(9u64),
        TraceFlags::SAMPLED,
        false,
        Default::default(),
    );
    opentelemetry::Context::new().with_remote_span_context(span)
}

/// lens's round of the carrier's bytes, or with `cx` of a trace context (the carrier
/// injected, encoded and decoded as well).
fn lens(rounds: usize, sweep_bytes: usize, cx: bool) -> Result<(), Box<dyn Error>> {
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
                    let mut cpu = Cpu::default();
                    let since = clock::thread_user_sys_us();
                    for _ in 0..rounds {
                        if b.rank() == 0 {
                            pause();
                            if cx {
                                let c = source_context();
                                std::hint::black_box(blocking::broadcast_context(b, 0, &c)?);
                            } else {
                                std::hint::black_box(blocking::broadcast(b, 0, mine)?);
                            }
                        } else {
                            sweep(&mut cold);
                            if cx {
                                let none = opentelemetry::Context::new();
                                let got = cpu.time(|| blocking::broadcast_context(b, 0, &none))?;
                                std::hint::black_box(got);
                            } else {
                                std::hint::black_box(cpu.time(|| blocking::broadcast(b, 0, mine))?);
                            }
                        }
                    }
                    if b.rank() != 0 {
                        cpu.print(if cx { "lens_cx" } else { "lens" }, since);
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
        "lens" => lens(rounds, sweep_mib << 20, false),
        "lens_cx" => lens(rounds, sweep_mib << 20, true),
        other => Err(format!("{other}: `lens`, `lens_cx` or `raw`").into()),
    }
}
