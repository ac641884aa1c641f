//! The small endpoints: health, server and model info (read by sglang-router before it
//! routes), the OpenAI model list, and cache flush. All answer from local state, without a
//! round trip, except flush, which checks that nothing runs (waiting for it, with `timeout`)
//! and then tells the controller.
//!
//! sglang-router (`--dp-aware`) reads `dp_size` from `/server_info` to make one worker per rank,
//! names the model from `served_model_name`, and loads a tokenizer from `tokenizer_path` (else
//! `model_path`): a local directory if one exists at that path, else a Hugging Face Hub id.

use actix_web::{web, HttpRequest, HttpResponse};
use protocol::{Abort, FlushCache, Message};
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;

use super::body;
use super::error::ApiError;
use super::generate::read_body;
use super::schema::requests::AbortRequest;
use super::schema::responses::{
    AbortResponse, FlushCacheResponse, HealthResponse, HealthStatus, ListObject, ModelCard,
    ModelInfo, ModelList, ModelObject, ServerInfo,
};
use super::validation_error::ValidationError;
use crate::state::{model_path_str, AppState};
use crate::tokenizer::ModelFacts;

/// `model_path` and `tokenizer_path` as SGLang reports them. A model directory is made absolute:
/// a gateway on the same host resolves a relative one from its own working directory, misses
/// it, and goes to the Hugging Face Hub instead. The built-in model reports its id.
fn reported_model_path(facts: &ModelFacts) -> String {
    match &facts.model_path {
        Some(dir) => std::path::absolute(dir)
            .unwrap_or_else(|_| dir.clone())
            .display()
            .to_string(),
        None => model_path_str(facts),
    }
}

/// Whether some rank serves (open without the API key). Also at `/health_generate`.
#[utoipa::path(
    get,
    path = "/health",
    tag = "operations",
    responses((status = 200, description = "Some rank is live", body = HealthResponse)),
)]
pub async fn health(state: web::Data<AppState>) -> HttpResponse {
    match state.fresh_cluster().await {
        Some(c) if !c.live_ranks.is_empty() => HttpResponse::Ok().json(HealthResponse {
            status: HealthStatus::Ok,
            live_ranks: c.live_ranks.iter().map(|r| r.rank).collect(),
        }),
        Some(_) => ApiError::unavailable("no live rank").into(),
        None => ApiError::unavailable(crate::cluster_view::CONTROLLER_UNREACHABLE).into(),
    }
}

/// The deployment as SGLang's gateway reads it, and this server's state. Also at
/// `/server_info`.
#[utoipa::path(
    get,
    path = "/get_server_info",
    tag = "operations",
    responses((status = 200, description = "Server information", body = ServerInfo)),
)]
pub async fn server_info(state: web::Data<AppState>) -> HttpResponse {
    let cluster = state.fresh_cluster().await;
    let limits = state.limits().await;
    let (live_ranks, ranks, method) = match &cluster {
        Some(c) => (
            c.live_ranks.iter().map(|r| r.rank).collect::<Vec<_>>(),
            rank_views(&c.live_ranks),
            Some(c.load_balance_method.clone()),
        ),
        None => (Vec::new(), json!([]), None),
    };
    let sim_profiles = simulated_profiles(cluster.as_ref());
    let on_gpu = cluster
        .iter()
        .flat_map(|c| &c.live_ranks)
        .any(|r| r.gpu.is_some());
    let status_age_s =
        (state.bridge.cluster().await).map(|snap| snap.received.elapsed().as_secs_f64());
    HttpResponse::Ok().json(ServerInfo {
        dp_size: reported_dp_size(live_ranks.len(), state.args.dp_size),
        // Each rank is one device: no tensor parallelism (SGLang's gateway reads this).
        tp_size: 1,
        model_path: reported_model_path(&state.facts),
        tokenizer_path: reported_model_path(&state.facts),
        served_model_name: state.served_model_name.clone(),
        live_ranks,
        ranks,
        load_balance_method: method,
        cluster_status_age_s: status_age_s,
        // Simulated ranks (`--device sim`) compute nothing: say so wherever results are read,
        // even beside real ones.
        device: match (sim_profiles.is_empty(), on_gpu) {
            (false, _) => "sim",
            (true, true) => "cuda",
            (true, false) => "cpu",
        }
        .to_string(),
        simulated: !sim_profiles.is_empty(),
        sim_profiles,
        version: env!("CARGO_PKG_VERSION").to_string(),
        context_length: limits.context_len,
        vocab_size: limits.vocab_size,
        max_request_bytes: state.args.http.max_request_bytes,
        request_timeout_s: state.args.http.request_timeout_s,
        tokenizer_addr: state.args.tokenizer_addr.clone(),
        controller_addr: state.args.controller_addr.clone(),
        requests_in_flight: state.bridge.in_flight().await,
        frames_dropped: state.bridge.frames_dropped(),
        chat_template: state.chat_template.source.describe(),
        api_key_required: !state.api_keys.is_empty(),
        zmq_security: state.bridge.security().as_str().to_string(),
        invariant_violations: state.bridge.invariant_violations().await,
    })
}

/// What a rank computes on, as `--device` names it: `cuda:N` for a rank that announced a GPU,
/// `sim` for a simulated one, else `cpu` (also a rank that predates the GPU field).
fn rank_device(rank: &protocol::RankInfo) -> String {
    match (
        &rank.gpu,
        rank.status.as_ref().and_then(|s| s.simulated.as_ref()),
    ) {
        (Some(gpu), _) => gpu.device(),
        (None, Some(_)) => "sim".to_string(),
        (None, None) => "cpu".to_string(),
    }
}

/// The live ranks as `/get_server_info` lists them: each `RankInfo` as the controller sent it
/// (its `gpu` included), with its `device` beside its `rank`.
fn rank_views(ranks: &[protocol::RankInfo]) -> serde_json::Value {
    let views = ranks.iter().map(|rank| {
        let mut view = serde_json::Map::new();
        view.insert("rank".into(), json!(rank.rank));
        view.insert("device".into(), json!(rank_device(rank)));
        if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(rank) {
            view.extend(fields.into_iter().filter(|(k, _)| k != "rank"));
        }
        serde_json::Value::Object(view)
    });
    serde_json::Value::Array(views.collect())
}

/// The profiles of the live ranks that are simulated (`--device sim`), each once.
fn simulated_profiles(cluster: Option<&protocol::ClusterStatus>) -> Vec<String> {
    let profiles: std::collections::BTreeSet<&str> = cluster
        .iter()
        .flat_map(|c| &c.live_ranks)
        .filter_map(|r| r.status.as_ref()?.simulated.as_deref())
        .collect();
    profiles.into_iter().map(String::from).collect()
}

/// `dp_size` as SGLang's gateway reads it: how many ranks are live now, so a deployment grown
/// or shrunk by starting and stopping worker units reports what actually serves; `--dp-size`
/// (the starting expectation) only while no rank is known live.
fn reported_dp_size(live: usize, configured: u32) -> u32 {
    if live > 0 {
        u32::try_from(live).unwrap_or(u32::MAX)
    } else {
        configured
    }
}

/// The model, as SGLang's gateway reads it. Also at `/model_info`.
#[utoipa::path(
    get,
    path = "/get_model_info",
    tag = "operations",
    responses((status = 200, description = "Model information", body = ModelInfo)),
)]
pub async fn model_info(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(ModelInfo {
        model_path: reported_model_path(&state.facts),
        tokenizer_path: reported_model_path(&state.facts),
        is_generation: true,
    })
}

/// The served model (OpenAI).
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "openai",
    responses((status = 200, description = "The one served model", body = ModelList)),
)]
pub async fn models(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(ModelList {
        object: ListObject::List,
        data: vec![ModelCard {
            id: state.served_model_name.clone(),
            object: ModelObject::Model,
            owned_by: "dpserve".to_string(),
            root: reported_model_path(&state.facts),
            max_model_len: state.limits().await.context_len,
        }],
    })
}

/// The query of `POST /flush_cache`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FlushParams {
    /// Seconds to wait for idle (SGLang's parameter): for this server's requests in flight to
    /// end and every live rank to report none running or waiting, then flush. At most
    /// `--request-timeout-s` (a longer wait is cut to it). Absent or 0: refuse at once if busy.
    #[param(minimum = 0)]
    pub timeout: Option<f64>,
}

impl FlushParams {
    /// How long to wait, from the query string; a bad `timeout` is a 400 naming it.
    fn wait(query: &str, most_s: u64) -> Result<std::time::Duration, ApiError> {
        let params = web::Query::<FlushParams>::from_query(query)
            .map_err(|e| ValidationError::TimeoutQuery {
                error: e.to_string(),
            })?
            .into_inner();
        match params.timeout {
            None => Ok(std::time::Duration::ZERO),
            Some(t) if t.is_finite() && t >= 0.0 => {
                Ok(std::time::Duration::from_secs_f64(t.min(most_s as f64)))
            }
            Some(got) => Err(ValidationError::Timeout { got }.into()),
        }
    }
}

/// `POST /flush_cache`: drop every rank's prefix cache, only when nothing runs. As SGLang:
/// without `timeout` it is refused (400) at once while this tokenizer has requests in flight
/// or a live rank's fresh status shows running or waiting requests; with `timeout=SECS` it
/// waits, up to that long, for both to clear (a rank's status lags a request's end by up to a
/// report interval), then flushes, and is refused only when the time runs out. A worker still
/// refuses on its own if a request reaches it meanwhile.
#[utoipa::path(
    post,
    path = "/flush_cache",
    tag = "operations",
    params(FlushParams),
    responses((status = 200, description = "Flush sent to every live rank",
        body = FlushCacheResponse)),
)]
pub async fn flush_cache(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let wait = FlushParams::wait(req.query_string(), state.args.http.request_timeout_s)?;
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribed before the first look, so a status that arrives after it wakes the wait.
    let mut updates = state.bridge.cluster_updates();
    loop {
        let blocked = match state.fresh_cluster().await {
            None => ApiError::unavailable(
                "no recent cluster status from the controller; cache not flushed",
            ),
            Some(cluster) => match flush_refusal(state.bridge.in_flight().await, &cluster) {
                None => return send_flush(&state, &cluster),
                Some(refusal) if wait.is_zero() => ApiError::bad_request(refusal),
                Some(refusal) => ApiError::bad_request(format!(
                    "Timed out after {} s waiting for idle state. {refusal}",
                    wait.as_secs_f64()
                )),
            },
        };
        if wait.is_zero() {
            return Err(blocked);
        }
        // Each new status is a new look; the deadline (or a bridge shutting down) ends the wait.
        match tokio::time::timeout_at(deadline, updates.changed()).await {
            Ok(Ok(())) => continue,
            _ => return Err(blocked),
        }
    }
}

fn send_flush(
    state: &AppState,
    cluster: &protocol::ClusterStatus,
) -> Result<HttpResponse, ApiError> {
    if !state.bridge.send(Message::FlushCache(FlushCache {})) {
        return Err(ApiError::unavailable("tokenizer is shutting down"));
    }
    Ok(HttpResponse::Ok().json(FlushCacheResponse {
        message: "Cache flush sent to every live rank; each empties its prefix cache unless requests reached it meanwhile (then it refuses and logs why).".to_string(),
        ranks: cluster.live_ranks.iter().map(|r| r.rank).collect(),
    }))
}

/// Why a flush must wait, if it must: requests in flight here, or queued or running on a rank.
fn flush_refusal(in_flight: usize, cluster: &protocol::ClusterStatus) -> Option<String> {
    let (mut waiting, mut running) = (0u64, 0u64);
    for status in cluster.live_ranks.iter().filter_map(|r| r.status.as_ref()) {
        waiting += u64::from(status.num_waiting_reqs);
        running += u64::from(status.num_running_reqs);
    }
    (in_flight > 0 || waiting > 0 || running > 0).then(|| {
        format!(
            "Cache not flushed because there are pending requests. #queue-req: {waiting}, \
             #running-req: {running}, #in-flight-req (this server): {in_flight}"
        )
    })
}

/// `POST /abort_request {"rid": R}` (or `{"abort_all": true}`): abort on the worker. A rid that
/// fanned out (`n` > 1, batched prompts) aborts every `R-<i>` too. The requests end with
/// finish reason `abort`.
#[utoipa::path(
    post,
    path = "/abort_request",
    tag = "sglang",
    request_body = AbortRequest,
    responses((status = 200, description = "Aborts sent", body = AbortResponse)),
)]
pub async fn abort_request(
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, state.args.http.max_request_bytes).await?;
    let AbortRequest { rid, abort_all } = body::read(&body)?;
    let all = abort_all.unwrap_or(false);
    if rid.as_deref() == Some("") {
        return Err(ValidationError::EmptyAbortRid.into());
    }
    let rids = match rid {
        _ if all => None,
        Some(rid) => {
            let children = format!("{rid}-");
            let mut rids = (state.bridge)
                .rids_matching(|r| {
                    r == rid
                        || r.strip_prefix(&children)
                            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
                })
                .await;
            if rids.is_empty() {
                // Not waited on here (another tokenizer, or already done): the worker decides.
                rids.push(rid.clone());
            }
            Some(rids)
        }
        _ => return Err(ValidationError::AbortTarget.into()),
    };
    let sent = match &rids {
        None => state.bridge.send(Message::Abort(Abort { rid: None })),
        Some(rids) => rids.iter().all(|r| {
            state.bridge.send(Message::Abort(Abort {
                rid: Some(r.clone()),
            }))
        }),
    };
    if !sent {
        return Err(ApiError::unavailable("tokenizer is shutting down"));
    }
    Ok(HttpResponse::Ok().json(AbortResponse {
        aborted: rids.map_or(json!("all"), |r| json!(r)),
    }))
}

/// `GET /metrics`: Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text exposition 0.0.4 (`dpserve:` names)",
        content_type = "text/plain", body = String)),
)]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let cluster = state.fresh_cluster().await;
    let in_flight = state.bridge.in_flight().await;
    match state.metrics.render(cluster.as_ref(), in_flight) {
        Ok(text) => HttpResponse::Ok()
            .content_type(crate::metrics::CONTENT_TYPE)
            .body(text),
        Err(err) => ApiError::internal(format!("metrics encoding failed: {err}")).into(),
    }
}

pub async fn not_found() -> HttpResponse {
    ApiError::new(404, "no such endpoint").into()
}

#[cfg(test)]
mod tests {
    use crate::tokenizer::BuiltinTokenizer;
    use protocol::{Capacity, ClusterStatus, RankInfo, WorkerStatus};

    use super::*;

    fn cluster(loads: &[(u32, u32)]) -> ClusterStatus {
        ClusterStatus {
            timestamp: 0.0,
            load_balance_method: "round_robin".into(),
            live_ranks: loads
                .iter()
                .enumerate()
                .map(|(rank, &(running, waiting))| RankInfo {
                    disaggregation_mode: Default::default(),
                    rank: rank as u32,
                    capacity: Capacity {
                        max_total_tokens: 64,
                        max_running_requests: 8,
                        context_len: 64,
                        vocab_size: 100,
                    },
                    model_id: "m".into(),
                    last_seen_s: 0.0,
                    status: Some(WorkerStatus {
                        rank: rank as u32,
                        timestamp: 0.0,
                        num_running_reqs: running,
                        num_waiting_reqs: waiting,
                        num_used_tokens: 0,
                        max_total_tokens: 64,
                        cache_hit_rate: 0.0,
                        gen_throughput: 0.0,
                        finished_rids: Vec::new(),
                        num_free_tokens: 64,
                        num_evictable_tokens: 0,
                        kernel_path: String::new(),
                        taken_seq: None,
                        disagg: None,
                        simulated: None,
                        status_seq: None,
                        prefill: None,
                        invariant_violations: Vec::new(),
                    }),
                    gpu: None,
                    num_inflight: None,
                    invariant_violations: Vec::new(),
                })
                .collect(),
            routing: Vec::new(),
            controller_id: None,
            regret: Vec::new(),
            num_inflight: None,
            taken_submission_seq: None,
        }
    }

    #[test]
    fn simulated_ranks_are_named_once_each() {
        let mut c = cluster(&[(0, 0), (0, 0), (0, 0)]);
        assert!(simulated_profiles(Some(&c)).is_empty());
        assert!(simulated_profiles(None).is_empty());
        for r in &mut c.live_ranks[..2] {
            r.status.as_mut().unwrap().simulated = Some("h100".into());
        }
        assert_eq!(simulated_profiles(Some(&c)), vec!["h100".to_string()]);
    }

    #[test]
    fn each_rank_says_what_it_computes_on_beside_its_gpu() {
        let mut c = cluster(&[(0, 0), (0, 0), (0, 0)]);
        c.live_ranks[1].gpu = Some(protocol::GpuInfo {
            ordinal: 1,
            name: "NVIDIA H200".into(),
            compute_capability: "9.0".into(),
            total_memory_bytes: 150_754_820_096,
        });
        c.live_ranks[2].status.as_mut().unwrap().simulated = Some("h100".into());
        let views = rank_views(&c.live_ranks);
        let devices: Vec<&str> = (0..3)
            .map(|i| views[i]["device"].as_str().unwrap())
            .collect();
        assert_eq!(devices, ["cpu", "cuda:1", "sim"]);
        assert_eq!(
            views[1]["gpu"],
            json!({
                "ordinal": 1,
                "name": "NVIDIA H200",
                "compute_capability": "9.0",
                "total_memory_bytes": 150_754_820_096u64,
            })
        );
        assert!(views[0].get("gpu").is_none(), "absent for a CPU rank");
        // Everything the controller sent is still there, `rank` first.
        let keys: Vec<&String> = views[1].as_object().unwrap().keys().collect();
        assert_eq!(keys[..2], ["rank", "device"]);
        for key in ["capacity", "model_id", "last_seen_s", "status"] {
            assert!(views[1].get(key).is_some(), "{key}");
        }
        assert_eq!(views[1]["capacity"]["max_total_tokens"], 64);
    }

    #[test]
    fn flush_waits_for_every_pending_request() {
        assert_eq!(flush_refusal(0, &cluster(&[(0, 0), (0, 0)])), None);
        let mut no_status = cluster(&[(0, 0)]);
        no_status.live_ranks[0].status = None;
        assert_eq!(
            flush_refusal(0, &no_status),
            None,
            "a rank not reporting yet"
        );
        for (in_flight, loads, counts) in [
            (
                1,
                vec![(0, 0)],
                "#queue-req: 0, #running-req: 0, #in-flight-req (this server): 1",
            ),
            (0, vec![(0, 0), (2, 0)], "#queue-req: 0, #running-req: 2"),
            (0, vec![(0, 3), (1, 1)], "#queue-req: 4, #running-req: 1"),
        ] {
            let refusal = flush_refusal(in_flight, &cluster(&loads)).expect("refused");
            assert!(
                refusal.starts_with("Cache not flushed because there are pending requests."),
                "{refusal}"
            );
            assert!(refusal.contains(counts), "{refusal} lacks {counts}");
        }
    }

    #[test]
    fn flush_timeout_is_seconds_cut_to_the_request_timeout() {
        use std::time::Duration;
        let wait = |q| FlushParams::wait(q, 600);
        assert_eq!(
            wait("").unwrap(),
            Duration::ZERO,
            "no timeout: refuse at once"
        );
        assert_eq!(wait("timeout=60").unwrap(), Duration::from_secs(60));
        assert_eq!(
            wait("other=1&timeout=0.5").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(wait("timeout=1e9").unwrap(), Duration::from_secs(600));
        for bad in [
            "timeout=-1",
            "timeout=abc",
            "timeout=",
            "timeout=inf",
            "timeout=NaN",
        ] {
            let err = wait(bad).unwrap_err();
            assert_eq!(err.status, 400, "{bad}");
            assert_eq!(err.param.as_deref(), Some("timeout"), "{bad}");
        }
    }

    #[test]
    fn reported_model_path_is_absolute_and_builtin_reports_its_id() {
        let builtin = BuiltinTokenizer::facts();
        assert_eq!(reported_model_path(&builtin), protocol::builtin::MODEL_ID);
        let relative = ModelFacts {
            model_path: Some("../models/stories260k".into()),
            ..builtin
        };
        let shown = reported_model_path(&relative);
        assert!(std::path::Path::new(&shown).is_absolute(), "{shown}");
        assert!(shown.ends_with("stories260k"), "{shown}");
    }

    #[test]
    fn dp_size_counts_the_live_ranks_and_falls_back_to_the_flag() {
        assert_eq!(
            reported_dp_size(2, 1),
            2,
            "two units serving, DPSERVE_DP_SIZE unset"
        );
        assert_eq!(reported_dp_size(1, 4), 1, "three of four ranks gone");
        assert_eq!(
            reported_dp_size(0, 4),
            4,
            "nothing live yet: the expectation"
        );
    }
}
