//! The name a STREAM socket gives a connection, kept without a heap allocation.
//!
//! libzmq names each accepted connection itself (5 bytes: a zero and a counter), and the
//! name is read with every message and copied into every event about the connection: kept
//! in a `Vec` it cost an allocation per frame. Longer names (not made by libzmq today) go
//! to the heap.

use std::hash::{Hash, Hasher};

/// Bytes kept inline: libzmq's names with room to spare.
const INLINE: usize = 22;

/// A connection's routing id.
#[derive(Clone)]
pub(crate) enum RoutingId {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl RoutingId {
    /// The empty id (an outbound connection's, which lens never addresses by id).
    pub(crate) const EMPTY: RoutingId = RoutingId::Inline {
        len: 0,
        bytes: [0; INLINE],
    };

    pub(crate) fn new(id: &[u8]) -> RoutingId {
        if id.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..id.len()].copy_from_slice(id);
            // Fits: INLINE is below 256.
            RoutingId::Inline {
                len: id.len() as u8,
                bytes,
            }
        } else {
            RoutingId::Heap(id.into())
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            RoutingId::Inline { len, bytes } => &bytes[..usize::from(*len)],
            RoutingId::Heap(b) => b,
        }
    }
}

impl PartialEq for RoutingId {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for RoutingId {}

impl Hash for RoutingId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl std::fmt::Debug for RoutingId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RoutingId({:02x?})", self.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_every_length_keep_their_bytes_and_compare_by_them() {
        // (why, bytes)
        let rows: [(&str, Vec<u8>); 5] = [
            ("empty", vec![]),
            ("libzmq's own 5 bytes", vec![0, 1, 2, 3, 4]),
            ("the longest kept inline", vec![9; INLINE]),
            ("one byte past inline", vec![9; INLINE + 1]),
            ("the longest libzmq allows", vec![7; 255]),
        ];
        for (why, bytes) in rows {
            let id = RoutingId::new(&bytes);
            assert_eq!(id.as_bytes(), &bytes[..], "{why}");
            assert_eq!(id, RoutingId::new(&bytes), "{why}");
            assert_eq!(id.clone(), id, "{why}");
            let mut other = bytes.clone();
            other.push(0);
            assert_ne!(id, RoutingId::new(&other), "{why}: a longer id differs");
        }
        assert_eq!(RoutingId::EMPTY, RoutingId::new(&[]));
    }
}
