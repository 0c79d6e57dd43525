//! One bucket of a usage report: its id to the rule RLS would apply, and
//! the rule (with the ledger's grant) to the assignment Envoy enforces.

use crate::limit::algorithms::Rlqs;
use crate::limit::{Algorithm, FailurePolicy, Window};
use crate::quota;
use crate::rules::{LimitSpec, Rule};
use crate::storage::keys::identity_entries;

/// What a bucket id's entries may be; past these a bucket is skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdLimits {
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
}

/// Why a bucket was skipped: each a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// No entries, or an empty key or value (the protocol requires both).
    Empty,
    /// More entries than `max_entries`, or a key past `max_key_bytes`:
    /// both come from the operator's bucket builders.
    TooLarge,
    /// The stream already tracks `rlqs.max_buckets` buckets, or the
    /// replica's streams `rlqs.max_total_buckets` together.
    TooManyBuckets,
    /// The bucket's rule counts in calendar windows (`timezone`): a
    /// budget renewed at a local boundary is not a rate a token bucket in
    /// Envoy can enforce, so RLQS leaves it alone (Envoy's
    /// `no_assignment_behavior` applies); RLS enforces it.
    Calendar,
}

impl Skip {
    pub const ALL: [Skip; 4] = [
        Skip::Empty,
        Skip::TooLarge,
        Skip::TooManyBuckets,
        Skip::Calendar,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Empty => "empty_id",
            Skip::TooLarge => "id_too_large",
            Skip::TooManyBuckets => "too_many_buckets",
            Skip::Calendar => "calendar_window",
        }
    }
}

/// The entries a bucket id maps to, in the documented order: keys in
/// bytewise order (a bucket id is an unordered map, so one order has to be
/// chosen; rules are written with their keys nested in this order). A value
/// past `max_value_bytes` is matched whole and enters the limiter's
/// identity as a digest, as in RLS.
pub fn entries<'a>(
    id: impl IntoIterator<Item = (&'a String, &'a String)>,
    limits: IdLimits,
) -> Result<Vec<(String, String)>, Skip> {
    let mut entries: Vec<(String, String)> = id
        .into_iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if entries.is_empty() || entries.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
        return Err(Skip::Empty);
    }
    if entries.len() > limits.max_entries
        || entries.iter().any(|(k, _)| k.len() > limits.max_key_bytes)
    {
        return Err(Skip::TooLarge);
    }
    entries.sort_unstable();
    Ok(entries)
}

/// The entries as a limiter's identity (long values as digests).
pub fn identity(entries: &[(String, String)], max_value_bytes: usize) -> Vec<(String, String)> {
    identity_entries(entries, max_value_bytes).into_owned()
}

/// What a bucket gets, before it is put in protocol terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    AllowAll,
    DenyAll,
    /// `tokens_per_fill` every `fill_secs`, at most `max_tokens` at once.
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_secs: u64,
    },
}

/// How a rule is enforced by quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// No limit (no rule, `unlimited`): allow all, count nothing.
    Free,
    /// A 0 limit: deny all.
    Banned,
    /// Shadow mode: allow all, but usage is counted on the rule.
    Shadow,
    /// A limit shared by lease.
    Leased { limit: u64, window: Window },
}

/// How requests decided one at a time count `limit` per `window` of
/// `rule`, when the ledger's shares are to keep one count with them
/// ([`quota::Counted`]): a fixed window (the rule's algorithm, else
/// `default`), epoch-aligned, where a share held `hold_micros` covers few
/// enough windows; or a token bucket. Neither sharded (shards count in
/// other slots). `None`: the ledger bounds the shares on its own (the
/// sliding windows, whose counts do not say when a hit is spent).
pub fn counted(
    rule: &Rule,
    default: Algorithm,
    limit: u64,
    window: Window,
    hold_micros: u64,
) -> Option<quota::Counted> {
    if rule.shards.unwrap_or(1) > 1 || window.zone().is_some() {
        return None;
    }
    let w = window.micros();
    match rule.algorithm.unwrap_or(default).spec().rlqs {
        Rlqs::Window => quota::window::Fixed::fits(w, hold_micros).then_some(
            quota::Counted::Window(quota::window::Fixed {
                limit,
                window_micros: w,
            }),
        ),
        Rlqs::Bucket => Some(quota::Counted::Bucket(quota::bucket::Bucket {
            limit,
            burst: rule.burst.unwrap_or(0),
        })),
        Rlqs::Ledger | Rlqs::Never => None,
    }
}

pub fn plan(rule: Option<&Rule>, global_shadow: bool) -> Plan {
    let Some(rule) = rule else {
        return Plan::Free;
    };
    let banned = |r: &Rule| {
        matches!(
            r.limit,
            LimitSpec::PerUnit {
                requests_per_unit: 0,
                ..
            }
        )
    };
    match rule.limit {
        LimitSpec::Unlimited => Plan::Free,
        _ if rule.shadow_mode || global_shadow => Plan::Shadow,
        // A zero limit anywhere in a `rate_limits:` list.
        _ if rule.more.iter().any(banned) => Plan::Banned,
        // A limit a quota stream cannot release what it took from (a
        // count in flight; rules name such an algorithm, it is never the
        // default): refused, never passed.
        _ if std::iter::once(rule)
            .chain(&rule.more)
            .any(|r| r.algorithm.is_some_and(|a| a.spec().rlqs == Rlqs::Never)) =>
        {
            Plan::Banned
        }
        LimitSpec::PerUnit {
            requests_per_unit: 0,
            ..
        } => Plan::Banned,
        LimitSpec::PerUnit {
            requests_per_unit,
            window,
        } => Plan::Leased {
            limit: u64::from(requests_per_unit),
            window,
        },
    }
}

/// A grant as a token bucket: `tokens` per fill interval, and a burst of
/// `burst` times the share of one window (at least one token). No tokens
/// is `DENY_ALL`: Envoy refuses a bucket of 0 tokens per fill.
pub fn token_bucket(tokens: u64, window: Window, burst: f64) -> Assignment {
    if tokens == 0 {
        return Assignment::DenyAll;
    }
    let fill_secs = quota::fill_secs(window);
    let per_window = tokens as f64 * window.seconds() as f64 / fill_secs as f64;
    let max_tokens = (per_window * burst).ceil().clamp(1.0, f64::from(u32::MAX)) as u32;
    Assignment::TokenBucket {
        max_tokens,
        tokens_per_fill: tokens.min(u64::from(u32::MAX)) as u32,
        fill_secs,
    }
}

/// A bucket under several limits (`rate_limits:`), granted a share of
/// each: the token bucket of the share with the fewest tokens per second,
/// its size held within every share's tokens per window, so that neither
/// the rate nor a burst passes any of them.
pub fn token_bucket_within(grants: &[(u64, Window)], burst: f64) -> Assignment {
    let rate = |&(tokens, window): &(u64, Window)| tokens as f64 / quota::fill_secs(window) as f64;
    let Some(&(tokens, window)) = grants.iter().min_by(|a, b| rate(a).total_cmp(&rate(b))) else {
        return Assignment::DenyAll;
    };
    match token_bucket(tokens, window, burst) {
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_secs,
        } => {
            let within = grants
                .iter()
                .map(|&(t, w)| {
                    let per_window = t as f64 * w.seconds() as f64 / quota::fill_secs(w) as f64;
                    per_window.floor().clamp(1.0, f64::from(u32::MAX)) as u32
                })
                .min()
                .unwrap_or(max_tokens);
            Assignment::TokenBucket {
                max_tokens: max_tokens.min(within),
                tokens_per_fill,
                fill_secs,
            }
        }
        other => other,
    }
}

/// The stricter of two assignments: the slower rate, in a bucket no
/// larger than either's (within both, whichever fills faster).
pub fn stricter(a: Assignment, b: Assignment) -> Assignment {
    match (a, b) {
        (Assignment::DenyAll, _) | (_, Assignment::DenyAll) => Assignment::DenyAll,
        (Assignment::AllowAll, other) | (other, Assignment::AllowAll) => other,
        (
            Assignment::TokenBucket {
                max_tokens: ma,
                tokens_per_fill: ta,
                fill_secs: fa,
            },
            Assignment::TokenBucket {
                max_tokens: mb,
                tokens_per_fill: tb,
                fill_secs: fb,
            },
        ) => {
            // ta / fa against tb / fb, exactly.
            let (tokens_per_fill, fill_secs) = if u128::from(ta) * u128::from(fb.max(1))
                <= u128::from(tb) * u128::from(fa.max(1))
            {
                (ta, fa)
            } else {
                (tb, fb)
            };
            Assignment::TokenBucket {
                max_tokens: ma.min(mb),
                tokens_per_fill,
                fill_secs,
            }
        }
    }
}

/// What a bucket gets when the store fails and no earlier grant is in
/// force: the rule's failure policy (`error` cannot be said per bucket,
/// so it leaves Envoy to its own no-assignment behaviour: no answer).
pub fn on_failure(policy: FailurePolicy) -> Option<Assignment> {
    match policy {
        FailurePolicy::Allow => Some(Assignment::AllowAll),
        FailurePolicy::Deny => Some(Assignment::DenyAll),
        FailurePolicy::Error => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Unit;

    const LIMITS: IdLimits = IdLimits {
        max_entries: 2,
        max_key_bytes: 8,
        max_value_bytes: 16,
    };

    fn id(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_stricter_assignment_is_the_slower_within_both() {
        let bucket = |max_tokens, tokens_per_fill, fill_secs| Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_secs,
        };
        // 12000 a minute against 6000 a minute: the slower rate, the
        // smaller bucket, whichever order.
        let old = bucket(200, 12_000, 60);
        let new = bucket(100, 6_000, 60);
        assert_eq!(stricter(old, new), new);
        assert_eq!(stricter(new, old), new);
        // Rates compared exactly across fill intervals: 10 per 2 s is
        // slower than 6 per second, and the bucket is the smaller one.
        assert_eq!(
            stricter(bucket(50, 10, 2), bucket(6, 6, 1)),
            bucket(6, 10, 2)
        );
        assert_eq!(stricter(Assignment::DenyAll, new), Assignment::DenyAll);
        assert_eq!(stricter(Assignment::AllowAll, new), new);
        assert_eq!(stricter(new, Assignment::AllowAll), new);
    }

    #[test]
    fn keys_are_sorted_and_ids_checked() {
        let given = id(&[("path", "/a"), ("name", "x")]);
        let got = entries(given.iter().map(|(k, v)| (k, v)), LIMITS).unwrap();
        assert_eq!(got, id(&[("name", "x"), ("path", "/a")]));
        let check = |pairs: &[(&str, &str)]| {
            let given = id(pairs);
            entries(given.iter().map(|(k, v)| (k, v)), LIMITS)
        };
        assert_eq!(check(&[]), Err(Skip::Empty));
        assert_eq!(check(&[("a", "")]), Err(Skip::Empty));
        assert_eq!(check(&[("", "b")]), Err(Skip::Empty));
        assert_eq!(
            check(&[("a", "1"), ("b", "2"), ("c", "3")]),
            Err(Skip::TooLarge)
        );
        assert_eq!(check(&[("a_long_key", "1")]), Err(Skip::TooLarge));
        let long = "v".repeat(100);
        let ok = check(&[("a", long.as_str())]).unwrap();
        assert_eq!(ok[0].1.len(), 100, "matched whole");
        assert_ne!(identity(&ok, 16)[0].1, long, "a digest in the identity");
    }

    #[test]
    fn grants_become_buckets_envoy_reads() {
        assert_eq!(
            token_bucket(0, Unit::Second.into(), 1.0),
            Assignment::DenyAll
        );
        assert_eq!(
            token_bucket(6_000, Unit::Second.into(), 1.0),
            Assignment::TokenBucket {
                max_tokens: 100,
                tokens_per_fill: 6_000,
                fill_secs: 60
            }
        );
        assert_eq!(
            token_bucket(1, Unit::Second.into(), 1.0),
            Assignment::TokenBucket {
                max_tokens: 1,
                tokens_per_fill: 1,
                fill_secs: 60
            }
        );
        // 10 per 2 seconds (`unit_multiplier: 2`): 300 a minute, 10 at once.
        let two = crate::limit::Window::new(Unit::Second, 2).unwrap();
        assert_eq!(
            token_bucket(300, two, 1.0),
            Assignment::TokenBucket {
                max_tokens: 10,
                tokens_per_fill: 300,
                fill_secs: 60
            }
        );
        assert_eq!(
            token_bucket(50, Unit::Hour.into(), 0.5),
            Assignment::TokenBucket {
                max_tokens: 25,
                tokens_per_fill: 50,
                fill_secs: 3_600
            }
        );
    }

    #[test]
    fn a_bucket_under_several_limits_stays_within_each() {
        // 60 a minute and 2 a second, the whole of each granted: the
        // minute's rate (1/s) is the slower, and a burst never passes the
        // second's 2.
        let shares = [
            (60, Window::of(Unit::Minute)),
            (120, Window::of(Unit::Second)),
        ];
        assert_eq!(
            token_bucket_within(&shares, 1.0),
            Assignment::TokenBucket {
                max_tokens: 2,
                tokens_per_fill: 60,
                fill_secs: 60
            }
        );
        // Alone, the minute's share would allow 60 at once.
        assert_eq!(
            token_bucket(60, Window::of(Unit::Minute), 1.0),
            Assignment::TokenBucket {
                max_tokens: 60,
                tokens_per_fill: 60,
                fill_secs: 60
            }
        );
        // A share of nothing denies.
        let none = [
            (0, Window::of(Unit::Minute)),
            (120, Window::of(Unit::Second)),
        ];
        assert_eq!(token_bucket_within(&none, 1.0), Assignment::DenyAll);
    }
}
