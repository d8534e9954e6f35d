-- tollgate 0001 (PostgreSQL): rate-limit rules and the violation audit log.
-- Idempotent: tollgate::sql::migrate runs it when the tables are missing; it can also be
-- run by any migration tool.

CREATE TABLE IF NOT EXISTS RateLimitRule (
    rule_id          BIGSERIAL PRIMARY KEY,
    key_pattern      VARCHAR(128) NOT NULL,  -- e.g. 'user:{user_id}', 'endpoint:/api/search'
    scope            VARCHAR(32)  NOT NULL,  -- 'user', 'endpoint', 'global', 'ip'
    rate_per_second  FLOAT        NOT NULL,  -- tokens added per second
    burst_capacity   INT          NOT NULL,  -- most tokens in the bucket
    plan             VARCHAR(32),            -- NULL: every plan
    is_active        BOOLEAN      NOT NULL DEFAULT TRUE,
    description      TEXT,
    created_at       TIMESTAMPTZ  NOT NULL DEFAULT NOW(),
    UNIQUE (key_pattern, plan)
);

-- One row per refusal by one limit (tollgate::audit::Violation).
CREATE TABLE IF NOT EXISTS RateLimitViolation (
    violation_id     BIGSERIAL PRIMARY KEY,
    bucket_key       VARCHAR(256) NOT NULL,  -- the key as logs show it (hashed unless an address)
    user_id          BIGINT,                 -- not written by tollgate: for the application
    ip_address       INET,                   -- the client's address, when known
    endpoint         VARCHAR(255),           -- matched route template, else the path
    requested_at     TIMESTAMPTZ  NOT NULL DEFAULT NOW(),
    tokens_at_time   FLOAT        NOT NULL,  -- whole tokens left when refused
    rule_id          BIGINT,                 -- RateLimitRule.rule_id, by value (no constraint)
    limit_name       VARCHAR(128) NOT NULL,
    cost             BIGINT       NOT NULL DEFAULT 1,
    retry_after_ms   BIGINT,                 -- NULL: no wait helps (cost beyond the burst)
    shadow           BOOLEAN      NOT NULL DEFAULT FALSE  -- a shadow limit's "would refuse"
);

CREATE INDEX IF NOT EXISTS idx_violation_user ON RateLimitViolation (user_id, requested_at DESC);
CREATE INDEX IF NOT EXISTS idx_violation_ip   ON RateLimitViolation (ip_address, requested_at DESC);
CREATE INDEX IF NOT EXISTS idx_violation_rule ON RateLimitViolation (rule_id, requested_at DESC);
