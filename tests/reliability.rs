//! Reliability: every input a fuzzer (or a stranger's file) can produce is a typed error, never a panic, an abort
//! or an allocation beyond the memory budget. One regression test per crash or unbounded allocation found, each
//! built from a minimal input; the crasher files and fuzz corpora are replayed through the fuzz harness
//! (`fuzz/src/lib.rs`, shared with the cargo-fuzz targets). See docs/reliability.md.

use std::io::Write;
use std::path::Path;

use armoury::attack::budget::{project_ball, project_row};
use armoury::attack::{best_other, per_sample_norms, sample, Norm};
use armoury::data::{Dataset, Idx, IdxData};
use armoury::onnx::proto::TensorProto;
use armoury::onnx::{float_tensor, int_tensor, LoadOptions, OnnxModel};
use armoury::{Classifier, Counters, Error, Goal, Module, ModuleClassifier, Resolved, Tensor};
use flate2::write::GzEncoder;
use flate2::Compression;
use ndarray::Array2;

use crate::common::fixture;
use crate::onnx::build::{attr_i, attr_ints, attr_s, node, Graph};

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

/// A budget small enough that the hostile graphs below exceed it by orders of magnitude.
const SMALL: LoadOptions = LoadOptions { max_memory: 64 << 20, batch_size: 2 };

fn idx_header(dtype: u8, dims: &[u32]) -> Vec<u8> {
    let mut b = vec![0, 0, dtype, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b
}

fn gzip(members: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in members {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(m).unwrap();
        out.extend(e.finish().unwrap());
    }
    out
}

fn is_resource_limit<T>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(Error::ResourceLimit { .. }))
}

// ---------------------------------------------------------------------------------------------------- IDX

#[test]
fn idx_empty_with_huge_dims_is_an_error() {
    // [FFFFFFFF, FFFFFFFF, 0]: no element, but no valid array either (ndarray rejected it in an `expect`).
    let bytes = idx_header(0x08, &[u32::MAX, u32::MAX, 0]);
    let r = Idx::decode(&bytes, Path::new("huge.idx"));
    assert!(matches!(r, Err(Error::BadFile { .. })), "{r:?}");
    assert!(Idx::new(vec![u32::MAX as usize, u32::MAX as usize, 0], IdxData::U8(vec![])).is_err());
    // A legitimate empty file still decodes.
    let empty = Idx::decode(&idx_header(0x08, &[0, 28, 28]), Path::new("empty.idx")).unwrap();
    assert_eq!(empty.dims(), &[0, 28, 28]);
}

#[test]
fn idx_gzip_reads_only_the_declared_size() {
    // A header for one 28×28 image, then 64 MiB of zeros in further gzip members (a few hundred KB compressed):
    // the reader stops one byte past the declared size instead of inflating everything.
    let mut first = idx_header(0x08, &[1, 28, 28]);
    first.extend(vec![0u8; 784]);
    let zeros = vec![0u8; 1 << 20];
    let members: Vec<&[u8]> = std::iter::once(&first[..]).chain(std::iter::repeat_n(&zeros[..], 64)).collect();
    let gz = gzip(&members);
    assert!(gz.len() < 1 << 20, "the bomb is small: {} bytes", gz.len());
    let t = std::time::Instant::now();
    let r = Idx::decode(&gz, Path::new("bomb.idx.gz"));
    match r {
        Err(Error::BadFile { msg, .. }) => assert!(msg.contains("1 extra"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed().as_secs_f32() < 1.0, "inflated more than it had to: {:?}", t.elapsed());
    // The same file without the trailing members decodes.
    assert_eq!(Idx::decode(&gzip(&[&first]), Path::new("ok.idx.gz")).unwrap().dims(), &[1, 28, 28]);
    // A header declaring more than the memory budget is refused before inflating anything.
    let huge = gzip(&[&idx_header(0x08, &[1 << 31, 1 << 31])]);
    assert!(is_resource_limit(&Idx::decode(&huge, Path::new("huge.idx.gz"))));
}

#[test]
fn class_counts_are_limited() {
    let images = Tensor::zeros(&[1, 1, 2, 2]);
    // A label of 2^31 − 1 once panicked with a capacity overflow (a confusion matrix of that many classes).
    let r = Dataset::new(images.clone(), vec![(1 << 31) - 1], 1 << 31);
    assert!(is_resource_limit(&r), "{r:?}");
    let idx = Idx::from_labels(&[(1 << 31) - 1]).unwrap();
    let labels = Idx::decode(&idx.encode(), Path::new("labels.idx")).unwrap().to_labels(Path::new("l")).unwrap();
    assert!(is_resource_limit(&Dataset::new(images.clone(), labels, (1 << 31) - 1 + 1)));
    // 40,000 classes are allowed, but evaluating them needs a 12.8 GB confusion matrix: over a 4 GiB budget (the
    // classes are the model's: 40,000 outputs).
    let d = Dataset::new(images, vec![39_999], 40_000).unwrap();
    let model = armoury::nn::Sequential::new()
        .add("flatten", armoury::nn::Flatten)
        .add("fc", armoury::nn::Linear::new(4, 40_000, true, 0));
    armoury::limits::set_max_memory(4 << 30);
    let r = armoury::train::evaluate(&model, &d, 1);
    assert!(is_resource_limit(&r), "{r:?}");
    // The ONNX class count is the declared output dimension: 2^40 is refused.
    let g = Graph::new(13, &[-1, 4]).node(node("Identity", &["x"], &["y"], "id", vec![])).output("y", &[-1, 1 << 40]);
    let r = g.model().classifier((0.0, 1.0));
    assert!(is_resource_limit(&r), "{:?}", r.err().map(|e| e.to_string()));
}

// ---------------------------------------------------------------------------------------------------- ONNX

/// A graph's model message with extra initialisers (raw tensors the builder cannot express).
fn with_inits(g: &Graph, extra: Vec<TensorProto>) -> armoury::onnx::proto::ModelProto {
    let mut p = g.proto();
    p.graph.as_mut().unwrap().initializer.extend(extra);
    p
}

fn empty_tensor(name: &str, dims: &[i64], data_type: i32) -> TensorProto {
    TensorProto { name: name.into(), dims: dims.to_vec(), data_type, ..Default::default() }
}

fn load(p: &armoury::onnx::proto::ModelProto) -> armoury::Result<OnnxModel> {
    OnnxModel::from_proto_with(p, SMALL)
}

fn forward(m: &OnnxModel, shape: &[usize]) -> armoury::Result<Tensor> {
    m.forward_t(&Tensor::full(shape, 0.5), false)
}

#[test]
fn onnx_empty_tensors_with_huge_dims_are_errors() {
    const FLOAT: i32 = 1;
    const INT64: i32 = 7;
    // An initialiser [0, 2^40, 2^40] ("length checked" in value.rs).
    let g = Graph::new(13, &[-1, 4]).node(node("Add", &["x", "e"], &["y"], "add", vec![])).output("y", &[]);
    let r = load(&with_inits(&g, vec![empty_tensor("e", &[0, 1 << 40, 1 << 40], FLOAT)]));
    assert!(matches!(r, Err(Error::BadFile { .. })), "{:?}", r.err());
    // Broadcasting two empty constants to [0, 2^40, 2^40] while folding, float and integer (ints.rs Div).
    for (op, ty) in [("Add", FLOAT), ("Div", INT64)] {
        let g = Graph::new(13, &[-1, 4])
            .node(node(op, &["a", "b"], &["c"], "fold", vec![]))
            .node(node("Add", &["x", "c"], &["y"], "add", vec![]))
            .output("y", &[]);
        let p = with_inits(&g, vec![empty_tensor("a", &[0, 1, 1 << 40], ty), empty_tensor("b", &[0, 1 << 40, 1], ty)]);
        assert!(is_resource_limit(&load(&p)), "{op}");
    }
    // Gather → reshape: empty indices of shape [0, 2^31, 2^31] make [N, 0, 2^31, 2^31] of the data, whose non-zero
    // dimensions multiply past isize::MAX.
    let g = Graph::new(13, &[-1, 4])
        .node(node("Gather", &["x", "i"], &["g1"], "g1", vec![attr_i("axis", 1)]))
        .node(node("Gather", &["g1", "i"], &["y"], "g2", vec![attr_i("axis", 2)]))
        .output("y", &[]);
    let p = with_inits(&g, vec![empty_tensor("i", &[0, 1 << 31, 1 << 31], INT64)]);
    assert!(is_resource_limit(&load(&p).and_then(|m| forward(&m, &[2, 4]))));
    // Slice to an empty axis, then Reshape (allowzero) to [0, 2^40, 2^40], then Flatten and GlobalAveragePool.
    let g = Graph::new(13, &[-1, 4])
        .init_i("s", &[1], &[0])
        .init_i("e", &[1], &[0])
        .init_i("a", &[1], &[1])
        .init_i("shape", &[3], &[0, 1 << 40, 1 << 40])
        .node(node("Slice", &["x", "s", "e", "a"], &["z"], "slice", vec![]))
        .node(node("Reshape", &["z", "shape"], &["r"], "reshape", vec![attr_i("allowzero", 1)]))
        .node(node("Flatten", &["r"], &["y"], "flatten", vec![]))
        .output("y", &[]);
    assert!(load(&g.proto()).and_then(|m| forward(&m, &[2, 4])).is_err());
    // A Slice of an axis declared huge on an empty tensor is counted in closed form (it once listed 2^39 indices).
    let g = Graph::new(13, &[-1, 4])
        .init_i("s", &[1], &[0])
        .init_i("e", &[1], &[i64::MAX])
        .init_i("a", &[1], &[2])
        .init_i("st", &[1], &[2])
        .node(node("Slice", &["x", "s", "e", "a", "st"], &["y"], "slice", vec![]))
        .output("y", &[]);
    let p = with_inits(&g, vec![]);
    let m = load(&p).unwrap();
    assert!(forward(&m, &[2, 4]).is_err(), "axis 2 of a rank-2 input");
}

#[test]
fn onnx_axis_zero_of_a_scalar_is_an_error() {
    // A data-dependent scalar (ReduceSum over every axis, keepdims 0), then each op with axis 0.
    let scalar = |g: Graph| {
        g.node(node("ReduceSum", &["x"], &["s"], "sum", vec![attr_i("keepdims", 0)])).init_i("zero", &[1], &[0])
    };
    let cases = [
        ("Gather", node("Gather", &["s", "zero0"], &["y"], "gather", vec![])),
        ("Squeeze", node("Squeeze", &["s", "zero"], &["y"], "squeeze", vec![])),
        ("Slice", node("Slice", &["s", "zero", "zero", "zero"], &["y"], "slice", vec![])),
        ("Pad", node("Pad", &["s", "pads", "pv", "zero"], &["y"], "pad", vec![])),
    ];
    for (op, n) in cases {
        let g = scalar(Graph::new(18, &[-1, 4]))
            .init_i("zero0", &[], &[0])
            .init_i("pads", &[2], &[1, 1])
            .init("pv", &[], &[0.0])
            .node(n)
            .output("y", &[]);
        let r = OnnxModel::from_proto(&g.proto()).and_then(|m| forward(&m, &[2, 4]));
        assert!(r.is_err(), "{op} on a scalar: {r:?}");
    }
    // Integer Concat of two scalars (folded at load).
    let g = Graph::new(13, &[-1, 4])
        .init_i("a", &[], &[1])
        .init_i("b", &[], &[2])
        .node(node("Concat", &["a", "b"], &["c"], "cat", vec![attr_i("axis", 0)]))
        .node(node("Reshape", &["x", "c"], &["y"], "reshape", vec![]))
        .output("y", &[]);
    assert!(OnnxModel::from_proto(&g.proto()).is_err());
}

#[test]
fn onnx_duplicate_output_names_are_errors() {
    let r = OnnxModel::from_proto(&duplicate_output_graph().proto());
    assert!(matches!(&r, Err(Error::BadFile { msg, .. }) if msg.contains("already defined")), "{:?}", r.err());
    // A node output named like the graph input.
    let g = Graph::new(13, &[-1, 4]).node(node("Relu", &["x"], &["x"], "a", vec![])).output("x", &[]);
    assert!(OnnxModel::from_proto(&g.proto()).is_err());
}

/// Two nodes defining `h`.
fn duplicate_output_graph() -> Graph {
    Graph::new(13, &[-1, 4])
        .node(node("Relu", &["x"], &["h"], "a", vec![]))
        .node(node("Neg", &["x"], &["h"], "b", vec![]))
        .node(node("Add", &["h", "h"], &["y"], "c", vec![]))
        .output("y", &[])
}

/// Conv with pads of 2^16 on a 4×4 input: 2^17 squared activations (68 GB).
fn big_conv_graph() -> Graph {
    Graph::new(13, &[-1, 1, 4, 4])
        .init("w", &[1, 1, 3, 3], &[0.1; 9])
        .node(node("Conv", &["x", "w"], &["y"], "bigconv", vec![attr_ints("pads", &[1 << 16; 4])]))
        .output("y", &[])
}

/// A pooling kernel of 2^16 with SAME_UPPER: the padding comes from the kernel, not from `pads`.
fn big_pool_graph() -> Graph {
    let attrs = vec![attr_ints("kernel_shape", &[1 << 16, 1 << 16]), attr_s("auto_pad", "SAME_UPPER")];
    Graph::new(13, &[-1, 1, 4, 4]).node(node("MaxPool", &["x"], &["y"], "bigpool", attrs)).output("y", &[])
}

fn assert_names_node(r: armoury::Result<impl std::fmt::Debug>, node: &str) {
    match r {
        Err(e @ Error::ResourceLimit { .. }) => assert!(e.to_string().contains(node), "{e}"),
        other => panic!("expected a resource limit naming {node}: {other:?}"),
    }
}

#[test]
fn onnx_intermediate_sizes_are_checked_at_load() {
    assert_names_node(load(&big_conv_graph().proto()), "bigconv");
    // Pad with 2^16 on each side.
    let g = Graph::new(13, &[-1, 1, 4, 4])
        .init_i("pads", &[8], &[0, 0, 1 << 16, 1 << 16, 0, 0, 1 << 16, 1 << 16])
        .node(node("Pad", &["x", "pads"], &["y"], "bigpad", vec![]))
        .output("y", &[]);
    assert_names_node(load(&g.proto()), "bigpad");
    assert_names_node(load(&big_pool_graph().proto()), "bigpool");
    // Constant folding of [100000, 1]·[1, 100000] (40 GB) in a 0.8 MB file.
    let col = vec![1.0f32; 100_000];
    let g = Graph::new(13, &[-1, 4])
        .node(node("MatMul", &["a", "b"], &["c"], "fold", vec![]))
        .node(node("Add", &["x", "c"], &["y"], "add", vec![]))
        .output("y", &[]);
    let mut p = g.proto();
    let inits = &mut p.graph.as_mut().unwrap().initializer;
    inits.push(float_tensor("a", &[100_000, 1], &col));
    inits.push(float_tensor("b", &[1, 100_000], &col));
    // (a and b feed MatMul only: constants, folded at load.)
    assert_names_node(OnnxModel::from_proto_with(&p, SMALL), "fold");
    // Gather whose output is indices × the rest of the data: [100000] indices into a [1000, 1000] parameter.
    let data = vec![0.5f32; 1_000_000];
    let g = Graph::new(13, &[-1, 1000])
        .init("d", &[1000, 1000], &data)
        .node(node("Gather", &["d", "i"], &["g"], "biggather", vec![]))
        .node(node("MatMul", &["x", "g"], &["y"], "mm", vec![]))
        .output("y", &[]);
    let p = with_inits(&g, vec![int_tensor("i", &[100_000], &vec![0; 100_000])]);
    assert_names_node(OnnxModel::from_proto_with(&p, SMALL), "biggather");
}

#[test]
fn onnx_memory_is_estimated_and_checked_at_run_time() {
    let m = OnnxModel::load(fixture("cnn.onnx")).unwrap();
    let e = m.memory_estimate().expect("cnn.onnx has a fixed input shape");
    assert_eq!(e.batch_size, armoury::classifier::CHUNK);
    // By hand, in bytes at batch 32: the input 32·784·4 = 100352; conv1 → relu → pool fused, [32,16,12,12] =
    // 294912; conv2 fused, [32,32,4,4] = 65536; the flattened [32,512] = 65536; fc1 and its relu [32,128] = 16384
    // each; fc2 [32,10] = 1280.
    assert_eq!(e.graph_bytes, 100_352 + 294_912 + 65_536 + 65_536 + 16_384 + 16_384 + 1280, "{e:?}");
    // The peak is at conv1: the input, its output, the unpooled activations [32,16,24,24] and one sample's
    // unfolded columns (25 × 576) per thread.
    let columns = 25 * 576 * 4 * rayon::current_num_threads() as u128;
    assert_eq!(e.peak_bytes, 100_352 + 294_912 + 32 * 16 * 24 * 24 * 4 + columns, "{e:?}");
    assert_eq!(e.peak_node, "/conv1/Conv");
    // A budget below the estimate refuses the model at load, naming a node.
    let tight = LoadOptions { max_memory: (e.peak_bytes / 4) as u64, batch_size: 32 };
    assert!(is_resource_limit(&OnnxModel::load_with(fixture("cnn.onnx"), tight)));
    // Loaded for batch 1 within 4 MB, a batch of 512 is refused when it runs, before the node allocates.
    let small = LoadOptions { max_memory: 4 << 20, batch_size: 1 };
    let m = OnnxModel::load_with(fixture("cnn.onnx"), small).unwrap();
    assert!(forward(&m, &[1, 1, 28, 28]).is_ok());
    assert!(is_resource_limit(&forward(&m, &[512, 1, 28, 28])));
    // Every fixture model has an estimate and runs under the default budget.
    for f in ["mlp.onnx", "zoo.onnx", "zoo_opset13.onnx"] {
        let m = OnnxModel::load(fixture(f)).unwrap();
        assert!(m.memory_estimate().is_some(), "{f}");
    }
}

// ---------------------------------------------------------------------------------------------------- ops

#[test]
fn max_pool_backward_with_no_planes() {
    for shape in [[0, 1, 4, 4], [2, 0, 4, 4]] {
        for k in [2, 3] {
            let x = Tensor::zeros(&shape).variable();
            let y = x.max_pool2d(armoury::Pool2dParams::square(k)).unwrap();
            let g = y.sum_all().grad_wrt(&[&x]).unwrap();
            assert_eq!(g[0].shape(), &shape);
            let y = x.avg_pool2d(armoury::Pool2dParams::square(k)).unwrap();
            assert_eq!(y.sum_all().grad_wrt(&[&x]).unwrap()[0].shape(), &shape);
        }
    }
    assert!(Tensor::zeros(&[1, 1, 0, 4]).max_pool2d(armoury::Pool2dParams::square(1)).is_err());
}

#[test]
fn shapes_are_checked_over_every_dimension() {
    assert!(is_resource_limit(&Tensor::from_vec(vec![], &[0, 1 << 40, 1 << 40])));
    assert!(is_resource_limit(&Tensor::zeros(&[0, 4]).reshape(&[0, 1 << 40, 1 << 40])));
    assert!(Tensor::zeros(&[2, 3]).narrow(1, usize::MAX, 2).is_err());
}

// ---------------------------------------------------------------------------------------------------- files

#[test]
#[cfg(unix)]
fn write_atomic_keeps_permissions_and_leaves_no_temporary() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("armoury-atomic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.bin");
    std::fs::write(&path, b"old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    // A symlink planted where the old predictable temporary name was is neither followed nor touched.
    let target = dir.join("victim");
    std::fs::write(&target, b"keep").unwrap();
    let planted = dir.join(format!(".out.bin.{}.0.tmp", std::process::id()));
    let _ = std::os::unix::fs::symlink(&target, &planted);
    armoury::io::write_atomic(&path, b"new").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") && !n.contains(&format!("{}.0", std::process::id())))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn nan_weights_are_refused_on_load() {
    let dir = std::env::temp_dir().join(format!("armoury-nan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nan.safetensors");
    let model = armoury::nn::mlp(1);
    let mut tensors = armoury::io::load_tensors(fixture("mlp.safetensors")).unwrap();
    tensors[0].1.fill(f32::NAN);
    armoury::io::save_tensors(&path, &tensors).unwrap();
    let r = armoury::io::load_module(&model, &path);
    assert!(matches!(&r, Err(Error::BadFile { msg, .. }) if msg.contains("NaN")), "{r:?}");
    std::fs::remove_dir_all(&dir).unwrap();
    // An ONNX parameter holding NaN.
    let g = Graph::new(13, &[-1, 2])
        .init("w", &[2, 2], &[1.0, f32::NAN, 0.0, 1.0])
        .node(node("MatMul", &["x", "w"], &["y"], "mm", vec![]))
        .output("y", &[]);
    assert!(OnnxModel::from_proto(&g.proto()).is_err());
}

// ---------------------------------------------------------------------------------------------------- API misuse

/// A classifier whose bounds and class count are whatever the test says (a custom implementation's mistakes).
struct Custom {
    inner: ModuleClassifier,
    bounds: (f32, f32),
    classes: usize,
    nan: bool,
}

impl Custom {
    fn new(bounds: (f32, f32), classes: usize, nan: bool) -> Custom {
        let module = armoury::nn::Sequential::new().add("flatten", armoury::nn::Flatten);
        let inner = ModuleClassifier::new(module, &[1, 1, 2], 2, (0.0, 1.0)).unwrap();
        Custom { inner, bounds, classes, nan }
    }
}

impl Classifier for Custom {
    fn input_shape(&self) -> &[usize] {
        self.inner.input_shape()
    }
    fn num_classes(&self) -> usize {
        self.classes
    }
    fn bounds(&self) -> (f32, f32) {
        self.bounds
    }
    fn forward(&self, x: &Tensor) -> armoury::Result<Tensor> {
        let z = self.inner.forward(x)?;
        Ok(if self.nan { z.mul_scalar(f32::NAN) } else { z.narrow(1, 0, self.classes.min(2))? })
    }
    fn counters(&self) -> &Counters {
        self.inner.counters()
    }
}

#[test]
fn public_api_misuse_is_an_error() {
    let x = Tensor::full(&[2, 1, 1, 2], 0.5);
    // Dataset::image: an index whose byte offset overflows.
    let d = Dataset::new(Tensor::zeros(&[3, 1, 2, 2]), vec![0, 1, 0], 2).unwrap();
    assert!(d.image(usize::MAX / 2).is_none());
    assert!(d.image(3).is_none() && d.image(2).is_some());
    // sample, per_sample_norms.
    assert!(sample(&x, 2).is_err() && sample(&Tensor::scalar(1.0), 0).is_err());
    assert!(per_sample_norms(&x, &Tensor::zeros(&[3, 1, 1, 2])).is_err());
    // Resolved: a goal built for another batch.
    let goal = Resolved::Targeted(vec![1]);
    assert!(!goal.is_success(None, 5, 0, 1));
    assert!(goal.class(5, &[0, 0]).is_err() && Resolved::Untargeted.class(2, &[0, 0]).is_err());
    assert!(goal.check(2, 2).is_err() && Resolved::Targeted(vec![1, 7]).check(2, 2).is_err());
    // AttackResult::evaluate with too few labels, counts or targets.
    let clf = Custom::new((0.0, 1.0), 2, false);
    let ev = |labels: &[usize], goal: Resolved, counts: usize| {
        armoury::AttackResult::evaluate(&clf, &x, x.clone(), labels, goal, vec![0; counts], vec![0; counts])
    };
    assert!(ev(&[0, 1], Resolved::Untargeted, 2).is_ok());
    assert!(ev(&[0], Resolved::Untargeted, 2).is_err());
    assert!(ev(&[0, 1], Resolved::Untargeted, 1).is_err());
    assert!(ev(&[0, 1], Resolved::Targeted(vec![1]), 2).is_err());
    // best_other: one class, all-NaN rows, a class out of range.
    assert!(best_other(&Array2::zeros((2, 1)), &[0, 0]).is_err());
    assert!(best_other(&Array2::zeros((2, 3)), &[0, 3]).is_err());
    let nan = Array2::from_elem((1, 3), f32::NAN);
    assert_eq!(best_other(&nan, &[0]).unwrap()[0].0, 1);
    assert_eq!(best_other(&nan, &[1]).unwrap()[0].0, 0);
    // project_row / project_ball with a NaN or negative radius.
    for e in [f32::NAN, -0.1] {
        for norm in [Norm::Linf, Norm::L2, Norm::L1] {
            assert!(project_row(&mut [0.5, -0.5], norm, e).is_err(), "{norm:?} {e}");
        }
        assert!(project_ball(&mut Array2::zeros((1, 2)), Norm::Linf, &[e]).is_err());
    }
    let mut r = [0.5f32, -0.5];
    project_row(&mut r, Norm::Linf, 0.25).unwrap();
    assert_eq!(r, [0.25, -0.25]);
}

#[test]
fn classifier_contract_checks_bounds_classes_and_logits() {
    use armoury::Attack;
    use armoury_attacks::Pgd;
    let x = Tensor::full(&[2, 1, 1, 2], 0.5);
    let pgd = Pgd { steps: 2, ..Pgd::linf(0.1) };
    // Inverted or NaN bounds of a custom classifier: an error, not a panic in f32::clamp.
    for bounds in [(1.0, 0.0), (f32::NAN, 1.0), (0.0, f32::INFINITY)] {
        let clf = Custom::new(bounds, 2, false);
        assert!(clf.check_input(&x).is_err(), "{bounds:?}");
        assert!(pgd.run(&clf, &x, &[0, 1], &Goal::Untargeted, 0).is_err(), "{bounds:?}");
    }
    // RandomTarget with one class.
    let one = Custom::new((0.0, 1.0), 1, false);
    let r = armoury::attack::resolve_goal_for(
        &one,
        &x,
        &[0, 0],
        &Goal::RandomTarget { seed: 1 },
        armoury::attack::Access::Gradients,
    );
    assert!(r.is_err());
    // All-NaN logits have no prediction.
    let nan = Custom::new((0.0, 1.0), 2, true);
    assert!(matches!(nan.predict(&x), Err(Error::NonFinite { .. })));
    // ModuleClassifier refuses an absurd class count.
    let module = armoury::nn::Sequential::new().add("flatten", armoury::nn::Flatten);
    assert!(is_resource_limit(&ModuleClassifier::new(module, &[1, 2, 2], 1 << 40, (0.0, 1.0))));
}

// ---------------------------------------------------------------------------------------------------- replay

/// Every file under `tests/fixtures/crashers/<target>/` and `fuzz/corpus/<target>/` through the fuzz target's
/// harness: none may panic (each returns, whatever it decides about the input).
#[test]
fn crashers_and_corpora_replay_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut replayed = 0;
    for (target, run) in harness::TARGETS {
        for dir in [root.join("tests/fixtures/crashers").join(target), root.join("fuzz/corpus").join(target)] {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            let mut files: Vec<_> = entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
            files.sort();
            for f in files {
                // A running fuzzer replaces corpus files by smaller ones: one gone since the listing is skipped.
                let bytes = match std::fs::read(&f) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    r => r.unwrap(),
                };
                let r = std::panic::catch_unwind(|| run(&bytes));
                assert!(r.is_ok(), "{target}: {} panics", f.display());
                replayed += 1;
            }
        }
    }
    assert!(replayed > 0, "no crasher or corpus file found");
}

// ---------------------------------------------------------------------------------------------------- seeds

/// The fuzz seed corpora (`fuzz/corpus/<target>/seed-*`) and the minimal crashers of the regression tests above
/// (`tests/fixtures/crashers/<target>/`), built here so that they can be regenerated:
/// `ARMOURY_WRITE_FUZZ_SEEDS=1 cargo test --release --test tests -- reliability::fuzz_seeds`. Without the
/// variable the test checks that every file it would write is in the repository, unchanged.
#[test]
fn fuzz_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let write = std::env::var_os("ARMOURY_WRITE_FUZZ_SEEDS").is_some();
    let mut missing = Vec::new();
    for (dir, target, name, bytes) in seed_files() {
        let path = root.join(dir).join(target).join(name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
            missing.push(path.display().to_string());
        }
    }
    assert!(missing.is_empty(), "regenerate with ARMOURY_WRITE_FUZZ_SEEDS=1: {missing:?}");
}

type SeedFile = (&'static str, &'static str, String, Vec<u8>);

fn seed_files() -> Vec<SeedFile> {
    use prost::Message;
    const CORPUS: &str = "fuzz/corpus";
    const CRASHERS: &str = "tests/fixtures/crashers";
    let mut out: Vec<SeedFile> = Vec::new();
    let mut add = |dir, target, name: &str, bytes: Vec<u8>| out.push((dir, target, name.to_string(), bytes));
    // IDX: every element type, plain and gzip; the idx_gzip target compresses its input itself.
    let images = Idx::new(vec![2, 3, 3], IdxData::U8((0..18).map(|v| v * 14).collect())).unwrap();
    let labels = Idx::from_labels(&[3, 1, 4]).unwrap();
    let wide = Idx::from_labels(&[300, 2]).unwrap();
    let floats = Idx::new(vec![1, 2, 2], IdxData::F32(vec![0.0, 0.25, 0.5, 1.0])).unwrap();
    let doubles = Idx::new(vec![1, 2, 2, 1], IdxData::F64(vec![0.0, 0.5, 0.75, 1.0])).unwrap();
    let shorts = Idx::new(vec![3], IdxData::I16(vec![-1, 0, 7])).unwrap();
    let bytes = Idx::new(vec![2], IdxData::I8(vec![-3, 3])).unwrap();
    for (name, idx) in [
        ("images", &images),
        ("labels", &labels),
        ("labels-i32", &wide),
        ("f32", &floats),
        ("f64", &doubles),
        ("i16", &shorts),
        ("i8", &bytes),
    ] {
        add(CORPUS, "idx", &format!("seed-{name}.idx"), idx.encode());
        add(CORPUS, "idx", &format!("seed-{name}.idx.gz"), gzip(&[&idx.encode()]));
        add(CORPUS, "idx_gzip", &format!("seed-{name}.idx"), idx.encode());
    }
    add(CRASHERS, "idx", "empty-huge-dims.idx", idx_header(0x08, &[u32::MAX, u32::MAX, 0]));
    add(CRASHERS, "idx", "declares-8-exabytes.idx.gz", gzip(&[&idx_header(0x08, &[1 << 31, 1 << 31])]));
    let mut one = idx_header(0x08, &[1, 2, 2]);
    one.extend([0; 4]);
    add(CRASHERS, "idx", "multi-member-extra.idx.gz", gzip(&[&one, &[0; 4096], &[0; 4096]]));
    // safetensors: a Linear(4, 3) as the harness loads it, mixed dtypes with metadata, and the zoo weights.
    let dir = std::env::temp_dir().join(format!("armoury-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lin = armoury::nn::Sequential::new().add("fc", armoury::nn::Linear::new(4, 3, true, 7));
    armoury::io::save_module(&lin, dir.join("fc.safetensors")).unwrap();
    add(CORPUS, "safetensors", "seed-linear.safetensors", std::fs::read(dir.join("fc.safetensors")).unwrap());
    let any = vec![
        ("w".to_string(), armoury::io::AnyTensor::F32(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[2, 2]), 0.5))),
        ("y".to_string(), armoury::io::AnyTensor::I64(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[3]), 2))),
    ];
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    armoury::io::save_tensors_any(dir.join("any.safetensors"), &any, Some(&meta)).unwrap();
    add(CORPUS, "safetensors", "seed-mixed.safetensors", std::fs::read(dir.join("any.safetensors")).unwrap());
    add(CORPUS, "safetensors", "seed-zoo.safetensors", std::fs::read(fixture("zoo.safetensors")).unwrap());
    // ONNX: the two zoo exports and small graphs covering the other operators.
    for f in ["zoo.onnx", "zoo_opset13.onnx"] {
        add(CORPUS, "onnx", &format!("seed-{f}"), std::fs::read(fixture(f)).unwrap());
    }
    for (name, g) in onnx_seed_graphs() {
        add(CORPUS, "onnx", &format!("seed-{name}.onnx"), g.encode_to_vec());
    }
    for (name, p) in onnx_crashers() {
        add(CRASHERS, "onnx", &format!("{name}.onnx"), p.encode_to_vec());
    }
    // Threat models (the two built-in cascades and a small custom one) and fuzzer mutation configurations.
    use armoury::eval::ThreatModel;
    for (name, tm) in
        [("autoattack-linf", ThreatModel::autoattack_linf(0.1)), ("autoattack-l2", ThreatModel::autoattack_l2(0.5))]
    {
        add(CORPUS, "threat_model", &format!("seed-{name}.json"), serde_json::to_vec_pretty(&tm).unwrap());
    }
    let custom = r#"{"name": "sweep", "norm": "l2", "eps": [0.25, 0.5, 1.0], "bounds": [0, 1],
 "attacks": [{"name": "apgd-ce", "steps": 20, "restarts": 2, "step_size": 0.1}, {"name": "square", "queries": 100}],
 "minimal": [{"name": "fab", "targets": 3}], "seed": 7, "batch_size": 64}"#;
    add(CORPUS, "threat_model", "seed-custom.json", custom.as_bytes().to_vec());
    let config = r#"{"methods": [
  {"method": "brightness", "params": {"beta": [-0.2, -0.1, 0.1, 0.2]}},
  {"method": "contrast"}, {"method": "rotate"}, {"method": "translate"},
  {"method": "gaussian_noise"}, {"method": "adversarial", "attack": "fgsm"}
]}"#;
    add(CORPUS, "fuzz_config", "seed-config.json", config.as_bytes().to_vec());
    // Image folders: an option byte, then two images of the same size (PNG, JPEG).
    let img = image::RgbImage::from_fn(4, 3, |x, y| image::Rgb([(x * 60) as u8, (y * 80) as u8, 128]));
    for (opt, fmt, ext) in [(0u8, image::ImageFormat::Png, "png"), (7, image::ImageFormat::Jpeg, "jpg")] {
        let mut enc = std::io::Cursor::new(Vec::new());
        img.write_to(&mut enc, fmt).unwrap();
        let mut b = vec![opt];
        b.extend(enc.get_ref());
        b.extend(enc.get_ref());
        add(CORPUS, "image_folder", &format!("seed-{ext}"), b);
    }
    std::fs::remove_dir_all(&dir).unwrap();
    out
}

fn onnx_seed_graphs() -> Vec<(&'static str, armoury::onnx::proto::ModelProto)> {
    use crate::onnx::build::attr_f;
    let w: Vec<f32> = (0..18).map(|i| (i as f32 - 9.0) / 10.0).collect();
    let fc: Vec<f32> = (0..24).map(|i| (i as f32 - 12.0) / 20.0).collect();
    let cnn = Graph::new(13, &[-1, 1, 4, 4])
        .init("w", &[2, 1, 3, 3], &w)
        .init("b", &[2], &[0.1, -0.1])
        .init("fw", &[3, 8], &fc)
        .init("fb", &[3], &[0.0, 0.1, 0.2])
        .node(node("Conv", &["x", "w", "b"], &["c"], "conv", vec![attr_ints("pads", &[1, 1, 1, 1])]))
        .node(node("Relu", &["c"], &["r"], "relu", vec![]))
        .node(node(
            "MaxPool",
            &["r"],
            &["p"],
            "pool",
            vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[2, 2])],
        ))
        .node(node("Flatten", &["p"], &["f"], "flatten", vec![]))
        .node(node("Gemm", &["f", "fw", "fb"], &["y"], "fc", vec![attr_i("transB", 1)]))
        .output("y", &[-1, 3]);
    let shapes = Graph::new(13, &[-1, 1, 2, 2])
        .init_i("i0", &[], &[0])
        .init_i("ax", &[1], &[0])
        .init_i("m1", &[1], &[-1])
        .node(node("Shape", &["x"], &["s"], "shape", vec![]))
        .node(node("Gather", &["s", "i0"], &["n"], "gather", vec![]))
        .node(node("Unsqueeze", &["n", "ax"], &["n1"], "unsq", vec![]))
        .node(node("Concat", &["n1", "m1"], &["t"], "cat", vec![attr_i("axis", 0)]))
        .node(node("Reshape", &["x", "t"], &["r"], "reshape", vec![]))
        .node(node("Softmax", &["r"], &["y"], "softmax", vec![]))
        .output("y", &[-1, 4]);
    let layout = Graph::new(13, &[-1, 1, 4, 4])
        .init_i("pads", &[8], &[0, 0, 1, 0, 0, 0, 0, 1])
        .init_i("st", &[2], &[0, 1])
        .init_i("en", &[2], &[4, 5])
        .init_i("axs", &[2], &[2, 3])
        .init_i("steps", &[2], &[2, 1])
        .init_i("sq", &[1], &[1])
        .node(node("Pad", &["x", "pads"], &["p"], "pad", vec![attr_s("mode", "reflect")]))
        .node(node("Slice", &["p", "st", "en", "axs", "steps"], &["s"], "slice", vec![]))
        .node(node("Transpose", &["s"], &["t"], "transpose", vec![attr_ints("perm", &[0, 1, 3, 2])]))
        .node(node(
            "AveragePool",
            &["t"],
            &["a"],
            "avg",
            vec![attr_ints("kernel_shape", &[2, 2]), attr_s("auto_pad", "SAME_UPPER")],
        ))
        .node(node("GlobalMaxPool", &["a"], &["g"], "gmax", vec![]))
        .node(node("Squeeze", &["g"], &["y"], "squeeze", vec![]))
        .output("y", &[]);
    let elementwise = Graph::new(13, &[-1, 4])
        .init("k", &[4], &[0.5, 1.0, 2.0, 4.0])
        .init("slope", &[4], &[0.1, 0.2, 0.3, 0.4])
        .init("lo", &[], &[0.1])
        .init("e", &[], &[2.0])
        .node(node("Mul", &["x", "k"], &["a"], "mul", vec![]))
        .node(node("Sub", &["a", "k"], &["b"], "sub", vec![]))
        .node(node("PRelu", &["b", "slope"], &["c"], "prelu", vec![]))
        .node(node("Clip", &["c", "lo"], &["d"], "clip", vec![]))
        .node(node("Pow", &["d", "e"], &["f"], "pow", vec![]))
        .node(node("Sqrt", &["f"], &["g"], "sqrt", vec![]))
        .node(node("Div", &["g", "k"], &["h"], "div", vec![]))
        .node(node("LeakyRelu", &["h"], &["i"], "leaky", vec![attr_f("alpha", 0.2)]))
        .node(node("Tanh", &["i"], &["j"], "tanh", vec![]))
        .node(node("Sigmoid", &["j"], &["l"], "sigmoid", vec![]))
        .node(node("Exp", &["l"], &["m"], "exp", vec![]))
        .node(node("Log", &["m"], &["n"], "log", vec![]))
        .node(node("Neg", &["n"], &["o"], "neg", vec![]))
        .node(node("ReduceMean", &["o"], &["r"], "mean", vec![attr_ints("axes", &[1]), attr_i("keepdims", 1)]))
        .node(node("Add", &["o", "r"], &["s"], "add", vec![]))
        .node(node("Dropout", &["s"], &["t"], "dropout", vec![]))
        .node(node("Identity", &["t"], &["u"], "identity", vec![]))
        .node(node("LogSoftmax", &["u"], &["y"], "logsoftmax", vec![]))
        .output("y", &[-1, 4]);
    let norm = Graph::new(13, &[-1, 2, 2, 2])
        .init("sc", &[2], &[1.0, 0.5])
        .init("bi", &[2], &[0.0, 0.1])
        .init("mu", &[2], &[0.2, -0.2])
        .init("var", &[2], &[1.0, 2.0])
        .init("mw", &[2, 3], &[0.1, 0.2, 0.3, -0.1, -0.2, -0.3])
        .node(node("BatchNormalization", &["x", "sc", "bi", "mu", "var"], &["b"], "bn", vec![]))
        .node(node("GlobalAveragePool", &["b"], &["g"], "gap", vec![]))
        .node(node("Flatten", &["g"], &["f"], "flatten", vec![]))
        .node(node("MatMul", &["f", "mw"], &["m"], "matmul", vec![]))
        .node(node("Cast", &["m"], &["c"], "cast", vec![attr_i("to", 1)]))
        .node(node("ReduceSum", &["c"], &["y"], "sum", vec![attr_ints("axes", &[1]), attr_i("keepdims", 1)]))
        .output("y", &[]);
    vec![
        ("cnn", cnn.proto()),
        ("shape-arithmetic", shapes.proto()),
        ("layout", layout.proto()),
        ("elementwise", elementwise.proto()),
        ("normalisation", norm.proto()),
    ]
}

/// The hostile graphs of the regression tests above, as files.
fn onnx_crashers() -> Vec<(&'static str, armoury::onnx::proto::ModelProto)> {
    const FLOAT: i32 = 1;
    const INT64: i32 = 7;
    let add = Graph::new(13, &[-1, 4]).node(node("Add", &["x", "e"], &["y"], "add", vec![])).output("y", &[]);
    let gathers = Graph::new(13, &[-1, 4])
        .node(node("Gather", &["x", "i"], &["g1"], "g1", vec![attr_i("axis", 1)]))
        .node(node("Gather", &["g1", "i"], &["y"], "g2", vec![attr_i("axis", 2)]))
        .output("y", &[]);
    let scalar = Graph::new(13, &[-1, 4])
        .init_i("zero0", &[], &[0])
        .node(node("ReduceSum", &["x"], &["s"], "sum", vec![attr_i("keepdims", 0)]))
        .node(node("Gather", &["s", "zero0"], &["y"], "gather", vec![]))
        .output("y", &[]);
    let classes =
        Graph::new(13, &[-1, 4]).node(node("Identity", &["x"], &["y"], "id", vec![])).output("y", &[-1, 1 << 40]);
    vec![
        ("empty-huge-initialiser", with_inits(&add, vec![empty_tensor("e", &[0, 1 << 40, 1 << 40], FLOAT)])),
        ("gather-empty-huge", with_inits(&gathers, vec![empty_tensor("i", &[0, 1 << 31, 1 << 31], INT64)])),
        ("duplicate-output", duplicate_output_graph().proto()),
        ("conv-pads-2e16", big_conv_graph().proto()),
        ("pool-kernel-2e16-same-upper", big_pool_graph().proto()),
        ("gather-axis-0-of-scalar", scalar.proto()),
        ("declared-2e40-classes", classes.proto()),
    ]
}
