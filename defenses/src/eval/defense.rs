//! A defense (an input transformation in front of the model): its adaptive cascade and the transferred
//! worst-case inputs, per sample, and its figures.

use armoury::eval::{self, CascadeRun, Ledger, ThreatModel};
use armoury::metrics::{defense_metrics, wilson, Z95};
use armoury::report::{AttackSummary, DefenseReport};
use armoury::{Classifier, Error, Result};
use serde::{Deserialize, Serialize};

use super::{probabilities, survived_all, Context};
use crate::registry::transform;
use crate::transforms::Defended;

/// A defense's per-sample results.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DefenseSlice {
    /// The spec it was built from.
    pub spec: String,
    /// The transform's name with its settings.
    pub name: String,
    /// The adaptive cascade's ledger on the defended model.
    pub ledger: Ledger,
    /// Whether the defended model classifies the undefended cascade's worst-case input correctly.
    pub transfer_ok: Vec<bool>,
    /// Undefended and defended probabilities on those inputs, row-major `[samples, classes]`.
    pub raw: Vec<f32>,
    /// See `raw`.
    pub defended: Vec<f32>,
}

/// The threat model of a defense's adaptive cascade: the headline ε, no minimum-norm attacks.
pub fn defense_threat(tm: &ThreatModel, name: &str) -> Result<ThreatModel> {
    Ok(ThreatModel {
        name: format!("{} + {name}", tm.name),
        eps: vec![*tm.eps.last().ok_or_else(|| Error::invalid("evaluation", "the threat model has no ε"))?],
        minimal: Vec::new(),
        ..tm.clone()
    })
}

/// The defended model attacked by the cascade at the headline ε on the run's samples (resumable:
/// `defense-K[-i-of-n].json` in the output directory), and both models on the undefended cascade's worst-case
/// inputs.
pub(super) fn slice(cx: &Context<'_>, k: usize, spec: &str) -> Result<DefenseSlice> {
    let t = transform(spec)?;
    let name = t.name();
    let defended = Defended::shared(cx.model.clone(), t)?.with_eot(cx.eot, cx.threat.seed)?;
    let tm = defense_threat(cx.threat, &name)?;
    let run = CascadeRun {
        threat: &tm,
        build: cx.build,
        model_name: format!("{} behind {name}", cx.ledger.model),
        identity: cx.ledger.identity.clone(),
        range: cx.ledger.range,
        total_samples: cx.ledger.total_samples,
        chunk: tm.batch_size,
        state: Some(cx.file(&format!("defense-{k}"))),
        max_steps: None,
        progress: Some(cx.progress),
    };
    let ledger = eval::run_cascade(&defended, &cx.set.test, &run)?;
    let (x, y, _) = eval::worst_case_inputs(cx.ledger, &cx.set.test)?;
    let (raw, def) = (cx.model.probabilities(&x)?, defended.probabilities(&x)?);
    let pred = armoury::classifier::argmax_rows(&def);
    Ok(DefenseSlice {
        spec: spec.to_string(),
        name,
        ledger,
        transfer_ok: pred.iter().zip(&y).map(|(p, l)| p == l).collect(),
        raw: raw.iter().copied().collect(),
        defended: def.iter().copied().collect(),
    })
}

impl DefenseSlice {
    /// The defense's figures (`tm`: the evaluation's threat model; `labels`: the samples' true labels; `classes`:
    /// the model's): clean accuracy and the adaptive cascade attack by attack, then the transferred worst-case
    /// inputs; its robust accuracy is the share of samples that survive *every* one of them (per sample, never
    /// the smaller of the means), transfer accuracy and DefenseEvaluate's metrics on the transferred inputs.
    pub fn report(&self, tm: &ThreatModel, labels: &[usize], classes: usize) -> Result<DefenseReport> {
        let dtm = defense_threat(tm, &self.name)?;
        let eps = *dtm.eps.last().expect("defense_threat keeps the headline ε");
        let summary = eval::summarise(&dtm, &self.ledger, classes);
        let n = self.ledger.records.len();
        if self.transfer_ok.len() != n || labels.len() != n {
            return Err(Error::invalid(
                "defense report",
                format!(
                    "{}: {n} cascade records, {} transfer results, {} labels",
                    self.name,
                    self.transfer_ok.len(),
                    labels.len()
                ),
            ));
        }
        let last = dtm.eps.len() - 1;
        let cascade: Vec<bool> = self.ledger.records.iter().map(|r| r.robust_at(last, None)).collect();
        let robust = survived_all(&[&cascade, &self.transfer_ok])?;
        let count = |v: &[bool]| v.iter().filter(|&&b| b).count();
        let mut per_attack = armoury::report::attack_summaries(&summary, 0);
        per_attack.push(AttackSummary {
            attack: "the undefended cascade's worst-case inputs (transferred)".into(),
            robust_accuracy_after: wilson(count(&robust), n, Z95)?,
            broken: count(&cascade) - count(&robust),
            mean_gradients: 0.0,
            mean_queries: 1.0,
            seconds: 0.0,
        });
        Ok(DefenseReport {
            name: self.name.clone(),
            clean_accuracy: summary.clean_accuracy,
            robust_accuracy: wilson(count(&robust), n, Z95)?,
            eps,
            per_attack,
            transfer_accuracy: wilson(count(&self.transfer_ok), n, Z95)?,
            metrics: defense_metrics(
                &probabilities(&self.raw, classes)?,
                &probabilities(&self.defended, classes)?,
                labels,
            )?,
            metrics_inputs: worst_case_words(eps, n),
        })
    }
}

/// The inputs DefenseEvaluate's metrics compare on, in words.
pub fn worst_case_words(eps: f64, n: usize) -> String {
    format!(
        "the undefended cascade's worst-case inputs at ε ≤ {eps} ({n} samples: the adversarial example where the \
         cascade broke the undefended model, the clean image elsewhere)"
    )
}
