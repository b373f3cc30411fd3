//! The one bounded recorder of a session's egress decisions: every decision of a session's
//! proxy passes its [`Recorder`] before anything is logged, audited or streamed.
//!
//! A sandbox makes decisions as fast as it opens connections — a refused CONNECT costs the
//! proxy no name lookup and no upstream — and each recorded decision is a log line, an
//! audit line and an event in the stream of every task running in the session. So each
//! session has two token buckets: one for refusals ([`REFUSALS`]) and one for allowed
//! connections ([`ADMISSIONS`]), kept apart so that a flood of refusals never hides where
//! an allowed connection went, nor the reverse. A decision past its bucket is counted, not
//! recorded: the count (refused, allowed, the allowed ones' bytes, the first few hosts) is
//! reported as one [`EgressSuppressed`] once it is [`SUPPRESSED_INTERVAL`] old — with the
//! next decision, at the proxy's next tick, or when the session's proxy ends. Connections
//! closed at once because the session had [`super::MAX_CONNECTIONS_PER_SESSION`] open
//! take a refusal token for their log line and are counted the same way.
//!
//! So in `t` seconds a session reports at most `burst + t / refill` decisions of each kind
//! and one count per [`SUPPRESSED_INTERVAL`] (plus the last), and every decision is either
//! reported or counted.
//!
//! This module must never block, never do I/O, and never let a decision go uncounted.

use std::time::{Duration, Instant};

use super::EgressEvent;
use crate::session_key::SessionKey;

/// A token bucket's size and refill: `burst` records at once, then one per `refill`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub burst: u32,
    pub refill: Duration,
}

impl Budget {
    /// The most records this budget allows over `elapsed`, from a full bucket.
    pub fn most_over(&self, elapsed: Duration) -> u64 {
        u64::from(self.burst) + (elapsed.as_nanos() / self.refill.as_nanos()) as u64
    }
}

/// Refused decisions a session records one by one: a burst of 100 (a tool trying a few
/// blocked mirrors, each retried, is recorded whole), then one a second. Past that,
/// refusals say nothing new that the count and its sample hosts do not; the bound is what
/// keeps a looping client from writing gigabytes of audit log (one a second is ~30 MB a
/// day of audit lines per flooding session, against tens of thousands a second unbounded).
pub const REFUSALS: Budget = Budget { burst: 100, refill: Duration::from_secs(1) };
/// Allowed decisions a session records one by one: a burst of 200 (a package install
/// opening a connection per download), then ten a second. Each costs the sandbox a real
/// connection upstream, so they are rarer than refusals, and each says where data went,
/// so the budget is larger; past it they are counted with their bytes.
pub const ADMISSIONS: Budget = Budget { burst: 200, refill: Duration::from_millis(100) };
/// How old a count of suppressed decisions is before it is reported: one line per ten
/// seconds of flood says how big it is without becoming one.
pub const SUPPRESSED_INTERVAL: Duration = Duration::from_secs(10);
/// Distinct `host:port`s a count names (the first seen): enough to tell a loop on one
/// host from a scan, never a list that grows with the flood.
pub const MAX_SAMPLE_HOSTS: usize = 4;

/// A session's decisions past its record budget, counted instead of reported one by one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EgressSuppressed {
    /// The session whose sandbox asked.
    pub session: SessionKey,
    /// Refused decisions counted.
    pub refused: u64,
    /// Allowed decisions counted.
    pub allowed: u64,
    /// Connections closed at once at [`super::MAX_CONNECTIONS_PER_SESSION`], counted.
    pub connections_closed: u64,
    /// Bytes the counted allowed decisions sent.
    pub bytes_sent: u64,
    /// Bytes they received.
    pub bytes_received: u64,
    /// The first [`MAX_SAMPLE_HOSTS`] distinct `host:port`s asked for.
    pub hosts: Vec<String>,
    /// Time from the first decision counted to the report.
    pub seconds: u64,
}

impl EgressSuppressed {
    /// Every decision and closed connection it counts.
    pub fn total(&self) -> u64 {
        self.refused + self.allowed + self.connections_closed
    }
}

/// What a session's proxy reports to the observers ([`crate::Sandbox::on_egress`]).
#[derive(Debug, Clone, PartialEq)]
pub enum EgressReport {
    /// One decision, recorded whole.
    Decision(EgressEvent),
    /// Decisions past the session's record budget, counted.
    Suppressed(EgressSuppressed),
}

impl EgressReport {
    /// The decision, if this reports one.
    pub fn decision(&self) -> Option<&EgressEvent> {
        match self {
            EgressReport::Decision(ev) => Some(ev),
            EgressReport::Suppressed(_) => None,
        }
    }
}

/// A token bucket ([`Budget`]) on a clock the caller passes, so it is tested without time.
#[derive(Debug)]
struct Bucket {
    budget: Budget,
    tokens: u32,
    /// When `tokens` was last brought up to date (a partial period since then is kept).
    last: Instant,
}

impl Bucket {
    fn full(budget: Budget, now: Instant) -> Bucket {
        Bucket { budget, tokens: budget.burst, last: now }
    }

    /// Takes a token if there is one at `now`.
    fn take(&mut self, now: Instant) -> bool {
        let periods = now.saturating_duration_since(self.last).as_nanos() / self.budget.refill.as_nanos();
        if periods > 0 {
            let tokens = u128::from(self.tokens) + periods;
            if tokens >= u128::from(self.budget.burst) {
                self.tokens = self.budget.burst;
                self.last = now;
            } else {
                self.tokens = tokens as u32;
                // `periods` < burst here, so this fits.
                self.last += self.budget.refill * periods as u32;
            }
        }
        match self.tokens.checked_sub(1) {
            Some(left) => {
                self.tokens = left;
                true
            }
            None => false,
        }
    }
}

/// The count being gathered, and when its first decision came.
#[derive(Debug)]
struct Tally {
    since: Instant,
    counted: EgressSuppressed,
}

/// One session's recorder (see the module documentation).
#[derive(Debug)]
pub(crate) struct Recorder {
    session: SessionKey,
    refusals: Bucket,
    admissions: Bucket,
    tally: Option<Tally>,
}

/// What to report for one decision, in order: a count that came due, then the decision
/// itself if it is within its budget.
#[derive(Debug)]
pub(crate) struct Reports {
    pub(crate) suppressed: Option<EgressSuppressed>,
    pub(crate) decision: Option<EgressEvent>,
}

impl Recorder {
    pub(crate) fn new(session: SessionKey, now: Instant) -> Recorder {
        Recorder {
            session,
            refusals: Bucket::full(REFUSALS, now),
            admissions: Bucket::full(ADMISSIONS, now),
            tally: None,
        }
    }

    /// Takes `ev` at `now`: reported if its bucket has a token, counted otherwise.
    pub(crate) fn decide(&mut self, ev: EgressEvent, now: Instant) -> Reports {
        let suppressed = self.due(now);
        let bucket = if ev.allowed { &mut self.admissions } else { &mut self.refusals };
        if bucket.take(now) {
            return Reports { suppressed, decision: Some(ev) };
        }
        let counted = &mut self.tally(now).counted;
        if ev.allowed {
            counted.allowed += 1;
            counted.bytes_sent += ev.bytes_sent;
            counted.bytes_received += ev.bytes_received;
        } else {
            counted.refused += 1;
        }
        let host = format!("{}:{}", ev.host, ev.port);
        if counted.hosts.len() < MAX_SAMPLE_HOSTS && !counted.hosts.contains(&host) {
            counted.hosts.push(host);
        }
        Reports { suppressed, decision: None }
    }

    /// A connection closed at once (the session had its most open): whether to log it
    /// (a refusal token), and a count that came due. Counted when not logged.
    pub(crate) fn connection_closed(&mut self, now: Instant) -> (bool, Option<EgressSuppressed>) {
        let suppressed = self.due(now);
        if self.refusals.take(now) {
            return (true, suppressed);
        }
        self.tally(now).counted.connections_closed += 1;
        (false, suppressed)
    }

    /// The count, if it is [`SUPPRESSED_INTERVAL`] old at `now` (the proxy's tick).
    pub(crate) fn due(&mut self, now: Instant) -> Option<EgressSuppressed> {
        let old = self.tally.as_ref().is_some_and(|t| now.saturating_duration_since(t.since) >= SUPPRESSED_INTERVAL);
        if old { self.flush(now) } else { None }
    }

    /// The count whatever its age (the session's proxy ends).
    pub(crate) fn flush(&mut self, now: Instant) -> Option<EgressSuppressed> {
        let Tally { since, mut counted } = self.tally.take()?;
        counted.seconds = now.saturating_duration_since(since).as_secs();
        Some(counted)
    }

    fn tally(&mut self, now: Instant) -> &mut Tally {
        let session = &self.session;
        self.tally.get_or_insert_with(|| Tally {
            since: now,
            counted: EgressSuppressed {
                session: session.clone(),
                refused: 0,
                allowed: 0,
                connections_closed: 0,
                bytes_sent: 0,
                bytes_received: 0,
                hosts: vec![],
                seconds: 0,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(allowed: bool, host: &str) -> EgressEvent {
        EgressEvent {
            session: SessionKey::new("u", "s"),
            kind: "connect".into(),
            host: host.into(),
            port: 443,
            allowed,
            rule: "r".into(),
            bytes_sent: 3,
            bytes_received: 5,
            credential: None,
        }
    }

    #[test]
    fn a_burst_is_recorded_then_one_per_refill_and_the_rest_is_counted() {
        let t0 = Instant::now();
        let mut r = Recorder::new(SessionKey::new("u", "s"), t0);
        let recorded = (0..REFUSALS.burst + 50).filter(|_| r.decide(event(false, "x"), t0).decision.is_some()).count();
        assert_eq!(recorded, REFUSALS.burst as usize);
        // Allowed connections have a bucket of their own: the flood hid none of them.
        assert!(r.decide(event(true, "pypi.org"), t0).decision.is_some());
        // One refill later, one more refusal is recorded; the count is not due yet.
        let later = t0 + REFUSALS.refill;
        assert_eq!(r.decide(event(false, "y"), later).decision.map(|e| e.host), Some("y".into()));
        assert_eq!(r.due(later), None);
        let due = t0 + SUPPRESSED_INTERVAL;
        let reports = r.decide(event(false, "z"), due);
        let counted = reports.suppressed.expect("the count is due with the next decision");
        assert_eq!((counted.refused, counted.allowed, counted.hosts.clone()), (50, 0, vec!["x:443".to_string()]));
        assert_eq!(counted.seconds, SUPPRESSED_INTERVAL.as_secs());
        assert!(reports.decision.is_some(), "the bucket refilled meanwhile");
    }

    proptest! {
        /// Whatever the decisions and their timing: each kind is reported at most as its
        /// budget allows over the time they took, counts come at most once per interval
        /// (plus the last), and every decision is either reported or counted.
        #[test]
        fn a_flood_writes_at_most_the_buckets_records_and_loses_no_decision(
            steps in prop::collection::vec((0u64..400, any::<bool>(), 0u8..6, any::<bool>()), 1..2000),
        ) {
            let t0 = Instant::now();
            let mut r = Recorder::new(SessionKey::new("u", "s"), t0);
            let mut now = t0;
            let (mut refused, mut allowed, mut closed) = (0u64, 0u64, 0u64);
            let (mut reported_refused, mut reported_allowed, mut logged_closed) = (0u64, 0u64, 0u64);
            let mut counts: Vec<EgressSuppressed> = vec![];
            for (gap_ms, is_allowed, host, is_close) in steps {
                now += Duration::from_millis(gap_ms);
                if is_close {
                    closed += 1;
                    let (logged, due) = r.connection_closed(now);
                    logged_closed += u64::from(logged);
                    counts.extend(due);
                    continue;
                }
                if is_allowed { allowed += 1 } else { refused += 1 }
                let reports = r.decide(event(is_allowed, &format!("h{host}")), now);
                counts.extend(reports.suppressed);
                if let Some(d) = reports.decision {
                    if d.allowed { reported_allowed += 1 } else { reported_refused += 1 }
                }
            }
            counts.extend(r.flush(now));
            let elapsed = now - t0;
            prop_assert!(reported_refused + logged_closed <= REFUSALS.most_over(elapsed));
            prop_assert!(reported_allowed <= ADMISSIONS.most_over(elapsed));
            let intervals = (elapsed.as_nanos() / SUPPRESSED_INTERVAL.as_nanos()) as usize;
            prop_assert!(counts.len() <= intervals + 1, "{} counts over {elapsed:?}", counts.len());
            let sum = |f: fn(&EgressSuppressed) -> u64| counts.iter().map(f).sum::<u64>();
            prop_assert_eq!(reported_refused + sum(|c| c.refused), refused);
            prop_assert_eq!(reported_allowed + sum(|c| c.allowed), allowed);
            prop_assert_eq!(logged_closed + sum(|c| c.connections_closed), closed);
            prop_assert!(counts.iter().all(|c| c.hosts.len() <= MAX_SAMPLE_HOSTS && c.total() > 0));
        }
    }
}
