//! `report.md`: the report's figures as Markdown tables (no plots).

use std::fmt::Write as _;

use super::{fmt_interval, Report};

/// Table cells must not contain a `|` or a line break.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// The Markdown summary of `r`.
pub(super) fn summary(r: &Report) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "# {}\n", cell(&r.title));
    let header = super::header::rendered(r, cell, |t| format!("`{}`", cell(t)));
    if !header.is_empty() {
        let _ = writeln!(m, "| what was measured | |\n|---|---|");
        for (label, text) in header {
            let _ = writeln!(m, "| {label} | {text} |");
        }
        m.push_str("\n## Figures\n\n");
    }
    let _ = writeln!(m, "| | |\n|---|---|");
    let _ = writeln!(m, "| model | {} |", cell(&r.model));
    let _ = writeln!(m, "| threat model | `{}` |", cell(&r.threat_model_hash));
    let _ = writeln!(m, "| seed | {} |\n| samples | {} |", r.seed, r.samples);
    if let Some(i) = &r.identity {
        let _ = writeln!(m, "| model sha256 | `{}` |", cell(&i.model_hash));
        let _ = writeln!(m, "| data | {} (sha256 `{}`) |", cell(&i.data), cell(&i.data_hash));
        let _ = writeln!(m, "| kernel path | {} |\n| Armoury | {} |", cell(&i.kernel), cell(&i.version));
    }
    let _ = writeln!(m, "| clean accuracy | {} |", fmt_interval(&r.clean_accuracy));
    let _ = writeln!(m, "| robust accuracy | {} |", fmt_interval(&r.robust_accuracy));
    if !r.per_attack.is_empty() {
        m.push_str("\n## Per attack (cumulative, in cascade order)\n\n");
        m.push_str(
            "| attack | robust accuracy after (95%) | broken | gradients / sample | queries / sample | seconds |\n",
        );
        m.push_str("|---|---|---|---|---|---|\n");
        for a in &r.per_attack {
            let _ = writeln!(m, "| {} | {} |", cell(&a.attack), super::summary_cells(a).join(" | "));
        }
    }
    for c in &r.curves {
        let _ = writeln!(
            m,
            "\n## Accuracy vs ε: {} ({})\n\n| ε | accuracy (95%) |\n|---|---|",
            cell(&c.attack),
            cell(&c.norm)
        );
        for (e, a) in c.eps.iter().zip(&c.accuracy) {
            let _ = writeln!(m, "| {e} | {} |", fmt_interval(a));
        }
    }
    if !r.minimal_norms.is_empty() {
        m.push_str(
            "\n## Minimal perturbation norms\n\n| attack | norm | found | median | mean |\n|---|---|---|---|---|\n",
        );
        for d in &r.minimal_norms {
            let mut found: Vec<f64> = d.norms.iter().flatten().copied().collect();
            found.sort_by(f64::total_cmp);
            let (median, mean) = if found.is_empty() {
                ("—".to_string(), "—".to_string())
            } else {
                let k = found.len();
                let med = if k % 2 == 1 { found[k / 2] } else { 0.5 * (found[k / 2 - 1] + found[k / 2]) };
                (format!("{med:.4}"), format!("{:.4}", found.iter().sum::<f64>() / k as f64))
            };
            let _ = writeln!(
                m,
                "| {} | {} | {}/{} | {median} | {mean} |",
                cell(&d.attack),
                cell(&d.norm),
                found.len(),
                d.norms.len()
            );
        }
    }
    attack_metrics(&mut m, r);
    defenses(&mut m, r);
    if let Some(f) = &r.class_flips {
        m.push_str("\n## Class flips (rows: true class, columns: adversarial prediction)\n\n| |");
        for c in &f.classes {
            let _ = write!(m, " {} |", cell(c));
        }
        let _ = writeln!(m, "\n|---|{}", "---|".repeat(f.classes.len()));
        for (c, row) in f.classes.iter().zip(&f.counts) {
            let counts: Vec<String> = row.iter().map(|v| v.to_string()).collect();
            let _ = writeln!(m, "| {} | {} |", cell(c), counts.join(" | "));
        }
    }
    if !r.audit.is_empty() {
        m.push_str("\n## Gradient-masking audit\n\n| check | verdict | explanation |\n|---|---|---|\n");
        for v in &r.audit {
            let _ = writeln!(
                m,
                "| {} | {} | {} |",
                cell(&v.check),
                if v.pass { "pass" } else { "**FAIL**" },
                cell(&v.explanation)
            );
        }
    }
    m
}

fn attack_metrics(m: &mut String, r: &Report) {
    if r.attack_metrics.is_empty() {
        return;
    }
    m.push_str(
        "\n## Attack metrics\n\n| attack | MR | ACAC | ACTC | rel. L0 | rel. L2 | rel. L∞ | ASS | NTE | successes |\n",
    );
    m.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for (name, a) in &r.attack_metrics {
        let _ = writeln!(m, "| {} | {} |", cell(name), super::metric_cells(a).join(" | "));
    }
    m.push('\n');
    for (name, sentence) in super::METRIC_SENTENCES {
        let _ = writeln!(m, "- **{name}**: {sentence}");
    }
}

fn defenses(m: &mut String, r: &Report) {
    if !r.defenses.is_empty() {
        m.push_str("\n## Defenses (robust accuracy: the cascade through the defense's BPDA/EOT gradients)\n\n");
        let _ =
            writeln!(m, "| {} |\n|{}", super::DEFENSE_COLUMNS.join(" | "), "---|".repeat(super::DEFENSE_COLUMNS.len()));
        for (name, cells) in super::defense_rows(r) {
            let _ = writeln!(m, "| {} | {} |", cell(&name), cells.join(" | "));
        }
        let _ = writeln!(
            m,
            "\nDefenseEvaluate's metrics compare the two models on {}.",
            cell(&r.defenses[0].metrics_inputs)
        );
    }
    if !r.detectors.is_empty() {
        m.push_str("\n## Detectors\n\n| detector | threshold (FPR fitted) | clean / adversarial scored | ROC AUC | TPR at 1% FPR | TPR at 5% FPR | protected clean accuracy | protected robust, non-adaptive | protected robust, adaptive | protected robust, every attack | adaptive attack |\n");
        m.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
        for d in &r.detectors {
            let _ = writeln!(
                m,
                "| {} | {} | {} |",
                cell(&d.name),
                super::detector_cells(d).join(" | "),
                cell(&d.adaptive_attack)
            );
        }
    }
    if !r.stateful.is_empty() {
        m.push_str("\n## Stateful detectors (query attacks, one sample at a time from an empty history)\n\n");
        let _ = writeln!(
            m,
            "| {} |\n|{}",
            super::STATEFUL_COLUMNS.join(" | "),
            "---|".repeat(super::STATEFUL_COLUMNS.len())
        );
        for row in super::stateful_rows(r) {
            let _ = writeln!(m, "| {} |", row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | "));
        }
    }
}
