//! `report.html`: one self-contained page — summary tables, the SVG plots inline, the example grid as a PNG
//! data URI, and a few lines of script that record in the page whether every plot and image rendered.

use std::fmt::Write as _;

use base64::Engine as _;

use super::{fmt_interval, html_escape, plots, Report};
use crate::metrics::{attack_radar, defense_radar};
use crate::Result;

const STYLE: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 10px;text-align:right}\
th{background:#f3f3f3}td.name,th.name{text-align:left}.pass{color:#17803d;font-weight:bold}\
.fail{color:#c0262d;font-weight:bold}figure{margin:1em 0}svg.armoury-plot{display:block;max-width:100%;height:auto}\
img.grid{image-rendering:pixelated;border:1px solid #ccc}";

/// Records, once the page has loaded, how many rows of the header (what was measured) rendered visibly
/// (`data-header-rows`), how many plots it has (`data-plots`), how many rendered with a non-empty
/// box and drawn shapes (`data-plots-rendered`), and any script or resource error (`data-errors`), as
/// attributes of `<body>`.
const SELF_CHECK: &str = "(function(){var errors=[];\
window.addEventListener('error',function(e){errors.push(e.message||((e.target&&e.target.id)||'resource')+' failed to load');},true);\
window.addEventListener('load',function(){var svgs=document.querySelectorAll('svg.armoury-plot'),ok=0;\
svgs.forEach(function(s){var b=s.getBBox();if(b.width>0&&b.height>0&&s.querySelectorAll('path,polyline,polygon,rect,circle,line').length>0)ok++;});\
document.querySelectorAll('img').forEach(function(i){if(!(i.complete&&i.naturalWidth>0))errors.push((i.id||'image')+' did not decode');});\
var hr=0;document.querySelectorAll('table#header tr').forEach(function(t){var r=t.getBoundingClientRect();if(r.width>0&&r.height>0&&t.textContent.trim().length>0)hr++;});\
var b=document.body;b.setAttribute('data-header-rows',hr);b.setAttribute('data-plots',svgs.length);b.setAttribute('data-plots-rendered',ok);b.setAttribute('data-errors',errors.join('; '));});})();";

/// The whole page.
pub(super) fn page(r: &Report) -> Result<String> {
    let mut h = String::new();
    let title = html_escape(&r.title);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title><style>{STYLE}</style>\
         <script>{SELF_CHECK}</script></head>\n<body>\n<h1>{title}</h1>\n"
    );
    header(&mut h, r);
    summary(&mut h, r);
    if !r.per_attack.is_empty() {
        h.push_str("<h2>Per attack</h2>\n");
        per_attack_table(&mut h, r);
        figure(&mut h, &plots::per_attack(r.clean_accuracy, &r.per_attack)?);
    }
    if !r.curves.is_empty() {
        h.push_str("<h2>Robust accuracy vs ε</h2>\n");
        for norm in super::norms_in(r.curves.iter().map(|c| c.norm.as_str())) {
            let curves: Vec<_> = r.curves.iter().filter(|c| c.norm == norm).collect();
            figure(&mut h, &plots::eps_curves(&norm, &curves, r.clean_accuracy)?);
        }
    }
    if !r.minimal_norms.is_empty() {
        h.push_str("<h2>Minimal perturbations</h2>\n");
        for norm in super::norms_in(r.minimal_norms.iter().map(|d| d.norm.as_str())) {
            let dists: Vec<_> = r.minimal_norms.iter().filter(|d| d.norm == norm).collect();
            figure(&mut h, &plots::norm_cdf(&norm, &dists)?);
        }
    }
    if let Some(flips) = &r.class_flips {
        h.push_str("<h2>Class flips</h2>\n");
        figure(&mut h, &plots::class_flips(flips)?);
    }
    let radar = match &r.radar {
        Some(radar) => Some(radar.clone()),
        None if !r.attack_metrics.is_empty() => Some(attack_radar(&r.attack_metrics)?),
        None => None,
    };
    if !r.attack_metrics.is_empty() || radar.is_some() {
        h.push_str("<h2>Attack metrics</h2>\n");
        attack_metrics_table(&mut h, r);
    }
    if let Some(radar) = &radar {
        figure(&mut h, &plots::radar(radar, "plot-radar", "Attack metrics (larger = stronger attack)")?);
    }
    defenses(&mut h, r)?;
    detectors(&mut h, r);
    stateful(&mut h, r);
    if !r.audit.is_empty() {
        h.push_str("<h2>Gradient-masking audit</h2>\n<table id=\"audit\"><tr><th class=\"name\">check</th><th>verdict</th><th class=\"name\">explanation</th></tr>\n");
        for v in &r.audit {
            let (class, word) = if v.pass { ("pass", "pass") } else { ("fail", "FAIL") };
            let _ = writeln!(
                h,
                "<tr><td class=\"name\">{}</td><td class=\"{class}\">{word}</td><td class=\"name\">{}</td></tr>",
                html_escape(&v.check),
                html_escape(&v.explanation)
            );
        }
        h.push_str("</table>\n");
    }
    examples(&mut h, r)?;
    h.push_str("</body></html>\n");
    Ok(h)
}

fn figure(h: &mut String, p: &plots::Plot) {
    let _ = writeln!(h, "<figure data-plot=\"{}\">{}</figure>", html_escape(&p.id), p.svg);
}

/// What was measured (model, data, threat model, date, version): the page's first table.
fn header(h: &mut String, r: &Report) {
    let rows = super::header::rendered(r, html_escape, |t| format!("<code>{}</code>", html_escape(t)));
    if rows.is_empty() {
        return;
    }
    h.push_str("<table id=\"header\">\n");
    for (label, text) in rows {
        let _ = writeln!(h, "<tr><th class=\"name\">{label}</th><td class=\"name\">{text}</td></tr>");
    }
    h.push_str("</table>\n<h2>Figures</h2>\n");
}

fn summary(h: &mut String, r: &Report) {
    let rows = [
        ("model", html_escape(&r.model)),
        ("threat model", format!("<code>{}</code>", html_escape(&r.threat_model_hash))),
        ("seed", r.seed.to_string()),
        ("samples", r.samples.to_string()),
        ("clean accuracy", fmt_interval(&r.clean_accuracy)),
        ("robust accuracy", fmt_interval(&r.robust_accuracy)),
    ];
    h.push_str("<table id=\"summary\">\n");
    let identity = r.identity.iter().flat_map(|i| {
        [
            ("model sha256", format!("<code>{}</code>", html_escape(&i.model_hash))),
            ("data", format!("{} (sha256 <code>{}</code>)", html_escape(&i.data), html_escape(&i.data_hash))),
            ("kernel path", html_escape(&i.kernel)),
            ("Armoury", html_escape(&i.version)),
        ]
    });
    for (k, v) in rows.into_iter().chain(identity) {
        let _ = writeln!(h, "<tr><th class=\"name\">{k}</th><td class=\"name\">{v}</td></tr>");
    }
    h.push_str("</table>\n");
}

fn per_attack_table(h: &mut String, r: &Report) {
    h.push_str("<table id=\"per-attack\"><tr><th class=\"name\">attack</th><th>robust accuracy after (95%)</th><th>broken</th><th>gradients / sample</th><th>queries / sample</th><th>seconds</th></tr>\n");
    for a in &r.per_attack {
        let cells: Vec<String> = super::summary_cells(a).iter().map(|c| format!("<td>{c}</td>")).collect();
        let _ = writeln!(h, "<tr><td class=\"name\">{}</td>{}</tr>", html_escape(&a.attack), cells.concat());
    }
    h.push_str("</table>\n");
}

fn attack_metrics_table(h: &mut String, r: &Report) {
    if r.attack_metrics.is_empty() {
        return;
    }
    h.push_str("<table id=\"attack-metrics\"><tr><th class=\"name\">attack</th><th>MR</th><th>ACAC</th><th>ACTC</th><th>rel. L0</th><th>rel. L2</th><th>rel. L∞</th><th>ASS</th><th>NTE</th><th>successes</th></tr>\n");
    for (name, m) in &r.attack_metrics {
        let cells: Vec<String> = super::metric_cells(m).iter().map(|c| format!("<td>{c}</td>")).collect();
        let _ = writeln!(h, "<tr><td class=\"name\">{}</td>{}</tr>", html_escape(name), cells.concat());
    }
    h.push_str("</table>\n<dl id=\"metric-notes\">\n");
    for (name, sentence) in super::METRIC_SENTENCES {
        let _ = writeln!(h, "<dt>{name}</dt><dd>{}</dd>", html_escape(sentence));
    }
    h.push_str("</dl>\n");
}

/// The defenses' table (undefended beside each defense) and their radar chart (DefenseEvaluate's metrics).
fn defenses(h: &mut String, r: &Report) -> Result<()> {
    if r.defenses.is_empty() {
        return Ok(());
    }
    h.push_str("<h2>Defenses</h2>\n<p>Each defense is attacked by the same cascade through its BPDA/EOT gradients \
                (adaptive); <em>transfer</em> is the defended model on the undefended cascade's adversarial inputs.</p>\n");
    h.push_str("<table id=\"defenses\"><tr>");
    for (k, c) in super::DEFENSE_COLUMNS.iter().enumerate() {
        let _ = write!(h, "<th{}>{c}</th>", if k == 0 { " class=\"name\"" } else { "" });
    }
    h.push_str("</tr>\n");
    for (name, cells) in super::defense_rows(r) {
        let cells: Vec<String> = cells.iter().map(|c| format!("<td>{c}</td>")).collect();
        let _ = writeln!(h, "<tr><td class=\"name\">{}</td>{}</tr>", html_escape(&name), cells.concat());
    }
    h.push_str("</table>\n");
    let _ = writeln!(
        h,
        "<p>DefenseEvaluate's metrics compare the two models on {}.</p>",
        html_escape(&r.defenses[0].metrics_inputs)
    );
    let radar = match &r.defense_radar {
        Some(radar) => radar.clone(),
        None => {
            let metrics: Vec<_> = r.defenses.iter().map(|d| (d.name.clone(), d.metrics.clone())).collect();
            defense_radar(&metrics)?
        }
    };
    figure(h, &plots::radar(&radar, "plot-defense-radar", "Defense metrics (larger = better defense)")?);
    Ok(())
}

/// The detectors' table: detection against the cascade's adversarial examples and the protected pipeline.
fn detectors(h: &mut String, r: &Report) {
    if r.detectors.is_empty() {
        return;
    }
    h.push_str("<h2>Detectors</h2>\n<table id=\"detectors\"><tr><th class=\"name\">detector</th><th>threshold (FPR fitted)</th><th>clean / adversarial scored</th><th>ROC AUC</th><th>TPR at 1% FPR</th><th>TPR at 5% FPR</th><th>protected clean accuracy</th><th>protected robust, non-adaptive</th><th>protected robust, adaptive</th><th>protected robust, every attack</th><th class=\"name\">adaptive attack</th></tr>\n");
    for d in &r.detectors {
        let cells: Vec<String> = super::detector_cells(d).iter().map(|c| format!("<td>{c}</td>")).collect();
        let _ = writeln!(
            h,
            "<tr><td class=\"name\">{}</td>{}<td class=\"name\">{}</td></tr>",
            html_escape(&d.name),
            cells.concat(),
            html_escape(&d.adaptive_attack)
        );
    }
    h.push_str("</table>\n");
}

/// The stateful detectors' table: one row per attack on the watched model.
fn stateful(h: &mut String, r: &Report) {
    if r.stateful.is_empty() {
        return;
    }
    h.push_str("<h2>Stateful detectors</h2>\n<table id=\"stateful\"><tr>");
    for (k, c) in super::STATEFUL_COLUMNS.iter().enumerate() {
        let class = if k < 2 { " class=\"name\"" } else { "" };
        let _ = write!(h, "<th{class}>{}</th>", html_escape(c));
    }
    h.push_str("</tr>\n");
    for row in super::stateful_rows(r) {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(k, c)| format!("<td{}>{}</td>", if k < 2 { " class=\"name\"" } else { "" }, html_escape(c)))
            .collect();
        let _ = writeln!(h, "<tr>{}</tr>", cells.concat());
    }
    h.push_str("</table>\n");
}

/// The examples as a table with labelled columns: true class, the clean image, the adversarial image and its
/// prediction, the perturbation scaled to its largest change, and the attack; images embedded as PNG data URIs.
fn examples(h: &mut String, r: &Report) -> Result<()> {
    if r.examples.is_empty() {
        return Ok(());
    }
    h.push_str(
        "<h2>Examples</h2>\n<p>The first adversarial examples the cascade found. The perturbation is adversarial − \
         clean, scaled per example so that its largest change (given below it) is white (+) or black (−); \
         mid-grey is unchanged.</p>\n<table id=\"examples\"><tr><th>#</th><th class=\"name\">true class</th>\
         <th>clean image</th><th>adversarial image</th><th class=\"name\">prediction on it</th>\
         <th>perturbation</th><th class=\"name\">attack</th></tr>\n",
    );
    let b64 = |png: &[u8]| base64::engine::general_purpose::STANDARD.encode(png);
    for (k, e) in r.examples.iter().take(super::MAX_EXAMPLES).enumerate() {
        let ([clean, adv, delta], largest) = super::example_pngs(e)?;
        let img = |what: &str, png: &[u8]| {
            format!(
                "<img id=\"example-{k}-{what}\" class=\"grid\" alt=\"example {k}: {what}\" \
                 src=\"data:image/png;base64,{}\">",
                b64(png)
            )
        };
        let _ = writeln!(
            h,
            "<tr><td>{k}</td><td class=\"name\">{}</td><td>{}</td><td>{}</td><td class=\"name\">{}</td>\
             <td>{}<br>±{largest:.4}</td><td class=\"name\">{}</td></tr>",
            html_escape(&super::class_name(&r.class_names, e.label)),
            img("clean", &clean),
            img("adversarial", &adv),
            html_escape(&super::class_name(&r.class_names, e.adversarial_prediction)),
            img("perturbation", &delta),
            html_escape(&e.attack)
        );
    }
    h.push_str("</table>\n");
    Ok(())
}
