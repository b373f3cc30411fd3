-- 0001: the task store's three tables, as the redb backend keeps them.
-- Applied once per database by warden at open (host/src/store/postgres.rs), recorded in
-- warden_migrations; never edit an applied migration, add the next numbered file.

-- One row per task. `record` is the whole TaskRecord as JSON and is authoritative; the
-- other columns copy the fields that lookups and the retention purge filter on.
-- `json`, not `jsonb`: the text is kept as written, so a `\u0000` escape in a task's
-- output is stored (jsonb refuses it), and nothing queries inside the document.
CREATE TABLE tasks (
    task_id        text   PRIMARY KEY,
    principal      text,
    user_id        text   NOT NULL,
    session_id     text   NOT NULL,
    status         text   NOT NULL,
    created_at_ms  bigint NOT NULL,
    updated_at_ms  bigint NOT NULL,
    finished_at_ms bigint,
    record         json   NOT NULL
);
-- retention purge: finished tasks by finish time
CREATE INDEX tasks_finished_at ON tasks (finished_at_ms) WHERE finished_at_ms IS NOT NULL;
-- listings newest first, and recovery of unfinished tasks at start
CREATE INDEX tasks_created_at ON tasks (created_at_ms);
-- a principal's tasks (operator listings)
CREATE INDEX tasks_principal ON tasks (principal, created_at_ms);
-- a session's tasks (A2A context lookups)
CREATE INDEX tasks_session ON tasks (session_id);

-- A task's events in sequence order; `seq` is the SSE event id (Last-Event-ID).
CREATE TABLE events (
    task_id text   NOT NULL,
    seq     bigint NOT NULL,
    event   json   NOT NULL,
    PRIMARY KEY (task_id, seq)
);

-- Plugin key/value state (the `state` capability). Keys are bytes: a plugin's key is any
-- UTF-8 string, NUL included, which PostgreSQL text cannot hold.
CREATE TABLE plugin_state (
    plugin text  NOT NULL,
    key    bytea NOT NULL,
    value  bytea NOT NULL,
    PRIMARY KEY (plugin, key)
);
