//! PNG grids of images (clean, adversarial, perturbation) with optional row labels in a tiny bitmap font.

use std::io::Cursor;
use std::path::Path;

use image::{ImageFormat, Rgb, RgbImage};

use crate::{Error, Result, Tensor};

const OP: &str = "save_png_grid";

/// Pixels between neighbouring images, between rows, and around a row label.
pub const GRID_GAP: u32 = 2;

/// One row of a PNG grid: an optional label (drawn at the left; empty for none) and its images.
#[derive(Clone, Debug, Default)]
pub struct GridRow {
    /// Text drawn to the left of the row (digits, letters, space and `.,:;-+=/()[]%_<>?!#*'ε`; other characters
    /// are drawn as `?`, lower case as upper case). Empty: no label.
    pub label: String,
    /// The images: each `[C, H, W]` (C = 1 or 3), `[H, W]` or `[1, C, H, W]`, values in `[0,1]` (clamped).
    pub images: Vec<Tensor>,
}

impl GridRow {
    /// A row with a label.
    pub fn new(label: impl Into<String>, images: Vec<Tensor>) -> GridRow {
        GridRow { label: label.into(), images }
    }
}

/// Writes `rows` of images into one RGB PNG at `path` (atomically: a temporary file, then a rename).
///
/// Every image must have the same height H and width W; each is drawn `scale` times larger, with
/// [`GRID_GAP`] white pixels between images and between rows, and grayscale images drawn in gray. The PNG is
/// `label_width + cols·W·scale + (cols−1)·GAP` wide and `rows·H·scale + (rows−1)·GAP` high, where `cols` is the
/// longest row and `label_width` is 0 when every label is empty.
///
/// Errors: no rows or no images, `scale = 0`, a bad image shape or channel count, different image sizes, NaN
/// or Inf pixels, and I/O or encoding failures.
pub fn save_png_grid(path: impl AsRef<Path>, rows: &[GridRow], scale: u32) -> Result<()> {
    let path = path.as_ref();
    let img = grid_image(rows, scale)?;
    let mut png = Vec::new();
    img.write_to(&mut Cursor::new(&mut png), ImageFormat::Png)
        .map_err(|source| Error::Image { path: path.into(), source })?;
    crate::io::write_atomic(path, &png)
}

/// [`save_png_grid`]'s picture as PNG bytes (for embedding in a page), with the same checks.
pub fn png_grid_bytes(rows: &[GridRow], scale: u32) -> Result<Vec<u8>> {
    let img = grid_image(rows, scale)?;
    let mut png = Vec::new();
    img.write_to(&mut Cursor::new(&mut png), ImageFormat::Png)
        .map_err(|e| Error::invalid(OP, format!("PNG encoding failed: {e}")))?;
    Ok(png)
}

fn grid_image(rows: &[GridRow], scale: u32) -> Result<RgbImage> {
    if scale == 0 {
        return Err(Error::invalid(OP, "scale must be at least 1"));
    }
    let cols = rows.iter().map(|r| r.images.len()).max().unwrap_or(0);
    if cols == 0 {
        return Err(Error::invalid(OP, "no images to draw"));
    }
    let mut size: Option<(usize, usize)> = None;
    for t in rows.iter().flat_map(|r| &r.images) {
        let (_, h, w) = chw(t)?;
        if !t.all_finite() {
            return Err(Error::NonFinite { op: OP });
        }
        match size {
            None => size = Some((h, w)),
            Some(s) if s != (h, w) => {
                return Err(Error::ShapeMismatch { op: OP, expected: vec![s.0, s.1], got: vec![h, w] })
            }
            Some(_) => {}
        }
    }
    let (h, w) = size.expect("cols > 0, so there is an image");
    let (cell_w, cell_h) = (to_u32(w)? * scale, to_u32(h)? * scale);
    let text_scale = (cell_h / 24).clamp(1, 4);
    let max_chars = rows.iter().map(|r| r.label.chars().count()).max().unwrap_or(0);
    let label_w = if max_chars == 0 { 0 } else { to_u32(max_chars)? * 4 * text_scale + 2 * GRID_GAP };
    let ncols = to_u32(cols)?;
    let nrows = to_u32(rows.len())?;
    let width = label_w + ncols * cell_w + (ncols - 1) * GRID_GAP;
    let height = nrows * cell_h + (nrows - 1) * GRID_GAP;
    let mut img = RgbImage::from_pixel(width, height, Rgb([255, 255, 255]));
    for (r, row) in rows.iter().enumerate() {
        let y0 = r as u32 * (cell_h + GRID_GAP);
        if !row.label.is_empty() {
            let ty = y0 + cell_h.saturating_sub(5 * text_scale) / 2;
            draw_text(&mut img, GRID_GAP, ty, &row.label, text_scale);
        }
        for (c, t) in row.images.iter().enumerate() {
            let x0 = label_w + c as u32 * (cell_w + GRID_GAP);
            draw_image(&mut img, x0, y0, t, scale)?;
        }
    }
    Ok(img)
}

/// A picture of the perturbation `adv − clean`: `0.5 + magnify·(adv − clean)`, clamped to `[0,1]`, so no change is
/// mid-gray and a change of ±0.5/magnify saturates. Same shape as the inputs, which must agree.
pub fn perturbation_image(clean: &Tensor, adv: &Tensor, magnify: f32) -> Result<Tensor> {
    if clean.shape() != adv.shape() {
        return Err(Error::ShapeMismatch {
            op: "perturbation_image",
            expected: clean.shape().to_vec(),
            got: adv.shape().to_vec(),
        });
    }
    if !magnify.is_finite() {
        return Err(Error::invalid("perturbation_image", format!("magnify must be finite, got {magnify}")));
    }
    let d = (adv.value() - clean.value()).mapv(|d| (0.5 + magnify * d).clamp(0.0, 1.0));
    Ok(Tensor::new(d))
}

/// (C, H, W) of an image tensor of rank 2, 3 or 4 (batch of one), with C = 1 or 3.
fn chw(t: &Tensor) -> Result<(usize, usize, usize)> {
    let (c, h, w) = match *t.shape() {
        [h, w] => (1, h, w),
        [c, h, w] | [1, c, h, w] => (c, h, w),
        _ => return Err(t.rank_error(OP, 3)),
    };
    if c != 1 && c != 3 {
        return Err(Error::invalid(OP, format!("images need 1 or 3 channels, got shape {:?}", t.shape())));
    }
    if h == 0 || w == 0 {
        return Err(Error::invalid(OP, format!("empty image of shape {:?}", t.shape())));
    }
    Ok((c, h, w))
}

fn to_u32(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::invalid(OP, format!("{n} is too large for an image dimension")))
}

fn draw_image(img: &mut RgbImage, x0: u32, y0: u32, t: &Tensor, scale: u32) -> Result<()> {
    let (c, h, w) = chw(t)?;
    let v = t.value();
    let px = v.as_standard_layout();
    let px = px.as_slice().expect("standard layout is contiguous");
    let byte = |i: usize| (px[i].clamp(0.0, 1.0) * 255.0).round() as u8;
    for y in 0..h {
        for x in 0..w {
            let i = y * w + x;
            let rgb = if c == 1 { [byte(i); 3] } else { [byte(i), byte(h * w + i), byte(2 * h * w + i)] };
            fill(img, x0 + x as u32 * scale, y0 + y as u32 * scale, scale, Rgb(rgb));
        }
    }
    Ok(())
}

fn fill(img: &mut RgbImage, x0: u32, y0: u32, size: u32, color: Rgb<u8>) {
    for y in y0..(y0 + size).min(img.height()) {
        for x in x0..(x0 + size).min(img.width()) {
            img.put_pixel(x, y, color);
        }
    }
}

fn draw_text(img: &mut RgbImage, x0: u32, y0: u32, text: &str, s: u32) {
    for (k, ch) in text.chars().enumerate() {
        let glyph = glyph(ch);
        let gx = x0 + k as u32 * 4 * s;
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..3 {
                if bits & (4 >> col) != 0 {
                    fill(img, gx + col * s, y0 + row as u32 * s, s, Rgb([0, 0, 0]));
                }
            }
        }
    }
}

/// A 3×5 glyph: five rows, three bits each (4 = left column).
fn glyph(ch: char) -> [u8; 5] {
    match ch.to_ascii_uppercase() {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 2, 2],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        'A' => [2, 5, 7, 5, 5],
        'B' => [6, 5, 6, 5, 6],
        'C' => [3, 4, 4, 4, 3],
        'D' => [6, 5, 5, 5, 6],
        'E' => [7, 4, 6, 4, 7],
        'F' => [7, 4, 6, 4, 4],
        'G' => [3, 4, 5, 5, 3],
        'H' => [5, 5, 7, 5, 5],
        'I' => [7, 2, 2, 2, 7],
        'J' => [1, 1, 1, 5, 2],
        'K' => [5, 5, 6, 5, 5],
        'L' => [4, 4, 4, 4, 7],
        'M' => [5, 7, 7, 5, 5],
        'N' => [6, 5, 5, 5, 5],
        'O' => [2, 5, 5, 5, 2],
        'P' => [6, 5, 6, 4, 4],
        'Q' => [2, 5, 5, 6, 3],
        'R' => [6, 5, 6, 5, 5],
        'S' => [3, 4, 2, 1, 6],
        'T' => [7, 2, 2, 2, 2],
        'U' => [5, 5, 5, 5, 7],
        'V' => [5, 5, 5, 5, 2],
        'W' => [5, 5, 7, 7, 5],
        'X' => [5, 5, 2, 5, 5],
        'Y' => [5, 5, 2, 2, 2],
        'Z' => [7, 1, 2, 4, 7],
        ' ' => [0, 0, 0, 0, 0],
        '.' => [0, 0, 0, 0, 2],
        ',' => [0, 0, 0, 2, 4],
        ':' => [0, 2, 0, 2, 0],
        ';' => [0, 2, 0, 2, 4],
        '-' => [0, 0, 7, 0, 0],
        '+' => [0, 2, 7, 2, 0],
        '=' => [0, 7, 0, 7, 0],
        '/' => [1, 1, 2, 4, 4],
        '(' => [2, 4, 4, 4, 2],
        ')' => [2, 1, 1, 1, 2],
        '[' => [6, 4, 4, 4, 6],
        ']' => [3, 1, 1, 1, 3],
        '%' => [5, 1, 2, 4, 5],
        '_' => [0, 0, 0, 0, 7],
        '<' => [1, 2, 4, 2, 1],
        '>' => [4, 2, 1, 2, 4],
        '!' => [2, 2, 2, 0, 2],
        '#' => [5, 7, 5, 7, 5],
        '*' => [0, 5, 2, 5, 0],
        '\'' => [2, 2, 0, 0, 0],
        'ε' => [3, 4, 6, 4, 3],
        _ => [7, 1, 2, 0, 2], // '?'
    }
}
