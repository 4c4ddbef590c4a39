//! Honest evaluation of a detector: how well its scores separate clean from adversarial inputs
//! ([`detection_metrics`]), what the protected pipeline gets right ([`protected_accuracy`]), and the adaptive
//! attack ([`AdaptivePgd`]) that knows the detector is there.

use std::ops::Range;

use armoury::detector::{roc_auc, roc_curve, tpr_at_fpr};
use armoury::report::{LineChart, Series};
use armoury::seed::sample_seed;
use armoury::{Classifier, Detector, Error, Reduction, Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How well a detector's scores separate clean inputs from adversarial ones.
#[derive(Clone, Debug, PartialEq)]
pub struct DetectionMetrics {
    /// Area under the ROC curve.
    pub auc: f64,
    /// True-positive rate at the threshold fitted on the clean scores at 1% false positives.
    pub tpr_at_1fpr: f64,
    /// The same at 5%.
    pub tpr_at_5fpr: f64,
    /// The ROC curve (false-positive rate, true-positive rate).
    pub roc: Vec<(f64, f64)>,
}

/// The detector's [`DetectionMetrics`] on `clean` (negatives) and `adversarial` (positives) inputs. The
/// thresholds at 1% and 5% are fitted on these clean scores, as a deployed detector's would be on held-out
/// clean data; the detector's own threshold is not used.
pub fn detection_metrics(detector: &dyn Detector, clean: &Tensor, adversarial: &Tensor) -> Result<DetectionMetrics> {
    DetectionMetrics::from_scores(&detector.score(clean)?, &detector.score(adversarial)?)
}

impl DetectionMetrics {
    /// The metrics of scores already computed: `negatives` of clean inputs, `positives` of adversarial ones (what
    /// a sharded evaluation merges: each shard scores its samples, the merge concatenates them in order).
    pub fn from_scores(negatives: &[f32], positives: &[f32]) -> Result<DetectionMetrics> {
        Ok(DetectionMetrics {
            auc: roc_auc(negatives, positives)?,
            tpr_at_1fpr: tpr_at_fpr(negatives, positives, 0.01)?.0,
            tpr_at_5fpr: tpr_at_fpr(negatives, positives, 0.05)?.0,
            roc: roc_curve(negatives, positives)?,
        })
    }

    /// The ROC curve as a chart titled `title`: false-positive rate against true-positive rate on [0, 1], the
    /// curve named `name`, with the diagonal of a detector that guesses.
    pub fn roc_chart(&self, title: String, name: &str) -> LineChart {
        LineChart {
            title,
            x_label: "false-positive rate".into(),
            y_label: "true-positive rate".into(),
            x_range: Some((0.0, 1.0)),
            y_range: Some((0.0, 1.0)),
            series: vec![Series { name: name.to_string(), points: self.roc.clone() }],
            diagonal: true,
        }
    }
}

/// The accuracy of a protected pipeline (a classifier, possibly with a rejection class such as
/// [`armoury::Guarded`]) on `x`: a sample counts when it is classified correctly, or — with
/// `rejection_defends`, for adversarial inputs — when it is rejected. On clean data pass `false`: a rejected
/// clean input is an error.
pub fn protected_accuracy(
    pipeline: &dyn Classifier,
    x: &Tensor,
    labels: &[usize],
    rejection_defends: bool,
) -> Result<f64> {
    let ok = protected_correct(pipeline, x, labels, rejection_defends)?;
    Ok(ok.iter().filter(|&&c| c).count() as f64 / labels.len().max(1) as f64)
}

/// Per sample, whether [`protected_accuracy`] counts it: correctly classified, or rejected when
/// `rejection_defends`.
pub fn protected_correct(
    pipeline: &dyn Classifier,
    x: &Tensor,
    labels: &[usize],
    rejection_defends: bool,
) -> Result<Vec<bool>> {
    let pred = pipeline.predict(x)?;
    if pred.len() != labels.len() {
        return Err(Error::invalid("protected_accuracy", "one label per sample"));
    }
    let reject = pipeline.rejection_class();
    // Protected: not broken by the core's rule, with a rejection counting as protection only if it defends.
    let reject_as = if rejection_defends { reject } else { None };
    Ok(pred.iter().zip(labels).map(|(&p, &l)| !armoury::attack::is_success(reject_as, l, None, p)).collect())
}

/// L∞ PGD against a protected pipeline (Carlini & Wagner 2017; Tramèr et al. 2020): for a pipeline with a
/// rejection class K ([`armoury::Guarded`]) it ascends `CE(z_{0..K}, y) − λ·max(0, z_K − max_{j<K} z_j)`, the
/// classifier's loss minus λ times how far the input is inside the detector's rejection region (Guarded's
/// `z_K − max_j z_j` is `scale·(s(x) − τ)`): the detector's score enters the loss while the input is flagged.
/// Gradients flow through the detector's [`Detector::score_tensor`] (BPDA through non-differentiable
/// squeezers, the reformer's own gradient) and through randomised pipelines' EOT gradients (the region
/// classifier); for a pipeline without a rejection class it is PGD on the cross-entropy.
///
/// A sample's answer is the last iterate that the pipeline neither rejects nor classifies correctly, else the
/// last iterate. Random start uniform in the ε-ball, drawn per sample from its own values and the seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptivePgd {
    /// L∞ budget, input units.
    pub eps: f32,
    /// Iterations.
    pub steps: usize,
    /// Step size.
    pub step_size: f32,
    /// Weight λ of the detector term.
    pub lambda: f32,
    /// Start from a uniform point in the ε-ball.
    pub random_start: bool,
}

impl Default for AdaptivePgd {
    /// ε = 0.1, 40 steps of 0.01, λ = 1, random start.
    fn default() -> Self {
        AdaptivePgd { eps: 0.1, steps: 40, step_size: 0.01, lambda: 1.0, random_start: true }
    }
}

impl AdaptivePgd {
    fn objective(&self, z: &Tensor, r: Range<usize>, labels: &[usize], reject: Option<usize>) -> Result<Tensor> {
        let y = &labels[r];
        match reject {
            None => z.cross_entropy(y, Reduction::None),
            Some(k) => {
                let (n, _) = z.dims2("AdaptivePgd")?;
                let zc = z.narrow(1, 0, k)?;
                let inside = z.narrow(1, k, 1)?.sub(&zc.max(1, true)?)?.reshape(&[n])?.relu();
                zc.cross_entropy(y, Reduction::None)?.sub(&inside.mul_scalar(self.lambda))
            }
        }
    }

    /// The adversarial inputs for `x` with true `labels` against `pipeline`.
    pub fn run(&self, pipeline: &dyn Classifier, x: &Tensor, labels: &[usize], seed: u64) -> Result<Tensor> {
        let n = pipeline.check_input(x)?;
        if labels.len() != n {
            return Err(Error::invalid("AdaptivePgd", "one label per sample"));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0 && self.step_size.is_finite() && self.lambda.is_finite()) {
            return Err(Error::invalid("AdaptivePgd", format!("invalid settings {self:?}")));
        }
        let (lo, hi) = pipeline.bounds();
        let x0: Vec<f32> = x.value().as_standard_layout().iter().copied().collect();
        let d = x0.len() / n;
        let mut xa = x0.clone();
        if self.random_start && self.eps > 0.0 {
            for i in 0..n {
                let mut rng = ChaCha8Rng::seed_from_u64(sample_seed(seed, 0, &x0[i * d..(i + 1) * d]));
                for v in &mut xa[i * d..(i + 1) * d] {
                    *v = (*v + rng.random_range(-self.eps..=self.eps)).clamp(lo, hi);
                }
            }
        }
        let reject = pipeline.rejection_class();
        let broken = |p: usize, y: usize| armoury::attack::is_success(reject, y, None, p);
        let mut best: Vec<Option<Vec<f32>>> = vec![None; n];
        let f = |z: &Tensor, r: Range<usize>| self.objective(z, r, labels, reject);
        for _ in 0..self.steps {
            let xt = Tensor::from_vec(xa.clone(), x.shape())?;
            let (_, grad, logits) = pipeline.gradient(&xt, &f)?;
            for (i, p) in armoury::classifier::argmax_rows(&logits).into_iter().enumerate() {
                if broken(p, labels[i]) {
                    best[i] = Some(xa[i * d..(i + 1) * d].to_vec());
                }
            }
            let g = grad.value().as_standard_layout().iter().copied().collect::<Vec<f32>>();
            for j in 0..xa.len() {
                let step = if g[j].is_finite() { self.step_size * g[j].signum() * f32::from(g[j] != 0.0) } else { 0.0 };
                xa[j] = (xa[j] + step).clamp(x0[j] - self.eps, x0[j] + self.eps).clamp(lo, hi);
            }
        }
        let last = pipeline.predict(&Tensor::from_vec(xa.clone(), x.shape())?)?;
        for (i, p) in last.into_iter().enumerate() {
            if !broken(p, labels[i]) {
                if let Some(b) = &best[i] {
                    xa[i * d..(i + 1) * d].copy_from_slice(b);
                }
            }
        }
        Tensor::from_vec(xa, x.shape())
    }
}
