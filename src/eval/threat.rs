//! The threat model as data: the norm, the ε grid, the input bounds, the attacks of the cascade with their
//! parameters and budgets, the minimum-norm attacks, and the seed — read from JSON, checked field by field, and
//! hashed (SHA-256 of its canonical JSON) into every result, ledger and report, so that two figures are only
//! compared when they answer the same question.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::attack::Norm;
use crate::{Error, Result};

/// One attack of a threat model: a registry name (`armoury_attacks::registry`) and the settings that override
/// its defaults; `None` keeps the attack's own.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AttackSpec {
    /// The attack's registry name (`apgd-ce`, `apgd-t`, `fab-t`, `square`, …).
    pub name: String,
    /// Iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    /// Step size in input units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_size: Option<f64>,
    /// Random restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<usize>,
    /// Model queries per sample (black-box attacks' budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queries: Option<u64>,
    /// Target classes tried in turn (APGD-T, FAB-T).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<usize>,
}

impl AttackSpec {
    /// An attack by name with its defaults.
    pub fn named(name: &str) -> AttackSpec {
        AttackSpec { name: name.into(), steps: None, step_size: None, restarts: None, queries: None, targets: None }
    }

    /// A label for tables: the name with the settings given.
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = self.steps {
            parts.push(format!("steps={s}"));
        }
        if let Some(s) = self.step_size {
            parts.push(format!("step={s}"));
        }
        if let Some(r) = self.restarts {
            parts.push(format!("restarts={r}"));
        }
        if let Some(q) = self.queries {
            parts.push(format!("queries={q}"));
        }
        if let Some(t) = self.targets {
            parts.push(format!("targets={t}"));
        }
        if parts.is_empty() {
            self.name.clone()
        } else {
            format!("{}({})", self.name, parts.join(", "))
        }
    }
}

fn default_batch() -> usize {
    500
}

/// What the evaluation attacks with (see the module doc).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ThreatModel {
    /// A name for reports.
    pub name: String,
    /// `linf`, `l2` or `l1`.
    pub norm: String,
    /// The budgets, ascending, in input units; the headline figure is at the largest.
    pub eps: Vec<f64>,
    /// The input bounds the model must have (`None`: whatever the model says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounds: Option<[f64; 2]>,
    /// The cascade, in order: each attack runs only on the samples every earlier one left robust.
    pub attacks: Vec<AttackSpec>,
    /// Minimum-norm attacks run once on every correctly classified sample, for the distribution of minimal
    /// perturbations (may be empty).
    #[serde(default)]
    pub minimal: Vec<AttackSpec>,
    /// The seed of every attack (each attack and ε gets its own stream of it).
    #[serde(default)]
    pub seed: u64,
    /// Samples per attack call (does not change any result).
    #[serde(default = "default_batch")]
    pub batch_size: usize,
}

impl ThreatModel {
    /// AutoAttack's standard L∞ list at `eps`: APGD-CE, APGD-T (9 targets), FAB-T (9 targets), Square (5,000
    /// queries); DeepFool for the minimal perturbations.
    pub fn autoattack_linf(eps: f64) -> ThreatModel {
        ThreatModel::autoattack("linf", eps)
    }

    /// AutoAttack's standard L2 list at `eps`: the same four attacks in L2.
    pub fn autoattack_l2(eps: f64) -> ThreatModel {
        ThreatModel::autoattack("l2", eps)
    }

    /// AutoAttack's L1 list at `eps` (Croce & Hein 2021, "Mind the box"): L1-APGD-CE (5 restarts) and L1-APGD-T
    /// (5 targets) as the authors' L1 standard version sets them, then FAB-T (9 targets) and Square in L1; FAB in
    /// L1 for the minimal perturbations (DeepFool has no L1 version).
    pub fn autoattack_l1(eps: f64) -> ThreatModel {
        let mut tm = ThreatModel::autoattack("l1", eps);
        tm.name = "autoattack-l1".into();
        tm.attacks[0].restarts = Some(5);
        tm.attacks[1].targets = Some(5);
        tm.minimal = vec![AttackSpec::named("fab")];
        tm
    }

    fn autoattack(norm: &str, eps: f64) -> ThreatModel {
        let with = |name: &str, f: &dyn Fn(&mut AttackSpec)| {
            let mut s = AttackSpec::named(name);
            f(&mut s);
            s
        };
        ThreatModel {
            name: format!("autoattack-standard-{norm}"),
            norm: norm.into(),
            eps: vec![eps],
            bounds: None,
            attacks: vec![
                with("apgd-ce", &|s| s.steps = Some(100)),
                with("apgd-t", &|s| (s.steps, s.targets) = (Some(100), Some(9))),
                with("fab-t", &|s| (s.steps, s.targets) = (Some(100), Some(9))),
                with("square", &|s| s.queries = Some(5_000)),
            ],
            minimal: vec![AttackSpec::named("deepfool")],
            seed: 0,
            batch_size: default_batch(),
        }
    }

    /// Parses and checks a threat model from JSON; an error names the offending field (`attacks[1].steps`).
    pub fn from_json(text: &str) -> Result<ThreatModel> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let tm: ThreatModel = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            Error::invalid("threat model", format!("field `{path}`: {}", e.inner()))
        })?;
        tm.check()?;
        Ok(tm)
    }

    /// Reads a threat model file (JSON).
    pub fn load(path: &Path) -> Result<ThreatModel> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        ThreatModel::from_json(&text).map_err(|e| Error::bad_file(path, e.to_string()))
    }

    /// The norm.
    pub fn norm(&self) -> Result<Norm> {
        self.norm.parse().map_err(|_| field("norm", format!("'{}' is not linf, l2 or l1", self.norm)))
    }

    /// Checks every field; the error names the first bad one.
    pub fn check(&self) -> Result<()> {
        self.norm()?;
        if self.eps.is_empty() {
            return Err(field("eps", "needs at least one budget"));
        }
        for (i, &e) in self.eps.iter().enumerate() {
            if !e.is_finite() || e <= 0.0 || e > f32::MAX as f64 {
                return Err(field(&format!("eps[{i}]"), format!("{e} must be finite and > 0")));
            }
            if i > 0 && e <= self.eps[i - 1] {
                return Err(field(&format!("eps[{i}]"), "budgets must be strictly ascending"));
            }
        }
        if let Some([lo, hi]) = self.bounds {
            if !(lo.is_finite() && hi.is_finite() && lo < hi) {
                return Err(field("bounds", format!("[{lo}, {hi}] must be finite with min < max")));
            }
        }
        if self.attacks.is_empty() {
            return Err(field("attacks", "the cascade needs at least one attack"));
        }
        for (list, specs) in [("attacks", &self.attacks), ("minimal", &self.minimal)] {
            for (i, s) in specs.iter().enumerate() {
                if s.name.trim().is_empty() {
                    return Err(field(&format!("{list}[{i}].name"), "is empty"));
                }
                if s.step_size.is_some_and(|v| !v.is_finite() || v <= 0.0) {
                    return Err(field(&format!("{list}[{i}].step_size"), "must be finite and > 0"));
                }
                if s.steps == Some(0) {
                    return Err(field(&format!("{list}[{i}].steps"), "must be at least 1 (0 steps attack nothing)"));
                }
                if s.queries == Some(0) {
                    return Err(field(
                        &format!("{list}[{i}].queries"),
                        "must be at least 1 (0 queries attack nothing)",
                    ));
                }
                if s.restarts == Some(0) {
                    return Err(field(&format!("{list}[{i}].restarts"), "must be at least 1"));
                }
                if s.targets == Some(0) {
                    return Err(field(&format!("{list}[{i}].targets"), "must be at least 1"));
                }
            }
        }
        if self.batch_size == 0 {
            return Err(field("batch_size", "must be at least 1"));
        }
        Ok(())
    }

    /// SHA-256 (hex) of the canonical JSON of the threat model (fields in declaration order, defaults written
    /// out): the same threat model always hashes the same, whatever the file's spacing or key order.
    pub fn hash(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("a threat model always serialises");
        Sha256::digest(&canonical).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Checks the model's bounds against the threat model's.
    pub fn check_bounds(&self, model: (f32, f32)) -> Result<()> {
        match self.bounds {
            Some([lo, hi]) if (lo as f32, hi as f32) != model => Err(field(
                "bounds",
                format!("[{lo}, {hi}] but the model's input bounds are [{}, {}]", model.0, model.1),
            )),
            _ => Ok(()),
        }
    }
}

fn field(name: &str, msg: impl std::fmt::Display) -> Error {
    Error::invalid("threat model", format!("field `{name}`: {msg}"))
}
