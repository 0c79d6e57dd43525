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
use yaml_rust2::scanner::TScalarStyle;

use super::depth::MAX_DEPTH;
use super::yaml::join;

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
            Open::Mapping { key: Some(k), .. } => path = join(&path, k.as_str()),
            Open::Mapping { .. } => {}
            Open::Sequence { items, .. } => path = format!("{path}[{}]", items.len()),
        }
    }
    path
}

/// The scalar `value` read at char index `at`: a slice of `text` when it
/// holds the value as it is there, else the value itself.
fn scalar<'t>(
    text: &'t str,
    at: usize,
    value: String,
    line: u32,
    plain: bool,
) -> MarkedScalarNode<'t> {
    let text = match text.get(at..at + value.len()) {
        Some(slice) if slice == value => Cow::Borrowed(slice),
        _ => Cow::Owned(value),
    };
    MarkedScalarNode { text, line, plain }
}

/// Parses a rule file's text into its top-level mapping.
pub(super) fn parse(text: &str) -> Result<MarkedMappingNode<'_>, Refused> {
    let refused = |line: usize, reason: &str| Refused {
        line,
        path: String::new(),
        reason: reason.to_string(),
    };
    let mut parser = Parser::new(text.chars());
    let mut open: Vec<Open<'_>> = Vec::new();
    let mut root: Option<MarkedMappingNode<'_>> = None;
    // The first problem that is not a scan error: reported once the
    // document has been read, since a scan error (or a nesting too deep)
    // later in it wins, as with the parser's own loader.
    let mut problem: Option<Refused> = None;
    loop {
        let (event, mark) = match parser.next_token() {
            Ok(next) => next,
            // The scanner reads a flow collection's brackets ahead of
            // their events, and stops past 255 of them with this error.
            Err(e) if e.info() == "recursion limit exceeded" => {
                return Err(Refused {
                    line: e.marker().line(),
                    path: path_of(&open),
                    reason: format!("nested deeper than {MAX_DEPTH} levels"),
                });
            }
            Err(e) => {
                return Err(refused(
                    e.marker().line(),
                    &format!("invalid YAML: {}", e.info()),
                ));
            }
        };
        let line = u32::try_from(mark.line()).unwrap_or(u32::MAX);
        let done: Yaml<'_> = match event {
            Event::MappingStart(anchor, ref tag) | Event::SequenceStart(anchor, ref tag) => {
                if open.len() >= MAX_DEPTH {
                    return Err(Refused {
                        line: mark.line(),
                        path: path_of(&open),
                        reason: format!("nested deeper than {MAX_DEPTH} levels"),
                    });
                }
                let is_mapping = matches!(event, Event::MappingStart(..));
                if problem.is_none() {
                    problem = if tag.is_some() {
                        Some(refused(mark.line(), "YAML tags are not supported"))
                    } else if anchor != 0 {
                        Some(refused(
                            mark.line(),
                            "YAML anchors and aliases are not supported",
                        ))
                    } else if matches!(open.last(), Some(Open::Mapping { key: None, .. })) {
                        Some(refused(mark.line(), "mapping keys must be strings"))
                    } else if open.is_empty() && root.is_none() && !is_mapping {
                        Some(refused(
                            mark.line(),
                            "a rule file must be a mapping with `domain` and `descriptors`",
                        ))
                    } else {
                        None
                    };
                }
                open.push(if is_mapping {
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
                continue;
            }
            Event::MappingEnd | Event::SequenceEnd => match open.pop() {
                Some(Open::Mapping { line, entries, .. }) => {
                    Yaml::Mapping(MarkedMappingNode { entries, line })
                }
                Some(Open::Sequence { line, items }) => {
                    Yaml::Sequence(MarkedSequenceNode { items, line })
                }
                None => continue,
            },
            Event::Scalar(value, style, anchor, tag) => {
                if problem.is_none() {
                    problem = if anchor != 0 {
                        Some(refused(
                            mark.line(),
                            "YAML anchors and aliases are not supported",
                        ))
                    } else if tag.is_some() {
                        Some(refused(mark.line(), "YAML tags are not supported"))
                    } else if open.is_empty() {
                        Some(refused(
                            mark.line(),
                            "a rule file must be a mapping with `domain` and `descriptors`",
                        ))
                    } else {
                        None
                    };
                }
                let plain = matches!(style, TScalarStyle::Plain);
                Yaml::Scalar(scalar(text, mark.index(), value, line, plain))
            }
            Event::Alias(_) => {
                if problem.is_none() {
                    problem = Some(refused(
                        mark.line(),
                        "YAML anchors and aliases are not supported",
                    ));
                }
                Yaml::Scalar(scalar(text, 0, String::new(), line, false))
            }
            // The first document only.
            Event::DocumentEnd => break,
            Event::StreamEnd => {
                if root.is_none() && problem.is_none() {
                    root = Some(MarkedMappingNode {
                        entries: Vec::new(),
                        line,
                    });
                }
                break;
            }
            Event::StreamStart | Event::DocumentStart | Event::Nothing => continue,
        };
        // A node is complete: it goes into the collection that holds it.
        match open.last_mut() {
            Some(Open::Mapping {
                entries,
                key,
                index,
                ..
            }) => match key.take() {
                None => match done {
                    Yaml::Scalar(k) => *key = Some(k),
                    // Refused above; a stand-in keeps the walk going.
                    _ => *key = Some(scalar(text, 0, "?".into(), line, false)),
                },
                Some(k) => {
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
                    if let Some(first) = first
                        && problem.is_none()
                    {
                        problem = Some(refused(
                            k.line as usize,
                            &format!("duplicate key {:?} (first on line {first})", k.as_str()),
                        ));
                    }
                    entries.push((k, done));
                }
            },
            Some(Open::Sequence { items, .. }) => items.push(done),
            None => {
                if let Yaml::Mapping(m) = done
                    && root.is_none()
                {
                    root = Some(m);
                }
            }
        }
    }
    match (problem, root) {
        (Some(p), _) => Err(p),
        (None, Some(root)) => Ok(root),
        (None, None) => Err(refused(
            1,
            "a rule file must be a mapping with `domain` and `descriptors`",
        )),
    }
}
