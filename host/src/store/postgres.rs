//! The PostgreSQL backend: task records, events and plugin state in a database at
//! `store.url`, with the same behaviour as the embedded one (the store's test suite runs
//! against both).
//!
//! Why `tokio-postgres`: it is the plain asynchronous driver on the runtime warden already
//! runs, with no proc macros and nothing that needs a database at build time (sqlx's
//! checked queries do, and its `migrate!` pulls in its macro crate and a larger tree for
//! what is here a dozen statements). A `Client` pipelines concurrent queries over one
//! connection, so the store needs no pool: reads share one connection and the writer has
//! its own; either is re-opened when the server closed it. The migrations are the SQL
//! files in `host/migrations/`, embedded in the binary and applied at open by
//! [`migrate`] in one transaction under an advisory lock, recorded in
//! `warden_migrations`; a database migrated by a newer warden is refused.
//!
//! Writes: one writer task takes whatever is queued ([`super::take_batch`]), keeps the
//! last write of each key (writes of one batch commit together, so only the last one
//! is ever visible), and commits the batch as one transaction of at most four
//! statements (`UNNEST` arrays, keys in sorted order so concurrent writers lock rows
//! alike). A batch whose connection was lost is retried once on a new connection: every
//! statement is an upsert or a delete, so replaying it is harmless.
//!
//! The connection is plain TCP or a Unix socket (no TLS), for a database on the host or a
//! private network; `sslmode=require` fails at connect. Owns the database's tables; never
//! reached except through [`super::Store`], never logs a URL (the facade names it
//! redacted) or a stored value.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::{Client, NoTls};

use super::{Msg, TaskRecord, Write};

/// The schema's migrations, in order: (version, name, SQL). Append, never edit.
const MIGRATIONS: &[(i32, &str, &str)] = &[(1, "tasks", include_str!("../../migrations/0001_tasks.sql"))];

/// The advisory lock key under which migrations run, so two hosts opening one new
/// database at once do not both create the tables ("warden" in ASCII, then 1).
const MIGRATION_LOCK: i64 = 0x7761_7264_656e_0001;

/// How long a connection attempt may take when the URL sets no `connect_timeout`: a
/// database that does not answer fails `warden serve` at start instead of hanging it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The `application_name` warden's sessions show in `pg_stat_activity`, unless the URL
/// sets one.
const APPLICATION_NAME: &str = "warden";

/// Server-side cap on one statement (`statement_timeout`, unless the URL's `options` set
/// their own): a commit stuck behind a lock fails instead of holding every task's finish.
/// The store's statements are small upserts and indexed reads, done in milliseconds.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Client-side cap on one read or commit, past [`STATEMENT_TIMEOUT`]: covers a server or
/// network that stopped answering at all (the connection is dropped and reopened).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(40);

/// How long sent data may stay unacknowledged before the kernel drops the connection
/// (`tcp_user_timeout`, unless the URL sets it): a partitioned database is noticed in
/// seconds, not after TCP's ~15 minutes of retransmissions.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// Idle time before TCP keepalive probes start, unless the URL sets `keepalives_idle`
/// (the driver's default is 2 hours): an idle connection to a vanished server is found.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);

/// tokio-postgres' own default `keepalives_idle`, to tell whether the URL set one.
const DRIVER_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// The URL's configuration with warden's defaults where it says nothing: a connect
/// timeout, the application name, a statement timeout, a TCP user timeout and keepalives
/// (see the constants for why).
fn with_defaults(mut config: tokio_postgres::Config) -> tokio_postgres::Config {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name(APPLICATION_NAME);
    }
    if config.get_options().is_none() {
        config.options(format!("-c statement_timeout={}", STATEMENT_TIMEOUT.as_millis()));
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    if config.get_keepalives_idle() == DRIVER_KEEPALIVE_IDLE {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    config
}

/// The connected backend: the parsed configuration (to reconnect) and the read connection.
pub(super) struct PgBackend {
    config: Arc<tokio_postgres::Config>,
    location: Arc<str>,
    reader: Mutex<Option<Arc<Client>>>,
}

impl PgBackend {
    /// Connects, applies the migrations the database lacks and starts the writer.
    pub(super) async fn open(url: &str, rx: mpsc::UnboundedReceiver<Msg>, location: String) -> Result<Self, String> {
        let config: tokio_postgres::Config =
            url.parse().map_err(|e| format!("not a PostgreSQL URL: {}", message(&e)))?;
        let config = Arc::new(with_defaults(config));
        let location: Arc<str> = location.into();
        let mut writer_client = connect(&config, &location).await?;
        migrate(&mut writer_client).await.map_err(|e| format!("cannot apply the migrations: {e}"))?;
        let reader = connect(&config, &location).await?;
        tokio::spawn(writer(config.clone(), location.clone(), writer_client, rx));
        Ok(PgBackend { config, location, reader: Mutex::new(Some(Arc::new(reader))) })
    }

    /// The read connection, re-opened if the server closed it.
    async fn reader(&self) -> Result<Arc<Client>, String> {
        let open = self.reader.lock().unwrap().as_ref().filter(|c| !c.is_closed()).cloned();
        if let Some(c) = open {
            return Ok(c);
        }
        let c = Arc::new(connect(&self.config, &self.location).await?);
        *self.reader.lock().unwrap() = Some(c.clone());
        Ok(c)
    }

    /// Runs `query` on the read connection; once more on a new connection when the server
    /// closed it meanwhile (a restarted or failed-over database), as the writer does.
    async fn read<T, F, Fut>(&self, query: F) -> Result<T, String>
    where
        F: Fn(Arc<Client>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let c = self.reader().await?;
        let Ok(first) = tokio::time::timeout(OPERATION_TIMEOUT, query(c.clone())).await else {
            // No answer at all: drop the connection, so the next read opens a new one.
            self.reader.lock().unwrap().take();
            return Err(format!("PostgreSQL did not answer a read within {OPERATION_TIMEOUT:?}"));
        };
        match first {
            Err(e) if c.is_closed() => {
                tracing::warn!(store = %self.location, error = %message(&e), "PostgreSQL connection lost during a read; retrying");
                let retry = tokio::time::timeout(OPERATION_TIMEOUT, query(self.reader().await?)).await;
                retry.map_err(|_| format!("PostgreSQL did not answer a read within {OPERATION_TIMEOUT:?}"))?.map_err(pg)
            }
            other => other.map_err(pg),
        }
    }

    pub(super) async fn task(&self, id: &str) -> Result<Option<TaskRecord>, String> {
        let row = self
            .read(|c| async move { c.query_opt("SELECT record::text FROM tasks WHERE task_id = $1", &[&id]).await })
            .await?;
        match row {
            None => Ok(None),
            Some(row) => {
                let text: String = row.get(0);
                serde_json::from_str(&text).map(Some).map_err(|e| format!("corrupt task {id}: {e}"))
            }
        }
    }

    pub(super) async fn events_after(
        &self,
        task_id: &str,
        after: u64,
    ) -> Result<Vec<(u64, serde_json::Value)>, String> {
        // Sequence numbers are stored as bigint: none is above i64::MAX, so nothing follows it.
        let Ok(after) = i64::try_from(after) else { return Ok(vec![]) };
        let rows = self
            .read(|c| async move {
                c.query(
                    "SELECT seq, event::text FROM events WHERE task_id = $1 AND seq > $2 ORDER BY seq",
                    &[&task_id, &after],
                )
                .await
            })
            .await?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.get(0);
                let text: String = row.get(1);
                let ev = serde_json::from_str(&text).map_err(|e| format!("corrupt event: {e}"))?;
                Ok((seq as u64, ev))
            })
            .collect()
    }

    pub(super) async fn tasks(&self) -> Result<Vec<TaskRecord>, String> {
        let rows =
            self.read(|c| async move { c.query("SELECT record::text FROM tasks ORDER BY task_id", &[]).await }).await?;
        Ok(rows.iter().filter_map(|row| serde_json::from_str(row.get::<_, &str>(0)).ok()).collect())
    }

    pub(super) async fn event_count(&self) -> Result<u64, String> {
        let row = self.read(|c| async move { c.query_one("SELECT count(*) FROM events", &[]).await }).await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Deletes tasks finished before `cutoff` (ms) and their events, in one statement.
    pub(super) async fn purge_finished_before(&self, cutoff: u64) -> Result<usize, String> {
        let cutoff = i64::try_from(cutoff).unwrap_or(i64::MAX);
        let row = self
            .read(|c| async move {
                c.query_one(
                    "WITH old AS (DELETE FROM tasks WHERE finished_at_ms < $1 RETURNING task_id), \
                          gone AS (DELETE FROM events WHERE task_id IN (SELECT task_id FROM old)) \
                     SELECT count(*) FROM old",
                    &[&cutoff],
                )
                .await
            })
            .await?;
        Ok(row.get::<_, i64>(0) as usize)
    }

    pub(super) async fn state_get(&self, plugin: &str, key: &str) -> Result<Option<Vec<u8>>, String> {
        let row = self
            .read(|c| async move {
                c.query_opt(
                    "SELECT value FROM plugin_state WHERE plugin = $1 AND key = $2",
                    &[&plugin, &key.as_bytes()],
                )
                .await
            })
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    pub(super) async fn state_all(&self) -> Result<Vec<(String, String, Vec<u8>)>, String> {
        let rows =
            self.read(|c| async move {
                c.query("SELECT plugin, key, value FROM plugin_state ORDER BY plugin, key", &[]).await
            })
            .await?;
        rows.iter()
            .map(|row| {
                let key =
                    String::from_utf8(row.get(1)).map_err(|_| "corrupt plugin state key (not UTF-8)".to_owned())?;
                Ok((row.get(0), key, row.get(2)))
            })
            .collect()
    }
}

/// Opens one connection; its protocol half runs as a task until the client is dropped.
async fn connect(config: &tokio_postgres::Config, location: &Arc<str>) -> Result<Client, String> {
    let (client, connection) = config.connect(NoTls).await.map_err(|e| format!("cannot connect: {}", message(&e)))?;
    let location = location.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(store = %location, error = %message(&e), "PostgreSQL connection closed");
        }
    });
    Ok(client)
}

/// Applies the migrations the database lacks, in one transaction under [`MIGRATION_LOCK`].
async fn migrate(client: &mut Client) -> Result<(), String> {
    let tx = client.transaction().await.map_err(pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(pg)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS warden_migrations (\
             version integer PRIMARY KEY, \
             name text NOT NULL, \
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(pg)?;
    let applied: Vec<i32> =
        tx.query("SELECT version FROM warden_migrations", &[]).await.map_err(pg)?.iter().map(|r| r.get(0)).collect();
    let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    if let Some(newest) = applied.iter().max().filter(|v| **v > known) {
        return Err(format!(
            "the database is at schema version {newest}, newer than this warden knows ({known}); \
             run the warden that migrated it, or a newer one"
        ));
    }
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        tx.batch_execute(sql).await.map_err(|e| format!("migration {version} ({name}): {}", message(&e)))?;
        tx.execute("INSERT INTO warden_migrations (version, name) VALUES ($1, $2)", &[version, name])
            .await
            .map_err(pg)?;
    }
    tx.commit().await.map_err(pg)
}

/// The writer task: one transaction per batch; ends when the store is dropped.
async fn writer(
    config: Arc<tokio_postgres::Config>,
    location: Arc<str>,
    client: Client,
    mut rx: mpsc::UnboundedReceiver<Msg>,
) {
    let mut client = Some(client);
    while let Some(first) = rx.recv().await {
        let batch = super::take_batch(first, &mut rx);
        let latest = Latest::of(&batch);
        let result =
            if latest.is_empty() { Ok(()) } else { commit_retrying(&config, &location, &mut client, &latest).await };
        super::settle(batch, result, &location);
    }
}

/// Commits `latest`, on a new connection if there is none or the current one is closed;
/// retried once when the connection was lost during the commit.
async fn commit_retrying(
    config: &tokio_postgres::Config,
    location: &Arc<str>,
    client: &mut Option<Client>,
    latest: &Latest<'_>,
) -> Result<(), String> {
    for attempt in 0..2 {
        if client.as_ref().is_none_or(Client::is_closed) {
            *client = Some(connect(config, location).await?);
        }
        let c = client.as_mut().expect("connected above");
        let Ok(committed) = tokio::time::timeout(OPERATION_TIMEOUT, commit(c, latest)).await else {
            // No answer at all: the transaction's fate is the server's (it rolls back when
            // the dropped connection is noticed); the flushes waiting on it hear an error.
            *client = None;
            return Err(format!("PostgreSQL did not answer a commit within {OPERATION_TIMEOUT:?}"));
        };
        match committed {
            Ok(()) => return Ok(()),
            Err(e) if c.is_closed() && attempt == 0 => {
                tracing::warn!(store = %location, error = %message(&e), "PostgreSQL connection lost during a commit; retrying");
                *client = None;
            }
            Err(e) => return Err(message(&e)),
        }
    }
    Err("the connection was lost twice in a row".into())
}

/// The last write of each key in a batch, keys sorted.
#[derive(Default)]
struct Latest<'a> {
    tasks: BTreeMap<&'a str, &'a TaskRecord>,
    events: BTreeMap<(&'a str, u64), &'a serde_json::Value>,
    /// `None`: delete.
    state: BTreeMap<(&'a str, &'a str), Option<&'a [u8]>>,
}

impl<'a> Latest<'a> {
    fn of(batch: &'a [Msg]) -> Self {
        let mut l = Latest::default();
        for w in super::writes(batch) {
            match w {
                Write::Task(rec) => {
                    l.tasks.insert(rec.task_id.as_str(), rec);
                }
                Write::Event { task_id, seq, event } => {
                    l.events.insert((task_id.as_str(), *seq), event);
                }
                Write::StateSet { plugin, key, value } => {
                    l.state.insert((plugin.as_str(), key.as_str()), Some(value.as_slice()));
                }
                Write::StateDelete { plugin, key } => {
                    l.state.insert((plugin.as_str(), key.as_str()), None);
                }
            }
        }
        l
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty() && self.events.is_empty() && self.state.is_empty()
    }
}

/// PostgreSQL's `text` cannot hold NUL: the lookup columns copy a record's fields without
/// it (the record itself, JSON with NUL escaped, is what is read back).
fn column(s: &str) -> String {
    s.replace('\0', "")
}

/// Milliseconds as bigint (no time warden records is past i64::MAX ms).
fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

async fn commit(client: &mut Client, l: &Latest<'_>) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    if !l.tasks.is_empty() {
        let recs = l.tasks.values();
        let ids: Vec<&str> = l.tasks.keys().copied().collect();
        let principals: Vec<Option<String>> = recs.clone().map(|r| r.principal.as_deref().map(column)).collect();
        let users: Vec<String> = recs.clone().map(|r| column(&r.user_id)).collect();
        let sessions: Vec<String> = recs.clone().map(|r| column(&r.session_id)).collect();
        let statuses: Vec<&str> = recs.clone().map(|r| r.status.as_str()).collect();
        let created: Vec<i64> = recs.clone().map(|r| ms(r.created_at_ms)).collect();
        let updated: Vec<i64> = recs.clone().map(|r| ms(r.updated_at_ms)).collect();
        let finished: Vec<Option<i64>> = recs.clone().map(|r| r.finished_at_ms.map(ms)).collect();
        let records: Vec<String> =
            recs.map(|r| serde_json::to_string(r).expect("a task record always serialises")).collect();
        tx.execute(
            "INSERT INTO tasks (task_id, principal, user_id, session_id, status, created_at_ms, updated_at_ms, \
                                finished_at_ms, record) \
             SELECT t.task_id, t.principal, t.user_id, t.session_id, t.status, t.created_at_ms, t.updated_at_ms, \
                    t.finished_at_ms, t.record::json \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], \
                         $8::bigint[], $9::text[]) \
                  AS t(task_id, principal, user_id, session_id, status, created_at_ms, updated_at_ms, \
                       finished_at_ms, record) \
             ON CONFLICT (task_id) DO UPDATE SET principal = EXCLUDED.principal, user_id = EXCLUDED.user_id, \
                 session_id = EXCLUDED.session_id, status = EXCLUDED.status, \
                 created_at_ms = EXCLUDED.created_at_ms, updated_at_ms = EXCLUDED.updated_at_ms, \
                 finished_at_ms = EXCLUDED.finished_at_ms, record = EXCLUDED.record",
            &[&ids, &principals, &users, &sessions, &statuses, &created, &updated, &finished, &records],
        )
        .await?;
    }
    if !l.events.is_empty() {
        let ids: Vec<&str> = l.events.keys().map(|k| k.0).collect();
        let seqs: Vec<i64> = l.events.keys().map(|k| ms(k.1)).collect();
        let events: Vec<String> =
            l.events.values().map(|e| serde_json::to_string(e).expect("JSON always serialises")).collect();
        tx.execute(
            "INSERT INTO events (task_id, seq, event) \
             SELECT e.task_id, e.seq, e.event::json FROM UNNEST($1::text[], $2::bigint[], $3::text[]) AS e(task_id, seq, event) \
             ON CONFLICT (task_id, seq) DO UPDATE SET event = EXCLUDED.event",
            &[&ids, &seqs, &events],
        )
        .await?;
    }
    let (sets, deletes): (Vec<_>, Vec<_>) = l.state.iter().partition(|(_, v)| v.is_some());
    if !sets.is_empty() {
        let plugins: Vec<&str> = sets.iter().map(|((p, _), _)| *p).collect();
        let keys: Vec<&[u8]> = sets.iter().map(|((_, k), _)| k.as_bytes()).collect();
        let values: Vec<&[u8]> = sets.iter().map(|(_, v)| v.unwrap_or_default()).collect();
        tx.execute(
            "INSERT INTO plugin_state (plugin, key, value) \
             SELECT * FROM UNNEST($1::text[], $2::bytea[], $3::bytea[]) \
             ON CONFLICT (plugin, key) DO UPDATE SET value = EXCLUDED.value",
            &[&plugins, &keys, &values],
        )
        .await?;
    }
    if !deletes.is_empty() {
        let plugins: Vec<&str> = deletes.iter().map(|((p, _), _)| *p).collect();
        let keys: Vec<&[u8]> = deletes.iter().map(|((_, k), _)| k.as_bytes()).collect();
        tx.execute(
            "DELETE FROM plugin_state WHERE (plugin, key) IN (SELECT * FROM UNNEST($1::text[], $2::bytea[]))",
            &[&plugins, &keys],
        )
        .await?;
    }
    tx.commit().await
}

/// A driver error as a message: the server's own text and code for a database error
/// (tokio-postgres's `Display` says only "db error"), else the error and its causes.
fn message(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut m = format!("{} ({})", db.message(), db.code().code());
        if let Some(detail) = db.detail() {
            m.push_str(&format!(": {detail}"));
        }
        return m;
    }
    let mut m = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let s_text = s.to_string();
        if !m.contains(&s_text) {
            m.push_str(&format!(": {s_text}"));
        }
        source = s.source();
    }
    m
}

fn pg(e: tokio_postgres::Error) -> String {
    message(&e)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_url_gets_timeouts_unless_it_sets_its_own() {
        let c = with_defaults("postgres://u@h/d".parse().unwrap());
        assert_eq!(c.get_options(), Some("-c statement_timeout=30000"));
        assert_eq!(c.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert_eq!(c.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(c.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(c.get_application_name(), Some(APPLICATION_NAME));
        let own =
            "postgres://u@h/d?options=-c%20work_mem%3D4MB&tcp_user_timeout=5&keepalives_idle=9&application_name=x";
        let c = with_defaults(own.parse().unwrap());
        assert_eq!(c.get_options(), Some("-c work_mem=4MB"));
        assert_eq!(c.get_tcp_user_timeout(), Some(&Duration::from_secs(5)));
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(9));
        assert_eq!(c.get_application_name(), Some("x"));
    }
}
