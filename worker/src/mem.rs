//! Sizing the KV pool from a memory budget when `--max-total-tokens` is not given: a fraction
//! (`--mem-fraction`) of the host memory free at start, less the model's weights, divided by
//! what one token slot costs. Reading the host's memory is here too; allocating the pool is not
//! (see `model::KvBuffers`, whose zeroed buffers cost no memory until a slot is written).
//!
//! ```text
//! budget = mem_fraction × available − weight_bytes
//! slots  = clamp(budget / kv_bytes_per_token, context_len, req_to_token_rows × per_request)
//! per_request = min(context_len, KV_TOKENS_PER_RUNNING_REQUEST)   unless --mem-fraction is given
//!             = context_len                                       when it is
//! ```
//!
//! The lower bound lets one request use the whole context. The upper bound, by default, is a
//! few thousand tokens per running request: what serving needs, so a small model (the built-in
//! one has an 8192-token context and 64 running requests) does not reserve gigabytes of a host
//! it shares. An operator who sets `--mem-fraction` asks for the pool the memory allows, up to
//! every slot the request-to-token table can address at once (beyond it, slots could only ever
//! hold evictable cache).

use std::path::Path;

/// Default `--mem-fraction`. See the flag's documentation in `args/serve.rs` for why it is this low.
pub const DEFAULT_MEM_FRACTION: f64 = 0.5;

/// KV slots when the free memory cannot be read (no `/proc/meminfo`): the pool size dpserve
/// used before it sized pools from memory, still clamped like a derived size.
pub const FALLBACK_MAX_TOTAL_TOKENS: usize = 32768;

/// KV slots per running request in a default pool (no `--max-total-tokens`, no
/// `--mem-fraction`): with the prefix cache, plenty for the prompts and answers a request
/// holds; one full context stays the floor for a single long request.
pub const KV_TOKENS_PER_RUNNING_REQUEST: usize = 2048;

/// `--mem-fraction` parser: a number in (0, 1]. NaN, 0, negatives and more than 1 are refused
/// at startup, before anything is loaded.
pub fn parse_mem_fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected a number in (0, 1], got {s:?}"))?;
    check_mem_fraction(v)
}

/// `v` if it is in (0, 1].
pub fn check_mem_fraction(v: f64) -> Result<f64, String> {
    // Written so that NaN fails too.
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("expected a number in (0, 1], got {v}"))
    }
}

/// How much memory this process may still take, and where that number came from.
#[derive(Debug, Clone, PartialEq)]
pub struct MemReading {
    pub available_bytes: u64,
    /// `/proc/meminfo MemAvailable`, or the cgroup's limit when that is tighter.
    pub source: String,
}

/// Memory free for this process now: `MemAvailable` from `/proc/meminfo`, or the headroom under
/// this process's cgroup v2 `memory.max` (a systemd `MemoryMax=`, a container limit) when that
/// is smaller. `Err` says why nothing could be read.
pub fn read_available_memory() -> Result<MemReading, String> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| format!("cannot read /proc/meminfo: {e}"))?;
    let host = meminfo_available_bytes(&meminfo)
        .ok_or_else(|| "no MemAvailable line in /proc/meminfo".to_string())?;
    let mut reading = MemReading {
        available_bytes: host,
        source: "/proc/meminfo MemAvailable".into(),
    };
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_v2_path(&text));
    if let Some(path) = cgroup {
        let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        if let (Some(max), Some(current)) = (read("memory.max"), read("memory.current")) {
            if let Some(headroom) = cgroup_headroom_bytes(&max, &current) {
                if headroom < reading.available_bytes {
                    reading = MemReading {
                        available_bytes: headroom,
                        source: format!("{} memory.max − memory.current", dir.display()),
                    };
                }
            }
        }
    }
    Ok(reading)
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
pub fn meminfo_available_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut parts = line["MemAvailable:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// This process's cgroup v2 path (the `0::PATH` line of `/proc/self/cgroup`).
pub fn cgroup_v2_path(proc_self_cgroup: &str) -> Option<String> {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// `memory.max − memory.current`, or `None` without a limit (`max`) or on unreadable values.
pub fn cgroup_headroom_bytes(memory_max: &str, memory_current: &str) -> Option<u64> {
    let max: u64 = memory_max.trim().parse().ok()?; // "max" (no limit) does not parse
    let current: u64 = memory_current.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// Everything the pool size is derived from.
#[derive(Debug, Clone, PartialEq)]
pub struct KvBudget {
    /// Memory free before the model was loaded; `None` when it could not be read.
    pub available_bytes: Option<u64>,
    pub mem_fraction: f64,
    /// The model's weights in memory (not yet counted in `available_bytes`).
    pub weight_bytes: u64,
    /// K and V of one token over all layers: 2 × layers × kv_heads × head_dim × element size.
    pub kv_bytes_per_token: u64,
    pub context_len: usize,
    /// Rows of the request-to-token table (running plus pre-allocated).
    pub req_to_token_rows: usize,
    /// Most slots per row the pool is sized for: `Some(KV_TOKENS_PER_RUNNING_REQUEST)` by
    /// default, `None` (a full context per row) when `--mem-fraction` was given.
    pub tokens_per_request: Option<usize>,
}

/// What bounded the derived size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolLimit {
    /// The memory budget.
    Budget,
    /// The budget is below one full context; raised to it.
    OneContext,
    /// The budget exceeds what the request-to-token table can address; lowered to it.
    ReqToTokenTable,
    /// No memory reading: [`FALLBACK_MAX_TOTAL_TOKENS`].
    Fallback,
}

impl PoolLimit {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolLimit::Budget => "memory budget",
            PoolLimit::OneContext => "raised to one full context",
            PoolLimit::ReqToTokenTable => "capped at req-to-token rows × tokens per request",
            PoolLimit::Fallback => "fixed fallback (free memory unknown)",
        }
    }
}

/// The derived pool size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPoolSize {
    pub max_total_tokens: usize,
    /// `mem_fraction × available − weights` (0 when the weights alone exceed the share).
    pub budget_bytes: Option<u64>,
    pub limit: PoolLimit,
}

impl KvBudget {
    /// Smallest and largest sensible pool: one full context, and `tokens_per_request` slots
    /// for each request-to-token row (by default a few thousand, else a full context each:
    /// every slot the table can address). Slot ids must fit in 32 bits.
    pub fn bounds(&self) -> (usize, usize) {
        let per_row = self
            .tokens_per_request
            .map_or(self.context_len, |t| t.min(self.context_len));
        // Never below one full context, whatever the cap per row.
        let max = self
            .req_to_token_rows
            .max(1)
            .saturating_mul(per_row)
            .max(self.context_len)
            .min(u32::MAX as usize);
        (self.context_len.clamp(1, max), max)
    }

    /// The pool size (pure: the caller reads memory and logs).
    pub fn derive(&self) -> KvPoolSize {
        let (min, max) = self.bounds();
        let Some(available) = self.available_bytes else {
            return KvPoolSize {
                max_total_tokens: FALLBACK_MAX_TOTAL_TOKENS.clamp(min, max),
                budget_bytes: None,
                limit: PoolLimit::Fallback,
            };
        };
        // f64 holds byte counts exactly up to 2^53 (8 PiB), far beyond any host.
        let share = (available as f64 * self.mem_fraction).floor() as u64;
        let budget = share.saturating_sub(self.weight_bytes);
        let slots = budget / self.kv_bytes_per_token.max(1);
        let slots = usize::try_from(slots).unwrap_or(usize::MAX);
        let (max_total_tokens, limit) = if slots < min {
            (min, PoolLimit::OneContext)
        } else if slots > max {
            (max, PoolLimit::ReqToTokenTable)
        } else {
            (slots, PoolLimit::Budget)
        };
        KvPoolSize {
            max_total_tokens,
            budget_bytes: Some(budget),
            limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BuiltinSize, KvBuffers, ModelConfig};

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn budget(available: Option<u64>, fraction: f64, weights: u64) -> KvBudget {
        KvBudget {
            available_bytes: available,
            mem_fraction: fraction,
            weight_bytes: weights,
            kv_bytes_per_token: 16 * 1024, // the built-in base model
            context_len: 8192,
            req_to_token_rows: 64,
            // As when --mem-fraction is given: the memory decides.
            tokens_per_request: None,
        }
    }

    #[test]
    fn the_default_pool_is_sized_for_the_requests_not_the_host() {
        // The built-in base model on a 24 GiB host: a full context per running request would
        // be 64 × 8192 slots × 16 KiB = 8 GiB; the default stops at a few thousand per request.
        let mut b = budget(Some(20 * GIB), 0.5, 0);
        assert_eq!(b.derive().max_total_tokens, 64 * 8192);
        b.tokens_per_request = Some(KV_TOKENS_PER_RUNNING_REQUEST);
        let size = b.derive();
        assert_eq!(size.max_total_tokens, 64 * KV_TOKENS_PER_RUNNING_REQUEST);
        assert_eq!(size.limit, PoolLimit::ReqToTokenTable);
        assert!(size.max_total_tokens as u64 * b.kv_bytes_per_token <= 2 * GIB);
        // A small memory budget still wins, and one full context is still the floor.
        let mut small = budget(Some(GIB), 0.5, 0);
        small.tokens_per_request = Some(KV_TOKENS_PER_RUNNING_REQUEST);
        assert_eq!(
            small.derive().max_total_tokens,
            (GIB / 2 / (16 * 1024)) as usize
        );
        let mut one = budget(Some(20 * GIB), 0.5, 0);
        one.req_to_token_rows = 1;
        one.tokens_per_request = Some(KV_TOKENS_PER_RUNNING_REQUEST);
        assert_eq!(one.derive().max_total_tokens, 8192);
    }

    #[test]
    fn derivation_table() {
        // (what, inputs, expected tokens, expected limit)
        let cases = [
            (
                "budget inside the bounds",
                budget(Some(4 * GIB), 0.5, 0),
                (2 * GIB / (16 * 1024)) as usize,
                PoolLimit::Budget,
            ),
            (
                "weights come out of the share",
                budget(Some(4 * GIB), 0.5, GIB),
                (GIB / (16 * 1024)) as usize,
                PoolLimit::Budget,
            ),
            (
                "a huge host stops at what the req-to-token table addresses",
                budget(Some(1024 * GIB), 0.9, 0),
                64 * 8192,
                PoolLimit::ReqToTokenTable,
            ),
            (
                "a tiny host still fits one full context",
                budget(Some(64 * MIB), 0.5, 0),
                8192,
                PoolLimit::OneContext,
            ),
            (
                "weights beyond the share: one context, budget zero",
                budget(Some(GIB), 0.1, 2 * GIB),
                8192,
                PoolLimit::OneContext,
            ),
            (
                "unreadable memory: the fixed fallback",
                budget(None, 0.5, 0),
                FALLBACK_MAX_TOTAL_TOKENS,
                PoolLimit::Fallback,
            ),
        ];
        for (what, inputs, tokens, limit) in cases {
            let got = inputs.derive();
            assert_eq!(got.max_total_tokens, tokens, "{what}");
            assert_eq!(got.limit, limit, "{what}");
        }
        assert_eq!(
            budget(Some(GIB), 0.1, 2 * GIB).derive().budget_bytes,
            Some(0)
        );
    }

    #[test]
    fn a_share_per_worker_divides_the_pool() {
        // `up --dp-size 4` gives each worker a quarter of the fraction.
        let one = budget(Some(8 * GIB), 0.5, 0).derive().max_total_tokens;
        let quarter = budget(Some(8 * GIB), 0.5 / 4.0, 0)
            .derive()
            .max_total_tokens;
        assert_eq!(quarter, one / 4);
    }

    #[test]
    fn the_fallback_is_clamped_too() {
        let mut b = budget(None, 0.5, 0);
        b.context_len = 65536; // one context exceeds the fallback
        assert_eq!(b.derive().max_total_tokens, 65536);
        b.context_len = 128;
        b.req_to_token_rows = 8; // the table addresses fewer than the fallback
        assert_eq!(b.derive().max_total_tokens, 1024);
    }

    #[test]
    fn slots_fit_in_32_bits() {
        let mut b = budget(Some(u64::MAX / 2), 1.0, 0);
        b.kv_bytes_per_token = 1;
        b.req_to_token_rows = usize::MAX / 2;
        assert_eq!(b.derive().max_total_tokens, u32::MAX as usize);
    }

    #[test]
    fn mem_fraction_must_be_in_zero_one() {
        for ok in ["0.5", "1", "0.01", " 0.9 "] {
            assert!(parse_mem_fraction(ok).is_ok(), "{ok}");
        }
        for bad in ["0", "-0.1", "1.01", "NaN", "nan", "inf", "", "half"] {
            let err = parse_mem_fraction(bad).unwrap_err();
            assert!(err.contains("(0, 1]"), "{bad}: {err}");
        }
    }

    #[test]
    fn meminfo_and_cgroup_parsing() {
        let meminfo = "MemTotal:       24684092 kB\nMemFree:          228228 kB\n\
                       MemAvailable:   22616604 kB\nBuffers:            1 kB\n";
        assert_eq!(meminfo_available_bytes(meminfo), Some(22616604 * 1024));
        assert_eq!(meminfo_available_bytes("MemTotal: 5 kB\n"), None);
        assert_eq!(meminfo_available_bytes("MemAvailable: x kB\n"), None);

        let v1_and_v2 = "4:memory:/a/b\n0::/system.slice/dpserve-worker@3.service\n";
        assert_eq!(
            cgroup_v2_path(v1_and_v2).as_deref(),
            Some("/system.slice/dpserve-worker@3.service")
        );
        assert_eq!(cgroup_v2_path("4:memory:/a/b\n"), None);

        assert_eq!(cgroup_headroom_bytes("max\n", "123\n"), None);
        assert_eq!(cgroup_headroom_bytes("1000\n", "300\n"), Some(700));
        assert_eq!(cgroup_headroom_bytes("1000", "3000"), Some(0));
    }

    #[test]
    fn this_host_reports_free_memory() {
        // Linux is the only platform dpserve targets; the reading must work here.
        let reading = read_available_memory().expect("free memory");
        assert!(reading.available_bytes > 0, "{reading:?}");
    }

    /// Resident bytes of the mapping that holds `addr`, from `/proc/self/smaps`.
    fn resident_bytes_of_mapping(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = first.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = (lo..hi).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("Rss:") {
                    let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap();
                    return kb * 1024;
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn a_large_pool_costs_no_memory_until_slots_are_written() {
        // 2^20 slots of the tiny model: 128 MiB per K or V buffer, 512 MiB in all, virtual.
        let config = ModelConfig::builtin(BuiltinSize::Tiny);
        let slots = 1 << 20;
        let mut kv = KvBuffers::new(&config, slots);
        let layer_bytes = (slots * config.kv_dim() * 4) as u64;
        // The mapping read may be merged with its neighbours (the other buffers, other tests'
        // allocations) and transparent huge pages may fault 2 MiB at a buffer's head: allow a
        // quarter of one buffer, far below the 4 buffers (512 MiB) resident.
        let allowed = layer_bytes / 4;
        let mut buffers: Vec<&mut [f32]> = kv.buffers_mut().collect();
        for buf in &buffers {
            let rss = resident_bytes_of_mapping(buf.as_ptr() as usize);
            assert!(
                rss < allowed,
                "a fresh KV buffer is {rss} bytes resident of {layer_bytes}"
            );
        }
        // Writing the last 4096 slots makes exactly those pages resident: the reading works.
        let row = config.kv_dim();
        let k0 = &mut buffers[0];
        let start = (slots - 4096) * row;
        k0[start..].fill(1.0);
        let rss = resident_bytes_of_mapping(buffers[0].as_ptr() as usize);
        let written = (4096 * row * 4) as u64;
        assert!(
            rss >= written && rss < allowed,
            "after writing {written} bytes, {rss} resident"
        );
    }
}
