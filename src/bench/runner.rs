//! One benchmark run against a server: learn what it serves, build the workload, warm up, send
//! every request on its schedule, and measure, with what the server says about the run after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Map, Value};

use super::ceiling;
use super::client::{Backend, BenchClient};
use super::metrics::{BenchMetrics, Details, RequestOutcome};
use super::plan::Plan;
use super::probe::{self, ServerFacts};
use super::report::RunInfo;
use super::workload::{self, BenchRequest, Dataset};
use super::{bailian, mooncake};

/// Output tokens of a warm-up request at most: warm-up only needs the path exercised.
const WARMUP_MAX_OUTPUT: usize = 16;

/// One benchmark run against a server.
pub async fn run_once(base_url: &str, plan: &Plan) -> anyhow::Result<(RunInfo, BenchMetrics)> {
    let (client, facts, notes) = connect(base_url, plan).await?;
    let requests = workload_of(plan, facts.vocab_size)?;
    warm_up(&client, plan, &requests, facts.vocab_size).await?;
    if plan.flush_cache {
        client.flush_cache().await?;
        // The flush is fire-and-forget to the ranks; give it a moment to land.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let num_prompts = requests.len();
    let (prompts, mut m) = measure(&client, plan, requests).await;

    // The method and per-rank hit rates as the server saw them, after the run (unknown when
    // the server has no /get_server_info).
    let after = match &facts.server_info {
        Ok(before) => Some(
            client
                .server_info()
                .await
                .unwrap_or_else(|_| before.clone()),
        ),
        Err(_) => None,
    };
    let rank_hits = after.as_ref().map(rank_cache_hits);
    let after = after.unwrap_or(Value::Null);
    if let Some(dp) = after["dp_size"].as_u64() {
        m = m.with_ranks(dp as u32);
    }
    let granularity = match plan.gsp.dataset.is_trace() {
        true => plan.trace.block_tokens,
        false => 1,
    };
    m.ceilings = Some(ceiling::compute(
        prompts.iter().map(Vec::as_slice),
        granularity,
        total_kv_capacity(&after),
    ));
    let info = run_info(plan, &facts, num_prompts, &after, rank_hits, notes);
    Ok((info, m))
}

/// A client for the server with what it serves learned (the notes on what was assumed
/// instead are printed and returned).
async fn connect(
    base_url: &str,
    plan: &Plan,
) -> anyhow::Result<(BenchClient, ServerFacts, Vec<String>)> {
    let mut client = BenchClient::new(base_url, plan.backend, plan.model.clone())?;
    let facts = probe::probe(&client, plan.vocab_size, plan.model.as_deref()).await?;
    let notes = facts.notes(plan.backend == Backend::Openai);
    for note in &notes {
        eprintln!("note: {note}");
    }
    if let Some(model) = &facts.model {
        client.set_model(model.clone());
    }
    Ok((client, facts, notes))
}

/// Sends the workload on its schedule, with a progress bar; returns the prompts in send order
/// (for the ceilings, computed once the capacity is known) and the run's metrics.
async fn measure(
    client: &BenchClient,
    plan: &Plan,
    mut requests: Vec<BenchRequest>,
) -> (Vec<Vec<u32>>, BenchMetrics) {
    // `--sim-speed`: the ranks run K times faster than modelled, and so does the workload.
    let k = plan.sim_speed;
    for r in &mut requests {
        r.at = r.at.map(|t| t / k);
        r.after_gap_s /= k;
    }
    let arrivals = workload::send_times(&plan.gsp, &requests, plan.request_rate * k, plan.seed);
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| arrivals[a].total_cmp(&arrivals[b]));
    let prompts: Vec<Vec<u32>> = order
        .iter()
        .map(|&i| requests[i].input_ids.clone())
        .collect();
    let pb = progress_bar(plan.progress, requests.len());
    let (mut outcomes, duration) =
        send_all(client, requests, arrivals, plan.max_concurrency, pb.clone()).await;
    pb.finish_and_clear();
    // Back to modelled time.
    for o in &mut outcomes {
        o.scale_time(k);
    }
    let duration = duration * k;
    let mut m = BenchMetrics::compute(&outcomes, duration, plan.slo);
    m.details = plan.output_details.then(|| Details::of(&outcomes));
    (prompts, m)
}

/// What the run was: the plan, the server's facts and its answer after the run (`Null` when
/// it has no `/get_server_info`), with a note when its ranks are simulated.
fn run_info(
    plan: &Plan,
    facts: &ServerFacts,
    num_prompts: usize,
    after: &Value,
    rank_hits: Option<Map<String, Value>>,
    mut notes: Vec<String>,
) -> RunInfo {
    let sim_profiles: Vec<String> = after["sim_profiles"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str().map(str::to_string))
        .collect();
    if !sim_profiles.is_empty() {
        notes.push(format!(
            "SIMULATED: the ranks are simulated ({}); every timing here comes from a cost \
             model, not a model run (docs/SIM.md)",
            sim_profiles.join(", ")
        ));
    }
    if plan.sim_speed != 1.0 {
        notes.push(format!(
            "--sim-speed {}: the ranks ran that many times faster than modelled and the \
             workload was sent as much faster; every time here is the measured one times {0} \
             (what does not scale, HTTP, tokenizing and routing, reads {0} times larger)",
            plan.sim_speed
        ));
    }
    RunInfo {
        backend: plan.backend.name().to_string(),
        gsp: plan.gsp.clone(),
        trace: plan.gsp.dataset.is_trace().then(|| plan.trace.clone()),
        num_prompts,
        request_rate: plan.request_rate,
        max_concurrency: plan.max_concurrency,
        seed: plan.seed,
        load_balance_method: after["load_balance_method"].as_str().map(str::to_string),
        dp_size: after["dp_size"].as_u64(),
        server_rank_cache_hit_rate: rank_hits,
        vocab_size: facts.vocab_size,
        vocab_size_from: facts.vocab_from.to_string(),
        model: facts.model.clone(),
        model_from: facts.model_from.to_string(),
        notes,
        sim_profiles,
    }
}

/// The requests of the plan's dataset (a trace window, or a generated workload).
fn workload_of(plan: &Plan, vocab_size: u32) -> anyhow::Result<Vec<BenchRequest>> {
    let requests = match plan.gsp.dataset {
        Dataset::Mooncake => {
            mooncake::generate(&plan.trace, vocab_size, plan.num_prompts, plan.seed)?
        }
        Dataset::Bailian => {
            bailian::generate(&plan.trace, vocab_size, plan.num_prompts, plan.seed)?
        }
        _ => workload::generate(&plan.gsp, vocab_size, plan.num_prompts, plan.seed)?,
    };
    anyhow::ensure!(
        !requests.is_empty(),
        "the workload is empty (--num-prompts 0, or a trace window with no request?)"
    );
    Ok(requests)
}

/// `--warmup-requests` requests of the workload's shape, all sent at once; any failure stops
/// the run.
async fn warm_up(
    client: &BenchClient,
    plan: &Plan,
    requests: &[BenchRequest],
    vocab_size: u32,
) -> anyhow::Result<()> {
    if plan.warmup_requests == 0 {
        return Ok(());
    }
    let (len, output) = match plan.gsp.dataset {
        Dataset::Mooncake | Dataset::Bailian => (requests[0].prompt_len(), requests[0].output_len),
        _ => (
            plan.gsp.system_prompt_len + plan.gsp.question_len,
            plan.gsp.output_len,
        ),
    };
    let w = workload::warmup_request(vocab_size, len, output.min(WARMUP_MAX_OUTPUT), plan.seed);
    let warm: Vec<BenchRequest> = (0..plan.warmup_requests).map(|_| w.clone()).collect();
    let n = warm.len();
    let (outcomes, _) = send_all(client, warm, vec![0.0; n], None, ProgressBar::hidden()).await;
    if let Some(failed) = outcomes.iter().find(|o| !o.success) {
        anyhow::bail!(
            "warm-up failed: {}",
            failed.error.as_deref().unwrap_or("unknown error")
        );
    }
    Ok(())
}

fn progress_bar(shown: bool, len: usize) -> ProgressBar {
    if !shown {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64);
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// Each rank's cache hit rate, by rank, from `/get_server_info`.
fn rank_cache_hits(info: &Value) -> Map<String, Value> {
    let mut rank_hits = Map::new();
    for r in info["ranks"].as_array().into_iter().flatten() {
        if let (Some(rank), Some(rate)) =
            (r["rank"].as_u64(), r["status"]["cache_hit_rate"].as_f64())
        {
            rank_hits.insert(rank.to_string(), json!(rate));
        }
    }
    rank_hits
}

/// Every rank's KV pool added up, from `/get_server_info` (unknown without it).
fn total_kv_capacity(info: &Value) -> Option<u64> {
    info["ranks"].as_array().and_then(|ranks| {
        ranks
            .iter()
            .map(|r| {
                r["capacity"]["max_total_tokens"]
                    .as_u64()
                    .or(r["status"]["max_total_tokens"].as_u64())
            })
            .sum()
    })
}

/// Sends every request at its arrival time (seconds after start) and, when it names one, once
/// the request it comes `after` has finished (success or not) and its `after_gap_s` more has
/// passed, at most `max_concurrency` at once; returns the outcomes in request order and the wall time of the whole run.
async fn send_all(
    client: &BenchClient,
    requests: Vec<BenchRequest>,
    arrivals: Vec<f64>,
    max_concurrency: Option<usize>,
    pb: ProgressBar,
) -> (Vec<RequestOutcome>, f64) {
    let semaphore = max_concurrency.map(|c| Arc::new(tokio::sync::Semaphore::new(c)));
    // finished[i] holds when request i had its outcome; a request waits for its `after`'s
    // before it takes a concurrency slot (a slot held while waiting could starve the request
    // waited for).
    let (finished_tx, finished_rx): (Vec<_>, Vec<_>) = (0..requests.len())
        .map(|_| tokio::sync::watch::channel(None::<tokio::time::Instant>))
        .unzip();
    let start = tokio::time::Instant::now();
    let wall = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let n = requests.len();
    for ((pos, (req, at)), done) in requests
        .into_iter()
        .zip(arrivals)
        .enumerate()
        .zip(finished_tx)
    {
        let client = client.clone();
        let semaphore = semaphore.clone();
        let pb = pb.clone();
        let mut before = req.after.and_then(|j| finished_rx.get(j)).cloned();
        tasks.spawn(async move {
            // At its arrival time, and no sooner than `after_gap_s` after the request it comes
            // after has ended: max(start + at, that end + gap).
            let mut send_at = start + Duration::from_secs_f64(at);
            if let Some(before) = &mut before {
                // An error means the earlier request's task is gone: go on regardless.
                let ended = match before.wait_for(Option::is_some).await {
                    Ok(ended) => *ended,
                    Err(_) => None,
                };
                let gap = Duration::from_secs_f64(req.after_gap_s.max(0.0));
                send_at = send_at.max(ended.unwrap_or_else(tokio::time::Instant::now) + gap);
            }
            tokio::time::sleep_until(send_at).await;
            let _permit = match &semaphore {
                Some(s) => Some(s.clone().acquire_owned().await),
                None => None,
            };
            let sent_s = start.elapsed().as_secs_f64();
            let mut outcome = client.send(&req).await;
            outcome.sent_s = sent_s;
            outcome.ended_s = start.elapsed().as_secs_f64();
            done.send_replace(Some(tokio::time::Instant::now()));
            pb.inc(1);
            (pos, outcome)
        });
    }
    let mut outcomes: Vec<RequestOutcome> = vec![RequestOutcome::default(); n];
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((pos, outcome)) => outcomes[pos] = outcome,
            Err(e) => tracing::error!("a request task failed: {e}"),
        }
    }
    (outcomes, wall.elapsed().as_secs_f64())
}
