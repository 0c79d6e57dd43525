//! A leased limiter's identity as the leasing layer keeps it: the
//! descriptor (domain and entries) in one allocation, and the few numbers
//! that make its limit. A leased hit counts no usage reports, takes no
//! receipt, is neither sharded nor on a list and has no calendar window
//! ([`super::hits::leased`]), so none of those is kept: two hits with
//! equal keys count against the same state with the same limit. One
//! allocation instead of one per string keeps the map's entry small, so
//! the layer holds more limiters in the same memory.

use crate::limit::{Algorithm, Window};
use crate::storage::limiter::LimiterId;
use crate::storage::{Hit, Shard};

/// The identity of a limiter the layer holds.
pub(super) struct LeaseKey {
    /// The domain, then each entry's key and value, each after its
    /// length (4 bytes, little-endian).
    text: Box<[u8]>,
    pub(super) limit: u64,
    pub(super) burst: u64,
    pub(super) window: Window,
    pub(super) shard: Shard,
    pub(super) algorithm: Algorithm,
    pub(super) buckets: u8,
}

/// The lookup shortcut for `hit`'s key: the parts a [`LeaseKey`] keeps,
/// hashed with a fixed seed (a collision costs a comparison, never a
/// wrong answer).
pub(super) fn fingerprint(hit: &Hit<'_>) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one((
        hit.domain,
        hit.entries,
        hit.algorithm,
        hit.limit,
        hit.window,
        hit.buckets,
        hit.burst,
        hit.shard,
    ))
}

fn push(text: &mut Vec<u8>, s: &str) {
    let len = u32::try_from(s.len()).expect("a descriptor string is under 4 GiB");
    text.extend_from_slice(&len.to_le_bytes());
    text.extend_from_slice(s.as_bytes());
}

/// The next string of `text` from `at`, and where the one after starts.
fn next(text: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let len = u32::from_le_bytes(text.get(at..at + 4)?.try_into().ok()?) as usize;
    let start = at + 4;
    Some((text.get(start..start + len)?, start + len))
}

impl LeaseKey {
    pub(super) fn of(hit: &Hit<'_>) -> LeaseKey {
        let size = 4
            + hit.domain.len()
            + hit
                .entries
                .iter()
                .map(|(k, v)| 8 + k.len() + v.len())
                .sum::<usize>();
        let mut text = Vec::with_capacity(size);
        push(&mut text, hit.domain);
        for (k, v) in hit.entries {
            push(&mut text, k);
            push(&mut text, v);
        }
        LeaseKey {
            text: text.into_boxed_slice(),
            limit: hit.limit,
            burst: hit.burst,
            window: hit.window,
            shard: hit.shard,
            algorithm: hit.algorithm,
            buckets: hit.buckets,
        }
    }

    /// Whether `hit` is on this limiter (its cost and kind aside).
    pub(super) fn is(&self, hit: &Hit<'_>) -> bool {
        self.limit == hit.limit
            && self.algorithm == hit.algorithm
            && self.window == hit.window
            && self.buckets == hit.buckets
            && self.burst == hit.burst
            && self.shard == hit.shard
            && self.text_is(hit)
    }

    fn text_is(&self, hit: &Hit<'_>) -> bool {
        let strings = std::iter::once(hit.domain).chain(
            hit.entries
                .iter()
                .flat_map(|(k, v)| [k.as_str(), v.as_str()]),
        );
        let mut at = 0;
        for s in strings {
            match next(&self.text, at) {
                Some((kept, after)) if kept == s.as_bytes() => at = after,
                _ => return false,
            }
        }
        at == self.text.len()
    }

    /// The limiter's full identity, owned (a give-back's hit is built from
    /// it: one allocation per string, off the request path).
    pub(super) fn to_id(&self) -> LimiterId {
        let mut strings = Vec::new();
        let mut at = 0;
        while let Some((s, after)) = next(&self.text, at) {
            // Written from `&str`s: always UTF-8.
            strings.push(String::from_utf8_lossy(s).into_owned());
            at = after;
        }
        let mut strings = strings.into_iter();
        let domain = strings.next().unwrap_or_default();
        let mut entries = Vec::with_capacity(strings.len() / 2);
        while let (Some(k), Some(v)) = (strings.next(), strings.next()) {
            entries.push((k, v));
        }
        LimiterId {
            domain: domain.into(),
            entries: entries.into(),
            algorithm: self.algorithm,
            limit: self.limit,
            window: self.window,
            buckets: self.buckets,
            burst: self.burst,
            shard: self.shard,
            usage_reports: false,
            receipt: false,
            also: Box::new([]),
        }
    }

    /// The bytes the key holds on the heap.
    pub(super) fn heap_bytes(&self) -> usize {
        self.text.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Unit;
    use crate::storage::Ahead;
    use crate::storage::limiter::Limiter;

    fn hit<'a>(domain: &'a str, entries: &'a [(String, String)]) -> Hit<'a> {
        Hit {
            domain,
            entries,
            algorithm: Algorithm::SlidingWindowCounter,
            limit: 100,
            window: Window::new(Unit::Minute, 1).unwrap(),
            hits: 1,
            negative: false,
            usage_reports: false,
            buckets: 2,
            burst: 0,
            shard: Shard::NONE,
            receipt: false,
            also: &[],
            lease: true,
            ahead: Ahead::NONE,
        }
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_key_is_its_hit_and_no_other() {
        let one = entries(&[("user", "alice"), ("path", "/a")]);
        let key = LeaseKey::of(&hit("d", &one));
        assert!(key.is(&hit("d", &one)));
        // The same bytes cut differently are another descriptor.
        for other in [
            entries(&[("user", "alic"), ("epath", "/a")]),
            entries(&[("user", "alice")]),
            entries(&[("user", "alice"), ("path", "/a"), ("x", "")]),
            entries(&[("user", "alice"), ("path", "/b")]),
        ] {
            assert!(!key.is(&hit("d", &other)), "{other:?}");
        }
        assert!(!key.is(&hit("e", &one)));
        assert!(!key.is(&Hit {
            limit: 101,
            ..hit("d", &one)
        }));
        assert!(!key.is(&Hit {
            buckets: 3,
            ..hit("d", &one)
        }));
        // Empty strings are kept as such.
        let empty = entries(&[("", "")]);
        let key = LeaseKey::of(&hit("", &empty));
        assert!(key.is(&hit("", &empty)));
        assert!(!key.is(&hit("", &[])));
    }

    #[test]
    fn the_full_identity_comes_back() {
        let one = entries(&[("user", "ålice"), ("path", "")]);
        let h = hit("dom", &one);
        let id = LeaseKey::of(&h).to_id();
        assert!(h.is(&id));
        assert_eq!(id, h.to_id());
    }
}
