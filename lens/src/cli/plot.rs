//! The soak's plot: one SVG of four panels (round p50 and p99, RSS, descriptors, threads)
//! against time, written by hand so that it needs no plotting crate.

use std::fmt::Write as _;

use super::soak_sample::Sample;

const PANEL_W: f64 = 560.0;
const PANEL_H: f64 = 150.0;
const MARGIN: f64 = 56.0;

/// The SVG text for `rows`, one sample every `sample_every` seconds.
pub(crate) fn soak_svg(rows: &[Sample], sample_every: f64) -> String {
    type Series = (&'static str, &'static str, fn(&Sample) -> f64);
    let panels: [(&str, &[Series]); 4] = [
        (
            "round (µs)",
            &[
                ("p50", "#1f77b4", |s| s.p50_us),
                ("p99", "#d62728", |s| s.p99_us),
            ],
        ),
        (
            "RSS (MiB)",
            &[("max over ranks", "#2ca02c", |s| s.rss_kib / 1024.0)],
        ),
        (
            "open descriptors",
            &[("max over ranks", "#9467bd", |s| s.fds)],
        ),
        ("threads", &[("max over ranks", "#8c564b", |s| s.threads)]),
    ];
    let height = MARGIN + panels.len() as f64 * (PANEL_H + MARGIN);
    let width = PANEL_W + 2.0 * MARGIN;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let t_max = (rows.len().max(2) - 1) as f64;
    for (p, (title, series)) in panels.iter().enumerate() {
        let top = MARGIN + p as f64 * (PANEL_H + MARGIN);
        let values = series.iter().flat_map(|(_, _, f)| rows.iter().map(f));
        let y_max = values.fold(0.0, f64::max).max(1.0) * 1.1;
        let _ = writeln!(
            out,
            "<text x=\"{MARGIN}\" y=\"{}\" font-weight=\"bold\">{title}</text>\n\
             <rect x=\"{MARGIN}\" y=\"{top}\" width=\"{PANEL_W}\" height=\"{PANEL_H}\" fill=\"none\" stroke=\"#999\"/>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0} s</text>",
            top - 8.0,
            MARGIN - 4.0,
            top + 12.0,
            short(y_max),
            MARGIN - 4.0,
            top + PANEL_H,
            MARGIN + PANEL_W,
            top + PANEL_H + 16.0,
            (t_max + 1.0) * sample_every,
        );
        for (k, (name, colour, f)) in series.iter().enumerate() {
            let points: Vec<String> = rows
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let x = MARGIN + PANEL_W * i as f64 / t_max;
                    let y = top + PANEL_H * (1.0 - f(s) / y_max);
                    format!("{x:.1},{y:.1}")
                })
                .collect();
            let _ = writeln!(
                out,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>\n\
                 <text x=\"{}\" y=\"{}\" fill=\"{colour}\" text-anchor=\"end\">{name}</text>",
                points.join(" "),
                MARGIN + PANEL_W - 4.0,
                top + 14.0 + 14.0 * k as f64,
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

/// A value for an axis label: whole numbers, one decimal below 10.
fn short(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_has_a_line_per_series_through_every_sample() {
        let rows: Vec<Sample> = (0..5)
            .map(|i| Sample {
                rounds: 100,
                p50_us: 300.0 + f64::from(i),
                p99_us: 900.0,
                rss_kib: 8192.0,
                fds: 20.0,
                threads: 5.0,
                ..Sample::default()
            })
            .collect();
        let svg = soak_svg(&rows, 60.0);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // p50 and p99, RSS, descriptors, threads.
        assert_eq!(svg.matches("<polyline").count(), 5);
        for line in svg.lines().filter(|l| l.starts_with("<polyline")) {
            let points = line
                .split("points=\"")
                .nth(1)
                .unwrap_or("")
                .split('"')
                .next()
                .unwrap_or("");
            assert_eq!(points.split(' ').count(), 5, "{line}");
        }
        assert!(
            svg.contains("300 s"),
            "the time axis ends at the last sample"
        );
    }
}
