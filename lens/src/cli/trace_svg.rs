//! The demo's trace as a picture (`lens demo --svg`): for the first steps, one bar per rank
//! on the step's time axis, and a curve from rank 0's step to each span linked to it. The
//! README shows one (docs/demo-trace.svg).

use std::fmt::Write as _;

use super::rank::STEP_SPAN;
use super::record::{Job, SpanRecord};
use super::view::{came_last, span_in_step};

const MAX_STEPS: usize = 2;
const MAX_RANKS: usize = 8;
const LABEL_W: f64 = 260.0;
const AXIS_W: f64 = 520.0;
const ROW_H: f64 = 26.0;
const STEP_GAP: f64 = 56.0;
const MARGIN: f64 = 16.0;
const STEP_COLOUR: &str = "#1f77b4";
const STAGE_COLOUR: &str = "#ff7f0e";
const LINK_COLOUR: &str = "#555555";
const LEGEND_H: f64 = 24.0;

/// Escapes text for SVG.
fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG text of the first steps of `job`: a title per step (its trace id, the rank that
/// came last), a bar per rank, a curve per cross-rank link.
pub(crate) fn trace_svg(job: &Job) -> String {
    let roots = job.named(0, STEP_SPAN);
    let steps: Vec<&SpanRecord> = roots.into_iter().take(MAX_STEPS).collect();
    let ranks = job.ranks.len().min(MAX_RANKS);
    let step_h = STEP_GAP + ranks as f64 * ROW_H + 14.0;
    let width = 2.0 * MARGIN + LABEL_W + AXIS_W;
    let height = 2.0 * MARGIN + steps.len().max(1) as f64 * step_h + LEGEND_H;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"6\" \
         markerHeight=\"6\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"{LINK_COLOUR}\"/>\
         </marker></defs>\n"
    );
    for (k, root) in steps.iter().enumerate() {
        let top = MARGIN + k as f64 * step_h;
        let (t0, span_us) = (root.start_us, (root.end_us - root.start_us).max(1.0));
        let x = |t: f64| MARGIN + LABEL_W + ((t - t0) / span_us).clamp(0.0, 1.0) * AXIS_W;
        let mut title = format!(
            "step {}  ·  trace {}",
            root.step.unwrap_or(-1),
            root.trace_id
        );
        if let Some(line) = came_last(root) {
            let _ = write!(title, "  ·  {line}");
        }
        let _ = writeln!(
            out,
            "<text x=\"{MARGIN}\" y=\"{:.1}\" font-weight=\"bold\">{}</text>",
            top + 16.0,
            esc(&title)
        );
        // The step's time axis, from rank 0's step start to its end.
        let axis_y = top + STEP_GAP - 18.0 + ranks as f64 * ROW_H + 4.0;
        let _ = writeln!(
            out,
            "<line x1=\"{:.1}\" y1=\"{axis_y:.1}\" x2=\"{:.1}\" y2=\"{axis_y:.1}\" stroke=\"#999999\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#666666\">0 ms</text>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#666666\" text-anchor=\"end\">{:.2} ms</text>",
            x(t0),
            x(root.end_us),
            x(t0),
            axis_y + 14.0,
            x(root.end_us),
            axis_y + 14.0,
            span_us / 1000.0
        );
        // Where rank 0's step bar starts: each link's curve begins there.
        let root_y = top + STEP_GAP - 18.0 + ROW_H / 2.0;
        for rank in 0..ranks {
            let y = top + STEP_GAP - 18.0 + rank as f64 * ROW_H;
            let Some(span) = span_in_step(job, rank, root) else {
                let _ = writeln!(
                    out,
                    "<text x=\"{MARGIN}\" y=\"{:.1}\">rank {rank}  (no span)</text>",
                    y + 16.0
                );
                continue;
            };
            let (a, b) = (x(span.start_us), x(span.end_us).max(x(span.start_us) + 2.0));
            let colour = if rank == 0 { STEP_COLOUR } else { STAGE_COLOUR };
            let _ = writeln!(
                out,
                "<text x=\"{MARGIN}\" y=\"{:.1}\">rank {rank}  {}</text>\n\
                 <rect x=\"{a:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\" rx=\"3\">\
                 <title>{} {:.2} ms</title></rect>",
                y + 16.0,
                esc(&span.name),
                y + 4.0,
                b - a,
                ROW_H - 8.0,
                esc(&span.name),
                (span.end_us - span.start_us) / 1000.0
            );
            if let Some(link) = span.links.first().filter(|l| l.span_id == root.span_id) {
                let (sx, ex, ey) = (x(root.start_us) + 4.0, a, y + ROW_H / 2.0);
                let label = if link.trace_id == span.trace_id {
                    "child + link"
                } else {
                    "link"
                };
                let _ = writeln!(
                    out,
                    "<path d=\"M{sx:.1},{root_y:.1} C{sx:.1},{ey:.1} {sx:.1},{ey:.1} {ex:.1},{ey:.1}\" \
                     fill=\"none\" stroke=\"{LINK_COLOUR}\" stroke-dasharray=\"4 3\" marker-end=\"url(#arrow)\">\
                     <title>{label} to rank 0's {STEP_SPAN}</title></path>"
                );
            }
        }
    }
    let legend_y = height - MARGIN;
    let hidden = job.ranks.len() - ranks;
    let more = if hidden > 0 {
        format!("  ·  {hidden} more rank(s) not drawn")
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "<rect x=\"{MARGIN}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{STEP_COLOUR}\"/>\n\
         <text x=\"{:.1}\" y=\"{legend_y:.1}\">rank 0's step span</text>\n\
         <rect x=\"{:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{STAGE_COLOUR}\"/>\n\
         <text x=\"{:.1}\" y=\"{legend_y:.1}\">a later stage's span, linked to it (dashed){more}</text>",
        legend_y - 10.0,
        MARGIN + 18.0,
        MARGIN + 170.0,
        legend_y - 10.0,
        MARGIN + 188.0,
    );
    out.push_str("</svg>\n");
    out
}
