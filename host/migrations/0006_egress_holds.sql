-- 0006: the egress narrowings of running tool calls, shared between replicas
-- (warden_sandbox::EgressBoard, host/src/store/egress_board.rs). A session's connections may be
-- served by any replica with a channel into its container; each judges them by the lists
-- of every running call of the session, on whichever replica it runs. One row per held
-- call; withdrawn when the call ends, and ignored once its replica's lease
-- (replicas.alive_until_ms) has run out, so a dead replica's holds lapse with it.
CREATE TABLE egress_holds (
    user_id    text   NOT NULL,
    session_id text   NOT NULL,
    replica_id text   NOT NULL,
    hold_id    bigint NOT NULL,
    narrowings json   NOT NULL,
    PRIMARY KEY (replica_id, hold_id)
);
CREATE INDEX egress_holds_session ON egress_holds (user_id, session_id);
