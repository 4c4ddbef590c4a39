//! How well a detector's scores separate clean from adversarial inputs: the ROC curve, its area (ROC AUC) and
//! the true-positive rate at a false-positive rate calibrated as a deployed detector is ([`calibrate_threshold`]).
//!
//! Scores follow the [`super::Detector`] convention: higher is more suspicious, and an input is flagged when its
//! score is strictly above the threshold. Negatives are the clean inputs, positives the adversarial ones.

use super::calibrate_threshold;
use crate::{Error, Result};

fn check(op: &'static str, negatives: &[f32], positives: &[f32]) -> Result<()> {
    if negatives.is_empty() || positives.is_empty() {
        return Err(Error::invalid(op, "both the clean and the adversarial scores must be non-empty"));
    }
    if negatives.iter().chain(positives).any(|s| s.is_nan()) {
        return Err(Error::NonFinite { op });
    }
    Ok(())
}

/// The area under the ROC curve: the probability that a random adversarial score is above a random clean one,
/// ties counting one half (the Mann–Whitney U statistic divided by N⁻·N⁺), computed from average ranks in
/// O(N log N). 1 separates perfectly, 0.5 is chance.
///
/// Errors: an empty side or a NaN score.
pub fn roc_auc(negatives: &[f32], positives: &[f32]) -> Result<f64> {
    check("roc_auc", negatives, positives)?;
    let mut all: Vec<(f32, bool)> =
        negatives.iter().map(|&s| (s, false)).chain(positives.iter().map(|&s| (s, true))).collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Sum of the positives' ranks (1-based), tied scores sharing their average rank.
    let mut rank_sum = 0.0f64;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let average = (i + 1 + j) as f64 / 2.0;
        rank_sum += average * all[i..j].iter().filter(|e| e.1).count() as f64;
        i = j;
    }
    let (n, p) = (negatives.len() as f64, positives.len() as f64);
    Ok((rank_sum - p * (p + 1.0) / 2.0) / (n * p))
}

/// The fraction of `positives` flagged at the threshold [`calibrate_threshold`] fits on `negatives` at
/// `target_fpr` — what a detector deployed at that false-positive rate catches — and that threshold.
pub fn tpr_at_fpr(negatives: &[f32], positives: &[f32], target_fpr: f32) -> Result<(f64, f32)> {
    check("tpr_at_fpr", negatives, positives)?;
    let threshold = calibrate_threshold(negatives, target_fpr)?;
    let caught = positives.iter().filter(|&&s| s > threshold).count();
    Ok((caught as f64 / positives.len() as f64, threshold))
}

/// The ROC curve as (false-positive rate, true-positive rate) points, from (0, 0) — a threshold above every
/// score — through one point per distinct score taken as the threshold in decreasing order (flagged: strictly
/// above it), to (1, 1).
pub fn roc_curve(negatives: &[f32], positives: &[f32]) -> Result<Vec<(f64, f64)>> {
    check("roc_curve", negatives, positives)?;
    let mut all: Vec<(f32, bool)> =
        negatives.iter().map(|&s| (s, false)).chain(positives.iter().map(|&s| (s, true))).collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (n, p) = (negatives.len() as f64, positives.len() as f64);
    let (mut fp, mut tp) = (0usize, 0usize);
    let mut points = vec![(0.0, 0.0)];
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            if all[j].1 {
                tp += 1;
            } else {
                fp += 1;
            }
            j += 1;
        }
        // Threshold just below all[i].0: everything from the top to j is flagged.
        points.push((fp as f64 / n, tp as f64 / p));
        i = j;
    }
    Ok(points)
}
