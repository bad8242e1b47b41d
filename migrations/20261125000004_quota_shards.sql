-- Quota counters in 32 shards instead of 8, and the first shard a run tries is one whose part
-- of the limit is not 0.
--
-- A shard stays locked from the enqueue's COMMIT trigger to the end of that commit (its WAL
-- flush). With 16 enqueues committing at once and 8 shards, the random first pick was often
-- locked (a second statement to choose among the rest) and sometimes every shard with room was
-- (a poll with pg_sleep). pgbench, tests/bench/enqueue.sql with every quota set, 16 clients,
-- alternating in one session: 8 shards 1,109-1,271 transactions/s, 32 shards 1,320-1,466,
-- against 1,717-2,079 without quotas (BENCHMARKS.md). 64 shards measured the same as 32.
--
-- Counters made before keep their 8 shards: their counts sit in shards sized for 8, and the
-- limits live in each run's `quota`, not here, so their counts cannot be spread anew without
-- possibly admitting past a limit. Each row says how many shards its counter has; shard i's
-- part of a limit `lim` is spool_quota_cap(lim, i, shards), and the parts add up to `lim`.
ALTER TABLE quota_slots ADD COLUMN shards smallint NOT NULL DEFAULT 8;

CREATE FUNCTION spool_quota_cap(lim bigint, shard smallint, shards smallint) RETURNS bigint
    LANGUAGE sql IMMUTABLE AS $$ SELECT (lim - shard + shards - 1) / shards $$;

-- Takes room for one run in a shard of the counter (tenant, owner, agent) under `active_max`
-- concurrent runs and `rate_max` runs per hour (NULL: that limit does not apply). Returns
-- NULL when it took room, else the refusal (JSON, without the counter's key).
CREATE OR REPLACE FUNCTION spool_quota_take(tenant text, owner text, agent text,
                                 active_max bigint, rate_max bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    taken smallint;
    tries integer := 0;
    -- A shard that can hold room (shard i's part of a limit is 0 when i >= the limit).
    pick smallint := floor(random() * least(32, coalesce(active_max, rate_max),
                                            coalesce(rate_max, active_max)))::smallint;
BEGIN
    -- First one random shard, by its key: far from the limit it has room, and that is cheaper
    -- than choosing among them all (`pick` NULL, from the second try on; also when the
    -- counter has fewer shards than `pick`).
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
                        OR s.active_runs < spool_quota_cap(active_max, s.shard, s.shards))
                   AND (rate_max IS NULL
                        OR s.window_started_at <= now() - interval '1 hour'
                        OR s.window_runs < spool_quota_cap(rate_max, s.shard, s.shards))
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
            INSERT INTO quota_slots (tenant_id, owner_id, agent_id, shard, shards)
            SELECT tenant, owner, agent, g, 32 FROM generate_series(0, 31) AS g
            ON CONFLICT DO NOTHING;
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM quota_slots s
                        WHERE s.tenant_id = tenant AND s.owner_id = owner AND s.agent_id = agent
                          AND (active_max IS NULL
                               OR s.active_runs < spool_quota_cap(active_max, s.shard, s.shards))
                          AND (rate_max IS NULL
                               OR s.window_started_at <= now() - interval '1 hour'
                               OR s.window_runs < spool_quota_cap(rate_max, s.shard, s.shards))) THEN
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
                    AND spool_quota_cap(rate_max, s.shard, s.shards) > 0));
        END IF;
        -- A shard with room is held by a transaction that is committing: poll.
        tries := tries + 1;
        PERFORM pg_sleep(least(0.0002 * tries, 0.01));
    END LOOP;
END
$$;

DROP FUNCTION spool_quota_cap(bigint, smallint);
