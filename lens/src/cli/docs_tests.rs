//! The README's and the guide's code blocks, checked so the front door cannot drift from
//! the code: every `lens` command line parses with this program's arguments, every cargo
//! command names a package and features that exist, every path exists, the TOML names
//! real features, and every page with Rust blocks is compiled as doc tests of lens-trace.
//! (The demo's picture: `tests/docs.rs`; Python blocks: `lens-py/tests/test_docs.py`.)

use std::path::{Path, PathBuf};

use clap::Parser as _;
use lens_testkit::docs::{CodeBlock, code_blocks};

use super::Cli;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The README and every page of the guide: (path from the root, text).
fn pages() -> Vec<(String, String)> {
    let root = root();
    let mut names = vec!["README.md".to_owned()];
    let mut guide: Vec<String> = std::fs::read_dir(root.join("docs/guide"))
        .expect("docs/guide")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/guide/{n}"))
        .collect();
    guide.sort();
    names.extend(guide);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root.join(&n)).expect("a page");
            (n, text)
        })
        .collect()
}

/// What a checked command came to.
#[derive(Debug, PartialEq)]
enum Checked {
    /// Parsed or found as written.
    Ok,
    /// Not checkable in this build or on this machine, and why.
    Skipped(String),
}

/// The features this build of the program has.
fn built_with(feature: &str) -> bool {
    const BUILT: [(&str, bool); 3] = [
        ("tcp", cfg!(feature = "tcp")),
        ("mpi", cfg!(feature = "mpi")),
        ("nccl", cfg!(feature = "nccl")),
    ];
    BUILT.iter().any(|&(f, on)| f == feature && on)
}

/// The `[features]` names of the workspace package `package` (its folder is its name).
fn features_of(package: &str) -> Result<Vec<String>, String> {
    let manifest = std::fs::read_to_string(root().join(package).join("Cargo.toml"))
        .map_err(|e| format!("no package {package}: {e}"))?;
    let mut in_features = false;
    let mut names = Vec::new();
    for line in manifest.lines() {
        if line.starts_with('[') {
            in_features = line.trim() == "[features]";
        } else if in_features && let Some((name, _)) = line.split_once(" = ") {
            names.push(name.trim().to_owned());
        }
    }
    Ok(names)
}

/// `lens ARGS`: parsed by this program's parser where the build has what they need.
fn check_lens(args: &[&str], features: &[String]) -> Result<Checked, String> {
    let mut needs: Vec<String> = features.to_vec();
    if let Some(i) = args.iter().position(|a| *a == "--backend")
        && let Some(b) = args.get(i + 1)
        && *b != "local"
    {
        needs.push((*b).to_owned());
    }
    if let Some(missing) = needs.iter().find(|f| !built_with(f)) {
        return Ok(Checked::Skipped(format!(
            "this build has no feature {missing}"
        )));
    }
    let argv = std::iter::once("lens").chain(args.iter().copied());
    Cli::try_parse_from(argv)
        .map(|_| Checked::Ok)
        .map_err(|e| format!("`lens {}` does not parse: {e}", args.join(" ")))
}

/// `cargo run|build -p P [--features F] [-- ARGS]` and `cargo fuzz run T`.
fn check_cargo(args: &[&str], cwd: &Path) -> Result<Checked, String> {
    if args.first() == Some(&"fuzz") {
        let target = args.get(2).ok_or("cargo fuzz without a target")?;
        let manifest =
            std::fs::read_to_string(cwd.join("Cargo.toml")).map_err(|e| e.to_string())?;
        return if manifest.contains(&format!("name = \"{target}\"")) {
            Ok(Checked::Ok)
        } else {
            Err(format!("no fuzz target {target}"))
        };
    }
    let (ours, rest) = match args.iter().position(|a| *a == "--") {
        Some(i) => (&args[..i], Some(&args[i + 1..])),
        None => (args, None),
    };
    let after = |flag: &str| {
        ours.iter()
            .position(|a| *a == flag)
            .and_then(|i| ours.get(i + 1))
            .copied()
    };
    let package = after("-p").ok_or("a cargo command without -p")?;
    let known = features_of(package)?;
    let features: Vec<String> = after("--features")
        .map(|f| f.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    if let Some(f) = features.iter().find(|f| !known.contains(f)) {
        return Err(format!("package {package} has no feature {f}"));
    }
    match rest {
        Some(lens_args) if package == "lens" => check_lens(lens_args, &features),
        Some(_) => Err(format!(
            "cargo run of {package}, which the docs check cannot parse"
        )),
        None => Ok(Checked::Ok),
    }
}

/// One command line of a shell block, run from `cwd`.
fn check_command(line: &str, cwd: &Path) -> Result<Checked, String> {
    if let Some((dir, rest)) = line.split_once(" && ") {
        let dir = dir
            .strip_prefix("cd ")
            .ok_or("only `cd DIR && ...` chains are checked")?;
        let cwd = cwd.join(dir.trim());
        if !cwd.is_dir() {
            return Err(format!("no folder {dir}"));
        }
        return check_command(rest, &cwd);
    }
    if line.contains(['"', '\'', '$', '|', ';']) {
        return Err("quotes, variables, pipes and `;` are not checked: keep commands plain".into());
    }
    // Leading VAR=value assignments set the command's environment.
    let words: Vec<&str> = line
        .split_whitespace()
        .skip_while(|w| w.contains('=') && !w.starts_with('-'))
        .collect();
    let (program, args) = words.split_first().ok_or("an empty command")?;
    match *program {
        "cargo" => check_cargo(args, cwd),
        "lens" | "target/release/lens" => check_lens(args, &[]),
        "mpirun" => {
            let at = args
                .iter()
                .position(|a| a.ends_with("/lens"))
                .ok_or("mpirun of something other than lens")?;
            check_lens(&args[at + 1..], &["mpi".to_owned()])
        }
        "scripts/test.sh" | "pip" | "maturin" => {
            let path = match *program {
                "pip" => args.last().copied().unwrap_or_default(),
                "maturin" => ".",
                p => p,
            };
            let path = cwd.join(path);
            let ok = if *program == "scripts/test.sh" {
                path.is_file()
            } else {
                path.join("pyproject.toml").is_file()
            };
            if ok {
                Ok(Checked::Ok)
            } else {
                Err(format!("{} is not there", path.display()))
            }
        }
        "docker" => Ok(Checked::Skipped(
            "a third party's receiver, run with docker: not run by the tests".into(),
        )),
        other => Err(format!("a command the docs check does not know: {other}")),
    }
}

/// The logical lines of a shell block: comments dropped, `\` continuations joined.
fn commands(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in body.lines() {
        let code = line.split(" #").next().unwrap_or_default().trim_end();
        if code.trim_start().starts_with('#') || code.trim().is_empty() {
            continue;
        }
        if let Some(part) = code.strip_suffix('\\') {
            pending.push_str(part.trim());
            pending.push(' ');
        } else {
            pending.push_str(code.trim());
            out.push(std::mem::take(&mut pending));
        }
    }
    out
}

/// `[dependencies]` lines of a TOML block: each workspace crate it names, at the
/// workspace's version, with features it has.
fn check_toml(body: &str) -> Result<(), String> {
    let workspace =
        std::fs::read_to_string(root().join("Cargo.toml")).map_err(|e| e.to_string())?;
    let version = workspace
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .ok_or("no workspace version")?;
    for line in body.lines().filter(|l| l.contains(" = {")) {
        let (name, spec) = line.split_once(" = ").ok_or("a dependency line")?;
        let want = spec
            .split("version = \"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .ok_or_else(|| format!("{name} has no version"))?;
        if !version.starts_with(want) {
            return Err(format!(
                "{name} = {want}, but the workspace is at {version}"
            ));
        }
        let known = features_of(name.trim())?;
        let listed = spec
            .split('[')
            .nth(1)
            .and_then(|f| f.split(']').next())
            .unwrap_or("");
        for f in listed
            .split(',')
            .map(|f| f.trim().trim_matches('"'))
            .filter(|f| !f.is_empty())
        {
            if !known.iter().any(|k| k == f) {
                return Err(format!("{name} has no feature {f}"));
            }
        }
    }
    Ok(())
}

fn describe(page: &str, b: &CodeBlock) -> String {
    format!("{page}:{} ({})", b.line, b.lang)
}

#[test]
fn the_docs_code_blocks_match_the_code() {
    let lib =
        std::fs::read_to_string(root().join("lens-trace/src/lib.rs")).expect("lens-trace's lib.rs");
    let mut failures = Vec::new();
    let (mut checked, mut skipped) = (0, Vec::new());
    for (page, text) in pages() {
        for b in code_blocks(&text) {
            let at = describe(&page, &b);
            match b.lang.as_str() {
                "rust" => {
                    let included = format!("include_str!(\"../../{page}\")");
                    if !lib.contains(&included) {
                        failures.push(format!(
                            "{at}: {page} has Rust but is not a doc test of lens-trace"
                        ));
                    }
                }
                "sh" => {
                    for cmd in commands(&b.body) {
                        match check_command(&cmd, &root()) {
                            Ok(Checked::Ok) => checked += 1,
                            Ok(Checked::Skipped(why)) => {
                                skipped.push(format!("{at}: `{cmd}`: {why}"))
                            }
                            Err(e) => failures.push(format!("{at}: `{cmd}`: {e}")),
                        }
                    }
                }
                "toml" => match check_toml(&b.body) {
                    Ok(()) => checked += 1,
                    Err(e) => failures.push(format!("{at}: {e}")),
                },
                // The demo's picture (tests/docs.rs) and Python (lens-py/tests/test_docs.py).
                "text" if page == "README.md" => {}
                "python" => {}
                _ => failures.push(format!(
                    "{at}: a block no test checks: give it a language a test runs"
                )),
            }
        }
    }
    for s in &skipped {
        eprintln!("not checked: {s}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Floors, so a parser that silently skips everything fails: 24 commands and TOML
    // blocks today, 12 of them checkable without the backends' features.
    assert!(
        checked + skipped.len() >= 20,
        "only {} commands found",
        checked + skipped.len()
    );
    assert!(checked >= 10, "only {checked} commands checked");
    if cfg!(all(feature = "tcp", feature = "mpi", feature = "nccl")) {
        // With every feature only the third party's command is left unchecked.
        assert!(
            skipped.iter().all(|s| s.contains("docker")),
            "skipped with every feature built: {skipped:?}"
        );
    }
}

#[test]
fn a_wrong_command_in_the_docs_is_caught() {
    let root = root();
    for (line, why) in [
        ("lens demo --rankz 4", "an unknown flag"),
        (
            "cargo run --release -p lens --features tpc -- demo",
            "an unknown feature",
        ),
        ("cargo build -p lens-nothing", "an unknown package"),
        (
            "cd nowhere && cargo fuzz run x",
            "a folder that is not there",
        ),
        ("rm -rf target", "a command the check does not know"),
    ] {
        assert!(check_command(line, &root).is_err(), "{line}: {why} passed");
    }
    assert!(check_toml("lens-trace = { version = \"0.1\", features = [\"tpc\"] }").is_err());
    assert!(check_toml("lens-trace = { version = \"9.0\" }").is_err());
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = root();
    let mut broken = Vec::new();
    let mut seen = 0;
    // The crates' own pages too, which crates.io shows.
    let crates = [
        "lens-core",
        "lens-local",
        "lens-testkit",
        "lens-tcp",
        "lens-mpi",
        "lens-nccl",
        "lens-otlp",
        "lens-tracing",
        "lens-py",
    ]
    .map(|c| {
        let page = format!("{c}/README.md");
        let text = std::fs::read_to_string(root.join(&page)).expect("a crate's README");
        (page, text)
    });
    for (page, text) in pages().into_iter().chain(crates) {
        let dir = root
            .join(&page)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for part in text.split("](").skip(1) {
            let target = part.split(')').next().unwrap_or_default();
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            seen += 1;
            if !dir.join(path).exists() {
                broken.push(format!("{page}: {target}"));
            }
        }
    }
    assert!(seen >= 30, "only {seen} relative links found");
    assert!(
        broken.is_empty(),
        "links to nothing:\n{}",
        broken.join("\n")
    );
}
