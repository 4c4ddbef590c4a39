//! The IDX file format (MNIST, Fashion-MNIST, …): reading, writing and conversion to images and labels.
//!
//! An IDX file is a 4-byte magic number `00 00 <type> <rank>`, then `rank` big-endian u32 dimensions, then the
//! values in row-major order, big-endian. Files may be gzip-compressed (detected by the magic bytes `1f 8b`, not
//! by the file name).

use std::io::{Read, Write};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use ndarray::{ArrayD, IxDyn};

use crate::{Error, Result, Tensor};

/// The element type of an IDX file: the third byte of its magic number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdxType {
    /// `0x08`: unsigned byte (images and labels of MNIST-style sets).
    U8,
    /// `0x09`: signed byte.
    I8,
    /// `0x0B`: big-endian i16.
    I16,
    /// `0x0C`: big-endian i32.
    I32,
    /// `0x0D`: big-endian f32.
    F32,
    /// `0x0E`: big-endian f64.
    F64,
}

impl IdxType {
    /// The type for a magic-number code, if it is one of the six IDX types.
    pub fn from_code(code: u8) -> Option<IdxType> {
        Some(match code {
            0x08 => IdxType::U8,
            0x09 => IdxType::I8,
            0x0B => IdxType::I16,
            0x0C => IdxType::I32,
            0x0D => IdxType::F32,
            0x0E => IdxType::F64,
            _ => return None,
        })
    }

    /// The magic-number code.
    pub fn code(self) -> u8 {
        match self {
            IdxType::U8 => 0x08,
            IdxType::I8 => 0x09,
            IdxType::I16 => 0x0B,
            IdxType::I32 => 0x0C,
            IdxType::F32 => 0x0D,
            IdxType::F64 => 0x0E,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }
}

/// The values of an IDX file, in its element type, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum IdxData {
    /// Unsigned bytes.
    U8(Vec<u8>),
    /// Signed bytes.
    I8(Vec<i8>),
    /// 16-bit integers.
    I16(Vec<i16>),
    /// 32-bit integers.
    I32(Vec<i32>),
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 64-bit floats.
    F64(Vec<f64>),
}

impl IdxData {
    /// The element type.
    pub fn dtype(&self) -> IdxType {
        match self {
            IdxData::U8(_) => IdxType::U8,
            IdxData::I8(_) => IdxType::I8,
            IdxData::I16(_) => IdxType::I16,
            IdxData::I32(_) => IdxType::I32,
            IdxData::F32(_) => IdxType::F32,
            IdxData::F64(_) => IdxType::F64,
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            IdxData::U8(v) => v.len(),
            IdxData::I8(v) => v.len(),
            IdxData::I16(v) => v.len(),
            IdxData::I32(v) => v.len(),
            IdxData::F32(v) => v.len(),
            IdxData::F64(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every value as f64 (exact for all six types).
    fn to_f64(&self) -> Vec<f64> {
        match self {
            IdxData::U8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            IdxData::I8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            IdxData::I16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            IdxData::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            IdxData::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            IdxData::F64(v) => v.clone(),
        }
    }
}

/// A decoded IDX file: its dimensions and its values.
#[derive(Clone, Debug, PartialEq)]
pub struct Idx {
    dims: Vec<usize>,
    data: IdxData,
}

impl Idx {
    /// An IDX array; the number of values must equal the product of `dims`, the rank must be 1..=255 and every
    /// dimension must fit in a u32.
    pub fn new(dims: Vec<usize>, data: IdxData) -> Result<Idx> {
        if dims.is_empty() || dims.len() > 255 {
            return Err(Error::invalid("Idx::new", format!("rank must be 1..=255, got {}", dims.len())));
        }
        if let Some(d) = dims.iter().find(|&&d| u32::try_from(d).is_err()) {
            return Err(Error::invalid("Idx::new", format!("dimension {d} does not fit in a u32")));
        }
        let n = crate::limits::checked_numel("Idx::new", &dims)?;
        if n != data.len() {
            return Err(Error::ShapeMismatch { op: "Idx::new", expected: dims, got: vec![data.len()] });
        }
        Ok(Idx { dims, data })
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The values.
    pub fn data(&self) -> &IdxData {
        &self.data
    }

    /// The element type.
    pub fn dtype(&self) -> IdxType {
        self.data.dtype()
    }

    /// Reads an IDX file, plain or gzip-compressed.
    pub fn read(path: impl AsRef<Path>) -> Result<Idx> {
        let path = path.as_ref();
        let len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        crate::limits::check_bytes(|| format!("reading {}", path.display()), len.into(), crate::limits::max_memory())?;
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Idx::decode(&bytes, path)
    }

    /// Decodes IDX bytes, plain or gzip-compressed; `source` names them in error messages.
    ///
    /// A truncated or corrupt input (short header, non-zero magic bytes, unknown type code, fewer or more data
    /// bytes than the dimensions declare, broken gzip stream) is an [`Error::BadFile`].
    pub fn decode(bytes: &[u8], source: &Path) -> Result<Idx> {
        if bytes.starts_with(&[0x1f, 0x8b]) {
            return parse(&gunzip(bytes, source)?, source);
        }
        parse(bytes, source)
    }

    /// The plain (uncompressed) IDX encoding.
    pub fn encode(&self) -> Vec<u8> {
        let header = 4 + 4 * self.dims.len();
        let mut out = Vec::with_capacity(header + self.data.len() * self.dtype().size());
        out.extend_from_slice(&[0, 0, self.dtype().code(), self.dims.len() as u8]);
        for &d in &self.dims {
            out.extend_from_slice(&(d as u32).to_be_bytes());
        }
        match &self.data {
            IdxData::U8(v) => out.extend_from_slice(v),
            IdxData::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
            IdxData::I16(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
            IdxData::I32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
            IdxData::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
            IdxData::F64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
        }
        out
    }

    /// Writes the file atomically (a temporary file in the same directory, then a rename); gzip-compressed when
    /// the path ends in `.gz`, plain otherwise.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let plain = self.encode();
        let gz = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz"));
        let bytes = if gz {
            let mut enc = GzEncoder::new(Vec::with_capacity(plain.len() / 2), Compression::default());
            enc.write_all(&plain).map_err(|e| Error::io(path, e))?;
            enc.finish().map_err(|e| Error::io(path, e))?
        } else {
            plain
        };
        crate::io::write_atomic(path, &bytes)
    }

    /// Images as an N×C×H×W tensor: rank 3 `[N,H,W]` is one channel, rank 4 `[N,H,W,C]` with C = 1 or 3 is
    /// channels-last (converted to NCHW).
    ///
    /// u8 values are divided by 255 (so images are in `[0,1]`); f32/f64 values are kept as they are and must be
    /// finite and in `[0,1]`; the signed integer types are rejected (there is no agreed scale for them).
    pub fn to_images(&self, source: &Path) -> Result<Tensor> {
        let (n, h, w, c) = match self.dims[..] {
            [n, h, w] => (n, h, w, 1),
            [n, h, w, c] if c == 1 || c == 3 => (n, h, w, c),
            _ => {
                return Err(Error::bad_file(
                    source,
                    format!("images must have dimensions [N,H,W] or [N,H,W,C] with C = 1 or 3, got {:?}", self.dims),
                ))
            }
        };
        let values: Vec<f32> = match &self.data {
            IdxData::U8(v) => v.iter().map(|&x| f32::from(x) / 255.0).collect(),
            IdxData::F32(_) | IdxData::F64(_) => {
                let v: Vec<f32> = self.data.to_f64().into_iter().map(|x| x as f32).collect();
                if let Some(bad) = v.iter().find(|x| !(0.0..=1.0).contains(*x)) {
                    return Err(Error::bad_file(source, format!("float image value {bad} is not in [0,1]")));
                }
                v
            }
            other => {
                return Err(Error::bad_file(
                    source,
                    format!("images of IDX type {:?} are not supported (use u8, f32 or f64)", other.dtype()),
                ))
            }
        };
        let nhwc = ArrayD::from_shape_vec(IxDyn(&[n, h, w, c]), values)
            .map_err(|e| Error::bad_file(source, format!("images of dimensions {:?}: {e}", self.dims)))?;
        let nchw = nhwc.permuted_axes(IxDyn(&[0, 3, 1, 2])).as_standard_layout().into_owned();
        Ok(Tensor::new(nchw))
    }

    /// Labels: rank 1 `[N]` (or `[N,1]`) of any integer type, or of floats holding whole numbers; every label
    /// must be non-negative.
    pub fn to_labels(&self, source: &Path) -> Result<Vec<usize>> {
        if !matches!(self.dims[..], [_] | [_, 1]) {
            return Err(Error::bad_file(source, format!("labels must have dimensions [N], got {:?}", self.dims)));
        }
        if let IdxData::U8(v) = &self.data {
            return Ok(v.iter().map(|&x| usize::from(x)).collect());
        }
        self.data
            .to_f64()
            .into_iter()
            .enumerate()
            .map(|(i, x)| {
                if x >= 0.0 && x.fract() == 0.0 && x <= u32::MAX as f64 {
                    Ok(x as usize)
                } else {
                    Err(Error::bad_file(source, format!("label {i} is {x}, not a non-negative whole number")))
                }
            })
            .collect()
    }

    /// An N×C×H×W image tensor as u8 IDX: C = 1 gives `[N,H,W]`, C = 3 gives channels-last `[N,H,W,3]`.
    /// Values are clamped to `[0,1]` and rounded to the nearest multiple of 1/255; NaN or Inf is an error.
    pub fn from_images(images: &Tensor) -> Result<Idx> {
        let (n, c, h, w) = images.dims4("Idx::from_images")?;
        if c != 1 && c != 3 {
            return Err(Error::invalid("Idx::from_images", format!("expected 1 or 3 channels, got {c}")));
        }
        if !images.all_finite() {
            return Err(Error::NonFinite { op: "Idx::from_images" });
        }
        let nhwc = images.value().view().permuted_axes(IxDyn(&[0, 2, 3, 1]));
        let bytes: Vec<u8> = nhwc.iter().map(|&x| (x.clamp(0.0, 1.0) * 255.0).round() as u8).collect();
        let dims = if c == 1 { vec![n, h, w] } else { vec![n, h, w, c] };
        Idx::new(dims, IdxData::U8(bytes))
    }

    /// Labels as IDX: u8 when every label is below 256, i32 otherwise.
    pub fn from_labels(labels: &[usize]) -> Result<Idx> {
        let data = if labels.iter().all(|&l| l < 256) {
            IdxData::U8(labels.iter().map(|&l| l as u8).collect())
        } else {
            let v = labels
                .iter()
                .map(|&l| i32::try_from(l).map_err(|_| Error::invalid("Idx::from_labels", format!("label {l} > i32"))))
                .collect::<Result<Vec<i32>>>()?;
            IdxData::I32(v)
        };
        Idx::new(vec![labels.len()], data)
    }
}

/// Reads an IDX image file (plain or .gz) as an N×C×H×W tensor in `[0,1]`; see [`Idx::to_images`].
pub fn read_idx_images(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    Idx::read(path)?.to_images(path)
}

/// Reads an IDX label file (plain or .gz); see [`Idx::to_labels`].
pub fn read_idx_labels(path: impl AsRef<Path>) -> Result<Vec<usize>> {
    let path = path.as_ref();
    Idx::read(path)?.to_labels(path)
}

/// Writes N×C×H×W images in `[0,1]` as a u8 IDX file (gzip when the path ends in `.gz`); see [`Idx::from_images`].
pub fn write_idx_images(path: impl AsRef<Path>, images: &Tensor) -> Result<()> {
    Idx::from_images(images)?.write(path)
}

/// Writes labels as an IDX file (gzip when the path ends in `.gz`); see [`Idx::from_labels`].
pub fn write_idx_labels(path: impl AsRef<Path>, labels: &[usize]) -> Result<()> {
    Idx::from_labels(labels)?.write(path)
}

/// The element type, the dimensions and the header length of IDX bytes (at least the whole header), and the
/// number of data bytes the dimensions declare — checked to be a valid array shape.
fn parse_header(bytes: &[u8], source: &Path) -> Result<(IdxType, Vec<usize>, usize, usize)> {
    let bad = |msg: String| Error::bad_file(source, msg);
    if bytes.len() < 4 {
        return Err(bad(format!("truncated header: {} bytes, an IDX file starts with a 4-byte magic", bytes.len())));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(format!(
            "not an IDX file: magic starts with {:02x} {:02x}, expected 00 00",
            bytes[0], bytes[1]
        )));
    }
    let dtype = IdxType::from_code(bytes[2]).ok_or_else(|| {
        bad(format!("unknown IDX element type 0x{:02x} (expected 08, 09, 0B, 0C, 0D or 0E)", bytes[2]))
    })?;
    let rank = usize::from(bytes[3]);
    if rank == 0 {
        return Err(bad("IDX header declares rank 0".into()));
    }
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(bad(format!(
            "truncated header: rank {rank} needs {header} header bytes, the file has {}",
            bytes.len()
        )));
    }
    let dims: Vec<usize> =
        bytes[4..header].chunks_exact(4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize).collect();
    let numel = crate::limits::checked_numel("IDX dimensions", &dims)
        .map_err(|_| bad(format!("dimensions {dims:?} are not a valid array shape (too many elements)")))?;
    let need = numel.checked_mul(dtype.size()).ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
    Ok((dtype, dims, header, need))
}

/// Inflates a gzip-compressed IDX file, reading no more than its header declares (plus one byte, to tell a file
/// with extra data), after checking the declared size against [`crate::limits::max_memory`]: a small gzip stream
/// that inflates to gigabytes is refused without inflating it.
fn gunzip(bytes: &[u8], source: &Path) -> Result<Vec<u8>> {
    let corrupt = |e: std::io::Error| Error::bad_file(source, format!("corrupt or truncated gzip stream: {e}"));
    let mut dec = MultiGzDecoder::new(bytes);
    let mut out = Vec::new();
    (&mut dec).take(4).read_to_end(&mut out).map_err(corrupt)?;
    if out.len() == 4 {
        (&mut dec).take(4 * u64::from(out[3])).read_to_end(&mut out).map_err(corrupt)?;
    }
    let (_, _, header, need) = parse_header(&out, source)?;
    let total = header as u128 + need as u128;
    crate::limits::check_bytes(
        || format!("{}: decompressing the declared IDX data", source.display()),
        total,
        crate::limits::max_memory(),
    )?;
    // Grown as the stream delivers: a header may declare more than the stream holds.
    out.reserve(need.min(bytes.len().saturating_mul(16)));
    dec.take(need as u64 + 1).read_to_end(&mut out).map_err(corrupt)?;
    Ok(out)
}

/// Parses plain IDX bytes.
fn parse(bytes: &[u8], source: &Path) -> Result<Idx> {
    let bad = |msg: String| Error::bad_file(source, msg);
    let (dtype, dims, header, need) = parse_header(bytes, source)?;
    let body = &bytes[header..];
    if need > body.len() {
        return Err(bad(format!(
            "truncated: dimensions {dims:?} of {dtype:?} need {need} data bytes, the file has {}",
            body.len()
        )));
    }
    if need < body.len() {
        return Err(bad(format!(
            "dimensions {dims:?} of {dtype:?} need {need} data bytes, the file has {} extra",
            body.len() - need
        )));
    }
    let data = match dtype {
        IdxType::U8 => IdxData::U8(body.to_vec()),
        IdxType::I8 => IdxData::I8(body.iter().map(|&b| b as i8).collect()),
        IdxType::I16 => IdxData::I16(body.chunks_exact(2).map(|b| i16::from_be_bytes([b[0], b[1]])).collect()),
        IdxType::I32 => {
            IdxData::I32(body.chunks_exact(4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])).collect())
        }
        IdxType::F32 => {
            IdxData::F32(body.chunks_exact(4).map(|b| f32::from_be_bytes([b[0], b[1], b[2], b[3]])).collect())
        }
        IdxType::F64 => IdxData::F64(
            body.chunks_exact(8)
                .map(|b| f64::from_be_bytes(b.try_into().expect("chunks_exact(8) yields 8 bytes")))
                .collect(),
        ),
    };
    Ok(Idx { dims, data })
}
