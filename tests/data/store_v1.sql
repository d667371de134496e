-- A trajectory store as mtrl wrote it at schema version 1 (commit 9dfd155), dumped with sqlite3's iterdump:
-- one completed rollout of two turns (the first with <think> reasoning and a tool call), a tool call, a reward.
BEGIN TRANSACTION;
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL                      -- JSON
);
INSERT INTO "meta" VALUES('schema_version','1');
CREATE TABLE metrics (
    step      INTEGER NOT NULL,
    name      TEXT NOT NULL,
    value     REAL NOT NULL,
    wall_time REAL NOT NULL
);
CREATE TABLE rollouts (
    id               TEXT PRIMARY KEY,
    task_id          TEXT NOT NULL REFERENCES tasks(id),
    group_id         TEXT NOT NULL,
    status           TEXT NOT NULL,
    reward           REAL,
    turn_rewards     TEXT,                   -- JSON list or NULL
    reward_defaulted INTEGER NOT NULL,
    metrics          TEXT NOT NULL,          -- JSON object
    error            TEXT,
    policy_version   INTEGER NOT NULL,
    step             INTEGER,
    token_hash       TEXT NOT NULL,          -- sha256 hex of the bearer token, never the token
    created_at       REAL NOT NULL,
    finished_at      REAL,
    trained_step     INTEGER                 -- the step that consumed it; NULL until trained
);
INSERT INTO "rollouts" VALUES('r1','t1','g1','completed',1.0,NULL,0,'{"field_acc":1.0}',NULL,2,3,'1a7674eb4ee78df7e1ac439a93c3fa8e3c945784d4dec9fd8e3011738b2f1d62',1.0,1.79560716229924154279e+09,NULL);
CREATE TABLE tasks (
    id           TEXT PRIMARY KEY,
    prompt       TEXT,
    messages     TEXT,                       -- JSON list or NULL
    ground_truth TEXT NOT NULL,              -- JSON
    split        TEXT NOT NULL,
    data         TEXT NOT NULL               -- JSON object
);
INSERT INTO "tasks" VALUES('t1','Inspect aircraft N123',NULL,'{"ok":true}','train','{}');
CREATE TABLE tool_calls (
    rollout_id TEXT NOT NULL REFERENCES rollouts(id),
    seq        INTEGER NOT NULL,             -- order of arrival within the rollout
    call_id    TEXT,
    name       TEXT NOT NULL,
    arguments  TEXT NOT NULL,                -- JSON
    result     TEXT NOT NULL,                -- JSON
    error      TEXT,
    status     TEXT NOT NULL,
    latency_s  REAL NOT NULL,
    turn_index INTEGER,
    started_at REAL NOT NULL,
    PRIMARY KEY (rollout_id, seq)
);
INSERT INTO "tool_calls" VALUES('r1',0,'c1','logbook','{"tail":"N123"}','"clean"',NULL,'success',0.0,0,2.5);
CREATE TABLE turns (
    rollout_id          TEXT NOT NULL REFERENCES rollouts(id),
    idx                 INTEGER NOT NULL,
    messages            TEXT NOT NULL,       -- JSON list
    tools               TEXT NOT NULL,       -- JSON list
    prompt_prefix_len   INTEGER NOT NULL,    -- leading ids taken from the previous turn
    prompt_ids          BLOB NOT NULL,       -- int32 LE, the ids after the prefix
    completion_ids      BLOB NOT NULL,       -- int32 LE
    logprobs            BLOB NOT NULL,       -- float64 LE, one per completion id
    finish_reason       TEXT NOT NULL,
    completion_text     TEXT NOT NULL,
    tool_calls          TEXT NOT NULL,       -- JSON list (OpenAI format)
    policy_version      INTEGER NOT NULL,
    segment             INTEGER NOT NULL,
    break_reason        TEXT,
    malformed_tool_call INTEGER NOT NULL,
    started_at          REAL NOT NULL,
    latency_s           REAL NOT NULL,
    PRIMARY KEY (rollout_id, idx)
);
INSERT INTO "turns" VALUES('r1',0,'[{"role":"user","content":"Inspect aircraft N123"}]','[]',0,X'010000000200000003000000',X'0A0000000B0000000C0000000D000000',X'000000000000E0BF000000000000D0BF000000000000C0BF000000000000F0BF','tool_calls','<think>
The logbook first.
</think>

<tool_call>
{"name": "logbook", "arguments": {"tail": "N123"}}
</tool_call>','[{"id":"c1","type":"function","function":{"name":"logbook","arguments":"{\"tail\": \"N123\"}"}}]',2,0,NULL,0,2.0,0.5);
INSERT INTO "turns" VALUES('r1',1,'[{"role":"user","content":"Inspect aircraft N123"},{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"logbook","arguments":"{\"tail\": \"N123\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"clean"}]','[]',7,X'1400000015000000',X'1E0000001F000000',X'000000000000E8BF00000000000000C0','stop','Airworthy.','[]',2,0,NULL,0,3.0,0.25);
CREATE INDEX rollouts_by_step ON rollouts(step);
CREATE INDEX rollouts_by_group ON rollouts(group_id);
CREATE INDEX rollouts_by_status ON rollouts(status);
CREATE INDEX rollouts_by_trained ON rollouts(trained_step);
CREATE INDEX metrics_by_name ON metrics(name, step);
COMMIT;
