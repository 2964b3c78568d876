//! The fenced code blocks of a Markdown page, for tests that check that a project's
//! documentation still runs.

/// One fenced code block of a Markdown page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeBlock {
    /// The info string's first word (`rust`, `sh`, `python`, ...); empty when none.
    pub lang: String,
    /// The 1-based line of the opening fence, to name the block in a failure.
    pub line: usize,
    /// The lines between the fences, each ending in `\n`.
    pub body: String,
}

/// Every block fenced with three backticks in `markdown`, in order. An unclosed fence
/// runs to the end of the page, as Markdown reads it.
pub fn code_blocks(markdown: &str) -> Vec<CodeBlock> {
    let mut blocks = Vec::new();
    let mut open: Option<CodeBlock> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                let lang = info.split_whitespace().next().unwrap_or_default();
                open = Some(CodeBlock {
                    lang: lang.to_owned(),
                    line: i + 1,
                    body: String::new(),
                });
            }
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some(b), None) => {
                b.body.push_str(line);
                b.body.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks.extend(open);
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_found_with_their_language_line_and_body() {
        let page = "# t\n```sh\na\nb\n```\ntext\n```\nc\n```\n```python x\n";
        let got = code_blocks(page);
        let want = [("sh", 2, "a\nb\n"), ("", 7, "c\n"), ("python", 10, "")];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (b, (lang, line, body)) in got.iter().zip(want) {
            assert_eq!(
                (b.lang.as_str(), b.line, b.body.as_str()),
                (lang, line, body)
            );
        }
    }
}
