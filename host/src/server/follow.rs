//! Following one task's events as they happen: every stored event after a sequence
//! number (replay), then live events, each exactly once, scrubbed with the task's
//! session secrets as they are at the moment of sending. The channel closes after the
//! task's last event. A task running on another replica is read from the store, every
//! [`crate::engine::REMOTE_POLL`]. The SSE stream, MCP progress and A2A streaming all read
//! a task through this one follower; it never changes a task. Each follower reads for one
//! reader: an `approval_request` event offers the `scopes` that reader's authority may
//! choose ([`warden_approval::Authority::choosable`]: `always` to an admin only), not every
//! scope the gate offered.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;
use warden_approval::{Authority, Scope};

use crate::engine::Engine;

/// Events buffered per follower before the producer waits for its reader.
const FOLLOWER_BUFFER: usize = 64;

/// Events a follower reads at once (from memory or the store). A follower holds at most
/// this page and its buffer, whatever the length of the log (up to the task's event
/// budget, 100,000 events / 32 MiB by default).
///
/// Regression: a replay read the whole log at once and held it while its reader did not
/// read: fifty stalled `GET /v1/tasks/{id}/events` of one long task held gigabytes.
pub const REPLAY_PAGE: usize = 64;

/// Store reads in a row that may fail while following a task on another replica before the
/// stream ends (about 5 s of a database that does not answer, at one read per
/// [`crate::engine::REMOTE_POLL`]).
const MAX_READ_FAILURES: u32 = 25;

/// One event of a task: its sequence number (1-based) and the scrubbed event.
pub type Followed = (u64, Value);

/// The events of `task_id` with sequence numbers above `after`, as a reader with
/// `authority` is offered them; `session` is the task's (user id, session id). The receiver
/// yields `None` once the finished task's last event was sent (or the task is unknown), and
/// the producer stops when it is dropped. The follower holds `permit` (its reader's
/// admission, [`super::streams::Streams::admit`]) until it stops.
pub fn follow(
    permit: super::streams::StreamPermit,
    engine: Arc<Engine>,
    task_id: String,
    session: (String, String),
    after: u64,
    authority: Authority,
) -> mpsc::Receiver<Followed> {
    let (tx, rx) = mpsc::channel::<Followed>(FOLLOWER_BUFFER);
    tokio::spawn(async move {
        let _permit = permit;
        let scrubbed = |ev: &Value| {
            let mut ev = crate::redact::registry().session(&session.0, &session.1).scrubbed(ev);
            offer_to(authority, &mut ev);
            ev
        };
        let mut next = after;
        if let Some(live) = engine.live(&task_id) {
            let mut changed = live.watch();
            loop {
                changed.borrow_and_update();
                let finished = live.record().is_finished();
                loop {
                    let page = live.events_page(next, REPLAY_PAGE);
                    let more = page.len() == REPLAY_PAGE;
                    for (seq, ev) in page {
                        if tx.send((seq, scrubbed(&ev))).await.is_err() {
                            return; // reader gone
                        }
                        next = seq;
                    }
                    if !more {
                        break;
                    }
                }
                if finished {
                    return;
                }
                tokio::select! {
                    r = changed.changed() => if r.is_err() { break },
                    _ = tx.closed() => return,
                }
            }
        }
        // Finished, or running on another replica: from the store, re-read every
        // REMOTE_POLL until the task's `finish` event.
        let mut failures = 0;
        loop {
            let events = match engine.store().events_page(&task_id, next, REPLAY_PAGE).await {
                Ok(events) => {
                    failures = 0;
                    events
                }
                // A task running elsewhere: a passing database error does not end its stream.
                Err(e) if engine.replica_id().is_some() && failures < MAX_READ_FAILURES => {
                    failures += 1;
                    tracing::warn!(task_id = %task_id, error = %e, "event read failed; retrying");
                    tokio::time::sleep(crate::engine::REMOTE_POLL).await;
                    continue;
                }
                Err(e) => return tracing::error!(task_id = %task_id, error = %e, "event replay failed"),
            };
            let more = events.len() == REPLAY_PAGE;
            let mut finished = false;
            for (seq, ev) in events {
                finished |= ev["type"] == "finish";
                if tx.send((seq, scrubbed(&ev))).await.is_err() {
                    return;
                }
                next = seq;
            }
            if more && !finished {
                continue; // the next page at once
            }
            if finished || engine.replica_id().is_none() {
                return;
            }
            match engine.store().task(&task_id).await {
                Ok(Some(rec)) if !rec.is_finished() => {}
                // Finished meanwhile: its last events, page by page.
                Ok(Some(_)) => loop {
                    let Ok(events) = engine.store().events_page(&task_id, next, REPLAY_PAGE).await else { return };
                    let more = events.len() == REPLAY_PAGE;
                    for (seq, ev) in events {
                        if tx.send((seq, scrubbed(&ev))).await.is_err() {
                            return;
                        }
                        next = seq;
                    }
                    if !more {
                        return;
                    }
                },
                _ => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(crate::engine::REMOTE_POLL) => {}
                _ = tx.closed() => return,
            }
        }
    });
    rx
}

/// `ev` as a reader with `authority` is offered it: an `approval_request`'s `scopes` cut to
/// those [`Authority::choosable`] (a list that does not read as scopes offers `once`);
/// every other event unchanged.
fn offer_to(authority: Authority, ev: &mut Value) {
    if ev["type"] != "approval_request" {
        return;
    }
    let offered: Vec<Scope> = serde_json::from_value(ev["scopes"].take()).unwrap_or_default();
    ev["scopes"] = serde_json::to_value(authority.choosable(&offered)).unwrap_or(Value::Null);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_approval_request_offers_always_to_an_admin_only() {
        let ev = json!({ "type": "approval_request", "id": "apr_1", "scopes": ["once", "session", "always"] });
        let mut user = ev.clone();
        offer_to(Authority::User, &mut user);
        assert_eq!(user["scopes"], json!(["once", "session"]));
        assert_eq!(user["id"], "apr_1");
        let mut admin = ev.clone();
        offer_to(Authority::Admin, &mut admin);
        assert_eq!(admin, ev);
        let mut odd = json!({ "type": "approval_request", "scopes": "always" });
        offer_to(Authority::User, &mut odd);
        assert_eq!(odd["scopes"], json!(["once"]));
        let mut other = json!({ "type": "tool_call", "scopes": ["always"] });
        offer_to(Authority::User, &mut other);
        assert_eq!(other["scopes"], json!(["always"]), "only approval requests are read");
    }
}
