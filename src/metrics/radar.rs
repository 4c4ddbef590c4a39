//! The radar chart's data (MindArmour's `RadarMetric`): several normalised metrics per series, one axis each.
//! MindArmour only shows the chart on screen; here it is data, drawn into the report by [`crate::report`]:
//! [`attack_radar`] for the cascade's attacks, [`defense_radar`] for defenses (DefenseEvaluate's metrics).

use super::{AttackMetrics, DefenseMetrics};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// One polygon of a radar chart.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RadarSeries {
    /// The legend entry.
    pub name: String,
    /// One value in [0, 1] per axis.
    pub values: Vec<f64>,
}

/// A radar chart of normalised metrics (MindArmour's `RadarMetric`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Radar {
    /// The axes' names, clockwise from the top.
    pub axes: Vec<String>,
    /// The polygons.
    pub series: Vec<RadarSeries>,
}

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

/// The radar chart of defenses' [`DefenseMetrics`] (MindArmour's `RadarMetric` over `DefenseEvaluate`), every
/// axis mapped to [0, 1] with larger meaning a better defense: (1 + CAV) / 2, CRR, 1 − CSR, 1 − CCV and
/// 1 − COS / ln 2 (the Jensen–Shannon divergence in nats is at most ln 2). CCV and COS are undefined when no
/// sample is classified correctly by both models; their axes are then 0 (nothing to show for the defense).
///
/// MindArmour normalises each axis over the series (`scale="norm"`: divided by the axis' maximum), which makes
/// a single defense a regular polygon whatever its figures; the fixed mapping keeps one defense readable and
/// several comparable.
///
/// Errors: no defenses.
pub fn defense_radar(defenses: &[(String, DefenseMetrics)]) -> Result<Radar> {
    let axes = ["(1 + CAV) / 2", "CRR", "1 − CSR", "1 − CCV", "1 − COS / ln 2"].map(String::from).to_vec();
    let series = defenses
        .iter()
        .map(|(name, m)| {
            let values = [
                (1.0 + m.cav) / 2.0,
                m.crr,
                1.0 - m.csr,
                m.ccv.map_or(0.0, |v| 1.0 - v),
                m.cos.map_or(0.0, |v| 1.0 - v / std::f64::consts::LN_2),
            ];
            RadarSeries { name: name.clone(), values: values.into_iter().map(|v| v.clamp(0.0, 1.0)).collect() }
        })
        .collect();
    radar(axes, series)
}
