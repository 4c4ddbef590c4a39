//! Several detectors combined into one: flag when any, all, or a strict majority of them flag.
//!
//! MindArmour's `EnsembleDetector` indexes its vote counts by the members' flags instead of by member, so its
//! "vote" and "all" are not what they say; here each member's decision is counted once, by member.

use armoury::{calibrate_threshold, Detector, Error, Result, Tensor};

use super::with_value;

/// How [`Ensemble`] combines its members' decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Flag when at least one member flags.
    Any,
    /// Flag when every member flags.
    All,
    /// Flag when more than half of the members flag.
    Vote,
}

impl Policy {
    /// How many members must flag, of `k`.
    pub fn required(self, k: usize) -> usize {
        match self {
            Policy::Any => 1,
            Policy::All => k,
            Policy::Vote => k / 2 + 1,
        }
    }
}

/// Detectors combined by a [`Policy`].
///
/// Each member's *margin* is `(s_i − τ_i) / w_i`: positive exactly when member i flags (s_i > τ_i), with `w_i`
/// its clean scores' spread (τ_i minus their median, 1 until fitted) so that margins of detectors on different
/// scales are comparable. The ensemble's score is the j-th largest margin, j = [`Policy::required`]: above 0
/// exactly when at least j members flag. With threshold 0 — the threshold of an ensemble built from fitted
/// members — [`Detector::detect`] is exactly the policy applied to the members' own decisions. [`Detector::fit`]
/// fits every member at the target false-positive rate, then calibrates the ensemble's own threshold on its score
/// so that the ensemble as a whole flags at most that fraction of the clean inputs (k members each at rate f can
/// together flag up to k·f under `Any`).
pub struct Ensemble {
    members: Vec<Box<dyn Detector>>,
    policy: Policy,
    spreads: Vec<f32>,
    threshold: Option<f32>,
    name: String,
}

impl Ensemble {
    /// The members combined by `policy`; threshold 0 (the policy on the members' decisions).
    pub fn new(members: Vec<Box<dyn Detector>>, policy: Policy) -> Result<Ensemble> {
        if members.is_empty() {
            return Err(Error::invalid("Ensemble::new", "an ensemble needs at least one detector"));
        }
        let name = format!("ensemble-{}", format!("{policy:?}").to_lowercase());
        let spreads = vec![1.0; members.len()];
        Ok(Ensemble { members, policy, spreads, threshold: Some(0.0), name })
    }

    /// Renames it (for reports).
    pub fn named(mut self, name: &str) -> Ensemble {
        self.name = name.to_string();
        self
    }

    /// The members.
    pub fn members(&self) -> &[Box<dyn Detector>] {
        &self.members
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Each member's threshold, an error if one has none.
    fn member_thresholds(&self) -> Result<Vec<f32>> {
        self.members
            .iter()
            .map(|m| {
                m.threshold().filter(|t| !t.is_nan()).ok_or_else(|| {
                    Error::invalid(
                        "Ensemble",
                        format!("member '{}' has no threshold: fit it or the ensemble", m.name()),
                    )
                })
            })
            .collect()
    }

    /// The members' margins `[N][k]` (see [`Ensemble`]).
    pub fn margins(&self, x: &Tensor) -> Result<Vec<Vec<f32>>> {
        let taus = self.member_thresholds()?;
        let scores: Vec<Vec<f32>> = self.members.iter().map(|m| m.score(x)).collect::<Result<_>>()?;
        let n = scores[0].len();
        if scores.iter().any(|s| s.len() != n) {
            return Err(Error::invalid("Ensemble", "members returned different numbers of scores"));
        }
        Ok((0..n)
            .map(|i| (0..self.members.len()).map(|j| margin(scores[j][i], taus[j], self.spreads[j])).collect())
            .collect())
    }
}

/// (s − τ)/w in f64, rounded to f32 away from 0 when it would round to 0, so its sign is exactly that of s − τ.
fn margin(s: f32, tau: f32, spread: f32) -> f32 {
    let m = (f64::from(s) - f64::from(tau)) / f64::from(spread);
    let r = m as f32;
    if r == 0.0 && m != 0.0 {
        f32::MIN_POSITIVE.copysign(m as f32)
    } else {
        r
    }
}

/// The j-th largest (1-based) of `v`.
fn jth_largest(v: &mut [f32], j: usize) -> f32 {
    v.sort_by(|a, b| b.total_cmp(a));
    v[j - 1]
}

impl Detector for Ensemble {
    fn name(&self) -> &str {
        &self.name
    }
    fn score(&self, x: &Tensor) -> Result<Vec<f32>> {
        let j = self.policy.required(self.members.len());
        Ok(self.margins(x)?.into_iter().map(|mut m| jth_largest(&mut m, j)).collect())
    }
    fn threshold(&self) -> Option<f32> {
        self.threshold
    }
    fn set_threshold(&mut self, threshold: f32) {
        self.threshold = Some(threshold);
    }
    fn fit(&mut self, clean: &Tensor, target_fpr: f32) -> Result<f32> {
        for (m, w) in self.members.iter_mut().zip(&mut self.spreads) {
            let tau = m.fit(clean, target_fpr)?;
            let mut s = m.score(clean)?;
            s.sort_by(f32::total_cmp);
            let spread = tau - s[s.len() / 2];
            *w = if spread.is_finite() && spread > 0.0 { spread } else { 1.0 };
        }
        let threshold = calibrate_threshold(&self.score(clean)?, target_fpr)?;
        self.threshold = Some(threshold);
        Ok(threshold)
    }
    /// The members' margins on the graph and the j-th largest of them, when every member has a differentiable
    /// score.
    fn score_tensor(&self, x: &Tensor) -> Option<Result<Tensor>> {
        let taus = match self.member_thresholds() {
            Ok(t) => t,
            Err(e) => return Some(Err(e)),
        };
        let mut parts = Vec::with_capacity(self.members.len());
        for ((m, tau), w) in self.members.iter().zip(&taus).zip(&self.spreads) {
            let s = m.score_tensor(x)?;
            parts.push(s.map(|s| s.add_scalar(-tau).mul_scalar(1.0 / w)));
        }
        let run = || -> Result<Tensor> {
            let parts = parts.into_iter().collect::<Result<Vec<_>>>()?;
            let stacked = Tensor::stack(&parts, 1)?;
            let j = self.policy.required(self.members.len());
            let (n, _) = stacked.dims2("Ensemble")?;
            let (top, _) = stacked.topk(j)?;
            let t = top.narrow(1, j - 1, 1)?.reshape(&[n])?;
            // The value of `score` exactly (computed in f64), the gradient of the tensor.
            with_value(&t, self.score(x)?)
        };
        Some(run())
    }
}
