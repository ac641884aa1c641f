//! Reading routing traces back: a summary of a whole file (per-rank share, branches, keys that
//! moved, spill rate) and a one-request explanation. Pure functions over records, so the
//! `dpserve trace` command only does I/O.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::io::BufRead;

use protocol::route_record::RouteRecord;
use protocol::trace_event::{Branch, KeySource, RankCost};

/// Parse a trace, one record per line. Blank lines are skipped; lines that are not records are
/// counted (a file cut short by a crash ends in half a line) instead of aborting the report.
pub fn parse(reader: impl BufRead) -> std::io::Result<(Vec<RouteRecord>, usize)> {
    let mut records = Vec::new();
    let mut bad = 0;
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<RouteRecord>(&line) {
            Ok(r) => records.push(r),
            Err(_) => bad += 1,
        }
    }
    Ok((records, bad))
}

/// One key whose requests did not all land on one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct MovedKey {
    pub digest: String,
    pub source: KeySource,
    pub requests: u64,
    /// Ranks in the order the key visited them (consecutive repeats collapsed).
    pub path: Vec<u32>,
    /// Moves where the new or the previous decision was a spill.
    pub spill_moves: u64,
    /// Moves where the preferred (first HRW) rank changed: a rank left or joined.
    pub membership_moves: u64,
}

/// What `dpserve trace FILE` prints.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub records: u64,
    pub refused: u64,
    pub first_time: Option<f64>,
    pub last_time: Option<f64>,
    pub methods: BTreeMap<String, u64>,
    pub per_rank: BTreeMap<u32, u64>,
    pub branches: BTreeMap<String, u64>,
    pub key_sources: BTreeMap<String, u64>,
    pub keys: u64,
    pub moved: Vec<MovedKey>,
}

impl Summary {
    /// Spills over decisions that had a key (affinity + spill); `None` when there were none.
    pub fn spill_rate(&self) -> Option<f64> {
        let spill = self.branches.get("spill").copied().unwrap_or(0);
        let keyed = spill + self.branches.get("affinity").copied().unwrap_or(0);
        (keyed > 0).then(|| spill as f64 / keyed as f64)
    }
}

struct KeyState {
    source: KeySource,
    requests: u64,
    path: Vec<u32>,
    last: Option<(u32, Branch, Option<u32>)>,
    spill_moves: u64,
    membership_moves: u64,
}

pub fn summarize(records: &[RouteRecord]) -> Summary {
    let mut s = Summary::default();
    let mut keys: BTreeMap<&str, KeyState> = BTreeMap::new();
    for r in records {
        s.records += 1;
        s.first_time = Some(s.first_time.map_or(r.time, |t: f64| t.min(r.time)));
        s.last_time = Some(s.last_time.map_or(r.time, |t: f64| t.max(r.time)));
        *s.methods.entry(r.method.clone()).or_default() += 1;
        *s.key_sources.entry(r.key_source.to_string()).or_default() += 1;
        let (Some(rank), Some(branch)) = (r.rank, r.branch) else {
            s.refused += 1;
            *s.branches.entry("refused".into()).or_default() += 1;
            continue;
        };
        *s.per_rank.entry(rank).or_default() += 1;
        *s.branches.entry(branch.to_string()).or_default() += 1;
        let Some(digest) = r.key_digest.as_deref() else {
            continue;
        };
        let k = keys.entry(digest).or_insert_with(|| KeyState {
            source: r.key_source,
            requests: 0,
            path: Vec::new(),
            last: None,
            spill_moves: 0,
            membership_moves: 0,
        });
        k.requests += 1;
        let preferred = r.hrw_order.first().copied();
        if let Some((last_rank, last_branch, last_preferred)) = k.last {
            if last_rank != rank {
                if branch == Branch::Spill || last_branch == Branch::Spill {
                    k.spill_moves += 1;
                } else if last_preferred != preferred {
                    k.membership_moves += 1;
                }
            }
        }
        if k.path.last() != Some(&rank) {
            k.path.push(rank);
        }
        k.last = Some((rank, branch, preferred));
    }
    s.keys = keys.len() as u64;
    s.moved = keys
        .into_iter()
        .filter(|(_, k)| k.path.len() > 1)
        .map(|(digest, k)| MovedKey {
            digest: digest.to_string(),
            source: k.source,
            requests: k.requests,
            path: k.path,
            spill_moves: k.spill_moves,
            membership_moves: k.membership_moves,
        })
        .collect();
    // Most-travelled keys first.
    s.moved.sort_by(|a, b| {
        b.path
            .len()
            .cmp(&a.path.len())
            .then(a.digest.cmp(&b.digest))
    });
    s
}

/// How many moved keys the text summary lists.
pub const MOVED_KEYS_SHOWN: usize = 20;

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "routing decisions: {} ({} refused)",
            self.records, self.refused
        )?;
        if let (Some(a), Some(b)) = (self.first_time, self.last_time) {
            writeln!(f, "time span: {:.3} s", b - a)?;
        }
        let methods: Vec<String> = self
            .methods
            .iter()
            .map(|(m, n)| format!("{m} {n}"))
            .collect();
        writeln!(f, "methods: {}", methods.join(", "))?;
        let routed: u64 = self.per_rank.values().sum();
        writeln!(f, "requests per rank:")?;
        for (rank, n) in &self.per_rank {
            let share = 100.0 * *n as f64 / routed.max(1) as f64;
            writeln!(f, "  rank {rank:>4}: {n:>8}  {share:5.1}%")?;
        }
        writeln!(f, "branches:")?;
        for (b, n) in &self.branches {
            writeln!(f, "  {b:<13} {n:>8}")?;
        }
        let sources: Vec<String> = self
            .key_sources
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        writeln!(f, "key sources: {}", sources.join(", "))?;
        match self.spill_rate() {
            Some(rate) => writeln!(f, "spill rate: {:.1}% of keyed decisions", 100.0 * rate)?,
            None => writeln!(f, "spill rate: n/a (no keyed decisions)")?,
        }
        writeln!(
            f,
            "keys: {} distinct, {} stayed on one rank, {} moved",
            self.keys,
            self.keys - self.moved.len() as u64,
            self.moved.len()
        )?;
        for m in self.moved.iter().take(MOVED_KEYS_SHOWN) {
            let path: Vec<String> = m.path.iter().map(u32::to_string).collect();
            writeln!(
                f,
                "  {} ({}, {} requests): ranks {}; {} by spill, {} by a rank leaving/joining",
                m.digest,
                m.source,
                m.requests,
                path.join(" → "),
                m.spill_moves,
                m.membership_moves
            )?;
        }
        if self.moved.len() > MOVED_KEYS_SHOWN {
            writeln!(f, "  … and {} more", self.moved.len() - MOVED_KEYS_SHOWN)?;
        }
        Ok(())
    }
}

/// Explain one decision: a sentence, then the numbers.
pub fn explain(r: &RouteRecord) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", sentence(r));
    let _ = writeln!(out, "  method: {}   time: {:.6}", r.method, r.time);
    let _ = writeln!(
        out,
        "  key source: {}   digest: {}",
        r.key_source,
        r.key_digest.as_deref().unwrap_or("-")
    );
    if let Some(b) = r.branch {
        let _ = writeln!(
            out,
            "  branch: {b}   rank: {}",
            r.rank.map_or("-".into(), |x| x.to_string())
        );
    }
    if let Some(m) = r.margin {
        let _ = writeln!(
            out,
            "  margin: {m:.4} over the best other rank by the method's own measure{}",
            if m < 0.0 {
                " (the guard overruled it)"
            } else {
                ""
            }
        );
    }
    if let Some(ms) = r.held_ms {
        let _ = writeln!(
            out,
            "  held {ms:.0} ms by the controller (late binding) before this decision"
        );
    }
    if !r.loads.is_empty() {
        loads_table(r, &mut out);
    }
    crate::scores::table(r, &mut out);
    out
}

/// Active requests of `rank` at decision time.
fn load_of(r: &RouteRecord, rank: u32) -> u64 {
    r.loads
        .iter()
        .find(|l| l.rank == rank)
        .map_or(0, |l| l.active_requests)
}

/// The one sentence that says why the request went where it did.
fn sentence(r: &RouteRecord) -> String {
    let key = match (&r.key_digest, r.key_source) {
        (Some(d), src) => format!("its {src} key (digest {d})"),
        (None, _) => "it had no key".to_string(),
    };
    if let Some(peer) = crate::scores::sentence(r).filter(|_| r.error.is_none()) {
        return peer;
    }
    match (r.rank, r.branch, &r.error) {
        (_, _, Some(err)) => format!("Request {} was refused: {err}.", r.rid),
        (Some(rank), Some(Branch::Explicit), _) => format!(
            "Request {} named rank {rank} explicitly (routed_dp_rank / data_parallel_rank / \
             X-Data-Parallel-Rank), so {} was bypassed.",
            r.rid, r.method
        ),
        (Some(rank), Some(Branch::Affinity), _) => match r.hrw_order.first() {
            Some(&first) if first == rank => format!(
                "Request {} went to rank {rank}, the first HRW choice for {key}: it had {} \
                 active requests, within the threshold {}.",
                r.rid,
                load_of(r, rank),
                fmt_threshold(r.threshold)
            ),
            _ => format!(
                "Request {} went to rank {rank} by affinity for {key}.",
                r.rid
            ),
        },
        (Some(rank), Some(Branch::Cached | Branch::Cold | Branch::Spill), _)
            if !r.costs.is_empty() =>
        {
            cache_sentence(r, rank)
        }
        (Some(rank), Some(Branch::Spill), _) => {
            let pos = r.hrw_order.iter().position(|&x| x == rank).unwrap_or(0);
            let skipped: Vec<String> = r.hrw_order[..pos]
                .iter()
                .map(|&x| format!("rank {x} ({})", load_of(r, x)))
                .collect();
            format!(
                "Request {} spilled to rank {rank}, choice #{} in HRW order for {key}: {} \
                 had more active requests than the threshold {}, and rank {rank} had {}.",
                r.rid,
                pos + 1,
                skipped.join(", "),
                fmt_threshold(r.threshold),
                load_of(r, rank)
            )
        }
        (Some(rank), Some(Branch::Fallback), _) => format!(
            "Request {} went to rank {rank}: {key}, so the fallback method {} chose.",
            r.rid,
            r.fallback.as_deref().unwrap_or("(unknown)")
        ),
        (Some(rank), Some(b), _) => {
            format!(
                "Request {} went to rank {rank} by {} ({b}).",
                r.rid, r.method
            )
        }
        _ => format!("Request {} has an incomplete record.", r.rid),
    }
}

/// A rank's `cache_aware` cost spelled out term by term, for one with `active` requests.
fn cost_terms(c: &RankCost, active: u64) -> String {
    let unit = if c.prefill_rate.is_some() {
        "s"
    } else {
        " tokens"
    };
    let speed = c
        .prefill_rate
        .map_or(String::new(), |rate| format!(" at {rate:.0} tokens/s"));
    // Short answers among them feel the stall more (`--cache-aware-tpot-weight`).
    let fragile = c.stall_tpot.map_or(String::new(), |s| {
        format!(" (a second's stall adds {s:.3} s to their times per output token)")
    });
    format!(
        "cost {:.3}{unit} = {:.3} waiting behind {} queued prompt tokens + {:.3} for computing its {} tokens{speed}, counted for itself, for the requests after it and for the {active} requests active there{fragile}",
        c.cost,
        c.load_cost,
        c.backlog_tokens.unwrap_or(0),
        c.cost - c.load_cost,
        c.prefill_tokens,
    )
}

/// `cache_aware`'s sentence: what each rank had cached, the costs, and the guard.
fn cache_sentence(r: &RouteRecord, rank: u32) -> String {
    let Some(pos) = r.costs.iter().position(|c| c.rank == rank) else {
        return format!("Request {} went to rank {rank} by {}.", r.rid, r.method);
    };
    let c = &r.costs[pos];
    let prompt = c.matched_tokens + c.prefill_tokens;
    let terms = cost_terms(c, load_of(r, rank));
    let digest = r.key_digest.as_deref().unwrap_or("-");
    // The near-tie rule may put the rank holding more of the prompt, or one running fewer
    // requests, before a cheaper one.
    let tie = if r.costs.iter().any(|o| o.cost < c.cost) {
        " (costs within 10 % are a tie: among them the rank holding most of the prompt goes \
         first, then the one running the fewest requests)"
    } else {
        ""
    };
    let (cheapest, cheapest_line) = if tie.is_empty() {
        ("the cheapest", "the cheapest line")
    } else {
        ("one of the cheapest", "one of the cheapest lines")
    };
    match r.branch {
        Some(Branch::Cold) => format!(
            "Request {} went to rank {rank}: no rank holds any of its {prompt} prompt tokens, so {cheapest_line}{tie} ({terms}; equal costs in HRW order for its first block, digest {digest}), with {} active requests within the threshold {}.",
            r.rid,
            load_of(r, rank),
            fmt_threshold(r.threshold)
        ),
        Some(Branch::Spill) => {
            let skipped: Vec<String> = r.costs[..pos]
                .iter()
                .map(|s| {
                    format!(
                        "rank {} ({} cached, {} active requests)",
                        s.rank,
                        s.matched_tokens,
                        load_of(r, s.rank)
                    )
                })
                .collect();
            format!(
                "Request {} spilled to rank {rank}, choice #{} by cost: {} had more active requests than the threshold {}; rank {rank} holds {} of {prompt} prompt tokens ({terms}).",
                r.rid,
                pos + 1,
                skipped.join(", "),
                fmt_threshold(r.threshold),
                c.matched_tokens
            )
        }
        _ => {
            let next = r.costs.get(1).map_or(String::new(), |n| {
                format!(
                    "; the next cheapest, rank {}, holds {} (cost {:.3})",
                    n.rank, n.matched_tokens, n.cost
                )
            });
            format!(
                "Request {} went to rank {rank}, {cheapest}{tie}: it holds {} of {prompt} prompt tokens ({terms}){next}.",
                r.rid, c.matched_tokens
            )
        }
    }
}

/// Every live rank's load at decision time, in HRW order when there is one (the order the
/// overload guard walked), with the threshold it was held to.
fn loads_table(r: &RouteRecord, out: &mut String) {
    let total: u64 = r.loads.iter().map(|l| l.active_requests).sum();
    let mean = total as f64 / r.loads.len() as f64;
    if let Some(t) = r.threshold {
        let _ = writeln!(
            out,
            "  threshold: {t:.2} active requests = skew {:.2} × max(mean {mean:.2}, 1)",
            t / mean.max(1.0)
        );
    }
    let _ = writeln!(
        out,
        "  {:>6} {:>8} {:>10} {:>10}",
        "rank", "hrw #", "requests", "tokens"
    );
    let hrw_pos = |rank: u32| r.hrw_order.iter().position(|&x| x == rank);
    let mut rows: Vec<_> = r.loads.iter().collect();
    rows.sort_by_key(|l| hrw_pos(l.rank).unwrap_or(usize::MAX));
    for l in rows {
        let pos = hrw_pos(l.rank).map_or("-".into(), |p| (p + 1).to_string());
        let mark = if Some(l.rank) == r.rank {
            "  ← chosen"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {:>6} {:>8} {:>10} {:>10}{mark}",
            l.rank, pos, l.active_requests, l.active_tokens
        );
    }
}

fn fmt_threshold(t: Option<f64>) -> String {
    t.map_or("-".into(), |t| format!("{t:.2}"))
}

#[cfg(test)]
mod tests {
    use controller::policy::LoadBalancer;
    use controller::policy::{
        Method, PrefixAffinity, PrefixAffinityConfig, RankLoad, RankSet, RouteInput,
    };
    use controller::trace::route_record;

    use super::*;

    fn rec(rid: &str, key: &str, ranks: &RankSet, m: &mut PrefixAffinity) -> RouteRecord {
        let req = RouteInput {
            rid,
            input_ids: &[],
            routing_key: Some(key),
            bootstrap_room: None,
            max_new_tokens: None,
        };
        let d = m.select(&req, ranks);
        route_record(rid, 1.0, Method::PrefixAffinity, ranks, &Ok(d))
    }

    #[test]
    fn summary_counts_ranks_branches_and_moved_keys() {
        let mut m = PrefixAffinity::new(PrefixAffinityConfig::default());
        let idle = RankSet::idle(&[0, 1, 2, 3]);
        let first = rec("a", "hot", &idle, &mut m);
        let preferred = first.rank.unwrap();
        let busy = RankSet::new(
            (0..4)
                .map(|rank| RankLoad {
                    rank,
                    active_requests: if rank == preferred { 9 } else { 0 },
                    active_tokens: 0,
                })
                .collect(),
        );
        let spilled = rec("b", "hot", &busy, &mut m);
        let other = rec("c", "cold", &idle, &mut m);
        let text = std::iter::once(&first)
            .chain([&spilled, &other])
            .map(|r| serde_json::to_string(r).unwrap())
            .collect::<Vec<_>>()
            .join("\n")
            + "\n{\"truncated\": tr\n";
        let (records, bad) = parse(text.as_bytes()).unwrap();
        assert_eq!((records.len(), bad), (3, 1));
        let s = summarize(&records);
        assert_eq!(s.records, 3);
        assert_eq!(s.branches.get("spill"), Some(&1));
        assert_eq!(s.spill_rate(), Some(1.0 / 3.0));
        assert_eq!(s.keys, 2);
        assert_eq!(s.moved.len(), 1);
        assert_eq!(s.moved[0].path, vec![preferred, spilled.rank.unwrap()]);
        assert_eq!(s.moved[0].spill_moves, 1);
        let shown = s.to_string();
        assert!(shown.contains("spill rate: 33.3%"), "{shown}");

        let why = explain(&spilled);
        assert!(why.starts_with("Request b spilled to rank"), "{why}");
        assert!(
            why.contains("← chosen") && why.contains("threshold"),
            "{why}"
        );
    }

    #[test]
    fn explains_every_kind_of_decision() {
        let ranks = RankSet::idle(&[0, 1]);
        let explicit = route_record(
            "e",
            0.0,
            Method::PrefixAffinity,
            &ranks,
            &Ok(controller::policy::RouteDecision {
                key_source: KeySource::Explicit,
                ..controller::policy::RouteDecision::plain(1, Branch::Explicit)
            }),
        );
        assert!(explain(&explicit).contains("named rank 1 explicitly"));
        let refused = route_record(
            "x",
            0.0,
            Method::PrefixAffinity,
            &ranks,
            &Err(controller::router::RouteError::NoLiveRank),
        );
        assert!(explain(&refused).contains("was refused: no live"));
        let mut fb = controller::policy::RouteDecision::plain(0, Branch::Fallback);
        fb.fallback = Some(Method::TotalTokens);
        let fallback = route_record("f", 0.0, Method::PrefixAffinity, &ranks, &Ok(fb));
        assert!(explain(&fallback).contains("no key, so the fallback method total_tokens chose"));
        let mut held = fallback.clone();
        held.held_ms = Some(340.0);
        held.margin = Some(-0.25);
        let why = explain(&held);
        assert!(
            why.contains("held 340 ms by the controller (late binding)"),
            "{why}"
        );
        assert!(
            why.contains("margin: -0.2500") && why.contains("overruled"),
            "{why}"
        );
        assert!(!explain(&fallback).contains("held"));
    }

    #[test]
    fn explains_cache_aware_decisions_with_their_cost_terms() {
        use controller::policy::{CacheAware, CacheAwareConfig, CachedPrefix};
        // Skew 1.5: at the default 2 the guard never fires on two ranks. Whole stall and no
        // work weight: the arithmetic below counts each uncached token once per request.
        let mut m = CacheAware::new(CacheAwareConfig {
            max_load_skew: 1.5,
            work_weight: 0.0,
            compute_weight: 1.0,
            ..Default::default()
        });
        let prompt = [5u32; 100];
        let req = RouteInput {
            rid: "c1",
            input_ids: &prompt,
            routing_key: None,
            bootstrap_room: None,
            max_new_tokens: None,
        };
        let set = |matched: Vec<u64>, busy: u64| {
            RankSet::new(
                (0..2)
                    .map(|rank| RankLoad {
                        rank,
                        active_requests: if rank == 1 { busy } else { 0 },
                        active_tokens: 0,
                    })
                    .collect(),
            )
            .with_cached_prefix(CachedPrefix {
                matched_tokens: matched,
                first_block: 7,
                block_size: 32,
            })
        };
        let explain_with = |m: &mut CacheAware, ranks: RankSet| {
            let d = m.select(&req, &ranks);
            explain(&route_record("c1", 1.0, Method::CacheAware, &ranks, &Ok(d)))
        };
        let hit = explain_with(&mut m, set(vec![0, 64], 0));
        assert!(
            hit.contains("went to rank 1, the cheapest: it holds 64 of 100 prompt tokens")
                && hit.contains(
                    "cost 36.000 tokens = 0.000 waiting behind 0 queued prompt tokens + 36.000 for computing its 36 tokens, counted for itself, for the requests after it and for the 0 requests active there"
                )
                && hit.contains("the next cheapest, rank 0, holds 0"),
            "{hit}"
        );
        // Rank 1 (serving 1, holding 78) costs 2 × 22 = 44 tokens, rank 0 (idle, holding 57)
        // 43: within 10 %, so the rank holding more of the prompt goes first, and says so.
        let tie = explain_with(&mut m, set(vec![57, 78], 1));
        assert!(
            tie.contains("went to rank 1, one of the cheapest (costs within 10 % are a tie")
                && tie.contains("the next cheapest, rank 0, holds 57 (cost 43.000)"),
            "{tie}"
        );
        // Serving 9 requests, rank 1 holding 96 of the 100 tokens is still the cheapest (10 × 4
        // tokens against 100), but over the threshold.
        let spill = explain_with(&mut m, set(vec![0, 96], 9));
        assert!(
            spill.contains("spilled to rank 0, choice #2 by cost: rank 1 (96 cached, 9 active"),
            "{spill}"
        );
        // Nothing cached: rank 1 (idle, 1000 tokens/s) costs 0.1 s, rank 0 (serving 1, 2100
        // tokens/s) 2 × 100 / 2100 = 0.095 s; within 10 %, so the idle rank goes first.
        let timed = RankSet::new(
            (0..2)
                .map(|rank| RankLoad {
                    rank,
                    active_requests: u64::from(rank == 0),
                    active_tokens: 0,
                })
                .collect(),
        )
        .with_queues(
            [(0, 1, 2100.0), (1, 0, 1000.0)]
                .into_iter()
                .map(|(rank, running, rate)| controller::policy::RankQueue {
                    rank,
                    running_requests: running,
                    waiting_requests: 0,
                    max_total_tokens: 1 << 20,
                    prefill_backlog_tokens: Some(0),
                    prefill_rate: Some(rate),
                    stall_tpot: 0.0,
                    finish_first_tokens: 0,
                })
                .collect(),
        )
        .with_cached_prefix(CachedPrefix {
            matched_tokens: vec![0, 0],
            first_block: 7,
            block_size: 32,
        });
        let cold_tie = explain_with(&mut m, timed);
        assert!(
            cold_tie.contains(
                "went to rank 1: no rank holds any of its 100 prompt tokens, so one of the cheapest lines (costs within 10 % are a tie"
            ),
            "{cold_tie}"
        );
        let cold = explain_with(&mut m, set(vec![0, 0], 0));
        assert!(
            cold.contains("no rank holds any of its 100 prompt tokens"),
            "{cold}"
        );
    }

    /// `explain` of one decision by `method`'s balancer (built with the default settings).
    fn explain_peer(method: Method, ranks: &RankSet, prompt: &[u32]) -> String {
        let mut m = method.balancer(
            &PrefixAffinityConfig::default(),
            &controller::policy::CacheAwareConfig::default(),
            &controller::policy::PeerConfigs::default(),
        );
        let req = RouteInput {
            rid: "p1",
            input_ids: prompt,
            routing_key: None,
            bootstrap_room: None,
            max_new_tokens: None,
        };
        let d = m.select(&req, ranks);
        let rec = route_record("p1", 1.0, method, ranks, &Ok(d));
        // Through the file form, as `dpserve trace` reads it.
        let line = serde_json::to_string(&rec).unwrap();
        explain(&serde_json::from_str(&line).unwrap())
    }

    #[test]
    fn explains_the_peers_methods_with_their_terms() {
        use controller::policy::{CachedPrefix, RankQueue};
        let loads: Vec<RankLoad> = [(0, 2, 320), (1, 5, 0)]
            .iter()
            .map(|&(rank, active_requests, active_tokens)| RankLoad {
                rank,
                active_requests,
                active_tokens,
            })
            .collect();
        let ranks = RankSet::new(loads)
            .with_queues(vec![
                RankQueue {
                    rank: 0,
                    running_requests: 1,
                    waiting_requests: 1,
                    max_total_tokens: 640,
                    ..Default::default()
                },
                RankQueue {
                    rank: 1,
                    running_requests: 5,
                    waiting_requests: 0,
                    max_total_tokens: 640,
                    ..Default::default()
                },
            ])
            .with_cached_prefix(CachedPrefix {
                matched_tokens: vec![256, 0],
                first_block: 1,
                block_size: 32,
            });
        let prompt = [9u32; 320];

        let v = explain_peer(Method::VllmDp, &ranks, &prompt);
        assert!(
            v.contains(
                "went to rank 0, the lowest vLLM score 4 × waiting + running = 4 × 1 + 1 = 5"
            ) && v.contains("the next lowest, rank 1, scored 5")
                && v.contains("waiting    running"),
            "{v}"
        );
        let d = explain_peer(Method::DynamoKv, &ranks, &prompt);
        // Rank 0 saves 8 of 10 blocks but carries 10 active ones: 2 + 20 against 10 + 10.
        assert!(
            d.contains("went to rank 1, the lowest Dynamo cost (logit 20.00")
                && d.contains("0 prompt blocks cached there")
                && d.contains("the best other, rank 0, had logit 22.00"),
            "{d}"
        );
        // 2 × 0.8 + 0 + 0.5 against 0 + 1 + 1.
        let l = explain_peer(Method::LlmdPrefix, &ranks, &prompt);
        assert!(
            l.contains("went to rank 0, the highest llm-d score 2.10")
                && l.contains("the next highest, rank 1, scored 2.00")
                && l.contains("← chosen"),
            "{l}"
        );
        let s = explain_peer(Method::SmgCacheAware, &ranks, &prompt);
        assert!(
            s.contains("went to rank 0, the least loaded (2 active requests)")
                && s.contains("not above the match threshold"),
            "{s}"
        );
    }

    #[test]
    fn a_method_that_records_its_terms_as_data_is_explained_from_them() {
        // SMG's power_of_two learnt no word of the routing vocabulary: its two drawn ranks'
        // terms are named numbers, rendered as recorded.
        let loads = [(0, 4), (1, 1)]
            .iter()
            .map(|&(rank, active_requests)| RankLoad {
                rank,
                active_requests,
                active_tokens: 0,
            })
            .collect();
        let p = explain_peer(Method::SmgPowerOfTwo, &RankSet::new(loads), &[1, 2, 3]);
        assert!(
            p.contains("went to rank 1, the lowest cost by smg_power_of_two's rule: 1 (drawn ")
                && p.contains("active_requests 1)")
                && p.contains("the next lowest, rank 0, cost 4")
                && p.contains("active_requests       cost")
                && p.contains("← chosen"),
            "{p}"
        );
    }
}
