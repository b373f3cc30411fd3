//! A task's event stream as Server-Sent Events: every stored event after the client's
//! `Last-Event-ID` (replay), then live events as they happen, each exactly once with its
//! sequence number as the SSE `id`; `heartbeat` events while idle; the stream ends
//! after the task's `finish` event.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, Sse};
use futures_util::Stream;

use crate::engine::Engine;

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
    let events = super::follow::follow(engine, task_id, session, after);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat_every, heartbeat_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stream = futures_util::stream::unfold((events, ticker), |(mut events, mut ticker)| async move {
        let frame = tokio::select! {
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
    });
    Sse::new(stream)
}
