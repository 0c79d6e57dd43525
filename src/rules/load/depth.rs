//! The nesting bound, checked before the YAML parser (which recurses) runs.

use super::yaml::join;

/// Deepest nesting of mappings and lists a rule file may have, counting the
/// top-level mapping as 1. The YAML parser recurses once per level while it
/// builds its tree (and dropping the tree recurses again), so a file nested
/// a few thousand levels deep would overflow a thread's stack and take the
/// whole server down; `too_deep` checks this bound first. A real rule file
/// nests descriptors maybe ten deep, two levels each (a list, then its
/// mapping), plus the root, a `rate_limit` and a `replaces` list: about 25.
/// 64 allows 31 levels of descriptors with a `rate_limit` on the deepest.
/// Whatever else recurses over a rule tree (`Walker::level`, matching,
/// naming, describing) goes down one descriptor, two YAML levels, per call,
/// so this bounds it too.
pub const MAX_DEPTH: usize = 64;

/// The line and YAML path of the first mapping or list nested deeper than
/// [`MAX_DEPTH`], if any. This reads the event stream of the parser that
/// marked-yaml builds on, which keeps its state on the heap and builds
/// nothing, so it is safe at any depth and sees the nesting exactly as the
/// real parse will, whatever the style (block, compact `- - -`, flow
/// `[[` / `{{`, or mixed). It stops at the first collection too deep. On a
/// YAML error it gives up: the real parse stops at the same error, after no
/// deeper nesting than was read here.
pub(super) fn too_deep(text: &str) -> Option<(usize, String)> {
    use yaml_rust2::Event;
    use yaml_rust2::parser::Parser;

    /// An open collection and where in it the parser is.
    enum Open {
        /// `key` is the last key read; `in_value` while its value is read.
        Mapping { key: String, in_value: bool },
        /// The index of the item being read.
        List { index: usize },
    }

    /// A node ended inside the innermost collection: a mapping moves from
    /// key to value or back, a list to its next item.
    fn node_done(open: &mut [Open], scalar: Option<String>) {
        match open.last_mut() {
            Some(Open::Mapping { key, in_value }) => {
                if !*in_value {
                    // A key that is not a scalar is refused by the real parse.
                    *key = scalar.unwrap_or_else(|| "?".into());
                }
                *in_value = !*in_value;
            }
            Some(Open::List { index }) => *index += 1,
            None => {}
        }
    }

    /// The YAML path of the node being read.
    fn path_of(open: &[Open]) -> String {
        let mut path = String::new();
        for o in open {
            match o {
                Open::Mapping {
                    key,
                    in_value: true,
                } => path = join(&path, key),
                Open::Mapping { .. } => {}
                Open::List { index } => path = format!("{path}[{index}]"),
            }
        }
        path
    }

    let mut open: Vec<Open> = Vec::new();
    let mut parser = Parser::new(text.chars());
    loop {
        let (event, mark) = match parser.next_token() {
            Ok(next) => next,
            // The scanner reads a flow collection's brackets ahead of their
            // events, and stops past 255 of them with this error: far too
            // deep, but only its own position is known, and the path of
            // the collection that holds them.
            Err(e) if e.info() == "recursion limit exceeded" => {
                return Some((e.marker().line(), path_of(&open)));
            }
            Err(_) => return None,
        };
        match event {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                if open.len() >= MAX_DEPTH {
                    return Some((mark.line(), path_of(&open)));
                }
                open.push(match event {
                    Event::MappingStart(..) => Open::Mapping {
                        key: String::new(),
                        in_value: false,
                    },
                    _ => Open::List { index: 0 },
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                open.pop();
                node_done(&mut open, None);
            }
            Event::Scalar(value, ..) => node_done(&mut open, Some(value)),
            Event::Alias(_) => node_done(&mut open, None),
            // marked-yaml reads the first document only.
            Event::DocumentEnd | Event::StreamEnd => return None,
            Event::StreamStart | Event::DocumentStart | Event::Nothing => {}
        }
    }
}
