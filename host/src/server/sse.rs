//! A task's event stream as Server-Sent Events: every stored event after the client's
//! `Last-Event-ID` (replay), then live events as they happen, each exactly once with its
//! sequence number as the SSE `id`; `heartbeat` events while idle; the stream ends
//! after the task's `finish` event, or when the server shuts down (an open stream would
//! hold its graceful shutdown open). Also the live task list: every change of a task
//! record the caller may see.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, Sse};
use futures_util::Stream;

use tokio_util::sync::CancellationToken;

use crate::engine::Engine;

fn heartbeat() -> Event {
    Event::default().data(r#"{"type":"heartbeat"}"#)
}

/// The stream of `task_id`'s events with sequence numbers above `after`, as a reader with
/// `authority` is offered them ([`super::follow::follow`]); `session` is the task's (user
/// id, session id); heartbeats every `server.heartbeat`; it ends when the server shuts
/// down. It holds `permit` while open.
pub fn task_events(
    permit: super::streams::StreamPermit,
    server: &super::ServerState,
    task_id: String,
    session: (String, String),
    after: u64,
    authority: warden_approval::Authority,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
    let (heartbeat_every, shutdown) = (server.heartbeat, server.shutdown.clone());
    let events = super::follow::follow(permit, server.engine.clone(), task_id, session, after, authority);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat_every, heartbeat_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stream = futures_util::stream::unfold((events, ticker), move |(mut events, mut ticker)| {
        let shutdown = shutdown.clone();
        async move {
            let frame = tokio::select! {
                _ = shutdown.cancelled() => return None,
                ev = events.recv() => match ev {
                    Some((seq, ev)) => {
                        ticker.reset();
                        Event::default().id(seq.to_string()).data(ev.to_string())
                    }
                    None => return None,
                },
                _ = ticker.tick() => heartbeat(),
            };
            Some((Ok(frame), (events, ticker)))
        }
    });
    Sse::new(stream)
}

/// The live task list as Server-Sent Events: `{"type":"task","task":{…}}` for every
/// change of a task record `visible` accepts (submitted, status, plugin build,
/// finished), `{"type":"resync"}` when this follower fell behind and should read
/// `GET /v1/tasks` again, `heartbeat` events while idle. Never ends on its own; holds
/// `permit` while open.
pub fn task_changes<V: Fn(&crate::store::TaskRecord) -> bool + Send + 'static>(
    permit: super::streams::StreamPermit,
    engine: &Engine,
    visible: V,
    heartbeat_every: Duration,
    shutdown: CancellationToken,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<V>> {
    use tokio::sync::broadcast::error::RecvError;
    let changes = engine.task_changes();
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat_every, heartbeat_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = (changes, ticker, visible, shutdown, permit);
    let stream = futures_util::stream::unfold(
        state,
        |(mut changes, mut ticker, visible, shutdown, permit)| async move {
            let frame = loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    change = changes.recv() => match change {
                        Ok(rec) if visible(&rec) => {
                            ticker.reset();
                            let task = super::task_json(&rec);
                            break Event::default().data(serde_json::json!({ "type": "task", "task": task }).to_string());
                        }
                        Ok(_) => continue,
                        Err(RecvError::Lagged(_)) => break Event::default().data(r#"{"type":"resync"}"#),
                        Err(RecvError::Closed) => return None,
                    },
                    _ = ticker.tick() => break heartbeat(),
                }
            };
            Some((Ok(frame), (changes, ticker, visible, shutdown, permit)))
        },
    );
    Sse::new(stream)
}
