//! One count for a limit that Envoys' shares (RLQS) and requests decided
//! one at a time (RLS, and replicas' leases of tokens) both spend, when it
//! is a token bucket.
//!
//! A share of `s` tokens per fill of `F` seconds lets an Envoy take
//! `s * t / F` tokens in any time `t` it holds, plus its own bucket's
//! burst. The limit's bucket refills at the limit's rate, which the shares
//! in force never pass together (the ledger's invariant), so the shares
//! fit in its rate; what a share will take is charged to the bucket when
//! it is granted, to the end of its life, at once: the bucket may go into
//! debt, and requests decided one at a time are refused until the refill
//! has paid it back. At the holder's next report, what the old share would
//! have taken after [`MARGIN_MICROS`] is given back (never above the
//! bucket's size) and the new one charged; over the margin the larger of
//! the two is charged (Envoy spends the old share until the answer
//! arrives). A share that expires has been charged to its end.
//!
//! So over any time `T` the bucket and the shares admit at most the
//! bucket's burst plus `T` times its rate, plus the Envoys' bursts, the
//! bound each has alone. Charges are rounded up and give-backs down, so a
//! report can cost a token more than the share took.
//!
//! Requests decided one at a time take no part in the water-filling here
//! (a bucket keeps no measure of their rate); instead a share is the
//! stream's max-min fair share of the streams' demands, without the part
//! of what nobody asked for that a share has elsewhere: that part would be
//! charged to the bucket whether the Envoy spends it or not. Requests get
//! what the shares leave of the rate.

use super::{Grant, Ledger, Report, Terms};

pub use super::window::MARGIN_MICROS;

/// A token bucket's limit, as its rule gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Tokens per window.
    pub limit: u64,
    /// Its size, as a rule's `burst` says it (0: the limit).
    pub burst: u64,
}

/// One report's grant, and what it changes in the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub grant: Grant,
    /// Tokens the old share will not take: given back first.
    pub give_back: u64,
    /// Tokens the new share may take: charged after.
    pub charge: u64,
}

/// One stream's report on a limit counted in a token bucket: the ledger's
/// grant, what the old share gives back and what the new one is charged.
pub fn report(ledger: &mut Ledger, holder: &str, usage: Report, terms: Terms, now: u64) -> Charge {
    let fill = u128::from(terms.fill_secs.saturating_mul(1_000_000).max(1));
    let tokens = |s: u64, from: u64, to: u64| u128::from(s) * u128::from(to.saturating_sub(from));
    let whole = |tm: u128, up: bool| {
        let n = if up { tm.div_ceil(fill) } else { tm / fill };
        u64::try_from(n).unwrap_or(u64::MAX)
    };
    let (old, margin_end, give_back) = match ledger.share(holder, now) {
        Some(old) => {
            let end = old.expires_micros;
            let margin_end = now.saturating_add(MARGIN_MICROS).min(end);
            let back = whole(tokens(old.granted, margin_end, end), false);
            (old.granted, margin_end, back)
        }
        None => (0, now, 0),
    };
    // No part of what nobody asked for: it would be charged to the
    // bucket, spent or not, and taken from requests decided one at a time.
    let grant = ledger.report_beside(holder, usage, terms, now, None, false);
    let to = now.saturating_add(terms.hold_micros);
    let s = grant.tokens;
    let charge = whole(
        tokens(s, margin_end, to) + tokens(s.saturating_sub(old), now, margin_end),
        true,
    );
    Charge {
        grant,
        give_back,
        charge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000;

    fn terms() -> Terms {
        // 100 a second: 6,000 tokens a minute.
        Terms {
            capacity: 6_000,
            fill_secs: 60,
            hold_micros: 16 * SEC,
        }
    }

    fn busy() -> Report {
        Report {
            requests: 1_000_000,
            elapsed_secs: 5,
        }
    }

    #[test]
    fn a_share_is_charged_to_its_end_and_what_it_will_not_take_comes_back() {
        let mut ledger = Ledger::default();
        let c = report(&mut ledger, "a", busy(), terms(), 0);
        assert_eq!(c.grant.tokens, 6_000);
        assert_eq!((c.give_back, c.charge), (0, 1_600), "100 a second for 16 s");
        // 5 s later, the same share: 10.75 s of the old one come back; the
        // new one is charged from the margin's end.
        let c = report(&mut ledger, "a", busy(), terms(), 5 * SEC);
        assert_eq!(c.grant.tokens, 6_000);
        assert_eq!((c.give_back, c.charge), (1_075, 1_575));
        // Net, a report charges what the share could take since the last.
        assert_eq!(1_600 - 1_075 + 1_575 - 1_600, 500);
    }

    #[test]
    fn over_the_margin_the_larger_share_is_charged() {
        let mut ledger = Ledger::default();
        report(&mut ledger, "a", busy(), terms(), 0);
        report(&mut ledger, "b", busy(), terms(), SEC);
        // a shrinks to half at its next report: the margin keeps the old
        // rate, charged already; after it, the new one.
        let c = report(&mut ledger, "a", busy(), terms(), 5 * SEC);
        assert_eq!(c.grant.tokens, 3_000);
        assert_eq!(c.give_back, 1_075);
        assert_eq!(
            c.charge, 788,
            "50 a second for the 15.75 s after the margin"
        );
    }
}
