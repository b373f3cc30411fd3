-- 0005: the import journal of durable tasks (host/src/journal.rs). One row per entry of a
-- task's journal: `seq` 0 is the header (what the task ran: its call and plugin build),
-- then one row per import call its plugin made, in order. An entry written `started` is
-- rewritten `done` with its result (the upsert in host/src/store/postgres.rs, `commit`).
-- Purged with its task (`purge_finished_before`).
CREATE TABLE journal (
    task_id text   NOT NULL,
    seq     bigint NOT NULL,
    entry   json   NOT NULL,
    PRIMARY KEY (task_id, seq)
);
