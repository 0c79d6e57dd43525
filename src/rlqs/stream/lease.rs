//! A report's leases: each leased bucket's share of its limits' ledgers,
//! taken a few buckets at a time.

use futures_util::StreamExt;

use super::{Item, LEASES_IN_FLIGHT};
use crate::limit::Window;
use crate::proto::rlqs::UsageReport;
use crate::quota::{self, Grant, Report, Terms};
use crate::rlqs::bucket::{self, Plan};
use crate::rlqs::{DEFAULT_REPORT_SECS, HOLD_MARGIN, Inner};
use crate::rules::LimitSpec;
use crate::storage::{LeaseCall, StoreError};

/// On an error, the grants the list's earlier limits already got: their
/// ledgers hold them now, whatever the bucket is sent.
pub(super) type Grants = Vec<(Grant, Window)>;

/// What a bucket's leases came to: `None` when its plan takes none.
pub(super) type Leased = Option<Result<Grants, (StoreError, Grants)>>;

/// The leases of every item, in order. They go out a few at a time: a
/// report can carry thousands of buckets, and every Envoy reports at
/// about the same moment; unbounded, they would all wait in the store
/// client's queue at once and time out together.
pub(super) async fn lease_all(inner: &Inner, domain: &str, items: &[Item<'_>]) -> Vec<Leased> {
    let hold_micros = (inner.options.assignment_ttl_secs * 1_000_000)
        .saturating_add(HOLD_MARGIN.as_micros() as u64);
    let leases: Vec<crate::storage::BoxFuture<'_, Leased>> = items
        .iter()
        .map(|item| {
            Box::pin(lease(inner, domain, item, hold_micros))
                as crate::storage::BoxFuture<'_, Leased>
        })
        .collect();
    futures_util::stream::iter(leases)
        .buffered(LEASES_IN_FLIGHT)
        .collect()
        .await
}

/// A leased bucket's share of each of its limits' ledgers (every limit of
/// a `rate_limits:` list), stopping at the first store error.
async fn lease(inner: &Inner, domain: &str, item: &Item<'_>, hold_micros: u64) -> Leased {
    let Plan::Leased { limit, window } = item.plan else {
        return None;
    };
    let store = inner.engine.store();
    let default_algorithm = inner.engine.options().default_algorithm;
    let report = report_of(item.usage);
    let more = item.rule.map_or(&[][..], |r| r.more.as_slice());
    let limits =
        std::iter::once((item.rule, limit, window)).chain(more.iter().filter_map(
            |r| match r.limit {
                LimitSpec::PerUnit {
                    requests_per_unit,
                    window,
                } => Some((Some(r), u64::from(requests_per_unit), window)),
                LimitSpec::Unlimited => None,
            },
        ));
    let mut grants = Vec::with_capacity(1 + more.len());
    for (rule, limit, window) in limits {
        let terms = Terms {
            capacity: quota::capacity(limit, window),
            fill_secs: quota::fill_secs(window),
            hold_micros,
        };
        let call = LeaseCall {
            domain,
            entries: &item.limiter,
            algorithm: rule.and_then(|r| r.algorithm).unwrap_or(default_algorithm),
            window,
            holder: item.holder.as_str(),
            report,
            terms,
            counted: rule
                .and_then(|r| bucket::counted(r, default_algorithm, limit, window, hold_micros)),
        };
        match store.lease(call).await {
            Ok(grant) => grants.push((grant, window)),
            Err(e) => return Some(Err((e, grants))),
        }
    }
    Some(Ok(grants))
}

/// A bucket's usage as a lease reports it: its requests and the seconds
/// they took (the default report interval when it names none).
fn report_of(usage: &UsageReport) -> Report {
    let elapsed = usage
        .time_elapsed
        .as_ref()
        .map_or(0, |d| d.seconds.max(0) as u64);
    Report {
        requests: usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied),
        elapsed_secs: if elapsed == 0 {
            DEFAULT_REPORT_SECS
        } else {
            elapsed
        },
    }
}
