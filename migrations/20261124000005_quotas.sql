-- Quotas at enqueue (DESIGN §8): runs per hour, concurrent runs and daily tokens, per user and
-- per tenant (from configuration), and per user and tenant for one agent's runs (its
-- `governance`). shared/src/quota.rs resolves which counters a run has; a counter is keyed by
-- (tenant_id, owner_id, agent_id), `owner_id` '' for the whole tenant, `agent_id` '' for every
-- agent.
--
-- Runs per hour and concurrent runs live in `quota_slots`: each counter is split into eight
-- shards, shard i holding at most spool_quota_cap(limit, i) of the limit (the caps add up to
-- the limit exactly). A run takes room in one shard; a shard is only ever changed by a
-- transaction holding its row lock and never past its cap, so a counter never admits more
-- than its limit, across any number of API processes. Room is taken, and given back, with
-- SKIP LOCKED, in a random shard: enqueues of one tenant do not queue behind each other's
-- commits (one row per counter did: with every quota set, P1 fell from 2,723 to 1,832
-- requests/s), and no transaction ever waits for a shard while holding another, so they
-- cannot deadlock on them. A run is refused only when no shard has room in the committed
-- state; a shard with room that another transaction holds (for the few hundred microseconds of
-- its commit) is waited for by polling.
-- * `active_runs`: runs enqueued under a concurrency limit that have not ended. Added at the
--   enqueue's commit, given back at the commit of the transaction that ends the run or deletes
--   it while active (from any shard with some: shards are interchangeable, only their sum
--   counts).
-- * `window_started_at`, `window_runs`: a fixed one-hour window per shard, which starts with
--   the first run after its previous window ended (as GitHub's hourly API limit does);
--   `Retry-After` is the earliest end of a full shard's window.
-- A counter with both limits keeps both in one shard row, so a run takes room for both at
-- once; near both limits at the same time a run may be refused with room left in total
-- (never admitted past one).
CREATE TABLE quota_slots (
    tenant_id         text        NOT NULL,
    owner_id          text        NOT NULL,
    agent_id          text        NOT NULL,
    shard             smallint    NOT NULL,
    active_runs       integer     NOT NULL DEFAULT 0,
    window_started_at timestamptz NOT NULL DEFAULT now(),
    window_runs       integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, owner_id, agent_id, shard)
);

-- Daily token budgets: tokens (prompt + generated) of the UTC day, charged by the workers
-- after each model call of a run under a budget (shared/src/db/quota.rs), read by the
-- enqueue.
CREATE TABLE quota_counters (
    tenant_id  text   NOT NULL,
    owner_id   text   NOT NULL,
    agent_id   text   NOT NULL,
    day        date   NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')::date,
    day_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, owner_id, agent_id)
);

-- The counters a run is admitted against, with the limits that applied at enqueue
-- (`{"counters": [{"owner_id", "agent_id", "limits": {...}}]}`, shared/src/quota.rs); NULL
-- when none applied. The worker charges tokens to those with a `daily_token_budget` and stops
-- the run when one is spent; `runs_quota_release` gives back the room of those with
-- `max_concurrent_runs`.
ALTER TABLE runs ADD COLUMN quota jsonb;

-- Shard `shard`'s part of `lim` (the eight parts add up to `lim`).
CREATE FUNCTION spool_quota_cap(lim bigint, shard smallint) RETURNS bigint
    LANGUAGE sql IMMUTABLE AS $$ SELECT (lim - shard + 7) / 8 $$;

-- Takes room for one run in a shard of the counter (tenant, owner, agent) under `active_max`
-- concurrent runs and `rate_max` runs per hour (NULL: that limit does not apply). Returns
-- NULL when it took room, else the refusal (JSON, without the counter's key).
CREATE FUNCTION spool_quota_take(tenant text, owner text, agent text,
                                 active_max bigint, rate_max bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    taken smallint;
    tries integer := 0;
    pick smallint := floor(random() * 8)::smallint;
BEGIN
    -- First one random shard, by its key: far from the limit it has room, and that is cheaper
    -- than choosing among the eight (`pick` NULL, from the second try on).
    LOOP
        UPDATE quota_slots q
           SET active_runs = q.active_runs + (active_max IS NOT NULL)::int,
               window_runs = CASE WHEN rate_max IS NULL THEN q.window_runs
                                  WHEN q.window_started_at <= now() - interval '1 hour' THEN 1
                                  ELSE q.window_runs + 1 END,
               window_started_at = CASE WHEN rate_max IS NOT NULL
                                         AND q.window_started_at <= now() - interval '1 hour'
                                        THEN now() ELSE q.window_started_at END
         WHERE (q.tenant_id, q.owner_id, q.agent_id, q.shard) =
               (SELECT s.tenant_id, s.owner_id, s.agent_id, s.shard FROM quota_slots s
                 WHERE s.tenant_id = tenant AND s.owner_id = owner AND s.agent_id = agent
                   AND (pick IS NULL OR s.shard = pick)
                   AND (active_max IS NULL
                        OR s.active_runs < spool_quota_cap(active_max, s.shard))
                   AND (rate_max IS NULL
                        OR s.window_started_at <= now() - interval '1 hour'
                        OR s.window_runs < spool_quota_cap(rate_max, s.shard))
                 ORDER BY random() LIMIT 1
                   FOR UPDATE SKIP LOCKED)
        RETURNING q.shard INTO taken;
        IF FOUND THEN
            RETURN NULL;
        END IF;
        IF pick IS NOT NULL THEN
            pick := NULL;
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM quota_slots s
                        WHERE s.tenant_id = tenant AND s.owner_id = owner
                          AND s.agent_id = agent) THEN
            -- The counter's first run: make its shards (a racing first run makes them too).
            INSERT INTO quota_slots (tenant_id, owner_id, agent_id, shard)
            SELECT tenant, owner, agent, g FROM generate_series(0, 7) AS g
            ON CONFLICT DO NOTHING;
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM quota_slots s
                        WHERE s.tenant_id = tenant AND s.owner_id = owner AND s.agent_id = agent
                          AND (active_max IS NULL
                               OR s.active_runs < spool_quota_cap(active_max, s.shard))
                          AND (rate_max IS NULL
                               OR s.window_started_at <= now() - interval '1 hour'
                               OR s.window_runs < spool_quota_cap(rate_max, s.shard))) THEN
            -- No shard has room, as committed: refused.
            IF active_max IS NOT NULL
               AND (SELECT sum(active_runs) FROM quota_slots s
                     WHERE s.tenant_id = tenant AND s.owner_id = owner
                       AND s.agent_id = agent) >= active_max THEN
                RETURN jsonb_build_object('code', 'concurrency_limited', 'limit', active_max);
            END IF;
            RETURN jsonb_build_object('code', 'rate_limited', 'limit', rate_max,
                'retry_after',
                (SELECT min(extract(epoch FROM s.window_started_at + interval '1 hour' - now()))
                   FROM quota_slots s
                  WHERE s.tenant_id = tenant AND s.owner_id = owner AND s.agent_id = agent
                    AND spool_quota_cap(rate_max, s.shard) > 0));
        END IF;
        -- A shard with room is held by a transaction that is committing: poll.
        tries := tries + 1;
        PERFORM pg_sleep(least(0.0002 * tries, 0.01));
    END LOOP;
END
$$;

-- Admission, at the enqueue's COMMIT (a deferred trigger, after every other statement of the
-- transaction): refuses the run, with SQLSTATE SQ429 and the refusal as JSON in DETAIL (read by
-- shared/src/db/quota.rs), when a budget is spent or a counter has no room; the failed COMMIT
-- rolls everything back, room taken included.
CREATE FUNCTION spool_quota_admit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c record;
    refusal jsonb;
BEGIN
    FOR c IN SELECT * FROM jsonb_to_recordset(NEW.quota->'counters')
                        AS x(owner_id text, agent_id text, limits jsonb)
              ORDER BY owner_id, agent_id
    LOOP
        refusal := NULL;
        IF c.limits ? 'daily_token_budget' THEN
            SELECT jsonb_build_object('code', 'budget_exceeded',
                       'limit', (c.limits->>'daily_token_budget')::bigint,
                       'retry_after',
                       extract(epoch FROM (k.day + 1)::timestamp AT TIME ZONE 'UTC' - now()))
              INTO refusal
              FROM quota_counters k
             WHERE k.tenant_id = NEW.tenant_id AND k.owner_id = c.owner_id
               AND k.agent_id = c.agent_id AND k.day = (now() AT TIME ZONE 'UTC')::date
               AND k.day_tokens >= (c.limits->>'daily_token_budget')::bigint;
        END IF;
        IF refusal IS NULL AND c.limits ?| ARRAY['max_concurrent_runs', 'runs_per_hour'] THEN
            refusal := spool_quota_take(NEW.tenant_id, c.owner_id, c.agent_id,
                                        (c.limits->>'max_concurrent_runs')::bigint,
                                        (c.limits->>'runs_per_hour')::bigint);
        END IF;
        IF refusal IS NOT NULL THEN
            RAISE EXCEPTION 'quota reached: %', refusal->>'code'
                USING ERRCODE = 'SQ429',
                      DETAIL = (refusal || jsonb_build_object('owner_id', c.owner_id,
                                                              'agent_id', c.agent_id))::text;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER runs_quota_admit
    AFTER INSERT ON runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.quota IS NOT NULL)
    EXECUTE FUNCTION spool_quota_admit();

-- Release, at the COMMIT of the transaction that ends a run (or deletes it while active, as
-- erasing its thread does): one run's room in each counter with a concurrency limit, from any
-- shard that has some (SKIP LOCKED, polling like the take).
CREATE FUNCTION spool_quota_release() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c record;
    tries integer;
    run runs;
BEGIN
    IF TG_OP = 'DELETE' THEN
        run := OLD;
    ELSE
        run := NEW;
    END IF;
    FOR c IN SELECT * FROM jsonb_to_recordset(run.quota->'counters')
                        AS x(owner_id text, agent_id text, limits jsonb)
              WHERE limits ? 'max_concurrent_runs'
              ORDER BY owner_id, agent_id
    LOOP
        tries := 0;
        LOOP
            UPDATE quota_slots q SET active_runs = q.active_runs - 1
             WHERE (q.tenant_id, q.owner_id, q.agent_id, q.shard) =
                   (SELECT s.tenant_id, s.owner_id, s.agent_id, s.shard FROM quota_slots s
                     WHERE s.tenant_id = run.tenant_id AND s.owner_id = c.owner_id
                       AND s.agent_id = c.agent_id AND s.active_runs > 0
                     ORDER BY random() LIMIT 1
                       FOR UPDATE SKIP LOCKED);
            EXIT WHEN FOUND;
            EXIT WHEN NOT EXISTS (SELECT 1 FROM quota_slots s
                                   WHERE s.tenant_id = run.tenant_id
                                     AND s.owner_id = c.owner_id
                                     AND s.agent_id = c.agent_id AND s.active_runs > 0);
            tries := tries + 1;
            PERFORM pg_sleep(least(0.0002 * tries, 0.01));
        END LOOP;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER runs_quota_release
    AFTER UPDATE OF status ON runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.quota IS NOT NULL
          AND OLD.status IN ('queued', 'running', 'requires_action', 'awaiting_approval')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION spool_quota_release();

CREATE CONSTRAINT TRIGGER runs_quota_release_deleted
    AFTER DELETE ON runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (OLD.quota IS NOT NULL
          AND OLD.status IN ('queued', 'running', 'requires_action', 'awaiting_approval'))
    EXECUTE FUNCTION spool_quota_release();
