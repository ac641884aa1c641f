//! The peers' methods' decisions in words (`dpserve trace --rid`): the sentence and the table
//! of per-rank terms that a `routed` record's [`RankScore`]s carry. Pure functions of the
//! record, beside [`crate::report`], which calls them.

use std::fmt::Write as _;

use protocol::route_record::RouteRecord;
use protocol::trace_event::{Branch, RankScore};

/// The sentence for a decision whose record carries scores, or `None` for any other.
pub(super) fn sentence(r: &RouteRecord) -> Option<String> {
    let rank = r.rank?;
    let chosen = r.scores.iter().find(|s| s.rank() == rank)?;
    let d = Decided {
        rid: &r.rid,
        rank,
        others: r.scores.iter().filter(|s| s.rank() != rank).collect(),
    };
    let branch = r.branch?;
    match *chosen {
        RankScore::VllmDp {
            waiting,
            running,
            score,
            ..
        } => Some(vllm_sentence(&d, waiting, running, score)),
        RankScore::SmgCacheAware {
            matched_tokens,
            load,
            ..
        } => Some(smg_sentence(r, rank, matched_tokens, load, branch)),
        RankScore::DynamoKv { .. } => dynamo_sentence(&d, chosen, branch),
        RankScore::LlmdPrefix { .. } => llmd_sentence(&d, chosen),
    }
}

/// The request, the rank it went to and the other ranks' scores.
struct Decided<'a> {
    rid: &'a str,
    rank: u32,
    others: Vec<&'a RankScore>,
}

fn vllm_sentence(d: &Decided<'_>, waiting: u64, running: u64, score: u64) -> String {
    let next = d
        .others
        .iter()
        .filter_map(|s| match **s {
            RankScore::VllmDp { rank, score, .. } => Some((score, rank)),
            _ => None,
        })
        .min()
        .map_or(String::new(), |(s, q)| {
            format!("; the next lowest, rank {q}, scored {s}")
        });
    let Decided { rid, rank, .. } = d;
    format!(
        "Request {rid} went to rank {rank}, the lowest vLLM score 4 × waiting + running = \
         4 × {waiting} + {running} = {score} (ties go to the lowest rank){next}."
    )
}

/// `None` unless `chosen` is `dynamo_kv`'s.
fn dynamo_sentence(d: &Decided<'_>, chosen: &RankScore, branch: Branch) -> Option<String> {
    let RankScore::DynamoKv {
        overlap_blocks,
        prefill_blocks,
        decode_blocks,
        logit,
        probability,
        ..
    } = *chosen
    else {
        return None;
    };
    let terms = format!(
        "logit {logit:.2} = weight × {prefill_blocks:.2} prefill blocks to compute + \
         {decode_blocks:.2} decode blocks; {overlap_blocks} prompt blocks cached there"
    );
    let best_other = d
        .others
        .iter()
        .filter_map(|s| match **s {
            RankScore::DynamoKv { rank, logit, .. } => Some((logit, rank)),
            _ => None,
        })
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let next = best_other.map_or(String::new(), |(l, q)| {
        format!("; the best other, rank {q}, had logit {l:.2}")
    });
    let Decided { rid, rank, .. } = d;
    Some(match (branch, probability) {
        (Branch::Sampled, Some(p)) => format!(
            "Request {rid} went to rank {rank}, drawn by Dynamo's softmax over the \
             normalised logits with probability {:.1}% ({terms}){next}.",
            p * 100.0
        ),
        _ => format!("Request {rid} went to rank {rank}, the lowest Dynamo cost ({terms}){next}."),
    })
}

/// `None` unless `chosen` is `llmd_prefix`'s.
fn llmd_sentence(d: &Decided<'_>, chosen: &RankScore) -> Option<String> {
    let RankScore::LlmdPrefix {
        prefix,
        queue,
        kv_cache,
        score,
        ..
    } = *chosen
    else {
        return None;
    };
    let next = d
        .others
        .iter()
        .filter_map(|s| match **s {
            RankScore::LlmdPrefix { rank, score, .. } => Some((score, rank)),
            _ => None,
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map_or(String::new(), |(s, q)| {
            format!("; the next highest, rank {q}, scored {s:.2}")
        });
    let Decided { rid, rank, .. } = d;
    Some(format!(
        "Request {rid} went to rank {rank}, the highest llm-d score {score:.2} = weighted \
         prefix {prefix:.2} (cached share of the prompt's blocks) + queue {queue:.2} + \
         KV-cache {kv_cache:.2} (1 − utilisation){next}."
    ))
}

fn smg_sentence(r: &RouteRecord, rank: u32, matched: u64, load: u64, branch: Branch) -> String {
    let rid = &r.rid;
    let loads = r.scores.iter().filter_map(|s| match *s {
        RankScore::SmgCacheAware { load, .. } => Some(load),
        _ => None,
    });
    let (lo, hi) = loads.fold((u64::MAX, 0), |(lo, hi), l| (lo.min(l), hi.max(l)));
    let best = r
        .scores
        .iter()
        .filter_map(|s| match *s {
            RankScore::SmgCacheAware {
                rank,
                matched_tokens,
                ..
            } => Some((matched_tokens, rank)),
            _ => None,
        })
        .max_by_key(|&(m, q)| (m, std::cmp::Reverse(q)))
        .unwrap_or((0, rank));
    match branch {
        Branch::Balance => format!(
            "Request {rid} went to rank {rank}, the shortest queue ({load} active requests): loads \
             were imbalanced (max {hi}, min {lo}, beyond both balance thresholds), so SMG's \
             balance mode set the cache aside (the best tree match was {} tokens on rank {}).",
            best.0, best.1
        ),
        Branch::Matched => format!(
            "Request {rid} went to rank {rank}, whose routing-history tree holds {matched} leading \
             prompt tokens, a share above the match threshold; loads were balanced (max {hi}, \
             min {lo})."
        ),
        _ => format!(
            "Request {rid} went to rank {rank}, the least loaded ({load} active requests): the \
             best tree match ({} tokens, rank {}) was not above the match threshold.",
            best.0, best.1
        ),
    }
}

/// One row per rank of the terms the method weighed.
pub(super) fn table(r: &RouteRecord, out: &mut String) {
    let mark = |rank: u32| {
        if Some(rank) == r.rank {
            "  ← chosen"
        } else {
            ""
        }
    };
    let Some(first) = r.scores.first() else {
        return;
    };
    let header = match first {
        RankScore::VllmDp { .. } => "    rank    waiting    running      score",
        RankScore::SmgCacheAware { .. } => "    rank    matched       load tree tokens",
        RankScore::DynamoKv { .. } => {
            "    rank  cached bl prefill bl  decode bl      logit       p"
        }
        RankScore::LlmdPrefix { .. } => "    rank     prefix      queue   kv-cache      score",
    };
    let _ = writeln!(out, "{header}");
    for s in &r.scores {
        let row = match *s {
            RankScore::VllmDp {
                rank,
                waiting,
                running,
                score,
            } => format!("  {rank:>6} {waiting:>10} {running:>10} {score:>10}"),
            RankScore::SmgCacheAware {
                rank,
                matched_tokens,
                load,
                tree_tokens,
            } => format!("  {rank:>6} {matched_tokens:>10} {load:>10} {tree_tokens:>11}"),
            RankScore::DynamoKv {
                rank,
                overlap_blocks,
                prefill_blocks,
                decode_blocks,
                logit,
                probability,
            } => format!(
                "  {rank:>6} {overlap_blocks:>10} {prefill_blocks:>10.2} {decode_blocks:>10.2} \
                 {logit:>10.2} {:>7}",
                probability.map_or("-".into(), |p| format!("{p:.3}"))
            ),
            RankScore::LlmdPrefix {
                rank,
                prefix,
                queue,
                kv_cache,
                score,
            } => format!("  {rank:>6} {prefix:>10.2} {queue:>10.2} {kv_cache:>10.2} {score:>10.2}"),
        };
        let _ = writeln!(out, "{row}{}", mark(s.rank()));
    }
}

/// One rank's terms, short, for a line of a request's journey (`r0 4×1+1=5`).
pub(super) fn brief(s: &RankScore) -> String {
    match *s {
        RankScore::VllmDp {
            rank,
            waiting,
            running,
            score,
        } => format!("r{rank} 4×{waiting}+{running}={score}"),
        RankScore::SmgCacheAware {
            rank,
            matched_tokens,
            load,
            ..
        } => format!("r{rank} {matched_tokens} matched, load {load}"),
        RankScore::DynamoKv { rank, logit, .. } => format!("r{rank} logit {logit:.2}"),
        RankScore::LlmdPrefix { rank, score, .. } => format!("r{rank} score {score:.2}"),
    }
}
