//! The one place where limiter keys are formatted.
//!
//! Layout of a key:
//!
//! ```text
//! <prefix>:{<tag>}:<algo><window seconds>:<role>:<identity>
//! tg1:{3f9a0c4e1b7d2a65}:l60:z:api:user=alice:path=%2Fv1
//! ```
//!
//! * `prefix` is a setting (default `tg1`; the trailing digit versions the
//!   layout) so several deployments can share one Redis.
//! * `tag` is the first 64 bits of SHA-256 of the identity, in hex. Redis
//!   Cluster hashes only the text inside the first `{...}`, so every key of one
//!   limiter lands in one slot (no `CROSSSLOT` in a script) while different
//!   limiters spread over all slots. Sharding a hot limiter over several slots
//!   adds a suffix inside the braces (`{<tag>.<n>}`), which no identity-derived
//!   tag can contain.
//! * `algo` is `f`, `c` or `l` (fixed window, counter, log) followed by the
//!   window length, so changing a rule's algorithm or unit starts a fresh
//!   counter instead of misreading an old one. A counter with other than
//!   the default 2 buckets adds `b` and its bucket count (`c60b10`), so a
//!   changed bucket count never reads another layout's state.
//! * `role` names the key within a limiter (`h` hash state, `z` log set, `m`
//!   log metadata).
//! * `identity` is the domain then `:key=value` per entry, each part escaped:
//!   `%`, `:`, `=`, `{`, `}`, space and control bytes become `%XX`. Escaping is
//!   injective (every `%` in the output starts an escape), so no two different
//!   descriptors produce the same identity: `a_b`+`c` and `a`+`b_c` differ, and
//!   no value can open or close a hash tag.
//! * An identity longer than [`MAX_IDENTITY`] bytes is replaced by `%H`
//!   followed by the full SHA-256 of it in hex, which keeps keys bounded; `%H`
//!   cannot occur in an escaped identity, so a hashed identity never equals a
//!   plain one.

use std::fmt::Write;

use sha2::{Digest, Sha256};

use crate::limit::{Algorithm, DEFAULT_BUCKETS};
use crate::storage::Hit;

/// Longest identity kept verbatim in a key.
pub const MAX_IDENTITY: usize = 256;

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "tg1";

/// Role of a key within one limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Fixed window and counter state (a hash).
    State,
    /// The sliding log's sorted set.
    LogSet,
    /// The sliding log's running sum and sequence (a hash).
    LogMeta,
}

impl Role {
    fn code(self) -> &'static str {
        match self {
            Role::State => "h",
            Role::LogSet => "z",
            Role::LogMeta => "m",
        }
    }
}

/// Builds keys under one prefix.
#[derive(Debug, Clone)]
pub struct KeyBuilder {
    prefix: String,
}

impl Default for KeyBuilder {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX)
    }
}

/// The keys of one limiter: they share a hash tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterKeys {
    /// Everything up to the role, e.g. `tg1:{3f9a...}:l60`.
    head: String,
    identity: String,
}

impl LimiterKeys {
    pub fn key(&self, role: Role) -> String {
        format!("{}:{}:{}", self.head, role.code(), self.identity)
    }

    /// The hash tag, braces included.
    pub fn tag(&self) -> &str {
        let start = self.head.find('{').unwrap_or(0);
        let end = self
            .head
            .find('}')
            .map(|e| e + 1)
            .unwrap_or(self.head.len());
        &self.head[start..end]
    }
}

impl KeyBuilder {
    /// `prefix` must not contain `{` or `}` (settings validate this).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn limiter(&self, hit: &Hit<'_>) -> LimiterKeys {
        let mut identity = String::with_capacity(64);
        escape_into(&mut identity, hit.domain);
        for (k, v) in hit.entries {
            identity.push(':');
            escape_into(&mut identity, k);
            identity.push('=');
            escape_into(&mut identity, v);
        }
        let digest = Sha256::digest(identity.as_bytes());
        let mut tag = String::with_capacity(16);
        for b in &digest[..8] {
            let _ = write!(tag, "{b:02x}");
        }
        if identity.len() > MAX_IDENTITY {
            let mut hashed = String::with_capacity(66);
            hashed.push_str("%H");
            for b in digest.iter() {
                let _ = write!(hashed, "{b:02x}");
            }
            identity = hashed;
        }
        let algo = match hit.algorithm {
            Algorithm::FixedWindow => 'f',
            Algorithm::SlidingWindowCounter => 'c',
            Algorithm::SlidingWindowLog => 'l',
        };
        let mut head = format!("{}:{{{}}}:{}{}", self.prefix, tag, algo, hit.unit.seconds());
        if hit.algorithm == Algorithm::SlidingWindowCounter && hit.buckets != DEFAULT_BUCKETS {
            let _ = write!(head, "b{}", hit.buckets);
        }
        LimiterKeys { head, identity }
    }
}

/// Appends `s` with every byte that is special in a key escaped as `%XX`.
fn escape_into(out: &mut String, s: &str) {
    for ch in s.chars() {
        match ch {
            '%' | ':' | '=' | '{' | '}' | ' ' | '\u{0}'..='\u{1f}' | '\u{7f}' => {
                let _ = write!(out, "%{:02X}", ch as u32);
            }
            _ => out.push(ch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Unit;

    fn keys(domain: &str, entries: &[(&str, &str)]) -> LimiterKeys {
        let entries: Vec<(String, String)> = entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        KeyBuilder::default().limiter(&Hit {
            domain,
            entries: &entries,
            algorithm: Algorithm::SlidingWindowLog,
            limit: 1,
            unit: Unit::Minute,
            hits: 1,
            negative: false,
            buckets: 2,
        })
    }

    #[test]
    fn naive_join_collisions_are_distinct() {
        let a = keys("d", &[("k", "a_b"), ("k2", "c")]);
        let b = keys("d", &[("k", "a"), ("k2", "b_c")]);
        assert_ne!(a, b);
        let a = keys("d", &[("k", "a:k2=b")]);
        let b = keys("d", &[("k", "a"), ("k2", "b")]);
        assert_ne!(a.key(Role::LogSet), b.key(Role::LogSet));
        let a = keys("d:x", &[]);
        let b = keys("d", &[("x", "")]);
        assert_ne!(a.key(Role::LogSet), b.key(Role::LogSet));
    }

    #[test]
    fn braces_in_values_never_form_a_tag() {
        let k = keys("d", &[("k", "}{x}")]);
        let key = k.key(Role::LogSet);
        let open = key.find('{').unwrap();
        let close = key.find('}').unwrap();
        assert_eq!(&key[open..=close], k.tag());
        assert_eq!(key.matches('{').count(), 1);
        assert_eq!(key.matches('}').count(), 1);
        assert_eq!(k.tag().len(), 18);
    }

    #[test]
    fn long_values_are_bounded_and_distinct() {
        let long_a = "a".repeat(10_000);
        let long_b = format!("{}b", "a".repeat(9_999));
        let a = keys("d", &[("k", &long_a)]).key(Role::State);
        let b = keys("d", &[("k", &long_b)]).key(Role::State);
        assert!(a.len() < 120, "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn bucket_count_is_part_of_a_counter_identity() {
        let entries = vec![("k".to_string(), "v".to_string())];
        let key = |algorithm, buckets| {
            KeyBuilder::default()
                .limiter(&Hit {
                    domain: "d",
                    entries: &entries,
                    algorithm,
                    limit: 1,
                    unit: Unit::Minute,
                    hits: 1,
                    negative: false,
                    buckets,
                })
                .key(Role::State)
        };
        let counter = Algorithm::SlidingWindowCounter;
        assert!(key(counter, 2).contains("}:c60:h:"), "{}", key(counter, 2));
        assert!(
            key(counter, 10).contains("}:c60b10:h:"),
            "{}",
            key(counter, 10)
        );
        assert_ne!(key(counter, 10), key(counter, 60));
        // Other algorithms ignore the count: one limiter whatever it says.
        let fixed = Algorithm::FixedWindow;
        assert_eq!(key(fixed, 2), key(fixed, 10));
    }

    #[test]
    fn layout_is_readable() {
        let k = keys("api", &[("user", "alice smith")]).key(Role::LogSet);
        assert!(k.starts_with("tg1:{"), "{k}");
        assert!(k.ends_with("}:l60:z:api:user=alice%20smith"), "{k}");
    }
}
