//! The radar chart's data (MindArmour's `RadarMetric`): several normalised metrics per series, one axis each.
//! MindArmour only shows the chart on screen; here it is data, drawn into the report by [`crate::report`].

use super::AttackMetrics;
use crate::report::{Radar, RadarSeries};
use crate::{Error, Result};

/// A validated [`Radar`]: at least 3 axes, at least one series, each with one value per axis, every value
/// finite and in [0, 1] (normalise before: a radar chart compares shapes, so its axes must share a scale).
///
/// Errors: fewer than 3 axes, no series, a series of another length, a value outside [0, 1] (named).
pub fn radar(axes: Vec<String>, series: Vec<RadarSeries>) -> Result<Radar> {
    const OP: &str = "radar";
    if axes.len() < 3 {
        return Err(Error::invalid(OP, format!("a radar chart needs at least 3 axes, got {}", axes.len())));
    }
    if series.is_empty() {
        return Err(Error::invalid(OP, "a radar chart needs at least one series"));
    }
    for s in &series {
        if s.values.len() != axes.len() {
            return Err(Error::invalid(
                OP,
                format!("series '{}' has {} values for {} axes", s.name, s.values.len(), axes.len()),
            ));
        }
        if let Some((axis, v)) = axes.iter().zip(&s.values).find(|(_, v)| !(0.0..=1.0).contains(*v)) {
            return Err(Error::invalid(OP, format!("series '{}', axis '{axis}': {v} is not in [0, 1]", s.name)));
        }
    }
    Ok(Radar { axes, series })
}

/// The radar chart of attacks' metrics, every axis oriented so that larger means a stronger attack: MR, ACAC,
/// 1 − ACTC, ASS (omitted when an attack's images were too small for SSIM) and NTE, each already in [0, 1].
/// MindArmour's examples plot ACTC itself, whose direction is the opposite of the other axes'.
///
/// Errors: no attacks.
pub fn attack_radar(attacks: &[(String, AttackMetrics)]) -> Result<Radar> {
    let with_ssim = attacks.iter().all(|(_, m)| m.avg_ssim.is_some());
    let mut axes = vec!["MR".to_string(), "ACAC".into(), "1 − ACTC".into()];
    if with_ssim {
        axes.push("ASS".into());
    }
    axes.push("NTE".into());
    let series = attacks
        .iter()
        .map(|(name, m)| {
            let mut values = vec![m.misclassification_rate, m.avg_confidence_adversarial, 1.0 - m.avg_confidence_true];
            if with_ssim {
                values.push(m.avg_ssim.unwrap_or(0.0));
            }
            values.push(m.nte);
            RadarSeries { name: name.clone(), values: values.into_iter().map(|v| v.clamp(0.0, 1.0)).collect() }
        })
        .collect();
    radar(axes, series)
}
