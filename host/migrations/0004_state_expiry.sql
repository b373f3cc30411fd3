-- 0004: plugin state expires. Each entry records when it was last written; the retention
-- sweep (store.retention, the one that purges finished tasks) deletes entries not
-- written since (host/src/store/postgres.rs, `state_expire`).
--
-- The `plugin` column now holds a state namespace, `<plugin>/<user>` (one plugin's state
-- for one user). Rows from before hold the bare plugin id, which no namespace matches:
-- they count as written at 0, so the first sweep after this migration removes them.
-- (Version 3 is another migration's; versions need not be applied in order.)
ALTER TABLE plugin_state ADD COLUMN written_at_ms bigint NOT NULL DEFAULT 0;
-- the retention sweep: entries by last write
CREATE INDEX plugin_state_written_at ON plugin_state (written_at_ms);
