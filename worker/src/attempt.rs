//! One attempt of one run: from the claim to a fenced final write, a release, or nothing at
//! all when the lease was lost. Its events go to the thread's stream through a [`Publisher`].
//!
//! Failures are sorted here: a lost lease writes and publishes nothing more (another worker
//! owns the run now); a release (shutdown) gives the run back without counting a crash; an
//! error leaves the lease to expire, so the run is retried on another worker and fails for good
//! after `SPOOL_MAX_RECLAIMS`; a panic fails the run at once, since retrying would panic again.
//!
//! Order of the end: the message and status are committed to Postgres first, then
//! `message_end` and `done` are published, so a client that sees `done` and fetches the message
//! over REST always finds it final. The agent's spec is loaded once, before the loop, so the
//! run's end fires its `on_run_complete` hooks (even after a panic) without loading it again.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use spool_shared::agent::AgentSpec;
use spool_shared::db::runs::{Claimed, Fence, Outcome, Run};
use spool_shared::event::{
    AttemptRestarted, Citations, MessageEnd, MessageStart, Origin, end_of_message,
};
use spool_shared::run::{FailureCode, RunFailure};
use spool_shared::status::RunStatus;
use spool_shared::stream::FLUSH_WINDOW;

use crate::agent::answer::{Answer, LoopEnd};
use crate::agent::checkpoint;
use crate::agent::context::Attempt;
use crate::agent::{self, Hooks};
use crate::lease::Lease;
use crate::publish::Publisher;
use crate::stop::{Stop, TimeLimit};
use crate::worker::Worker;

/// Why an attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The run reached a terminal status (written by this attempt).
    Finished(RunStatus),
    /// Another worker holds the run now; nothing was written.
    LeaseLost,
    /// Shutdown: the run went back to the queue.
    Released,
    /// The run waits for tool outputs or an approval, without a worker.
    Paused,
}

/// Executes one claimed attempt, inside an `invoke_agent {agent}` span (GenAI semantic
/// conventions, see [`crate::agent::genai`]) that joins the enqueuing request's trace.
/// Never panics and never returns an error: it logs instead, and says how the attempt ended
/// (`None`: it failed, and the lease will expire).
pub(crate) async fn execute(
    worker: Worker,
    claimed: Claimed,
    lease: Lease,
    release: CancellationToken,
) -> Option<Ended> {
    let run = claimed.run();
    // The agent's name, model and provider are known once its spec is loaded (`agent_span`);
    // until then the span is `invoke_agent`, as the conventions name it without a name.
    let span = tracing::info_span!("run",
        otel.name = "invoke_agent",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.provider.name = tracing::field::Empty,
        gen_ai.agent.name = tracing::field::Empty,
        gen_ai.agent.id = run.agent_id.map(|id| id.to_string()),
        gen_ai.request.model = tracing::field::Empty,
        gen_ai.conversation.id = %run.thread_id,
        error.type = tracing::field::Empty,
        workflow.id = %run.id,
        thread.id = %run.thread_id,
        run.attempt = run.attempt);
    // Every attempt of the run joins the trace of the request that enqueued it.
    if let Some(traceparent) = &run.trace_context {
        spool_shared::telemetry::set_parent_from_traceparent(&span, traceparent);
    }
    // Instrumented, not entered: an entered span held across an await would label whatever
    // else runs on this thread meanwhile.
    execute_in_span(&worker, &claimed, lease, release)
        .instrument(span)
        .await
}

/// The attempt inside its span: its context and stop signal, the agent's spec, the loop, and
/// how it ended (counted, timed, logged). The order of an attempt's end (the fenced write,
/// then the stream's end, then the publisher's flush) reads top to bottom here.
async fn execute_in_span(
    worker: &Worker,
    claimed: &Claimed,
    lease: Lease,
    release: CancellationToken,
) -> Option<Ended> {
    let run = claimed.run();
    let origin = Origin::of(run, run.attempt);
    let events = Publisher::start(
        worker.streams.clone(),
        origin,
        lease.beats.clone(),
        worker.args.coalesce_max_bytes,
    );
    let stop = Stop::new(
        lease.lost.clone(),
        lease.cancel_requested.clone(),
        release,
        run.cancel_requested_at.is_some(),
    );
    let a = Attempt {
        db: &worker.db,
        engine: &worker.engine,
        claimed,
        stop: &stop,
        events: &events,
        admission: &worker.admission,
    };
    let started = std::time::Instant::now();
    let spec = agent::load_spec(a.db, a.engine, run).await;
    if let Ok(Some(spec)) = &spec {
        agent_span(&a, spec).await;
    }
    let _time_limit = time_limit(&stop, run, spec.as_ref().ok().and_then(Option::as_ref));
    let result = match &spec {
        Ok(spec) => {
            AssertUnwindSafe(attempt(&a, worker.args.max_reclaims, spec.as_ref()))
                .catch_unwind()
                .await
        }
        Err(err) => Ok(Err(anyhow::anyhow!("loading the run's agent: {err}"))),
    };
    record_attempt(claimed, &result, started.elapsed());
    let spec = spec.ok().flatten();
    let ended = ended(&a, spec.as_ref(), result).await;
    // A run taken back from its wait for agent runs ended without them (its time limit):
    // its tree is cancelled, before its own end is streamed.
    if claimed.previous_status() == RunStatus::Waiting && matches!(ended, Some(Ended::Finished(_)))
    {
        crate::agent::cancel_children(worker, run).await;
    }
    wind_up(ended.as_ref(), lease, events).await;
    ended
}

/// The run's time limit, counted from enqueue by the database clock (`heartbeat_at` is the
/// database's now() at this claim): the timer that fires it, while it is kept.
fn time_limit(stop: &Stop, run: &Run, spec: Option<&AgentSpec>) -> Option<TimeLimit> {
    spec.and_then(AgentSpec::time_limit_secs).map(|secs| {
        let now = run.heartbeat_at.unwrap_or(run.created_at);
        let end = run.created_at + chrono::Duration::seconds(i64::from(secs));
        stop.time_out_after((end - now).to_std().unwrap_or_default())
    })
}

/// How the attempt ended, from its result: the loop's end; a failed run (a fenced write) if
/// Postgres refused its data or it panicked; none if it failed otherwise (logged, and the
/// lease will expire).
async fn ended(
    a: &Attempt<'_>,
    spec: Option<&AgentSpec>,
    result: Result<anyhow::Result<Ended>, Box<dyn std::any::Any + Send>>,
) -> Option<Ended> {
    match result {
        Ok(Ok(ended)) => Some(ended),
        // Postgres refused the data itself: another attempt would fail the same way.
        Ok(Err(err)) if is_data_error(&err) => {
            tracing::error!(
                error = format!("{err:#}"),
                "attempt failed on data; failing the run"
            );
            let message = "the run produced data that could not be stored";
            fail(a, spec, message).await
        }
        Ok(Err(err)) => {
            tracing::error!(
                error = format!("{err:#}"),
                "attempt failed; the lease will expire"
            );
            let span = tracing::Span::current();
            span.record("otel.status_code", "error");
            span.record("error.type", "_OTHER");
            None
        }
        Err(_) => {
            tracing::error!("attempt panicked; failing the run");
            fail(a, spec, "the worker panicked").await
        }
    }
}

/// Names the attempt's span for its agent and records the agent's model and provider.
async fn agent_span(a: &Attempt<'_>, spec: &AgentSpec) {
    let span = tracing::Span::current();
    spool_shared::telemetry::rename(&span, format!("invoke_agent {}", spec.name));
    span.record("gen_ai.agent.name", spec.name.as_str());
    span.record("gen_ai.request.model", spec.model.as_str());
    // A model no provider serves fails the first call (recorded there); the attribute is
    // then left out.
    if let Ok(models) = a
        .engine
        .models(a.db, &a.claimed.run().tenant_id, spec)
        .await
        && let Some(first) = models.first()
    {
        span.record("gen_ai.provider.name", first.model.system());
    }
}

/// Records a failed run on the attempt's span: its failure code as `error.type`.
fn record_failure(error: &RunFailure) {
    let span = tracing::Span::current();
    span.record("otel.status_code", "error");
    span.record("error.type", error.code.as_str());
}

/// Fails the run at once (`internal_error`), where retrying on another worker would only fail
/// again, keeping what earlier attempts produced. `None` if even that cannot be written.
async fn fail(a: &Attempt<'_>, spec: Option<&AgentSpec>, message: &str) -> Option<Ended> {
    let error = RunFailure::new(FailureCode::InternalError, message);
    let answer = partial_answer(a).await;
    match end(a, spec, RunStatus::Failed, answer, Some(&error)).await {
        Ok(ended) => Some(ended),
        Err(err) => {
            tracing::error!(error = %err, "could not record the failure");
            None
        }
    }
}

/// Whether Postgres refused an attempt's data itself (SQLSTATE class 22: data exceptions),
/// which no retry can fix, rather than being unreachable or busy.
fn is_data_error(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|cause| cause.downcast_ref::<sqlx::Error>())
        .any(|err| match err {
            sqlx::Error::Database(db) => db.code().is_some_and(|code| code.starts_with("22")),
            _ => false,
        })
}

/// Flushes the attempt's events once its end is written, or drops them when it lost the run.
async fn wind_up(ended: Option<&Ended>, lease: Lease, events: Publisher) {
    if let Some(ended) = ended {
        tracing::info!(?ended, "attempt ended");
    }
    match ended {
        Some(Ended::LeaseLost) | None => events.abort(),
        Some(_) => {
            // The attempt's end is written, so it needs no lease any more. Renewing it
            // during the flush would find the run no longer running and call it lost.
            drop(lease);
            events.finish(FLUSH_WINDOW).await;
        }
    }
}

/// Counts how attempts end, times them, and times finished runs from their enqueue.
fn record_attempt(
    claimed: &Claimed,
    result: &Result<anyhow::Result<Ended>, Box<dyn std::any::Any + Send>>,
    took: Duration,
) {
    let outcome = match result {
        Ok(Ok(Ended::Finished(status))) => {
            metrics::counter!("spool_runs_finished_total", "status" => status.as_str())
                .increment(1);
            let age = (chrono::Utc::now() - claimed.run().created_at)
                .to_std()
                .unwrap_or_default();
            metrics::histogram!("spool_run_duration_seconds").record(age.as_secs_f64());
            "finished"
        }
        Ok(Ok(Ended::Paused)) => "paused",
        Ok(Ok(Ended::Released)) => "released",
        Ok(Ok(Ended::LeaseLost)) => "lease_lost",
        Ok(Err(_)) => "error",
        Err(_) => "panic",
    };
    metrics::counter!("spool_attempts_total", "outcome" => outcome).increment(1);
    metrics::histogram!("spool_attempt_duration_seconds").record(took.as_secs_f64());
}

/// The attempt: a restart notice, the reclaim cap, the agent loop, and the end it leads to.
/// `spec` is `None` when the run's agent was deleted.
async fn attempt(
    a: &Attempt<'_>,
    max_reclaims: i32,
    spec: Option<&AgentSpec>,
) -> anyhow::Result<Ended> {
    let run = a.claimed.run();
    // After a crash or a release, not after an answered pause: that continues cleanly.
    if run.attempt > 1 && !run.resumed {
        a.events.send(AttemptRestarted {
            attempt: run.attempt,
        });
    }
    if run.reclaims > max_reclaims {
        a.events.send(MessageStart::new(None));
        let error = RunFailure::new(
            FailureCode::TooManyAttempts,
            format!(
                "the run was reclaimed {} times after its worker stopped heart-beating \
                 (crashed or hung); giving up",
                run.reclaims
            ),
        );
        let answer = partial_answer(a).await;
        return end(a, spec, RunStatus::Failed, answer, Some(&error)).await;
    }
    let Some(agent) = spec else {
        a.events.send(MessageStart::new(None));
        let error = RunFailure::new(
            FailureCode::AgentNotFound,
            "the run's agent no longer exists",
        );
        let answer = partial_answer(a).await;
        return end(a, None, RunStatus::Failed, answer, Some(&error)).await;
    };
    match agent::run(a, agent).await? {
        LoopEnd::LeaseLost => Ok(Ended::LeaseLost),
        LoopEnd::Paused => Ok(Ended::Paused),
        LoopEnd::Released => release(a).await,
        LoopEnd::Cancelled(answer) => end(a, spec, RunStatus::Cancelled, answer, None).await,
        LoopEnd::Failed(error, answer) => {
            end(a, spec, RunStatus::Failed, answer, Some(&error)).await
        }
        LoopEnd::Completed(mut answer) => {
            answer.cite();
            end(a, spec, RunStatus::Completed, answer, None).await
        }
    }
}

/// What earlier attempts produced (their settled steps), for a run that ends without running
/// the loop; nothing if it cannot be read.
async fn partial_answer(a: &Attempt<'_>) -> Answer {
    match checkpoint::restore(a.db, a.claimed.run()).await {
        Ok(checkpoint) => checkpoint.answer,
        Err(err) => {
            tracing::warn!(error = %err, "could not read the saved steps; ending without them");
            Answer::default()
        }
    }
}

/// Gives the run back to the queue (shutdown), waking a worker to take it.
async fn release(a: &Attempt<'_>) -> anyhow::Result<Ended> {
    let mut tx = a.db.begin().await?;
    if a.claimed.release(&mut *tx).await? == Fence::Held {
        spool_shared::db::notify_runs(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(Ended::Released)
}

/// Ends the run (fenced) with `status`, writing what it produced as its message once, then
/// publishes the end of the message and fires the agent's `on_run_complete` hooks. `LeaseLost`
/// if this attempt no longer holds the run (nothing is written or published).
async fn end(
    a: &Attempt<'_>,
    spec: Option<&AgentSpec>,
    status: RunStatus,
    answer: Answer,
    error: Option<&RunFailure>,
) -> anyhow::Result<Ended> {
    let run = a.claimed.run();
    if let Some(error) = error {
        record_failure(error);
    }
    let outcome = Outcome {
        status,
        content: &answer.content,
        parts: &answer.parts,
        usage: answer.usage,
        error,
        final_step: answer.final_step.as_deref().map(|(_, step)| step),
        output: answer.output.as_deref(),
        blocked: answer.blocked,
    };
    if a.claimed.finish(a.db, &outcome).await?.is_lost() {
        return Ok(Ended::LeaseLost);
    }
    // The run holds no room in its quotas any more (best effort: a counter that is full prunes
    // ended runs itself).
    if let Some(quota) = &run.quota {
        a.admission.release(&run.tenant_id, run.id, &quota.0).await;
    }
    // The final step was saved with the run's end: its `step_end` comes now.
    if let Some((number, step)) = answer.final_step.as_deref() {
        a.events.send(crate::agent::step::step_end(*number, step));
    }
    // Then the sources a completed answer cites, as the stored message holds them.
    if status == RunStatus::Completed && !answer.citations.is_empty() {
        a.events.send(Citations {
            citations: answer.citations.clone(),
        });
    }
    // `message_end` carries what the stored message says beyond its text.
    let end = MessageEnd {
        status,
        usage: answer.usage,
        blocked: answer.blocked,
        output: answer.output.as_deref().cloned(),
    };
    for data in end_of_message(end, error) {
        a.events.send(data);
    }
    if let Some(spec) = spec {
        Hooks::for_run(spec, a.engine, run).on_run_end(status, &answer.content);
    }
    Ok(Ended::Finished(status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn data_postgres_refuses_is_told_apart_from_an_unreachable_database() {
        let db = spool_tests::TestDb::new().await.expect("db");
        let refused = sqlx::query("SELECT 1 / 0")
            .execute(&db.pool)
            .await
            .expect_err("division by zero");
        let err = anyhow::Error::from(refused).context("saving a step");
        assert!(is_data_error(&err), "{err:#}");
        let unreachable = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(200))
            .connect("postgres://nobody@127.0.0.1:1/none")
            .await
            .expect_err("nothing listens there");
        assert!(!is_data_error(&anyhow::Error::from(unreachable)));
    }
}
