//! Matching a request descriptor against a domain's rule tree, exactly as the
//! reference service does, except that a `*` may stand anywhere in a value
//! (the reference only honours a trailing one).
//!
//! Per entry, one node is chosen at the current level: the exact key+value,
//! else the first wildcard of that key (file order) whose pattern matches,
//! else the key-only default. There is no backtracking: a failure deeper down
//! never retries a sibling. Only the node chosen by the last entry gives a
//! limit, so a request longer than every rule path gets none, and a shorter
//! one gets the limit of the node where it ends, if that node has one.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::{Domain, Level, Node, Rule};

pub(super) fn find<'a>(domain: &'a Domain, entries: &[(String, String)]) -> Option<&'a Rule> {
    let ((last_key, last_value), init) = entries.split_last()?;
    let mut level = &domain.root;
    for (key, value) in init {
        let node = lookup(level, key, value)?;
        if node.children.is_empty() {
            return None;
        }
        level = &node.children;
    }
    lookup(level, last_key, last_value)?.rule.as_deref()
}

/// How one entry of a descriptor was matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    /// By its exact key and value.
    Exact,
    /// By a wildcard value: the pattern, and that node's flags.
    Wildcard {
        pattern: &'a str,
        shared: bool,
        value_to_metric: bool,
    },
    /// By the key alone (the node has no value).
    Default { value_to_metric: bool },
}

/// The steps of the same walk as [`find`], one per entry matched; shorter
/// than `entries` when the walk stops early (no rule applies then).
pub(super) fn steps<'a>(domain: &'a Domain, entries: &[(String, String)]) -> Vec<Step<'a>> {
    let mut out = Vec::with_capacity(entries.len());
    let mut level = &domain.root;
    for (i, (key, value)) in entries.iter().enumerate() {
        let Some((node, step)) = lookup_step(level, key, value) else {
            break;
        };
        out.push(step);
        if i + 1 < entries.len() && node.children.is_empty() {
            break;
        }
        level = &node.children;
    }
    out
}

fn lookup_step<'a>(level: &'a Level, key: &str, value: &str) -> Option<(&'a Node, Step<'a>)> {
    if let Some(n) = level.exact.get(&(key, value) as &dyn Pair) {
        return Some((n, Step::Exact));
    }
    if let Some(n) = level
        .wildcard
        .iter()
        .find(|n| &*n.key == key && glob(&n.value, value))
    {
        let step = Step::Wildcard {
            pattern: &n.value,
            shared: n.share_threshold,
            value_to_metric: n.value_to_metric,
        };
        return Some((n, step));
    }
    let n = level.default.get(key)?;
    Some((
        n,
        Step::Default {
            value_to_metric: n.value_to_metric,
        },
    ))
}

/// The node chosen for one entry at one level.
fn lookup<'a>(level: &'a Level, key: &str, value: &str) -> Option<&'a Node> {
    level
        .exact
        .get(&(key, value) as &dyn Pair)
        .or_else(|| {
            level
                .wildcard
                .iter()
                .find(|n| &*n.key == key && glob(&n.value, value))
        })
        .or_else(|| level.default.get(key))
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters
/// (the empty one too) and every other character only itself.
///
/// Greedy with a single backtrack point (the last `*` seen): on a mismatch the
/// last star absorbs one more character. Linear in practice, `O(p * t)` at
/// worst, no allocation. Bytewise, which is exact for UTF-8 since `*` is ASCII.
pub(super) fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    // (pattern index after the star, text index the star's run ends at)
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            pi += 1;
            star = Some((pi, ti));
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// Looks up `exact: HashMap<(Arc<str>, Arc<str>), _>` with two `&str`
/// without building two strings per entry on the request path: both tuple
/// kinds hash and compare through this trait, the same way as the owned
/// tuple does (each field's `str` hash, in order).
trait Pair {
    fn pair(&self) -> (&str, &str);
}

impl Pair for (Arc<str>, Arc<str>) {
    fn pair(&self) -> (&str, &str) {
        (&self.0, &self.1)
    }
}

impl Pair for (&str, &str) {
    fn pair(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> Borrow<dyn Pair + 'a> for (Arc<str>, Arc<str>) {
    fn borrow(&self) -> &(dyn Pair + 'a) {
        self
    }
}

impl Hash for dyn Pair + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (a, b) = self.pair();
        a.hash(state);
        b.hash(state);
    }
}

impl PartialEq for dyn Pair + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.pair() == other.pair()
    }
}

impl Eq for dyn Pair + '_ {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_cases() {
        let cases = [
            ("*", "", true),
            ("*", "anything", true),
            ("a*", "a", true),
            ("a*", "abc", true),
            ("a*", "ba", false),
            ("*z", "xyz", true),
            ("*z", "zx", false),
            ("a*z", "az", true),
            ("a*z", "a-b-z", true),
            ("a*z", "a-b-zz", true),
            ("a*z", "a-b-zy", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "acb", false),
            ("**", "x", true),
            ("a**b", "ab", true),
            ("/api/*/users", "/api/v1/users", true),
            ("/api/*/users", "/api/v1/groups", false),
            ("héllo*", "héllo wörld", true),
            ("*ö*", "wörld", true),
            ("abc", "abc", true),
            ("abc", "abd", false),
            ("a*", "", false),
        ];
        for (pattern, text, want) in cases {
            assert_eq!(glob(pattern, text), want, "glob({pattern:?}, {text:?})");
        }
    }

    #[test]
    fn borrowed_lookup_matches_owned_keys() {
        let mut map = std::collections::HashMap::new();
        map.insert((Arc::from("k"), Arc::from("v")), 1);
        map.insert((Arc::from("k"), Arc::from("w")), 2);
        assert_eq!(map.get(&("k", "v") as &dyn Pair), Some(&1));
        assert_eq!(map.get(&("k", "w") as &dyn Pair), Some(&2));
        assert_eq!(map.get(&("kv", "") as &dyn Pair), None);
        assert_eq!(map.get(&("", "kv") as &dyn Pair), None);
    }
}
