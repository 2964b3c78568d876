//! What the switch reads of an IPv4 packet (addresses; for TCP the ports, sequence numbers
//! and flags), and the TCP resets it writes in a connection's name.

use std::net::Ipv4Addr;

/// TCP's protocol number in the IPv4 header.
const TCP: u8 = 6;
const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const RST: u8 = 0x04;

/// One TCP connection as the switch names it: the two ends, lower first, so that both
/// directions name it alike.
pub(super) type FlowKey = ((Ipv4Addr, u16), (Ipv4Addr, u16));

/// A TCP segment's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tcp {
    pub(super) src_port: u16,
    pub(super) dst_port: u16,
    pub(super) seq: u32,
    pub(super) ack: u32,
    pub(super) flags: u8,
    /// Bytes of data it carries.
    pub(super) payload: u32,
}

impl Tcp {
    /// The sequence number after this segment (data, and one each for SYN and FIN).
    pub(super) fn seq_end(&self) -> u32 {
        let flags = u32::from(self.flags & SYN != 0) + u32::from(self.flags & FIN != 0);
        self.seq.wrapping_add(self.payload).wrapping_add(flags)
    }

    pub(super) fn is_reset(&self) -> bool {
        self.flags & RST != 0
    }
}

/// An IPv4 packet's addresses and, for TCP, its segment's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Packet {
    pub(super) src: Ipv4Addr,
    pub(super) dst: Ipv4Addr,
    pub(super) tcp: Option<Tcp>,
}

impl Packet {
    /// `None` for anything but a well-formed IPv4 packet (the switch drops it).
    pub(super) fn parse(b: &[u8]) -> Option<Packet> {
        if b.len() < 20 || b[0] >> 4 != 4 {
            return None;
        }
        let ihl = usize::from(b[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([b[2], b[3]]));
        if ihl < 20 || total < ihl || total > b.len() {
            return None;
        }
        let addr = |at: usize| Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]);
        let tcp = (b[9] == TCP)
            .then(|| {
                let t = b.get(ihl..total)?;
                let doff = usize::from(*t.get(12)? >> 4) * 4;
                if doff < 20 || doff > t.len() {
                    return None;
                }
                let word = |at: usize| u32::from_be_bytes([t[at], t[at + 1], t[at + 2], t[at + 3]]);
                Some(Tcp {
                    src_port: u16::from_be_bytes([t[0], t[1]]),
                    dst_port: u16::from_be_bytes([t[2], t[3]]),
                    seq: word(4),
                    ack: word(8),
                    flags: t[13],
                    payload: u32::try_from(t.len() - doff).ok()?,
                })
            })
            .flatten();
        Some(Packet {
            src: addr(12),
            dst: addr(16),
            tcp,
        })
    }

    /// The connection a TCP packet belongs to, and whether it goes from the key's first end
    /// to its second.
    pub(super) fn flow(&self) -> Option<(FlowKey, bool)> {
        let t = self.tcp?;
        let (a, b) = ((self.src, t.src_port), (self.dst, t.dst_port));
        Some(if a <= b {
            ((a, b), true)
        } else {
            ((b, a), false)
        })
    }
}

/// A TCP reset from `from` to `to` with sequence number `seq`: what a host would send when
/// the connection is gone. A receiver takes it only when `seq` is exactly the next one it
/// expects (RFC 5961), so the switch writes the sequence it last delivered.
pub(super) fn reset(from: (Ipv4Addr, u16), to: (Ipv4Addr, u16), seq: u32) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64; // TTL
    p[9] = TCP;
    p[12..16].copy_from_slice(&from.0.octets());
    p[16..20].copy_from_slice(&to.0.octets());
    let ip_sum = checksum(0, &p[..20]);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&from.1.to_be_bytes());
    t[2..4].copy_from_slice(&to.1.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = RST;
    // The pseudo-header: addresses, protocol, the segment's length.
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&from.0.octets());
    pseudo[4..8].copy_from_slice(&to.0.octets());
    pseudo[9] = TCP;
    pseudo[10..12].copy_from_slice(&20u16.to_be_bytes());
    let sum = checksum(sum_words(0, &pseudo), t);
    t[16..18].copy_from_slice(&sum.to_be_bytes());
    p
}

fn sum_words(mut acc: u32, b: &[u8]) -> u32 {
    for pair in b.chunks(2) {
        let hi = u32::from(pair[0]) << 8;
        acc += hi | pair.get(1).map_or(0, |&lo| u32::from(lo));
    }
    acc
}

/// The Internet checksum (RFC 1071) of `b`, with `acc` summed in first.
fn checksum(acc: u32, b: &[u8]) -> u16 {
    let mut acc = sum_words(acc, b);
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !u16::try_from(acc).unwrap_or(0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    /// An IPv4 TCP packet with `payload` bytes of data.
    fn segment(seq: u32, flags: u8, payload: usize) -> Vec<u8> {
        let mut p = reset((A, 4000), (B, 29500), seq);
        p[33] = flags;
        p.extend(std::iter::repeat_n(7u8, payload));
        let total = u16::try_from(p.len()).expect("small");
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p
    }

    #[test]
    fn packets_parse_or_are_dropped() {
        let data = Some(Tcp {
            src_port: 4000,
            dst_port: 29500,
            seq: 100,
            ack: 0,
            flags: 0x18,
            payload: 5,
        });
        let rows: &[(Vec<u8>, Option<Option<Tcp>>, &str)] = &[
            (segment(100, 0x18, 5), Some(data), "data"),
            (vec![0x60; 40], None, "IPv6 is not forwarded"),
            (vec![0x45; 10], None, "shorter than a header"),
            (
                {
                    let mut p = segment(1, 0x10, 0);
                    p[2] = 0xff;
                    p
                },
                None,
                "longer than read",
            ),
            (
                {
                    let mut p = segment(1, 0x10, 0);
                    p[9] = 17;
                    p
                },
                Some(None),
                "UDP: no TCP header",
            ),
            (
                {
                    let mut p = segment(1, 0x10, 0);
                    p[32] = 0x10;
                    p
                },
                Some(None),
                "a TCP header under 20 bytes",
            ),
        ];
        for (bytes, want, why) in rows {
            let got = Packet::parse(bytes);
            assert_eq!(got.map(|p| p.tcp), *want, "{why}");
            if let Some(p) = got {
                assert_eq!((p.src, p.dst), (A, B), "{why}");
            }
        }
    }

    #[test]
    fn a_reset_has_valid_checksums_and_reads_back() {
        let p = reset((A, 4000), (B, 29500), 0xdead_beef);
        // A header whose checksum is right sums to zero.
        assert_eq!(checksum(0, &p[..20]), 0);
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&A.octets());
        pseudo[4..8].copy_from_slice(&B.octets());
        pseudo[9] = TCP;
        pseudo[11] = 20;
        assert_eq!(checksum(sum_words(0, &pseudo), &p[20..]), 0);
        let t = Packet::parse(&p).and_then(|p| p.tcp).expect("a TCP reset");
        assert!(t.is_reset());
        assert_eq!(
            (t.seq, t.payload, t.seq_end()),
            (0xdead_beef, 0, 0xdead_beef)
        );
    }

    #[test]
    fn sequence_ends_count_syn_and_fin() {
        let end = |flags, n| {
            Packet::parse(&segment(u32::MAX, flags, n))
                .and_then(|p| p.tcp)
                .expect("tcp")
                .seq_end()
        };
        assert_eq!(end(0x10, 3), 2, "wraps");
        assert_eq!(end(SYN, 0), 0);
        assert_eq!(end(FIN | 0x10, 1), 1);
    }

    #[test]
    fn both_directions_name_one_flow() {
        let there = Packet::parse(&segment(1, 0x10, 0)).expect("packet");
        let back = Packet::parse(&reset((B, 29500), (A, 4000), 1)).expect("packet");
        let (k1, d1) = there.flow().expect("tcp");
        let (k2, d2) = back.flow().expect("tcp");
        assert_eq!(k1, k2);
        assert_ne!(d1, d2);
    }
}
