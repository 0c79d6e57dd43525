//! One stream: its reports in order, one response per report that has a
//! bucket to answer, until the client closes it or the server stops.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

mod lease;

use super::bucket::{self, Assignment, Plan, Skip};
use super::{Inner, ShareView};
use crate::limit::Window;
use crate::proto::rlqs::{
    BlanketRule, BucketAction, BucketActionKind, BucketId, QuotaAssignmentAction,
    RateLimitQuotaResponse, RateLimitQuotaUsageReports, RateLimitStrategy, Strategy, TokenBucket,
    UsageReport,
};
use crate::quota::Grant;
use crate::rules::LimitSpec;
use crate::rules::{Counts, Rule, RuleSet};
use lease::{Leased, lease_all};

/// Lease calls one stream has in flight at once.
const LEASES_IN_FLIGHT: usize = 32;

/// What a stream remembers of one bucket.
struct Tracked {
    /// The last report with usage (or the first report).
    active: Instant,
    /// The last assignment and until when it holds, for a store failure.
    last: Option<(Assignment, Instant)>,
}

/// A stream's state between reports.
struct State {
    number: u64,
    holder: String,
    domain: Option<String>,
    buckets: HashMap<Vec<(String, String)>, Tracked>,
    /// Skips already logged on this stream (once per reason).
    logged: [bool; Skip::ALL.len()],
}

pub(super) async fn run(
    inner: &Inner,
    number: u64,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
) {
    let mut state = State {
        number,
        holder: format!("{}.{number}", inner.replica),
        domain: None,
        buckets: HashMap::new(),
        logged: [false; Skip::ALL.len()],
    };
    let mut draining = inner.draining.clone();
    let drained = async move {
        // A dropped sender means no drain will come: wait forever.
        if draining.wait_for(|d| *d).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(drained);
    loop {
        let message = tokio::select! {
            m = inbound.message() => m,
            () = tx.closed() => break,
            () = &mut drained => {
                // Envoy drops the stream and opens a new one at its next
                // report; the shares it holds stay in force meanwhile.
                let _ = tx
                    .send(Err(Status::unavailable("tollgate is shutting down: reconnect")))
                    .await;
                break;
            }
        };
        let reports = match message {
            Ok(Some(reports)) => reports,
            // Closed by the client, or broken: nothing to answer.
            Ok(None) | Err(_) => break,
        };
        match answer(inner, &mut state, reports).await {
            Ok(Some(response)) => {
                if tx.send(Ok(response)).await.is_err() {
                    break;
                }
            }
            Ok(None) => {}
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                break;
            }
        }
    }
    inner.stats.buckets_removed(state.buckets.len() as u64);
}

/// One bucket of a report, once read.
struct Item<'a> {
    usage: &'a UsageReport,
    /// The entries with long values as digests: the stream's key for the
    /// bucket, so what a stream keeps per bucket is bounded whatever the
    /// values' length.
    identity: Vec<(String, String)>,
    /// The identity of the limiter the bucket counts on, as RLS counts
    /// the same entries ([`crate::engine::limiter_identity`]): the lease's
    /// key. A `share_threshold` wildcard's values share one.
    limiter: Vec<(String, String)>,
    /// Who holds the bucket's share: the stream, or, on a limiter other
    /// buckets may share, the stream's bucket (one share each, so none
    /// overwrites another's).
    holder: String,
    rule: Option<&'a Rule>,
    plan: Plan,
}

/// The response to one report: the stream's domain checked, each bucket
/// read, their leases taken, and an assignment for each bucket answered;
/// the stream's shares are kept for the quota views. `None` when no
/// bucket has anything to answer.
async fn answer(
    inner: &Inner,
    state: &mut State,
    reports: RateLimitQuotaUsageReports,
) -> Result<Option<RateLimitQuotaResponse>, Status> {
    let domain = stream_domain(state, &reports.domain)?;
    let rules = inner.engine.rules().current();
    let now = Instant::now();
    let mut actions = Vec::with_capacity(reports.bucket_quota_usages.len());
    let mut items = Vec::with_capacity(reports.bucket_quota_usages.len());
    // A bucket is answered once a report: a repeat of one (Envoy sends
    // none; any client may) is left out, its usage with it.
    let mut named: HashSet<Vec<(&str, &str)>> = HashSet::new();
    for usage in &reports.bucket_quota_usages {
        if let Some(id) = &usage.bucket_id {
            let mut pairs: Vec<(&str, &str)> = id
                .bucket
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            pairs.sort_unstable();
            if !named.insert(pairs) {
                continue;
            }
        }
        match read(inner, state, &rules, &domain, usage, now) {
            Read::Skipped => {}
            Read::Abandoned(action) => actions.push(action),
            Read::Item(item) => items.push(item),
        }
    }
    let grants = lease_all(inner, &domain, &items).await;
    let views = assign(inner, state, &domain, &items, grants, now, &mut actions);
    inner
        .shares
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(state.number, views);
    Ok((!actions.is_empty()).then_some(RateLimitQuotaResponse {
        bucket_action: actions,
    }))
}

/// The domain a report counts in: the first report of a stream must name
/// it, and later reports name the same one or none.
fn stream_domain(state: &mut State, given: &str) -> Result<String, Status> {
    match (&state.domain, given) {
        (None, "") => Err(Status::invalid_argument(
            "the first usage report of a stream must name its domain",
        )),
        (None, given) => {
            state.domain = Some(given.to_owned());
            Ok(given.to_owned())
        }
        (Some(first), given) if !given.is_empty() && given != first => {
            Err(Status::invalid_argument(format!(
                "a stream reports for one domain: it began with {first:?}, then named {given:?}"
            )))
        }
        (Some(first), _) => Ok(first.clone()),
    }
}

/// What one bucket of a report comes to, once read.
enum Read<'a> {
    /// Skipped (logged once per reason on the stream): no answer.
    Skipped,
    /// Without usage past `abandon_after`: forgotten, and told so.
    Abandoned(BucketAction),
    /// To be answered.
    Item(Item<'a>),
}

/// Reads one bucket of a report: its entries, its usage counted, the
/// stream's record of it, its rule and plan, and the limiter it counts
/// on.
fn read<'a>(
    inner: &Inner,
    state: &mut State,
    rules: &'a RuleSet,
    domain: &str,
    usage: &'a UsageReport,
    now: Instant,
) -> Read<'a> {
    let options = &inner.options;
    let id = usage.bucket_id.as_ref().map(|b| &b.bucket);
    let entries = match id.map(|m| bucket::entries(m.iter(), options.ids)) {
        Some(Ok(entries)) => entries,
        Some(Err(why)) => {
            skip(inner, &mut state.logged, state.number, domain, why);
            return Read::Skipped;
        }
        None => {
            skip(inner, &mut state.logged, state.number, domain, Skip::Empty);
            return Read::Skipped;
        }
    };
    let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
    inner.stats.reported(allowed, denied);
    let identity = bucket::identity(&entries, options.ids.max_value_bytes);
    let used = allowed > 0 || denied > 0;
    match track(inner, state, domain, &identity, used, now) {
        Tracking::Skipped => return Read::Skipped,
        Tracking::Abandoned => {
            return Read::Abandoned(BucketAction {
                bucket_id: usage.bucket_id.clone(),
                bucket_action: Some(BucketActionKind::AbandonAction(Default::default())),
            });
        }
        Tracking::Kept => {}
    }
    let rule = rules.find(domain, &entries);
    let plan = bucket::plan(rule, inner.engine.options().shadow_mode);
    // A calendar limit, alone or in a `rate_limits:` list.
    let calendar = |r: &crate::rules::Rule| matches!(r.limit, LimitSpec::PerUnit { window, .. } if window.zone().is_some());
    if let Plan::Leased { .. } = plan
        && rule.is_some_and(|r| calendar(r) || r.more.iter().any(calendar))
    {
        skip(
            inner,
            &mut state.logged,
            state.number,
            domain,
            Skip::Calendar,
        );
        return Read::Skipped;
    }
    if let Some(rule) = rule {
        account(rule.stats.counts(), plan, allowed, denied);
    }
    let max_value = options.ids.max_value_bytes;
    let (limiter, holder) = counted_on(
        rules,
        domain,
        &entries,
        rule,
        &identity,
        &state.holder,
        max_value,
    );
    Read::Item(Item {
        usage,
        identity,
        limiter,
        holder,
        rule,
        plan,
    })
}

/// What the stream's record of a bucket says.
enum Tracking {
    /// A new bucket past `max_buckets` or `max_total_buckets`: skipped.
    Skipped,
    /// Without usage for `abandon_after`: removed.
    Abandoned,
    /// Known or newly added, and to be answered.
    Kept,
}

/// Finds or adds the stream's record of the bucket `identity`, marking it
/// active when the report has usage (`used`).
fn track(
    inner: &Inner,
    state: &mut State,
    domain: &str,
    identity: &[(String, String)],
    used: bool,
    now: Instant,
) -> Tracking {
    let options = &inner.options;
    let full = state.buckets.len() >= options.max_buckets
        || inner.stats.buckets() >= options.max_total_buckets;
    let tracked = match state.buckets.entry(identity.to_vec()) {
        Entry::Occupied(known) => known.into_mut(),
        Entry::Vacant(_) if full => {
            skip(
                inner,
                &mut state.logged,
                state.number,
                domain,
                Skip::TooManyBuckets,
            );
            return Tracking::Skipped;
        }
        Entry::Vacant(new) => {
            inner.stats.buckets_added(1);
            new.insert(Tracked {
                active: now,
                last: None,
            })
        }
    };
    if used {
        tracked.active = now;
    } else if options
        .abandon_after
        .is_some_and(|after| now.duration_since(tracked.active) >= after)
    {
        state.buckets.remove(identity);
        inner.stats.buckets_removed(1);
        inner.stats.abandoned();
        return Tracking::Abandoned;
    }
    Tracking::Kept
}

/// Each item's assignment from its plan and its leases, pushed as an
/// action and remembered for a later store failure; the views of the
/// shares sent, for the quota report.
fn assign(
    inner: &Inner,
    state: &mut State,
    domain: &str,
    items: &[Item<'_>],
    grants: Vec<Leased>,
    now: Instant,
    actions: &mut Vec<BucketAction>,
) -> Vec<ShareView> {
    let options = &inner.options;
    let ttl = std::time::Duration::from_secs(options.assignment_ttl_secs);
    let mut views = Vec::with_capacity(items.len());
    for (item, grant) in items.iter().zip(grants) {
        let mut ledger = None;
        let assignment = match (item.plan, grant) {
            (Plan::Free | Plan::Shadow, _) => Some((Assignment::AllowAll, ttl)),
            (Plan::Banned, _) => Some((Assignment::DenyAll, ttl)),
            (Plan::Leased { window, .. }, Some(Ok(grants))) if grants.len() == 1 => {
                let grant = grants[0].0;
                ledger = Some(grant);
                Some((
                    bucket::token_bucket(grant.tokens, window, options.burst),
                    ttl,
                ))
            }
            (Plan::Leased { .. }, Some(Ok(grants))) => {
                ledger = grants.first().map(|g| g.0);
                Some((within(&grants, options.burst), ttl))
            }
            (Plan::Leased { .. }, grant) => {
                inner.stats.store_error();
                let written = match grant {
                    Some(Err((_, written))) => written,
                    _ => Vec::new(),
                };
                fallback(inner, state, item, now, &written)
            }
        };
        let Some((assignment, ttl)) = assignment else {
            continue;
        };
        if let Some(tracked) = state.buckets.get_mut(&item.identity) {
            tracked.last = Some((assignment, now + ttl));
        }
        inner.stats.sent(assignment);
        views.push(view(state.number, domain, item, assignment, ledger));
        actions.push(action(item.usage, assignment, ttl));
    }
    views
}

/// The limiter a bucket's `entries` count on under `rule`, as RLS counts
/// them (one function for both: [`crate::engine::limiter_identity`]), and
/// who holds the bucket's share of it: the stream, or, where other values
/// count on the same limiter (a `share_threshold` wildcard), the stream's
/// bucket, so that two buckets of one stream hold a share each and
/// neither report overwrites the other's. That holder is the stream and a
/// digest of the bucket's `identity` (the same for the stream's life; a
/// collision only merges two buckets' shares, as one holder).
fn counted_on(
    rules: &RuleSet,
    domain: &str,
    entries: &[(String, String)],
    rule: Option<&Rule>,
    identity: &[(String, String)],
    stream: &str,
    max_value: usize,
) -> (Vec<(String, String)>, String) {
    use std::hash::{Hash, Hasher};
    let steps = match rule {
        Some(r) if r.share_threshold => rules.steps(domain, entries),
        _ => Vec::new(),
    };
    let limiter = crate::engine::limiter_identity(entries, &steps, max_value).into_owned();
    if limiter == identity {
        return (limiter, stream.to_owned());
    }
    let mut h = std::hash::DefaultHasher::new();
    identity.hash(&mut h);
    (limiter, format!("{stream}/{:016x}", h.finish()))
}

/// The token bucket within every share of `grants` (a list's limits).
fn within(grants: &[(Grant, Window)], burst: f64) -> Assignment {
    let shares: Vec<_> = grants.iter().map(|(g, w)| (g.tokens, *w)).collect();
    bucket::token_bucket_within(&shares, burst)
}

/// A store failure: the last assignment while it holds (for what is left
/// of it, in whole seconds), else the rule's failure policy. `written`:
/// the grants a list's earlier limits got before a later one failed.
/// Their ledgers hold those new shares now (the other holders' grants
/// count on them), so what is sent stays within them too.
fn fallback(
    inner: &Inner,
    state: &State,
    item: &Item<'_>,
    now: Instant,
    written: &[(Grant, Window)],
) -> Option<(Assignment, std::time::Duration)> {
    let sent = fallback_alone(inner, state, item, now);
    if written.is_empty() {
        return sent;
    }
    let cap = within(written, inner.options.burst);
    sent.map(|(a, ttl)| (bucket::stricter(a, cap), ttl))
}

fn fallback_alone(
    inner: &Inner,
    state: &State,
    item: &Item<'_>,
    now: Instant,
) -> Option<(Assignment, std::time::Duration)> {
    let last = state.buckets.get(&item.identity).and_then(|t| t.last);
    if let Some((assignment, until)) = last {
        let left = until.saturating_duration_since(now).as_secs();
        if left >= 1 {
            return Some((assignment, std::time::Duration::from_secs(left)));
        }
    }
    let policy = item
        .rule
        .and_then(|r| r.on_store_error)
        .unwrap_or(inner.engine.options().on_store_error);
    bucket::on_failure(policy).map(|a| {
        (
            a,
            std::time::Duration::from_secs(inner.options.assignment_ttl_secs),
        )
    })
}

/// Envoy's reported usage on the rule's counters, as RLS hits are: the
/// same per-rule metrics, the same bounded labels.
fn account(counts: &Counts, plan: Plan, allowed: u64, denied: u64) {
    let total = allowed.saturating_add(denied);
    if total == 0 {
        return;
    }
    counts.total_hits.fetch_add(total, Ordering::Relaxed);
    match plan {
        Plan::Shadow => {
            counts.within_limit.fetch_add(total, Ordering::Relaxed);
        }
        _ => {
            counts.within_limit.fetch_add(allowed, Ordering::Relaxed);
            counts.over_limit.fetch_add(denied, Ordering::Relaxed);
        }
    }
}

fn skip(inner: &Inner, logged: &mut [bool; Skip::ALL.len()], stream: u64, domain: &str, why: Skip) {
    inner.stats.skipped(why);
    let i = Skip::ALL.iter().position(|s| *s == why).unwrap_or(0);
    if !logged[i] {
        logged[i] = true;
        tracing::warn!(
            domain,
            stream,
            reason = why.as_str(),
            "skipping a bucket of a usage report (logged once per stream and reason)"
        );
    }
}

fn view(
    stream: u64,
    domain: &str,
    item: &Item<'_>,
    assignment: Assignment,
    ledger: Option<Grant>,
) -> ShareView {
    ShareView {
        stream,
        domain: domain.to_owned(),
        bucket: item.identity.clone(),
        rule: item.rule.map(|r| r.path.clone()),
        assignment,
        holders: ledger.map_or(0, |g| g.holders),
        granted_total: ledger.map_or(0, |g| g.granted_total),
    }
}

fn action(usage: &UsageReport, assignment: Assignment, ttl: std::time::Duration) -> BucketAction {
    let strategy = match assignment {
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_secs,
        } => Strategy::TokenBucket(TokenBucket {
            max_tokens,
            // Always explicit: Envoy reads an unset one as 0, not 1.
            tokens_per_fill: Some(tokens_per_fill),
            fill_interval: Some(prost_types::Duration {
                seconds: fill_secs as i64,
                nanos: 0,
            }),
        }),
    };
    BucketAction {
        bucket_id: Some(usage.bucket_id.clone().unwrap_or_else(|| BucketId {
            bucket: Default::default(),
        })),
        bucket_action: Some(BucketActionKind::QuotaAssignmentAction(
            QuotaAssignmentAction {
                assignment_time_to_live: Some(prost_types::Duration {
                    seconds: ttl.as_secs() as i64,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            },
        )),
    }
}
