-- 0002: replicas. Several `warden serve` processes on one database share the work
-- through these two tables (host/src/store/postgres.rs owns every statement on them).

-- One row per task that has not finished. A task is claimable by any replica while
-- `owner` is NULL (then `submission` holds what running it needs); once a replica runs
-- it, or holds it because its secrets live only in that replica's memory (`submission`
-- NULL), `owner` names the replica and `lease_until_ms` is when the task counts as lost
-- unless the owner renews it. The row goes in the transaction that finishes the task.
CREATE TABLE task_queue (
    task_id          text    PRIMARY KEY,
    owner            text,
    lease_until_ms   bigint,
    submission       json,
    cancel_requested boolean NOT NULL DEFAULT false,
    queued_at_ms     bigint  NOT NULL
);
-- claims, oldest first; the cluster-wide queue count
CREATE INDEX task_queue_unclaimed ON task_queue (queued_at_ms) WHERE owner IS NULL;
-- lease renewal and the reaper
CREATE INDEX task_queue_owner ON task_queue (owner, lease_until_ms) WHERE owner IS NOT NULL;

-- Approval requests waiting for a person, published by the replica whose gate holds
-- the call (`owner`), so that any replica can list and decide them. A decision made
-- elsewhere is written to `decision`; the owner applies it to its gate and deletes the
-- row, as it does when the request is resolved any other way.
CREATE TABLE approvals (
    request_id    text   PRIMARY KEY,
    task_id       text,
    owner         text   NOT NULL,
    pending       json   NOT NULL,
    decision      json,
    created_at_ms bigint NOT NULL
);
CREATE INDEX approvals_decided ON approvals (owner) WHERE decision IS NOT NULL;

-- The replicas working on this database: each process registers its replica id with an
-- instance id of its own and renews `alive_until_ms` with its leases, so a second
-- process started with an id that a running one uses is refused instead of both
-- taking each other's tasks.
CREATE TABLE replicas (
    replica_id     text   PRIMARY KEY,
    instance       text   NOT NULL,
    alive_until_ms bigint NOT NULL,
    started_at_ms  bigint NOT NULL
);
