//! The picker of the scorer-then-picker methods (Dynamo's `WorkerScorer` / `WorkerPicker`
//! split): each method scores every rank its own way, then takes one rank among the best
//! scores, drawn uniformly, as Dynamo's and llm-d's pickers break ties.

use protocol::hash::SplitMix64;

/// Which end of the scores is best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Best {
    Lowest,
    Highest,
}

/// The row of `values` taken: one drawn uniformly (one draw of `rng`) among the rows whose
/// value is the best. `values` must not be empty.
pub(crate) fn pick_best(values: &[f64], best: Best, rng: &mut SplitMix64) -> usize {
    let top = match best {
        Best::Lowest => values.iter().copied().fold(f64::INFINITY, f64::min),
        Best::Highest => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    };
    let tied: Vec<usize> = (0..values.len()).filter(|&i| values[i] == top).collect();
    tied[rng.below(tied.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_is_taken_and_ties_are_drawn_uniformly() {
        let mut rng = SplitMix64::new(7);
        assert_eq!(pick_best(&[3.0, 1.0, 2.0], Best::Lowest, &mut rng), 1);
        assert_eq!(pick_best(&[3.0, 1.0, 2.0], Best::Highest, &mut rng), 0);
        let mut seen = [0usize; 4];
        for _ in 0..4000 {
            seen[pick_best(&[1.0, 0.5, 1.0, 1.0], Best::Highest, &mut rng)] += 1;
        }
        assert_eq!(seen[1], 0);
        assert!(
            seen.iter()
                .enumerate()
                .filter(|(i, _)| *i != 1)
                .all(|(_, &n)| (1100..1600).contains(&n)),
            "{seen:?}"
        );
    }
}
