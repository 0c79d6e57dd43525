//! The one place where limiter keys are formatted.
//!
//! Layout of a key:
//!
//! ```text
//! <prefix>:{<tag>}:<algo><window seconds>:<role>:<identity>
//! tg2:{3f9a0c4e1b7d2a65}:l60:z:api:user=alice:path=%2Fv1
//! ```
//!
//! * `prefix` is a setting (default `tg2`; the trailing digit versions the
//!   layout: `tg1` keys had a SHA-256 tag) so several deployments can share
//!   one Redis.
//! * `tag` is the 64-bit FNV-1a hash of the identity, in hex. Redis Cluster
//!   hashes only the text inside the first `{...}`, so every key of one
//!   limiter lands in one slot (no `CROSSSLOT` in a script) while different
//!   limiters spread over all slots. The tag only spreads limiters: the
//!   identity after it tells them apart, so two identities sharing a tag
//!   share a slot and nothing else, and a fast hash is enough. FNV-1a is
//!   fixed by its definition, so every replica and version computes the same
//!   tag. Sharding a hot limiter over several slots adds a suffix inside the
//!   braces (`{<tag>.<n>}`), which no identity-derived tag can contain.
//! * `algo` is `f`, `c`, `l` or `t` (fixed window, counter, log, token
//!   bucket) followed by the
//!   window length, so changing a rule's algorithm or unit starts a fresh
//!   counter instead of misreading an old one. A counter with other than
//!   the default 2 buckets adds `b` and its bucket count (`c60b10`), so a
//!   changed bucket count never reads another layout's state. A calendar
//!   window (`timezone:`) adds `@` and its zone's IANA name after its
//!   unit's nominal length (`f2592000@Europe/Berlin` for a month), so it
//!   never shares state with an epoch-aligned window of that length nor
//!   with the same unit in another zone (zone names hold no `:`, `{` or
//!   `}`). A staggered window (a counter's buckets starting at an offset
//!   of its descriptor, [`crate::limit::Window::staggered`]) adds `~`
//!   after its length (`c60~`), so that replicas placing its buckets
//!   otherwise (a version that placed them on the epoch) keep their own
//!   count instead of misreading this one.
//! * `role` names the key within a limiter (`h` hash state, `z` log set, `m`
//!   log metadata, `q` the lease ledger of a quota-shared limit: the
//!   limit's own algorithm and window, so each limit of a `rate_limits:`
//!   list keeps its own ledger, as it keeps its own count; never sharded,
//!   and a counter's ledger without its `b` part). A token bucket has one
//!   key, its `h` hash; its burst is not in the key (a changed burst keeps
//!   the tokens spent).
//! * `identity` is the domain then `:key=value` per entry, each part escaped:
//!   `%`, `:`, `=`, `{`, `}`, space and control bytes become `%XX`. Escaping is
//!   injective (every `%` in the output starts an escape), so no two different
//!   descriptors produce the same identity: `a_b`+`c` and `a`+`b_c` differ, and
//!   no value can open or close a hash tag.
//! * An identity longer than [`MAX_IDENTITY`] bytes is replaced by `%H`
//!   followed by the full SHA-256 of it in hex, which keeps keys bounded
//!   (Redis keys and the embedded store's alike, so that a long descriptor
//!   value does not make a limiter heavy in either); `%H`
//!   cannot occur in an escaped identity, so a hashed identity never equals a
//!   plain one. Here the hash stands for the identity, so it must resist
//!   collisions.
//!
//! * Before any of this, a descriptor value longer than `max_value_bytes`
//!   (a setting, 256 by default) enters the identity as [`DIGEST_MARK`],
//!   `sha256:` and the SHA-256 of all its bytes in hex ([`identity_value`]).
//!   Values come from clients (headers, paths), so any length must be
//!   decided, never refused; the digest keeps every layer's memory per
//!   limiter bounded. A value that itself starts with the mark is digested
//!   too, so a digest never equals a value sent as it is: two long values
//!   differing in their last byte are two limiters, equal ones share one.
//!
//! * A value a `share_threshold` wildcard matched enters the identity as
//!   [`SHARED_MARK`] and the pattern, so every value it matches shares one
//!   limiter; a value sent starting with that mark is digested, so no
//!   client value equals a shared one.
//!
//! * Outside every limiter's layout, one key per prefix: `<prefix>:resets`,
//!   the counter a reset moves ([`KeyBuilder::resets`]).
//!
//! A key is built in one buffer, its tag written in place once the identity
//! after it is known: one allocation per key, since every decision builds
//! one.

use std::fmt::Write;

use sha2::{Digest, Sha256};

use crate::limit::DEFAULT_BUCKETS;
use crate::storage::{Hit, Shard};

/// Starts a value that stands for a longer one (see the module docs): a
/// control character, which no ordinary value begins with.
pub const DIGEST_MARK: char = '\u{1}';

/// Starts the value of an entry a `share_threshold` wildcard matched: the
/// pattern follows, so every value it matches shares one limiter. A value
/// sent with this mark is digested ([`identity_value`]), so none equals it.
pub const SHARED_MARK: char = '\u{2}';

/// The value a `share_threshold` wildcard's matches share: the mark, then
/// the pattern.
pub fn shared_value(pattern: &str) -> String {
    let mut out = String::with_capacity(1 + pattern.len());
    out.push(SHARED_MARK);
    out.push_str(pattern);
    out
}

/// Default for the longest descriptor value kept as it is in an identity.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 256;

/// The value as it enters a limiter's identity: itself when at most `max`
/// bytes, else its digest (see the module docs).
pub fn identity_value(value: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if value.len() <= max && !value.starts_with([DIGEST_MARK, SHARED_MARK]) {
        return std::borrow::Cow::Borrowed(value);
    }
    let digest = Sha256::digest(value.as_bytes());
    let mut out = String::with_capacity(8 + 64);
    out.push(DIGEST_MARK);
    out.push_str("sha256:");
    for b in digest.iter() {
        let _ = write!(out, "{b:02x}");
    }
    std::borrow::Cow::Owned(out)
}

/// `entries` with every value as it enters an identity: borrowed as they
/// are when none needs a digest (the common case: no allocation).
pub fn identity_entries(
    entries: &[(String, String)],
    max_value: usize,
) -> std::borrow::Cow<'_, [(String, String)]> {
    if entries
        .iter()
        .all(|(_, v)| v.len() <= max_value && !v.starts_with([DIGEST_MARK, SHARED_MARK]))
    {
        return std::borrow::Cow::Borrowed(entries);
    }
    std::borrow::Cow::Owned(
        entries
            .iter()
            .map(|(k, v)| (k.clone(), identity_value(v, max_value).into_owned()))
            .collect(),
    )
}

/// Longest identity kept verbatim in a key.
pub const MAX_IDENTITY: usize = 256;

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "tg2";

/// Role of a key within one limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Fixed window and counter state (a hash).
    State,
    /// The sliding log's sorted set.
    LogSet,
    /// The sliding log's running sum and sequence (a hash).
    LogMeta,
    /// The lease ledger of a limit shared among quota streams (a hash:
    /// holder to `granted:expires:demand`).
    Lease,
}

impl Role {
    fn code(self) -> &'static str {
        match self {
            Role::State => "h",
            Role::LogSet => "z",
            Role::LogMeta => "m",
            Role::Lease => "q",
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
    /// The state key (role `h`); the other roles differ in one byte.
    text: String,
    /// Byte offset of the role code in `text`.
    role_at: usize,
    /// Byte range of the tag in `text`, braces included.
    tag: std::ops::Range<usize>,
}

/// Hex digits of a tag.
const TAG_LEN: usize = 16;
const TAG_PLACEHOLDER: &str = "0000000000000000";

impl LimiterKeys {
    pub fn key(&self, role: Role) -> String {
        self.clone().into_key(role)
    }

    /// The key of `role`, reusing this buffer.
    pub fn into_key(mut self, role: Role) -> String {
        self.text
            .replace_range(self.role_at..self.role_at + 1, role.code());
        self.text
    }

    /// The hash tag, braces included.
    pub fn tag(&self) -> &str {
        &self.text[self.tag.clone()]
    }

    /// The Redis Cluster slot of every key of this limiter: the slot a
    /// shard's suffix was chosen for, by the same function.
    pub fn slot(&self) -> u16 {
        slot_of(self.tag())
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
        let mut text = String::with_capacity(self.prefix.len() + TAG_LEN + 16 + identity_len(hit));
        text.push_str(&self.prefix);
        text.push_str(":{");
        let tag_at = text.len();
        text.push_str(TAG_PLACEHOLDER);
        text.push_str("}:");
        let tag = tag_at - 1..text.len() - 1;
        push_algo(&mut text, hit);
        text.push(':');
        let role_at = text.len();
        text.push_str(Role::State.code());
        text.push(':');
        let identity_at = text.len();
        push_identity(&mut text, hit);
        let hash = fnv1a(&text.as_bytes()[identity_at..]);
        let mut hex = [0u8; TAG_LEN];
        for (i, digit) in hex.iter_mut().enumerate() {
            *digit = HEX[((hash >> (60 - 4 * i)) & 0xf) as usize];
        }
        // Hex digits are ASCII: the replacement keeps the string valid.
        text.replace_range(
            tag_at..tag_at + TAG_LEN,
            std::str::from_utf8(&hex).unwrap_or_default(),
        );
        let mut tag = tag;
        let mut role_at = role_at;
        let mut identity_at = identity_at;
        if hit.shard.is_sharded() {
            let suffix = shard_suffix(&hex, hit.shard);
            text.insert_str(tag.end - 1, &suffix);
            tag.end += suffix.len();
            role_at += suffix.len();
            identity_at += suffix.len();
        }
        hash_long_identity(&mut text, identity_at);
        LimiterKeys { text, role_at, tag }
    }

    /// The counter every reset of a limiter under this prefix increments,
    /// which replicas read to forget their cached refusals (see
    /// `Store::reset_generation`): one per prefix, outside every
    /// limiter's layout (no tag, no role).
    pub fn resets(&self) -> String {
        format!("{}:resets", self.prefix)
    }

    /// The key of a limiter held in this process (the embedded store): the
    /// algorithm, window and identity, without prefix or tag, which only
    /// matter to a shared server. A long identity is hashed as in Redis
    /// keys, so a held limiter's key stays within a few hundred bytes.
    pub fn local(&self, hit: &Hit<'_>) -> String {
        let mut text = String::with_capacity(8 + identity_len(hit));
        push_algo(&mut text, hit);
        text.push(':');
        let identity_at = text.len();
        push_identity(&mut text, hit);
        if hash_long_identity(&mut text, identity_at) {
            // The store keeps the key and is charged for its capacity.
            text.shrink_to_fit();
        }
        text
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Replaces an identity (from `identity_at` to the end of `text`) longer
/// than [`MAX_IDENTITY`] by `%H` and its SHA-256 in hex; true when it did.
fn hash_long_identity(text: &mut String, identity_at: usize) -> bool {
    if text.len() - identity_at <= MAX_IDENTITY {
        return false;
    }
    let digest = Sha256::digest(&text.as_bytes()[identity_at..]);
    text.truncate(identity_at);
    text.push_str("%H");
    for b in digest.iter() {
        let _ = write!(text, "{b:02x}");
    }
    true
}

/// The algorithm, window and (for a counter with other than the default
/// buckets) the bucket count: what must change the key when it changes.
fn push_algo(text: &mut String, hit: &Hit<'_>) {
    let spec = hit.algorithm.spec();
    text.push(spec.key_code);
    let _ = write!(text, "{}", hit.window.seconds());
    if let Some(zone) = hit.window.zone() {
        text.push('@');
        text.push_str(zone.name());
    }
    if hit.window.is_staggered() {
        text.push('~');
    }
    if spec.keys_buckets && hit.buckets != DEFAULT_BUCKETS {
        let _ = write!(text, "b{}", hit.buckets);
    }
    if hit.shard.is_sharded() {
        // The count, not only the index: a changed shard count changes every
        // share, so it starts fresh state instead of reading the old one.
        let _ = write!(text, "s{}.{}", hit.shard.count, hit.shard.index);
    }
}

/// Redis Cluster's slot count.
const SLOTS: u32 = 16384;

/// The text appended inside a sharded limiter's braces: `.<index>.<n>`,
/// with `n` the first number that puts the tag's slot in the middle
/// quarter of the index's share of the slot range (shard `i` of `N` owns
/// slots `i*16384/N..(i+1)*16384/N`). Shards therefore sit in different
/// slots, spread evenly over the slot range and so over the primaries of a
/// cluster that splits the range evenly, whatever the tag; and every
/// replica computes the same text without knowing the cluster.
fn shard_suffix(hex: &[u8; TAG_LEN], shard: Shard) -> String {
    let count = u32::from(shard.count.max(1));
    let index = u32::from(shard.index) % count;
    let center = (2 * index + 1) * SLOTS / (2 * count);
    let half = (SLOTS / (8 * count)).max(1);
    let (low, high) = (center.saturating_sub(half), center + half);
    let head = format!(".{index}.");
    let mut crc = crc16(0, hex);
    crc = crc16(crc, head.as_bytes());
    let mut digits = String::new();
    for n in 0u32..1_000_000 {
        digits.clear();
        let _ = write!(digits, "{n}");
        let slot = u32::from(crc16(crc, digits.as_bytes())) % SLOTS;
        if (low..high).contains(&slot) {
            return format!("{head}{n}");
        }
    }
    // Unreachable in practice (a window of at least 64 slots is met within
    // a few hundred tries); still a valid, distinct suffix.
    format!("{head}x")
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis
/// Cluster maps keys to slots with, continued from `crc`.
fn crc16(mut crc: u16, bytes: &[u8]) -> u16 {
    for &b in bytes {
        crc = (crc << 8) ^ CRC16_TABLE[usize::from(((crc >> 8) as u8) ^ b)];
    }
    crc
}

const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The slot Redis Cluster gives `key`: the text inside its first `{...}`
/// when that is non-empty, else the whole key.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    (u32::from(crc16(0, hashed)) % SLOTS) as u16
}

/// The identity's length before escaping: a good first guess.
fn identity_len(hit: &Hit<'_>) -> usize {
    hit.domain.len()
        + hit
            .entries
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum::<usize>()
}

fn push_identity(out: &mut String, hit: &Hit<'_>) {
    escape_into(out, hit.domain);
    for (k, v) in hit.entries {
        out.push(':');
        escape_into(out, k);
        out.push('=');
        escape_into(out, v);
    }
}

/// 64-bit FNV-1a, as specified (offset basis and prime of the 64-bit
/// variant).
fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_on(0xcbf2_9ce4_8422_2325, bytes)
}

fn fnv1a_on(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A hash of a limiter's descriptor (its domain and entries) that every
/// replica and every version computes alike: FNV-1a over each string
/// after its length, then a 64-bit finalizer (splitmix64's), so that its
/// remainder by any window is spread evenly. Where a counter's buckets
/// start ([`crate::limit::algorithms::sliding_counter::phase`]).
pub fn descriptor_hash(domain: &str, entries: &[(String, String)]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325;
    let strings =
        std::iter::once(domain).chain(entries.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]));
    for s in strings {
        hash = fnv1a_on(hash, &(s.len() as u64).to_le_bytes());
        hash = fnv1a_on(hash, s.as_bytes());
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// Appends `s` with every byte that is special in a key escaped as `%XX`.
/// Special bytes are ASCII, which never occurs inside a multi-byte UTF-8
/// sequence, so scanning bytes is exact; runs of plain bytes are copied
/// whole.
fn escape_into(out: &mut String, s: &str) {
    let mut plain = 0;
    for (i, b) in s.bytes().enumerate() {
        if matches!(b, b'%' | b':' | b'=' | b'{' | b'}' | b' ' | 0..=0x1f | 0x7f) {
            out.push_str(&s[plain..i]);
            out.push('%');
            out.push(char::from(HEX_UPPER[usize::from(b >> 4)]));
            out.push(char::from(HEX_UPPER[usize::from(b & 0xf)]));
            plain = i + 1;
        }
    }
    out.push_str(&s[plain..]);
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;
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
            window: Unit::Minute.into(),
            hits: 1,
            negative: false,
            usage_reports: false,
            buckets: 2,
            burst: 0,
            shard: crate::storage::Shard::NONE,
            receipt: false,
            also: &[],
            lease: false,
            ahead: crate::storage::Ahead::NONE,
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
    fn a_descriptor_hash_stays_what_it_was() {
        // Replicas of every version place a counter's buckets by it: a
        // change moves every counter's buckets.
        let e = vec![("user".to_string(), "alice".to_string())];
        assert_eq!(
            descriptor_hash("api", &e),
            descriptor_hash("api", &e.clone())
        );
        assert_ne!(descriptor_hash("api", &e), descriptor_hash("apiuser", &[]));
        assert_eq!(descriptor_hash("api", &e), 5_803_481_564_278_766_997);
    }

    #[test]
    fn fnv1a_matches_its_definition() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// Replicas of every version must build the same key for the same
    /// limiter: a change here is a new layout and needs a new prefix.
    #[test]
    fn layout_is_pinned() {
        let k = keys("api", &[("user", "alice smith"), ("path", "/v1:x")]);
        let tag = format!("{{{:016x}}}", fnv1a(b"api:user=alice%20smith:path=/v1%3Ax"));
        assert_eq!(k.tag(), tag);
        assert_eq!(
            k.key(Role::LogSet),
            format!("tg2:{tag}:l60:z:api:user=alice%20smith:path=/v1%3Ax")
        );
        assert_eq!(
            k.clone().into_key(Role::LogMeta),
            format!("tg2:{tag}:l60:m:api:user=alice%20smith:path=/v1%3Ax")
        );
        assert_eq!(
            k.key(Role::State),
            format!("tg2:{tag}:l60:h:api:user=alice%20smith:path=/v1%3Ax")
        );
    }

    #[test]
    fn escaping_keeps_multibyte_text() {
        let k = keys("d", &[("k", "é:ü%\u{1}")]).key(Role::State);
        assert!(k.ends_with(":d:k=é%3Aü%25%01"), "{k}");
    }

    #[test]
    fn local_keys_tell_limiters_apart() {
        let entries = vec![("k".to_owned(), "v".to_owned())];
        let hit = |algorithm, unit: Unit| Hit {
            domain: "d",
            entries: &entries,
            algorithm,
            limit: 1,
            window: unit.into(),
            hits: 1,
            negative: false,
            usage_reports: false,
            buckets: DEFAULT_BUCKETS,
            burst: 0,
            shard: crate::storage::Shard::NONE,
            receipt: false,
            also: &[],
            lease: false,
            ahead: crate::storage::Ahead::NONE,
        };
        let b = KeyBuilder::default();
        let fixed = b.local(&hit(Algorithm::FixedWindow, Unit::Second));
        assert_eq!(fixed, "f1:d:k=v");
        let counter = |buckets| {
            b.local(&Hit {
                buckets,
                ..hit(Algorithm::SlidingWindowCounter, Unit::Second)
            })
        };
        assert_eq!(counter(DEFAULT_BUCKETS), "c1:d:k=v");
        assert_eq!(counter(10), "c1b10:d:k=v");
        // Staggered buckets are another layout: their own count.
        let staggered = Hit {
            window: crate::limit::Window::of(Unit::Second).staggered(),
            buckets: 10,
            ..hit(Algorithm::SlidingWindowCounter, Unit::Second)
        };
        assert_eq!(b.local(&staggered), "c1~b10:d:k=v");
        assert_eq!(b.local(&staggered.ledger()), "c1:d:k=v");
        assert_ne!(fixed, b.local(&hit(Algorithm::FixedWindow, Unit::Minute)));
        // A window of several units (`unit_multiplier`) is named by its
        // length, so the same length written either way is one limiter.
        let two = Hit {
            window: crate::limit::Window::new(Unit::Second, 2).unwrap(),
            ..hit(Algorithm::FixedWindow, Unit::Second)
        };
        assert_eq!(b.local(&two), "f2:d:k=v");
        let sixty = Hit {
            window: crate::limit::Window::new(Unit::Second, 60).unwrap(),
            ..hit(Algorithm::FixedWindow, Unit::Second)
        };
        assert_eq!(
            b.local(&sixty),
            b.local(&hit(Algorithm::FixedWindow, Unit::Minute))
        );
        assert_ne!(
            fixed,
            b.local(&hit(Algorithm::SlidingWindowCounter, Unit::Second))
        );
        // Long identities are hashed, bounded and still apart.
        let long = |last: &str| {
            let entries = vec![("k".to_owned(), format!("{}{last}", "a".repeat(10_000)))];
            b.local(&Hit {
                entries: &entries,
                ..hit(Algorithm::FixedWindow, Unit::Second)
            })
        };
        let (a, z) = (long("a"), long("z"));
        assert!(a.starts_with("f1:%H") && a.len() == 5 + 64, "{a}");
        assert_eq!(a.capacity(), a.len());
        assert_ne!(a, z);
    }

    #[test]
    fn layout_is_readable() {
        let k = keys("api", &[("user", "alice smith")]).key(Role::LogSet);
        assert!(k.starts_with("tg2:{"), "{k}");
        assert!(k.ends_with("}:l60:z:api:user=alice%20smith"), "{k}");
    }

    #[test]
    fn slots_are_redis_clusters() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        for (key, slot) in [
            ("foo", 12182),
            ("somekey", 11058),
            ("{user1000}.following", 3443),
            ("tg2:{abc.1.2}:x", 15444),
            ("{}x", 10595),
            ("a{}b{c}", 7353),
        ] {
            assert_eq!(slot_of(key), slot, "{key}");
        }
    }

    #[test]
    fn shards_get_their_own_keys_in_spread_slots() {
        let entries = vec![("tenant".to_owned(), "big".to_owned())];
        let hit = |shard| Hit {
            domain: "d",
            entries: &entries,
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            window: Unit::Hour.into(),
            hits: 1,
            negative: false,
            usage_reports: false,
            buckets: 2,
            burst: 0,
            shard,
            receipt: false,
            also: &[],
            lease: false,
            ahead: crate::storage::Ahead::NONE,
        };
        let b = KeyBuilder::default();
        let plain = b.limiter(&hit(Shard::NONE));
        for count in [2u16, 3, 8, 64] {
            let mut slots = Vec::new();
            for index in 0..count {
                let k = b.limiter(&hit(Shard { index, count }));
                let key = k.key(Role::State);
                // The shard's tag extends the limiter's own.
                assert!(k.tag().starts_with(&plain.tag()[..17]), "{key}");
                assert_eq!(key.matches('{').count(), 1, "{key}");
                let slot = u32::from(slot_of(&key));
                // In the middle quarter of the shard's part of the slots.
                let part = 16384 / u32::from(count);
                let center = (2 * u32::from(index) + 1) * 16384 / (2 * u32::from(count));
                assert!(slot.abs_diff(center) <= part / 8 + 1, "{key}: slot {slot}");
                slots.push(slot);
                assert_ne!(key, plain.key(Role::State));
                assert_ne!(
                    b.local(&hit(Shard { index, count })),
                    b.local(&hit(Shard::NONE))
                );
            }
            slots.dedup();
            assert_eq!(slots.len(), usize::from(count));
        }
        // A different shard count is different state.
        assert_ne!(
            b.limiter(&hit(Shard { index: 0, count: 2 })),
            b.limiter(&hit(Shard { index: 0, count: 3 }))
        );
    }
}
