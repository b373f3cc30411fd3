//! A task's event stream as Server-Sent Events: every stored event after the client's
//! `Last-Event-ID` (replay), then live events as they happen, each exactly once with its
//! sequence number as the SSE `id`; `heartbeat` events while idle; the stream ends
//! after the task's `finish` event.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, Sse};
use futures_util::Stream;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::engine::Engine;

/// Events buffered per client before the producer waits for it.
const CLIENT_BUFFER: usize = 64;

/// One SSE frame, scrubbed with the session's secrets as they are now (a secret given
/// to a later task of the session is scrubbed from an older task's replay too).
fn event(seq: u64, ev: &Value, session: &(String, String)) -> Event {
    let ev = crate::redact::registry().session(&session.0, &session.1).scrubbed(ev);
    Event::default().id(seq.to_string()).data(ev.to_string())
}

fn heartbeat() -> Event {
    Event::default().data(r#"{"type":"heartbeat"}"#)
}

/// The stream of `task_id`'s events with sequence numbers above `after`; `session` is
/// the task's (user id, session id).
pub fn task_events(
    engine: Arc<Engine>,
    task_id: String,
    session: (String, String),
    after: u64,
    heartbeat_every: Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = mpsc::channel::<Event>(CLIENT_BUFFER);
    tokio::spawn(async move {
        let mut next = after;
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat_every, heartbeat_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if let Some(live) = engine.live(&task_id) {
            let mut changed = live.watch();
            loop {
                changed.borrow_and_update();
                let finished = live.record().is_finished();
                for (seq, ev) in live.events_after(next) {
                    if tx.send(event(seq, &ev, &session)).await.is_err() {
                        return; // client gone
                    }
                    next = seq;
                }
                if finished {
                    return;
                }
                tokio::select! {
                    r = changed.changed() => if r.is_err() { return },
                    _ = ticker.tick() => if tx.send(heartbeat()).await.is_err() { return },
                }
            }
        }
        // Finished (or never ran here): everything is in the store.
        match engine.store().events_after(&task_id, next) {
            Ok(events) => {
                for (seq, ev) in events {
                    if tx.send(event(seq, &ev, &session)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => tracing::error!(task_id = %task_id, error = %e, "event replay failed"),
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) });
    Sse::new(stream)
}
