//! Tenant policy: which tools a tenant may call, how fast, and how many at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::settings::{PolicySettings, Rate};

/// Buckets and counters kept per replica before the full ones are dropped: a tenant id is the
/// caller's to choose (unless signatures bind it), so the map must not grow without bound. A
/// full bucket and an absent one mean the same.
const MAX_TRACKED_TENANTS: usize = 10_000;

/// One `[[policy]]` rule, compiled.
#[derive(Debug)]
pub(crate) struct Rule {
    pub tenant: String,
    allow: Vec<glob::Pattern>,
    deny: Vec<glob::Pattern>,
    pub rate: Option<Rate>,
    pub max_in_flight: Option<u32>,
}

impl Rule {
    fn new(settings: &PolicySettings) -> Rule {
        let globs =
            |globs: &[String]| globs.iter().filter_map(|glob| glob::Pattern::new(glob).ok()).collect();
        Rule {
            tenant: settings.tenant.clone(),
            allow: globs(&settings.allow),
            deny: globs(&settings.deny),
            rate: settings.rate(),
            max_in_flight: settings.max_in_flight,
        }
    }

    /// Why the rule does not let its tenant call `tool`, if it does not; deny wins over allow.
    pub(crate) fn refuses(&self, tool: &str) -> Option<&'static str> {
        if self.deny.iter().any(|glob| glob.matches(tool)) {
            return Some("denied by the tenant's policy");
        }
        if !self.allow.iter().any(|glob| glob.matches(tool)) {
            return Some("not allowed by the tenant's policy");
        }
        None
    }
}

/// The compiled `[[policy]]` rules.
#[derive(Debug, Default)]
pub(crate) struct Policies {
    rules: Vec<Rule>,
    by_tenant: HashMap<String, usize>,
    default: Option<usize>,
}

/// What a tenant's rule says about one tool.
pub(crate) enum Verdict<'a> {
    /// No `[[policy]]` is configured: everything is allowed, without limits.
    Open,
    /// The tenant has no rule and there is no default rule: nothing is allowed.
    NoRule,
    /// The tenant's rule (or the default one).
    Rule(&'a Rule),
}

impl Policies {
    pub(crate) fn new(settings: &[PolicySettings]) -> Policies {
        let rules: Vec<Rule> = settings.iter().map(Rule::new).collect();
        let by_tenant = rules.iter().enumerate().map(|(at, rule)| (rule.tenant.clone(), at)).collect();
        let default = rules.iter().position(|rule| rule.tenant == "*");
        Policies { rules, by_tenant, default }
    }

    /// Whether any rule is configured.
    pub(crate) fn is_open(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rule for `tenant`: its own, else the default rule.
    pub(crate) fn rule(&self, tenant: &str) -> Verdict<'_> {
        if self.rules.is_empty() {
            return Verdict::Open;
        }
        match self.by_tenant.get(tenant).copied().or(self.default) {
            Some(at) => Verdict::Rule(&self.rules[at]),
            None => Verdict::NoRule,
        }
    }

    /// Whether `tenant` may call `tool` (for listings).
    pub(crate) fn allows(&self, tenant: &str, tool: &str) -> bool {
        match self.rule(tenant) {
            Verdict::Open => true,
            Verdict::NoRule => false,
            Verdict::Rule(rule) => rule.refuses(tool).is_none(),
        }
    }
}

/// A token bucket.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// What this replica tracks of one tenant.
#[derive(Debug, Default)]
struct TenantState {
    bucket: Option<Bucket>,
    in_flight: u32,
}

/// Per-replica rate buckets and in-flight counters, by tenant.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    tenants: Mutex<HashMap<String, TenantState>>,
}

/// Why a call was held back by a limit, with when to retry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Limited {
    /// The tenant's calls in flight are at `max_in_flight`.
    InFlight(u32),
    /// The tenant's bucket is empty; a token is there after this.
    Rate(Duration),
}

/// A tenant's call counted in flight; dropping it ends the count.
pub(crate) struct InFlight {
    counters: Arc<Counters>,
    tenant: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut tenants = self.counters.lock();
        if let Some(state) = tenants.get_mut(&self.tenant) {
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0 && state.bucket.is_none() {
                tenants.remove(&self.tenant);
            }
        }
    }
}

impl Counters {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, TenantState>> {
        self.tenants.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a call of `tenant` in flight, unless it is at `max` already.
    pub(crate) fn enter(self: &Arc<Self>, tenant: &str, max: u32) -> Result<InFlight, Limited> {
        let mut tenants = self.lock();
        let state = match tenants.get_mut(tenant) {
            Some(state) => state,
            None => {
                Self::make_room(&mut tenants, Instant::now());
                tenants.entry(tenant.to_owned()).or_default()
            }
        };
        if state.in_flight >= max {
            return Err(Limited::InFlight(max));
        }
        state.in_flight += 1;
        Ok(InFlight { counters: self.clone(), tenant: tenant.to_owned() })
    }

    /// Takes a token from `tenant`'s bucket at `now`.
    pub(crate) fn take(&self, tenant: &str, rate: Rate, now: Instant) -> Result<(), Limited> {
        let mut tenants = self.lock();
        // A known tenant's name is not copied: only a new one allocates its entry.
        let state = match tenants.get_mut(tenant) {
            Some(state) => state,
            None => {
                Self::make_room(&mut tenants, now);
                tenants.entry(tenant.to_owned()).or_default()
            }
        };
        let bucket = state.bucket.get_or_insert(Bucket { tokens: rate.burst, at: now });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate.per_second).min(rate.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - bucket.tokens) / rate.per_second;
        Err(Limited::Rate(Duration::from_secs_f64(wait).max(Duration::from_millis(1))))
    }

    /// Drops the tenants that hold nothing worth keeping (no call in flight; a bucket that has
    /// refilled is as good as none) once there are too many.
    fn make_room(tenants: &mut HashMap<String, TenantState>, now: Instant) {
        if tenants.len() < MAX_TRACKED_TENANTS {
            return;
        }
        // A bucket untouched for an hour has refilled at any rate above one call an hour.
        tenants.retain(|_, state| {
            state.in_flight > 0
                || state.bucket.as_ref().is_some_and(|bucket| {
                    now.saturating_duration_since(bucket.at) < Duration::from_secs(3600)
                })
        });
    }

    /// How many tenants are tracked (tests).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(tenant: &str, allow: &[&str], deny: &[&str]) -> PolicySettings {
        PolicySettings {
            tenant: tenant.to_owned(),
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            deny: deny.iter().map(|s| (*s).to_owned()).collect(),
            rate: None,
            burst: None,
            max_in_flight: None,
        }
    }

    #[test]
    fn deny_wins_and_the_default_rule_covers_other_tenants() {
        let policies = Policies::new(&[
            rule("acme", &["echo", "time__*"], &["time__secret"]),
            rule("*", &["echo"], &[]),
        ]);
        assert!(policies.allows("acme", "echo"));
        assert!(policies.allows("acme", "time__now"));
        assert!(!policies.allows("acme", "time__secret"));
        assert!(!policies.allows("acme", "terminal_run"));
        assert!(policies.allows("other", "echo"));
        assert!(!policies.allows("other", "time__now"));
        assert!(policies.allows("", "echo"), "no tenant gets the default rule");
        let strict = Policies::new(&[rule("acme", &["*"], &["terminal_run"])]);
        assert!(!strict.allows("other", "echo"), "no rule and no default rule: nothing");
        assert!(!strict.allows("acme", "terminal_run"));
        assert!(Policies::new(&[]).allows("anyone", "terminal_run"));
    }

    #[test]
    fn a_bucket_gives_its_burst_then_one_token_per_period() {
        let counters = Counters::default();
        let rate = Rate { per_second: 10.0, burst: 3.0 };
        let start = Instant::now();
        for _ in 0..3 {
            counters.take("a", rate, start).unwrap();
        }
        let Err(Limited::Rate(wait)) = counters.take("a", rate, start) else { panic!("over the burst") };
        assert_eq!(wait, Duration::from_millis(100));
        // Another tenant has its own bucket.
        counters.take("b", rate, start).unwrap();
        let later = start + Duration::from_millis(100);
        counters.take("a", rate, later).unwrap();
        assert!(counters.take("a", rate, later).is_err());
        // Idle for long, the bucket holds no more than its burst.
        let much_later = start + Duration::from_secs(60);
        for _ in 0..3 {
            counters.take("a", rate, much_later).unwrap();
        }
        assert!(counters.take("a", rate, much_later).is_err());
    }

    #[test]
    fn in_flight_counts_until_dropped_and_tenants_do_not_pile_up() {
        let counters = Arc::new(Counters::default());
        let first = counters.enter("a", 2).unwrap();
        let second = counters.enter("a", 2).unwrap();
        assert_eq!(counters.enter("a", 2).err(), Some(Limited::InFlight(2)));
        let other = counters.enter("b", 2).unwrap();
        drop(first);
        let third = counters.enter("a", 2).unwrap();
        drop((second, third, other));
        assert_eq!(counters.tracked(), 0, "a tenant with nothing in flight and no bucket is forgotten");
        // Caller-chosen tenants cannot grow the map past its bound with full buckets.
        let rate = Rate { per_second: 1.0, burst: 5.0 };
        let start = Instant::now();
        for n in 0..MAX_TRACKED_TENANTS {
            counters.take(&format!("t{n}"), rate, start).unwrap();
        }
        counters.take("fresh", rate, start + Duration::from_secs(7200)).unwrap();
        assert_eq!(counters.tracked(), 1);
    }
}
