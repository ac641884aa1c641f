//! Simulated GPU ranks (`--device sim`): the real worker (scheduler, pools, radix cache,
//! messages, traces) with the forward pass replaced by a roofline cost model of a named GPU and
//! model ([`cost`], [`profile`]). A step sleeps for its modelled time and yields deterministic
//! pseudo-tokens, so routing and scheduling can be studied at a scale no CPU could compute.
//! Nothing here is a model's output: a simulated rank says so in its log, its status and
//! `/get_server_info`. See `docs/SIM.md`.

pub mod cost;
pub mod lockstep;
pub mod profile;

use std::time::{Duration, Instant};

pub use cost::{CostModel, PoolSize, SeqWork, StepCost, SIM_MAX_POOL_TOKENS};
pub use lockstep::LockStep;
pub use profile::{SimProfile, DEFAULT_SIM_PROFILE};

use crate::model::{BuiltinSize, ModelConfig, SeqInput};
use protocol::hash::splitmix64 as mix;

/// A bad profile or `--sim-config` file.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("unknown sim profile `{name}` (built-in: {known})")]
    UnknownProfile { name: String, known: String },
    #[error("sim profile field {field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("--sim-config {path}: {reason}")]
    Config { path: String, reason: String },
}

pub type Result<T> = std::result::Result<T, SimError>;

/// The logit of a step's pseudo-token; every other token's is 0. High enough that sampling at
/// any usual temperature picks it (e^30 against 8191 others), finite so penalties still apply.
const PSEUDO_LOGIT: f32 = 30.0;

/// What a simulated rank runs instead of a model. It speaks the built-in tokenizer's vocabulary
/// (so the tokenizer actor works unchanged) and never emits a special token, so a request
/// ends at its `max_new_tokens` or a stop condition its client asked for.
#[derive(Debug)]
pub struct SimModel {
    config: ModelConfig,
    cost: CostModel,
    seed: u64,
    /// `--sim-lock-step`: the cluster's shared rounds; `None` steps alone.
    lock_step: Option<LockStep>,
    /// When the last step's modelled time ended (wall clock), for the next step's start.
    last_end: std::sync::Mutex<Option<Instant>>,
}

impl SimModel {
    /// A simulated rank of `profile`; `seed` varies the pseudo-tokens.
    pub fn new(profile: SimProfile, seed: u64) -> Self {
        let mut config = ModelConfig::builtin(BuiltinSize::Base);
        // A simulated rank never joins a cluster of real ones (the controller refuses a
        // `Hello` whose model id differs from the cluster's).
        config.model_id = format!("sim:{}", profile.name);
        config.max_position_embeddings = profile.context_len;
        SimModel {
            config,
            cost: CostModel::new(profile),
            seed,
            lock_step: None,
            last_end: std::sync::Mutex::new(None),
        }
    }

    /// Steps in lock-step with the other ranks sharing `lock_step` (`--sim-lock-step`).
    pub fn with_lock_step(mut self, lock_step: LockStep) -> Self {
        self.lock_step = Some(lock_step);
        self
    }

    /// The shared rounds this rank steps in, if it steps in lock-step.
    pub fn lock_step(&self) -> Option<&LockStep> {
        self.lock_step.as_ref()
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    pub fn profile(&self) -> &SimProfile {
        self.cost.profile()
    }

    /// One step: sleeps for its modelled time and returns, per sequence, a logits row whose
    /// largest entry is the pseudo-token after its last new token.
    pub fn forward(&self, seqs: &[SeqInput<'_>]) -> Vec<f32> {
        let started = Instant::now();
        let vocab = self.config.vocab_size;
        let mut logits = vec![0.0; seqs.len() * vocab];
        for (row, s) in logits.chunks_exact_mut(vocab).zip(seqs) {
            row[self.next_token(s) as usize] = PSEUDO_LOGIT;
        }
        self.wait(seqs, started);
        logits
    }

    /// One step of embedding requests: sleeps like a prefill and returns, per sequence, a
    /// pseudo hidden state (deterministic in its tokens).
    pub fn forward_hidden(&self, seqs: &[SeqInput<'_>]) -> Vec<f32> {
        let started = Instant::now();
        let hidden = self.config.hidden_size;
        let mut out = Vec::with_capacity(seqs.len() * hidden);
        for s in seqs {
            let mut h = s
                .new_tokens
                .iter()
                .fold(self.seed, |h, &t| mix(h ^ u64::from(t)));
            out.extend((0..hidden).map(|_| {
                h = mix(h);
                (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            }));
        }
        self.wait(seqs, started);
        out
    }

    /// The modelled time of a step over `seqs`.
    pub fn step_time(&self, seqs: &[SeqInput<'_>]) -> Duration {
        let work: Vec<SeqWork> = seqs
            .iter()
            .map(|s| SeqWork {
                new_tokens: s.new_tokens.len(),
                context: s.start_pos,
            })
            .collect();
        self.cost.step(&work).time
    }

    /// Sleeps until the step's modelled time since its start has passed, and in lock-step
    /// until the round it joins ends. A step begun within the model's per-step overhead of the
    /// last one's modelled end starts from that end: the host's own time between steps
    /// (scheduling, sending outputs, a late wake) is what `step_overhead_ms` models, so it is
    /// not added again, and back-to-back steps keep the model's period at any `speed`.
    fn wait(&self, seqs: &[SeqInput<'_>], started: Instant) {
        let speed = self.cost.profile().speed;
        let wall = self.step_time(seqs).div_f64(speed);
        let allowance = Duration::from_secs_f64(self.cost.profile().step_overhead_ms / 1e3 / speed);
        let mut last_end = self.last_end.lock().unwrap_or_else(|e| e.into_inner());
        let end = step_begin(*last_end, started, allowance) + wall;
        *last_end = Some(end);
        drop(last_end);
        let left = end.saturating_duration_since(Instant::now());
        if let Some(lock_step) = &self.lock_step {
            match lock_step.step(left) {
                Ok(()) => return,
                // The step still takes its own time; the rounds are lost for this step only.
                Err(e) => tracing::warn!(path = %lock_step.path().display(), error = %e,
                                         "sim lock-step state unusable; stepping alone"),
            }
        }
        std::thread::sleep(left);
    }

    /// The pseudo-token after `s`: a hash of the seed, the last new token and its position, so
    /// the same prompt gives the same output on any rank, in any batch, cached or not. Never a
    /// special token (ids below the first ordinary word, or an end-of-sequence id).
    pub fn next_token(&self, s: &SeqInput<'_>) -> u32 {
        let last = s.new_tokens.last().copied().unwrap_or(0);
        let pos = (s.start_pos + s.new_tokens.len()) as u64;
        let first = FIRST_ORDINARY_ID;
        let span = (self.config.vocab_size as u32).saturating_sub(first).max(1) as u64;
        let mut h = mix(self.seed ^ mix(u64::from(last) ^ (pos << 32)));
        loop {
            let token = first + (h % span) as u32;
            if !self.config.eos_token_ids.contains(&token) {
                return token;
            }
            h = mix(h);
        }
    }
}

/// The built-in vocabulary's special tokens (unknown, BOS, EOS) are the ids below this.
const FIRST_ORDINARY_ID: u32 = protocol::builtin::EOS_ID + 1;

/// When a step that began at `started` starts in modelled time: at the last step's modelled
/// end if it began within `allowance` of it (the host's time between steps is the model's
/// per-step overhead), else when it began (the rank was idle).
fn step_begin(last_end: Option<Instant>, started: Instant, allowance: Duration) -> Instant {
    match last_end {
        Some(end) if started.saturating_duration_since(end) <= allowance => end.min(started),
        _ => started,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_to_back_steps_keep_the_model_s_period() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // The host took 0.5 ms between steps, within the 1 ms allowance: the step starts at
        // the last one's end, so the host's time is not added to the model's.
        assert_eq!(step_begin(Some(t0), t0 + ms(1) / 2, ms(1)), t0);
        // Idle for 5 ms, or the first step: it starts when it began.
        assert_eq!(step_begin(Some(t0), t0 + ms(5), ms(1)), t0 + ms(5));
        assert_eq!(step_begin(None, t0 + ms(5), ms(1)), t0 + ms(5));
        // Never before it began.
        assert_eq!(step_begin(Some(t0 + ms(2)), t0, ms(1)), t0);
    }

    fn model() -> SimModel {
        // No overhead and huge rates: the tests do not wait on the clock.
        let profile = SimProfile {
            step_overhead_ms: 0.0,
            peak_tflops: 1e9,
            mem_bandwidth_gbs: 1e12,
            ..SimProfile::cpu_calibrated()
        };
        SimModel::new(profile, 7)
    }

    fn input<'a>(tokens: &'a [u32], start_pos: usize, slots: &'a [u32]) -> SeqInput<'a> {
        SeqInput {
            new_tokens: tokens,
            start_pos,
            slots,
        }
    }

    #[test]
    fn pseudo_tokens_are_deterministic_ordinary_and_spread() {
        let m = model();
        let slots = [0u32; 64];
        let a = m.forward(&[input(&[5, 6, 7], 0, &slots), input(&[9], 40, &slots)]);
        let b = m.forward(&[input(&[7], 2, &slots)]);
        let vocab = m.config().vocab_size;
        let argmax = |row: &[f32]| kernels::argmax(row) as u32;
        // The same last token at the same position: the same next token, batched or not.
        assert_eq!(argmax(&a[..vocab]), argmax(&b[..vocab]));
        let mut seen = std::collections::HashSet::new();
        for pos in 0..2000 {
            let t = m.next_token(&input(&[pos as u32 % 50 + 3], pos, &slots));
            assert!(t >= FIRST_ORDINARY_ID && (t as usize) < vocab, "{t}");
            seen.insert(t);
        }
        assert!(seen.len() > 1500, "{} distinct of 2000", seen.len());
    }

    #[test]
    fn a_step_takes_its_modelled_time() {
        let profile = SimProfile {
            step_overhead_ms: 30.0,
            ..SimProfile::cpu_calibrated()
        };
        let m = SimModel::new(profile, 0);
        let slots = [0u32; 4];
        let seqs = [input(&[3], 3, &slots)];
        let want = m.step_time(&seqs);
        assert!(want >= Duration::from_millis(30));
        let started = Instant::now();
        m.forward(&seqs);
        assert!(started.elapsed() >= want);
    }

    #[test]
    fn the_config_speaks_the_builtin_vocabulary_under_its_own_id() {
        let m = model();
        assert_eq!(m.config().vocab_size, protocol::builtin::VOCAB_SIZE);
        assert_eq!(m.config().model_id, "sim:cpu-calibrated");
        let hidden = m.forward_hidden(&[input(&[4, 5], 0, &[0, 1])]);
        assert_eq!(hidden.len(), m.config().hidden_size);
        assert!(hidden.iter().any(|&x| x != 0.0));
    }
}
