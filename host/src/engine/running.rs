//! The tasks this process runs or queues ([`LiveTasks`]): each task's live side by id,
//! and beside it how many of them each user has, kept as tasks join and leave so that
//! admission (`server.max_tasks_per_user`) costs the same whatever the number of tasks.
//! It owns no task and decides nothing; [`super::Engine`] admits and ends tasks.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::live::LiveTask;

/// The engine's tasks by id, with each user's count of the ones that take a share of
/// `server.max_tasks_per_user` (every task but nested subagents, which run inside their
/// root task's).
///
/// Regression: the share was counted by scanning every live task, twice per submission and
/// once under the engine's lock: with 1,000 tasks queued at once, ~2 M comparisons, and
/// the task engine's throughput fell 12% in the dev profile.
#[derive(Default)]
pub(super) struct LiveTasks {
    by_id: HashMap<String, Arc<LiveTask>>,
    /// Tasks per user id that count for the user; a user with none has no entry.
    per_user: HashMap<String, usize>,
}

impl LiveTasks {
    /// Adds (or replaces) the task `id`.
    pub(super) fn insert(&mut self, id: String, task: Arc<LiveTask>) {
        self.count(&task, true);
        if let Some(old) = self.by_id.insert(id, task) {
            self.count(&old, false);
        }
    }

    /// Takes the task `id` out; `None` when it was not here.
    pub(super) fn remove(&mut self, id: &str) -> Option<Arc<LiveTask>> {
        let old = self.by_id.remove(id)?;
        self.count(&old, false);
        Some(old)
    }

    pub(super) fn get(&self, id: &str) -> Option<&Arc<LiveTask>> {
        self.by_id.get(id)
    }

    /// Tasks queued or running here, nested subagents included.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(super) fn ids(&self) -> impl Iterator<Item = &String> {
        self.by_id.keys()
    }

    /// Every task with its id.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &Arc<LiveTask>)> {
        self.by_id.iter()
    }

    /// Whether every task of `session` (user id, session id) here waits for a person — has
    /// an approval request waiting, is one of `asking` (the task whose request was just
    /// made and the tasks above it, whose counts may not have caught up yet), or is above
    /// such a task (a parent's `Agent` call waits on its child) — so nothing will use the
    /// session's sandbox until someone answers. `false` when the session has no open task
    /// here: a queued task is not waiting, and one that ended is no longer counted.
    pub(super) fn all_wait_for_people(&self, session: &(String, String), asking: &[&str]) -> bool {
        let mut open = Vec::new();
        for (id, t) in self.by_id.iter().filter(|(_, t)| &t.session == session) {
            let inner = t.inner.lock().unwrap();
            if inner.closed {
                continue;
            }
            let waits = inner.pending_approvals > 0 || asking.contains(&id.as_str());
            open.push((id.as_str(), inner.record.parent_task_id.clone(), waits));
        }
        if open.is_empty() {
            return false;
        }
        // Above a waiting task waits too: spread upwards until nothing changes (a chain is
        // at most `subagents.max_depth` long).
        loop {
            let parents: HashSet<String> =
                open.iter().filter(|(_, _, waits)| *waits).filter_map(|(_, p, _)| p.clone()).collect();
            let mut changed = false;
            for (id, _, waits) in open.iter_mut() {
                if !*waits && parents.contains(*id) {
                    *waits = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        open.iter().all(|(_, _, waits)| *waits)
    }

    /// How many of `user`'s tasks take a share of `server.max_tasks_per_user`.
    pub(super) fn of_user(&self, user: &str) -> usize {
        self.per_user.get(user).copied().unwrap_or(0)
    }

    fn count(&mut self, task: &LiveTask, joins: bool) {
        if !task.counts_for_user {
            return;
        }
        let user = &task.session.0;
        if joins {
            *self.per_user.entry(user.clone()).or_default() += 1;
        } else if let Some(n) = self.per_user.get_mut(user) {
            *n -= 1;
            if *n == 0 {
                self.per_user.remove(user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Task `id` joins: `user`'s, counting for the user or not (a nested subagent).
        Insert {
            id: u8,
            user: u8,
            counts: bool,
        },
        Remove {
            id: u8,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..8, 0u8..3, any::<bool>()).prop_map(|(id, user, counts)| Op::Insert { id, user, counts }),
            (0u8..8).prop_map(|id| Op::Remove { id }),
        ]
    }

    proptest! {
        /// Whatever tasks join, are replaced and leave, each user's count is what counting
        /// the tasks one by one gives, and a user with no task has no entry left behind.
        #[test]
        fn each_users_count_is_the_count_of_their_tasks(ops in proptest::collection::vec(op(), 0..64)) {
            let store = Store::in_memory().unwrap();
            let templates: Vec<Vec<Arc<LiveTask>>> = (0..3)
                .map(|user| {
                    [false, true]
                        .into_iter()
                        .map(|counts| {
                            LiveTask::detached(&format!("u{user}"), counts, Default::default(), store.clone())
                        })
                        .collect()
                })
                .collect();
            let mut tasks = LiveTasks::default();
            for op in ops {
                match op {
                    Op::Insert { id, user, counts } => {
                        tasks.insert(id.to_string(), templates[user as usize][counts as usize].clone())
                    }
                    Op::Remove { id } => {
                        let was_there = tasks.get(&id.to_string()).is_some();
                        prop_assert_eq!(tasks.remove(&id.to_string()).is_some(), was_there);
                    }
                }
                for user in ["u0", "u1", "u2"] {
                    let counted = tasks.by_id.values().filter(|t| t.counts_for_user && t.session.0 == user).count();
                    prop_assert_eq!(tasks.of_user(user), counted, "user {}", user);
                }
                prop_assert!(tasks.per_user.values().all(|&n| n > 0));
                prop_assert_eq!(tasks.len(), tasks.ids().count());
            }
        }
    }

    /// A session is left to a person only when every open task of it waits: its own
    /// request, the one just made, or a subagent below it that waits.
    #[test]
    fn a_session_waits_for_people_only_when_every_open_task_of_it_does() {
        let store = Store::in_memory().unwrap();
        let session = ("u".to_string(), "s1".to_string());
        // (id, parent, pending approvals)
        let make = |specs: &[(&str, Option<&str>, usize)]| {
            let mut tasks = LiveTasks::default();
            for (id, parent, pending) in specs {
                let t = LiveTask::detached("u", true, Default::default(), store.clone());
                {
                    let mut inner = t.inner.lock().unwrap();
                    inner.record.parent_task_id = parent.map(str::to_owned);
                    inner.pending_approvals = *pending;
                }
                tasks.insert(id.to_string(), t);
            }
            tasks
        };
        assert!(!make(&[]).all_wait_for_people(&session, &[]), "no task: nothing to pause for");
        assert!(make(&[("a", None, 1)]).all_wait_for_people(&session, &[]));
        assert!(make(&[("a", None, 0)]).all_wait_for_people(&session, &["a"]), "the request just made");
        assert!(!make(&[("a", None, 1), ("b", None, 0)]).all_wait_for_people(&session, &[]), "b may run a call");
        // A parent waits on its child's question; a second child that runs does not wait.
        assert!(make(&[("p", None, 0), ("c", Some("p"), 1)]).all_wait_for_people(&session, &[]));
        assert!(make(&[("g", None, 0), ("p", Some("g"), 0), ("c", Some("p"), 1)]).all_wait_for_people(&session, &[]));
        let busy = make(&[("p", None, 0), ("c", Some("p"), 1), ("d", Some("p"), 0)]);
        assert!(!busy.all_wait_for_people(&session, &[]));
        // Another session's tasks, and ended ones, do not count.
        assert!(make(&[("a", None, 1)]).all_wait_for_people(&session, &[]));
        assert!(!make(&[("a", None, 1)]).all_wait_for_people(&("u".into(), "other".into()), &["a"]));
        let ended = make(&[("a", None, 1), ("b", None, 0)]);
        ended.get("b").unwrap().inner.lock().unwrap().closed = true;
        assert!(ended.all_wait_for_people(&session, &[]));
    }
}
