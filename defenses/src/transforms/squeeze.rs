//! Bit-depth reduction (Xu, Evans & Qi 2018, "Feature squeezing: detecting adversarial examples in deep neural
//! networks", §3.1).

use armoury::{Error, Result, Tensor};

use super::{check_bounds, map_images, Transform};

/// Rounds every input value to one of `2^bits` evenly spaced levels spanning the classifier's bounds:
/// `lo + round((x − lo)/(hi − lo)·(2^bits − 1))/(2^bits − 1)·(hi − lo)`, after clipping to the bounds.
/// In [0, 1] with `bits = 1` this maps every value to 0 or 1. Not differentiable (BPDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitDepth {
    /// Bits per value, 1..=16.
    pub bits: u32,
}

impl Default for BitDepth {
    fn default() -> Self {
        BitDepth { bits: 4 }
    }
}

impl Transform for BitDepth {
    fn name(&self) -> String {
        format!("BitDepth(bits={})", self.bits)
    }

    fn validate(&self) -> Result<()> {
        if !(1..=16).contains(&self.bits) {
            return Err(Error::invalid("BitDepth", format!("bits {} must be in 1..=16", self.bits)));
        }
        Ok(())
    }

    fn apply(&self, x: &Tensor, bounds: (f32, f32), _draw: u64) -> Result<Tensor> {
        self.validate()?;
        check_bounds("BitDepth", bounds)?;
        let (lo, hi) = (bounds.0 as f64, bounds.1 as f64);
        let levels = ((1u32 << self.bits) - 1) as f64;
        map_images("BitDepth", x, |_, img, out| {
            for (o, &v) in out.iter_mut().zip(img) {
                let t = ((v as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                *o = (lo + (t * levels).round() / levels * (hi - lo)) as f32;
            }
            Ok(())
        })
    }
}
