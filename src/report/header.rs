//! The report's header: what was measured, in a reader's terms — the model (its file and content hash), the data
//! (name, samples, hash), the threat model (norm, ε grid, attacks and budgets; its hash as a detail), the date,
//! Armoury's version, the seed and the kernel path. The same rows head `report.md` and `report.html`.

use serde::{Deserialize, Serialize};

use super::Report;
use crate::eval::identity::short_hash as short;

/// What an evaluation measured, beyond the figures (see the module doc).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Header {
    /// The data set's name (e.g. `fashion-mnist`).
    pub data: String,
    /// The threat model's name.
    pub threat_model: String,
    /// Its norm (`linf`, `l2`, `l1`).
    pub norm: String,
    /// Its ε grid, in input units.
    pub eps: Vec<f64>,
    /// The cascade's attacks with their budgets, in order (`apgd-ce(steps=100)`).
    pub attacks: Vec<String>,
    /// The minimum-norm attacks.
    pub minimal: Vec<String>,
    /// When the report was made (UTC, RFC 3339).
    pub date: String,
    /// The Armoury version that made it.
    pub version: String,
}

impl Header {
    /// A header dated now, of this crate's version.
    pub fn now(data: &str, threat: &crate::eval::ThreatModel) -> Header {
        Header {
            data: data.to_string(),
            threat_model: threat.name.clone(),
            norm: threat.norm.clone(),
            eps: threat.eps.clone(),
            attacks: threat.attacks.iter().map(|a| a.label()).collect(),
            minimal: threat.minimal.iter().map(|a| a.label()).collect(),
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// The norm as a reader writes it.
pub(super) fn norm_symbol(norm: &str) -> &str {
    match norm {
        "linf" => "L∞",
        "l2" => "L2",
        "l1" => "L1",
        other => other,
    }
}

/// A cell of the header: plain text, or code (a hash or a name to copy).
enum Cell {
    Text(String),
    Code(String),
}

/// The header's rows, (label, cells), for both renderers; empty when the report has no header.
fn rows(r: &Report) -> Vec<(&'static str, Vec<Cell>)> {
    let Some(h) = &r.header else { return Vec::new() };
    let mut rows = Vec::new();
    let id = r.identity.as_ref();
    let mut model = vec![Cell::Text(r.model.clone())];
    if let Some(i) = id {
        model.extend([Cell::Text(" — sha256 ".into()), Cell::Code(short(&i.model_hash))]);
    }
    rows.push(("model", model));
    let mut data = vec![Cell::Text(format!("{}, {} samples", h.data, r.samples))];
    if let Some(i) = id {
        data.extend([Cell::Text(" — sha256 ".into()), Cell::Code(short(&i.data_hash))]);
    }
    rows.push(("data", data));
    let eps: Vec<String> = h.eps.iter().map(|e| format!("{e}")).collect();
    let grid = if eps.len() == 1 { format!("ε = {}", eps[0]) } else { format!("ε ∈ {{{}}}", eps.join(", ")) };
    rows.push((
        "threat model",
        vec![
            Cell::Text(format!("{}: {}, {grid} — ", h.threat_model, norm_symbol(&h.norm))),
            Cell::Code(short(&r.threat_model_hash)),
        ],
    ));
    rows.push(("attacks (cascade)", vec![Cell::Text(h.attacks.join(" → "))]));
    if !h.minimal.is_empty() {
        rows.push(("minimal perturbations", vec![Cell::Text(h.minimal.join(", "))]));
    }
    rows.push(("seed", vec![Cell::Text(r.seed.to_string())]));
    rows.push(("date", vec![Cell::Text(h.date.clone())]));
    let mut version = vec![Cell::Text(h.version.clone())];
    if let Some(i) = id {
        version.push(Cell::Text(format!(", {} kernels", i.kernel)));
    }
    rows.push(("Armoury", version));
    rows
}

/// The header's rows with each cell rendered by `text` or `code` and joined: (label, rendered value).
pub(super) fn rendered(
    r: &Report,
    text: impl Fn(&str) -> String,
    code: impl Fn(&str) -> String,
) -> Vec<(&str, String)> {
    rows(r)
        .into_iter()
        .map(|(label, cells)| {
            let value = cells
                .iter()
                .map(|c| match c {
                    Cell::Text(t) => text(t),
                    Cell::Code(t) => code(t),
                })
                .collect();
            (label, value)
        })
        .collect()
}
