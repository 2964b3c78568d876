//! The README's picture of a trace is what `lens demo` prints: the same lines, with the
//! ids, times and bar lengths of that run in place of this one's.

mod common;

use std::time::Duration;

use lens::testkit::docs::code_blocks;

/// A line with what changes between runs taken out: a bar between `|`s becomes `|bar|`,
/// a word of 8 or more hex digits (an id) `#`, and each number `#`.
fn shape(line: &str) -> String {
    let line = line.trim_end();
    let line = match (line.find('|'), line.rfind('|')) {
        (Some(a), Some(b)) if a < b => format!("{}|bar|{}", &line[..a], &line[b + 1..]),
        _ => line.to_owned(),
    };
    line.split(' ')
        .map(|word| {
            if word.len() >= 8 && word.chars().all(|c| c.is_ascii_hexdigit()) {
                return "#".to_owned();
            }
            // Runs of digits (with their decimal points) become one `#`.
            let mut out = String::new();
            let mut in_number = false;
            for c in word.chars() {
                let part_of_number = c.is_ascii_digit() || (in_number && c == '.');
                if part_of_number {
                    if !in_number {
                        out.push('#');
                    }
                } else {
                    out.push(c);
                }
                in_number = part_of_number;
            }
            out
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_readme_picture_is_what_the_demo_prints() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let pictures: Vec<_> = code_blocks(&readme)
        .into_iter()
        .filter(|b| b.lang == "text")
        .collect();
    assert_eq!(
        pictures.len(),
        1,
        "the README has one picture of the demo's trace"
    );
    let want: Vec<String> = pictures[0].body.lines().map(shape).collect();

    let run = common::lens(&["demo", "--steps", "1"], Duration::from_secs(120));
    assert!(run.ok, "lens demo failed:\n{}", run.stderr);
    let got: Vec<String> = run.stdout.lines().map(shape).collect();
    assert!(
        got.windows(want.len()).any(|w| w == want.as_slice()),
        "the README's picture:\n{}\nis not the shape of what `lens demo --steps 1` printed:\n{}",
        want.join("\n"),
        got.join("\n")
    );
}

#[test]
fn shapes_keep_words_and_drop_what_varies() {
    for (a, b, same) in [
        (
            "rank 3    train_step |███··| 17.71 ms",
            "rank 1    train_step |·████| 5.2 ms",
            true,
        ),
        (
            "trace 8797970c3a379115  train_step",
            "trace 0123456789abcdef  train_step",
            true,
        ),
        (
            "trace cdcc0c3a37911540  a",
            "trace 99c1294bf78c0096  a",
            true,
        ),
        ("0.10 ms after", "12.5 ms after", true),
        ("pp.recv_forward.linked", "pp.recv_backward.linked", false),
        (
            "rank 1    train_step |██| 1 ms",
            "rank 1    pp.recv_forward |██| 1 ms",
            false,
        ),
        ("ok: 4 rank(s) verified", "ok: 4 rank(s) failed", false),
    ] {
        assert_eq!(
            shape(a) == shape(b),
            same,
            "{a:?} / {b:?}: {} / {}",
            shape(a),
            shape(b)
        );
    }
}

/// An SVG's elements in order, each with its text where it has some (shaped as above):
/// what a picture shows, without its coordinates.
fn svg_outline(svg: &str) -> Vec<String> {
    svg.split('<')
        .skip(1)
        .filter(|piece| !piece.starts_with('/'))
        .map(|piece| {
            let tag: String = piece
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            let text = piece.split_once('>').map_or("", |(_, t)| t).trim();
            if text.is_empty() {
                tag
            } else {
                format!("{tag}: {}", shape(text))
            }
        })
        .collect()
}

#[test]
fn the_readme_image_is_what_the_demo_draws() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let command = "-- demo --steps 2 --inject delay:2:3 --svg docs/demo-trace.svg";
    assert!(
        readme.contains(command),
        "the README names the command that draws its picture"
    );
    assert!(
        readme.contains("](docs/demo-trace.svg)"),
        "the README shows the picture"
    );
    let committed =
        std::fs::read_to_string(format!("{root}/docs/demo-trace.svg")).expect("the picture");

    let dir = std::env::temp_dir().join(format!("lens-docs-svg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let path = dir.join("trace.svg");
    let args = [
        "demo",
        "--steps",
        "2",
        "--inject",
        "delay:2:3",
        "--svg",
        path.to_str().expect("a UTF-8 path"),
    ];
    let run = common::lens(&args, Duration::from_secs(120));
    let drawn = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.ok, "lens demo --svg failed:\n{}", run.stderr);
    let (want, got) = (svg_outline(&committed), svg_outline(&drawn));
    assert!(
        want.len() > 30,
        "the committed picture has {} elements",
        want.len()
    );
    assert_eq!(
        want, got,
        "docs/demo-trace.svg is not what `cargo run -p lens {command}` draws now: run it again"
    );
    // A link's curve per later stage, per step.
    assert_eq!(
        got.iter().filter(|e| e.starts_with("path")).count(),
        2 * 3 + 1,
        "{got:?}"
    );
}
