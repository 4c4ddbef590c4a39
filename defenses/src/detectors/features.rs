//! Feature-space detectors on chosen layers' activations (the classifier's layer taps): local intrinsic
//! dimensionality (Ma et al. 2018, "Characterizing adversarial subspaces using local intrinsic
//! dimensionality") and the Mahalanobis distance to the closest class-conditional Gaussian (Lee et al. 2018,
//! "A simple unified framework for detecting out-of-distribution samples and adversarial attacks"), one feature
//! per layer, combined by a [`Logistic`] regression.

use std::sync::Arc;

use armoury::{no_grad, Classifier, Detector, Error, Result, Tensor};
use ndarray::Array2;

use super::in_pieces;
use super::logistic::{Logistic, LogisticTraining};

/// A per-layer statistic of activations: one value per sample, higher meaning more suspicious.
pub trait LayerStatistic: Send + Sync {
    /// The detector's name.
    fn name(&self) -> &str;
    /// The statistic `[N]` of layer number `layer`'s activation `act` `[N, …]` (on the graph when tracked).
    fn layer_score(&self, layer: usize, act: &Tensor) -> Result<Tensor>;
}

/// A detector over layer statistics: the features `[N, L]` of the chosen layers, combined by a logistic
/// regression (standardised mean until [`LayerDetector::fit_combiner`] fits it on adversarial examples).
pub struct LayerDetector<S> {
    classifier: Arc<dyn Classifier>,
    layers: Vec<String>,
    statistic: S,
    combiner: Option<Logistic>,
    threshold: Option<f32>,
}

/// Local intrinsic dimensionality on layer activations.
pub type Lid = LayerDetector<LidStatistic>;
/// Mahalanobis distance on layer activations.
pub type Mahalanobis = LayerDetector<MahalanobisStatistic>;

fn check_layers(classifier: &dyn Classifier, layers: &[String]) -> Result<()> {
    if layers.is_empty() {
        return Err(Error::invalid("LayerDetector", "at least one layer is needed"));
    }
    let valid = classifier.layer_names();
    if let Some(bad) = layers.iter().find(|l| !valid.contains(l)) {
        return Err(Error::invalid("LayerDetector", format!("unknown layer '{bad}' (valid: {})", valid.join(", "))));
    }
    Ok(())
}

fn layer_refs(layers: &[String]) -> Vec<&str> {
    layers.iter().map(String::as_str).collect()
}

impl<S: LayerStatistic> LayerDetector<S> {
    /// The per-layer features `[N, L]` on the graph (tracked when `x` is).
    fn feature_tensor(&self, x: &Tensor) -> Result<Tensor> {
        self.classifier.check_input(x)?;
        let (_, acts) = self.classifier.forward_activations(x, &layer_refs(&self.layers))?;
        let cols =
            acts.iter().enumerate().map(|(l, a)| self.statistic.layer_score(l, a)).collect::<Result<Vec<_>>>()?;
        Tensor::stack(&cols, 1)
    }

    /// The per-layer features `[N, L]` of a batch.
    pub fn features(&self, x: &Tensor) -> Result<Array2<f32>> {
        let l = self.layers.len();
        let v = in_pieces(x, |xc| no_grad(|| self.feature_tensor(xc)).map(|t| t.to_vec()))?;
        let n = v.len() / l;
        Array2::from_shape_vec((n, l), v).map_err(|e| Error::invalid("LayerDetector", e.to_string()))
    }

    /// Fits the logistic combiner on the features of clean and adversarial inputs (Ma et al.'s and Lee et al.'s
    /// supervised detector); the threshold is unchanged (fit it again on clean data).
    pub fn fit_combiner(&mut self, clean: &Tensor, adversarial: &Tensor, cfg: &LogisticTraining) -> Result<()> {
        let (fc, fa) = (self.features(clean)?, self.features(adversarial)?);
        self.combiner = Some(Logistic::fit(&fc, &fa, cfg)?);
        Ok(())
    }

    /// The combiner, once fitted.
    pub fn combiner(&self) -> Option<&Logistic> {
        self.combiner.as_ref()
    }

    /// The layers tapped.
    pub fn layers(&self) -> &[String] {
        &self.layers
    }

    fn combined(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.combiner.as_ref().ok_or_else(|| {
            Error::invalid(
                "LayerDetector",
                format!("{}: no combiner: fit the detector on clean data first", self.statistic.name()),
            )
        })?;
        c.apply(&self.feature_tensor(x)?)
    }
}

impl<S: LayerStatistic> Detector for LayerDetector<S> {
    fn name(&self) -> &str {
        self.statistic.name()
    }
    fn score(&self, x: &Tensor) -> Result<Vec<f32>> {
        in_pieces(x, |xc| no_grad(|| self.combined(xc)).map(|t| t.to_vec()))
    }
    fn threshold(&self) -> Option<f32> {
        self.threshold
    }
    fn set_threshold(&mut self, threshold: f32) {
        self.threshold = Some(threshold);
    }
    /// Standardises the features on `clean` (equal weights) unless a combiner was fitted, then calibrates.
    fn fit(&mut self, clean: &Tensor, target_fpr: f32) -> Result<f32> {
        if self.combiner.is_none() {
            self.combiner = Some(Logistic::standardised(&self.features(clean)?)?);
        }
        let t = armoury::calibrate_threshold(&self.score(clean)?, target_fpr)?;
        self.threshold = Some(t);
        Ok(t)
    }
    fn score_tensor(&self, x: &Tensor) -> Option<Result<Tensor>> {
        Some(self.combined(x))
    }
}

/// The maximum-likelihood estimate of local intrinsic dimensionality from the distances `d₁ ≤ … ≤ d_k` to the
/// k nearest neighbours (Levina & Bickel; Ma et al. eq. 3): `−(1/k Σᵢ log(dᵢ/d_k))⁻¹`.
pub fn local_intrinsic_dimensionality(distances: &[f32]) -> f32 {
    let k = distances.len();
    let dk = distances.iter().copied().fold(0.0f32, f32::max) as f64;
    let s: f64 = distances.iter().map(|&d| (dk / d as f64).ln()).sum();
    (k as f64 / s.max(1e-12)) as f32
}

/// LID of each sample's activation among a fixed reference set of clean activations (Ma et al. estimate it
/// within a minibatch of clean samples; a fixed reference set makes a sample's score its own).
pub struct LidStatistic {
    reference: Vec<Tensor>,
    norms: Vec<Tensor>,
    k: usize,
}

impl Lid {
    /// LID on `layers` of `classifier` with `k` neighbours among the activations of the clean `reference`
    /// images (keep them apart from the images the threshold is fitted on: a reference image is its own nearest
    /// neighbour).
    pub fn new(classifier: Arc<dyn Classifier>, layers: &[&str], k: usize, reference: &Tensor) -> Result<Lid> {
        let layers: Vec<String> = layers.iter().map(|s| s.to_string()).collect();
        check_layers(classifier.as_ref(), &layers)?;
        let acts = no_grad(|| classifier.activations(reference, &layer_refs(&layers)))?;
        let m = reference.shape()[0];
        if k == 0 || k >= m {
            return Err(Error::invalid("Lid::new", format!("k = {k} must be in 1..{m} (the reference images)")));
        }
        let mut refs = Vec::new();
        let mut norms = Vec::new();
        for l in &layers {
            let a = acts.get(l).expect("asked for").flatten_from(1)?.detach();
            norms.push(a.mul(&a)?.sum(&[1], false)?.reshape(&[1, m])?);
            refs.push(a.t()?);
        }
        let statistic = LidStatistic { reference: refs, norms, k };
        Ok(LayerDetector { classifier, layers, statistic, combiner: None, threshold: None })
    }
}

impl LayerStatistic for LidStatistic {
    fn name(&self) -> &str {
        "lid"
    }
    fn layer_score(&self, layer: usize, act: &Tensor) -> Result<Tensor> {
        let a = act.flatten_from(1)?;
        let n = a.shape()[0];
        // Squared distances |a|² − 2 a·r + |r|² to every reference activation.
        let sq = a.mul(&a)?.sum(&[1], true)?;
        let d2 = sq.sub(&a.matmul(&self.reference[layer])?.mul_scalar(2.0))?.add(&self.norms[layer])?;
        let d = d2.clamp(1e-12, f32::MAX).sqrt();
        let (neg, _) = d.neg().topk(self.k)?; // the k smallest distances, ascending
        let logd = neg.neg().log();
        let logk = logd.narrow(1, self.k - 1, 1)?;
        let s = logk.sub(&logd)?.sum(&[1], false)?.clamp(1e-12, f32::MAX);
        Tensor::full(&[n], self.k as f32).div(&s)
    }
}

/// The Mahalanobis distance of each sample's (spatially averaged) activation to the closest class mean, under
/// the covariance shared by the classes (Lee et al. 2018).
pub struct MahalanobisStatistic {
    means: Vec<Tensor>,
    precision: Vec<Tensor>,
}

/// A convolutional activation `[N, C, H, W]` averaged over space, a flat one as it is: `[N, D]`.
fn pooled(act: &Tensor) -> Result<Tensor> {
    if act.rank() == 4 {
        act.mean(&[2, 3], false)
    } else {
        act.flatten_from(1)
    }
}

impl Mahalanobis {
    /// Class means and the shared covariance (plus `ridge`·I, ridge ≥ 0) of the activations of the clean
    /// `images` with their `labels` on `layers`.
    pub fn new(
        classifier: Arc<dyn Classifier>,
        layers: &[&str],
        images: &Tensor,
        labels: &[usize],
        ridge: f32,
    ) -> Result<Mahalanobis> {
        let layers: Vec<String> = layers.iter().map(|s| s.to_string()).collect();
        check_layers(classifier.as_ref(), &layers)?;
        let k = classifier.num_classes();
        if labels.len() != images.shape().first().copied().unwrap_or(0) || labels.iter().any(|&y| y >= k) {
            return Err(Error::invalid("Mahalanobis::new", "one label in 0..classes per image"));
        }
        if !(ridge.is_finite() && ridge >= 0.0) {
            return Err(Error::invalid("Mahalanobis::new", format!("ridge {ridge} must be finite and ≥ 0")));
        }
        let acts = no_grad(|| classifier.activations(images, &layer_refs(&layers)))?;
        let (mut means, mut precision) = (Vec::new(), Vec::new());
        for l in &layers {
            let f = no_grad(|| pooled(acts.get(l).expect("asked for")))?;
            let (mu, p) = class_gaussians(&f, labels, k, ridge)?;
            means.push(mu);
            precision.push(p);
        }
        let statistic = MahalanobisStatistic { means, precision };
        Ok(LayerDetector { classifier, layers, statistic, combiner: None, threshold: None })
    }
}

/// Class means `[K, D]` and the precision `[D, D]` of the shared covariance `Σ = 1/N Σᵢ (fᵢ − μ_yᵢ)(fᵢ − μ_yᵢ)ᵀ
/// + ridge·I` (f64 accumulation, Cholesky inverse).
fn class_gaussians(f: &Tensor, labels: &[usize], k: usize, ridge: f32) -> Result<(Tensor, Tensor)> {
    let (n, d) = f.dims2("Mahalanobis")?;
    let v = f.to_vec();
    let mut mean = vec![0.0f64; k * d];
    let mut count = vec![0usize; k];
    for (i, &y) in labels.iter().enumerate() {
        count[y] += 1;
        for j in 0..d {
            mean[y * d + j] += v[i * d + j] as f64;
        }
    }
    for c in 0..k {
        for j in 0..d {
            mean[c * d + j] /= count[c].max(1) as f64;
        }
    }
    let mut cov = vec![0.0f64; d * d];
    let mut diff = vec![0.0f64; d];
    for (i, &y) in labels.iter().enumerate() {
        for j in 0..d {
            diff[j] = v[i * d + j] as f64 - mean[y * d + j];
        }
        for a in 0..d {
            for b in 0..=a {
                cov[a * d + b] += diff[a] * diff[b];
            }
        }
    }
    for a in 0..d {
        for b in 0..=a {
            cov[a * d + b] /= n as f64;
            cov[b * d + a] = cov[a * d + b];
        }
        cov[a * d + a] += ridge as f64;
    }
    let p = spd_inverse(&cov, d)?;
    let means = Tensor::from_vec(mean.iter().map(|&m| m as f32).collect(), &[k, d])?;
    Ok((means, Tensor::from_vec(p.iter().map(|&x| x as f32).collect(), &[d, d])?))
}

/// The inverse of a symmetric positive-definite `d × d` matrix (row-major) by Cholesky factorisation; an error
/// when it is not positive definite (add a ridge).
pub fn spd_inverse(a: &[f64], d: usize) -> Result<Vec<f64>> {
    let mut l = vec![0.0f64; d * d];
    for i in 0..d {
        for j in 0..=i {
            let s: f64 = (0..j).map(|m| l[i * d + m] * l[j * d + m]).sum();
            if i == j {
                let v = a[i * d + i] - s;
                if v.is_nan() || v <= 0.0 {
                    return Err(Error::invalid("Mahalanobis", "the covariance is singular: give a positive ridge"));
                }
                l[i * d + i] = v.sqrt();
            } else {
                l[i * d + j] = (a[i * d + j] - s) / l[j * d + j];
            }
        }
    }
    // inv = L⁻ᵀ L⁻¹: solve L y = e_c then Lᵀ x = y for each column c.
    let mut inv = vec![0.0f64; d * d];
    let mut y = vec![0.0f64; d];
    for c in 0..d {
        for i in 0..d {
            let e = if i == c { 1.0 } else { 0.0 };
            let s: f64 = (0..i).map(|m| l[i * d + m] * y[m]).sum();
            y[i] = (e - s) / l[i * d + i];
        }
        for i in (0..d).rev() {
            let s: f64 = (i + 1..d).map(|m| l[m * d + i] * inv[m * d + c]).sum();
            inv[i * d + c] = (y[i] - s) / l[i * d + i];
        }
    }
    Ok(inv)
}

impl LayerStatistic for MahalanobisStatistic {
    fn name(&self) -> &str {
        "mahalanobis"
    }
    fn layer_score(&self, layer: usize, act: &Tensor) -> Result<Tensor> {
        let f = pooled(act)?;
        let (mu, p) = (&self.means[layer], &self.precision[layer]);
        let k = mu.shape()[0];
        let mut per_class = Vec::with_capacity(k);
        for c in 0..k {
            let diff = f.sub(&mu.narrow(0, c, 1)?)?;
            per_class.push(diff.matmul(p)?.mul(&diff)?.sum(&[1], false)?);
        }
        Tensor::stack(&per_class, 1)?.min(1, false)
    }
}
