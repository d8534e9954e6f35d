-- tollgate 0002 (SQLite): the plan of each API key, for rules with a plan read by key
-- (tollgate::sql::SqlSourceOptions::plan_by_key). Idempotent, as 0001.

CREATE TABLE IF NOT EXISTS RateLimitPlanKey (
    api_key          VARCHAR(256) PRIMARY KEY,  -- the key as requests carry it
    plan             VARCHAR(32)  NOT NULL,     -- a RateLimitRule.plan
    is_active        BOOLEAN      NOT NULL DEFAULT TRUE,  -- false: the default plan
    created_at       TEXT         NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
