//! The switch: one thread that reads every host's packets from its TUN device, holds each
//! for its links' delays, and writes it into the destination host's device; or drops it
//! (loss, a cut link), or resets its TCP connection.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::link::Link;
use super::packet::{FlowKey, Packet, reset};
use super::sys;

/// How long the switch sleeps at most with nothing due, so that it sees a stop soon.
const IDLE: Duration = Duration::from_millis(20);
/// The most the switch wakes before a packet is due (and then looks without sleeping).
const MAX_WAKE_AHEAD: Duration = Duration::from_micros(50);
/// A packet larger than any MTU the hosts' devices have.
const MAX_PACKET: usize = 65_536;

/// What the switch does to one host's packets: its link, and whether it is cut.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Port {
    pub(super) link: Link,
    pub(super) cut: bool,
}

/// What the network's owner changes while the switch runs.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) ports: Mutex<Vec<Port>>,
    /// Bumped at every change, so the switch copies the ports only then.
    pub(super) generation: AtomicU64,
    pub(super) stop: AtomicBool,
    pub(super) stats: Counters,
}

impl Shared {
    pub(super) fn new(ports: Vec<Port>) -> Self {
        Shared {
            ports: Mutex::new(ports),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stats: Counters::default(),
        }
    }

    pub(super) fn change(&self, f: impl FnOnce(&mut Vec<Port>)) {
        f(&mut self.ports.lock().unwrap_or_else(PoisonError::into_inner));
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// The switch's counts, read by [`super::Network::stats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) forwarded: AtomicU64,
    pub(super) lost: AtomicU64,
    pub(super) cut: AtomicU64,
    pub(super) resets: AtomicU64,
    pub(super) late_max_ns: AtomicU64,
    pub(super) late_sum_ns: AtomicU64,
    pub(super) cpu_ns: AtomicU64,
}

/// A packet held until it is due.
struct Held {
    due: Instant,
    order: u64,
    to: usize,
    bytes: Vec<u8>,
    /// For a TCP segment (not a reset): its connection, which way it goes (0: from the
    /// key's first end), and the sequence number after it.
    tcp: Option<(FlowKey, usize, u32)>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.order) == (o.due, o.order)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.order).cmp(&(o.due, o.order))
    }
}

/// Notes that `end` was delivered on `key` in direction `slot`: the next reset to that
/// direction's receiver must carry it.
fn note_delivered(
    delivered: &mut HashMap<FlowKey, [Option<u32>; 2]>,
    key: FlowKey,
    slot: usize,
    end: u32,
) {
    let e = delivered.entry(key).or_insert([None, None]);
    // Sequence numbers wrap, and a retransmission repeats an earlier one: keep the later.
    if e[slot].is_none_or(|cur| (1..=u32::MAX / 2).contains(&end.wrapping_sub(cur))) {
        e[slot] = Some(end);
    }
}

/// A small fast generator for jitter, loss and resets (splitmix64): no cryptography needed.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Rng((t as u64) ^ u64::from(std::process::id()).rotate_left(32))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// `d` with up to ± `jitter` added, never below zero.
    fn around(&mut self, d: Duration, jitter: Duration) -> Duration {
        if jitter.is_zero() {
            return d;
        }
        let off = jitter.as_secs_f64() * (2.0 * self.unit() - 1.0);
        Duration::try_from_secs_f64((d.as_secs_f64() + off).max(0.0)).unwrap_or(d)
    }
}

/// The switch's state on its own thread.
pub(super) struct Switch {
    devices: Vec<File>,
    addrs: Vec<Ipv4Addr>,
    shared: Arc<Shared>,
}

impl Switch {
    pub(super) fn new(devices: Vec<File>, addrs: Vec<Ipv4Addr>, shared: Arc<Shared>) -> Self {
        Switch {
            devices,
            addrs,
            shared,
        }
    }

    fn host_of(&self, a: Ipv4Addr) -> Option<usize> {
        self.addrs.iter().position(|&h| h == a)
    }

    /// Runs until the owner sets `stop`.
    pub(super) fn run(self) {
        sys::tight_timer_slack();
        if let Err(e) = sys::real_time() {
            tracing::debug!(error = %e, "the switch runs at the normal priority");
        }
        let n = self.devices.len();
        let stats = &self.shared.stats;
        let mut ports: Vec<Port> = Vec::new();
        let mut seen_generation = u64::MAX;
        let mut rng = Rng::seeded();
        let mut held: BinaryHeap<Reverse<Held>> = BinaryHeap::new();
        let mut order = 0u64;
        // Per pair of hosts, when its last packet is due: a later one never overtakes it.
        let mut last_due: Vec<Option<Instant>> = vec![None; n * n];
        // Per TCP connection, the sequence number after what was delivered each way (the
        // one a reset must carry).
        let mut delivered: HashMap<FlowKey, [Option<u32>; 2]> = HashMap::new();
        let mut buf = vec![0u8; MAX_PACKET];
        let mut ready = Vec::with_capacity(n);
        let mut oversleep = Duration::ZERO;
        while !self.shared.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            // Wake early by what waking has overslept lately, then look without sleeping
            // until the packet is due: a sleep alone delivers tens of µs late on a VM.
            let wait = held.peek().map_or(IDLE, |Reverse(h)| {
                h.due
                    .saturating_duration_since(now)
                    .saturating_sub(oversleep)
                    .min(IDLE)
            });
            if !wait.is_zero() {
                if sys::wait_readable(&self.devices, wait, &mut ready).is_err() {
                    // A device that cannot be polled: the network is being torn down.
                    break;
                }
                if !ready.contains(&true) {
                    let over = now.elapsed().saturating_sub(wait).min(MAX_WAKE_AHEAD);
                    // A moving average over about eight wake-ups.
                    oversleep = (oversleep * 7 + over) / 8;
                }
            }
            // A packet's delay counts from when it was read, not from before the wait.
            let now = Instant::now();
            // After the wait, not before: a packet sent after a change (a reset asked for,
            // then a write) is read after it, so it must see it.
            let generation = self.shared.generation.load(Ordering::Acquire);
            if generation != seen_generation {
                seen_generation = generation;
                ports.clone_from(
                    &self
                        .shared
                        .ports
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner),
                );
            }
            for from in 0..n {
                if !wait.is_zero() && !ready.get(from).copied().unwrap_or(false) {
                    continue;
                }
                loop {
                    let len = match (&self.devices[from]).read(&mut buf) {
                        Ok(len) => len,
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    };
                    let bytes = &buf[..len];
                    let Some(p) = Packet::parse(bytes) else {
                        continue;
                    };
                    let Some(to) = self.host_of(p.dst) else {
                        continue;
                    };
                    let (src, dst) = (ports[from], ports[to]);
                    if src.cut || dst.cut {
                        stats.cut.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if rng.chance(src.link.loss) || rng.chance(dst.link.loss) {
                        stats.lost.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let flow = p.flow();
                    let carries_data = p.tcp.is_some_and(|t| t.payload > 0);
                    if let Some((key, _)) = flow.filter(|_| {
                        carries_data && (rng.chance(src.link.reset) || rng.chance(dst.link.reset))
                    }) {
                        // The connection is gone: nothing of it still held is delivered,
                        // and each end gets a reset it accepts.
                        held.retain(|Reverse(h)| h.tcp.is_none_or(|(k, ..)| k != key));
                        let ends = delivered.remove(&key).unwrap_or([None, None]);
                        let (a, b) = key;
                        let at = |addr| self.host_of(addr);
                        // Counted first: whoever sees the reset may read the count at once.
                        stats.resets.fetch_add(1, Ordering::Relaxed);
                        // ends[0]: delivered from a to b, so b expects it next.
                        for (seq, from_end, to_end) in [(ends[0], a, b), (ends[1], b, a)] {
                            if let (Some(seq), Some(host)) = (seq, at(to_end.0)) {
                                let _ = (&self.devices[host]).write(&reset(from_end, to_end, seq));
                            }
                        }
                        continue;
                    }
                    let mut due = now
                        + rng.around(src.link.send, src.link.jitter)
                        + rng.around(dst.link.recv, dst.link.jitter);
                    let pair = &mut last_due[from * n + to];
                    if let Some(last) = *pair {
                        due = due.max(last);
                    }
                    *pair = Some(due);
                    order += 1;
                    held.push(Reverse(Held {
                        due,
                        order,
                        to,
                        bytes: bytes.to_vec(),
                        tcp: flow
                            .zip(p.tcp)
                            .filter(|(_, t)| !t.is_reset())
                            .map(|((key, forward), t)| (key, usize::from(!forward), t.seq_end())),
                    }));
                }
            }
            let now = Instant::now();
            while held.peek().is_some_and(|Reverse(h)| h.due <= now) {
                let Some(Reverse(h)) = held.pop() else { break };
                if let Some((key, slot, end)) = h.tcp {
                    note_delivered(&mut delivered, key, slot, end);
                }
                stats.forwarded.fetch_add(1, Ordering::Relaxed);
                let _ = (&self.devices[h.to]).write(&h.bytes);
                let late = u64::try_from(now.saturating_duration_since(h.due).as_nanos())
                    .unwrap_or(u64::MAX);
                stats.late_sum_ns.fetch_add(late, Ordering::Relaxed);
                stats.late_max_ns.fetch_max(late, Ordering::Relaxed);
            }
            let cpu = u64::try_from(crate::thread_cpu().as_nanos()).unwrap_or(u64::MAX);
            stats.cpu_ns.store(cpu, Ordering::Relaxed);
        }
    }
}
