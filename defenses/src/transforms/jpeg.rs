//! JPEG compression (Dziugaite et al. 2016; Das et al. 2017; Guo et al. 2018) through the `image` crate.

use armoury::{Error, Result, Tensor};
use image::codecs::jpeg::JpegEncoder;
use image::{ExtendedColorType, ImageFormat};

use super::{check_bounds, map_images, Transform};

/// Encodes each image as a JPEG at `quality` and decodes it back: values are quantised to 8 bits over the
/// classifier's bounds, compressed (grayscale for 1 channel, RGB for 3) and mapped back to the bounds.
/// Not differentiable (BPDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Jpeg {
    /// JPEG quality, 1..=100.
    pub quality: u8,
}

impl Default for Jpeg {
    fn default() -> Self {
        Jpeg { quality: 75 }
    }
}

impl Transform for Jpeg {
    fn name(&self) -> String {
        format!("Jpeg(quality={})", self.quality)
    }

    fn validate(&self) -> Result<()> {
        if !(1..=100).contains(&self.quality) {
            return Err(Error::invalid("Jpeg", format!("quality {} must be in 1..=100", self.quality)));
        }
        Ok(())
    }

    fn apply(&self, x: &Tensor, bounds: (f32, f32), _draw: u64) -> Result<Tensor> {
        self.validate()?;
        check_bounds("Jpeg", bounds)?;
        let (_, c, h, w) = x.dims4("Jpeg")?;
        let color = match c {
            1 => ExtendedColorType::L8,
            3 => ExtendedColorType::Rgb8,
            _ => return Err(Error::invalid("Jpeg", format!("JPEG needs 1 or 3 channels, got {c}"))),
        };
        if h == 0 || w == 0 || h > u16::MAX as usize || w > u16::MAX as usize {
            return Err(Error::invalid("Jpeg", format!("image size {h}x{w} is not encodable")));
        }
        let (lo, hi) = bounds;
        let hw = h * w;
        map_images("Jpeg", x, |_, img, out| {
            // NCHW planes → interleaved 8-bit pixels.
            let mut bytes = vec![0u8; c * hw];
            for ch in 0..c {
                for p in 0..hw {
                    let t = ((img[ch * hw + p] - lo) / (hi - lo)).clamp(0.0, 1.0);
                    bytes[p * c + ch] = (t * 255.0).round() as u8;
                }
            }
            let mut encoded = Vec::new();
            JpegEncoder::new_with_quality(&mut encoded, self.quality)
                .encode(&bytes, w as u32, h as u32, color)
                .map_err(|e| Error::invalid("Jpeg", format!("encoding failed: {e}")))?;
            let decoded = image::load_from_memory_with_format(&encoded, ImageFormat::Jpeg)
                .map_err(|e| Error::invalid("Jpeg", format!("decoding failed: {e}")))?;
            let pixels = if c == 1 { decoded.to_luma8().into_raw() } else { decoded.to_rgb8().into_raw() };
            if pixels.len() != c * hw {
                return Err(Error::invalid("Jpeg", "decoded image has the wrong size"));
            }
            for ch in 0..c {
                for p in 0..hw {
                    out[ch * hw + p] = lo + pixels[p * c + ch] as f32 / 255.0 * (hi - lo);
                }
            }
            Ok(())
        })
    }
}
