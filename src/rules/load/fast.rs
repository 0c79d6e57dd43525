//! The tree of a rule file written in the plainest block style, read
//! straight from its lines: what a control plane generates (`key: value`
//! lines, `- ` items, comments), several times faster than the general
//! parser. Anything else (flow collections, quotes with escapes, block
//! scalars, anchors, tags, documents markers, tabs, a value that runs over
//! lines, a duplicate key, deep nesting...) gives `None`, and the general
//! parser reads the file and reports what is wrong: so this never refuses
//! a file, and what it accepts gives the tree the general parser would
//! (a test holds both to every example and fixture file).

use std::borrow::Cow;

use super::depth::MAX_DEPTH;
use super::tree::{MarkedMappingNode, MarkedScalarNode, MarkedSequenceNode, Yaml};

/// One line with content: its number, indentation and text after it.
#[derive(Clone, Copy)]
struct Line<'t> {
    number: u32,
    indent: usize,
    text: &'t str,
}

/// The lines with content, read as they are asked for (a file's lines
/// are never all held at once).
struct Reader<'t> {
    raw: std::iter::Enumerate<std::str::Split<'t, char>>,
    peeked: Option<Line<'t>>,
    /// A line this subset does not read was met: the file is not ours.
    foreign: bool,
    /// The line where the text ends.
    end: u32,
}

/// The tree of `text`, when it is in the plain block subset.
pub(super) fn parse(text: &str) -> Option<MarkedMappingNode<'_>> {
    // The parser ends the stream on a line of its own.
    let unterminated = usize::from(!text.is_empty() && !text.ends_with('\n'));
    let end = u32::try_from(text.matches('\n').count() + 1 + unterminated).ok()?;
    let mut r = Reader {
        raw: text.split('\n').enumerate(),
        peeked: None,
        foreign: false,
        end,
    };
    let Some(first) = r.peek() else {
        // Nothing but comments: an empty mapping where the text ends.
        return (!r.foreign).then(|| MarkedMappingNode::new(Vec::new(), end));
    };
    if first.indent != 0 || first.text.starts_with('-') {
        return None;
    }
    let root = r.mapping(0, 1)?;
    // Everything read, and nothing this subset does not know.
    (r.peek().is_none() && !r.foreign).then_some(root)
}

impl<'t> Reader<'t> {
    fn peek(&mut self) -> Option<Line<'t>> {
        if self.peeked.is_none() && !self.foreign {
            self.peeked = self.read();
        }
        self.peeked
    }

    fn advance(&mut self) {
        self.peeked = None;
    }

    /// The next line with content; `None` at the end, or at a line this
    /// subset does not read (`foreign` then says so).
    fn read(&mut self) -> Option<Line<'t>> {
        for (i, raw) in self.raw.by_ref() {
            // Printable ASCII only: no tabs, carriage returns, byte order
            // marks or characters the YAML scanner would refuse.
            if raw.bytes().any(|b| !(0x20..=0x7e).contains(&b))
                || raw.starts_with("---")
                || raw.starts_with("...")
                || raw.starts_with('%')
            {
                self.foreign = true;
                return None;
            }
            let content = raw.trim_start_matches(' ');
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let Ok(number) = u32::try_from(i + 1) else {
                self.foreign = true;
                return None;
            };
            return Some(Line {
                number,
                indent: raw.len() - content.len(),
                text: content.trim_end_matches(' '),
            });
        }
        None
    }

    /// A block mapping whose keys are at column `indent`.
    fn mapping(&mut self, indent: usize, depth: usize) -> Option<MarkedMappingNode<'t>> {
        if depth > MAX_DEPTH {
            return None;
        }
        let start = self.peek()?.number;
        let mut entries: Vec<(MarkedScalarNode<'t>, Yaml<'t>)> = Vec::new();
        while let Some(line) = self.peek() {
            if line.indent < indent {
                break;
            }
            if line.indent > indent {
                return None;
            }
            self.advance();
            let entry = self.entry(line, line.text, indent, depth)?;
            // Few keys per mapping in a rule file; a duplicate is the
            // general parser's to report.
            if entries.iter().any(|(k, _)| k.as_str() == entry.0.as_str()) {
                return None;
            }
            entries.push(entry);
        }
        Some(MarkedMappingNode::new(entries, start))
    }

    /// `key: value` or `key:` (the value on the lines below) found on
    /// `line`, in a mapping at column `indent`.
    fn entry(
        &mut self,
        line: Line<'t>,
        text: &'t str,
        indent: usize,
        depth: usize,
    ) -> Option<(MarkedScalarNode<'t>, Yaml<'t>)> {
        let (key, rest) = match text.split_once(": ") {
            Some((key, rest)) => (key, rest.trim_start_matches(' ')),
            None => (text.strip_suffix(':')?, ""),
        };
        let key = plain(key, line.number)?;
        if !rest.is_empty() {
            return Some((key, Yaml::Scalar(scalar(rest, line.number)?)));
        }
        let value = match self.peek() {
            Some(next) if next.indent > indent && is_item(next.text) => {
                Yaml::Sequence(self.sequence(next.indent, depth + 1)?)
            }
            Some(next) if next.indent > indent => {
                Yaml::Mapping(self.mapping(next.indent, depth + 1)?)
            }
            // A list may sit at its key's own column.
            Some(next) if next.indent == indent && is_item(next.text) => {
                Yaml::Sequence(self.sequence(indent, depth + 1)?)
            }
            // An empty value: the parser places it where the next token
            // starts.
            next => {
                let at = next.map_or(self.end, |n| n.number);
                Yaml::Scalar(MarkedScalarNode::new(Cow::Borrowed(""), at, true))
            }
        };
        Some((key, value))
    }

    /// A block sequence whose `- ` are at column `indent`.
    fn sequence(&mut self, indent: usize, depth: usize) -> Option<MarkedSequenceNode<'t>> {
        if depth > MAX_DEPTH {
            return None;
        }
        let start = self.peek()?.number;
        let mut items = Vec::new();
        while let Some(line) = self.peek() {
            if line.indent < indent || (line.indent == indent && !is_item(line.text)) {
                break;
            }
            if line.indent > indent {
                return None;
            }
            self.advance();
            let rest = line.text.strip_prefix("- ")?;
            let spaces = rest.len() - rest.trim_start_matches(' ').len();
            let rest = &rest[spaces..];
            if rest.starts_with('-') || rest.starts_with('#') {
                return None;
            }
            let column = indent + 2 + spaces;
            if rest.contains(": ") || rest.ends_with(':') {
                // A mapping starting on the item's line; its other keys
                // are at the first key's column.
                if depth + 1 > MAX_DEPTH {
                    return None;
                }
                let first = self.entry(line, rest, column, depth + 1)?;
                items.push(Yaml::Mapping(self.mapping_after(
                    first,
                    column,
                    depth + 1,
                )?));
            } else {
                items.push(Yaml::Scalar(scalar(rest, line.number)?));
            }
        }
        Some(MarkedSequenceNode::new(items, start))
    }

    /// The rest of a mapping whose first entry is `first`.
    fn mapping_after(
        &mut self,
        first: (MarkedScalarNode<'t>, Yaml<'t>),
        indent: usize,
        depth: usize,
    ) -> Option<MarkedMappingNode<'t>> {
        let line = first.0.line();
        let mut entries = vec![first];
        if self.peek().is_some_and(|l| l.indent == indent) {
            let rest = self.mapping(indent, depth)?;
            for entry in rest.into_entries() {
                if entries.iter().any(|(k, _)| k.as_str() == entry.0.as_str()) {
                    return None;
                }
                entries.push(entry);
            }
        } else if self.peek().is_some_and(|l| l.indent > indent) {
            return None;
        }
        Some(MarkedMappingNode::new(entries, line))
    }
}

fn is_item(text: &str) -> bool {
    text.starts_with("- ")
}

/// A plain scalar that reads as itself in any YAML context here: no
/// indicator first, nothing that could end or continue it inside.
fn plain(text: &str, line: u32) -> Option<MarkedScalarNode<'_>> {
    let first = text.chars().next()?;
    if "-?:,[]{}#&*!|>'\"%@` ".contains(first)
        || text.ends_with(' ')
        || text.contains(": ")
        || text.contains(" #")
        || text.ends_with(':')
        || text.contains(['{', '}', '[', ']', ','])
    {
        return None;
    }
    Some(MarkedScalarNode::new(Cow::Borrowed(text), line, true))
}

/// A value: plain, or quoted without escapes or inner quotes.
fn scalar(text: &str, line: u32) -> Option<MarkedScalarNode<'_>> {
    for quote in ['"', '\''] {
        if let Some(inner) = text.strip_prefix(quote) {
            let inner = inner.strip_suffix(quote)?;
            if inner.contains([quote, '\\']) {
                return None;
            }
            return Some(MarkedScalarNode::new(Cow::Borrowed(inner), line, false));
        }
    }
    plain(text, line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::load::tree::parse as parse_events;

    /// The tree as text: kind, line, scalar text and style, nested.
    fn render(node: &Yaml<'_>, out: &mut String) {
        let line = node.span().start().map_or(0, |m| m.line());
        match node {
            Yaml::Scalar(s) => out.push_str(&format!("{line}:{:?}{}", s.as_str(), s.may_coerce())),
            Yaml::Mapping(m) => {
                out.push_str(&format!("{line}:{{"));
                for (k, v) in m.iter() {
                    render(
                        &Yaml::Scalar(MarkedScalarNode::new(
                            k.as_str().into(),
                            k.line(),
                            k.may_coerce(),
                        )),
                        out,
                    );
                    out.push_str(": ");
                    render(v, out);
                    out.push_str(", ");
                }
                out.push('}');
            }
            Yaml::Sequence(s) => {
                out.push_str(&format!("{line}:["));
                for item in s.iter() {
                    render(item, out);
                    out.push_str(", ");
                }
                out.push(']');
            }
        }
    }

    fn tree(root: MarkedMappingNode<'_>) -> String {
        let mut out = String::new();
        render(&Yaml::Mapping(root), &mut out);
        out
    }

    /// Every file this reads, it reads as the general parser does.
    fn same(text: &str) -> bool {
        match parse(text) {
            Some(fast) => {
                let general = parse_events(text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
                assert_eq!(tree(fast), tree(general), "{text}");
                true
            }
            None => false,
        }
    }

    fn yaml_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                yaml_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                out.push(path);
            }
        }
    }

    #[test]
    fn reads_what_the_general_parser_reads() {
        let mut files = Vec::new();
        for dir in ["examples", "tests/fixtures"] {
            yaml_files(std::path::Path::new(dir), &mut files);
        }
        let mut read = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            if same(&text) {
                read += 1;
            }
            // And each with one line left out, or indented one more: lists
            // and mappings cut short, misplaced keys, odd indentation.
            let lines: Vec<&str> = text.lines().collect();
            for i in 0..lines.len() {
                let mut cut = lines.clone();
                cut.remove(i);
                same(&cut.join("\n"));
                let mut shifted: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                shifted[i].insert(0, ' ');
                same(&shifted.join("\n"));
            }
        }
        // The plain block files among them are read here.
        assert!(read >= 5, "{read} of {}", files.len());
        let generated: String = (0..50)
            .map(|i| format!("  - key: tenant\n    value: t{i}\n    rate_limit:\n      unit: second\n      requests_per_unit: {i}\n"))
            .collect();
        assert!(same(&format!("domain: d\ndescriptors:\n{generated}")));
        for text in [
            "",
            "# only a comment\n",
            "domain: d\n",
            "domain: d\ndescriptors:\n- key: a\n  value: \"x y\"\n- key: b\n  value: 'z'\n",
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit:\n          unlimited: true\n",
            "domain: d\ndescriptors:\n  -   key: a\n      value: v\n",
            "a:\nb: 1\n",
            "a:\n  - x\n  - y\nb: z\n",
        ] {
            assert!(same(text), "{text:?} is read here");
        }
        // Left to the general parser (which reports what is wrong).
        for text in [
            "domain: d\ndomain: e\n",
            "a: {b: 1}\n",
            "a: b # comment\n",
            "a: \"x\\ty\"\n",
            "a: |\n  text\n",
            "a: &x 1\n",
            "a: !t 1\n",
            "---\na: 1\n",
            "a:\tb\n",
            "a: b\n  c\n",
            "a: 1\n b: 2\n",
            "- a\n",
            "a : 1\n",
            "a: caf\u{e9}\n",
            "a: [1, 2]\n",
            "a:\n  - - x\n",
        ] {
            assert!(
                parse(text).is_none(),
                "{text:?} is left to the general parser"
            );
        }
    }
}
