//! How many prompt tokens one prefill step may compute so that it ends within a target time
//! (`--prefill-step-target-ms`): a worker serves status, aborts and SIGTERM only between steps,
//! so on a slow CPU an unbounded 2048-token chunk would leave it deaf for a minute. Not the
//! per-request chunking (`--chunked-prefill-size`) or the pool limits; those still apply.
//!
//! The cost per prompt token is learnt from the steps themselves (an exponential average of
//! seconds per token, which follows the context growing); until the first measurement a step
//! takes at most `PROBE_TOKENS`. Cost O(1) per step.

use std::time::Duration;

/// A step never gets fewer tokens than this, however slow the machine: progress first.
pub const MIN_TOKENS: usize = 16;
/// Tokens of the first step, before any cost is known.
pub const PROBE_TOKENS: usize = 128;
/// Weight of the newest measurement in the average.
const ALPHA: f64 = 0.5;

#[derive(Debug, Clone)]
pub struct StepBudget {
    target: Option<Duration>,
    secs_per_token: Option<f64>,
}

impl StepBudget {
    /// `None`: no time bound (the token limits alone decide).
    pub fn new(target: Option<Duration>) -> Self {
        StepBudget {
            target,
            secs_per_token: None,
        }
    }

    /// Most prompt tokens the next prefill step should compute, at most `max`.
    pub fn tokens(&self, max: usize) -> usize {
        let Some(target) = self.target else {
            return max;
        };
        let fit = match self.secs_per_token {
            Some(c) if c > 0.0 => (target.as_secs_f64() / c).min(usize::MAX as f64) as usize,
            Some(_) => max,
            None => PROBE_TOKENS,
        };
        fit.max(MIN_TOKENS).min(max)
    }

    /// A prefill step computed `tokens` prompt tokens in `took`.
    pub fn observe(&mut self, tokens: usize, took: Duration) {
        if tokens == 0 {
            return;
        }
        let c = took.as_secs_f64() / tokens as f64;
        self.secs_per_token = Some(match self.secs_per_token {
            Some(old) => ALPHA * c + (1.0 - ALPHA) * old,
            None => c,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn unbounded_without_a_target() {
        let mut b = StepBudget::new(None);
        assert_eq!(b.tokens(8192), 8192);
        b.observe(100, 100 * MS);
        assert_eq!(b.tokens(8192), 8192);
    }

    #[test]
    fn probes_then_fits_the_target_and_follows_the_cost() {
        let mut b = StepBudget::new(Some(500 * MS));
        assert_eq!(b.tokens(8192), PROBE_TOKENS);
        assert_eq!(b.tokens(50), 50);
        // 10 ms a token: 50 tokens fit in 500 ms.
        b.observe(128, 1280 * MS);
        assert_eq!(b.tokens(8192), 50);
        // Faster steps raise it (averaged), never above the limit.
        b.observe(50, 50 * MS);
        assert_eq!(b.tokens(8192), 90); // 0.5 · 1 ms + 0.5 · 10 ms = 5.5 ms a token
        b.observe(1000, 1000 * MS);
        b.observe(1000, 1000 * MS);
        b.observe(1000, 1000 * MS);
        assert!(b.tokens(8192) > 300 && b.tokens(8192) <= 500);
        assert_eq!(b.tokens(64), 64);
    }

    #[test]
    fn a_very_slow_machine_still_makes_progress() {
        let mut b = StepBudget::new(Some(MS));
        b.observe(16, Duration::from_secs(10));
        assert_eq!(b.tokens(8192), MIN_TOKENS);
        assert_eq!(b.tokens(3), 3);
        b.observe(16, Duration::ZERO);
        b.observe(16, Duration::ZERO);
        assert!(b.tokens(8192) >= MIN_TOKENS);
    }
}
