//! `README.md` renders on GitHub and crates.io as it reads: every ``[`Name`]`` in it is a link
//! (an inline one, or a reference with a definition), never literal brackets, and every
//! relative link names a file of the repository.

use std::collections::HashSet;
use std::path::Path;

const README: &str = include_str!("../README.md");

/// The text outside fenced code blocks.
fn prose() -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in README.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The labels of the link definitions (`[label]: target` at the start of a line).
fn definitions(text: &str) -> HashSet<String> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix('[')?;
            let (label, after) = rest.split_once(']')?;
            after.starts_with(':').then(|| label.to_lowercase())
        })
        .collect()
}

#[test]
fn every_bracketed_name_is_a_link() {
    let text = prose();
    let defined = definitions(&text);
    let mut missing = Vec::new();
    for (at, _) in text.match_indices("[`") {
        let Some(end) = text[at..].find("`]") else {
            continue;
        };
        let label = &text[at + 1..at + end + 1];
        let after = &text[at + end + 2..];
        let inline = after.starts_with('(') || after.starts_with('[');
        let line_start = at == 0 || text[..at].ends_with('\n');
        let definition = line_start && after.starts_with(':');
        if !inline && !definition && !defined.contains(&label.to_lowercase()) {
            missing.push(label.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "README.md: no link definition for {missing:?} (GitHub shows them as literal brackets)"
    );
}

#[test]
fn every_relative_link_names_a_file() {
    let text = prose();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    for (at, _) in text.match_indices("](") {
        let rest = &text[at + 2..];
        let Some(end) = rest.find(')') else { continue };
        let target = &rest[..end];
        if target.contains("://") || target.starts_with('#') {
            continue;
        }
        let path = target.split('#').next().unwrap_or_default();
        if !root.join(path).exists() {
            missing.push(target.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "README.md links to missing files: {missing:?}"
    );
}
