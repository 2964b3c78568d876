//! The configuration reference (docs/guide/configuration.md) names every environment
//! variable lens's code reads, and only those: the test reads every library crate's and the
//! program's source for the names of variables and compares them with the page's tables.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What an environment variable of lens's looks like: a launcher's, OpenTelemetry's or
/// lens's own prefix, or one of the launchers' and W3C's bare names.
fn is_variable(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "LENS_",
        "OTEL_",
        "SLURM_",
        "OMPI_",
        "PMI_",
        "PMIX_",
        "MPI_LOCAL",
        "TORCHELASTIC_",
        "MASTER_",
    ];
    const NAMES: &[&str] = &[
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "HOSTNAME",
        "CUDA_VISIBLE_DEVICES",
        "TRACEPARENT",
        "TRACESTATE",
        "BAGGAGE",
    ];
    let shaped = name.len() > 2
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    shaped && (NAMES.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p)))
}

/// Source files of the code that runs in a user's job: each crate's `src`, without test
/// modules kept in files of their own.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" && name != "sim" {
                sources(&path, out);
            }
        } else if (name.ends_with(".rs") || name.ends_with(".py"))
            && !name.ends_with("tests.rs")
            && !name.starts_with("test")
        {
            out.push(path);
        }
    }
}

/// Every quoted name in `text` that looks like a variable.
fn quoted_variables(text: &str, into: &mut BTreeSet<String>) {
    for part in text.split('"').skip(1).step_by(2) {
        if is_variable(part) {
            into.insert(part.to_owned());
        }
    }
}

#[test]
fn configuration_reference() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in [
        "lens-core/src",
        "lens-local/src",
        "lens-tcp/src",
        "lens-mpi/src",
        "lens-nccl/src",
        "lens-otlp/src",
        "lens-tracing/src",
        "lens-trace/src",
        "lens-testkit/src",
        "lens-py/src",
        "lens-py/python",
        "lens/src",
    ] {
        sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut read = BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("a source file");
        // Only the code before an inline test module: names in tests are the tests' own.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        quoted_variables(code, &mut read);
    }

    let page = std::fs::read_to_string(root.join("docs/guide/configuration.md"))
        .expect("docs/guide/configuration.md");
    let mut listed = BTreeSet::new();
    for line in page.lines().filter(|l| l.starts_with("| `")) {
        // The first cell: one or more `NAME`s.
        let first = line.split('|').nth(1).unwrap_or_default();
        for name in first.split('`').skip(1).step_by(2) {
            listed.insert(name.to_owned());
        }
    }
    assert!(listed.len() > 40, "the page's tables list only {listed:?}");

    let unlisted: Vec<_> = read.difference(&listed).collect();
    let unread: Vec<_> = listed.difference(&read).collect();
    assert!(
        unlisted.is_empty(),
        "the code reads variables docs/guide/configuration.md does not list: {unlisted:?}"
    );
    assert!(
        unread.is_empty(),
        "docs/guide/configuration.md lists variables no code reads: {unread:?}"
    );
}
