//! Secret lanes: which Bash commands of one session may run at the same time.
//!
//! Every command of a session runs as the same uid, so a running command can read the
//! environment of any other running command of the session (`/proc/<pid>/environ`, its
//! memory, its descriptors): a prompt-injected task B would read task A's `tool_context`
//! secrets while a command of A runs. A session's [`Lanes`] owns the one rule that keeps
//! them apart: **Bash commands of a session run at the same time only when their secret
//! fingerprint is equal** (`shell_state::writer_of`: a keyed hash of the call's secret
//! names and values, [`NO_SECRETS`] for none). Calls with the same secrets,
//! or with none, have nothing to take from each other and run side by side; a call of
//! another fingerprint waits until every running one has ended — by then the agent has killed
//! everything they started — for at most its own timeout. A command's lane is held until
//! its agent has swept its processes, also when the call is dropped mid-command
//! (`exec::run` keeps the [`LanePass`] until that kill has run).
//!
//! Fairness: waiting calls are admitted in arrival order, consecutive waiters of one
//! fingerprint together. Once a call of another fingerprint waits, new calls of the
//! running fingerprint queue behind it, so a stream of one task's commands never starves
//! another task's.
//!
//! What runs outside the lanes, and why:
//! - Glob and Grep run ripgrep with no secrets in its environment and no code the model
//!   chose (its argv is built by `tools::search`): nothing to steal from them, and they
//!   read nothing but files.
//! - Read, Write and Edit are served by the agent itself, which is non-dumpable.
//! - Session processes (stdio MCP servers, `process.rs`) and what they run for a call run
//!   beside every command as the same uid: a server started with a task's secrets can be
//!   read by any concurrent command of the session, and a program a server runs for a call
//!   (a git hook the model wrote) can read a concurrent command's environment until the
//!   call ends and the host contains the session ([`crate::Sandbox::contain`]). Tasks whose
//!   secrets must stay apart from such servers need sessions of their own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// The fingerprint of a call's secrets (`shell_state::writer_of`): a keyed hash of the
/// secret names and values, [`NO_SECRETS`] for calls without secrets; the key is random
/// per host process. Which lane a command runs in, which calls' secrets wrote a
/// persisted shell variable, and (in the host) which stdio MCP server process a task may
/// use: one started with exactly its secrets.
pub type Writer = u64;
/// The fingerprint of a call without secrets (also the lane those calls share).
pub const NO_SECRETS: Writer = 0;

/// One session's lanes (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    state: Mutex<State>,
    /// Woken whenever a command ends or a waiter gives up: waiters look again.
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// The fingerprint of the running commands (`None`: none runs).
    running: Option<Writer>,
    /// How many commands run in `running`'s lane.
    count: usize,
    /// Calls waiting, in arrival order: (ticket, fingerprint).
    queue: VecDeque<(u64, Writer)>,
    /// The next ticket number.
    next_ticket: u64,
}

impl State {
    /// Whether the waiter `ticket` of `lane` may start now: its lane runs or none does,
    /// and every waiter ahead of it is of its lane (it is in the first group).
    fn may_start(&self, ticket: u64, lane: Writer) -> bool {
        if self.running.is_some_and(|r| r != lane) {
            return false;
        }
        for &(t, l) in &self.queue {
            if t == ticket {
                return true;
            }
            if l != lane {
                return false;
            }
        }
        false
    }
}

/// Leave to run a command in one lane; the lane is held until it drops.
#[derive(Debug)]
pub(crate) struct LanePass {
    lanes: Arc<Lanes>,
}

impl Drop for LanePass {
    fn drop(&mut self) {
        let mut s = self.lanes.state.lock().expect("lanes lock");
        s.count -= 1;
        if s.count == 0 {
            s.running = None;
        }
        drop(s);
        self.lanes.changed.notify_waiters();
    }
}

/// A call waited its whole timeout for commands of another fingerprint to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaneTimeout;

/// A waiter's place in the queue; leaving it (given up or dropped) lets those behind on.
struct Ticket<'a> {
    lanes: &'a Lanes,
    ticket: u64,
    queued: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.queued {
            return;
        }
        let mut s = self.lanes.state.lock().expect("lanes lock");
        s.queue.retain(|&(t, _)| t != self.ticket);
        drop(s);
        self.lanes.changed.notify_waiters();
    }
}

impl Lanes {
    /// Waits until a command of fingerprint `lane` may run in this session, at most
    /// `within`; the command runs in the lane while the returned pass lives.
    pub(crate) async fn enter(self: &Arc<Self>, lane: Writer, within: Duration) -> Result<LanePass, LaneTimeout> {
        let deadline = tokio::time::Instant::now() + within;
        let mut ticket = {
            let mut s = self.state.lock().expect("lanes lock");
            let t = s.next_ticket;
            s.next_ticket += 1;
            s.queue.push_back((t, lane));
            Ticket { lanes: self, ticket: t, queued: true }
        };
        loop {
            // Registered before looking, so no wake-up between the look and the wait is lost.
            let mut changed = std::pin::pin!(self.changed.notified());
            changed.as_mut().enable();
            {
                let mut s = self.state.lock().expect("lanes lock");
                if s.may_start(ticket.ticket, lane) {
                    s.queue.retain(|&(t, _)| t != ticket.ticket);
                    s.running = Some(lane);
                    s.count += 1;
                    ticket.queued = false;
                    drop(s);
                    // The next waiters of this lane may start beside it.
                    self.changed.notify_waiters();
                    return Ok(LanePass { lanes: self.clone() });
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(LaneTimeout);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Writer = 11;
    const B: Writer = 22;
    const LONG: Duration = Duration::from_secs(3600);
    /// Long enough for a runnable waiter to be admitted on a loaded machine.
    const SETTLE: Duration = Duration::from_millis(50);

    /// Whether `enter` finished within [`SETTLE`] (the handle is kept for later).
    async fn started(h: &mut tokio::task::JoinHandle<Result<LanePass, LaneTimeout>>) -> bool {
        tokio::time::timeout(SETTLE, &mut *h).await.is_ok()
    }

    #[tokio::test]
    async fn one_fingerprint_runs_side_by_side_another_waits() {
        let lanes = Arc::new(Lanes::default());
        let a1 = lanes.enter(A, LONG).await.unwrap();
        let a2 = lanes.enter(A, LONG).await.unwrap();
        let l = lanes.clone();
        let mut b = tokio::spawn(async move { l.enter(B, LONG).await });
        assert!(!started(&mut b).await, "another fingerprint never runs beside a running one");
        drop(a1);
        assert!(!started(&mut b).await, "not while one of them still runs");
        drop(a2);
        let pass = tokio::time::timeout(SETTLE * 20, b).await.expect("admitted").unwrap();
        assert!(pass.is_ok());
    }

    #[tokio::test]
    async fn a_waiting_fingerprint_is_not_starved_by_a_stream_of_the_running_one() {
        let lanes = Arc::new(Lanes::default());
        let a1 = lanes.enter(A, LONG).await.unwrap();
        let l = lanes.clone();
        let mut b = tokio::spawn(async move { l.enter(B, LONG).await });
        assert!(!started(&mut b).await);
        // A later call of the running fingerprint queues behind the waiting one.
        let l = lanes.clone();
        let mut a2 = tokio::spawn(async move { l.enter(A, LONG).await });
        assert!(!started(&mut a2).await, "a new call of the running lane overtook a waiting lane");
        drop(a1);
        let b_pass = tokio::time::timeout(SETTLE * 20, &mut b).await.expect("B admitted").unwrap().unwrap();
        assert!(!started(&mut a2).await, "A runs again only after B");
        drop(b_pass);
        assert!(tokio::time::timeout(SETTLE * 20, a2).await.expect("A admitted").unwrap().is_ok());
    }

    #[tokio::test]
    async fn consecutive_waiters_of_one_fingerprint_start_together() {
        let lanes = Arc::new(Lanes::default());
        let a = lanes.enter(A, LONG).await.unwrap();
        let (l1, l2) = (lanes.clone(), lanes.clone());
        let mut b1 = tokio::spawn(async move { l1.enter(B, LONG).await });
        let mut b2 = tokio::spawn(async move { l2.enter(B, LONG).await });
        assert!(!started(&mut b1).await && !started(&mut b2).await);
        drop(a);
        let p1 = tokio::time::timeout(SETTLE * 20, b1).await.unwrap().unwrap().unwrap();
        let p2 = tokio::time::timeout(SETTLE * 20, b2).await.unwrap().unwrap().unwrap();
        drop((p1, p2));
        assert!(lanes.enter(A, Duration::ZERO).await.is_ok(), "free again once both ended");
    }

    #[tokio::test]
    async fn a_waiter_gives_up_at_its_timeout_and_one_dropped_blocks_no_one() {
        let lanes = Arc::new(Lanes::default());
        let a = lanes.enter(A, LONG).await.unwrap();
        assert_eq!(lanes.enter(B, SETTLE).await.unwrap_err(), LaneTimeout);
        // A dropped waiter (its call was canceled) leaves the queue.
        let l = lanes.clone();
        let b = tokio::spawn(async move { l.enter(B, LONG).await });
        tokio::time::sleep(SETTLE).await;
        b.abort();
        let _ = b.await;
        assert!(lanes.enter(A, Duration::ZERO).await.is_ok(), "the running lane admits again: no one waits");
        drop(a);
        let s = lanes.state.lock().unwrap();
        assert!(s.queue.is_empty(), "{s:?}");
    }

    #[tokio::test]
    async fn no_secrets_is_a_lane_like_any_other() {
        let lanes = Arc::new(Lanes::default());
        let none = lanes.enter(NO_SECRETS, LONG).await.unwrap();
        assert!(lanes.enter(A, SETTLE).await.is_err(), "a call with secrets never runs beside one without");
        assert!(lanes.enter(NO_SECRETS, SETTLE).await.is_ok());
        drop(none);
        assert!(lanes.enter(A, SETTLE).await.is_ok());
    }
}
