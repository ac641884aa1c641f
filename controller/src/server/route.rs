//! One request's decision and its dispatch: the method's choice among the live ranks under
//! the DP budget, the tokens the chosen rank is expected to compute, and the send.

use std::time::Instant;

use protocol::msg_trace::Milestone;
use protocol::{Message, TokenOut};

use super::{kv_events, Controller};
use crate::policy::{Method, RouteDecision, RouteInput};
use crate::router::{route, RouteError};
use crate::trace::{route_record, RouteRecord};

impl Controller {
    /// Routes a generation request of a unified deployment now and sends it to its rank (or
    /// answers the client why not).
    pub(super) fn route_unified(&mut self, mut req: protocol::GenerateReq) {
        let tokens = req.input_ids.len() as u64 + u64::from(req.sampling.max_new_tokens);
        let (decision, prefill, record) =
            self.decide_one(&(&req).into(), req.routed_dp_rank, req.return_routing);
        req.routing.extend(record);
        let rid = req.rid.clone();
        self.dispatch(&rid, decision, tokens, prefill, Message::GenerateReq(req));
    }

    /// [`Self::decide`], and the prompt tokens the chosen rank is expected to compute.
    pub(super) fn decide_one(
        &mut self,
        input: &RouteInput<'_>,
        explicit: Option<u32>,
        for_client: bool,
    ) -> (Result<RouteDecision, RouteError>, u64, Option<RouteRecord>) {
        let (decision, record) = self.decide(input, explicit, for_client);
        let prefill = self.expect_computed(&decision, input.input_ids);
        (decision, prefill, record)
    }

    /// Route one request on fresh loads, and record the decision (trace file and the
    /// `dpserve::route` tracing target); its record too when `for_client` asked for it.
    pub(super) fn decide(
        &mut self,
        input: &RouteInput<'_>,
        explicit: Option<u32>,
        for_client: bool,
    ) -> (Result<RouteDecision, RouteError>, Option<RouteRecord>) {
        self.ranks.refresh();
        // Beside disaggregated ranks, only unified and prefill ones compute a whole request.
        let ranks = self
            .ranks
            .rank_set_where(|m| m != protocol::DisaggMode::Decode);
        self.decide_among(input, explicit, &ranks, None, for_client)
    }

    /// [`Self::decide`] among `ranks`; for one `leg` of a disaggregated request (the decode
    /// leg by its own method), recorded as that leg's decision.
    pub(super) fn decide_among(
        &mut self,
        input: &RouteInput<'_>,
        explicit: Option<u32>,
        ranks: &crate::policy::RankSet,
        leg: Option<protocol::DisaggMode>,
        for_client: bool,
    ) -> (Result<RouteDecision, RouteError>, Option<RouteRecord>) {
        let (balancer, method) = if leg == Some(protocol::DisaggMode::Decode) {
            (self.decode_balancer.as_mut(), self.config.decode_method)
        } else {
            (self.balancer.as_mut(), self.config.method)
        };
        let leg_name = leg.map(|l| l.as_str().to_string());
        // Only a method that reads the index pays for hashing the prompt.
        let with_prefix;
        let ranks = if method.uses_kv_index() && explicit.is_none() {
            with_prefix = kv_events::with_cached_prefix(&self.kv_index, input.input_ids, ranks);
            &with_prefix
        } else {
            ranks
        };
        let mut decision = route(balancer, input, explicit, ranks);
        if let (Ok(d), Some(c)) = (&mut decision, ranks.cached_prefix()) {
            let i = ranks.loads().partition_point(|l| l.rank < d.rank);
            d.cached_tokens = c.matched_tokens.get(i).copied();
        }
        self.route_counts.record(method, &decision);
        if let Ok(d) = &decision {
            self.route_counts.record_regret(method, d, ranks);
        }
        if self.tracer.enabled() {
            let milestone = match &decision {
                Ok(d) => {
                    let mut m = d.milestone(method, ranks);
                    if let Milestone::Routed { leg, .. } = &mut m {
                        leg.clone_from(&leg_name);
                    }
                    m
                }
                Err(e) => Milestone::Refused {
                    error: e.to_string(),
                },
            };
            self.tracer.milestone(input.rid, milestone);
        }
        if let Ok(d) = &decision {
            tracing::debug!(
                target: "dpserve::route",
                rid = input.rid,
                rank = d.rank,
                branch = %d.branch,
                key_source = %d.key_source,
                key_digest = d.key_digest.map(|k| format!("{k:016x}")),
                hrw_order = ?d.hrw_order,
                threshold = d.threshold,
                "routed"
            );
        }
        // Built only when tracing to a file or for a client that asked: otherwise a decision
        // allocates nothing extra.
        let held_ms = self.releasing.map(|d| d.as_secs_f64() * 1000.0);
        let record = || {
            let mut rec = route_record(input.rid, protocol::unix_time(), method, ranks, &decision);
            rec.leg.clone_from(&leg_name);
            rec.held_ms = held_ms;
            rec
        };
        let mut for_client = for_client.then(record);
        if let Some(trace) = &self.trace {
            trace.record(for_client.clone().unwrap_or_else(record));
        }
        if decision.is_err() {
            for_client = None;
        }
        (decision, for_client)
    }

    /// The prompt tokens the chosen rank will compute for `ids` (what it does not hold by the
    /// KV index; all of them for methods that do not read it). Under `cache_aware` the prompt's
    /// blocks are predicted on that rank from now on (see [`KvIndex::predict`]): the next
    /// request sharing them meets it there before its KV events arrive.
    pub(super) fn expect_computed(
        &mut self,
        decision: &Result<RouteDecision, RouteError>,
        ids: &[u32],
    ) -> u64 {
        let Ok(d) = decision else { return 0 };
        if self.config.method == Method::CacheAware {
            self.kv_index.predict(d.rank, ids, Instant::now());
        }
        (ids.len() as u64).saturating_sub(d.cached_tokens.unwrap_or(0))
    }

    /// Sends a routed request to its rank (`tokens` of KV at most, `prefill_tokens` of them to
    /// compute); false (the client answered) when it could not.
    pub(super) fn dispatch(
        &mut self,
        rid: &str,
        decision: Result<RouteDecision, RouteError>,
        tokens: u64,
        prefill_tokens: u64,
        msg: Message,
    ) -> bool {
        let decision = match decision {
            Ok(d) => d,
            Err(err) => {
                tracing::info!(rid, %err, "request not routed");
                self.send_to_tokenizer(&Message::TokenOut(TokenOut::error(
                    rid,
                    err.http_status(),
                    err.to_string(),
                )));
                return false;
            }
        };
        if let Message::GenerateReq(r) = &msg {
            let refused = r
                .sampling
                .constraint
                .as_ref()
                .and_then(|_| self.ranks.refuses_constraints(decision.rank));
            if let Some(why) = refused {
                tracing::warn!(rid, %why, "request not sent");
                self.send_to_tokenizer(&Message::TokenOut(TokenOut::error(rid, 503, why)));
                return false;
            }
        }
        // Numbered per rank, so the rank's statuses can say exactly which dispatches they count.
        let seq = self.ranks.next_dispatch_seq(decision.rank);
        let mut msg = msg;
        if let Message::GenerateReq(protocol::GenerateReq { dispatch_seq, .. })
        | Message::EmbedReq(protocol::EmbedReq { dispatch_seq, .. }) = &mut msg
        {
            *dispatch_seq = seq;
        }
        if self.send_to_worker(decision.rank, &msg) {
            let max_new_tokens = match &msg {
                Message::GenerateReq(r) => u64::from(r.sampling.max_new_tokens),
                _ => 0,
            };
            self.ranks.dispatched(
                decision.rank,
                rid,
                tokens,
                prefill_tokens,
                seq,
                max_new_tokens,
            );
            true
        } else {
            self.send_to_tokenizer(&Message::TokenOut(TokenOut::error(
                rid,
                503,
                format!("data parallel rank {} is unreachable", decision.rank),
            )));
            false
        }
    }
}
