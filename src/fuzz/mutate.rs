//! Image mutations (DeepHunter, Xie et al. 2019): pixel-value changes and affine transformations with bilinear
//! resampling, on one image [C, H, W] at a time, every result clipped to the input bounds. Adversarial mutations
//! run an attack and are applied by the fuzzer, which has the model.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::seed;

/// A mutation method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// `mean + α (x − mean)` around the image's mean (α = `alpha`).
    Contrast,
    /// `x + β · (max − min)` (β = `beta`, a fraction of the input range).
    Brightness,
    /// Separable Gaussian blur of standard deviation `sigma` pixels (edges repeated).
    GaussianBlur,
    /// The mean of `length` bilinear samples along a line at `angle` degrees (edges repeated).
    MotionBlur,
    /// `x + a · range · U(−1, 1)` per element (a = `amplitude`).
    UniformNoise,
    /// `x + σ · range · N(0, 1)` per element (σ = `sigma`).
    GaussianNoise,
    /// A fraction `fraction` of the pixels set to the minimum or the maximum (all channels, even odds).
    SaltPepper,
    /// Shift by (`dx`, `dy`) pixels.
    Translate,
    /// Zoom by `factor` about the centre.
    Scale,
    /// Shear `[[1, sx], [sy, 1]]` about the centre.
    Shear,
    /// Rotation by `degrees` about the centre.
    Rotate,
    /// An attack from the fuzzer's list (its budget is the attack's own).
    Adversarial,
}

/// The strategy groups of DeepHunter: at most one affine or adversarial mutation per lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    /// Pixel-value mutations.
    Pixel,
    /// Affine transformations.
    Affine,
    /// Attacks.
    Adversarial,
}

impl Group {
    /// `pixel`, `affine`, `adversarial`.
    pub fn name(self) -> &'static str {
        match self {
            Group::Pixel => "pixel",
            Group::Affine => "affine",
            Group::Adversarial => "adversarial",
        }
    }
}

impl Method {
    /// Every method but [`Method::Adversarial`].
    pub const IMAGE: [Method; 11] = [
        Method::Contrast,
        Method::Brightness,
        Method::GaussianBlur,
        Method::MotionBlur,
        Method::UniformNoise,
        Method::GaussianNoise,
        Method::SaltPepper,
        Method::Translate,
        Method::Scale,
        Method::Shear,
        Method::Rotate,
    ];

    /// The name used in configuration files (`gaussian_blur`, …).
    pub fn name(self) -> &'static str {
        match self {
            Method::Contrast => "contrast",
            Method::Brightness => "brightness",
            Method::GaussianBlur => "gaussian_blur",
            Method::MotionBlur => "motion_blur",
            Method::UniformNoise => "uniform_noise",
            Method::GaussianNoise => "gaussian_noise",
            Method::SaltPepper => "salt_pepper",
            Method::Translate => "translate",
            Method::Scale => "scale",
            Method::Shear => "shear",
            Method::Rotate => "rotate",
            Method::Adversarial => "adversarial",
        }
    }

    /// The method called `name`.
    pub fn from_name(name: &str) -> Option<Method> {
        Method::IMAGE.into_iter().chain([Method::Adversarial]).find(|m| m.name() == name)
    }

    /// Its strategy group.
    pub fn group(self) -> Group {
        match self {
            Method::Translate | Method::Scale | Method::Shear | Method::Rotate => Group::Affine,
            Method::Adversarial => Group::Adversarial,
            _ => Group::Pixel,
        }
    }

    /// The names of its parameters (at most two).
    pub fn param_names(self) -> &'static [&'static str] {
        match self {
            Method::Contrast => &["alpha"],
            Method::Brightness => &["beta"],
            Method::GaussianBlur | Method::GaussianNoise => &["sigma"],
            Method::MotionBlur => &["length", "angle"],
            Method::UniformNoise => &["amplitude"],
            Method::SaltPepper => &["fraction"],
            Method::Translate => &["dx", "dy"],
            Method::Scale => &["factor"],
            Method::Shear => &["sx", "sy"],
            Method::Rotate => &["degrees"],
            Method::Adversarial => &[],
        }
    }

    /// The parameters that leave an image unchanged (what shrinking moves towards).
    pub fn identity(self) -> [f32; 2] {
        match self {
            Method::Contrast | Method::Scale | Method::MotionBlur => [1.0, 0.0],
            _ => [0.0, 0.0],
        }
    }

    /// The default range of each parameter (brightness and noise as fractions of the input range), used by the
    /// default configuration and by automatic parameter choice: changes that keep a 28×28 image's meaning.
    pub fn default_range(self) -> [(f32, f32); 2] {
        match self {
            Method::Contrast => [(0.6, 1.4), (0.0, 0.0)],
            Method::Brightness => [(-0.25, 0.25), (0.0, 0.0)],
            Method::GaussianBlur => [(0.3, 1.2), (0.0, 0.0)],
            Method::MotionBlur => [(2.0, 5.0), (0.0, 180.0)],
            Method::UniformNoise => [(0.02, 0.15), (0.0, 0.0)],
            Method::GaussianNoise => [(0.02, 0.1), (0.0, 0.0)],
            Method::SaltPepper => [(0.002, 0.02), (0.0, 0.0)],
            Method::Translate => [(-3.0, 3.0), (-3.0, 3.0)],
            Method::Scale => [(0.85, 1.15), (0.0, 0.0)],
            Method::Shear => [(-0.2, 0.2), (-0.2, 0.2)],
            Method::Rotate => [(-15.0, 15.0), (0.0, 0.0)],
            Method::Adversarial => [(0.0, 0.0), (0.0, 0.0)],
        }
    }

    /// The values a configuration file may give parameter `k` (checked when a file is read).
    pub fn valid_range(self, k: usize) -> (f32, f32) {
        match (self, k) {
            (Method::Contrast, _) => (0.0, 10.0),
            (Method::Brightness, _) | (Method::Shear, _) => (-1.0, 1.0),
            (Method::GaussianBlur, _) => (0.0, 8.0),
            (Method::MotionBlur, 0) => (0.0, 32.0),
            (Method::MotionBlur, _) => (-360.0, 360.0),
            (Method::UniformNoise | Method::GaussianNoise | Method::SaltPepper, _) => (0.0, 1.0),
            (Method::Translate, _) => (-64.0, 64.0),
            (Method::Scale, _) => (0.1, 10.0),
            (Method::Rotate, _) => (-360.0, 360.0),
            (Method::Adversarial, _) => (0.0, 0.0),
        }
    }
}

/// One mutation step of a lineage: a method, its parameters and the seed of its random draws (noise), so that
/// the same step on the same image gives the same result (what shrinking relies on).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The method.
    pub method: Method,
    /// Its parameters ([`Method::param_names`]; unused ones are 0).
    pub params: [f32; 2],
    /// For [`Method::Adversarial`], the index of the attack in the fuzzer's list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attack: Option<usize>,
    /// The seed of the step's random draws (noise positions and values; the attack's call seed).
    pub seed: u64,
}

impl Step {
    /// The step with its parameters moved a fraction `t` of the way from the identity (t = 0: no change,
    /// t = 1: this step).
    pub fn scaled(&self, t: f32) -> Step {
        let id = self.method.identity();
        let mut s = self.clone();
        for ((p, &orig), id) in s.params.iter_mut().zip(&self.params).zip(id) {
            *p = id + t * (orig - id);
        }
        s
    }

    /// A short description, e.g. `rotate(degrees=-7.30)`.
    pub fn describe(&self, attack_names: &[String]) -> String {
        if self.method == Method::Adversarial {
            let name = self.attack.and_then(|a| attack_names.get(a)).map(String::as_str).unwrap_or("?");
            return format!("adversarial({name})");
        }
        let params: Vec<String> =
            self.method.param_names().iter().zip(self.params).map(|(n, v)| format!("{n}={v:.3}")).collect();
        format!("{}({})", self.method.name(), params.join(", "))
    }
}

/// Applies an image step (any method but [`Method::Adversarial`], which returns the image unchanged) to one image
/// `src` of shape [C, H, W] with input bounds `(lo, hi)`; the result is clipped to the bounds.
pub fn apply(step: &Step, src: &[f32], shape: [usize; 3], bounds: (f32, f32)) -> Vec<f32> {
    let (lo, hi) = bounds;
    let range = hi - lo;
    let [p0, p1] = step.params;
    let mut rng = seed::rng(step.seed);
    let mut out = match step.method {
        Method::Contrast => {
            let mean = (src.iter().map(|&v| f64::from(v)).sum::<f64>() / src.len().max(1) as f64) as f32;
            src.iter().map(|&v| mean + p0 * (v - mean)).collect()
        }
        Method::Brightness => src.iter().map(|&v| v + p0 * range).collect(),
        Method::GaussianBlur => gaussian_blur(src, shape, p0),
        Method::MotionBlur => motion_blur(src, shape, p0, p1),
        Method::UniformNoise => src.iter().map(|&v| v + p0 * range * (2.0 * rng.random::<f32>() - 1.0)).collect(),
        Method::GaussianNoise => {
            let z = seed::normal_vec(&mut rng, src.len());
            src.iter().zip(z).map(|(&v, z)| v + p0 * range * z).collect()
        }
        Method::SaltPepper => salt_pepper(src, shape, bounds, p0, &mut rng),
        Method::Translate => affine(src, shape, lo, [1.0, 0.0, 0.0, 1.0], [p0, p1]),
        Method::Scale => affine(src, shape, lo, [p0, 0.0, 0.0, p0], [0.0, 0.0]),
        Method::Shear => affine(src, shape, lo, [1.0, p0, p1, 1.0], [0.0, 0.0]),
        Method::Rotate => {
            let (s, c) = p0.to_radians().sin_cos();
            affine(src, shape, lo, [c, -s, s, c], [0.0, 0.0])
        }
        Method::Adversarial => src.to_vec(),
    };
    for v in &mut out {
        *v = v.clamp(lo, hi);
    }
    out
}

/// Bilinear sample of plane `p` (H × W) at (y, x); outside the image, `fill`.
fn bilinear(p: &[f32], h: usize, w: usize, y: f32, x: f32, fill: Option<f32>) -> f32 {
    let (y0, x0) = (y.floor(), x.floor());
    let (fy, fx) = (y - y0, x - x0);
    let at = |yy: f32, xx: f32| -> f32 {
        let inside = yy >= 0.0 && xx >= 0.0 && yy <= (h - 1) as f32 && xx <= (w - 1) as f32;
        match fill {
            Some(f) if !inside => f,
            _ => {
                let yi = yy.clamp(0.0, (h - 1) as f32) as usize;
                let xi = xx.clamp(0.0, (w - 1) as f32) as usize;
                p[yi * w + xi]
            }
        }
    };
    let top = at(y0, x0) * (1.0 - fx) + at(y0, x0 + 1.0) * fx;
    let bottom = at(y0 + 1.0, x0) * (1.0 - fx) + at(y0 + 1.0, x0 + 1.0) * fx;
    top * (1.0 - fy) + bottom * fy
}

/// Output pixel p = A (q − c) + c + t for source pixel q, c the centre: each output samples the source at
/// q = A⁻¹ (p − c − t) + c, bilinearly, with `fill` outside. A singular A gives a plane of `fill`.
fn affine(src: &[f32], shape: [usize; 3], fill: f32, a: [f32; 4], t: [f32; 2]) -> Vec<f32> {
    let [c, h, w] = shape;
    let det = a[0] * a[3] - a[1] * a[2];
    if det.abs() < 1e-6 {
        return vec![fill; src.len()];
    }
    let inv = [a[3] / det, -a[1] / det, -a[2] / det, a[0] / det];
    let (cy, cx) = ((h as f32 - 1.0) / 2.0, (w as f32 - 1.0) / 2.0);
    let mut out = vec![0.0; c * h * w];
    for ch in 0..c {
        let plane = &src[ch * h * w..(ch + 1) * h * w];
        for y in 0..h {
            for x in 0..w {
                let (dx, dy) = (x as f32 - cx - t[0], y as f32 - cy - t[1]);
                let sx = inv[0] * dx + inv[1] * dy + cx;
                let sy = inv[2] * dx + inv[3] * dy + cy;
                out[ch * h * w + y * w + x] = bilinear(plane, h, w, sy, sx, Some(fill));
            }
        }
    }
    out
}

fn gaussian_blur(src: &[f32], shape: [usize; 3], sigma: f32) -> Vec<f32> {
    let [c, h, w] = shape;
    if sigma <= 1e-3 {
        return src.to_vec();
    }
    let r = ((3.0 * sigma).ceil() as usize).min(h.max(w));
    let mut k: Vec<f32> =
        (0..=2 * r).map(|i| (-((i as f32 - r as f32).powi(2)) / (2.0 * sigma * sigma)).exp()).collect();
    let total: f32 = k.iter().sum();
    k.iter_mut().for_each(|v| *v /= total);
    let clampi = |i: isize, n: usize| i.clamp(0, n as isize - 1) as usize;
    let mut tmp = vec![0.0; src.len()];
    let mut out = vec![0.0; src.len()];
    for ch in 0..c {
        let o = ch * h * w;
        for y in 0..h {
            for x in 0..w {
                tmp[o + y * w + x] = k
                    .iter()
                    .enumerate()
                    .map(|(i, kv)| kv * src[o + y * w + clampi(x as isize + i as isize - r as isize, w)])
                    .sum();
            }
        }
        for y in 0..h {
            for x in 0..w {
                out[o + y * w + x] = k
                    .iter()
                    .enumerate()
                    .map(|(i, kv)| kv * tmp[o + clampi(y as isize + i as isize - r as isize, h) * w + x])
                    .sum();
            }
        }
    }
    out
}

fn motion_blur(src: &[f32], shape: [usize; 3], length: f32, angle: f32) -> Vec<f32> {
    let [c, h, w] = shape;
    let n = length.round().max(1.0) as usize;
    if n == 1 {
        return src.to_vec();
    }
    let (s, co) = angle.to_radians().sin_cos();
    let offsets: Vec<(f32, f32)> = (0..n)
        .map(|i| {
            let d = i as f32 - (n as f32 - 1.0) / 2.0;
            (d * s, d * co)
        })
        .collect();
    let mut out = vec![0.0; src.len()];
    for ch in 0..c {
        let plane = &src[ch * h * w..(ch + 1) * h * w];
        for y in 0..h {
            for x in 0..w {
                let sum: f32 =
                    offsets.iter().map(|(dy, dx)| bilinear(plane, h, w, y as f32 + dy, x as f32 + dx, None)).sum();
                out[ch * h * w + y * w + x] = sum / n as f32;
            }
        }
    }
    out
}

fn salt_pepper(src: &[f32], shape: [usize; 3], (lo, hi): (f32, f32), p: f32, rng: &mut impl Rng) -> Vec<f32> {
    let [c, h, w] = shape;
    let mut out = src.to_vec();
    for pos in 0..h * w {
        let (u, salt) = (rng.random::<f32>(), rng.random::<bool>());
        if u < p {
            for ch in 0..c {
                out[ch * h * w + pos] = if salt { hi } else { lo };
            }
        }
    }
    out
}
