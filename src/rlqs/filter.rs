//! Envoy's quota filter enforcing one bucket's assignments, as the filter
//! behaves (not as the protocol documents it): a token bucket refilled
//! continuously at `tokens_per_fill / fill_interval`, full when first
//! assigned; rebuilt only when its shape changes, then starting with the
//! old bucket's remaining/max ratio; an assignment ends at its time to
//! live. For the simulator (`tollgate simulate-rlqs`) and the tests that
//! check a bound with Envoys in it: what the server cannot see (requests
//! before the first assignment, after an expiry) follows `fallback`.

use super::bucket::Assignment;

const SEC: u64 = 1_000_000;

/// One bucket of one Envoy.
#[derive(Debug, Clone)]
pub struct Filter {
    enforced: Option<Enforced>,
    expires: u64,
    /// What requests get without an assignment in force: Envoy's default
    /// is to allow them; a check of what the server bounds denies them.
    fallback: bool,
    /// Requests allowed and denied since [`Filter::take_usage`].
    allowed: u64,
    denied: u64,
    /// Tokens it was given beyond its rate: each new bucket's first fill
    /// and what a ratio-keeping rebuild added.
    gained: f64,
}

#[derive(Debug, Clone)]
enum Enforced {
    Allow,
    Deny,
    Tokens {
        tokens: f64,
        max: f64,
        per_micro: f64,
        at: u64,
        shape: (u32, u32, u64),
    },
}

impl Filter {
    /// A bucket with no assignment yet; `fallback` allows requests then.
    pub fn new(fallback: bool) -> Filter {
        Filter {
            enforced: None,
            expires: u64::MAX,
            fallback,
            allowed: 0,
            denied: 0,
            gained: 0.0,
        }
    }

    /// One request at `now`: whether it passes.
    pub fn admit(&mut self, now: u64) -> bool {
        if now >= self.expires {
            self.enforced = None;
        }
        let ok = match &mut self.enforced {
            None => self.fallback,
            Some(Enforced::Allow) => true,
            Some(Enforced::Deny) => false,
            Some(Enforced::Tokens {
                tokens,
                max,
                per_micro,
                at,
                ..
            }) => {
                *tokens = (*tokens + (now - *at) as f64 * *per_micro).min(*max);
                *at = now;
                if *tokens >= 1.0 {
                    *tokens -= 1.0;
                    true
                } else {
                    false
                }
            }
        };
        if ok {
            self.allowed += 1;
        } else {
            self.denied += 1;
        }
        ok
    }

    /// The requests allowed and denied since the last call: a report's.
    pub fn take_usage(&mut self) -> (u64, u64) {
        let usage = (self.allowed, self.denied);
        (self.allowed, self.denied) = (0, 0);
        usage
    }

    /// Tokens its bucket holds at `now` (0 without one in force).
    pub fn tokens(&self, now: u64) -> f64 {
        if now >= self.expires {
            return 0.0;
        }
        self.filled(now)
    }

    /// Tokens the last bucket would hold at `now`, expired or not.
    fn filled(&self, now: u64) -> f64 {
        match &self.enforced {
            Some(Enforced::Tokens {
                tokens,
                max,
                per_micro,
                at,
                ..
            }) => (tokens + now.saturating_sub(*at) as f64 * per_micro).min(*max),
            _ => 0.0,
        }
    }

    /// The rate its bucket fills at, tokens per microsecond (0 without a
    /// bucket in force at `now`).
    pub fn per_micro(&self, now: u64) -> f64 {
        match &self.enforced {
            Some(Enforced::Tokens { per_micro, .. }) if now < self.expires => *per_micro,
            _ => 0.0,
        }
    }

    /// Whether an `ALLOW_ALL` assignment is in force at `now`.
    pub fn allows_all(&self, now: u64) -> bool {
        matches!(self.enforced, Some(Enforced::Allow)) && now < self.expires
    }

    /// Tokens given beyond the rate so far (see the field).
    pub fn gained(&self) -> f64 {
        self.gained
    }

    /// An assignment arrives at `now`, held `ttl_secs`.
    pub fn assign(&mut self, now: u64, assignment: Assignment, ttl_secs: u64) {
        // Tokens of a bucket whose assignment had lapsed come back with
        // the new one: beyond the rate, as a first fill is.
        let lapsed = now >= self.expires;
        self.expires = now + ttl_secs * SEC;
        let before = self.filled(now);
        let carried = if lapsed { 0.0 } else { before };
        let (max_tokens, tokens_per_fill, fill_secs) = match assignment {
            Assignment::AllowAll => {
                self.enforced = Some(Enforced::Allow);
                return;
            }
            Assignment::DenyAll => {
                self.enforced = Some(Enforced::Deny);
                return;
            }
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_secs,
            } => (max_tokens, tokens_per_fill, fill_secs),
        };
        let shape = (max_tokens, tokens_per_fill, fill_secs);
        let max = f64::from(max_tokens);
        let ratio = match &self.enforced {
            Some(Enforced::Tokens {
                max: old_max,
                shape: old,
                ..
            }) => {
                if *old == shape {
                    // Unchanged: Envoy keeps the bucket as it is.
                    if let Some(Enforced::Tokens { tokens, at, .. }) = &mut self.enforced {
                        *tokens = before;
                        *at = now;
                    }
                    self.gained += before - carried;
                    return;
                }
                (before / old_max).min(1.0)
            }
            _ => 1.0,
        };
        let tokens = ratio * max;
        self.gained += (tokens - carried).max(0.0);
        self.enforced = Some(Enforced::Tokens {
            tokens,
            max,
            per_micro: f64::from(tokens_per_fill) / (fill_secs * SEC) as f64,
            at: now,
            shape,
        });
    }
}
