//! Which ranks export their spans.

use std::collections::BTreeSet;

use lens_core::{Error, RankInfo, Result};

/// Which ranks send their spans to the trace backend. Ranks that do not export still
/// broadcast, create spans and link them (their span contexts are valid); their spans are
/// simply not sent anywhere.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub enum ExportRanks {
    /// Every rank (the default).
    #[default]
    All,
    /// The first rank of each node (local rank 0): needs a launcher that gives local ranks.
    FirstPerNode,
    /// Exactly these ranks.
    List(BTreeSet<usize>),
    /// About this fraction of the ranks (0.0 to 1.0), chosen deterministically from the rank
    /// number alone, so every rank (and every rerun) agrees which ranks export.
    Fraction(f64),
}

impl ExportRanks {
    /// Parses the [`crate::env::LENS_OTLP_EXPORT_RANKS`] syntax: `all`, `first-per-node`,
    /// `ranks:0,4,8` or `fraction:0.25`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the text and the accepted forms.
    pub fn parse(text: &str) -> Result<Self> {
        let t = text.trim();
        let bad = |why: &str| {
            Error::config(format!(
                "export ranks {text:?}: {why} (expected all, first-per-node, ranks:0,4,8 or fraction:0.25)"
            ))
        };
        if t.eq_ignore_ascii_case("all") {
            return Ok(ExportRanks::All);
        }
        if t.eq_ignore_ascii_case("first-per-node") {
            return Ok(ExportRanks::FirstPerNode);
        }
        if let Some(list) = t.strip_prefix("ranks:") {
            let ranks = list
                .split(',')
                .map(|r| r.trim().parse::<usize>())
                .collect::<Result<BTreeSet<_>, _>>()
                .map_err(|_| bad("a rank is not a non-negative integer"))?;
            return Ok(ExportRanks::List(ranks));
        }
        if let Some(f) = t.strip_prefix("fraction:") {
            let f: f64 = f.trim().parse().map_err(|_| bad("not a number"))?;
            return ExportRanks::fraction(f);
        }
        Err(bad("unknown form"))
    }

    /// [`ExportRanks::Fraction`], checked.
    ///
    /// # Errors
    /// [`Error::Config`] unless `0.0 <= f <= 1.0`.
    pub fn fraction(f: f64) -> Result<Self> {
        if (0.0..=1.0).contains(&f) {
            Ok(ExportRanks::Fraction(f))
        } else {
            Err(Error::config(format!(
                "export fraction {f} is not between 0 and 1"
            )))
        }
    }

    /// Whether `info`'s rank exports.
    ///
    /// # Errors
    /// [`Error::Config`] for [`ExportRanks::FirstPerNode`] when the local rank is unknown,
    /// and for a list naming a rank outside the world (a typo would silence a rank).
    pub fn selects(&self, info: &RankInfo) -> Result<bool> {
        match self {
            ExportRanks::All => Ok(true),
            ExportRanks::FirstPerNode => match info.local_rank {
                Some(local) => Ok(local == 0),
                None => Err(Error::config(format!(
                    "exporting from the first rank of each node needs the local rank, which the \
                     launcher ({:?}) did not give rank {}",
                    info.launcher, info.rank
                ))),
            },
            ExportRanks::List(ranks) => {
                if let Some(r) = ranks.iter().find(|r| **r >= info.world_size) {
                    return Err(Error::config(format!(
                        "export ranks name rank {r}, outside a world of {}",
                        info.world_size
                    )));
                }
                Ok(ranks.contains(&info.rank))
            }
            ExportRanks::Fraction(f) => Ok(draw(info.rank) < *f),
        }
    }
}

/// A number in [0, 1) fixed by the rank (splitmix64): spread evenly, so a fraction `f`
/// selects about `f * world_size` ranks, the same ones on every rank and every run.
fn draw(rank: usize) -> f64 {
    let mut z = (rank as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(rank: usize, world: usize, local: Option<usize>) -> RankInfo {
        let i = RankInfo::new(rank, world).expect("rank below world");
        match local {
            Some(l) => i.with_local_rank(l),
            None => i,
        }
    }

    #[test]
    fn parse_table() {
        let rows: &[(&str, Option<ExportRanks>, &str)] = &[
            ("all", Some(ExportRanks::All), "the default spelled out"),
            (
                " ALL ",
                Some(ExportRanks::All),
                "case and spaces do not matter",
            ),
            (
                "first-per-node",
                Some(ExportRanks::FirstPerNode),
                "node leaders",
            ),
            (
                "ranks:0, 4,8",
                Some(ExportRanks::List([0, 4, 8].into())),
                "a list with spaces",
            ),
            (
                "fraction:0.25",
                Some(ExportRanks::Fraction(0.25)),
                "a fraction",
            ),
            ("fraction:1.5", None, "a fraction above one"),
            ("fraction:x", None, "a fraction that is not a number"),
            ("ranks:0,a", None, "a rank that is not a number"),
            ("ranks:", None, "an empty list"),
            ("some", None, "an unknown form"),
        ];
        for (text, want, why) in rows {
            let got = ExportRanks::parse(text).ok();
            assert_eq!(&got, want, "{why}: {text:?}");
        }
    }

    #[test]
    fn selection_table() {
        let rows: &[(ExportRanks, RankInfo, Result<bool, ()>, &str)] = &[
            (ExportRanks::All, info(3, 4, None), Ok(true), "all ranks"),
            (
                ExportRanks::FirstPerNode,
                info(4, 8, Some(0)),
                Ok(true),
                "a node's first rank",
            ),
            (
                ExportRanks::FirstPerNode,
                info(5, 8, Some(1)),
                Ok(false),
                "a node's second rank",
            ),
            (
                ExportRanks::FirstPerNode,
                info(5, 8, None),
                Err(()),
                "no local rank known",
            ),
            (
                ExportRanks::List([1, 3].into()),
                info(3, 4, None),
                Ok(true),
                "listed",
            ),
            (
                ExportRanks::List([1, 3].into()),
                info(2, 4, None),
                Ok(false),
                "not listed",
            ),
            (
                ExportRanks::List([1, 9].into()),
                info(1, 4, None),
                Err(()),
                "a rank outside the world",
            ),
            (
                ExportRanks::Fraction(0.0),
                info(0, 4, None),
                Ok(false),
                "no rank at 0",
            ),
            (
                ExportRanks::Fraction(1.0),
                info(3, 4, None),
                Ok(true),
                "every rank at 1",
            ),
        ];
        for (how, info, want, why) in rows {
            let got = how.selects(info).map_err(|_| ());
            assert_eq!(&got, want, "{why}");
        }
    }

    #[test]
    fn a_fraction_selects_about_that_share_the_same_every_time() {
        let world = 10_000;
        let pick = |f: f64| -> Vec<usize> {
            (0..world)
                .filter(|r| {
                    ExportRanks::Fraction(f)
                        .selects(&info(*r, world, None))
                        .expect("fraction never fails")
                })
                .collect()
        };
        let quarter = pick(0.25);
        assert!(
            (2_300..=2_700).contains(&quarter.len()),
            "0.25 of 10000 ranks chose {}",
            quarter.len()
        );
        assert_eq!(quarter, pick(0.25), "the choice is deterministic");
        let tenth = pick(0.1);
        assert!(
            tenth.iter().all(|r| quarter.contains(r)),
            "a smaller fraction is a subset"
        );
    }
}
