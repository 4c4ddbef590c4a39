//! Image folders: one sub-folder of PNG/JPEG images per class.

use std::path::{Path, PathBuf};

use image::imageops::FilterType;
use image::ImageReader;

use super::Dataset;
use crate::{Error, Result, Tensor};

const OP: &str = "load_image_folder";

/// How [`load_image_folder`] converts images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageFolderOptions {
    /// Resize every image to `(width, height)` with a triangle (bilinear) filter; `None` keeps the original
    /// size, and then every image must have the same size.
    pub size: Option<(u32, u32)>,
    /// 1 for grayscale (luma), 3 for RGB; alpha is dropped.
    pub channels: usize,
}

impl Default for ImageFolderOptions {
    /// Original size, RGB.
    fn default() -> Self {
        ImageFolderOptions { size: None, channels: 3 }
    }
}

/// Loads a folder with one sub-folder per class (`dir/cat/*.png`, `dir/dog/*.jpg`, …) and returns the data set
/// and the class names.
///
/// Classes are the sub-folders sorted by name (label = position); hidden folders are skipped. Files ending in
/// `.png`, `.jpg` or `.jpeg` (any case) are loaded in name order, other files are ignored. Pixels are u8 / 255,
/// in `[0,1]`.
///
/// Errors: no class folders, a class folder with no images, an image that cannot be decoded
/// ([`Error::Image`]), `channels` other than 1 or 3, a zero target size, and images of different sizes when
/// `size` is `None`.
pub fn load_image_folder(dir: impl AsRef<Path>, options: ImageFolderOptions) -> Result<(Dataset, Vec<String>)> {
    let dir = dir.as_ref();
    let ImageFolderOptions { size, channels } = options;
    if channels != 1 && channels != 3 {
        return Err(Error::invalid(OP, format!("channels must be 1 or 3, got {channels}")));
    }
    if let Some((w, h)) = size {
        if w == 0 || h == 0 {
            return Err(Error::invalid(OP, format!("size must be positive, got {w}x{h}")));
        }
    }
    let classes = sorted_entries(dir, |p| p.is_dir())?;
    if classes.is_empty() {
        return Err(Error::invalid(OP, format!("{}: no class sub-folders", dir.display())));
    }
    let mut names = Vec::with_capacity(classes.len());
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    let mut shape: Option<(u32, u32, PathBuf)> = None;
    for (label, class_dir) in classes.iter().enumerate() {
        names.push(file_name(class_dir));
        let files = sorted_entries(class_dir, |p| p.is_file() && is_image(p))?;
        if files.is_empty() {
            return Err(Error::invalid(OP, format!("{}: no PNG or JPEG images", class_dir.display())));
        }
        for file in files {
            let (w, h) = load_one(&file, size, channels, &mut pixels)?;
            let bytes = pixels.len() as u128 * 4;
            crate::limits::check_bytes(
                || format!("{}: the images so far", dir.display()),
                bytes,
                crate::limits::max_memory(),
            )?;
            match &shape {
                None => shape = Some((w, h, file.clone())),
                Some((w0, h0, first)) if (*w0, *h0) != (w, h) => {
                    return Err(Error::invalid(
                        OP,
                        format!(
                            "{} is {w}x{h} but {} is {w0}x{h0}; set ImageFolderOptions::size to resize",
                            file.display(),
                            first.display()
                        ),
                    ))
                }
                Some(_) => {}
            }
            labels.push(label);
        }
    }
    let (w, h, _) = shape.expect("at least one image was loaded");
    let images = Tensor::from_vec(pixels, &[labels.len(), channels, h as usize, w as usize])?;
    Ok((Dataset::new(images, labels, classes.len())?, names))
}

/// Decodes one image, converts and resizes it, appends its pixels (C×H×W) and returns (width, height).
fn load_one(path: &Path, size: Option<(u32, u32)>, channels: usize, out: &mut Vec<f32>) -> Result<(u32, u32)> {
    let mut reader = ImageReader::open(path).and_then(|r| r.with_guessed_format()).map_err(|e| Error::io(path, e))?;
    // The decoder refuses an image whose declared size needs more than the memory budget (a 100000×100000 PNG
    // header is a few bytes).
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(crate::limits::max_memory());
    reader.limits(limits);
    let img = reader.decode().map_err(|source| Error::Image { path: path.into(), source })?;
    if channels == 1 {
        let mut g = img.to_luma8();
        if let Some((w, h)) = size {
            g = image::imageops::resize(&g, w, h, FilterType::Triangle);
        }
        out.extend(g.as_raw().iter().map(|&v| f32::from(v) / 255.0));
        Ok(g.dimensions())
    } else {
        let mut rgb = img.to_rgb8();
        if let Some((w, h)) = size {
            rgb = image::imageops::resize(&rgb, w, h, FilterType::Triangle);
        }
        let raw = rgb.as_raw();
        for c in 0..3 {
            out.extend(raw.iter().skip(c).step_by(3).map(|&v| f32::from(v) / 255.0));
        }
        Ok(rgb.dimensions())
    }
}

fn is_image(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| ["png", "jpg", "jpeg"].iter().any(|x| e.eq_ignore_ascii_case(x)))
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The non-hidden entries of `dir` that pass `keep`, sorted by name.
fn sorted_entries(dir: &Path, keep: impl Fn(&Path) -> bool) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        if !file_name(&path).starts_with('.') && keep(&path) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}
