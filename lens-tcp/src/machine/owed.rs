//! The children a rank sent the round's data to whose ack has not come. A rank's children
//! are one range of ranks in lens's trees (`Tree::children`), so the set is a bit per
//! child: rank 0 of a star holds up to N - 1 and takes one out per ack, which a B-tree did
//! with about 260 instructions and an allocation per 11 children (callgrind, rank 0 of 32).

use std::ops::Range;

/// A set of ranks within the range it was made over.
#[derive(Debug)]
pub(super) struct Owed {
    ranks: Range<usize>,
    bits: Vec<u64>,
    len: usize,
}

impl Owed {
    /// An empty set for ranks in `range` (a rank's children).
    pub(super) fn over(range: Range<usize>) -> Owed {
        Owed {
            bits: vec![0; range.len().div_ceil(64)],
            ranks: range,
            len: 0,
        }
    }

    /// The word and bit of `r`; `None` outside the range.
    fn slot(&self, r: usize) -> Option<(usize, u64)> {
        self.ranks.contains(&r).then(|| {
            let i = r - self.ranks.start;
            (i / 64, 1 << (i % 64))
        })
    }

    /// Adds `r`; false when it was there already or is outside the range (a rank that is
    /// not a child is never owed an ack).
    pub(super) fn insert(&mut self, r: usize) -> bool {
        let Some((w, bit)) = self.slot(r) else {
            return false;
        };
        let new = self.bits[w] & bit == 0;
        self.bits[w] |= bit;
        self.len += usize::from(new);
        new
    }

    /// Takes `r` out; whether it was there.
    pub(super) fn remove(&mut self, r: usize) -> bool {
        let Some((w, bit)) = self.slot(r) else {
            return false;
        };
        let was = self.bits[w] & bit != 0;
        self.bits[w] &= !bit;
        self.len -= usize::from(was);
        was
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ranks in the set, in ascending order.
    pub(super) fn into_ranks(self) -> impl Iterator<Item = usize> {
        let first = self.ranks.start;
        self.bits
            .into_iter()
            .enumerate()
            .flat_map(move |(w, mut bits)| {
                std::iter::from_fn(move || {
                    (bits != 0).then(|| {
                        let at = bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        first + w * 64 + at
                    })
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::Owed;

    enum Op {
        Insert(usize, bool),
        Remove(usize, bool),
    }

    #[test]
    fn a_set_of_children_answers_as_a_set_would() {
        use Op::{Insert, Remove};
        // (why, the children's range, operations with what each returns, what is left)
        let rows: &[(&str, std::ops::Range<usize>, &[Op], &[usize])] = &[
            ("empty", 1..4, &[], &[]),
            (
                "no children",
                5..5,
                &[Insert(5, false), Remove(5, false)],
                &[],
            ),
            (
                "every child of a star",
                1..4,
                &[Insert(1, true), Insert(2, true), Insert(3, true)],
                &[1, 2, 3],
            ),
            (
                "an ack takes one out",
                1..4,
                &[Insert(1, true), Insert(3, true), Remove(1, true)],
                &[3],
            ),
            (
                "twice in, once counted",
                1..4,
                &[Insert(2, true), Insert(2, false)],
                &[2],
            ),
            (
                "an ack not owed",
                1..4,
                &[
                    Insert(2, true),
                    Remove(3, false),
                    Remove(2, true),
                    Remove(2, false),
                ],
                &[],
            ),
            (
                "below and beyond the range",
                5..9,
                &[
                    Insert(4, false),
                    Insert(9, false),
                    Remove(4, false),
                    Remove(100, false),
                ],
                &[],
            ),
            (
                "across words, in order",
                1..1024,
                &[
                    Insert(1000, true),
                    Insert(64, true),
                    Insert(65, true),
                    Insert(1, true),
                    Insert(1023, true),
                ],
                &[1, 64, 65, 1000, 1023],
            ),
            (
                "the last bit of a word",
                0..128,
                &[Insert(63, true), Insert(127, true), Remove(63, true)],
                &[127],
            ),
        ];
        for (why, range, ops, left) in rows {
            let mut s = Owed::over(range.clone());
            for (i, op) in ops.iter().enumerate() {
                let (got, want) = match *op {
                    Insert(r, want) => (s.insert(r), want),
                    Remove(r, want) => (s.remove(r), want),
                };
                assert_eq!(got, want, "{why}: operation {i}");
            }
            assert_eq!(s.len(), left.len(), "{why}: len");
            assert_eq!(s.is_empty(), left.is_empty(), "{why}: is_empty");
            let ranks: Vec<usize> = s.into_ranks().collect();
            assert_eq!(ranks, *left, "{why}: what is left");
        }
    }
}
