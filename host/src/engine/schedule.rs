//! Who runs next: the run slots of this process (`server.max_concurrent_tasks`) shared
//! fairly among the users with work queued ([`Scheduler`]), each user holding at most
//! `server.max_running_per_user` of them.
//!
//! The rule ([`FairQueue`]): when a slot frees, the next task is the oldest queued task of
//! the user with the fewest running tasks among those below their cap (ties: the user
//! whose oldest queued task came first); within a user, first come first served. So a
//! user who submitted one task waits at most for one slot to free, however many another
//! user queued — a user with queued work never waits while another user takes a second
//! slot more than them. A queued task's place ([`QueuePlace`]) is where that rule puts it
//! if nothing else arrives, and why it waits.
//!
//! The replicas' shared queue holds the same rule in its claim query
//! ([`crate::store::Store::claim`]). This module only hands out slots; it never starts,
//! runs or ends a task ([`super::Engine`] does), and nested subagents, which run inside
//! their root task's slot, never come here.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::oneshot;

/// Why a queued task waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// Every run slot (`server.max_concurrent_tasks`) runs a task.
    SlotsBusy,
    /// The task's user runs `server.max_running_per_user` tasks already.
    UserRunningLimit,
    /// In the replicas' shared queue: any replica with a free slot takes it.
    SharedQueue,
}

/// Where a queued task stands: `GET /v1/tasks/{id}` shows it as `queue` while the task
/// is `submitted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueuePlace {
    /// 1 = the next task to start. Where the fair-share rule puts it if no other task
    /// arrives: a later task of a user with fewer running tasks may come before it.
    pub position: usize,
    pub reason: WaitReason,
    /// The reason in words, with the limit's key and value.
    pub message: String,
}

/// The queued work of every user and the slots each user runs, as plain data: the
/// fair-share rule and nothing else (unit- and property-tested on its own).
#[derive(Debug)]
pub(super) struct FairQueue<T> {
    /// `server.max_concurrent_tasks`.
    capacity: usize,
    /// `server.max_running_per_user`.
    per_user: usize,
    /// Slots taken, in all.
    running_total: usize,
    /// Slots taken per user; a user with none has no entry.
    running: HashMap<String, usize>,
    /// Queued tasks per user, oldest first, each with its arrival number; a user with
    /// none has no entry.
    waiting: HashMap<String, VecDeque<(u64, T)>>,
    /// The next arrival number.
    next_seq: u64,
}

impl<T> FairQueue<T> {
    pub(super) fn new(capacity: usize, per_user: usize) -> Self {
        FairQueue {
            capacity: capacity.max(1),
            per_user: per_user.max(1),
            running_total: 0,
            running: HashMap::new(),
            waiting: HashMap::new(),
            next_seq: 0,
        }
    }

    pub(super) fn running_of(&self, user: &str) -> usize {
        self.running.get(user).copied().unwrap_or(0)
    }

    /// Free slots (whoever may take them).
    pub(super) fn free(&self) -> usize {
        self.capacity.saturating_sub(self.running_total)
    }

    /// Queues `item` for `user`, last of the user's.
    pub(super) fn push(&mut self, user: &str, item: T) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.waiting.entry(user.to_owned()).or_default().push_back((seq, item));
    }

    /// Takes the first queued item of `user` that `is` picks out of the queue.
    pub(super) fn remove(&mut self, user: &str, is: impl Fn(&T) -> bool) -> Option<T> {
        let queue = self.waiting.get_mut(user)?;
        let at = queue.iter().position(|(_, t)| is(t))?;
        let (_, item) = queue.remove(at)?;
        if queue.is_empty() {
            self.waiting.remove(user);
        }
        Some(item)
    }

    /// The user whose queued task starts next: below the cap, fewest running, then the
    /// oldest queued task.
    fn next_user(&self) -> Option<&String> {
        self.waiting
            .iter()
            .filter(|(user, _)| self.running_of(user) < self.per_user)
            .min_by_key(|(user, queue)| (self.running_of(user), queue.front().map_or(u64::MAX, |(seq, _)| *seq)))
            .map(|(user, _)| user)
    }

    /// Starts the next queued task if a slot is free for it: (its user, it), its slot taken.
    pub(super) fn start_next(&mut self) -> Option<(String, T)> {
        if self.free() == 0 {
            return None;
        }
        let user = self.next_user()?.clone();
        let queue = self.waiting.get_mut(&user)?;
        let (_, item) = queue.pop_front()?;
        if queue.is_empty() {
            self.waiting.remove(&user);
        }
        self.take(&user);
        Some((user, item))
    }

    /// Takes a slot for a task of `user` that did not queue, when one is free for it and
    /// no queued task comes first.
    pub(super) fn try_take(&mut self, user: &str) -> bool {
        if self.free() == 0 || self.running_of(user) >= self.per_user || self.next_user().is_some() {
            return false;
        }
        self.take(user);
        true
    }

    fn take(&mut self, user: &str) {
        self.running_total += 1;
        *self.running.entry(user.to_owned()).or_default() += 1;
    }

    /// Gives back a slot of `user`.
    pub(super) fn release(&mut self, user: &str) {
        let Some(n) = self.running.get_mut(user) else { return };
        *n -= 1;
        if *n == 0 {
            self.running.remove(user);
        }
        self.running_total = self.running_total.saturating_sub(1);
    }

    /// The order key of the `k`-th queued task (arrival `seq`) of a user running `running`:
    /// tasks start in the order of these keys if nothing else arrives or ends. Within a
    /// user the keys increase, and [`FairQueue::start_next`] takes the least of the users'
    /// first keys, so the order it starts tasks in is the order of all the keys.
    fn key(&self, running: usize, k: usize, seq: u64) -> (bool, usize, u64) {
        (running + k >= self.per_user, running + k, seq)
    }

    /// Where the queued item of `user` that `is` picks out stands, and why it waits.
    pub(super) fn place(&self, user: &str, is: impl Fn(&T) -> bool) -> Option<QueuePlace> {
        let queue = self.waiting.get(user)?;
        let k = queue.iter().position(|(_, t)| is(t))?;
        let mine = self.key(self.running_of(user), k, queue[k].0);
        let before: usize = self
            .waiting
            .iter()
            .map(|(other, q)| {
                let running = self.running_of(other);
                q.iter().enumerate().filter(|(j, (seq, _))| self.key(running, *j, *seq) < mine).count()
            })
            .sum();
        let running = self.running_of(user);
        let (reason, message) = if running >= self.per_user {
            (
                WaitReason::UserRunningLimit,
                format!(
                    "user `{user}` runs {running} tasks, the most one user may run at once \
                     (server.max_running_per_user = {}); it starts when one of them ends",
                    self.per_user
                ),
            )
        } else {
            (
                WaitReason::SlotsBusy,
                format!(
                    "all {} run slots are busy (server.max_concurrent_tasks); slots go to the users with the fewest \
                     running tasks first",
                    self.capacity
                ),
            )
        };
        Some(QueuePlace { position: before + 1, reason, message })
    }
}

/// A queued task waiting for its slot.
struct Waiter {
    task_id: String,
    grant: oneshot::Sender<SlotPermit>,
}

/// The run slots of this process, handed out by the fair-share rule. Share it as
/// `Arc<Scheduler>`.
pub(super) struct Scheduler {
    queue: Mutex<FairQueue<Waiter>>,
}

/// A run slot of a task; given back when dropped (and the next queued task started).
pub struct SlotPermit {
    scheduler: Arc<Scheduler>,
    user: String,
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        let started = {
            let mut queue = self.scheduler.queue.lock().unwrap();
            queue.release(&self.user);
            self.scheduler.start_queued(&mut queue)
        };
        self.scheduler.grant(started);
    }
}

/// Takes a waiter out of the queue when its wait is given up (its task canceled).
struct Dequeue<'a> {
    scheduler: &'a Scheduler,
    user: &'a str,
    task_id: &'a str,
}

impl Drop for Dequeue<'_> {
    fn drop(&mut self) {
        let removed = self.scheduler.queue.lock().unwrap().remove(self.user, |w| w.task_id == self.task_id);
        drop(removed);
    }
}

impl Scheduler {
    /// `max_concurrent_tasks` slots, at most `max_running_per_user` of them per user.
    pub(super) fn new(max_concurrent_tasks: usize, max_running_per_user: usize) -> Arc<Self> {
        Arc::new(Scheduler { queue: Mutex::new(FairQueue::new(max_concurrent_tasks, max_running_per_user)) })
    }

    /// Every queued task a free slot can take now, with its permit.
    fn start_queued(self: &Arc<Self>, queue: &mut FairQueue<Waiter>) -> Vec<(Waiter, SlotPermit)> {
        let mut started = vec![];
        while let Some((user, waiter)) = queue.start_next() {
            started.push((waiter, SlotPermit { scheduler: self.clone(), user }));
        }
        started
    }

    /// Hands the started tasks their permits (outside the lock: a waiter gone meanwhile
    /// drops its permit, which gives the slot back).
    fn grant(&self, started: Vec<(Waiter, SlotPermit)>) {
        for (waiter, permit) in started {
            let _ = waiter.grant.send(permit);
        }
    }

    /// Waits for a slot for task `task_id` of `user`, in the queue; `None` only if the
    /// scheduler let go of the wait (never while the task waits).
    pub(super) async fn acquire(self: &Arc<Self>, user: &str, task_id: &str) -> Option<SlotPermit> {
        let (grant, granted) = oneshot::channel();
        let started = {
            let mut queue = self.queue.lock().unwrap();
            queue.push(user, Waiter { task_id: task_id.to_owned(), grant });
            self.start_queued(&mut queue)
        };
        self.grant(started);
        let _dequeue = Dequeue { scheduler: self, user, task_id };
        granted.await.ok()
    }

    /// A slot for a task of `user` now, if one is free for it and no queued task comes first.
    pub(super) fn try_acquire(self: &Arc<Self>, user: &str) -> Option<SlotPermit> {
        let taken = self.queue.lock().unwrap().try_take(user);
        taken.then(|| SlotPermit { scheduler: self.clone(), user: user.to_owned() })
    }

    /// Free slots.
    pub(super) fn free(&self) -> usize {
        self.queue.lock().unwrap().free()
    }

    /// Whether a task of `user` would find a slot at once.
    pub(super) fn has_room_for(&self, user: &str) -> bool {
        let queue = self.queue.lock().unwrap();
        queue.free() > 0 && queue.running_of(user) < queue.per_user
    }

    /// Where task `task_id` of `user` stands in the queue, if it is queued here.
    pub(super) fn place(&self, user: &str, task_id: &str) -> Option<QueuePlace> {
        self.queue.lock().unwrap().place(user, |w| w.task_id == task_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Starts queued tasks while slots are free: the (user, task) started, in order.
    fn start_all(q: &mut FairQueue<u32>) -> Vec<(String, u32)> {
        std::iter::from_fn(|| q.start_next()).collect()
    }

    /// Regression (issue 41): one user's 100 queued tasks came before another user's one,
    /// which waited for all of them. It starts at the next free slot.
    #[test]
    fn regression_one_users_backlog_does_not_starve_another_user() {
        let mut q = FairQueue::new(2, 2);
        for t in 0..100 {
            q.push("bob", t);
        }
        assert_eq!(start_all(&mut q), [("bob".into(), 0), ("bob".into(), 1)]);
        q.push("alice", 1000);
        let place = q.place("alice", |t| *t == 1000).unwrap();
        assert_eq!((place.position, place.reason), (1, WaitReason::SlotsBusy));
        assert!(place.message.contains("server.max_concurrent_tasks"), "{}", place.message);
        q.release("bob");
        assert_eq!(start_all(&mut q), [("alice".into(), 1000)]);
        q.release("bob");
        assert_eq!(start_all(&mut q), [("bob".into(), 2)]);
    }

    #[test]
    fn a_user_at_the_cap_waits_with_the_reason() {
        let mut q = FairQueue::new(4, 1);
        q.push("bob", 1);
        q.push("bob", 2);
        assert_eq!(start_all(&mut q), [("bob".into(), 1)]);
        let place = q.place("bob", |t| *t == 2).unwrap();
        assert_eq!((place.position, place.reason), (1, WaitReason::UserRunningLimit));
        assert!(place.message.contains("server.max_running_per_user = 1"), "{}", place.message);
        assert!(!q.try_take("bob"));
        assert!(q.try_take("alice"), "a free slot and a user below the cap");
    }

    /// What the property test runs: a user submits a task, or a running task of a user ends.
    #[derive(Debug, Clone)]
    enum Op {
        Submit(u8),
        End(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![3 => (0u8..4).prop_map(Op::Submit), 2 => (0u8..4).prop_map(Op::End)]
    }

    proptest! {
        /// Whatever users submit and whenever tasks end: a slot never goes to a user while
        /// another user with queued work (below the cap) runs fewer tasks; no slot stays free
        /// while a task that may start waits; no user runs more than the cap; each user's
        /// tasks start in the order submitted; and the places of the queued tasks are 1..=n,
        /// the next one started being the one at place 1.
        #[test]
        fn slots_go_to_the_user_with_the_fewest_running(
            capacity in 1usize..5,
            per_user in 1usize..5,
            ops in proptest::collection::vec(op(), 0..80),
        ) {
            let mut q = FairQueue::new(capacity, per_user);
            let mut next = 0u32;
            let mut running: HashMap<String, Vec<u32>> = HashMap::new();
            let mut last_started: HashMap<String, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Submit(u) => {
                        q.push(&format!("u{u}"), next);
                        next += 1;
                    }
                    Op::End(u) => {
                        let user = format!("u{u}");
                        if running.get_mut(&user).and_then(|r| r.pop()).is_some() {
                            q.release(&user);
                        }
                    }
                }
                // The places before starting: distinct, 1..=n.
                let mut places: Vec<(usize, String, u32)> = q
                    .waiting
                    .iter()
                    .flat_map(|(user, queue)| queue.iter().map(move |(_, t)| (user.clone(), *t)))
                    .map(|(user, t)| (q.place(&user, |x| *x == t).unwrap().position, user, t))
                    .collect();
                places.sort();
                prop_assert_eq!(places.iter().map(|p| p.0).collect::<Vec<_>>(), (1..=places.len()).collect::<Vec<_>>());
                let mut first = true;
                loop {
                    // Who could be served, before the pick.
                    let eligible: Vec<(String, usize)> = q
                        .waiting
                        .keys()
                        .filter(|u| q.running_of(u) < per_user)
                        .map(|u| (u.clone(), q.running_of(u)))
                        .collect();
                    let Some((user, t)) = q.start_next() else {
                        prop_assert!(q.free() == 0 || eligible.is_empty(), "a slot is free and {:?} may start", eligible);
                        break;
                    };
                    let had = running.get(&user).map_or(0, Vec::len);
                    for (other, n) in &eligible {
                        prop_assert!(had <= *n, "{} got a slot with {} running while {} waits with {}", user, had, other, n);
                    }
                    prop_assert!(had < per_user);
                    if first {
                        prop_assert_eq!(places.first().map(|p| (p.1.clone(), p.2)), Some((user.clone(), t)), "place 1 starts first");
                        first = false;
                    }
                    if let Some(prev) = last_started.insert(user.clone(), t) {
                        prop_assert!(prev < t, "{}'s tasks started out of order", user);
                    }
                    running.entry(user).or_default().push(t);
                }
                let total: usize = running.values().map(Vec::len).sum();
                prop_assert!(total <= capacity);
                prop_assert_eq!(q.free(), capacity - total);
            }
        }
    }

    #[tokio::test]
    async fn a_canceled_wait_leaves_the_queue_and_a_dropped_permit_starts_the_next() {
        let s = Scheduler::new(1, 1);
        let first = s.try_acquire("bob").expect("a free slot");
        let waiting = s.clone();
        let wait = tokio::spawn(async move { waiting.acquire("bob", "t2").await });
        let alice = s.clone();
        let alice_wait = tokio::spawn(async move { alice.acquire("alice", "t3").await });
        while s.place("alice", "t3").is_none() || s.place("bob", "t2").is_none() {
            tokio::task::yield_now().await;
        }
        assert_eq!(s.place("bob", "t2").unwrap().reason, WaitReason::UserRunningLimit);
        wait.abort();
        let _ = wait.await;
        assert!(s.place("bob", "t2").is_none(), "a canceled wait leaves the queue");
        drop(first);
        let permit = alice_wait.await.unwrap().expect("alice's task starts");
        assert_eq!(s.free(), 0);
        drop(permit);
        assert_eq!(s.free(), 1);
    }
}
