//! A rule file's YAML as a tree of nodes that know their line, built in
//! one pass over the event stream of `yaml-rust2`'s parser, which keeps its
//! own state on the heap: the nesting bound ([`MAX_DEPTH`]) is checked on
//! the same events, before any node deeper than it exists, and nothing here
//! recurses (dropping a tree recurses once per level, bounded by that).
//!
//! It is small on purpose: a scalar is a slice of the file's text whenever
//! the text holds it as it is (a plain or simply quoted value), a mapping a
//! vector of entries, so a file of a hundred thousand rules parses in a
//! fraction of a second into a few hundred bytes per rule, all freed once
//! the rules are built. What it refuses, and how it reads scalars, is what
//! `marked-yaml` (the loader this replaces) did: the first document only;
//! anchors, aliases and tags refused; duplicate mapping keys and non-scalar
//! keys refused; the top level must be a mapping (an empty file is an empty
//! one); a scalar "may coerce" only when plain.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

use yaml_rust2::Event;
use yaml_rust2::parser::Parser;
use yaml_rust2::scanner::{ScanError, TScalarStyle};

use super::depth::MAX_DEPTH;

/// Where a node starts: its 1-based line.
#[derive(Debug, Clone, Copy)]
pub(super) struct Marker(usize);

impl Marker {
    pub(super) fn line(&self) -> usize {
        self.0
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Span(Marker);

impl Span {
    pub(super) fn start(&self) -> Option<Marker> {
        Some(self.0)
    }
}

#[derive(Debug)]
pub(super) enum Yaml<'t> {
    Scalar(MarkedScalarNode<'t>),
    Mapping(MarkedMappingNode<'t>),
    Sequence(MarkedSequenceNode<'t>),
}

#[derive(Debug)]
pub(super) struct MarkedScalarNode<'t> {
    text: Cow<'t, str>,
    line: u32,
    plain: bool,
}

#[derive(Debug)]
pub(super) struct MarkedMappingNode<'t> {
    entries: Vec<(MarkedScalarNode<'t>, Yaml<'t>)>,
    line: u32,
}

#[derive(Debug)]
pub(super) struct MarkedSequenceNode<'t> {
    items: Vec<Yaml<'t>>,
    line: u32,
}

fn span(line: u32) -> Span {
    Span(Marker(line as usize))
}

impl<'t> Yaml<'t> {
    pub(super) fn span(&self) -> Span {
        match self {
            Yaml::Scalar(s) => span(s.line),
            Yaml::Mapping(m) => span(m.line),
            Yaml::Sequence(s) => span(s.line),
        }
    }

    pub(super) fn as_mapping(&self) -> Option<&MarkedMappingNode<'t>> {
        match self {
            Yaml::Mapping(m) => Some(m),
            _ => None,
        }
    }

    pub(super) fn as_sequence(&self) -> Option<&MarkedSequenceNode<'t>> {
        match self {
            Yaml::Sequence(s) => Some(s),
            _ => None,
        }
    }
}

impl<'t> MarkedScalarNode<'t> {
    pub(super) fn new(text: Cow<'t, str>, line: u32, plain: bool) -> Self {
        MarkedScalarNode { text, line, plain }
    }

    pub(super) fn line(&self) -> u32 {
        self.line
    }

    pub(super) fn span(&self) -> Span {
        span(self.line)
    }

    pub(super) fn as_str(&self) -> &str {
        &self.text
    }

    /// Plain (unquoted): `null`, `~` and empty may read as absent.
    pub(super) fn may_coerce(&self) -> bool {
        self.plain
    }
}

impl<'t> MarkedMappingNode<'t> {
    pub(super) fn new(entries: Vec<(MarkedScalarNode<'t>, Yaml<'t>)>, line: u32) -> Self {
        MarkedMappingNode { entries, line }
    }

    pub(super) fn into_entries(self) -> Vec<(MarkedScalarNode<'t>, Yaml<'t>)> {
        self.entries
    }

    pub(super) fn span(&self) -> Span {
        span(self.line)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&MarkedScalarNode<'t>, &Yaml<'t>)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

impl<'t> MarkedSequenceNode<'t> {
    pub(super) fn new(items: Vec<Yaml<'t>>, line: u32) -> Self {
        MarkedSequenceNode { items, line }
    }

    pub(super) fn iter(&self) -> std::slice::Iter<'_, Yaml<'t>> {
        self.items.iter()
    }
}

/// Why a file did not parse: its line, the YAML path of the node (for a
/// nesting too deep), and the reason.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Refused {
    pub line: usize,
    pub path: String,
    pub reason: String,
}

/// A collection being read.
enum Open<'t> {
    Mapping {
        line: u32,
        entries: Vec<(MarkedScalarNode<'t>, Yaml<'t>)>,
        /// The key read, while its value is read.
        key: Option<MarkedScalarNode<'t>>,
        /// Keys by text, once a mapping has many (duplicates are looked
        /// up in `entries` until then).
        index: Option<HashMap<Cow<'t, str>, u32>>,
    },
    Sequence {
        line: u32,
        items: Vec<Yaml<'t>>,
    },
}

/// The YAML path of the node being read (`descriptors[3].rate_limit`).
fn path_of(open: &[Open<'_>]) -> String {
    let mut path = String::new();
    for o in open {
        match o {
            Open::Mapping { key: Some(k), .. } if path.is_empty() => path = k.as_str().into(),
            Open::Mapping { key: Some(k), .. } => path = format!("{path}.{}", k.as_str()),
            Open::Mapping { .. } => {}
            Open::Sequence { items, .. } => path = format!("{path}[{}]", items.len()),
        }
    }
    path
}

/// The scalar `value` read at char index `at`: a slice of `text` when it
/// holds the value as it is there (or just after an opening quote), else
/// the value itself. (The index counts chars: after a multi-byte one it
/// misses, and the value is kept.)
fn scalar<'t>(
    text: &'t str,
    at: usize,
    value: String,
    line: u32,
    plain: bool,
) -> MarkedScalarNode<'t> {
    let slice = |from: usize| text.get(from..from + value.len()).filter(|s| *s == value);
    let text = match slice(at).or_else(|| slice(at + 1)) {
        Some(slice) => Cow::Borrowed(slice),
        None => Cow::Owned(value),
    };
    MarkedScalarNode { text, line, plain }
}

/// Parses a rule file's text into its top-level mapping from the YAML
/// parser's events.
pub(super) fn parse(text: &str) -> Result<MarkedMappingNode<'_>, Refused> {
    let mut parser = Parser::new(text.chars());
    let mut reading = Reading {
        text,
        open: Vec::new(),
        root: None,
        problem: None,
    };
    loop {
        let (event, mark) = parser.next_token().map_err(|e| reading.scan_error(&e))?;
        let line = u32::try_from(mark.line()).unwrap_or(u32::MAX);
        let done: Yaml<'_> = match event {
            Event::MappingStart(anchor, ref tag) | Event::SequenceStart(anchor, ref tag) => {
                let is_mapping = matches!(event, Event::MappingStart(..));
                reading.start(is_mapping, anchor, tag.is_some(), mark.line())?;
                continue;
            }
            Event::MappingEnd | Event::SequenceEnd => match reading.end() {
                Some(done) => done,
                None => continue,
            },
            Event::Scalar(value, style, anchor, tag) => {
                reading.scalar_problem(anchor, tag.is_some(), mark.line());
                let plain = matches!(style, TScalarStyle::Plain);
                Yaml::Scalar(scalar(text, mark.index(), value, line, plain))
            }
            Event::Alias(_) => {
                reading.note(mark.line(), "YAML anchors and aliases are not supported");
                Yaml::Scalar(scalar(text, 0, String::new(), line, false))
            }
            // The first document only.
            Event::DocumentEnd => break,
            Event::StreamEnd => {
                reading.stream_end(line);
                break;
            }
            Event::StreamStart | Event::DocumentStart | Event::Nothing => continue,
        };
        reading.place(done, line);
    }
    reading.finish()
}

/// A refusal at `line`, with no path.
fn refusal(line: usize, reason: &str) -> Refused {
    Refused {
        line,
        path: String::new(),
        reason: reason.to_string(),
    }
}

/// What a rule file's events have built so far.
struct Reading<'t> {
    text: &'t str,
    /// The collections started and not yet ended, outermost first.
    open: Vec<Open<'t>>,
    /// The top-level mapping, once complete.
    root: Option<MarkedMappingNode<'t>>,
    /// The first problem that is not a scan error: reported once the
    /// document has been read, since a scan error (or a nesting too deep)
    /// later in it wins, as with the parser's own loader.
    problem: Option<Refused>,
}

impl<'t> Reading<'t> {
    /// Keeps `reason` at `line` as the problem, unless one came first.
    fn note(&mut self, line: usize, reason: &str) {
        if self.problem.is_none() {
            self.problem = Some(refusal(line, reason));
        }
    }

    /// The refusal of a scan error, which stops the reading at once.
    fn scan_error(&self, e: &ScanError) -> Refused {
        // The scanner reads a flow collection's brackets ahead of their
        // events, and stops past 255 of them with this error.
        if e.info() == "recursion limit exceeded" {
            return Refused {
                line: e.marker().line(),
                path: path_of(&self.open),
                reason: format!("nested deeper than {MAX_DEPTH} levels"),
            };
        }
        refusal(e.marker().line(), &format!("invalid YAML: {}", e.info()))
    }

    /// Opens a mapping or a sequence at `line`: refused at once past
    /// [`MAX_DEPTH`]; a tag, an anchor, a mapping as a key or a top level
    /// that is not a mapping noted as the problem.
    fn start(
        &mut self,
        is_mapping: bool,
        anchor: usize,
        tagged: bool,
        line: usize,
    ) -> Result<(), Refused> {
        if self.open.len() >= MAX_DEPTH {
            return Err(Refused {
                line,
                path: path_of(&self.open),
                reason: format!("nested deeper than {MAX_DEPTH} levels"),
            });
        }
        let reason = if tagged {
            Some("YAML tags are not supported")
        } else if anchor != 0 {
            Some("YAML anchors and aliases are not supported")
        } else if matches!(self.open.last(), Some(Open::Mapping { key: None, .. })) {
            Some("mapping keys must be strings")
        } else if self.open.is_empty() && self.root.is_none() && !is_mapping {
            Some("a rule file must be a mapping with `domain` and `descriptors`")
        } else {
            None
        };
        if let Some(reason) = reason {
            self.note(line, reason);
        }
        let line = u32::try_from(line).unwrap_or(u32::MAX);
        self.open.push(if is_mapping {
            Open::Mapping {
                line,
                entries: Vec::new(),
                key: None,
                index: None,
            }
        } else {
            Open::Sequence {
                line,
                items: Vec::new(),
            }
        });
        Ok(())
    }

    /// Closes the innermost collection: the complete node, if one was
    /// open.
    fn end(&mut self) -> Option<Yaml<'t>> {
        match self.open.pop()? {
            Open::Mapping { line, entries, .. } => {
                Some(Yaml::Mapping(MarkedMappingNode { entries, line }))
            }
            Open::Sequence { line, items } => {
                Some(Yaml::Sequence(MarkedSequenceNode { items, line }))
            }
        }
    }

    /// Notes what a scalar at `line` may not have: an anchor or a tag,
    /// or no collection to be in.
    fn scalar_problem(&mut self, anchor: usize, tagged: bool, line: usize) {
        let reason = if anchor != 0 {
            Some("YAML anchors and aliases are not supported")
        } else if tagged {
            Some("YAML tags are not supported")
        } else if self.open.is_empty() {
            Some("a rule file must be a mapping with `domain` and `descriptors`")
        } else {
            None
        };
        if let Some(reason) = reason {
            self.note(line, reason);
        }
    }

    /// At the end of the stream, an empty file is an empty mapping.
    fn stream_end(&mut self, line: u32) {
        if self.root.is_none() && self.problem.is_none() {
            self.root = Some(MarkedMappingNode {
                entries: Vec::new(),
                line,
            });
        }
    }

    /// Puts a complete node into the collection that holds it: a
    /// mapping's key or value, a sequence's item, or the root.
    fn place(&mut self, done: Yaml<'t>, line: u32) {
        match self.open.last_mut() {
            Some(Open::Mapping {
                entries,
                key,
                index,
                ..
            }) => match key.take() {
                None => match done {
                    Yaml::Scalar(k) => *key = Some(k),
                    // Refused above; a stand-in keeps the walk going.
                    _ => *key = Some(scalar(self.text, 0, "?".into(), line, false)),
                },
                Some(k) => {
                    if let Some(duplicate) = add_entry(entries, index, k, done)
                        && self.problem.is_none()
                    {
                        self.problem = Some(duplicate);
                    }
                }
            },
            Some(Open::Sequence { items, .. }) => items.push(done),
            None => {
                if let Yaml::Mapping(m) = done
                    && self.root.is_none()
                {
                    self.root = Some(m);
                }
            }
        }
    }

    /// The top-level mapping, or the first problem seen.
    fn finish(self) -> Result<MarkedMappingNode<'t>, Refused> {
        match (self.problem, self.root) {
            (Some(p), _) => Err(p),
            (None, Some(root)) => Ok(root),
            (None, None) => Err(refusal(
                1,
                "a rule file must be a mapping with `domain` and `descriptors`",
            )),
        }
    }
}

/// Adds the entry `k: value` to a mapping's `entries`, its keys indexed
/// once it has many. Returns the refusal of a duplicate key.
fn add_entry<'t>(
    entries: &mut Vec<(MarkedScalarNode<'t>, Yaml<'t>)>,
    index: &mut Option<HashMap<Cow<'t, str>, u32>>,
    k: MarkedScalarNode<'t>,
    value: Yaml<'t>,
) -> Option<Refused> {
    const INDEXED: usize = 16;
    if entries.len() == INDEXED {
        *index = Some(
            entries
                .iter()
                .map(|(e, _)| (e.text.clone(), e.line))
                .collect(),
        );
    }
    let first = match index {
        Some(index) => match index.entry(k.text.clone()) {
            Entry::Occupied(e) => Some(*e.get()),
            Entry::Vacant(e) => {
                e.insert(k.line);
                None
            }
        },
        None => entries
            .iter()
            .find(|(e, _)| e.text == k.text)
            .map(|(e, _)| e.line),
    };
    let duplicate = first.map(|first| {
        refusal(
            k.line as usize,
            &format!("duplicate key {:?} (first on line {first})", k.as_str()),
        )
    });
    entries.push((k, value));
    duplicate
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys<'a>(m: &'a MarkedMappingNode<'_>) -> Vec<&'a str> {
        m.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn scalars_slice_the_text_when_they_can() {
        let root = parse("a: plain\nb: 'quoted'\nc: \"esc\\taped\"\n").unwrap();
        let values: Vec<(&str, bool, bool)> = root
            .iter()
            .map(|(_, v)| match v {
                Yaml::Scalar(s) => (
                    s.as_str(),
                    s.may_coerce(),
                    matches!(s.text, Cow::Borrowed(_)),
                ),
                _ => panic!("{v:?}"),
            })
            .collect();
        assert_eq!(
            values,
            [
                ("plain", true, true),
                ("quoted", false, true),
                ("esc\taped", false, false)
            ]
        );
        assert_eq!(root.span().start().unwrap().line(), 1);
    }

    #[test]
    fn lines_and_nesting() {
        let root = parse("domain: d\ndescriptors:\n  - key: k\n    value: v\n").unwrap();
        assert_eq!(keys(&root), ["domain", "descriptors"]);
        let (_, list) = root.iter().nth(1).unwrap();
        let item = list.as_sequence().unwrap().iter().next().unwrap();
        assert_eq!(item.span().start().unwrap().line(), 3);
        let item = item.as_mapping().unwrap();
        assert_eq!(keys(item), ["key", "value"]);
        assert_eq!(
            item.iter().nth(1).unwrap().0.span().start().unwrap().line(),
            4
        );
    }

    #[test]
    fn refusals() {
        let reason = |text: &str| parse(text).map(|_| ()).unwrap_err();
        let r = reason("a: 1\nb: 2\na: 3\n");
        assert_eq!(
            (r.line, r.reason.as_str()),
            (3, "duplicate key \"a\" (first on line 1)")
        );
        // Past the size where keys are indexed, and a third time.
        let mut many: String = (0..40).map(|i| format!("k{i}: {i}\n")).collect();
        many.push_str("k7: again\nk7: and again\n");
        let r = reason(&many);
        assert_eq!(
            (r.line, r.reason.as_str()),
            (41, "duplicate key \"k7\" (first on line 8)")
        );
        assert_eq!(
            reason("- a\n").reason,
            "a rule file must be a mapping with `domain` and `descriptors`"
        );
        assert_eq!(
            reason("a: &x 1\nb: *x\n").reason,
            "YAML anchors and aliases are not supported"
        );
        assert_eq!(reason("a: !tag 1\n").reason, "YAML tags are not supported");
        assert_eq!(
            reason("? [a]\n: 1\n").reason,
            "mapping keys must be strings"
        );
        assert!(reason("a: [1\n").reason.starts_with("invalid YAML: "));
        // Too deep: refused with the path, before the node exists.
        let deep = format!("a: {}{}\n", "[".repeat(70), "]".repeat(70));
        let r = reason(&deep);
        assert_eq!(r.reason, format!("nested deeper than {MAX_DEPTH} levels"));
        assert!(r.path.starts_with("a[0][0]"), "{}", r.path);
    }

    #[test]
    fn empty_file_and_first_document_only() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse("# nothing\n").unwrap().is_empty());
        let root = parse("a: 1\n---\nb: [\n").unwrap();
        assert_eq!(keys(&root), ["a"]);
    }
}
