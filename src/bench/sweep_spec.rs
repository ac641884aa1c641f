//! `--sweep`, `--sweep-repeats` and `--slo-attainment` checked: what a sweep is asked to do.
//! Beside the sweep, not in it, so that the bench's plan holds it without importing the sweep
//! that runs it.

use anyhow::Context;

/// What `--sweep` asks for, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSpec {
    /// Ascending, distinct, positive.
    pub rates: Vec<f64>,
    pub repeats: usize,
    /// The share of requests within the SLO a rate must reach, in (0, 1].
    pub attainment: f64,
    /// Run every rate; otherwise a method stops after its first rate that misses the target.
    pub all_rates: bool,
    /// Rates that may be added (`--sweep-extend`): [`EXTEND_FACTOR`] times the highest while
    /// some method still meets the target there, the lowest over it while every method misses
    /// it there.
    pub extend: usize,
}

/// `--sweep-extend` when the rates are a preset's.
pub const DEFAULT_SWEEP_EXTEND: usize = 4;
/// Each added rate over the one before.
pub const EXTEND_FACTOR: f64 = 1.5;

impl SweepSpec {
    /// `--sweep` (empty: the preset's rates), `--sweep-repeats`, `--slo-attainment`.
    pub fn new(
        rates: &[f64],
        preset_rates: Option<&[f64]>,
        repeats: usize,
        attainment: f64,
    ) -> anyhow::Result<SweepSpec> {
        let given = if rates.is_empty() {
            preset_rates.filter(|r| !r.is_empty()).context(
                "--sweep names no rate (e.g. --sweep 1,1.5,2; only a preset brings its own)",
            )?
        } else {
            rates
        };
        for &r in given {
            anyhow::ensure!(
                r.is_finite() && r > 0.0,
                "--sweep: every rate must be a positive number, got {r}"
            );
        }
        let mut rates = given.to_vec();
        rates.sort_by(f64::total_cmp);
        rates.dedup();
        anyhow::ensure!(repeats >= 1, "--sweep-repeats must be at least 1");
        anyhow::ensure!(
            attainment > 0.0 && attainment <= 1.0,
            "--slo-attainment must be a share in (0, 1], got {attainment}"
        );
        Ok(SweepSpec {
            rates,
            repeats,
            attainment,
            all_rates: false,
            extend: 0,
        })
    }
}
