//! `sliding_window_counter`: counts in `buckets` buckets per window,
//! weighted by how much of each the trailing window still covers. Small
//! constant memory; an estimate within its bound (see the Guarantees).

use super::*;
use crate::limit::{DEFAULT_BUCKETS, MAX_BUCKETS};
use crate::storage::Ahead;
use crate::storage::memory::heap::heap;

pub const SPEC: Spec = Spec {
    name: "sliding_window_counter",
    key_code: 'c',
    keys_buckets: true,
    staggered: true,
    roles: &[Role::State],
    lua: include_str!("../../../lua/sliding_window_counter.lua"),
    batch_id: 2,
    param: Param::Buckets,
    leasing: Leasing::Bucket,
    refusals: Refusals::SameCost,
    rlqs: Rlqs::Ledger,
    reset: Reset::MarkWindow,
    bound: Bound::Buckets,
    calendar: false,
    own_keys: &["buckets"],
    entry_per_hit: None,
    takes_reports: true,
    memory: || State::Counter(Memory::default()),
};

// The embedded store.

/// Its state in the embedded store.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// Index of the current bucket.
    window: u64,
    /// Bucket counts by age: `[0]` is the current bucket.
    counts: Vec<u64>,
    /// Hits reserved ahead ([`crate::storage::Ahead`]) in the buckets
    /// after `window`: `[j]` in bucket `window + 1 + j`, the last one
    /// nonzero. Empty (no heap) on a limiter that reserves nothing.
    ahead: Vec<u64>,
}

impl Embedded for Memory {
    fn decide(&mut self, now: u64, hit: &Hit<'_>, _: usize, expires_at: &mut u64) -> Decision {
        let (d, exp) = decide(
            now,
            hit.window.micros(),
            hit,
            &mut self.window,
            (&mut self.counts, &mut self.ahead),
        );
        *expires_at = (*expires_at).max(exp);
        d
    }

    fn undo(&mut self, now: u64, hit: &Hit<'_>, r: &Receipt, reset_at: Option<u64>) {
        undo(
            now,
            hit.window.micros(),
            hit,
            (r, reset_at),
            self.window,
            (&mut self.counts, &mut self.ahead),
        );
    }

    fn heap_bytes(&self) -> usize {
        heap(self.counts.capacity() * size_of::<u64>())
            + heap(self.ahead.capacity() * size_of::<u64>())
    }

    fn written_from(&self, hit: &Hit<'_>) -> Option<u64> {
        if self.counts.is_empty() {
            return None;
        }
        // Bucket `window` starts at (window x w - phase) / spans.
        let n = hit.buckets.clamp(DEFAULT_BUCKETS, MAX_BUCKETS) as u128;
        let scaled = u128::from(self.window) * u128::from(hit.window.micros());
        let from = scaled
            .saturating_sub(u128::from(phase_of(hit)))
            .div_ceil(n - 1);
        Some(u64::try_from(from).unwrap_or(u64::MAX))
    }
}

/// Where `hit`'s buckets start, in scaled units (below: `1 / (n - 1)`
/// microsecond) and within one bucket (`[0, w)`): 0 on an epoch-aligned
/// window, else [`phase`] of its descriptor.
fn phase_of(hit: &Hit<'_>) -> u64 {
    phase(hit.domain, hit.entries, hit.window)
}

/// How far a staggered window's buckets start after the epoch-aligned
/// ones, in units of `1 / (n - 1)` microsecond whatever `n` is, below the
/// window's microseconds (one bucket): the descriptor's
/// [`descriptor_hash`](crate::storage::keys::descriptor_hash), which
/// every replica computes alike, by the window. Spread so, the limiters
/// of one rule turn their buckets at different instants, and their
/// leases (which live within a bucket) end apart. 0 on a window that is
/// not staggered.
pub fn phase(domain: &str, entries: &[(String, String)], window: crate::limit::Window) -> u64 {
    if !window.is_staggered() {
        return 0;
    }
    crate::storage::keys::descriptor_hash(domain, entries) % window.micros().max(1)
}

/// `n` buckets of `w / (n - 1)` each, epoch-aligned or starting
/// [`phase`] after that: the current one, `n - 2`
/// full ones, and the oldest, which weighs what is left of it in the
/// trailing window. With `n = 2` that is the classic previous-and-current
/// pair. Only admitted hits are recorded, unless the limiter takes usage
/// reports: then every positive cost is, and the answer is refused while
/// the estimate is over the limit.
///
/// Time is counted in units of `1 / (n - 1)` microsecond ("scaled"), so a
/// bucket is exactly `w` scaled units long whatever `n` is and no bucket
/// boundary is rounded; real durations are the scaled ones divided by
/// `n - 1`, rounded up.
///
/// The steps of lua/sliding_window_counter.lua: move the buckets to now
/// ([`Buckets::roll`]), then its `decide` (give back, or take), with the
/// script's local functions as methods of [`Buckets`].
fn decide(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    window: &mut u64,
    (counts, ahead): (&mut Vec<u64>, &mut Vec<u64>),
) -> (Decision, u64) {
    let mut b = Buckets::at(now, w, hit);
    let (now_idx, now_elapsed) = (b.idx, b.elapsed);
    let held = counts.iter().any(|&c| c > 0) || !ahead.is_empty();
    if held && *window > b.idx {
        // A bucket written after `now`: the clock stepped back. Counted on
        // in that bucket, from its start, as the script does.
        b.idx = *window;
        b.elapsed = 0;
    }
    b.roll(window, counts, ahead);
    let mut d = if hit.negative {
        b.give_back(counts, ahead, hit.hits)
    } else {
        b.take(counts, ahead, hit)
    };
    if d.admitted && hit.receipt && !hit.ahead.is_none() {
        let granted = b.reserve_ahead(counts, ahead, hit);
        if let Some(r) = d.receipt.as_mut() {
            r.ahead = granted;
        }
    }
    // Until the last bucket that holds hits has left the trailing window,
    // from the real `now` (before a step back moves the current bucket
    // on): the current bucket and those reserved after it, plus n - 1.
    let later = (b.idx - now_idx).saturating_add(ahead.len() as u64);
    let span = (b.n as u64).saturating_add(later).saturating_mul(w);
    let expires = now.saturating_add(b.real(span - now_elapsed));
    (d, expires)
}

/// The buckets as one decision sees them: their number, the current
/// bucket and how far into it now is, and the limit.
struct Buckets {
    /// The number of buckets.
    n: usize,
    /// `n - 1`: scaled units per microsecond.
    spans: u64,
    /// A bucket's length in scaled units (the window in microseconds).
    w: u64,
    /// Index of the current bucket.
    idx: u64,
    /// Scaled time since the current bucket started.
    elapsed: u64,
    limit: u64,
}

impl Buckets {
    /// The buckets of `hit`'s limiter at `now`.
    fn at(now: u64, w: u64, hit: &Hit<'_>) -> Buckets {
        let n = hit.buckets.clamp(DEFAULT_BUCKETS, MAX_BUCKETS) as usize;
        let spans = n as u64 - 1;
        let scaled = u128::from(now) * u128::from(spans) + u128::from(phase_of(hit));
        let idx = (scaled / u128::from(w)) as u64;
        let elapsed = (scaled - u128::from(idx) * u128::from(w)) as u64;
        Buckets {
            n,
            spans,
            w,
            idx,
            elapsed,
            limit: hit.limit,
        }
    }

    /// The script's `real`: a scaled duration in microseconds, rounded up.
    fn real(&self, scaled: u64) -> u64 {
        scaled.div_ceil(self.spans)
    }

    /// Moves the counts to the current bucket, as the script reads them:
    /// shifted by the buckets gone by, all zero after `n` of them (or when
    /// the bucket count changed); a bucket after the stored one counts
    /// what was reserved in it, and the reservations left are moved on.
    fn roll(&self, window: &mut u64, counts: &mut Vec<u64>, ahead: &mut Vec<u64>) {
        let (n, idx) = (self.n, self.idx);
        if counts.len() != n {
            counts.clear();
            // Exactly n: the default growth would round 2 buckets up to 4.
            counts.reserve_exact(n);
            counts.resize(n, 0);
        } else if idx >= *window && idx - *window < n as u64 {
            let shift = (idx - *window) as usize;
            counts.rotate_right(shift);
            counts[..shift].fill(0);
        } else if idx != *window {
            counts.fill(0);
        }
        if idx > *window && !ahead.is_empty() {
            let shift = idx - *window;
            for (age, c) in counts.iter_mut().enumerate() {
                // Bucket idx - age, reserved in as ahead[shift - age - 1].
                if let Some(j) = shift.checked_sub(age as u64 + 1)
                    && let Some(&r) = ahead.get(j as usize)
                {
                    *c = r;
                }
            }
            ahead.drain(..(shift as usize).min(ahead.len()));
            if ahead.is_empty() {
                *ahead = Vec::new();
            }
        }
        *window = idx;
    }

    /// The count of the trailing window that starts where bucket
    /// `idx + y` starts (`y >= 1`), each of its buckets whole: the
    /// script's `span`.
    fn span(&self, counts: &[u64], ahead: &[u64], y: usize) -> u64 {
        let n = self.n;
        // Buckets idx + y - n + 1 ..= idx: ages 0 .. n - y.
        let past: u64 = counts[..n.saturating_sub(y)].iter().sum();
        // Buckets idx + max(1, y - n + 1) ..= idx + y.
        let from = y.saturating_sub(n).min(ahead.len());
        let to = y.min(ahead.len());
        past.saturating_add(ahead[from..to].iter().sum())
    }

    /// The script's `estimate`: the estimate now, or where buckets ahead
    /// hold reservations, the count of the fullest trailing window a hit
    /// now would weigh in.
    fn fullest(&self, counts: &[u64], ahead: &[u64]) -> f64 {
        let mut e = self.estimate(counts);
        for y in 1..=ahead.len().min(self.n - 1) {
            e = e.max(self.span(counts, ahead, y) as f64);
        }
        e
    }

    /// The script's "Reservations in the next buckets, for an admitted
    /// lease": the lease's `hit.ahead.hits` in each of the next buckets,
    /// bucket after bucket while every trailing window it weighs in holds
    /// at most the limit. Returns the buckets reserved.
    fn reserve_ahead(&self, counts: &[u64], ahead: &mut Vec<u64>, hit: &Hit<'_>) -> u8 {
        let (wanted, each) = (hit.ahead.windows.min(Ahead::MAX_WINDOWS), hit.ahead.hits);
        let before = ahead.len();
        let mut granted = 0;
        for j in 1..=wanted {
            let at = usize::from(j) - 1;
            if ahead.len() <= at {
                ahead.resize(at + 1, 0);
            }
            ahead[at] = ahead[at].saturating_add(each);
            let y = usize::from(j);
            if (y..y + self.n).any(|y| self.span(counts, ahead, y) > self.limit) {
                ahead[at] -= each;
                break;
            }
            granted = j;
        }
        ahead.truncate(before.max(usize::from(granted)));
        granted
    }

    /// The script's `estimate`, in the same floating-point steps.
    /// Multiplying before dividing keeps the estimate exact while
    /// oldest x window stays below 2^53.
    fn estimate(&self, counts: &[u64]) -> f64 {
        let n = self.n;
        let wf = self.w as f64;
        let left = (self.w - self.elapsed) as f64;
        let full: u64 = counts[..n - 1].iter().sum();
        counts[n - 1] as f64 * left / wf + full as f64
    }

    /// The script's `remaining`.
    fn remaining(&self, est: f64) -> u64 {
        let r = (self.limit as f64 - est).floor();
        if r > 0.0 { r as u64 } else { 0 }
    }

    /// The script's `ok_reset`: until the oldest bucket holding hits has
    /// left the trailing window.
    fn ok_reset(&self, counts: &[u64]) -> u64 {
        match counts.iter().rposition(|&c| c > 0) {
            Some(age) => self.real((self.n - age) as u64 * self.w - self.elapsed),
            None => 0,
        }
    }

    /// The script's `wait_for`: refused, the first bucket (j buckets on)
    /// where the full ones, and what is reserved up to it, fit a hit of
    /// `cost`, and so does each window to come that it weighs in (where
    /// buckets after it hold reservations), then the moment in it when
    /// the oldest has lost enough weight: oldest x (w - e) / w <= room
    /// holds from e = w - floor(w x room / oldest).
    fn wait_for(&self, counts: &[u64], ahead: &[u64], cost: u64) -> u64 {
        let (n, w) = (self.n, self.w);
        let wf = w as f64;
        let need = (self.limit - cost) as f64;
        for j in 0..n {
            let later = (j + n - 1).min(ahead.len());
            if (j + 1..=later)
                .any(|y| self.span(counts, ahead, y).saturating_add(cost) > self.limit)
            {
                continue;
            }
            let reserved: u64 = ahead[..j.min(ahead.len())].iter().sum();
            let full = counts[..n - 1 - j].iter().sum::<u64>() + reserved;
            if full as f64 > need {
                continue;
            }
            let oldest = counts[n - 1 - j];
            let at = if oldest == 0 {
                0
            } else {
                w - ((wf * (need - full as f64) / oldest as f64).floor() as u64).min(w)
            };
            return if j == 0 {
                self.real(at.saturating_sub(self.elapsed)).max(1)
            } else {
                self.real(j as u64 * w + at - self.elapsed)
            };
        }
        w
    }

    /// The negative branch of the script's `decide`: gives `hits` back,
    /// newest bucket first, never below zero.
    fn give_back(&self, counts: &mut [u64], ahead: &[u64], hits: u64) -> Decision {
        let mut back = hits;
        for c in counts.iter_mut() {
            let take = back.min(*c);
            *c -= take;
            back -= take;
        }
        let est = self.fullest(counts, ahead);
        decision(true, self.remaining(est), self.ok_reset(counts))
    }

    /// The rest of the script's `decide`: refuses a cost above the limit,
    /// admits one that fits, records a usage report that does not (and
    /// refuses it), or refuses.
    fn take(&self, counts: &mut [u64], ahead: &[u64], hit: &Hit<'_>) -> Decision {
        let limit = self.limit;
        let est = self.fullest(counts, ahead);
        if hit.hits > limit && !hit.usage_reports {
            return decision(false, self.remaining(est), self.w);
        }
        if est + hit.hits as f64 <= limit as f64 {
            counts[0] += hit.hits;
            let est = self.fullest(counts, ahead);
            let d = decision(true, self.remaining(est), self.ok_reset(counts));
            // The receipt's mark: how long the bucket it recorded in
            // stays current (a lease is spent only until then).
            let left = self.real(self.w - self.elapsed);
            return with_receipt(d, hit, hit.hits, self.idx, left);
        }
        if hit.usage_reports {
            // Recorded all the same; refused until a check would pass.
            counts[0] = counts[0].saturating_add(hit.hits).min(MAX_COUNT);
            let est = self.fullest(counts, ahead);
            return decision(false, self.remaining(est), self.wait_for(counts, ahead, 0));
        }
        decision(
            false,
            self.remaining(est),
            self.wait_for(counts, ahead, hit.hits),
        )
    }
}

/// Counter: the receipt's bucket, while it is still one of the `n`
/// buckets in the trailing window, and only where what it recorded may
/// not predate the limiter's last reset (`reset_at`): a reset deleted that
/// count, and the count after it holds other hits. The receipt names its
/// bucket, not when it was recorded, so the bucket the reset fell in gives
/// nothing back after it: an error towards refusing. `window` is the index
/// of the state's newest bucket, `counts[age]` the bucket `age` buckets
/// older.
fn undo(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    (r, reset_at): (&Receipt, Option<u64>),
    window: u64,
    (counts, ahead): (&mut [u64], &mut [u64]),
) {
    let n = hit.buckets.clamp(DEFAULT_BUCKETS, MAX_BUCKETS) as usize;
    if counts.len() != n {
        return;
    }
    let spans = n as u64 - 1;
    let phase = u128::from(phase_of(hit));
    let bucket = |t: u64| ((u128::from(t) * u128::from(spans) + phase) / u128::from(w)) as u64;
    // A reservation may have been recorded in its lease's bucket, before.
    let first = r.at.saturating_sub(u64::from(r.reserved));
    if reset_at.is_some_and(|at| bucket(at) >= first) {
        return;
    }
    let idx = bucket(now);
    if r.at > window {
        // Hits reserved in a bucket the state has not been moved to: the
        // script moves it there first, so they are taken back once that
        // bucket has begun, while it still counts.
        if r.at <= idx
            && idx - r.at < n as u64
            && let Some(a) = ahead.get_mut((r.at - window - 1) as usize)
        {
            *a = a.saturating_sub(r.hits);
        }
        return;
    }
    // Buckets the state has not been moved past yet: the receipt's age
    // counts from the state's newest bucket, and one older than the
    // trailing window at `now` has stopped counting anyway.
    let age = window - r.at;
    if idx.saturating_sub(r.at) >= n as u64 {
        return;
    }
    if let Some(c) = counts.get_mut(age as usize) {
        *c = c.saturating_sub(r.hits);
    }
}

/// How long the bucket that is current at `now` (the caller's clock) stays
/// current: how far a lease taken now may be spent at least, for sizing.
pub(crate) fn bucket_left(now: u64, hit: &Hit<'_>) -> u64 {
    let b = Buckets::at(now, hit.window.micros(), hit);
    b.real(b.w - b.elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Unit, Window};
    use crate::storage::{Ahead, Shard};

    fn hit(buckets: u8, hits: u64) -> Hit<'static> {
        Hit {
            domain: "d",
            entries: &[],
            algorithm: Algorithm::SlidingWindowCounter,
            limit: 10,
            window: Window::of(Unit::Second),
            hits,
            negative: false,
            usage_reports: false,
            buckets,
            burst: 0,
            shard: Shard::NONE,
            receipt: true,
            also: &[],
            lease: false,
            ahead: Ahead::NONE,
        }
    }

    #[test]
    fn a_receipt_says_how_long_its_bucket_stays_current() {
        // Three buckets of half a second: 0.2 s into the second one.
        let mut m = Memory::default();
        let mut exp = 0;
        let now = 7_000_000 + 700_000;
        let d = m.decide(now, &hit(3, 4), 0, &mut exp);
        let r = d.receipt.unwrap();
        assert_eq!((r.hits, r.at, r.mark), (4, 15, 300_000));
        assert_eq!(bucket_left(now, &hit(3, 4)), 300_000);
        // Two buckets: the bucket is the window.
        let d = Memory::default().decide(now, &hit(2, 1), 0, &mut exp);
        assert_eq!(d.receipt.unwrap().mark, 300_000);
    }

    /// A clock that steps back below the bucket last written (a Redis
    /// failover to a replica whose clock is behind) counts on in that
    /// bucket, and the limiter lives until the clock passes it: what it
    /// holds is never counted afresh.
    #[test]
    fn a_clock_step_back_counts_on_in_the_bucket_written() {
        let mut m = Memory::default();
        let mut exp = 0;
        let at = 30_000_000 + 500_000;
        for _ in 0..10 {
            assert!(m.decide(at, &hit(2, 1), 0, &mut exp).admitted);
        }
        // Three seconds back: three buckets before the one written.
        let back = at - 3_000_000;
        let mut expires = 0;
        let d = m.decide(back, &hit(2, 1), 0, &mut expires);
        assert!(!d.admitted, "{d:?}");
        assert_eq!(m.counts, [10, 0]);
        // The state lives past the end of the written bucket's trailing
        // window on the stepped clock: 31 s plus one bucket.
        assert!(expires >= 32_000_000, "{expires}");
        // Once the clock is past the written bucket, the window slides on:
        // at its end all 10 weigh, half a bucket later half of them.
        let d = m.decide(at + 500_000, &hit(2, 1), 0, &mut exp);
        assert!(!d.admitted, "{d:?}");
        assert!(m.decide(at + 1_000_000, &hit(2, 1), 0, &mut exp).admitted);
    }

    #[test]
    fn staggered_buckets_start_at_the_descriptor_s_phase() {
        let staggered = Window::of(Unit::Second).staggered();
        let entries = |v: &str| vec![("user".to_string(), v.to_string())];
        // Within a bucket, and spread: 1,000 users land in most tenths.
        let mut tenths = [0u32; 10];
        for i in 0..1_000 {
            let p = phase("d", &entries(&format!("u{i}")), staggered);
            assert!(p < 1_000_000);
            tenths[(p / 100_000) as usize] += 1;
        }
        assert!(
            tenths.iter().all(|&n| (50..=150).contains(&n)),
            "{tenths:?}"
        );
        assert_eq!(phase("d", &entries("u1"), Window::of(Unit::Second)), 0);
        // The buckets turn `phase` after the epoch's seconds (3 buckets:
        // scaled units of half a microsecond, buckets of 0.5 s).
        let e = entries("alice");
        let p = phase("d", &e, staggered);
        let h = Hit {
            domain: "d",
            entries: &e,
            window: staggered,
            ..hit(3, 1)
        };
        let now = 7_000_000;
        let left = bucket_left(now, &h);
        assert_eq!(left, (1_000_000 - (2 * now + p) % 1_000_000).div_ceil(2));
        // Decided across that turn: the count moves to the older bucket
        // there, not at the aligned half second.
        let mut m = Memory::default();
        let mut exp = 0;
        let r = m.decide(now, &h, 0, &mut exp).receipt.unwrap();
        assert_eq!(r.mark, left);
        let next = m.decide(now + left, &h, 0, &mut exp).receipt.unwrap();
        assert_eq!(next.at, r.at + 1);
        assert_eq!(m.counts[..2], [1, 1]);
    }

    #[test]
    fn a_give_back_recorded_before_a_reset_takes_nothing_off_the_fresh_count() {
        let mut m = Memory::default();
        let mut exp = 0;
        let h = hit(2, 6);
        let r = m.decide(1_100_000, &h, 0, &mut exp).receipt.unwrap();
        // Reset in the same bucket: the fresh count holds other hits.
        let mut fresh = Memory::default();
        fresh.decide(1_300_000, &h, 0, &mut exp);
        fresh.undo(1_400_000, &h, &r, Some(1_200_000));
        assert_eq!(fresh.counts[0], 6);
        // A reset in an earlier bucket does not stop it.
        m.undo(1_400_000, &h, &r, Some(900_000));
        assert_eq!(m.counts[0], 0);
    }
}
