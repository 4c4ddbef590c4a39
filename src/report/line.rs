//! A report in a terminal and in a log: the summary table a person reads after a run, one line per defense,
//! detector and stateful detector, and the JSON line a machine reads (figures rounded to 4 decimals).

use serde_json::{json, Map, Value};

use super::{header, Report, StatefulAttack};

fn round(v: f64) -> f64 {
    (v * 1e4).round() / 1e4
}

/// The summary table (Markdown): the threat model in words, clean accuracy, robust accuracy after each attack of
/// the cascade with its 95% interval and cost, and the audit's verdicts.
pub fn summary_table(r: &Report) -> String {
    let c = r.clean_accuracy;
    let threat = match &r.header {
        Some(h) => format!(
            "threat model `{}` (sha256 {}), ε = {} ({}), {} samples",
            h.threat_model,
            r.threat_model_hash,
            h.eps.last().copied().unwrap_or(0.0),
            header::norm_symbol(&h.norm),
            r.samples
        ),
        None => format!("threat model sha256 {}, {} samples", r.threat_model_hash, r.samples),
    };
    let mut md = format!(
        "# Robustness of {}\n\n{threat}\n\n| after | robust accuracy | 95% CI | broken | gradients/sample | \
         queries/sample | seconds |\n|---|---|---|---|---|---|---|\n| clean | {:.4} | [{:.4}, {:.4}] | | | | |\n",
        r.model, c.value, c.lo, c.hi
    );
    for a in &r.per_attack {
        let i = a.robust_accuracy_after;
        md += &format!(
            "| {} | {:.4} | [{:.4}, {:.4}] | {} | {:.1} | {:.1} | {:.2} |\n",
            a.attack, i.value, i.lo, i.hi, a.broken, a.mean_gradients, a.mean_queries, a.seconds
        );
    }
    if !r.audit.is_empty() {
        md += "\n## Gradient-masking audit\n\n| check | verdict | explanation |\n|---|---|---|\n";
        for v in &r.audit {
            md += &format!("| {} | {} | {} |\n", v.check, if v.pass { "pass" } else { "FAIL" }, v.explanation);
        }
    }
    md
}

/// One line per defense, detector and stateful detector of the report, for a terminal or a log.
pub fn protection_lines(r: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    for d in &r.defenses {
        lines.push(format!(
            "defense {}: clean {:.4}, robust {:.4} (adaptive at ε = {}, per sample over every attack), transfer {:.4}",
            d.name, d.clean_accuracy.value, d.robust_accuracy.value, d.eps, d.transfer_accuracy.value
        ));
    }
    for d in &r.detectors {
        lines.push(format!(
            "detector {}: AUC {:.4}, TPR@1% {:.4}, TPR@5% {:.4}; protected clean {:.4}, robust {:.4} (per sample: \
             non-adaptive {:.4}, adaptive {})",
            d.name,
            d.auc,
            d.tpr_at_1fpr,
            d.tpr_at_5fpr,
            d.protected_clean_accuracy,
            d.protected_robust_accuracy,
            d.protected_robust_non_adaptive,
            d.protected_robust_adaptive.map_or("not run".into(), |v| format!("{v:.4}")),
        ));
    }
    for d in &r.stateful {
        for a in &d.attacks {
            lines.push(format!(
                "{} vs {}: {} of {} attacked samples flagged, mean queries to the first flag {}, {} fooled unflagged; \
                 benign streams flagged {} of {}",
                d.name,
                a.attack,
                a.flagged,
                a.attacked,
                a.mean_queries_to_flag.map_or("—".into(), |q| format!("{q:.1}")),
                a.evaded,
                d.benign_flagged,
                d.benign_streams
            ));
        }
    }
    lines
}

/// The report's figures as one JSON object (the line a machine reads): model, clean and robust accuracy with
/// its interval, robust accuracy after each attack, the audit's verdicts, the identity, and the defenses',
/// detectors' and stateful detectors' figures when there are any. A command adds its own fields (its name, the
/// seconds it took, where the report is).
pub fn json_line(r: &Report) -> Value {
    let head = r.robust_accuracy;
    let per_attack: Map<String, Value> =
        r.per_attack.iter().map(|a| (a.attack.clone(), round(a.robust_accuracy_after.value).into())).collect();
    let audit: Map<String, Value> =
        r.audit.iter().map(|v| (v.check.clone(), (if v.pass { "pass" } else { "fail" }).into())).collect();
    let mut line = json!({
        "model": r.model,
        "clean_accuracy": round(r.clean_accuracy.value),
        "robust_accuracy": round(head.value),
        "robust_accuracy_ci": [round(head.lo), round(head.hi)],
        "per_attack": per_attack,
        "audit": audit,
        "identity": r.identity,
    });
    if !r.defenses.is_empty() {
        let d: Map<String, Value> =
            r.defenses.iter().map(|d| (d.name.clone(), round(d.robust_accuracy.value).into())).collect();
        line["defenses"] = d.into();
    }
    if !r.detectors.is_empty() {
        let d: Map<String, Value> = r
            .detectors
            .iter()
            .map(|d| {
                let v = json!({
                    "auc": round(d.auc),
                    "tpr_at_1fpr": round(d.tpr_at_1fpr),
                    "tpr_at_5fpr": round(d.tpr_at_5fpr),
                    "protected_clean_accuracy": round(d.protected_clean_accuracy),
                    "protected_robust_accuracy": round(d.protected_robust_accuracy),
                });
                (d.name.clone(), v)
            })
            .collect();
        line["detectors"] = d.into();
    }
    if !r.stateful.is_empty() {
        let share = |a: &StatefulAttack| round(a.flagged as f64 / a.attacked.max(1) as f64);
        let s: Map<String, Value> = r
            .stateful
            .iter()
            .map(|d| {
                let attack = |adaptive: bool| d.attacks.iter().find(|a| a.adaptive == adaptive);
                let v = json!({
                    "flagged": attack(false).map(share),
                    "mean_queries_to_flag":
                        attack(false).and_then(|a| a.mean_queries_to_flag).map(|q| (q * 10.0).round() / 10.0),
                    "flagged_adaptive": attack(true).map(share),
                    "benign_flag_rate": round(d.benign_flagged as f64 / d.benign_streams.max(1) as f64),
                });
                ("similarity".to_string(), v)
            })
            .collect();
        line["stateful"] = s.into();
    }
    line
}
