-- 0003: task listings by keyset. `GET /v1/tasks` pages newest first by
-- (created_at_ms, task_id) and continues strictly before the previous page's last task,
-- so each page is an index range scan, whatever its depth (no OFFSET, no full scan).
-- `task_id` is ordered bytewise (COLLATE "C"), as the embedded store orders it.

-- every user's tasks (an admin's listing)
CREATE INDEX tasks_listing ON tasks (created_at_ms DESC, task_id COLLATE "C" DESC);
-- one user's tasks (a tenant's listing: only ever its own)
CREATE INDEX tasks_user_listing ON tasks (user_id, created_at_ms DESC, task_id COLLATE "C" DESC);
