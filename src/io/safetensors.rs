//! Reading and writing [safetensors](https://github.com/huggingface/safetensors) files: model weights under
//! PyTorch's `state_dict` names, and plain named tensors.
//!
//! Values are stored little-endian in row-major order. Armoury computes in f32: floating-point tensors of any
//! width (F16, BF16, F32, F64) are read as f32, integer and boolean tensors as i64 (or, when asked for f32, as
//! the nearest f32). Module weights are written as F32, except `…num_batches_tracked` buffers, which PyTorch
//! keeps as an I64 scalar and which are written that way so that the file loads into PyTorch unchanged.
//!
//! Every read validates the whole header first (offsets, sizes, dtypes): a corrupt or truncated file is an
//! [`Error::BadFile`], never a panic. Writes go to a temporary file in the destination's directory that is then
//! renamed over the destination, so a reader never sees a half-written file.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::{Metadata, TensorInfo, TensorView};
use safetensors::{Dtype, SafeTensors};

use crate::nn::{Module, ModuleExt};
use crate::{Error, Result};

/// The suffix of the BatchNorm buffer that PyTorch stores as an I64 scalar.
const NUM_BATCHES_TRACKED: &str = "num_batches_tracked";

/// One tensor read from (or to be written to) a safetensors file, in the type Armoury keeps it in.
#[derive(Clone, Debug, PartialEq)]
pub enum AnyTensor {
    /// A floating-point tensor (F16, BF16, F32 or F64 in the file; written as F32).
    F32(ArrayD<f32>),
    /// An integer or boolean tensor (I8…I64, U8…U64 or BOOL in the file; written as I64).
    I64(ArrayD<i64>),
}

impl AnyTensor {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            AnyTensor::F32(a) => a.shape(),
            AnyTensor::I64(a) => a.shape(),
        }
    }

    /// The values as f32; integers are rounded to the nearest f32 (exact up to 2²⁴ in magnitude).
    pub fn to_f32(&self) -> ArrayD<f32> {
        match self {
            AnyTensor::F32(a) => a.clone(),
            AnyTensor::I64(a) => a.mapv(|v| v as f32),
        }
    }
}

/// A safetensors file read into memory, its header validated; tensors are decoded on request.
///
/// Open it once to read several tensors (the reference fixtures, a checkpoint) without re-reading the file.
///
/// ```no_run
/// use armoury::io::SafetensorsFile;
/// let file = SafetensorsFile::open("tests/fixtures/reference.safetensors")?;
/// let x = file.f32("x")?; // [16, 1, 28, 28]
/// let y = file.i64("y")?; // [16] class labels
/// # Ok::<(), armoury::Error>(())
/// ```
pub struct SafetensorsFile {
    path: PathBuf,
    bytes: Vec<u8>,
    /// Where the data section starts in `bytes` (after the length prefix and the JSON header).
    data_start: usize,
    metadata: Metadata,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile").field("path", &self.path).field("names", &self.names()).finish()
    }
}

impl SafetensorsFile {
    /// Reads the file at `path` and validates its header.
    ///
    /// Fails with [`Error::Io`] if the file cannot be read and [`Error::BadFile`] if it is not a valid
    /// safetensors file (bad header, offsets that do not tile the data, truncation, trailing bytes).
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref();
        let len = fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        crate::limits::check_bytes(|| format!("reading {}", path.display()), len.into(), crate::limits::max_memory())?;
        let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
        SafetensorsFile::from_bytes(bytes, path)
    }

    /// Parses a safetensors file already in memory; `path` is only used in error messages.
    pub fn from_bytes(bytes: Vec<u8>, path: impl Into<PathBuf>) -> Result<SafetensorsFile> {
        let path = path.into();
        let (header_len, metadata) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| Error::bad_file(&path, format!("not a valid safetensors file: {e}")))?;
        // `read_metadata` checked that 8 + header + data is exactly the file length, so this cannot overflow.
        let data_start = 8 + header_len;
        Ok(SafetensorsFile { path, bytes, data_start, metadata })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensor names, in the order of their data in the file.
    pub fn names(&self) -> Vec<String> {
        self.metadata.offset_keys()
    }

    /// Whether the file holds a tensor called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.metadata.info(name).is_some()
    }

    /// The shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.info(name)?.shape.clone())
    }

    /// The file's data type of tensor `name`, as safetensors spells it (`"F32"`, `"I64"`, …).
    pub fn dtype(&self, name: &str) -> Result<String> {
        Ok(self.info(name)?.dtype.to_string())
    }

    /// The free-form `__metadata__` string map of the header, if any.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.metadata().as_ref()
    }

    /// Tensor `name` in the type Armoury keeps it in: floats as f32, integers and booleans as i64.
    ///
    /// F64 values are rounded to f32; U64 values above `i64::MAX` and sub-byte or 8-bit float types (F4, F6,
    /// F8) are rejected with [`Error::BadFile`].
    pub fn tensor(&self, name: &str) -> Result<AnyTensor> {
        let info = self.info(name)?;
        let raw = self.raw(name, info)?;
        let shape = IxDyn(&info.shape);
        let fail = |msg: String| Error::bad_file(&self.path, format!("tensor '{name}': {msg}"));
        let floats = |v: Vec<f32>| ArrayD::from_shape_vec(shape.clone(), v).map(AnyTensor::F32);
        let ints = |v: Vec<i64>| ArrayD::from_shape_vec(shape.clone(), v).map(AnyTensor::I64);
        let out = match info.dtype {
            Dtype::F32 => floats(le_chunks::<4>(raw).map(f32::from_le_bytes).collect()),
            Dtype::F64 => floats(le_chunks::<8>(raw).map(|b| f64::from_le_bytes(b) as f32).collect()),
            Dtype::F16 => floats(le_chunks::<2>(raw).map(|b| f16_to_f32(u16::from_le_bytes(b))).collect()),
            Dtype::BF16 => floats(le_chunks::<2>(raw).map(|b| bf16_to_f32(u16::from_le_bytes(b))).collect()),
            Dtype::I64 => ints(le_chunks::<8>(raw).map(i64::from_le_bytes).collect()),
            Dtype::I32 => ints(le_chunks::<4>(raw).map(|b| i64::from(i32::from_le_bytes(b))).collect()),
            Dtype::I16 => ints(le_chunks::<2>(raw).map(|b| i64::from(i16::from_le_bytes(b))).collect()),
            Dtype::I8 => ints(raw.iter().map(|&b| i64::from(b as i8)).collect()),
            Dtype::U32 => ints(le_chunks::<4>(raw).map(|b| i64::from(u32::from_le_bytes(b))).collect()),
            Dtype::U16 => ints(le_chunks::<2>(raw).map(|b| i64::from(u16::from_le_bytes(b))).collect()),
            Dtype::U8 | Dtype::BOOL => ints(raw.iter().map(|&b| i64::from(b)).collect()),
            Dtype::U64 => {
                let v = le_chunks::<8>(raw)
                    .map(|b| i64::try_from(u64::from_le_bytes(b)))
                    .collect::<std::result::Result<Vec<i64>, _>>()
                    .map_err(|_| fail("U64 value does not fit in i64".into()))?;
                ints(v)
            }
            other => return Err(fail(format!("unsupported dtype {other}"))),
        };
        out.map_err(|e| fail(format!("shape {:?} does not match its data: {e}", info.shape)))
    }

    /// Tensor `name` as f32, whatever its type in the file (see [`AnyTensor::to_f32`]).
    pub fn f32(&self, name: &str) -> Result<ArrayD<f32>> {
        Ok(match self.tensor(name)? {
            AnyTensor::F32(a) => a,
            other => other.to_f32(),
        })
    }

    /// Integer tensor `name` (class labels, counters) as i64. A floating-point tensor is an
    /// [`Error::InvalidArgument`]: the caller asked for the wrong thing.
    pub fn i64(&self, name: &str) -> Result<ArrayD<i64>> {
        match self.tensor(name)? {
            AnyTensor::I64(a) => Ok(a),
            AnyTensor::F32(_) => Err(Error::invalid(
                "safetensors",
                format!("{}: tensor '{name}' is {}, not an integer type", self.path.display(), self.info(name)?.dtype),
            )),
        }
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> Result<Vec<(String, AnyTensor)>> {
        self.names().into_iter().map(|n| Ok((n.clone(), self.tensor(&n)?))).collect()
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.metadata
            .info(name)
            .ok_or_else(|| Error::invalid("safetensors", format!("{}: no tensor named '{name}'", self.path.display())))
    }

    fn raw(&self, name: &str, info: &TensorInfo) -> Result<&[u8]> {
        let (s, e) = info.data_offsets;
        self.data_start
            .checked_add(s)
            .zip(self.data_start.checked_add(e))
            .and_then(|(s, e)| self.bytes.get(s..e))
            .ok_or_else(|| Error::bad_file(&self.path, format!("tensor '{name}': data offsets out of range")))
    }
}

/// Every tensor of the file at `path` as f32 (integers converted), in file order.
pub fn load_tensors(path: impl AsRef<Path>) -> Result<Vec<(String, ArrayD<f32>)>> {
    let file = SafetensorsFile::open(path)?;
    file.names().into_iter().map(|n| Ok((n.clone(), file.f32(&n)?))).collect()
}

/// Every tensor of the file at `path` in its own kind (floats as f32, integers as i64), in file order.
pub fn load_tensors_any(path: impl AsRef<Path>) -> Result<Vec<(String, AnyTensor)>> {
    SafetensorsFile::open(path)?.tensors()
}

/// The integer tensor `name` of the file at `path`, flattened in row-major order (e.g. the labels `y` of the
/// reference fixtures).
pub fn read_i64(path: impl AsRef<Path>, name: &str) -> Result<Vec<i64>> {
    Ok(SafetensorsFile::open(path)?.i64(name)?.iter().copied().collect())
}

/// Writes named f32 tensors as F32 (atomically: a temporary file renamed over `path`).
///
/// Names must be unique and must not be `__metadata__`.
pub fn save_tensors(path: impl AsRef<Path>, tensors: &[(String, ArrayD<f32>)]) -> Result<()> {
    let items: Vec<(&str, Encoded)> = tensors.iter().map(|(n, a)| (n.as_str(), Encoded::f32(a))).collect();
    write_file(path.as_ref(), items, None)
}

/// Writes named tensors, floats as F32 and integers as I64, with an optional `__metadata__` string map
/// (atomically: a temporary file renamed over `path`).
pub fn save_tensors_any(
    path: impl AsRef<Path>,
    tensors: &[(String, AnyTensor)],
    metadata: Option<&HashMap<String, String>>,
) -> Result<()> {
    let items: Vec<(&str, Encoded)> = tensors.iter().map(|(n, t)| (n.as_str(), Encoded::any(t))).collect();
    write_file(path.as_ref(), items, metadata.cloned())
}

/// Writes every parameter and buffer of `module` under its PyTorch name (see [`ModuleExt::named_params`]):
/// F32, except `…num_batches_tracked` as an I64 scalar, as PyTorch does. Atomic: a temporary file in the same
/// directory is renamed over `path`.
///
/// ```no_run
/// let model = armoury::nn::cnn(0);
/// armoury::io::save_module(&model, "cnn.safetensors")?;
/// armoury::io::load_module(&model, "cnn.safetensors")?;
/// # Ok::<(), armoury::Error>(())
/// ```
pub fn save_module(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    save_module_inner(module, path.as_ref(), None)
}

/// [`save_module`] with a `__metadata__` string map in the header (provenance, epoch, accuracy, …).
pub fn save_module_with_metadata(
    module: &dyn Module,
    path: impl AsRef<Path>,
    metadata: &HashMap<String, String>,
) -> Result<()> {
    save_module_inner(module, path.as_ref(), Some(metadata.clone()))
}

fn save_module_inner(module: &dyn Module, path: &Path, metadata: Option<HashMap<String, String>>) -> Result<()> {
    let params = module.named_params();
    let items: Vec<(&str, Encoded)> = params
        .iter()
        .map(|(name, p)| {
            let value = p.value();
            let enc = if name.ends_with(NUM_BATCHES_TRACKED) {
                Encoded::i64_iter(value.shape(), value.iter().map(|&v| v.round() as i64))
            } else {
                Encoded::f32_iter(value.shape(), value.iter().copied())
            };
            (name.as_str(), enc)
        })
        .collect();
    write_file(path, items, metadata)
}

/// Loads the parameters and buffers of `module` from the safetensors file at `path` (a PyTorch `state_dict`
/// saved with `safetensors.torch.save_file`, or a file from [`save_module`]).
///
/// The file must hold exactly the module's names with the module's shapes. Otherwise the result is
/// [`Error::ParameterMismatch`] listing every difference, one line each — a missing name, an unexpected name, a
/// shape difference — and the module is left unchanged. Floating-point data of any width and integer data
/// (`num_batches_tracked`) are converted to f32. A corrupt or truncated file is [`Error::BadFile`]; nothing is
/// modified unless every tensor has been read and checked.
pub fn load_module(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    let file = SafetensorsFile::open(path)?;
    load_module_from(module, &file)
}

/// [`load_module`] from a file already opened.
pub fn load_module_from(module: &dyn Module, file: &SafetensorsFile) -> Result<()> {
    let params = module.named_params();
    let mut problems = Vec::new();
    let mut known = HashSet::new();
    for (name, p) in &params {
        known.insert(name.as_str());
        let want = p.shape();
        match file.shape(name) {
            Err(_) => problems.push(format!("missing in file: {name} {want:?}")),
            Ok(got) if got != want => problems.push(format!("shape of {name}: model {want:?}, file {got:?}")),
            Ok(_) => {}
        }
    }
    let mut unexpected: Vec<String> = file.names().into_iter().filter(|n| !known.contains(n.as_str())).collect();
    unexpected.sort();
    for name in unexpected {
        let shape = file.shape(&name)?;
        problems.push(format!("unexpected in file: {name} {shape:?}"));
    }
    if !problems.is_empty() {
        return Err(Error::ParameterMismatch(problems));
    }
    // Decode everything before touching the module, so that a bad tensor leaves it unchanged.
    let values = params.iter().map(|(name, _)| file.f32(name)).collect::<Result<Vec<_>>>()?;
    // A NaN or infinite weight would only show up as NaN logits later (every prediction class 0).
    if let Some(((name, _), _)) = params.iter().zip(&values).find(|(_, v)| v.iter().any(|x| !x.is_finite())) {
        return Err(Error::bad_file(&file.path, format!("parameter {name} holds NaN or infinite values")));
    }
    for ((_, p), v) in params.iter().zip(values) {
        p.set(v)?;
    }
    Ok(())
}

/// A tensor encoded for writing: its dtype, shape and little-endian bytes.
struct Encoded {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl Encoded {
    fn f32_iter(shape: &[usize], values: impl Iterator<Item = f32>) -> Encoded {
        Encoded { dtype: Dtype::F32, shape: shape.to_vec(), bytes: values.flat_map(f32::to_le_bytes).collect() }
    }

    fn i64_iter(shape: &[usize], values: impl Iterator<Item = i64>) -> Encoded {
        Encoded { dtype: Dtype::I64, shape: shape.to_vec(), bytes: values.flat_map(i64::to_le_bytes).collect() }
    }

    fn f32(a: &ArrayD<f32>) -> Encoded {
        Encoded::f32_iter(a.shape(), a.iter().copied())
    }

    fn any(t: &AnyTensor) -> Encoded {
        match t {
            AnyTensor::F32(a) => Encoded::f32(a),
            AnyTensor::I64(a) => Encoded::i64_iter(a.shape(), a.iter().copied()),
        }
    }
}

/// Serialises `items` and writes them atomically to `path`.
fn write_file(path: &Path, items: Vec<(&str, Encoded)>, metadata: Option<HashMap<String, String>>) -> Result<()> {
    let mut seen = HashSet::new();
    for (name, _) in &items {
        if *name == "__metadata__" || !seen.insert(*name) {
            return Err(Error::invalid("safetensors", format!("tensor name '{name}' is reserved or repeated")));
        }
    }
    let views = items
        .iter()
        .map(|(name, e)| Ok((*name, TensorView::new(e.dtype, e.shape.clone(), &e.bytes)?)))
        .collect::<std::result::Result<Vec<_>, safetensors::SafeTensorError>>()
        .and_then(|views| safetensors::serialize(views, metadata))
        .map_err(|e| Error::invalid("safetensors", format!("cannot serialise {}: {e}", path.display())))?;
    super::write_atomic(path, &views)
}

/// The `N`-byte chunks of `raw` as arrays (any alignment; a trailing partial chunk cannot occur because the
/// header was validated, and would be ignored).
fn le_chunks<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    raw.chunks_exact(N).map(|c| {
        let mut b = [0u8; N];
        b.copy_from_slice(c);
        b
    })
}

/// IEEE 754 half precision to f32 (exact: every f16 is an f32).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let bits = match (exp, mant) {
        (0, 0) => sign,
        // Subnormal: mant · 2⁻²⁴, exact in f32.
        (0, m) => {
            let magnitude = m as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -magnitude } else { magnitude };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// bfloat16 to f32 (exact: bf16 is the top half of an f32).
fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8001), -(2f32.powi(-24)));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn every_dtype_reads_back() {
        // Hand-built file: F64, F16, I32, BOOL tensors.
        let specs: Vec<(&str, Dtype, Vec<u8>)> = vec![
            ("a", Dtype::F64, [1.5f64, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect()),
            ("b", Dtype::F16, [0x3c00u16, 0xc000].iter().flat_map(|v| v.to_le_bytes()).collect()),
            ("c", Dtype::I32, [7i32, -3].iter().flat_map(|v| v.to_le_bytes()).collect()),
            ("d", Dtype::BOOL, vec![1, 0]),
        ];
        let views: Vec<_> =
            specs.iter().map(|(n, d, b)| (*n, TensorView::new(*d, vec![2], b).expect("valid view"))).collect();
        let bytes = safetensors::serialize(views, None).expect("serialises");
        let f = SafetensorsFile::from_bytes(bytes, "mem").expect("parses");
        assert_eq!(f.f32("a").expect("a").as_slice(), Some(&[1.5f32, -2.0][..]));
        assert_eq!(f.f32("b").expect("b").as_slice(), Some(&[1.0f32, -2.0][..]));
        assert_eq!(f.i64("c").expect("c").as_slice(), Some(&[7i64, -3][..]));
        assert_eq!(f.i64("d").expect("d").as_slice(), Some(&[1i64, 0][..]));
        assert_eq!(f.f32("c").expect("c as f32").as_slice(), Some(&[7.0f32, -3.0][..]));
        assert!(matches!(f.i64("a"), Err(Error::InvalidArgument { .. })));
        assert!(matches!(f.f32("zzz"), Err(Error::InvalidArgument { .. })));
    }

    #[test]
    fn garbage_is_a_bad_file_at_every_length() {
        let views = vec![("w", TensorView::new(Dtype::F32, vec![3], &[0u8; 12]).expect("valid"))];
        let bytes = safetensors::serialize(views, None).expect("serialises");
        for len in 0..bytes.len() {
            let r = SafetensorsFile::from_bytes(bytes[..len].to_vec(), "mem");
            assert!(matches!(r, Err(Error::BadFile { .. })), "length {len}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(SafetensorsFile::from_bytes(longer, "mem"), Err(Error::BadFile { .. })));
        assert_eq!(SafetensorsFile::from_bytes(bytes, "mem").expect("whole file").f32("w").expect("w").len(), 3);
    }
}
