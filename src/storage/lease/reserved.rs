//! The hits a lease reserved in the windows after its own ([`Ahead`]):
//! kept as one run of windows, a fixed size whatever their number, since
//! each window holds as many hits and its times and receipt follow from
//! its place in the run.

use crate::limit::algorithms::Leasing;
use crate::limit::{DEFAULT_BUCKETS, MAX_BUCKETS};
use crate::storage::{Ahead, Decision, Hit, Receipt};

/// Hits a lease reserved in a window to come, spent once that window has
/// begun.
pub(super) struct Reserved {
    pub(super) tokens: u64,
    /// Spendable from `from` until `until` (this replica's monotonic
    /// clock): from the window's start as seen from when the lease's
    /// answer came, to its end as seen from when the lease was asked, so
    /// every hit spent from it falls in its window.
    pub(super) from: u64,
    pub(super) until: u64,
    pub(super) receipt: Receipt,
}

/// The windows `next..=last` after a lease's (1 is the next one), each
/// `tokens` hits. The `j`-th is spendable from `from + ceil((j - 1) x
/// step)` until `until + j x step`, less a ten-thousandth of that span
/// (`step`: a window, or a counter's bucket, `w / spans`), and its
/// receipt is the lease's, `j` windows on.
pub(super) struct Run {
    tokens: u64,
    from: u64,
    until: u64,
    w: u64,
    spans: u8,
    next: u8,
    last: u8,
    /// The lease's receipt, of `tokens` hits.
    receipt: Receipt,
}

impl Run {
    fn get(&self, j: u8) -> Reserved {
        let (w, spans) = (self.w, u64::from(self.spans));
        let span = u64::from(j) * w / spans;
        Reserved {
            tokens: self.tokens,
            from: self
                .from
                .saturating_add((u64::from(j - 1) * w).div_ceil(spans)),
            // A replica's clock may run a little slower than the store's:
            // up to 100 ppm, the run's last window still ends in time.
            until: self.until.saturating_add(span - span / 10_000),
            receipt: Receipt {
                at: self.receipt.at + u64::from(j),
                reserved: j,
                ..self.receipt
            },
        }
    }
}

/// A limiter's reservations, in window order: none for most limiters, so
/// kept off the entry, in a thin pointer's room, until there are some.
#[derive(Default)]
pub(super) struct Reservations(Option<Box<Run>>);

impl Reservations {
    /// The heap bytes they take.
    pub(super) const RUN_BYTES: usize = std::mem::size_of::<Run>();

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The heap bytes they take: a run's, or none.
    pub(super) fn heap_bytes(&self) -> usize {
        if self.0.is_some() { Self::RUN_BYTES } else { 0 }
    }

    /// The first reservation.
    pub(super) fn first(&self) -> Option<Reserved> {
        self.0.as_ref().map(|run| run.get(run.next))
    }

    /// Hits in them all.
    pub(super) fn hits(&self) -> u64 {
        self.0
            .as_ref()
            .map_or(0, |run| u64::from(run.last + 1 - run.next) * run.tokens)
    }

    /// Moves past the first reservation: none left, the run is dropped.
    fn pop(&mut self) {
        if let Some(run) = self.0.as_mut() {
            run.next += 1;
            if run.next > run.last {
                self.0 = None;
            }
        }
    }

    /// The first reservation, taken out if its window has begun at `now`.
    pub(super) fn take_first(&mut self, now: u64) -> Option<Reserved> {
        let first = self.first().filter(|r| r.from <= now)?;
        self.pop();
        Some(first)
    }

    /// Forgets the reservations whose window is over at `now` (they
    /// counted in it); returns their hits.
    pub(super) fn lapse(&mut self, now: u64) -> u64 {
        let mut lapsed = 0;
        while let Some(r) = self.first().filter(|r| now >= r.until) {
            lapsed += r.tokens;
            self.pop();
        }
        lapsed
    }

    pub(super) fn clear(&mut self) {
        self.0 = None;
    }

    /// Takes `more` where none are held; else they are dropped (they
    /// counted in their windows): returns the hits dropped.
    pub(super) fn set(&mut self, more: Reservations) -> u64 {
        if self.is_empty() {
            *self = more;
            0
        } else {
            more.hits()
        }
    }
}

/// The hits a lease asked `now` and answered (`d`) at `answered`
/// reserved in the windows (a counter's buckets) after its own: as many
/// as its receipt says, `ahead.hits` each, the `j`-th spendable from its
/// start as seen from the answer (never before it) to its end as seen
/// from the ask (never after it). A fixed window's `j`-th window after
/// the lease's starts `(j - 1) x w` after the store's reset; a counter's
/// bucket `(j - 1) x w / (n - 1)` after the lease's bucket ends (the
/// receipt's mark, rounded up). Each has a receipt naming its window and
/// how far after the lease's it is, so that a give-back of it takes
/// nothing after a reset in between ([`Receipt::reserved`]). The run ends
/// before the first window too short to be spent in at all.
pub(super) fn reservations(
    hit: &Hit<'_>,
    d: &Decision,
    ahead: Ahead,
    now: u64,
    answered: u64,
) -> Reservations {
    let Some(r) = d.receipt.filter(|_| !ahead.is_none()) else {
        return Reservations::default();
    };
    let counter = hit.algorithm.spec().leasing == Leasing::Bucket;
    let spans = if counter {
        hit.buckets.clamp(DEFAULT_BUCKETS, MAX_BUCKETS) - 1
    } else {
        1
    };
    // Where the lease's own window (bucket) ends: at most `end_late`
    // after the answer, at least `end_early` after the ask.
    let (end_late, end_early) = if counter {
        (r.mark, r.mark.saturating_sub(1))
    } else {
        (d.reset_micros, d.reset_micros)
    };
    let mut run = Run {
        tokens: ahead.hits,
        from: answered.saturating_add(end_late),
        until: now.saturating_add(end_early),
        w: hit.window.micros(),
        spans: spans.max(1),
        next: 1,
        last: 0,
        receipt: Receipt {
            hits: ahead.hits,
            mark: 0,
            ahead: 0,
            reserved: 0,
            ..r
        },
    };
    let last = r.ahead.min(Ahead::MAX_WINDOWS);
    run.last = (1..=last)
        .take_while(|&j| {
            let r = run.get(j);
            r.from < r.until
        })
        .last()
        .unwrap_or(0);
    if run.last == 0 {
        return Reservations::default();
    }
    Reservations(Some(Box::new(run)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(last: u8) -> Reservations {
        Reservations(Some(Box::new(Run {
            tokens: 3,
            from: 1_000,
            until: 999,
            w: 60_000_000,
            spans: 1,
            next: 1,
            last,
            receipt: Receipt {
                hits: 3,
                at: 40,
                mark: 0,
                shard: 0,
                ahead: 0,
                reserved: 0,
            },
        })))
    }

    /// The run gives each window its own times and receipt, in order,
    /// and forgets those whose window is over.
    #[test]
    fn a_run_of_reservations_window_after_window() {
        let mut r = run(3);
        assert_eq!(r.hits(), 9);
        assert!(r.take_first(999).is_none(), "not before its window");
        let first = r.take_first(1_000).unwrap();
        assert_eq!(
            (first.tokens, first.receipt.at, first.receipt.reserved),
            (3, 41, 1)
        );
        assert_eq!(first.until, 999 + 60_000_000 - 6_000);
        assert_eq!(r.hits(), 6);
        let second = r.first().unwrap();
        assert_eq!(second.from, 1_000 + 60_000_000);
        assert_eq!((second.receipt.at, second.receipt.reserved), (42, 2));
        // The second window ends: it lapses, the third is next.
        assert_eq!(r.lapse(second.until), 3);
        assert_eq!(r.first().unwrap().receipt.reserved, 3);
        assert_eq!(r.lapse(u64::MAX), 3);
        assert!(r.is_empty() && r.heap_bytes() == 0);
        // Held ones stay; more are dropped, their hits counted.
        let mut held = run(2);
        assert_eq!(held.set(run(3)), 9);
        assert_eq!(held.hits(), 6);
        assert_eq!(held.heap_bytes(), Reservations::RUN_BYTES);
    }
}
