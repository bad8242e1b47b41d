"""The job-queue peers of spool-bench P5: arq (Redis) and procrastinate (Postgres), each at its
defaults with two worker processes, timed the way P5 times Spool: `--jobs` no-op jobs enqueued
by `--clients` concurrent clients, from the first enqueue until every job has completed.

    queue_peers.py arq --jobs 3000 --clients 16 --redis redis://127.0.0.1:6379
    queue_peers.py procrastinate --jobs 3000 --clients 16 --db postgres://root@127.0.0.1/x

Prints one JSON line: {"peer", "jobs", "seconds", "jobs_per_sec"}. The workers are started
before the clock starts and stopped after. arq's job increments a Redis counter (one INCR) so
the end is seen without scanning its results; procrastinate's end is its jobs' `succeeded`
status. Each run uses a queue (arq) or a database (procrastinate) of its own.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))

# --- arq -------------------------------------------------------------------------------------

async def arq_noop(ctx):
    await ctx["redis"].incr(os.environ["PEER_COUNTER"])


def arq_worker_main():
    """An arq worker at its defaults (max_jobs 10, poll_delay 0.5 s) on the bench's queue."""
    from arq.connections import RedisSettings
    from arq.worker import run_worker

    class Settings:
        functions = [arq_noop]
        redis_settings = RedisSettings.from_dsn(os.environ["PEER_REDIS"])
        queue_name = os.environ["PEER_QUEUE"]

    run_worker(Settings)


async def arq_bench(jobs, clients, redis_url):
    from arq import create_pool
    from arq.connections import RedisSettings

    queue = f"arq:bench:{uuid.uuid4().hex}"
    counter = f"{queue}:done"
    env = dict(os.environ, PEER_ROLE="arq-worker", PEER_REDIS=redis_url, PEER_QUEUE=queue,
               PEER_COUNTER=counter)
    workers = [spawn(env) for _ in range(2)]
    pool = await create_pool(RedisSettings.from_dsn(redis_url), default_queue_name=queue)
    try:
        await asyncio.sleep(1.0)  # the workers connect
        started = time.perf_counter()
        await in_parallel(jobs, clients, lambda: pool.enqueue_job("arq_noop"))
        while int(await pool.get(counter) or 0) < jobs:
            await asyncio.sleep(0.01)
        seconds = time.perf_counter() - started
    finally:
        stop(workers)
        keys = [k async for k in pool.scan_iter(match="arq:*")]
        for i in range(0, len(keys), 1000):
            await pool.delete(*keys[i:i + 1000])
        await pool.aclose()
    return seconds


# --- procrastinate ---------------------------------------------------------------------------


def procrastinate_app(conninfo):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop")
    async def noop():
        return None

    return app, noop


def procrastinate_worker_main():
    app, _ = procrastinate_app(os.environ["PEER_DB"])
    # The CLI's `worker` command with its defaults (concurrency 1, every queue).
    asyncio.run(run_procrastinate_worker(app))


async def run_procrastinate_worker(app):
    async with app.open_async():
        await app.run_worker_async()


async def procrastinate_bench(jobs, clients, db_url):
    import psycopg

    base, _, _ = db_url.rpartition("/")
    name = f"spool_bench_procrastinate_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    conninfo = f"{base}/{name}"
    try:
        app, noop = procrastinate_app(conninfo)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
        env = dict(os.environ, PEER_ROLE="procrastinate-worker", PEER_DB=conninfo)
        workers = [spawn(env) for _ in range(2)]
        try:
            async with app.open_async():
                await asyncio.sleep(1.0)  # the workers connect and listen
                started = time.perf_counter()
                await in_parallel(jobs, clients, lambda: noop.defer_async())
                async with await psycopg.AsyncConnection.connect(conninfo) as conn:
                    while True:
                        row = await (await conn.execute(
                            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                        )).fetchone()
                        if row[0] >= jobs:
                            break
                        await asyncio.sleep(0.01)
                seconds = time.perf_counter() - started
        finally:
            stop(workers)
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return seconds


# --- common ----------------------------------------------------------------------------------


def spawn(env):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(workers):
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.wait()


async def in_parallel(jobs, clients, enqueue):
    remaining = iter(range(jobs))

    async def client():
        for _ in remaining:
            await enqueue()

    await asyncio.gather(*(client() for _ in range(clients)))


def main():
    role = os.environ.get("PEER_ROLE")
    if role == "arq-worker":
        return arq_worker_main()
    if role == "procrastinate-worker":
        return procrastinate_worker_main()
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=["arq", "procrastinate"])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", default="postgres://root@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    if args.peer == "arq":
        seconds = asyncio.run(arq_bench(args.jobs, args.clients, args.redis))
    else:
        seconds = asyncio.run(procrastinate_bench(args.jobs, args.clients, args.db))
    print(json.dumps({"peer": args.peer, "jobs": args.jobs, "seconds": seconds,
                      "jobs_per_sec": args.jobs / seconds}))


if __name__ == "__main__":
    main()
