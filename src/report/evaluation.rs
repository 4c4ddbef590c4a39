//! A ledger's figures as the report's data model ([`crate::report::Report`]): robust accuracy after each attack
//! with its Wilson interval, the security curves over the ε grid, the minimal-perturbation norms, the class-flip
//! matrix, MindArmour's attack metrics and radar chart of the cascade after each attack, the audit's verdicts and
//! the first adversarial examples.

use crate::classifier::Classifier;
use crate::data::{builtin_class_names, Dataset};
use crate::eval::{Ledger, Summary, ThreatModel};
use crate::metrics::{attack_metrics, attack_radar, AttackMetrics};
use crate::report::{AttackSummary, ClassFlips, EpsCurve, ExampleImage, Header, NormDistribution, Report, Verdict};
use crate::tensor::Tensor;
use crate::Result;

/// How many adversarial examples a report shows.
pub const EXAMPLES: usize = 8;

/// The report of a complete ledger evaluated on `data` with `model`.
pub fn to_report(
    model: &dyn Classifier,
    data: &Dataset,
    tm: &ThreatModel,
    ledger: &Ledger,
    s: &Summary,
    audit: Vec<Verdict>,
) -> Result<Report> {
    let last = tm.eps.len() - 1;
    let label = |j: usize| s.per_attack[j].attack.clone();
    let per_attack = attack_summaries(s, last);
    let curves = s
        .per_attack
        .iter()
        .map(|a| EpsCurve {
            attack: format!("after {}", a.attack),
            norm: tm.norm.clone(),
            eps: tm.eps.clone(),
            accuracy: a.robust_after.clone(),
        })
        .collect();
    let minimal_norms = s
        .minimal_norms
        .iter()
        .map(|(attack, norms)| NormDistribution { attack: attack.clone(), norm: tm.norm.clone(), norms: norms.clone() })
        .collect();
    let classes = s.class_flips.len();
    let class_flips =
        Some(ClassFlips { classes: (0..classes).map(|c| c.to_string()).collect(), counts: s.class_flips.clone() });
    let attack_metrics = cascade_metrics(model, data, ledger, s, last)?;
    let radar = if attack_metrics.is_empty() { None } else { Some(attack_radar(&attack_metrics)?) };
    let [c, h, w] = data.image_shape();
    let examples = ledger
        .records
        .iter()
        .filter_map(|r| Some((r, r.broken.as_ref()?, r.adversarial.as_ref()?)))
        .take(EXAMPLES)
        .map(|(r, b, adv)| ExampleImage {
            shape: [c, h, w],
            original: data.image(r.index).map(<[f32]>::to_vec).unwrap_or_default(),
            adversarial: adv.clone(),
            label: r.label,
            adversarial_prediction: b.prediction,
            attack: label(b.attack_index),
        })
        .collect();
    let mut report = Report {
        title: format!("Robustness of {} under {}", s.model, tm.name),
        model: s.model.clone(),
        threat_model_hash: s.threat_model_hash.clone(),
        identity: Some(ledger.identity.clone()),
        header: Some(Header::now(&ledger.identity.data, tm)),
        class_names: Vec::new(),
        seed: tm.seed,
        samples: s.samples,
        clean_accuracy: s.clean_accuracy,
        robust_accuracy: s.headline(),
        per_attack,
        curves,
        minimal_norms,
        class_flips,
        attack_metrics,
        radar,
        audit,
        examples,
        defenses: Vec::new(),
        defense_radar: None,
        detectors: Vec::new(),
        stateful: Vec::new(),
    };
    if let Some(names) = builtin_class_names(&ledger.identity.data, classes) {
        report.set_class_names(names);
    }
    Ok(report)
}

/// Each attack of the summary's cascade at ε number `eps_index`: robust accuracy after it with its interval,
/// samples broken, cost.
pub fn attack_summaries(s: &Summary, eps_index: usize) -> Vec<AttackSummary> {
    s.per_attack
        .iter()
        .map(|a| AttackSummary {
            attack: a.attack.clone(),
            robust_accuracy_after: a.robust_after[eps_index.min(a.robust_after.len().saturating_sub(1))],
            broken: a.broken,
            mean_gradients: a.mean_gradients,
            mean_queries: a.mean_queries,
            seconds: a.seconds,
        })
        .collect()
}

/// MindArmour's attack metrics of the cascade after each attack, at the headline ε: over the correctly
/// classified samples, the adversarial input of those broken so far, the clean one otherwise.
fn cascade_metrics(
    model: &dyn Classifier,
    data: &Dataset,
    ledger: &Ledger,
    s: &Summary,
    last: usize,
) -> Result<Vec<(String, AttackMetrics)>> {
    let correct: Vec<_> = ledger.records.iter().filter(|r| r.clean_correct()).collect();
    if correct.is_empty() {
        return Ok(Vec::new());
    }
    let [c, h, w] = data.image_shape();
    let shape = [correct.len(), c, h, w];
    let clean: Vec<f32> = correct.iter().flat_map(|r| data.image(r.index).unwrap_or(&[]).to_vec()).collect();
    let x = Tensor::from_vec(clean, &shape)?;
    let labels: Vec<usize> = correct.iter().map(|r| r.label).collect();
    let (lo, hi) = model.bounds();
    let mut out = Vec::new();
    for (j, a) in s.per_attack.iter().enumerate() {
        let adv: Vec<f32> = correct
            .iter()
            .flat_map(|r| match (&r.broken, &r.adversarial) {
                (Some(b), Some(v)) if (b.eps_index == last && b.attack_index <= j) || b.eps_index < last => v.clone(),
                _ => data.image(r.index).unwrap_or(&[]).to_vec(),
            })
            .collect();
        let xa = Tensor::from_vec(adv, &shape)?;
        let probs = model.probabilities(&xa)?;
        out.push((format!("after {}", a.attack), attack_metrics(&x, &xa, &labels, &probs, None, (hi - lo) as f64)?));
    }
    Ok(out)
}
