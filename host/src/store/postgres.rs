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

/// Most egress holds of one session read from the board (one per call running in it on
/// another replica; calls per session are bounded far below): more refuse the connection.
const MAX_EGRESS_HOLDS_READ: usize = 1000;

/// The schema's migrations, in order: (version, name, SQL). Append, never edit.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "tasks", include_str!("../../migrations/0001_tasks.sql")),
    (2, "replicas", include_str!("../../migrations/0002_replicas.sql")),
    (3, "task_listing", include_str!("../../migrations/0003_task_listing.sql")),
    (4, "state_expiry", include_str!("../../migrations/0004_state_expiry.sql")),
    (5, "journal", include_str!("../../migrations/0005_journal.sql")),
    (6, "egress_holds", include_str!("../../migrations/0006_egress_holds.sql")),
];

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
    /// The connection of the transactions ([`PgBackend::enqueue`],
    /// [`PgBackend::state_put`]): a transaction needs a connection of its own; the read
    /// connection is shared by concurrent queries.
    enqueuer: tokio::sync::Mutex<Option<Client>>,
}

/// The advisory lock key under which a task is added to the shared queue, so that the
/// cluster-wide `server.max_queued_tasks` holds exactly ("warden" in ASCII, then 2).
const QUEUE_LOCK: i64 = 0x7761_7264_656e_0002;

/// The first key of the two-key advisory lock under which a state namespace is counted
/// and written ([`PgBackend::state_put`]; the second key is `hashtext(namespace)`): "wa" "rd"
/// in ASCII. Two-key locks never conflict with the one-key locks above.
const STATE_LOCK: i32 = 0x7761_7264;

/// Bytes (keys + values) state namespace `$1` holds, and of those the entry `$2`'s.
const STATE_USAGE: &str = "SELECT COALESCE(SUM(octet_length(key) + octet_length(value)), 0)::bigint, \
     COALESCE(SUM(octet_length(key) + octet_length(value)) FILTER (WHERE key = $2), 0)::bigint \
     FROM plugin_state WHERE plugin = $1";

/// The fair-share order of the shared queue (the engine's `schedule` rule across replicas),
/// as the common tables `held` (each user's tasks held by any replica, nested subagents not
/// counted) and `ranked` (the waiting tasks): a task's `rank` is the number of its user's
/// tasks queued before it, its `level` that plus what its user holds. Tasks are claimed by
/// level, then age: the oldest task of the user holding the fewest first, first come first
/// served within a user.
const FAIR_ORDER: &str = "WITH held AS ( \
       SELECT t.user_id, q.owner, count(*) AS n FROM task_queue q JOIN tasks t ON t.task_id = q.task_id \
       WHERE q.owner IS NOT NULL AND (t.record->>'parent_task_id') IS NULL GROUP BY t.user_id, q.owner), \
     ranked AS ( \
       SELECT q.task_id, q.queued_at_ms, t.user_id, \
              row_number() OVER (PARTITION BY t.user_id ORDER BY q.queued_at_ms, q.task_id) - 1 AS rank, \
              coalesce((SELECT sum(h.n) FROM held h WHERE h.user_id = t.user_id), 0)::bigint \
                + row_number() OVER (PARTITION BY t.user_id ORDER BY q.queued_at_ms, q.task_id) - 1 AS level \
       FROM task_queue q JOIN tasks t ON t.task_id = q.task_id \
       WHERE q.owner IS NULL)";

/// A task a replica took from the queue: its record and its stored submission.
pub(super) type ClaimedRow = (String, Option<String>, Option<String>);

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
        Ok(PgBackend {
            config,
            location,
            reader: Mutex::new(Some(Arc::new(reader))),
            enqueuer: tokio::sync::Mutex::new(None),
        })
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

    /// Every entry of `task_id`'s journal, in order.
    pub(super) async fn journal(&self, task_id: &str) -> Result<Vec<(u64, serde_json::Value)>, String> {
        let rows = self
            .read(|c| async move {
                c.query("SELECT seq, entry::text FROM journal WHERE task_id = $1 ORDER BY seq", &[&task_id]).await
            })
            .await?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.get(0);
                let text: String = row.get(1);
                let entry = serde_json::from_str(&text).map_err(|e| format!("corrupt journal entry: {e}"))?;
                Ok((seq as u64, entry))
            })
            .collect()
    }

    pub(super) async fn events_after(
        &self,
        task_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, serde_json::Value)>, String> {
        // Sequence numbers are stored as bigint: none is above i64::MAX, so nothing follows it.
        let Ok(after) = i64::try_from(after) else { return Ok(vec![]) };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .read(|c| async move {
                c.query(
                    "SELECT seq, event::text FROM events WHERE task_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    &[&task_id, &after, &limit],
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

    /// Up to `limit` tasks before `before`, newest first (of `user` alone, or everyone's),
    /// through the indexes of migration 0003.
    pub(super) async fn list_tasks(
        &self,
        user: Option<&str>,
        before: &super::TaskCursor,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, String> {
        const KEYSET: &str = "(created_at_ms, task_id COLLATE \"C\") < ($1, $2 COLLATE \"C\")";
        const ORDER: &str = "ORDER BY created_at_ms DESC, task_id COLLATE \"C\" DESC LIMIT $3";
        let created = i64::try_from(before.created_at_ms).unwrap_or(i64::MAX);
        let id = before.task_id.as_str();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match user {
            Some(user) => {
                let sql = format!("SELECT record::text FROM tasks WHERE user_id = $4 AND {KEYSET} {ORDER}");
                self.read(|c| {
                    let sql = sql.clone();
                    async move { c.query(&sql, &[&created, &id, &limit, &user]).await }
                })
                .await?
            }
            None => {
                let sql = format!("SELECT record::text FROM tasks WHERE {KEYSET} {ORDER}");
                self.read(|c| {
                    let sql = sql.clone();
                    async move { c.query(&sql, &[&created, &id, &limit]).await }
                })
                .await?
            }
        };
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
                          gone AS (DELETE FROM events WHERE task_id IN (SELECT task_id FROM old)), \
                          journal AS (DELETE FROM journal WHERE task_id IN (SELECT task_id FROM old)) \
                     SELECT count(*) FROM old",
                    &[&cutoff],
                )
                .await
            })
            .await?;
        Ok(row.get::<_, i64>(0) as usize)
    }

    pub(super) async fn state_get(&self, namespace: &str, key: &str) -> Result<Option<Vec<u8>>, String> {
        let row = self
            .read(|c| async move {
                c.query_opt(
                    "SELECT value FROM plugin_state WHERE plugin = $1 AND key = $2",
                    &[&namespace, &key.as_bytes()],
                )
                .await
            })
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// See [`super::Store::state_put`]: one transaction under [`STATE_LOCK`] for the namespace.
    pub(super) async fn state_put(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        written_at_ms: u64,
        max_namespace_bytes: u64,
    ) -> Result<super::StatePut, String> {
        let mut guard = self.transaction_connection().await?;
        let client = guard.as_mut().expect("connected by transaction_connection");
        let work = async {
            let tx = client.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", &[&STATE_LOCK, &namespace]).await?;
            let row = tx.query_one(STATE_USAGE, &[&namespace, &key.as_bytes()]).await?;
            let (held, old) = (row.get::<_, i64>(0).max(0) as u64, row.get::<_, i64>(1).max(0) as u64);
            let total = held.saturating_sub(old) + (key.len() + value.len()) as u64;
            if total > max_namespace_bytes {
                return Ok(super::StatePut::OverLimit { total });
            }
            tx.execute(
                "INSERT INTO plugin_state (plugin, key, value, written_at_ms) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (plugin, key) DO UPDATE SET value = EXCLUDED.value, written_at_ms = EXCLUDED.written_at_ms",
                &[&namespace, &key.as_bytes(), &value, &ms(written_at_ms)],
            )
            .await?;
            tx.commit().await?;
            Ok(super::StatePut::Stored { total })
        };
        let outcome = tokio::time::timeout(OPERATION_TIMEOUT, work).await;
        settle_transaction(outcome, &mut guard)
    }

    pub(super) async fn state_bytes(&self, namespace: &str) -> Result<u64, String> {
        let row = self.read(|c| async move { c.query_one(STATE_USAGE, &[&namespace, &&b""[..]]).await }).await?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    /// See [`super::Store::state_expire`]: one statement.
    pub(super) async fn state_expire(&self, cutoff: u64) -> Result<usize, String> {
        let cutoff = ms(cutoff);
        let row = self
            .read(|c| async move {
                c.query_one(
                    "WITH gone AS (DELETE FROM plugin_state WHERE written_at_ms < $1 RETURNING 1) \
                     SELECT count(*) FROM gone",
                    &[&cutoff],
                )
                .await
            })
            .await?;
        Ok(row.get::<_, i64>(0) as usize)
    }

    /// The transaction connection, (re)opened when it is closed; held until the guard drops.
    async fn transaction_connection(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, String> {
        let mut guard = self.enqueuer.lock().await;
        if guard.as_ref().is_none_or(Client::is_closed) {
            *guard = Some(connect(&self.config, &self.location).await?);
        }
        Ok(guard)
    }

    /// Registers `instance` as replica `replica` until `alive_until`, unless a different
    /// instance holds that id, is alive at `now` and has renewed it since it read
    /// `stale_until` (the `alive_until` seen before: the holder did not renew, it is dead).
    /// Returns `None` when registered, else the holder's `alive_until` (ms).
    pub(super) async fn register_replica(
        &self,
        replica: &str,
        instance: &str,
        now: u64,
        alive_until: u64,
        stale_until: Option<u64>,
    ) -> Result<Option<u64>, String> {
        let (now, until, stale) = (ms(now), ms(alive_until), stale_until.map(ms));
        let row = self
            .read(|c| async move {
                c.query_opt(
                    "INSERT INTO replicas (replica_id, instance, alive_until_ms, started_at_ms) VALUES ($1, $2, $4, $3) \
                     ON CONFLICT (replica_id) DO UPDATE SET instance = EXCLUDED.instance, \
                         alive_until_ms = EXCLUDED.alive_until_ms, started_at_ms = EXCLUDED.started_at_ms \
                     WHERE replicas.instance = EXCLUDED.instance OR replicas.alive_until_ms < $3 \
                        OR replicas.alive_until_ms = $5 \
                     RETURNING 1",
                    &[&replica, &instance, &now, &until, &stale],
                )
                .await
            })
            .await?;
        if row.is_some() {
            return Ok(None);
        }
        let row = self
            .read(|c| async move {
                c.query_opt("SELECT alive_until_ms FROM replicas WHERE replica_id = $1", &[&replica]).await
            })
            .await?;
        Ok(Some(row.map(|r| r.get::<_, i64>(0).max(0) as u64).unwrap_or(0)))
    }

    /// Renews `instance`'s registration and the lease of the tasks among `running` that
    /// replica `owner` holds, until `lease_until`; returns those task ids, or `None` when
    /// another instance has taken the replica id over (this one's registration had
    /// lapsed). A row `owner` holds but does not run (a claim whose answer was lost, an
    /// end that failed to commit) is not renewed: it lapses and the reaper ends it.
    pub(super) async fn renew(
        &self,
        owner: &str,
        instance: &str,
        running: &[String],
        lease_until: u64,
    ) -> Result<Option<Vec<String>>, String> {
        let lease = ms(lease_until);
        let rows = self
            .read(|c| async move {
                c.query(
                    "WITH me AS (UPDATE replicas SET alive_until_ms = $3 WHERE replica_id = $1 AND instance = $2 \
                                 RETURNING 1), \
                          held AS (UPDATE task_queue SET lease_until_ms = $3 WHERE owner = $1 \
                                   AND task_id = ANY($4) AND EXISTS (SELECT 1 FROM me) RETURNING task_id) \
                     SELECT 'me', NULL FROM me UNION ALL SELECT 'task', task_id FROM held",
                    &[&owner, &instance, &lease, &running],
                )
                .await
            })
            .await?;
        if !rows.iter().any(|r| r.get::<_, &str>(0) == "me") {
            return Ok(None);
        }
        Ok(Some(rows.iter().filter_map(|r| r.get::<_, Option<String>>(1)).collect()))
    }

    /// The replica holding `task_id` (`None`: none, or not in the queue).
    pub(super) async fn holder(&self, task_id: &str) -> Result<Option<String>, String> {
        let row = self
            .read(|c| async move { c.query_opt("SELECT owner FROM task_queue WHERE task_id = $1", &[&task_id]).await })
            .await?;
        Ok(row.and_then(|r| r.get::<_, Option<String>>(0)))
    }

    /// Adds a task nobody runs yet to the shared queue, with its first record, unless
    /// `limits.max_queued` tasks already wait there or its user has `limits.max_per_user`
    /// tasks queued or held by a replica. One transaction under [`QUEUE_LOCK`] on a
    /// connection of its own, so concurrent enqueues on any replicas agree on both counts.
    pub(super) async fn enqueue(
        &self,
        rec: &TaskRecord,
        first_event: &serde_json::Value,
        submission: &str,
        limits: super::QueueLimits,
    ) -> Result<super::Enqueued, String> {
        use super::Enqueued;
        let mut guard = self.transaction_connection().await?;
        let client = guard.as_mut().expect("connected by transaction_connection");
        let record = serde_json::to_string(rec).expect("a task record always serialises");
        let event = serde_json::to_string(first_event).expect("JSON always serialises");
        let max = i64::try_from(limits.max_queued).unwrap_or(i64::MAX);
        let max_per_user = i64::try_from(limits.max_per_user).unwrap_or(i64::MAX);
        let user = column(&rec.user_id);
        let work = async {
            let tx = client.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&QUEUE_LOCK]).await?;
            let waiting: i64 = tx.query_one("SELECT count(*) FROM task_queue WHERE owner IS NULL", &[]).await?.get(0);
            if waiting >= max {
                return Ok(Enqueued::QueueFull);
            }
            // Queued or held by any replica (a held task's row is written by its replica's
            // writer a moment after it was admitted there); nested subagents not counted.
            let of_user: i64 = tx
                .query_one(
                    "SELECT count(*) FROM task_queue q JOIN tasks t ON t.task_id = q.task_id \
                     WHERE t.user_id = $1 AND (t.record->>'parent_task_id') IS NULL",
                    &[&user],
                )
                .await?
                .get(0);
            if of_user >= max_per_user {
                return Ok(Enqueued::UserFull);
            }
            tx.execute(
                "INSERT INTO tasks (task_id, principal, user_id, session_id, status, created_at_ms, updated_at_ms, record) \
                 VALUES ($1, $2, $3, $4, $5, $6, $6, $7::text::json)",
                &[
                    &rec.task_id,
                    &rec.principal.as_deref().map(column),
                    &column(&rec.user_id),
                    &column(&rec.session_id),
                    &rec.status.as_str(),
                    &ms(rec.created_at_ms),
                    &record,
                ],
            )
            .await?;
            tx.execute(
                "INSERT INTO events (task_id, seq, event) VALUES ($1, 1, $2::text::json)",
                &[&rec.task_id, &event],
            )
            .await?;
            tx.execute(
                "INSERT INTO task_queue (task_id, submission, queued_at_ms) VALUES ($1, $2::text::json, $3)",
                &[&rec.task_id, &submission, &ms(rec.created_at_ms)],
            )
            .await?;
            tx.commit().await?;
            Ok::<Enqueued, tokio_postgres::Error>(Enqueued::Queued)
        };
        let outcome = tokio::time::timeout(OPERATION_TIMEOUT, work).await;
        settle_transaction(outcome, &mut guard)
    }

    /// Takes up to `n` unclaimed tasks for `owner` until `lease_until`, in the fair-share
    /// order of [`FAIR_ORDER`], no more of a user than makes `max_running` held by `owner`
    /// (the cap is per replica, as `server.max_concurrent_tasks` is; rows another replica
    /// is claiming at the same moment are skipped, not waited for).
    /// Returns (task id, submission, record) of each.
    pub(super) async fn claim(
        &self,
        owner: &str,
        n: usize,
        max_running: usize,
        lease_until: u64,
    ) -> Result<Vec<ClaimedRow>, String> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let max_running = i64::try_from(max_running).unwrap_or(i64::MAX);
        let lease = ms(lease_until);
        let sql = format!(
            "{FAIR_ORDER} \
             UPDATE task_queue q SET owner = $1, lease_until_ms = $2 \
             FROM (SELECT w.task_id FROM task_queue w JOIN ranked r ON r.task_id = w.task_id \
                   WHERE w.owner IS NULL \
                     AND coalesce((SELECT h.n FROM held h WHERE h.user_id = r.user_id AND h.owner = $1), 0) \
                         + r.rank < $4 \
                   ORDER BY r.level, r.queued_at_ms, r.task_id \
                   LIMIT $3 FOR UPDATE OF w SKIP LOCKED) c \
             WHERE q.task_id = c.task_id \
             RETURNING q.task_id, q.submission::text, \
                       (SELECT t.record::text FROM tasks t WHERE t.task_id = q.task_id)"
        );
        let sql = &sql;
        let rows =
            self.read(|c| async move { c.query(sql.as_str(), &[&owner, &lease, &n, &max_running]).await }).await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
    }

    /// Where the unclaimed task `task_id` stands in [`FAIR_ORDER`] (1 = claimed next; the
    /// per-replica caps left aside); `None` when it is not waiting.
    pub(super) async fn queue_position(&self, task_id: &str) -> Result<Option<usize>, String> {
        let sql = format!(
            "{FAIR_ORDER} \
             SELECT (SELECT 1 + count(*) FROM ranked r \
                     WHERE (r.level, r.queued_at_ms, r.task_id) < (me.level, me.queued_at_ms, me.task_id)) \
             FROM ranked me WHERE me.task_id = $1"
        );
        let sql = &sql;
        let row = self.read(|c| async move { c.query_opt(sql.as_str(), &[&task_id]).await }).await?;
        Ok(row.map(|r| usize::try_from(r.get::<_, i64>(0)).unwrap_or(usize::MAX)))
    }

    /// What other replicas asked of `owner`: the tasks it holds that someone canceled, and
    /// decisions on its approval requests (request id, decision as JSON text).
    pub(super) async fn control(&self, owner: &str) -> Result<(Vec<String>, Vec<(String, String)>), String> {
        let rows = self
            .read(|c| async move {
                c.query(
                    "SELECT task_id, NULL FROM task_queue WHERE owner = $1 AND cancel_requested \
                     UNION ALL \
                     SELECT request_id, decision::text FROM approvals WHERE owner = $1 AND decision IS NOT NULL",
                    &[&owner],
                )
                .await
            })
            .await?;
        let mut cancels = vec![];
        let mut decisions = vec![];
        for r in &rows {
            match r.get::<_, Option<String>>(1) {
                None => cancels.push(r.get(0)),
                Some(d) => decisions.push((r.get(0), d)),
            }
        }
        Ok((cancels, decisions))
    }

    /// Takes over, for `taker` until `lease_until`, every task whose owner stopped renewing
    /// its lease before `now` — and with `own_too` every task `taker` itself held (a
    /// replica starting again under its id: what it ran died with it) — skipping rows
    /// another replica is taking; returns
    /// (task id, the owner that lost it, record) of each, for the taker to end.
    pub(super) async fn take_expired(
        &self,
        taker: &str,
        now: u64,
        lease_until: u64,
        own_too: bool,
    ) -> Result<Vec<(String, String, Option<String>)>, String> {
        let (now, lease) = (ms(now), ms(lease_until));
        let rows = self
            .read(|c| async move {
                c.query(
                    "UPDATE task_queue q SET owner = $1, lease_until_ms = $3, cancel_requested = false \
                     FROM (SELECT task_id, owner FROM task_queue WHERE owner IS NOT NULL \
                               AND (lease_until_ms < $2 OR ($4 AND owner = $1)) \
                           FOR UPDATE SKIP LOCKED) old \
                     WHERE q.task_id = old.task_id \
                     RETURNING q.task_id, old.owner, (SELECT t.record::text FROM tasks t WHERE t.task_id = q.task_id)",
                    &[&taker, &now, &lease, &own_too],
                )
                .await
            })
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
    }

    /// Takes `task_id` for `taker` if no replica holds it yet (so it can be ended
    /// without running); returns its record then.
    pub(super) async fn take_unclaimed(
        &self,
        taker: &str,
        task_id: &str,
        lease_until: u64,
    ) -> Result<Option<Option<String>>, String> {
        let lease = ms(lease_until);
        let row = self
            .read(|c| async move {
                c.query_opt(
                    "UPDATE task_queue q SET owner = $1, lease_until_ms = $3 WHERE task_id = $2 AND owner IS NULL \
                     RETURNING (SELECT t.record::text FROM tasks t WHERE t.task_id = q.task_id)",
                    &[&taker, &task_id, &lease],
                )
                .await
            })
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Hands `task_id`, held by `owner` but not started, back to the queue; `false` when
    /// `owner` does not hold it or it has no submission (it was never queued).
    pub(super) async fn requeue(&self, owner: &str, task_id: &str) -> Result<bool, String> {
        self.read(|c| async move {
            c.execute(
                "UPDATE task_queue SET owner = NULL, lease_until_ms = NULL WHERE task_id = $1 AND owner = $2 \
                 AND submission IS NOT NULL",
                &[&task_id, &owner],
            )
            .await
        })
        .await
        .map(|n| n == 1)
    }

    /// Ends `owner`'s lease on `task_id` now, so another replica takes it over at once.
    pub(super) async fn release_lease(&self, owner: &str, task_id: &str) -> Result<(), String> {
        self.read(|c| async move {
            c.execute("UPDATE task_queue SET lease_until_ms = 0 WHERE task_id = $1 AND owner = $2", &[&task_id, &owner])
                .await
        })
        .await
        .map(|_| ())
    }

    /// Asks the replica holding `task_id` to cancel it; `false` if no replica holds it.
    pub(super) async fn request_cancel(&self, task_id: &str) -> Result<bool, String> {
        let n = self
            .read(|c| async move {
                c.execute(
                    "UPDATE task_queue SET cancel_requested = true WHERE task_id = $1 AND owner IS NOT NULL",
                    &[&task_id],
                )
                .await
            })
            .await?;
        Ok(n > 0)
    }

    /// Puts replica `replica`'s hold `hold` in `user/session` on the egress board.
    pub(super) async fn publish_egress_hold(
        &self,
        (user, session): (&str, &str),
        replica: &str,
        hold: i64,
        narrowings: &str,
    ) -> Result<(), String> {
        self.read(|c| async move {
            c.execute(
                "INSERT INTO egress_holds (user_id, session_id, replica_id, hold_id, narrowings) \
                 VALUES ($1, $2, $3, $4, $5::text::json) \
                 ON CONFLICT (replica_id, hold_id) DO UPDATE SET narrowings = EXCLUDED.narrowings",
                &[&user, &session, &replica, &hold, &narrowings],
            )
            .await
        })
        .await
        .map(drop)
    }

    /// Takes replica `replica`'s hold `hold` off the egress board.
    pub(super) async fn withdraw_egress_hold(&self, replica: &str, hold: i64) -> Result<(), String> {
        self.read(|c| async move {
            c.execute("DELETE FROM egress_holds WHERE replica_id = $1 AND hold_id = $2", &[&replica, &hold]).await
        })
        .await
        .map(drop)
    }

    /// The narrowings (JSON) held in `user/session` by the other replicas whose lease runs.
    pub(super) async fn others_egress_holds(
        &self,
        (user, session): (&str, &str),
        replica: &str,
        now: i64,
    ) -> Result<Vec<String>, String> {
        let rows = self
            .read(|c| async move {
                c.query(
                    "SELECT h.narrowings::text FROM egress_holds h JOIN replicas r ON r.replica_id = h.replica_id \
                     WHERE h.user_id = $1 AND h.session_id = $2 AND h.replica_id <> $3 AND r.alive_until_ms > $4 \
                     LIMIT 1001",
                    &[&user, &session, &replica, &now],
                )
                .await
            })
            .await?;
        // Past the bound the lists are not all known: refuse rather than judge by some.
        if rows.len() > MAX_EGRESS_HOLDS_READ {
            return Err(format!("more than {MAX_EGRESS_HOLDS_READ} egress holds in the session"));
        }
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Drops this replica's holds left by an earlier life (its calls ended with it).
    pub(super) async fn clear_egress_holds(&self, replica: &str) -> Result<(), String> {
        self.read(|c| async move { c.execute("DELETE FROM egress_holds WHERE replica_id = $1", &[&replica]).await })
            .await
            .map(drop)
    }

    /// Approval requests waiting in other replicas' gates: (owner, pending request JSON).
    pub(super) async fn remote_approvals(&self, except_owner: &str) -> Result<Vec<(String, String)>, String> {
        let rows = self
            .read(|c| async move {
                c.query(
                    "SELECT owner, pending::text FROM approvals WHERE owner <> $1 AND decision IS NULL \
                     ORDER BY created_at_ms LIMIT 1000",
                    &[&except_owner],
                )
                .await
            })
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Records a decision on another replica's request; `false` if it is gone or decided.
    pub(super) async fn decide_remote(&self, request_id: &str, decision: &str) -> Result<bool, String> {
        let n = self
            .read(|c| async move {
                c.execute(
                    "UPDATE approvals SET decision = $2::text::json WHERE request_id = $1 AND decision IS NULL",
                    &[&request_id, &decision],
                )
                .await
            })
            .await?;
        Ok(n > 0)
    }

    /// Takes the approval requests of `task_id` out of the table — the gate that held them
    /// died with the replica that ran the task, which is being taken over — each as
    /// (pending request JSON, the decision JSON someone left on it meanwhile, if any).
    pub(super) async fn take_approvals_of(&self, task_id: &str) -> Result<Vec<(String, Option<String>)>, String> {
        let rows = self
            .read(|c| async move {
                c.query(
                    "DELETE FROM approvals WHERE task_id = $1 RETURNING pending::text, decision::text, created_at_ms",
                    &[&task_id],
                )
                .await
            })
            .await?;
        let mut rows: Vec<(i64, String, Option<String>)> =
            rows.iter().map(|r| (r.get(2), r.get(0), r.get(1))).collect();
        rows.sort_by_key(|(at, ..)| *at);
        Ok(rows.into_iter().map(|(_, pending, decision)| (pending, decision)).collect())
    }

    /// Deletes the approval requests of `task_ids` (tasks ended by another replica than
    /// the one whose gate held the requests).
    pub(super) async fn drop_approvals_of(&self, task_ids: &[String]) -> Result<(), String> {
        self.read(|c| async move { c.execute("DELETE FROM approvals WHERE task_id = ANY($1)", &[&task_ids]).await })
            .await
            .map(|_| ())
    }

    /// Unfinished tasks no replica holds or queues: left by a warden that ran before the
    /// queue existed, or by a single server on this database that stopped.
    pub(super) async fn unheld_unfinished(&self) -> Result<Vec<String>, String> {
        let rows = self
            .read(|c| async move {
                c.query(
                    "SELECT t.record::text FROM tasks t WHERE t.finished_at_ms IS NULL \
                     AND NOT EXISTS (SELECT 1 FROM task_queue q WHERE q.task_id = t.task_id)",
                    &[],
                )
                .await
            })
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    pub(super) async fn state_all(&self) -> Result<Vec<super::StateEntry>, String> {
        let rows = self
            .read(|c| async move {
                c.query("SELECT plugin, key, value, written_at_ms FROM plugin_state ORDER BY plugin, key", &[]).await
            })
            .await?;
        rows.iter()
            .map(|row| {
                let key =
                    String::from_utf8(row.get(1)).map_err(|_| "corrupt plugin state key (not UTF-8)".to_owned())?;
                Ok(super::StateEntry {
                    namespace: row.get(0),
                    key,
                    value: row.get(2),
                    written_at_ms: row.get::<_, i64>(3).max(0) as u64,
                })
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
    let mut unreported = None;
    while let Some(first) = rx.recv().await {
        let batch = super::take_batch(first, &mut rx);
        let latest = Latest::of(&batch);
        let result =
            if latest.is_empty() { Ok(()) } else { commit_retrying(&config, &location, &mut client, &latest).await };
        super::settle(batch, result, &location, &mut unreported);
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

/// A plugin state value to write: (value, written at, ms since the Unix epoch).
type StateValue<'a> = (&'a [u8], u64);

/// A published approval request: (task id, owner replica, the pending request).
type PublishedApproval<'a> = (Option<&'a str>, &'a str, &'a serde_json::Value);

/// The last write of each key in a batch, keys sorted.
#[derive(Default)]
struct Latest<'a> {
    tasks: BTreeMap<&'a str, &'a TaskRecord>,
    events: BTreeMap<(&'a str, u64), &'a serde_json::Value>,
    /// Journal entries by (task, seq): the last write of an entry wins.
    journal: BTreeMap<(&'a str, u64), &'a serde_json::Value>,
    /// `None`: delete.
    state: BTreeMap<(&'a str, &'a str), Option<StateValue<'a>>>,
    /// Task → (owner, lease end); `None`: released.
    queue: BTreeMap<&'a str, Option<(&'a str, u64)>>,
    /// Request id → (task id, owner, pending request); `None`: withdrawn.
    approvals: BTreeMap<&'a str, Option<PublishedApproval<'a>>>,
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
                Write::Journal { task_id, seq, entry } => {
                    l.journal.insert((task_id.as_str(), *seq), entry);
                }
                Write::StateSet { namespace, key, value, written_at_ms } => {
                    l.state.insert((namespace.as_str(), key.as_str()), Some((value.as_slice(), *written_at_ms)));
                }
                Write::StateDelete { namespace, key } => {
                    l.state.insert((namespace.as_str(), key.as_str()), None);
                }
                Write::Claim { task_id, owner, lease_until_ms } => {
                    l.queue.insert(task_id.as_str(), Some((owner.as_str(), *lease_until_ms)));
                }
                Write::Release { task_id } => {
                    l.queue.insert(task_id.as_str(), None);
                }
                Write::ApprovalPublished { request_id, task_id, owner, pending } => {
                    l.approvals.insert(request_id.as_str(), Some((task_id.as_deref(), owner.as_str(), pending)));
                }
                Write::ApprovalWithdrawn { request_id } => {
                    l.approvals.insert(request_id.as_str(), None);
                }
            }
        }
        l
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
            && self.events.is_empty()
            && self.journal.is_empty()
            && self.state.is_empty()
            && self.queue.is_empty()
            && self.approvals.is_empty()
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

/// One batch in one transaction. A finished task's record is final: neither its record
/// nor its events change once it is finished (with replicas, a replica that lost a
/// task's lease may still be writing it after another replica ended it "replica
/// lost"). Events go first, so a task's own finishing batch still writes its last events.
async fn commit(client: &mut Client, l: &Latest<'_>) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    if !l.events.is_empty() {
        let ids: Vec<&str> = l.events.keys().map(|k| k.0).collect();
        let seqs: Vec<i64> = l.events.keys().map(|k| ms(k.1)).collect();
        let events: Vec<String> =
            l.events.values().map(|e| serde_json::to_string(e).expect("JSON always serialises")).collect();
        tx.execute(
            "INSERT INTO events (task_id, seq, event) \
             SELECT e.task_id, e.seq, e.event::json FROM UNNEST($1::text[], $2::bigint[], $3::text[]) AS e(task_id, seq, event) \
             WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = e.task_id AND t.finished_at_ms IS NOT NULL) \
             ON CONFLICT (task_id, seq) DO NOTHING",
            &[&ids, &seqs, &events],
        )
        .await?;
    }
    if !l.journal.is_empty() {
        let ids: Vec<&str> = l.journal.keys().map(|k| k.0).collect();
        let seqs: Vec<i64> = l.journal.keys().map(|k| ms(k.1)).collect();
        let entries: Vec<String> =
            l.journal.values().map(|e| serde_json::to_string(e).expect("JSON always serialises")).collect();
        // A `started` entry becomes `done`; nothing is added to a finished task's journal.
        tx.execute(
            "INSERT INTO journal (task_id, seq, entry) \
             SELECT e.task_id, e.seq, e.entry::json FROM UNNEST($1::text[], $2::bigint[], $3::text[]) AS e(task_id, seq, entry) \
             WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = e.task_id AND t.finished_at_ms IS NOT NULL) \
             ON CONFLICT (task_id, seq) DO UPDATE SET entry = EXCLUDED.entry",
            &[&ids, &seqs, &entries],
        )
        .await?;
    }
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
                 finished_at_ms = EXCLUDED.finished_at_ms, record = EXCLUDED.record \
             WHERE tasks.finished_at_ms IS NULL",
            &[&ids, &principals, &users, &sessions, &statuses, &created, &updated, &finished, &records],
        )
        .await?;
    }
    let (claims, releases): (Vec<_>, Vec<_>) = l.queue.iter().partition(|(_, v)| v.is_some());
    if !claims.is_empty() {
        let ids: Vec<&str> = claims.iter().map(|(t, _)| **t).collect();
        let owners: Vec<&str> = claims.iter().filter_map(|(_, v)| v.map(|v| v.0)).collect();
        let leases: Vec<i64> = claims.iter().filter_map(|(_, v)| v.map(|v| ms(v.1))).collect();
        tx.execute(
            "INSERT INTO task_queue (task_id, owner, lease_until_ms, queued_at_ms) \
             SELECT q.task_id, q.owner, q.lease, $4 FROM UNNEST($1::text[], $2::text[], $3::bigint[]) AS q(task_id, owner, lease) \
             ON CONFLICT (task_id) DO UPDATE SET owner = EXCLUDED.owner, lease_until_ms = EXCLUDED.lease_until_ms",
            &[&ids, &owners, &leases, &ms(super::now_ms())],
        )
        .await?;
    }
    if !releases.is_empty() {
        let ids: Vec<&str> = releases.iter().map(|(t, _)| **t).collect();
        tx.execute("DELETE FROM task_queue WHERE task_id = ANY($1)", &[&ids]).await?;
    }
    let (published, withdrawn): (Vec<_>, Vec<_>) = l.approvals.iter().partition(|(_, v)| v.is_some());
    if !published.is_empty() {
        let ids: Vec<&str> = published.iter().map(|(r, _)| **r).collect();
        let tasks: Vec<Option<&str>> = published.iter().filter_map(|(_, v)| v.map(|v| v.0)).collect();
        let owners: Vec<&str> = published.iter().filter_map(|(_, v)| v.map(|v| v.1)).collect();
        let pending: Vec<String> = published
            .iter()
            .filter_map(|(_, v)| v.map(|v| serde_json::to_string(v.2).expect("JSON always serialises")))
            .collect();
        tx.execute(
            "INSERT INTO approvals (request_id, task_id, owner, pending, created_at_ms) \
             SELECT a.request_id, a.task_id, a.owner, a.pending::json, $5 \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[]) AS a(request_id, task_id, owner, pending) \
             ON CONFLICT (request_id) DO NOTHING",
            &[&ids, &tasks, &owners, &pending, &ms(super::now_ms())],
        )
        .await?;
    }
    if !withdrawn.is_empty() {
        let ids: Vec<&str> = withdrawn.iter().map(|(r, _)| **r).collect();
        tx.execute("DELETE FROM approvals WHERE request_id = ANY($1)", &[&ids]).await?;
    }
    let (sets, deletes): (Vec<_>, Vec<_>) = l.state.iter().partition(|(_, v)| v.is_some());
    if !sets.is_empty() {
        let namespaces: Vec<&str> = sets.iter().map(|((n, _), _)| *n).collect();
        let keys: Vec<&[u8]> = sets.iter().map(|((_, k), _)| k.as_bytes()).collect();
        let values: Vec<&[u8]> = sets.iter().map(|(_, v)| v.map(|v| v.0).unwrap_or_default()).collect();
        let written: Vec<i64> = sets.iter().map(|(_, v)| ms(v.map(|v| v.1).unwrap_or_default())).collect();
        tx.execute(
            "INSERT INTO plugin_state (plugin, key, value, written_at_ms) \
             SELECT * FROM UNNEST($1::text[], $2::bytea[], $3::bytea[], $4::bigint[]) \
             ON CONFLICT (plugin, key) DO UPDATE SET value = EXCLUDED.value, written_at_ms = EXCLUDED.written_at_ms",
            &[&namespaces, &keys, &values, &written],
        )
        .await?;
    }
    if !deletes.is_empty() {
        let namespaces: Vec<&str> = deletes.iter().map(|((n, _), _)| *n).collect();
        let keys: Vec<&[u8]> = deletes.iter().map(|((_, k), _)| k.as_bytes()).collect();
        tx.execute(
            "DELETE FROM plugin_state WHERE (plugin, key) IN (SELECT * FROM UNNEST($1::text[], $2::bytea[]))",
            &[&namespaces, &keys],
        )
        .await?;
    }
    tx.commit().await
}

/// The result of a transaction bounded by [`OPERATION_TIMEOUT`]; when the server did not
/// answer in time the connection is dropped, so the next transaction opens a new one.
fn settle_transaction<T>(
    outcome: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    connection: &mut Option<Client>,
) -> Result<T, String> {
    match outcome {
        Ok(r) => r.map_err(pg),
        Err(_) => {
            connection.take();
            Err(format!("PostgreSQL did not answer within {OPERATION_TIMEOUT:?}"))
        }
    }
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

    use serde_json::json;

    use super::*;

    /// Within one batch (one transaction) the last write of each key is the one committed:
    /// a repeated event number keeps the later event, a state key set then deleted is
    /// deleted, deleted then set is set. (Across batches queue order gives the same, except
    /// for events, which are append-only: the store's integration tests cover that.)
    #[test]
    fn the_last_write_of_a_batch_wins() {
        let event =
            |v: &str| Msg::Write(Box::new(Write::Event { task_id: "t".into(), seq: 1, event: json!({ "v": v }) }));
        let set = |key: &str| {
            Msg::Write(Box::new(Write::StateSet {
                namespace: "p".into(),
                key: key.into(),
                value: b"x".to_vec(),
                written_at_ms: 1,
            }))
        };
        let delete = |key: &str| Msg::Write(Box::new(Write::StateDelete { namespace: "p".into(), key: key.into() }));
        let batch = [
            event("first"),
            event("second"),
            set("set-then-deleted"),
            delete("set-then-deleted"),
            delete("deleted-then-set"),
            set("deleted-then-set"),
        ];
        let l = Latest::of(&batch);
        assert_eq!(l.events.into_iter().collect::<Vec<_>>(), [(("t", 1), &json!({ "v": "second" }))]);
        assert_eq!(l.state[&("p", "set-then-deleted")], None);
        assert_eq!(l.state[&("p", "deleted-then-set")], Some((&b"x"[..], 1)));
    }

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
