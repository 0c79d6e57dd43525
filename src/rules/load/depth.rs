//! The nesting bound, checked on the parser's events (`tree`) before any
//! node deeper than it is built.

/// Deepest nesting of mappings and lists a rule file may have, counting the
/// top-level mapping as 1. Dropping a parsed tree recurses once per level,
/// so a file nested a few thousand levels deep would overflow a thread's
/// stack and take the whole server down; `tree::parse` refuses it first. A real rule file
/// nests descriptors maybe ten deep, two levels each (a list, then its
/// mapping), plus the root, a `rate_limit` and a `replaces` list: about 25.
/// 64 allows 31 levels of descriptors with a `rate_limit` on the deepest.
/// Whatever else recurses over a rule tree (`Walker::level`, matching,
/// naming, describing) goes down one descriptor, two YAML levels, per call,
/// so this bounds it too.
pub const MAX_DEPTH: usize = 64;
