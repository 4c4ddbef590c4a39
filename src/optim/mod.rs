//! Optimisers (SGD with momentum/Nesterov/weight decay, Adam, AdamW), learning-rate schedules and gradient
//! clipping. An optimiser owns handles to the parameters it updates and reads their gradients from a
//! [`Gradients`] store returned by `loss.backward()`.

mod schedule;

use ndarray::{ArrayD, Zip};

use crate::autograd::Gradients;
use crate::nn::Param;
use crate::{Error, Result};

pub use schedule::LrSchedule;

/// Something that updates parameters from their gradients.
pub trait Optimizer: Send {
    /// One update of every parameter that has a gradient in `grads` (others are left alone).
    fn step(&mut self, grads: &Gradients) -> Result<()>;
    /// The current learning rate.
    fn lr(&self) -> f32;
    /// Sets the learning rate (schedules call this).
    fn set_lr(&mut self, lr: f32);
    /// The optimiser's state (moments, step count) as named arrays, for checkpoints.
    fn state(&self) -> Vec<(String, ArrayD<f32>)>;
    /// Restores a state saved by [`Optimizer::state`].
    fn load_state(&mut self, state: &[(String, ArrayD<f32>)]) -> Result<()>;
}

fn grad_of<'a>(grads: &'a Gradients, p: &Param) -> Option<&'a ArrayD<f32>> {
    grads.get(&p.tensor())
}

fn restore(
    slots: &mut [Option<ArrayD<f32>>],
    prefix: &str,
    params: &[Param],
    state: &[(String, ArrayD<f32>)],
) -> Result<()> {
    for (i, slot) in slots.iter_mut().enumerate() {
        let name = format!("{prefix}.{i}");
        *slot = match state.iter().find(|(n, _)| *n == name) {
            Some((_, a)) if a.shape() == params[i].shape().as_slice() => Some(a.clone()),
            Some((_, a)) => {
                return Err(Error::ShapeMismatch {
                    op: "optimizer state",
                    expected: params[i].shape(),
                    got: a.shape().to_vec(),
                })
            }
            None => None,
        };
    }
    Ok(())
}

fn export<'a>(slots: &'a [Option<ArrayD<f32>>], prefix: &'a str) -> impl Iterator<Item = (String, ArrayD<f32>)> + 'a {
    slots.iter().enumerate().filter_map(move |(i, s)| s.as_ref().map(|a| (format!("{prefix}.{i}"), a.clone())))
}

/// Settings of [`Sgd`] (PyTorch's meaning).
#[derive(Clone, Copy, Debug)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor (0 disables).
    pub momentum: f32,
    /// Dampening of the momentum.
    pub dampening: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig { lr: 0.01, momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0 }
    }
}

/// Stochastic gradient descent: g ← g + λθ; v ← μv + (1−τ)g; θ ← θ − lr·(g + μv if Nesterov, else v).
pub struct Sgd {
    params: Vec<Param>,
    cfg: SgdConfig,
    velocity: Vec<Option<ArrayD<f32>>>,
}

impl Sgd {
    /// SGD over `params`.
    pub fn new(params: Vec<Param>, cfg: SgdConfig) -> Result<Sgd> {
        if cfg.lr.is_nan()
            || cfg.lr < 0.0
            || cfg.momentum < 0.0
            || cfg.weight_decay < 0.0
            || (cfg.nesterov && (cfg.momentum <= 0.0 || cfg.dampening != 0.0))
        {
            return Err(Error::invalid("Sgd::new", format!("invalid settings {cfg:?}")));
        }
        let velocity = vec![None; params.len()];
        Ok(Sgd { params, cfg, velocity })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, grads: &Gradients) -> Result<()> {
        let c = self.cfg;
        for (p, vel) in self.params.iter().zip(&mut self.velocity) {
            let Some(g) = grad_of(grads, p) else { continue };
            let theta = p.value();
            let mut d = g.clone();
            if c.weight_decay != 0.0 {
                Zip::from(&mut d).and(&theta).for_each(|d, &t| *d += c.weight_decay * t);
            }
            if c.momentum != 0.0 {
                let v = match vel.take() {
                    Some(mut v) => {
                        Zip::from(&mut v).and(&d).for_each(|v, &d| *v = c.momentum * *v + (1.0 - c.dampening) * d);
                        v
                    }
                    None => d.clone(),
                };
                if c.nesterov {
                    Zip::from(&mut d).and(&v).for_each(|d, &v| *d += c.momentum * v);
                } else {
                    d.assign(&v);
                }
                *vel = Some(v);
            }
            let new = Zip::from(&theta).and(&d).map_collect(|&t, &d| t - c.lr * d);
            p.set(new)?;
        }
        Ok(())
    }
    fn lr(&self) -> f32 {
        self.cfg.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.cfg.lr = lr;
    }
    fn state(&self) -> Vec<(String, ArrayD<f32>)> {
        export(&self.velocity, "sgd.velocity").collect()
    }
    fn load_state(&mut self, state: &[(String, ArrayD<f32>)]) -> Result<()> {
        restore(&mut self.velocity, "sgd.velocity", &self.params, state)
    }
}

/// Settings of [`Adam`]; `decoupled_weight_decay` makes it AdamW.
#[derive(Clone, Copy, Debug)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Added to the root of the second moment.
    pub eps: f32,
    /// Weight decay: added to the gradient (Adam) or applied to the weights directly (AdamW).
    pub weight_decay: f32,
    /// AdamW (Loshchilov & Hutter): θ ← θ(1 − lr·λ) before the Adam step.
    pub decoupled_weight_decay: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, decoupled_weight_decay: false }
    }
}

impl AdamConfig {
    /// AdamW with PyTorch's default weight decay 0.01.
    pub fn adamw(lr: f32) -> Self {
        AdamConfig { lr, weight_decay: 0.01, decoupled_weight_decay: true, ..Default::default() }
    }
}

/// Adam (Kingma & Ba) with bias correction, as PyTorch computes it.
pub struct Adam {
    params: Vec<Param>,
    cfg: AdamConfig,
    m: Vec<Option<ArrayD<f32>>>,
    v: Vec<Option<ArrayD<f32>>>,
    t: Vec<u64>,
}

impl Adam {
    /// Adam over `params`.
    pub fn new(params: Vec<Param>, cfg: AdamConfig) -> Result<Adam> {
        let ok = cfg.lr >= 0.0
            && (0.0..1.0).contains(&cfg.beta1)
            && (0.0..1.0).contains(&cfg.beta2)
            && cfg.eps >= 0.0
            && cfg.weight_decay >= 0.0;
        if !ok {
            return Err(Error::invalid("Adam::new", format!("invalid settings {cfg:?}")));
        }
        let n = params.len();
        Ok(Adam { params, cfg, m: vec![None; n], v: vec![None; n], t: vec![0; n] })
    }
}

impl Optimizer for Adam {
    fn step(&mut self, grads: &Gradients) -> Result<()> {
        let c = self.cfg;
        for i in 0..self.params.len() {
            let p = &self.params[i];
            let Some(g) = grad_of(grads, p) else { continue };
            let mut theta = p.value().to_owned();
            let mut g = g.clone();
            if c.weight_decay != 0.0 {
                if c.decoupled_weight_decay {
                    theta.mapv_inplace(|t| t * (1.0 - c.lr * c.weight_decay));
                } else {
                    Zip::from(&mut g).and(&theta).for_each(|g, &t| *g += c.weight_decay * t);
                }
            }
            let m = self.m[i].get_or_insert_with(|| ArrayD::zeros(g.raw_dim()));
            let v = self.v[i].get_or_insert_with(|| ArrayD::zeros(g.raw_dim()));
            self.t[i] += 1;
            let t = self.t[i] as i32;
            let bc1 = 1.0 - c.beta1.powi(t);
            let bc2 = 1.0 - c.beta2.powi(t);
            let step = c.lr / bc1;
            let bc2_sqrt = bc2.sqrt();
            let update = |th: &mut f32, m: &mut f32, v: &mut f32, &g: &f32| {
                *m = c.beta1 * *m + (1.0 - c.beta1) * g;
                *v = c.beta2 * *v + (1.0 - c.beta2) * g * g;
                *th -= step * *m / (v.sqrt() / bc2_sqrt + c.eps);
            };
            // Elementwise: any split over threads gives the same values.
            let zip = Zip::from(&mut theta).and(m).and(v).and(&g);
            if g.len() >= crate::ops::PAR_THRESHOLD {
                zip.par_for_each(update);
            } else {
                zip.for_each(update);
            }
            p.set(theta)?;
        }
        Ok(())
    }
    fn lr(&self) -> f32 {
        self.cfg.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.cfg.lr = lr;
    }
    fn state(&self) -> Vec<(String, ArrayD<f32>)> {
        let steps =
            ArrayD::from_shape_vec(vec![self.t.len()], self.t.iter().map(|&t| t as f32).collect()).expect("1-D");
        export(&self.m, "adam.m")
            .chain(export(&self.v, "adam.v"))
            .chain(std::iter::once(("adam.t".to_string(), steps)))
            .collect()
    }
    fn load_state(&mut self, state: &[(String, ArrayD<f32>)]) -> Result<()> {
        restore(&mut self.m, "adam.m", &self.params, state)?;
        restore(&mut self.v, "adam.v", &self.params, state)?;
        if let Some((_, t)) = state.iter().find(|(n, _)| n == "adam.t") {
            if t.len() != self.t.len() {
                return Err(Error::ShapeMismatch {
                    op: "optimizer state",
                    expected: vec![self.t.len()],
                    got: t.shape().to_vec(),
                });
            }
            self.t = t.iter().map(|&v| v as u64).collect();
        }
        Ok(())
    }
}

/// Scales the gradients of `params` so their global L2 norm is at most `max_norm`; returns the norm before.
pub fn clip_grad_norm(grads: &mut Gradients, params: &[Param], max_norm: f32) -> Result<f32> {
    if max_norm.is_nan() || max_norm <= 0.0 {
        return Err(Error::invalid("clip_grad_norm", format!("max_norm = {max_norm} must be positive")));
    }
    let ids: Vec<_> = params.iter().map(|p| p.tensor().id()).collect();
    let total: f64 = ids
        .iter()
        .filter_map(|id| grads.get_id(*id))
        .map(|g| g.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>())
        .sum();
    let norm = total.sqrt() as f32;
    let scale = max_norm / (norm + 1e-6);
    if scale < 1.0 {
        for id in ids {
            if let Some(g) = grads.get_id_mut(id) {
                g.mapv_inplace(|v| v * scale);
            }
        }
    }
    Ok(norm)
}
