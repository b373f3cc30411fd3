//! The task store's behaviour, once per backend: every test below runs against the
//! embedded redb file and against PostgreSQL (`<test>::redb`, `<test>::postgres`), so the
//! two cannot drift apart.
//!
//! The PostgreSQL tests need the server `cargo xtask test` starts (Debian's package, in a
//! private data directory on a free port), named by `WARDEN_TEST_POSTGRES_URL`; each test
//! creates a database of its own there and drops it at the end. Without the variable they
//! fail, saying so: a backend that is not tested is not claimed to work.

use crate::records::record;
use std::time::{Duration, Instant};

use serde_json::json;
use warden::store::{FinishReason, StateEntry, Store, TaskState, Write, now_ms};

use crate::postgres::{TestDatabase, admin_client};

/// Where a test's store lives; [`Backend::open`] opens it (again, after a "restart").
pub enum Backend {
    Redb(tempfile::TempDir),
    Postgres(TestDatabase),
}

impl Backend {
    pub fn redb() -> Backend {
        Backend::Redb(tempfile::tempdir().unwrap())
    }

    pub async fn postgres() -> Backend {
        Backend::Postgres(TestDatabase::create().await)
    }

    /// Opens the store. A dropped redb store lets go of its file when its writer thread
    /// sees it dropped, a moment later: opening again waits for that.
    pub async fn open(&self) -> Store {
        match self {
            Backend::Redb(dir) => {
                let path = dir.path().join("state.db");
                let t = Instant::now();
                loop {
                    match Store::open(&path) {
                        Ok(s) => return s,
                        Err(e) if t.elapsed() < Duration::from_secs(5) => {
                            let _ = e;
                            tokio::time::sleep(Duration::from_millis(20)).await
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            Backend::Postgres(db) => Store::connect(&db.url).await.unwrap_or_else(|e| panic!("{e}")),
        }
    }

    async fn finish(self) {
        if let Backend::Postgres(db) = self {
            db.drop_database().await;
        }
    }
}

/// Runs the behaviour `$name` (an `async fn(&Backend)`) once per backend.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread")]
            async fn redb() {
                let b = super::Backend::redb();
                super::$name(&b).await;
                b.finish().await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn postgres() {
                let b = super::Backend::postgres().await;
                super::$name(&b).await;
                b.finish().await;
            }
        }
    )*};
}

on_both_backends!(
    a_task_is_read_back_as_written,
    events_come_in_order_after_any_last_event_id,
    plugin_state_is_kept_as_written,
    queued_writes_commit_in_queue_order_whatever_the_batches,
    a_restart_fails_interrupted_tasks_and_keeps_the_rest,
    purge_removes_only_tasks_finished_before_retention,
    concurrent_writers_share_commits,
    a_reopened_store_keeps_everything,
    a_state_put_is_committed_within_the_plugin_budget,
    a_state_store_on_a_task_store_is_durable_and_budgeted,
    regression_task_listings_are_keyset_pages_of_one_tenant,
    regression_one_tenant_filled_the_plugin_state_of_every_tenant,
    plugin_state_unwritten_past_retention_expires,
);

/// A queued plugin state write, written now.
fn state_set(namespace: &str, key: &str, value: impl Into<Vec<u8>>) -> Write {
    Write::StateSet { namespace: namespace.into(), key: key.into(), value: value.into(), written_at_ms: now_ms() }
}

/// Plugin state entries as (namespace, key, value), without their write times.
fn triples(entries: Vec<StateEntry>) -> Vec<(String, String, Vec<u8>)> {
    entries.into_iter().map(|e| (e.namespace, e.key, e.value)).collect()
}

/// PostgreSQL only (a file has no connection to lose): the server ending the store's
/// sessions, as a restart or a failover does, costs no read and no write; both are retried
/// once on a new connection.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_reads_and_writes_survive_the_server_dropping_their_connections() {
    let b = Backend::postgres().await;
    let store = b.open().await;
    store.write(Write::Task(record("task_before", TaskState::Working, None)));
    store.flush().await.unwrap();
    let Backend::Postgres(db) = &b else { unreachable!() };
    let admin = admin_client(&db.admin).await;
    let ended = admin
        .query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", &[&db.name])
        .await
        .unwrap()
        .len();
    assert!(ended >= 2, "the store's read and write sessions were ended ({ended})");
    let t = Instant::now();
    while admin
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", &[&db.name])
        .await
        .unwrap()
        .get::<_, i64>(0)
        > 0
    {
        assert!(t.elapsed() < Duration::from_secs(10), "the sessions did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.task("task_before").await.unwrap().map(|r| r.task_id).as_deref(), Some("task_before"));
    store.write(Write::Task(record("task_after", TaskState::Working, None)));
    store.flush().await.unwrap();
    assert!(store.task("task_after").await.unwrap().is_some());
    drop(admin);
    b.finish().await;
}

/// PostgreSQL only: a commit stuck behind another session's lock fails the flush once the
/// statement timeout passes (here the URL's own, 300 ms; warden's default is 30 s) instead
/// of holding every task's finish, and the store writes again once the lock is gone.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_commit_stuck_behind_a_lock_fails_its_flush_then_the_store_recovers() {
    let b = Backend::postgres().await;
    drop(b.open().await);
    let Backend::Postgres(db) = &b else { unreachable!() };
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let store = Store::connect(&format!("{}{sep}options=-c%20statement_timeout%3D300", db.url)).await.unwrap();
    let (mut locker, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE").await.unwrap();
    store.write(Write::Task(record("task_stuck", TaskState::Working, None)));
    let t = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(20), store.flush())
        .await
        .expect("the flush hung behind the lock")
        .expect_err("a commit behind the lock cannot succeed");
    assert!(e.to_string().contains("statement timeout"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(20));
    tx.rollback().await.unwrap();
    store.write(Write::Task(record("task_after", TaskState::Working, None)));
    store.flush().await.unwrap();
    assert!(store.task("task_after").await.unwrap().is_some());
    drop(store);
    b.finish().await;
}

/// PostgreSQL only: a database migrated by a newer warden (a schema version this one does
/// not know) is refused at open, naming both versions, rather than written to.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_refuses_a_database_from_a_newer_warden() {
    let b = Backend::postgres().await;
    drop(b.open().await);
    let Backend::Postgres(db) = &b else { unreachable!() };
    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("INSERT INTO warden_migrations (version, name) VALUES (999, 'from the future')")
        .await
        .unwrap();
    let e = Store::connect(&db.url).await.unwrap_err().to_string();
    // The newest version this warden knows: one per migration file.
    let known = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations")).unwrap().count();
    assert!(e.contains(&format!("schema version 999, newer than this warden knows ({known})")), "{e}");
    assert!(e.starts_with(&format!("task store {}", db.url)), "the error names the database: {e}");
    drop(client);
    b.finish().await;
}

async fn a_task_is_read_back_as_written(b: &Backend) {
    let store = b.open().await;
    assert!(store.task("task_none").await.unwrap().is_none());
    // Text PostgreSQL's `text` and `jsonb` refuse (NUL) and text beyond ASCII, in the
    // record and in the fields the database indexes.
    let mut rec = record("task_a", TaskState::Completed, Some(warden::store::now_ms()));
    rec.output = Some("nul \0 here, ünïcödé ✓, \"quoted\"".into());
    rec.session_id = "sess\0ion".into();
    rec.user_id = "üser".into();
    store.write(Write::Task(rec.clone()));
    store.flush().await.unwrap();
    assert_eq!(store.task("task_a").await.unwrap().as_ref(), Some(&rec));
    // A later write of the same task replaces it.
    let mut working = record("task_b", TaskState::Working, None);
    store.write(Write::Task(working.clone()));
    store.flush().await.unwrap();
    working.status = TaskState::Completed;
    working.output = Some("done".into());
    working.finished_at_ms = Some(5);
    store.write(Write::Task(working.clone()));
    store.flush().await.unwrap();
    assert_eq!(store.task("task_b").await.unwrap().as_ref(), Some(&working));
    let mut all: Vec<String> = store.tasks().await.unwrap().into_iter().map(|r| r.task_id).collect();
    all.sort();
    assert_eq!(all, ["task_a", "task_b"]);
}

async fn events_come_in_order_after_any_last_event_id(b: &Backend) {
    let store = b.open().await;
    // Written out of order, interleaved with another task's events.
    for seq in [3u64, 1, 5, 2, 4] {
        store.write(Write::Event { task_id: "task_e".into(), seq, event: json!({ "type": "token", "n": seq }) });
        store.write(Write::Event { task_id: "task_f".into(), seq, event: json!({ "type": "other" }) });
    }
    store.write(Write::Event {
        task_id: "task_e".into(),
        seq: 10,
        event: json!({ "type": "token", "text": "nul \u{0} ünï ✓" }),
    });
    store.flush().await.unwrap();
    let seqs = |ev: Vec<(u64, serde_json::Value)>| ev.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
    let all = store.events_after("task_e", 0).await.unwrap();
    assert_eq!(all.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 10]);
    assert_eq!(all[0].1, json!({ "type": "token", "n": 1 }));
    assert_eq!(all[5].1["text"], "nul \u{0} ünï ✓");
    // Last-Event-ID: only what follows it; past the last, nothing.
    assert_eq!(seqs(store.events_after("task_e", 3).await.unwrap()), [4, 5, 10]);
    assert_eq!(seqs(store.events_after("task_e", 7).await.unwrap()), [10]);
    assert!(store.events_after("task_e", 10).await.unwrap().is_empty());
    assert!(store.events_after("task_e", u64::MAX).await.unwrap().is_empty());
    assert!(store.events_after("task_none", 0).await.unwrap().is_empty());
    assert_eq!(store.event_count().await.unwrap(), 11);
}

/// Plugin state is stored byte for byte (NUL in keys, any bytes in values): the store
/// scrubs nothing, as what it is handed was scrubbed by whoever knew whose it is (the
/// `state` import, with the calling task's session secrets).
async fn plugin_state_is_kept_as_written(b: &Backend) {
    let store = b.open().await;
    assert!(store.state_get("p", "k").await.unwrap().is_none());
    store.write(state_set("p", "k", b"one".to_vec()));
    store.write(state_set("p", "nul\0key", vec![0, 1, 2, 255]));
    store.write(state_set("q", "about [redacted]", b"{\"prompt\":\"use [redacted]\"}".to_vec()));
    store.flush().await.unwrap();
    assert_eq!(store.state_get("p", "k").await.unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(store.state_get("p", "nul\0key").await.unwrap().as_deref(), Some(&[0u8, 1, 2, 255][..]));
    store.write(state_set("p", "k", b"two".to_vec()));
    store.flush().await.unwrap();
    assert_eq!(store.state_get("p", "k").await.unwrap().as_deref(), Some(&b"two"[..]));
    store.write(Write::StateDelete { namespace: "p".into(), key: "nul\0key".into() });
    store.flush().await.unwrap();
    assert!(store.state_get("p", "nul\0key").await.unwrap().is_none());
    let all = triples(store.state_all().await.unwrap());
    assert_eq!(
        all,
        vec![
            ("p".to_string(), "k".to_string(), b"two".to_vec()),
            ("q".to_string(), "about [redacted]".to_string(), b"{\"prompt\":\"use [redacted]\"}".to_vec()),
        ]
    );
}

/// Writes queued back to back, with no flush between, fall into one batch or several (the
/// writer takes what is queued when it wakes): either way the last write of each key wins.
/// (Regression: this test queued a task's final record before its events and a repeated
/// event number, which only one batch commits as written; a split batch dropped the events
/// of the already-finished task, as it must. Within one batch: the backends' unit tests.)
async fn queued_writes_commit_in_queue_order_whatever_the_batches(b: &Backend) {
    let store = b.open().await;
    let mut rec = record("task_w", TaskState::Working, None);
    store.write(Write::Task(rec.clone()));
    store.write(Write::Event { task_id: "task_w".into(), seq: 1, event: json!({ "v": "second" }) });
    rec.status = TaskState::Completed;
    rec.finished_at_ms = Some(9);
    store.write(Write::Task(rec.clone()));
    store.write(state_set("p", "set-then-deleted", b"x".to_vec()));
    store.write(Write::StateDelete { namespace: "p".into(), key: "set-then-deleted".into() });
    store.write(Write::StateDelete { namespace: "p".into(), key: "deleted-then-set".into() });
    store.write(state_set("p", "deleted-then-set", b"y".to_vec()));
    store.flush().await.unwrap();
    assert_eq!(store.task("task_w").await.unwrap().as_ref(), Some(&rec));
    assert_eq!(store.events_after("task_w", 0).await.unwrap(), vec![(1, json!({ "v": "second" }))]);
    assert!(store.state_get("p", "set-then-deleted").await.unwrap().is_none());
    assert_eq!(store.state_get("p", "deleted-then-set").await.unwrap().as_deref(), Some(&b"y"[..]));
    // A flush with nothing queued commits nothing and succeeds.
    store.flush().await.unwrap();
}

async fn a_restart_fails_interrupted_tasks_and_keeps_the_rest(b: &Backend) {
    {
        let store = b.open().await;
        store.write(Write::Task(record("task_done", TaskState::Completed, Some(warden::store::now_ms()))));
        store.write(Write::Task(record("task_running", TaskState::Working, None)));
        store.write(Write::Task(record("task_queued", TaskState::Submitted, None)));
        for seq in 1..=2 {
            store.write(Write::Event {
                task_id: "task_running".into(),
                seq,
                event: json!({ "type": "status", "status": "working" }),
            });
        }
        store.flush().await.unwrap();
    }
    let store = b.open().await;
    let recovered = store.recover_interrupted().await.unwrap();
    assert_eq!(recovered, ["task_queued", "task_running"]);
    for id in recovered {
        let r = store.task(&id).await.unwrap().unwrap();
        assert_eq!((r.status, r.error.as_deref()), (TaskState::Failed, Some(warden::store::HOST_RESTARTED)));
        assert_eq!(r.finish_reason, Some(FinishReason::HostRestarted));
        assert!(r.is_finished());
    }
    let ev = store.events_after("task_running", 0).await.unwrap();
    assert_eq!(ev.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!((ev[2].1["type"].as_str(), ev[3].1["type"].as_str()), (Some("error"), Some("finish")));
    assert_eq!(ev[3].1["reason"], "host_restarted");
    let queued = store.events_after("task_queued", 0).await.unwrap();
    assert_eq!(queued.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2], "a task with no events yet gets 1 and 2");
    let done = store.task("task_done").await.unwrap().unwrap();
    assert_eq!((done.status, done.output.as_deref()), (TaskState::Completed, Some("kept")));
    assert!(store.recover_interrupted().await.unwrap().is_empty(), "nothing is left to recover");
}

async fn purge_removes_only_tasks_finished_before_retention(b: &Backend) {
    let store = b.open().await;
    let now = warden::store::now_ms();
    // Events are written while the tasks run (a finished task takes no more events: the
    // writer may commit a finished record before an event queued after it, so the test
    // once lost an event to that rule whenever the batches fell that way).
    for id in ["task_ancient", "task_recent", "task_running"] {
        store.write(Write::Task(record(id, TaskState::Working, None)));
        store.write(Write::Event { task_id: id.into(), seq: 1, event: json!({ "type": "status" }) });
    }
    store.flush().await.unwrap();
    store.write(Write::Task(record("task_ancient", TaskState::Completed, Some(1))));
    store.write(Write::Task(record("task_recent", TaskState::Completed, Some(now))));
    store.flush().await.unwrap();
    assert_eq!(store.purge(Duration::from_secs(3600)).await.unwrap(), 1, "only the ancient task is past retention");
    assert!(store.task("task_ancient").await.unwrap().is_none());
    assert!(store.events_after("task_ancient", 0).await.unwrap().is_empty(), "its events went with it");
    assert!(store.task("task_recent").await.unwrap().is_some());
    assert!(store.task("task_running").await.unwrap().is_some(), "an unfinished task is never purged");
    assert_eq!(store.event_count().await.unwrap(), 2);
    assert_eq!(store.purge(Duration::from_secs(3600)).await.unwrap(), 0);
}

async fn concurrent_writers_share_commits(b: &Backend) {
    const TASKS: usize = 20;
    const EVENTS: u64 = 50;
    let store = b.open().await;
    let writers: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let id = format!("task_{t:02}");
                store.write(Write::Task(record(&id, TaskState::Working, None)));
                for seq in 1..=EVENTS {
                    store.write(Write::Event { task_id: id.clone(), seq, event: json!({ "t": t, "seq": seq }) });
                    if seq % 10 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                // Every writer's flush is answered once its writes are in.
                store.flush().await.unwrap();
                id
            })
        })
        .collect();
    for w in writers {
        let id = w.await.unwrap();
        let ev = store.events_after(&id, 0).await.unwrap();
        assert_eq!(ev.iter().map(|(s, _)| *s).collect::<Vec<_>>(), (1..=EVENTS).collect::<Vec<_>>(), "{id}");
    }
    assert_eq!(store.event_count().await.unwrap(), TASKS as u64 * EVENTS);
    assert_eq!(store.tasks().await.unwrap().len(), TASKS);
}

async fn a_reopened_store_keeps_everything(b: &Backend) {
    let rec = record("task_kept", TaskState::Completed, Some(warden::store::now_ms()));
    {
        let store = b.open().await;
        // A task's events before its finished record, as the engine writes them: once a
        // record is finished its events are final (replicas: a late writer adds nothing).
        store.write(Write::Event { task_id: "task_kept".into(), seq: 1, event: json!({ "type": "finish" }) });
        store.write(Write::Task(rec.clone()));
        store.write(state_set("p", "k", b"v".to_vec()));
        store.flush().await.unwrap();
    }
    let store = b.open().await;
    assert_eq!(store.task("task_kept").await.unwrap().as_ref(), Some(&rec));
    assert_eq!(store.events_after("task_kept", 0).await.unwrap(), vec![(1, json!({ "type": "finish" }))]);
    assert_eq!(triples(store.state_all().await.unwrap()), vec![("p".to_string(), "k".to_string(), b"v".to_vec())]);
    // Opening once more (PostgreSQL: no migration applied twice) loses nothing.
    drop(store);
    let again = b.open().await;
    assert_eq!(again.task("task_kept").await.unwrap().as_ref(), Some(&rec));
}

/// `state_put`: committed when it returns (readable at once, no flush), the plugin's bytes
/// counted as stored (a replaced value counts once), nothing written past the limit.
async fn a_state_put_is_committed_within_the_plugin_budget(b: &Backend) {
    use warden::store::StatePut;
    let store = b.open().await;
    assert_eq!(store.state_put("p", "k1", &[1; 40], now_ms(), 100).await.unwrap(), StatePut::Stored { total: 42 });
    assert_eq!(store.state_get("p", "k1").await.unwrap(), Some(vec![1; 40]));
    assert_eq!(store.state_put("p", "k2", &[2; 40], now_ms(), 100).await.unwrap(), StatePut::Stored { total: 84 });
    // Replacing k1 with a bigger value: 84 - 42 + 62 = 104 is over; nothing changes.
    assert_eq!(store.state_put("p", "k1", &[3; 60], now_ms(), 100).await.unwrap(), StatePut::OverLimit { total: 104 });
    assert_eq!(store.state_get("p", "k1").await.unwrap(), Some(vec![1; 40]));
    assert_eq!(store.state_put("p", "k1", &[3; 50], now_ms(), 100).await.unwrap(), StatePut::Stored { total: 94 });
    // Another plugin's bytes are its own.
    assert_eq!(store.state_put("q", "k1", &[4; 90], now_ms(), 100).await.unwrap(), StatePut::Stored { total: 92 });
    assert_eq!((store.state_bytes("p").await.unwrap(), store.state_bytes("q").await.unwrap()), (94, 92));
    store.state_delete("p", "k2").await.unwrap();
    assert!(store.state_get("p", "k2").await.unwrap().is_none());
    assert_eq!(store.state_bytes("p").await.unwrap(), 52);
}

/// A [`StateStore`] attached to a task store: every write is committed when `set` returns
/// (a store opened after it, as after a `kill -9`, has it), the budget counts what the
/// store holds, and a delete is committed too.
async fn a_state_store_on_a_task_store_is_durable_and_budgeted(b: &Backend) {
    use warden::config::Budgets;
    use warden::services::{StateError, StateNamespace, StateStore};
    let budgets = Budgets { max_state_bytes_per_plugin: 300, ..Budgets::default() };
    let claude = StateNamespace::new("claude", "alice");
    {
        let store = b.open().await;
        let state = StateStore::default();
        state.attach(store.clone()).await.unwrap();
        state.set(&claude, "transcript/t1", vec![b'a'; 200], &budgets).await.unwrap();
        state.set(&claude, "gone", b"x".to_vec(), &budgets).await.unwrap();
        // Committed already: read straight from the backend, nothing flushed.
        assert_eq!(store.state_get(&claude.store_key(), "transcript/t1").await.unwrap(), Some(vec![b'a'; 200]));
        state.delete(&claude, "gone").await.unwrap();
        assert!(store.state_get(&claude.store_key(), "gone").await.unwrap().is_none());
        let over = state.set(&claude, "more", vec![0; 100], &budgets).await.unwrap_err();
        assert!(
            matches!(&over, StateError::Budget(e) if e.key == "max_state_bytes_per_plugin" && e.got == 317),
            "{over:?}"
        );
        assert_eq!(state.bytes_held(&claude).await.unwrap(), 213);
    }
    let store = b.open().await;
    let state = StateStore::default();
    state.attach(store).await.unwrap();
    assert_eq!(state.get(&claude, "transcript/t1").await.unwrap(), Some(vec![b'a'; 200]));
    assert!(state.get(&claude, "gone").await.unwrap().is_none());
    assert_eq!(state.bytes_held(&claude).await.unwrap(), 213);
    assert!(matches!(state.set(&claude, "more", vec![0; 100], &budgets).await, Err(StateError::Budget(_))));
    state.set(&claude, "more", vec![0; 80], &budgets).await.unwrap();
}

/// Replicas: plugin state written through one replica's [`StateStore`] is what another
/// replica's reads at once (a transcript saved on A, resumed on B), both count the same
/// budget, and a store that fails a read gives the plugin an error, never a stale value.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_plugin_state_is_the_same_on_every_replica() {
    use warden::config::Budgets;
    use warden::services::{StateError, StateNamespace, StateStore};
    let (claude, race) = (StateNamespace::new("claude", "alice"), StateNamespace::new("race", "alice"));
    let b = Backend::postgres().await;
    let budgets = Budgets { max_state_bytes_per_plugin: 300, ..Budgets::default() };
    let (a, replica_b) = (StateStore::default(), StateStore::default());
    a.attach(b.open().await).await.unwrap();
    replica_b.attach(b.open().await).await.unwrap();
    // B read the key before A wrote it: B must not answer from what it saw then.
    assert!(replica_b.get(&claude, "transcript/t1").await.unwrap().is_none());
    a.set(&claude, "transcript/t1", b"turn 1".to_vec(), &budgets).await.unwrap();
    assert_eq!(replica_b.get(&claude, "transcript/t1").await.unwrap().as_deref(), Some(&b"turn 1"[..]));
    replica_b.set(&claude, "transcript/t1", b"turn 2".to_vec(), &budgets).await.unwrap();
    assert_eq!(a.get(&claude, "transcript/t1").await.unwrap().as_deref(), Some(&b"turn 2"[..]));
    // One budget for the plugin across replicas: A's 200 bytes count against B's write.
    a.set(&claude, "big", vec![0; 197], &budgets).await.unwrap();
    let over = replica_b.set(&claude, "more", vec![0; 100], &budgets).await.unwrap_err();
    assert!(matches!(&over, StateError::Budget(e) if e.key == "max_state_bytes_per_plugin"), "{over:?}");
    assert_eq!(replica_b.bytes_held(&claude).await.unwrap(), a.bytes_held(&claude).await.unwrap());
    a.delete(&claude, "big").await.unwrap();
    replica_b.set(&claude, "more", vec![0; 100], &budgets).await.unwrap();
    // Concurrent writers on both replicas cannot pass the budget together.
    let budgets = Budgets { max_state_bytes_per_plugin: 1000, ..budgets };
    let keys: Vec<String> = (0..20).map(|i| format!("k{i:02}")).collect();
    let writes = keys.iter().enumerate().map(|(i, key)| {
        let state = if i % 2 == 0 { &a } else { &replica_b };
        state.set(&race, key, vec![0; 97], &budgets)
    });
    let done = futures_util::future::join_all(writes).await;
    assert_eq!(done.iter().filter(|r| r.is_ok()).count(), 10, "{done:?}");
    assert_eq!(a.bytes_held(&race).await.unwrap(), 1000);
    // The database fails the read: an error value, not the last value seen.
    let Backend::Postgres(db) = &b else { unreachable!() };
    admin_client(&db.url).await.batch_execute("ALTER TABLE plugin_state RENAME TO plugin_state_gone").await.unwrap();
    assert!(matches!(replica_b.get(&claude, "transcript/t1").await, Err(StateError::Store(_))));
    assert!(matches!(a.set(&claude, "k", b"v".to_vec(), &budgets).await, Err(StateError::Store(_))));
    b.finish().await;
}

/// Regression (issue 41): replicas claimed the shared queue oldest first, so one user's
/// backlog held every other user's task until it had all run. The claim now takes the
/// oldest task of the user holding the fewest tasks cluster-wide, no more of a user than
/// `max_running_per_user` on the claiming replica, and a waiting task's place follows the
/// same order.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_regression_the_shared_queue_is_claimed_fairly_between_users() {
    use warden::store::{Enqueued, QueueLimits};
    let b = Backend::postgres().await;
    let store = b.open().await;
    let limits = QueueLimits { max_queued: 1000, max_per_user: 1000 };
    let mut created = 10;
    let mut enqueue = |user: &str, id: &str| {
        created += 1;
        let mut rec = record(id, TaskState::Submitted, None);
        rec.user_id = user.into();
        rec.created_at_ms = created;
        let store = store.clone();
        async move {
            let first = json!({ "type": "status", "status": "submitted" });
            let queued = store.enqueue(&rec, &first, &json!({}), limits).await.unwrap();
            assert_eq!(queued, Enqueued::Queued);
        }
    };
    for i in 0..100 {
        enqueue("anna", &format!("a{i:03}")).await;
    }
    enqueue("ben", "b000").await;
    // The claimed ids, sorted (an UPDATE returns its rows in no particular order).
    let ids = |claimed: Vec<warden::store::Claimed>| {
        let mut ids: Vec<String> = claimed.into_iter().map(|c| c.record.task_id).collect();
        ids.sort();
        ids
    };
    let lease = now_ms() + 60_000;
    // Two slots free: anna's oldest and ben's (fewest held, each), not anna's two oldest.
    assert_eq!(store.queue_position("b000").await.unwrap(), Some(2));
    assert_eq!(ids(store.claim("r1", 2, 10, lease).await.unwrap()), ["a000", "b000"]);
    enqueue("ben", "b001").await;
    // anna and ben hold one each; ben's next is queued after anna's, so anna's comes first.
    assert_eq!(store.queue_position("a001").await.unwrap(), Some(1));
    assert_eq!(store.queue_position("b001").await.unwrap(), Some(2));
    assert_eq!(store.queue_position("a000").await.unwrap(), None, "claimed: not waiting");
    assert_eq!(ids(store.claim("r2", 3, 10, lease).await.unwrap()), ["a001", "a002", "b001"]);
    // The cap is per replica: r2 runs two of anna's tasks, so with max_running_per_user 2
    // it takes none of hers however many slots it has; cleo's (holding none) comes first.
    enqueue("cleo", "c000").await;
    assert_eq!(store.queue_position("a003").await.unwrap(), Some(2));
    assert_eq!(ids(store.claim("r2", 5, 2, lease).await.unwrap()), ["c000"]);
    // r1 runs one of hers: it takes one more.
    assert_eq!(ids(store.claim("r1", 5, 2, lease).await.unwrap()), ["a003"]);
    b.finish().await;
}

/// Regression (CI of 2026-12-06): a replica killed between claiming a queued task and
/// writing its copy of the record left the record naming no replica, so the task ended
/// "replica lost" with no `replica`. The tasks taken from a lost replica name it.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_regression_a_task_lost_right_after_its_claim_names_the_lost_replica() {
    use warden::store::QueueLimits;
    let b = Backend::postgres().await;
    let store = b.open().await;
    let limits = QueueLimits { max_queued: 10, max_per_user: 10 };
    let rec = record("t-claimed", TaskState::Submitted, None);
    assert_eq!(rec.replica, None, "the control: a queued record names no replica");
    store.enqueue(&rec, &json!({ "type": "status", "status": "submitted" }), &json!({}), limits).await.unwrap();
    // r3 claims it with a lease already past, and dies before writing anything else.
    let claimed = store.claim("r3", 1, 10, now_ms() - 1).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let expired = store.take_expired("r1", now_ms() + 60_000, false).await.unwrap();
    let [(owner, lost)] = expired.as_slice() else { panic!("expected the one lost task: {expired:?}") };
    assert_eq!((owner.as_str(), lost.replica.as_deref()), ("r3", Some("r3")));
    b.finish().await;
}

/// Regression: listings read every task and paged by offset. Pages now follow a keyset
/// cursor on (created, id) through an index: newest first, no task twice or skipped even
/// as tasks arrive between pages or are purged, and a tenant's pages hold only its tasks.
async fn regression_task_listings_are_keyset_pages_of_one_tenant(b: &Backend) {
    use warden::store::{TaskCursor, TaskQuery, TaskRecord};
    let store = b.open().await;
    let mut all: Vec<TaskRecord> = Vec::new();
    // Three users; creation times repeat (ties are ordered by id), ids sort apart from time.
    for i in 0..37u64 {
        let mut rec = record(&format!("task_{:02}", (i * 7) % 37), TaskState::Completed, Some(5));
        rec.user_id = ["u", "v", "w"][(i % 3) as usize].into();
        rec.created_at_ms = 1000 + (i % 11);
        store.write(Write::Task(rec.clone()));
        all.push(rec);
    }
    store.flush().await.unwrap();
    let newest_first = |user: Option<&str>| {
        let mut want: Vec<(u64, String)> = all
            .iter()
            .filter(|r| user.is_none_or(|u| r.user_id == u))
            .map(|r| (r.created_at_ms, r.task_id.clone()))
            .collect();
        want.sort();
        want.reverse();
        want
    };
    for user in [Some("u"), Some("v"), None] {
        for limit in [1, 4, 50] {
            let (mut got, mut before, mut pages) = (Vec::new(), TaskCursor::START, 0);
            loop {
                let q = TaskQuery { user_id: user.map(str::to_owned), before: before.clone(), limit };
                let page = store.list_tasks(&q).await.unwrap();
                assert!(page.tasks.len() <= limit);
                assert!(page.tasks.iter().all(|r| user.is_none_or(|u| r.user_id == u)), "another tenant's task");
                got.extend(page.tasks.iter().map(|r| (r.created_at_ms, r.task_id.clone())));
                pages += 1;
                assert!(pages < 100, "the listing does not end");
                match page.next {
                    Some(next) => {
                        assert_eq!(TaskCursor::from_token(&next.token()), Some(next.clone()));
                        before = next;
                    }
                    None => break,
                }
            }
            assert_eq!(got, newest_first(user), "{user:?} by {limit}");
        }
    }
    // A task submitted between two pages is not on the later ones; nothing repeats.
    let q = TaskQuery { user_id: Some("u".into()), before: TaskCursor::START, limit: 3 };
    let first = store.list_tasks(&q).await.unwrap();
    let mut newer = record("task_zz_new", TaskState::Working, None);
    newer.user_id = "u".into();
    newer.created_at_ms = 2000;
    store.write(Write::Task(newer));
    store.flush().await.unwrap();
    let q = TaskQuery { user_id: Some("u".into()), before: first.next.unwrap(), limit: 500 };
    let rest = store.list_tasks(&q).await.unwrap();
    assert_eq!(first.tasks.len() + rest.tasks.len(), newest_first(Some("u")).len());
    assert!(rest.tasks.iter().all(|r| r.task_id != "task_zz_new" && !first.tasks.contains(r)));
    // Purged tasks leave the listing, and a reopened store lists the same.
    assert!(store.purge(Duration::from_secs(0)).await.unwrap() > 0);
    let q = TaskQuery { user_id: None, before: TaskCursor::START, limit: 500 };
    let left = store.list_tasks(&q).await.unwrap();
    assert_eq!(left.tasks.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(), ["task_zz_new"]);
    drop(store);
    let store = b.open().await;
    assert_eq!(store.list_tasks(&q).await.unwrap(), left);
    assert_eq!(TaskCursor::from_token("nope"), None);
}

/// Regression (second-tenant attack on main): plugin state was keyed by plugin only, so a
/// task of user B read and overwrote what user A's task of the same plugin had stored
/// (transcripts, remote context ids), and one user filling the plugin's byte budget left
/// no room for any other. State is per plugin per user: A's writes are invisible to B,
/// B's cannot touch A's, and each user has a budget of its own — on a store, after a
/// restart too.
async fn regression_one_tenant_filled_the_plugin_state_of_every_tenant(b: &Backend) {
    use warden::config::Budgets;
    use warden::services::{StateError, StateNamespace, StateStore};
    let budgets = Budgets { max_state_bytes_per_plugin: 300, ..Budgets::default() };
    let (alice, bob) = (StateNamespace::new("a2a", "alice"), StateNamespace::new("a2a", "bob"));
    {
        let state = StateStore::default();
        state.attach(b.open().await).await.unwrap();
        state.set(&alice, "context/t1", b"alice-remote-context".to_vec(), &budgets).await.unwrap();
        assert!(state.get(&bob, "context/t1").await.unwrap().is_none(), "B reads nothing of A's");
        state.set(&bob, "context/t1", b"bob's".to_vec(), &budgets).await.unwrap();
        state.delete(&bob, "context/t1").await.unwrap();
        assert_eq!(state.get(&alice, "context/t1").await.unwrap().as_deref(), Some(&b"alice-remote-context"[..]));
        // A fills its budget: A is refused, B still writes.
        state.set(&alice, "fill", vec![0; 260], &budgets).await.unwrap();
        let over = state.set(&alice, "more", vec![0; 10], &budgets).await.unwrap_err();
        assert!(matches!(&over, StateError::Budget(e) if e.key == "max_state_bytes_per_plugin"), "{over:?}");
        state.set(&bob, "context/t2", vec![1; 250], &budgets).await.unwrap();
        assert_eq!(state.bytes_held(&bob).await.unwrap(), 260);
    }
    // After a restart each namespace is still its own, with its own budget.
    let state = StateStore::default();
    state.attach(b.open().await).await.unwrap();
    assert_eq!(state.get(&alice, "context/t1").await.unwrap().as_deref(), Some(&b"alice-remote-context"[..]));
    assert!(state.get(&bob, "context/t1").await.unwrap().is_none());
    assert_eq!(state.get(&bob, "context/t2").await.unwrap(), Some(vec![1; 250]));
    assert!(matches!(state.set(&alice, "more", vec![0; 10], &budgets).await, Err(StateError::Budget(_))));
    state.set(&bob, "more", vec![0; 10], &budgets).await.unwrap();
}

/// Plugin state not written for the retention expires with the retention sweep; what was
/// written since stays, and write times survive a restart (expiry counts from the write,
/// not from when the store was opened). An entry from before write times were kept (no
/// time) goes with the first sweep.
async fn plugin_state_unwritten_past_retention_expires(b: &Backend) {
    use warden::config::Budgets;
    use warden::services::{StateNamespace, StateStore};
    let budgets = Budgets::default();
    let ns = StateNamespace::new("claude", "alice");
    let retention = Duration::from_millis(700);
    {
        let store = b.open().await;
        let state = StateStore::default();
        state.attach(store.clone()).await.unwrap();
        state.set(&ns, "transcript/old", b"old".to_vec(), &budgets).await.unwrap();
        state.set(&ns, "transcript/rewritten", b"v1".to_vec(), &budgets).await.unwrap();
        // Stored by a warden from before write times: counts as written at 0.
        store.write(Write::StateSet {
            namespace: "claude".into(),
            key: "legacy".into(),
            value: b"x".to_vec(),
            written_at_ms: 0,
        });
        store.flush().await.unwrap();
        tokio::time::sleep(retention + Duration::from_millis(300)).await;
        state.set(&ns, "transcript/rewritten", b"v2".to_vec(), &budgets).await.unwrap();
        state.set(&ns, "transcript/new", b"new".to_vec(), &budgets).await.unwrap();
        let bytes_before = state.bytes_held(&ns).await.unwrap();
        state.expire(retention).await.unwrap();
        assert!(state.get(&ns, "transcript/old").await.unwrap().is_none(), "not written within the retention");
        assert_eq!(state.get(&ns, "transcript/rewritten").await.unwrap().as_deref(), Some(&b"v2"[..]));
        assert_eq!(state.get(&ns, "transcript/new").await.unwrap().as_deref(), Some(&b"new"[..]));
        assert_eq!(state.bytes_held(&ns).await.unwrap(), bytes_before - ("transcript/old".len() + 3) as u64);
        let kept: Vec<String> = store.state_all().await.unwrap().into_iter().map(|e| e.key).collect();
        assert_eq!(kept, ["transcript/new", "transcript/rewritten"], "the store lost the same entries");
    }
    // Restarted: the kept entries keep their write times, so they expire one retention
    // after they were written, not after the restart.
    tokio::time::sleep(retention + Duration::from_millis(300)).await;
    let state = StateStore::default();
    state.attach(b.open().await).await.unwrap();
    assert_eq!(state.get(&ns, "transcript/new").await.unwrap().as_deref(), Some(&b"new"[..]), "kept until the sweep");
    state.set(&ns, "transcript/fresh", b"f".to_vec(), &budgets).await.unwrap();
    state.expire(retention).await.unwrap();
    assert!(state.get(&ns, "transcript/new").await.unwrap().is_none());
    assert!(state.get(&ns, "transcript/rewritten").await.unwrap().is_none());
    assert_eq!(state.get(&ns, "transcript/fresh").await.unwrap().as_deref(), Some(&b"f"[..]));
    assert_eq!(state.bytes_held(&ns).await.unwrap(), ("transcript/fresh".len() + 1) as u64);
}

/// Issue 49: the egress board of replicas on PostgreSQL. A replica reads the narrowings the
/// *other* live replicas' calls hold in a session (never its own, never another session's),
/// a withdrawn hold is gone at once, a dead replica's holds lapse with its lease, and a
/// replica starting again under its id clears what its earlier life left.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_egress_holds_are_shared_per_session_and_lapse_with_their_replica() {
    use warden::store::StoreEgressBoard;
    use warden_sandbox::{EgressBoard, SessionKey, SharedNarrowing};
    let b = Backend::postgres().await;
    let store = b.open().await;
    let alive = now_ms() + 60_000;
    for r in ["r1", "r2"] {
        assert_eq!(store.register_replica(r, &format!("{r}-life1"), alive, None).await.unwrap(), None);
    }
    let r1 = StoreEgressBoard::open(store.clone(), "r1".into()).await.unwrap().expect("a shared store");
    let r2 = StoreEgressBoard::open(store.clone(), "r2".into()).await.unwrap().expect("a shared store");
    let (k, other) = (SessionKey::new("u", "s"), SessionKey::new("u", "s2"));
    let list = |host: &str| vec![SharedNarrowing { source: "the task (egress)".into(), allow: vec![host.into()] }];
    r1.publish(&k, 7, &list("pypi.org")).await.unwrap();
    r1.publish(&other, 8, &list("example.com")).await.unwrap();
    assert_eq!(r2.others(&k).await.unwrap(), list("pypi.org"), "r2 reads r1's hold in the session");
    assert_eq!(r1.others(&k).await.unwrap(), vec![], "never its own");
    assert_eq!(r2.others(&other).await.unwrap(), list("example.com"), "per session");
    r1.withdraw(&k, 7).await;
    assert_eq!(r2.others(&k).await.unwrap(), vec![], "withdrawn");
    // r1 holds again and dies: its lease runs out, its holds lapse.
    r1.publish(&k, 9, &list("pypi.org")).await.unwrap();
    assert_eq!(r2.others(&k).await.unwrap(), list("pypi.org"), "the control: held");
    assert_eq!(store.register_replica("r1", "r1-life1", now_ms() - 1, None).await.unwrap(), None);
    assert_eq!(r2.others(&k).await.unwrap(), vec![], "a dead replica's holds lapse");
    // r1 comes back: what its earlier life left is cleared, not revived.
    assert_eq!(store.register_replica("r1", "r1-life2", alive, Some(now_ms())).await.unwrap(), None);
    StoreEgressBoard::open(store.clone(), "r1".into()).await.unwrap();
    assert_eq!(r2.others(&k).await.unwrap(), vec![], "cleared at the replica's start");
    assert_eq!(r2.others(&other).await.unwrap(), vec![]);
    b.finish().await;
}
