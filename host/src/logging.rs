//! The operator's log: every record is scrubbed, with the secrets of whose it is.
//!
//! A record belongs to a session when it, or a span it is logged in, names one — the fields
//! `user` (or `user_id`) and `session` (or `session_id`), as the sandbox's and the egress
//! proxy's lines do and as every task's span does ([`task_span`], which the engine enters
//! around everything a task runs). [`OwnerLayer`] finds that owner as each event arrives,
//! just before the formatting layer writes it, and the writer of [`ScrubbingMakeWriter`]
//! scrubs the formatted record with [`SecretRegistry::operator`] of that owner: the host's
//! secrets and the session's values fit to rewrite operator text. A record of no session is
//! scrubbed with [`SecretRegistry::operator_union`] (the host's secrets and every session's
//! fit values), since any tenant's secret could be in it. So a tenant's `tool_context`
//! value never rewrites a line about another tenant's session, and words (`task_`, `Bash`,
//! a user name) never rewrite any line (see `crate::redact`). A plugin's own lines reach
//! this writer already scrubbed of every value of their task's session (the `log` import).
//!
//! [`init`] builds the one subscriber: the CLI and the tests use it, so what is tested is
//! what runs.
//!
//! This module must never scrub a record of a known session with another session's
//! secrets, never keep an owner past the record it was found for, and never write a record
//! but whole.

use std::cell::RefCell;
use std::io::Write;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::redact::{SecretRegistry, registry};

/// The session a record belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    user: String,
    session: String,
}

thread_local! {
    /// The owner of the event being written on this thread: set by [`OwnerLayer`] as the
    /// event arrives, taken by the writer made for it.
    static OWNER: RefCell<Option<Owner>> = const { RefCell::new(None) };
}

/// The span every task runs in (the engine enters it around its driver): its fields make
/// each record logged while the task runs its session's.
pub fn task_span(user_id: &str, session_id: &str, task_id: &str) -> tracing::Span {
    // At `error` level so that it exists whatever `WARDEN_LOG` lets through: a filter that
    // dropped the span would leave the task's records without their owner.
    tracing::error_span!("task", user = %user_id, session = %session_id, task_id = %task_id)
}

/// The `user` and `session` fields of a span or an event.
#[derive(Default)]
struct OwnerFields {
    user: Option<String>,
    session: Option<String>,
}

impl OwnerFields {
    fn set(&mut self, field: &Field, value: String) {
        if value.is_empty() {
            return;
        }
        match field.name() {
            "user" | "user_id" => self.user = Some(value),
            "session" | "session_id" => self.session = Some(value),
            _ => {}
        }
    }

    fn owner(self) -> Option<Owner> {
        Some(Owner { user: self.user?, session: self.session? })
    }
}

impl Visit for OwnerFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if matches!(field.name(), "user" | "user_id" | "session" | "session_id") {
            // `%x` fields arrive here and print as their `Display` form.
            self.set(field, format!("{value:?}"));
        }
    }
}

/// Finds each event's owner (see the module documentation) for the writer.
#[derive(Debug, Default, Clone, Copy)]
pub struct OwnerLayer;

impl<S> Layer<S> for OwnerLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = OwnerFields::default();
        attrs.record(&mut fields);
        if let (Some(owner), Some(span)) = (fields.owner(), ctx.span(id)) {
            span.extensions_mut().insert(owner);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut fields = OwnerFields::default();
        values.record(&mut fields);
        if let (Some(owner), Some(span)) = (fields.owner(), ctx.span(id)) {
            let mut ext = span.extensions_mut();
            ext.remove::<Owner>();
            ext.insert(owner);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = OwnerFields::default();
        event.record(&mut fields);
        let owner = fields
            .owner()
            .or_else(|| ctx.event_scope(event)?.find_map(|span| span.extensions().get::<Owner>().cloned()));
        OWNER.with(|o| *o.borrow_mut() = owner);
    }
}

/// A `tracing_subscriber` writer factory whose writers scrub each record before it reaches
/// `inner`, with the secrets of the record's owner ([`OwnerLayer`]).
#[derive(Clone)]
pub struct ScrubbingMakeWriter<M> {
    inner: M,
    secrets: &'static SecretRegistry,
}

impl<M> ScrubbingMakeWriter<M> {
    /// Writers scrubbing with the process's secrets ([`registry`]).
    pub fn new(inner: M) -> Self {
        Self::with_registry(inner, registry())
    }

    /// Writers scrubbing with `secrets` (tests).
    pub fn with_registry(inner: M, secrets: &'static SecretRegistry) -> Self {
        ScrubbingMakeWriter { inner, secrets }
    }
}

impl<M> std::fmt::Debug for ScrubbingMakeWriter<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrubbingMakeWriter").finish_non_exhaustive()
    }
}

impl<'a, M> tracing_subscriber::fmt::MakeWriter<'a> for ScrubbingMakeWriter<M>
where
    M: tracing_subscriber::fmt::MakeWriter<'a>,
{
    type Writer = ScrubbingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        // The formatting layer makes the writer once the record is formatted, on the
        // thread of its event, after `OwnerLayer` saw that event.
        let owner = OWNER.with(|o| o.borrow_mut().take());
        ScrubbingWriter { inner: self.inner.make_writer(), buf: Vec::new(), owner, secrets: self.secrets }
    }
}

/// Collects one log record and writes it scrubbed when dropped.
pub struct ScrubbingWriter<W: Write> {
    inner: W,
    buf: Vec<u8>,
    owner: Option<Owner>,
    secrets: &'static SecretRegistry,
}

impl<W: Write> Write for ScrubbingWriter<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<W: Write> Drop for ScrubbingWriter<W> {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let out = match &self.owner {
            Some(o) => self.secrets.operator(Some(&o.user), Some(&o.session)).scrub_bytes(&self.buf).into_owned(),
            None => self.secrets.operator_union().scrub_bytes(&self.buf).into_owned(),
        };
        let _ = self.inner.write_all(&out);
        let _ = self.inner.flush();
    }
}

/// Installs the process's log subscriber: `filter`, [`OwnerLayer`], and the formatter
/// writing each record scrubbed to `writer`. `false` if one was installed already.
pub fn init<M>(filter: tracing_subscriber::EnvFilter, writer: M) -> bool
where
    M: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::registry()
        .with(filter)
        .with(OwnerLayer)
        .with(tracing_subscriber::fmt::layer().with_writer(ScrubbingMakeWriter::new(writer)))
        .try_init()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use proptest::prelude::*;

    use super::*;
    use crate::redact::REDACTED;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Runs `log` under the subscriber [`init`] installs (on this thread only), scrubbing
    /// with `secrets`; returns what was written.
    fn logged(secrets: &'static SecretRegistry, log: impl FnOnce()) -> String {
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::registry().with(OwnerLayer).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(ScrubbingMakeWriter::with_registry(move || sink.clone(), secrets)),
        );
        tracing::subscriber::with_default(subscriber, log);
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    fn leaked() -> &'static SecretRegistry {
        Box::leak(Box::new(SecretRegistry::default()))
    }

    /// Regression (attack review F7): the log writer scrubbed every line with the union
    /// of every tenant's values, so mallory's `tool_context` values `task_`, `session`,
    /// `Bash` and `alice` blanked those words out of every line of the host, alice's
    /// included, and a key-like value of mallory's rewrote alice's lines too. Now a line
    /// is rewritten only by its own session's values that could be secrets.
    #[test]
    fn regression_a_tenants_values_rewrote_every_host_log_line() {
        let reg = leaked();
        reg.remember("mallory", "m1", &["task_", "session", "Bash", "alice", "shared-9f3e-token"]).unwrap();
        reg.remember("alice", "s1", &["alice-key-1234"]).unwrap();
        let out = logged(reg, || {
            let span = task_span("alice", "s1", "task_9b1c");
            let _in = span.enter();
            tracing::info!(tool = "Bash", "alice's call with shared-9f3e-token and alice-key-1234");
        });
        assert!(out.contains("task{user=alice session=s1 task_id=task_9b1c}"), "{out}");
        assert!(out.contains("tool=\"Bash\""), "{out}");
        assert!(out.contains("shared-9f3e-token"), "mallory's value is not alice's secret: {out}");
        assert!(!out.contains("alice-key-1234") && out.contains(REDACTED), "alice's own secret is scrubbed: {out}");
    }

    #[test]
    fn an_events_own_fields_name_its_owner_and_a_line_of_no_session_gets_every_fit_value() {
        let reg = leaked();
        reg.remember("bob", "b1", &["bob-key-5678"]).unwrap();
        reg.remember("carol", "c1", &["carol-key-9012"]).unwrap();
        let out = logged(reg, || {
            tracing::warn!(user = "bob", session = "b1", "bob's line: bob-key-5678 carol-key-9012");
            tracing::warn!("a line of no session: bob-key-5678 carol-key-9012");
            // An event's own owner wins over the span it is logged in.
            let span = task_span("carol", "c1", "task_1");
            let _in = span.enter();
            tracing::warn!(user = "bob", session = "b1", "in carol's span: bob-key-5678 carol-key-9012");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].contains("[redacted] carol-key-9012"), "{}", lines[0]);
        assert!(lines[1].contains("[redacted] [redacted]"), "{}", lines[1]);
        assert!(lines[2].contains("[redacted] carol-key-9012"), "{}", lines[2]);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever values any tenant registered, a line logged in a task's span that holds
        /// none of its own session's values comes out as it went in.
        #[test]
        fn a_line_without_its_owners_secrets_is_written_unchanged(
            others in prop::collection::vec(("[a-c]{1,2}", "[a-c]{1,2}", "[A-Za-z0-9_. :=-]{4,16}"), 0..8),
            message in "[A-Za-z0-9_. :=-]{0,60}",
            quote in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        ) {
            let reg = leaked();
            for (user, session, value) in &others {
                prop_assume!(!REDACTED.contains(value.as_str()));
                reg.remember(user, session, &[value.as_str()]).unwrap();
            }
            let mut message = message;
            for i in &quote {
                if !others.is_empty() {
                    message.push_str(&others[i.index(others.len())].2);
                }
            }
            let plain = logged(leaked(), || {
                let span = task_span("owner", "sess", "task_1");
                let _in = span.enter();
                tracing::info!("{message}");
            });
            let scrubbed = logged(reg, || {
                let span = task_span("owner", "sess", "task_1");
                let _in = span.enter();
                tracing::info!("{message}");
            });
            // Timestamps differ: compare what follows them.
            let tail = |s: &str| s.split_once("INFO").map(|(_, t)| t.to_owned()).unwrap_or_default();
            prop_assert_eq!(tail(&scrubbed), tail(&plain));
        }
    }
}
