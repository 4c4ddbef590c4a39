//! The logistic-regression combiner of per-layer detector features (Ma et al. 2018 for LID, Lee et al. 2018
//! for Mahalanobis): standardised features, a weight each and a bias, fitted by the core's Adam optimiser.

use armoury::nn::Param;
use armoury::optim::{Adam, AdamConfig, Optimizer};
use armoury::{enable_grad, Error, Result, Tensor};
use ndarray::{Array1, Array2, ArrayD};

/// `t = Σ_l w_l (f_l − μ_l)/σ_l + b`: the logit of "adversarial" for features `f` `[N, L]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Logistic {
    /// Per-feature mean of the data it was standardised on.
    pub mean: Vec<f32>,
    /// Per-feature standard deviation (1 where it was 0).
    pub std: Vec<f32>,
    /// Weights.
    pub weights: Vec<f32>,
    /// Bias.
    pub bias: f32,
}

/// How [`Logistic::fit`] trains: full-batch Adam on the mean logistic loss plus an L2 penalty on the weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogisticTraining {
    /// Adam steps.
    pub steps: usize,
    /// Adam's learning rate.
    pub lr: f32,
    /// L2 penalty ½λ‖w‖².
    pub l2: f32,
}

impl Default for LogisticTraining {
    fn default() -> Self {
        LogisticTraining { steps: 500, lr: 0.05, l2: 1e-3 }
    }
}

fn moments(f: &Array2<f32>) -> (Vec<f32>, Vec<f32>) {
    let n = f.nrows().max(1) as f64;
    f.columns()
        .into_iter()
        .map(|c| {
            let m = c.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = c.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n;
            let s = var.sqrt();
            (m as f32, if s > 0.0 && s.is_finite() { s as f32 } else { 1.0 })
        })
        .unzip()
}

impl Logistic {
    /// The unsupervised combiner: features standardised on `clean` `[N, L]`, equal weights 1/L, no bias — the
    /// mean standardised feature, for when no adversarial examples are at hand.
    pub fn standardised(clean: &Array2<f32>) -> Result<Logistic> {
        check_features("Logistic::standardised", clean)?;
        let (mean, std) = moments(clean);
        let l = clean.ncols();
        Ok(Logistic { mean, std, weights: vec![1.0 / l as f32; l], bias: 0.0 })
    }

    /// Fits the combiner on clean (label 0) and adversarial (label 1) features `[N, L]`, standardised on both
    /// together, by minimising the mean logistic loss `softplus(−y·t)` (y = ±1) with Adam from zero weights.
    pub fn fit(clean: &Array2<f32>, adversarial: &Array2<f32>, cfg: &LogisticTraining) -> Result<Logistic> {
        check_features("Logistic::fit", clean)?;
        check_features("Logistic::fit", adversarial)?;
        if clean.ncols() != adversarial.ncols() {
            return Err(Error::invalid("Logistic::fit", "clean and adversarial features differ in width"));
        }
        let both = ndarray::concatenate(ndarray::Axis(0), &[clean.view(), adversarial.view()])
            .map_err(|e| Error::invalid("Logistic::fit", e.to_string()))?;
        let (mean, std) = moments(&both);
        let l = both.ncols();
        let standard = Logistic { mean: mean.clone(), std: std.clone(), weights: vec![0.0; l], bias: 0.0 };
        let z = standard.standardise(&both)?;
        let sign: Vec<f32> = (0..both.nrows()).map(|i| if i < clean.nrows() { 1.0 } else { -1.0 }).collect();
        let sign = Tensor::from_vec(sign, &[both.nrows()])?;
        let w = Param::new(ArrayD::zeros(ndarray::IxDyn(&[l, 1])));
        let b = Param::new(ArrayD::zeros(ndarray::IxDyn(&[1])));
        let mut opt = Adam::new(vec![w.clone(), b.clone()], AdamConfig { lr: cfg.lr, ..Default::default() })?;
        let n = both.nrows() as f32;
        for _ in 0..cfg.steps {
            let grads = enable_grad(|| -> Result<_> {
                let t = z.matmul(&w.tensor())?.reshape(&[both.nrows()])?.add(&b.tensor())?;
                // y = +1 adversarial: softplus(−t); y = −1 clean: softplus(t), i.e. softplus(sign·t).
                let loss = t.mul(&sign)?.softplus().sum_all().mul_scalar(1.0 / n);
                let wt = w.tensor();
                let penalty = wt.mul(&wt)?.sum_all().mul_scalar(0.5 * cfg.l2);
                loss.add(&penalty)?.backward()
            })?;
            opt.step(&grads)?;
        }
        Ok(Logistic { mean, std, weights: w.value().iter().copied().collect(), bias: b.value().iter().copied().sum() })
    }

    fn standardise(&self, f: &Array2<f32>) -> Result<Tensor> {
        let mut z = f.clone();
        for (mut c, (m, s)) in z.columns_mut().into_iter().zip(self.mean.iter().zip(&self.std)) {
            c.mapv_inplace(|v| (v - m) / s);
        }
        Tensor::from_vec(z.iter().copied().collect(), &[f.nrows(), f.ncols()])
    }

    /// The logits `[N]` of features `[N, L]` given as a tensor (on the graph when it is tracked).
    pub fn apply(&self, f: &Tensor) -> Result<Tensor> {
        let (n, l) = f.dims2("Logistic::apply")?;
        if l != self.weights.len() {
            return Err(Error::ShapeMismatch {
                op: "Logistic::apply",
                expected: vec![n, self.weights.len()],
                got: vec![n, l],
            });
        }
        let mean = Tensor::new(Array1::from(self.mean.clone()).into_dyn());
        let inv: Vec<f32> = self.std.iter().map(|s| 1.0 / s).collect();
        let inv = Tensor::new(Array1::from(inv).into_dyn());
        let w = Tensor::from_vec(self.weights.clone(), &[l, 1])?;
        Ok(f.sub(&mean)?.mul(&inv)?.matmul(&w)?.reshape(&[n])?.add_scalar(self.bias))
    }
}

fn check_features(op: &'static str, f: &Array2<f32>) -> Result<()> {
    if f.nrows() == 0 || f.ncols() == 0 {
        return Err(Error::invalid(op, "no features"));
    }
    if f.iter().any(|v| !v.is_finite()) {
        return Err(Error::NonFinite { op });
    }
    Ok(())
}
