//! The fenced code blocks of a Markdown text, for the tests that run the
//! docs' commands (`tests/docs.rs`) and check the book's examples
//! (`tests/book.rs`).

/// The fenced blocks of `markdown` in order, each as (its info string,
/// its body). `indented`: a fence indented under a list item counts too.
pub fn fenced(markdown: &str, indented: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in markdown.lines() {
        let fence = if indented {
            line.trim_start().strip_prefix("```")
        } else {
            line.strip_prefix("```")
        };
        match (&mut open, fence) {
            (None, Some(lang)) => open = Some((lang.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.push(open.take().unwrap()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}
