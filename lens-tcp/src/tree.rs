//! The fan-out tree over ranks `0..n`: rank r's children are k*r+1..=k*r+k. The star is the
//! tree with k = n - 1.

use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tree {
    pub n: usize,
    pub k: usize,
}

impl Tree {
    /// The tree of `n` ranks with fan-out `k` (`None`: the star).
    pub(crate) fn new(n: usize, k: Option<usize>) -> Tree {
        let star = n.saturating_sub(1).max(1);
        Tree {
            n,
            k: k.unwrap_or(star).clamp(1, star),
        }
    }

    /// Whether every rank is rank 0's child.
    pub(crate) fn is_star(self) -> bool {
        self.k + 1 >= self.n
    }

    pub(crate) fn parent(self, r: usize) -> Option<usize> {
        (r > 0).then(|| (r - 1) / self.k)
    }

    pub(crate) fn children(self, r: usize) -> Range<usize> {
        let first = r.saturating_mul(self.k).saturating_add(1).min(self.n);
        let end = r
            .saturating_mul(self.k)
            .saturating_add(self.k + 1)
            .min(self.n);
        first..end
    }

    pub(crate) fn depth(self, mut r: usize) -> usize {
        let mut d = 0;
        while let Some(p) = self.parent(r) {
            r = p;
            d += 1;
        }
        d
    }

    /// `r` and every rank below it.
    pub(crate) fn subtree(self, r: usize) -> Vec<usize> {
        let mut out = vec![r];
        let mut i = 0;
        while i < out.len() {
            out.extend(self.children(out[i]));
            i += 1;
        }
        out
    }

    /// Whether `r` is `top` or below it.
    pub(crate) fn is_below(self, r: usize, top: usize) -> bool {
        let mut at = r;
        loop {
            if at == top {
                return true;
            }
            match self.parent(at) {
                Some(p) => at = p,
                None => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Tree;

    #[test]
    fn tree_table() {
        // (n, k, rank, parent, children, depth, subtree)
        let rows: Vec<(
            usize,
            Option<usize>,
            usize,
            Option<usize>,
            Vec<usize>,
            usize,
            Vec<usize>,
        )> = vec![
            (1, None, 0, None, vec![], 0, vec![0]),
            (2, None, 0, None, vec![1], 0, vec![0, 1]),
            (4, None, 0, None, vec![1, 2, 3], 0, vec![0, 1, 2, 3]),
            (4, None, 3, Some(0), vec![], 1, vec![3]),
            (
                7,
                Some(2),
                0,
                None,
                vec![1, 2],
                0,
                vec![0, 1, 2, 3, 4, 5, 6],
            ),
            (7, Some(2), 1, Some(0), vec![3, 4], 1, vec![1, 3, 4]),
            (7, Some(2), 6, Some(2), vec![], 2, vec![6]),
            (8, Some(2), 3, Some(1), vec![7], 2, vec![3, 7]),
            (5, Some(1), 4, Some(3), vec![], 4, vec![4]),
            (
                5,
                Some(9),
                0,
                None,
                vec![1, 2, 3, 4],
                0,
                vec![0, 1, 2, 3, 4],
            ),
        ];
        for (n, k, r, parent, children, depth, subtree) in rows {
            let t = Tree::new(n, k);
            let why = format!("n={n} k={k:?} rank {r}");
            assert_eq!(t.parent(r), parent, "{why}: parent");
            assert_eq!(
                t.children(r).collect::<Vec<_>>(),
                children,
                "{why}: children"
            );
            assert_eq!(t.depth(r), depth, "{why}: depth");
            assert_eq!(t.subtree(r), subtree, "{why}: subtree");
            assert_eq!(t.is_star(), t.children(0).len() == n - 1, "{why}: star");
            for s in 0..n {
                assert_eq!(
                    t.is_below(s, r),
                    subtree.contains(&s),
                    "{why}: is {s} below"
                );
            }
        }
    }

    #[test]
    fn every_rank_is_reached_once() {
        for n in 1..40 {
            for k in 1..6 {
                let t = Tree::new(n, Some(k));
                let mut all = t.subtree(0);
                all.sort_unstable();
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "n={n} k={k}");
            }
        }
    }
}
