//! Disaggregated deployments: each generation request is paired with a prefill rank (by
//! `--load-balance-method`, where the prefix cache that matters lives) and a decode rank (by
//! `--decode-load-balance-method`; an explicit rank applies to this side), under a transfer
//! room of its own (random, never the client's `bootstrap_room`), and sent to both. When a
//! rank with a role leaves, its peers of the other role hear `PeerGone` so the transfers that
//! depended on it end at once.

use protocol::{DisaggLeg, DisaggMode, GenerateReq, Message, PeerGone, TokenOut};

use super::Controller;
use crate::policy::{RouteDecision, RouteInput};

impl Controller {
    pub(super) fn route_pd(&mut self, mut req: GenerateReq) {
        self.ranks.refresh();
        // The transfer's name is the controller's own, fresh per request: a client's
        // `bootstrap_room` only steers `follow_bootstrap_room`, since two requests that share
        // one (two clients, or the choices of one `n > 1` request) must never share a transfer.
        let room = protocol::random_room();
        let prefill_ranks = self.ranks.rank_set_where(|m| m == DisaggMode::Prefill);
        let decode_ranks = self.ranks.rank_set_where(|m| m == DisaggMode::Decode);
        for (set, role) in [(&prefill_ranks, "prefill"), (&decode_ranks, "decode")] {
            if set.is_empty() {
                return self.refuse(&req.rid, 503, format!("no live {role} rank"));
            }
        }
        let input = RouteInput::from(&req);
        let for_client = req.return_routing;
        let (prefill, prefill_record) = self.decide_among(
            &input,
            None,
            &prefill_ranks,
            Some(DisaggMode::Prefill),
            for_client,
        );
        let (decode, decode_record) = self.decide_among(
            &input,
            req.routed_dp_rank,
            &decode_ranks,
            Some(DisaggMode::Decode),
            for_client,
        );
        let computed = self.expect_computed(&prefill, &req.input_ids);
        let (prefill, decode) = match (prefill, decode) {
            (Ok(p), Ok(d)) => (p, d),
            (Err(e), _) | (_, Err(e)) => {
                return self.refuse(&req.rid, e.http_status(), e.to_string());
            }
        };
        let Some((endpoint, key)) = self.kv_endpoint(prefill.rank) else {
            let why = format!("prefill rank {} announced no KV endpoint", prefill.rank);
            return self.refuse(&req.rid, 503, why);
        };
        // The decode worker answers the client: it carries both legs' decisions.
        req.routing
            .extend(prefill_record.into_iter().chain(decode_record));
        req.disagg = Some(DisaggLeg {
            room,
            prefill_rank: prefill.rank,
            decode_rank: decode.rank,
            prefill_kv_endpoint: endpoint,
            prefill_kv_key: key,
        });
        self.send_legs(req, prefill, decode, computed);
    }

    /// The KV endpoint and public key prefill rank `rank` announced (`None` without an
    /// endpoint).
    fn kv_endpoint(&self, rank: u32) -> Option<(String, Option<String>)> {
        self.ranks
            .of_mode(DisaggMode::Prefill)
            .into_iter()
            .find(|(r, _)| *r == rank)
            .and_then(|(_, r)| Some((r.kv_endpoint.clone()?, r.kv_public_key.clone())))
    }

    /// Sends `req`'s prefill leg to `prefill`'s rank and `req` itself to `decode`'s (or answers
    /// the client why not); the prefill leg is aborted when the decode leg cannot be sent.
    fn send_legs(
        &mut self,
        req: GenerateReq,
        prefill: RouteDecision,
        decode: RouteDecision,
        computed: u64,
    ) {
        // The prefill leg first: a decode leg alone would wait for nothing.
        let rid = req.rid.clone();
        // Both workers enforce the constraint: the prefill one samples the first token.
        let refused = req.sampling.constraint.as_ref().and_then(|_| {
            self.ranks
                .refuses_constraints(prefill.rank)
                .or_else(|| self.ranks.refuses_constraints(decode.rank))
        });
        if let Some(why) = refused {
            return self.refuse(&rid, 503, why);
        }
        let prompt = req.input_ids.len() as u64;
        let seq = self.ranks.next_dispatch_seq(prefill.rank);
        // The prefill worker answers no client: the decisions travel with the decode leg only.
        let leg = GenerateReq {
            dispatch_seq: seq,
            routing: Vec::new(),
            ..req.clone()
        };
        if !self.send_to_worker(prefill.rank, &Message::GenerateReq(leg)) {
            let why = format!("prefill rank {} is unreachable", prefill.rank);
            return self.refuse(&rid, 503, why);
        }
        self.ranks
            .dispatched_leg(prefill.rank, &rid, prompt, computed, seq);
        let tokens = prompt + u64::from(req.sampling.max_new_tokens);
        // The decode rank receives the prompt's KV: it computes none of it.
        if !self.dispatch(&rid, Ok(decode), tokens, 0, Message::GenerateReq(req)) {
            let abort = Message::Abort(protocol::Abort {
                rid: Some(rid.clone()),
            });
            self.send_to_worker(prefill.rank, &abort);
        }
    }

    fn refuse(&mut self, rid: &str, status: u16, why: String) {
        tracing::info!(rid, %why, "request not routed");
        self.send_to_tokenizer(&Message::TokenOut(TokenOut::error(rid, status, why)));
    }

    /// Rank `rank` (of role `mode`) left: its peers of the other role drop what they wait for
    /// from it or would send to it.
    pub(super) fn announce_gone(&mut self, rank: u32, mode: Option<DisaggMode>, reason: &str) {
        let peers = match mode {
            Some(DisaggMode::Prefill) => DisaggMode::Decode,
            Some(DisaggMode::Decode) => DisaggMode::Prefill,
            _ => return,
        };
        let gone = Message::PeerGone(PeerGone {
            rank,
            reason: reason.to_string(),
        });
        let peers: Vec<u32> = self.ranks.of_mode(peers).iter().map(|p| p.0).collect();
        for peer in peers {
            self.send_to_worker(peer, &gone);
        }
    }
}
