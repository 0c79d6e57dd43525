//! A hit on the limits of a `rate_limits:` list ([`Hit::also`]) and its
//! answer ([`Group`]): one store call on every limit of the list.

use crate::limit::{Algorithm, Window};
use crate::storage::{Decision, Hit};

/// One further limit of a descriptor with several ([`Hit::also`]): what
/// tells it apart from the hit's own limit. Cost, identity, shard, usage
/// reports and receipts are the hit's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Also {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub window: Window,
    pub buckets: u8,
    pub burst: u64,
}

impl<'a> Hit<'a> {
    /// The limit `index` of the hit's list as a hit of its own (0: the
    /// hit's own limit, `i`: `also[i - 1]`), with the hit's cost: its
    /// keys, and how it is decided alone.
    pub fn part(&self, index: usize) -> Hit<'a> {
        match index.checked_sub(1).and_then(|i| self.also.get(i)) {
            None => Hit { also: &[], ..*self },
            Some(a) => Hit {
                algorithm: a.algorithm,
                limit: a.limit,
                window: a.window,
                buckets: a.buckets,
                burst: a.burst,
                also: &[],
                ..*self
            },
        }
    }

    /// How many limits the hit counts on (1 plus [`Hit::also`]).
    pub fn parts(&self) -> usize {
        1 + self.also.len()
    }
}

/// The answer of a hit on several limits ([`Hit::also`]). The decision
/// that holds it is the list's answer: admitted only when every limit
/// admitted; then it describes the tightest limit (fewest hits left, the
/// soonest reset among equals), else the refusing limit a hit of this cost
/// waits for longest. Its receipt is `None`: each part holds its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The limit described, as an index of [`Hit::part`].
    pub which: usize,
    /// Each limit's own answer, in [`Hit::part`] order: whether it admits
    /// this cost alone, and what it has left; a receipt on those that
    /// recorded it (only when the list admitted, or for a usage report).
    pub parts: Vec<Decision>,
}

impl Decision {
    /// The list's answer from each limit's own (see [`Group`]); `parts`
    /// holds at least one.
    pub fn of_parts(parts: Vec<Decision>) -> Decision {
        let admitted = parts.iter().all(|d| d.admitted);
        let which = if admitted {
            (0..parts.len())
                .min_by_key(|&i| (parts[i].remaining, parts[i].reset_micros))
                .unwrap_or(0)
        } else {
            (0..parts.len())
                .filter(|&i| !parts[i].admitted)
                .max_by_key(|&i| (parts[i].reset_micros, std::cmp::Reverse(i)))
                .unwrap_or(0)
        };
        let (remaining, reset_micros) = match parts.get(which) {
            Some(d) if admitted => (d.remaining, d.reset_micros),
            Some(d) => (0, d.reset_micros),
            None => (0, 0),
        };
        Decision {
            admitted,
            remaining,
            reset_micros,
            receipt: None,
            group: Some(Box::new(Group { which, parts })),
        }
    }

    /// Which limit of the hit's list this decision describes (0 for a
    /// single limit).
    pub fn which(&self) -> usize {
        self.group.as_ref().map_or(0, |g| g.which)
    }
}
