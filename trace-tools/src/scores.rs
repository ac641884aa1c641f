//! The peers' methods' decisions in words (`dpserve trace --rid`): the sentence and the table
//! of per-rank terms that a `routed` record's [`RankScore`]s carry. Pure functions of the
//! record, beside [`crate::report`], which calls them.

use std::fmt::Write as _;

use protocol::route_record::RouteRecord;
use protocol::trace_event::{Branch, RankScore, RankTerms};

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
        RankScore::Terms(ref t) => Some(terms_sentence(&d, t)),
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

/// Any other method's: its cost and named terms as recorded.
fn terms_sentence(d: &Decided<'_>, t: &RankTerms) -> String {
    let next = d
        .others
        .iter()
        .filter_map(|s| match s {
            RankScore::Terms(o) => Some((o.cost, o.rank)),
            _ => None,
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map_or(String::new(), |(c, q)| {
            format!("; the next lowest, rank {q}, cost {}", num(c))
        });
    let terms: Vec<String> = t
        .terms
        .iter()
        .map(|(n, v)| format!("{n} {}", num(*v)))
        .collect();
    let Decided { rid, rank, .. } = d;
    format!(
        "Request {rid} went to rank {rank}, the lowest cost by {}'s rule: {} ({}){next}.",
        t.rule,
        num(t.cost),
        terms.join(", ")
    )
}

/// A recorded term as the sentences and tables print it: whole numbers as they are, others to
/// two decimals.
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
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
    if let RankScore::Terms(t) = first {
        return terms_table(r, t, out, mark);
    }
    let header = match first {
        RankScore::VllmDp { .. } => "    rank    waiting    running      score",
        RankScore::SmgCacheAware { .. } => "    rank    matched       load tree tokens",
        RankScore::DynamoKv { .. } => {
            "    rank  cached bl prefill bl  decode bl      logit       p"
        }
        RankScore::LlmdPrefix { .. } => "    rank     prefix      queue   kv-cache      score",
        RankScore::Terms(_) => unreachable!("rendered by terms_table"),
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
            // A record's scores are all of one rule: terms as data are `terms_table`'s.
            RankScore::Terms(_) => continue,
        };
        let _ = writeln!(out, "{row}{}", mark(s.rank()));
    }
}

/// The table of a method that records its terms as data: a column per term, named as
/// recorded (the first rank's names), then its cost.
fn terms_table(
    r: &RouteRecord,
    first: &RankTerms,
    out: &mut String,
    mark: impl Fn(u32) -> &'static str,
) {
    let width = |n: &str| n.chars().count().max(10);
    let mut header = String::from("    rank");
    for (name, _) in &first.terms {
        let _ = write!(header, " {name:>w$}", w = width(name));
    }
    let _ = writeln!(out, "{header} {:>10}", "cost");
    for s in &r.scores {
        let RankScore::Terms(t) = s else { continue };
        let mut row = format!("  {:>6}", t.rank);
        for ((name, _), (_, v)) in first.terms.iter().zip(&t.terms) {
            let _ = write!(row, " {:>w$}", num(*v), w = width(name));
        }
        let _ = writeln!(out, "{row} {:>10}{}", num(t.cost), mark(t.rank));
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
        RankScore::Terms(ref t) => format!("r{} cost {}", t.rank, num(t.cost)),
    }
}
