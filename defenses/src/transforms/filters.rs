//! Spatial smoothing: median (Xu et al. 2018, feature squeezing), mean and Gaussian filters.
//!
//! Every filter works on each image and each channel separately, with scipy.ndimage's default `reflect`
//! boundary (half-sample symmetric: `d c b a | a b c d | d c b a`), so a constant image stays constant and the
//! result for one image never depends on the others. MindArmour's `SpatialSmoothing` filters across the batch
//! axis too (its window spans neighbouring images; docs/conventions.md, MindArmour differences); Armoury does not.
//!
//! The mean and Gaussian filters are a depthwise convolution (groups = C) of the reflect-padded input, built from
//! tracked ops (`index_select` for the padding, `conv2d`), so [`super::Defended`] differentiates them exactly.
//! The median filter is not differentiable and is differentiated with BPDA.

use armoury::{Conv2dParams, Error, Result, Tensor};

use super::{map_planes, reflect, Transform};

fn check_size(op: &'static str, size: usize) -> Result<()> {
    if size == 0 || size.is_multiple_of(2) {
        return Err(Error::invalid(op, format!("window size {size} must be odd and at least 1")));
    }
    Ok(())
}

/// Median of each `size × size` window, per image and channel (Xu, Evans & Qi 2018, "Feature squeezing").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MedianFilter {
    /// Window side, odd (2 for Xu et al.'s even windows is not supported: an odd window has a true median).
    pub size: usize,
}

impl Default for MedianFilter {
    fn default() -> Self {
        MedianFilter { size: 3 }
    }
}

impl Transform for MedianFilter {
    fn name(&self) -> String {
        format!("MedianFilter(size={})", self.size)
    }

    fn validate(&self) -> Result<()> {
        check_size("MedianFilter", self.size)
    }

    fn apply(&self, x: &Tensor, _bounds: (f32, f32), _draw: u64) -> Result<Tensor> {
        self.validate()?;
        let r = (self.size / 2) as isize;
        map_planes("MedianFilter", x, |p, h, w, out| {
            let mut win = Vec::with_capacity(self.size * self.size);
            let mid = self.size * self.size / 2;
            for i in 0..h {
                for j in 0..w {
                    win.clear();
                    for a in -r..=r {
                        let row = reflect(i as isize + a, h) * w;
                        for b in -r..=r {
                            win.push(p[row + reflect(j as isize + b, w)]);
                        }
                    }
                    let (_, m, _) = win.select_nth_unstable_by(mid, f32::total_cmp);
                    out[i * w + j] = *m;
                }
            }
        })
    }
}

/// The normalised `size`-tap Gaussian weights `exp(−i²/2σ²)` for `i = −size/2 ..= size/2`.
pub fn gaussian_weights(sigma: f32, size: usize) -> Vec<f32> {
    let r = (size / 2) as f64;
    let s = sigma as f64;
    let g: Vec<f64> = (0..size).map(|i| (-((i as f64 - r).powi(2)) / (2.0 * s * s)).exp()).collect();
    let total: f64 = g.iter().sum();
    g.iter().map(|v| (v / total) as f32).collect()
}

/// A depthwise convolution of the reflect-padded batch with one `k × k` kernel for every channel (tracked ops).
fn depthwise(x: &Tensor, kernel: &[f32], k: usize) -> Result<Tensor> {
    let (_, c, h, w) = x.dims4("spatial filter")?;
    let r = (k / 2) as isize;
    let rows: Vec<usize> = (-r..h as isize + r).map(|i| reflect(i, h)).collect();
    let cols: Vec<usize> = (-r..w as isize + r).map(|j| reflect(j, w)).collect();
    let padded = x.index_select(2, &rows)?.index_select(3, &cols)?;
    let weight: Vec<f32> = (0..c).flat_map(|_| kernel.iter().copied()).collect();
    let weight = Tensor::from_vec(weight, &[c, 1, k, k])?;
    padded.conv2d(&weight, None, Conv2dParams { groups: c, ..Default::default() })
}

fn check_batch(op: &'static str, x: &Tensor) -> Result<()> {
    x.dims4(op)?;
    if !x.all_finite() {
        return Err(Error::NonFinite { op });
    }
    Ok(())
}

/// Mean of each `size × size` window, per image and channel (differentiable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeanFilter {
    /// Window side, odd.
    pub size: usize,
}

impl Default for MeanFilter {
    fn default() -> Self {
        MeanFilter { size: 3 }
    }
}

impl MeanFilter {
    fn kernel(&self) -> Vec<f32> {
        vec![1.0 / (self.size * self.size) as f32; self.size * self.size]
    }
}

impl Transform for MeanFilter {
    fn name(&self) -> String {
        format!("MeanFilter(size={})", self.size)
    }

    fn validate(&self) -> Result<()> {
        check_size("MeanFilter", self.size)
    }

    fn apply(&self, x: &Tensor, bounds: (f32, f32), draw: u64) -> Result<Tensor> {
        let y = armoury::no_grad(|| self.differentiable(&x.detach(), bounds, draw).expect("always differentiable"))?;
        Ok(y.detach())
    }

    fn differentiable(&self, x: &Tensor, _bounds: (f32, f32), _draw: u64) -> Option<Result<Tensor>> {
        Some(
            self.validate()
                .and_then(|_| check_batch("MeanFilter", x))
                .and_then(|_| depthwise(x, &self.kernel(), self.size)),
        )
    }
}

/// Gaussian blur with standard deviation `sigma` pixels over a `size × size` window (weights sum to 1),
/// per image and channel (differentiable).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GaussianFilter {
    /// Standard deviation in pixels, > 0.
    pub sigma: f32,
    /// Window side, odd; [`GaussianFilter::new`] picks `2⌈3σ⌉ + 1`.
    pub size: usize,
}

impl GaussianFilter {
    /// A filter with window `2⌈3σ⌉ + 1`.
    pub fn new(sigma: f32) -> GaussianFilter {
        let size = if sigma.is_finite() && sigma > 0.0 { 2 * (3.0 * sigma).ceil() as usize + 1 } else { 1 };
        GaussianFilter { sigma, size }
    }

    /// The 2-D kernel [size × size], row-major: the outer product of [`gaussian_weights`].
    pub fn kernel(&self) -> Vec<f32> {
        let g = gaussian_weights(self.sigma, self.size);
        g.iter().flat_map(|a| g.iter().map(move |b| a * b)).collect()
    }
}

impl Default for GaussianFilter {
    fn default() -> Self {
        GaussianFilter::new(1.0)
    }
}

impl Transform for GaussianFilter {
    fn name(&self) -> String {
        format!("GaussianFilter(sigma={}, size={})", self.sigma, self.size)
    }

    fn validate(&self) -> Result<()> {
        if !(self.sigma.is_finite() && self.sigma > 0.0) {
            return Err(Error::invalid("GaussianFilter", format!("sigma {} must be positive and finite", self.sigma)));
        }
        check_size("GaussianFilter", self.size)
    }

    fn apply(&self, x: &Tensor, bounds: (f32, f32), draw: u64) -> Result<Tensor> {
        let y = armoury::no_grad(|| self.differentiable(&x.detach(), bounds, draw).expect("always differentiable"))?;
        Ok(y.detach())
    }

    fn differentiable(&self, x: &Tensor, _bounds: (f32, f32), _draw: u64) -> Option<Result<Tensor>> {
        Some(
            self.validate()
                .and_then(|_| check_batch("GaussianFilter", x))
                .and_then(|_| depthwise(x, &self.kernel(), self.size)),
        )
    }
}
