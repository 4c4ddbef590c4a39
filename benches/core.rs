//! `cargo bench --bench core [-- [MODEL…] [--batches 1,128,1000] [--budget-ms N] [--export DIR]]`: the benchmark
//! zoo (`benches/support/bench.rs`) — the reference `cnn` and `mlp`, a VGG-style 3×3 net and a small ResNet on
//! 32×32 RGB, and a wide MLP — forward, forward + input gradient and an Adam training step at batch 1, 128 and
//! 1000, as time, images/s, GFLOP/s and the share of the machine's f32 peak measured first (a tight loop of
//! fused multiply-adds on every thread).
//!
//! `--gemm` compares the products `Linear` layers run on (Armoury's packed kernel through `Tensor::matmul`, the
//! `gemm` crate, and `matrixmultiply` through ndarray, its two halves on the two threads) on large shapes.
//!
//! `--conv [FILTER]` times the convolutions of the full-size ResNets (batch 4 at 224², the CIFAR ones at batch 32)
//! one by one — forward, and the input gradient alone (the weight not tracked, as in an attack; the backward op's
//! time as `armoury::profile` records it) — as GFLOP/s and
//! the share of the measured peak; FILTER keeps the shapes whose label contains it. With `--cold`, every
//! timed call (and every timed backward) follows a pass of all threads writing 512 MB, so the operands, the output's
//! memory and the weights come from memory as they do inside a model, where each layer's data was last touched
//! many megabytes ago — a kernel's speed alone on warm data misled two earlier tuning rounds.
//!
//! `--silu` times a SiLU and a squeeze-and-excitation gate's product (`σ(gate)·x`, the gate `[4, C, 1, 1]`) on
//! EfficientNet-B0's shapes at batch 4, warm, as ms per call and elements per ns.
//!
//! `--export DIR` writes every model's weights and a check batch for `benches/reference/zoo.py` (PyTorch and
//! onnxruntime on the same models and weights) and exits.

#[path = "support/bench.rs"]
mod bench;

use bench::Zoo;

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// What the run times, chosen after every flag is read (so `--cold` may come before or after `--conv FILTER`).
enum Mode {
    /// The models of the zoo.
    Zoo,
    /// `--gemm`.
    Gemm,
    /// `--conv [FILTER]`.
    Conv(Option<String>),
    /// `--silu`.
    Silu,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    armoury::limits::reuse_freed_memory();
    let mut models = Vec::new();
    let mut batches = vec![1, 128, 1000];
    let mut budget_ms = 1500.0;
    let mut cold = false;
    let mut mode = Mode::Zoo;
    let mut args = std::env::args().skip(1).peekable();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--gemm" => mode = Mode::Gemm,
            "--silu" => mode = Mode::Silu,
            "--cold" => cold = true,
            "--conv" => mode = Mode::Conv(args.next_if(|f| !f.starts_with("--"))),
            "--export" => {
                let dir = args.next().ok_or("--export needs a directory")?;
                let all = if models.is_empty() { Zoo::ALL.to_vec() } else { models };
                bench::export(&all, std::path::Path::new(&dir))?;
                println!("exported {} models to {dir}", all.len());
                return Ok(());
            }
            "--batches" => {
                let list = args.next().ok_or("--batches needs a list")?;
                batches = list.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            "--budget-ms" => budget_ms = args.next().ok_or("--budget-ms needs a number")?.parse()?,
            name => models.push(Zoo::parse(name).ok_or_else(|| format!("unknown model or flag '{name}'"))?),
        }
    }
    match mode {
        Mode::Conv(filter) => return conv_shapes(budget_ms, filter.as_deref(), cold.then(Thrash::new)),
        _ if cold => return Err("--cold applies to --conv only".into()),
        Mode::Gemm => return gemm_compare(budget_ms),
        Mode::Silu => return silu_shapes(budget_ms),
        Mode::Zoo => {}
    }
    if models.is_empty() {
        models = Zoo::ALL.to_vec();
    }
    let peak = armoury::ops::measured_peak_gflops(1.0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{} threads, measured f32 peak {}, load average {}",
        rayon::current_num_threads(),
        peak.map_or("n/a (portable kernels)".to_string(), |p| format!("{p:.1} GFLOP/s")),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut rows = Vec::new();
    for zoo in models {
        rows.extend(bench::zoo_rows(zoo, &batches, budget_ms)?);
    }
    bench::print_zoo(&rows, peak);
    Ok(())
}

/// SiLU and a squeeze-and-excitation gate's product on EfficientNet-B0's shapes at batch 4, warm: ms per call and
/// elements per ns, against onnxruntime's `QuickGelu` and `Mul` in that model (`ort_profile.py`).
fn silu_shapes(budget_ms: f64) -> Result<(), Box<dyn std::error::Error>> {
    use armoury::Tensor;
    println!("{:>16} {:>10} {:>8} {:>10} {:>8}", "shape", "silu ms", "el/ns", "gate ms", "el/ns");
    for (c, hw) in [(96, 112), (144, 56), (32, 112), (672, 14), (240, 28), (480, 14), (1152, 7)] {
        let x = Tensor::uniform(&[4, c, hw, hw], -4.0, 4.0, 1);
        let gate = Tensor::uniform(&[4, c, 1, 1], -4.0, 4.0, 2);
        let silu = bench::median_ms_within(budget_ms, 2000, || {
            std::hint::black_box(x.silu());
            Ok(())
        })?;
        let gated = bench::median_ms_within(budget_ms, 2000, || {
            std::hint::black_box(gate.sigmoid().mul(&x)?);
            Ok(())
        })?;
        let n = x.numel() as f64;
        let label = format!("{c}@{hw}");
        println!("{label:>16} {silu:>10.3} {:>8.2} {gated:>10.3} {:>8.2}", n / silu / 1e6, n / gated / 1e6);
    }
    Ok(())
}

/// Forward and forward + input-gradient time of single convolutions of the shapes real ResNets, WideResNets,
/// MobileNets and EfficientNets spend their time in.
fn conv_shapes(
    budget_ms: f64,
    filter: Option<&str>,
    mut cold: Option<Thrash>,
) -> Result<(), Box<dyn std::error::Error>> {
    use armoury::ops::Conv2dParams;
    use armoury::Tensor;
    let peak = armoury::ops::measured_peak_gflops(1.0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "measured f32 peak {peak:?} GFLOP/s, {} threads, load {load}{}",
        rayon::current_num_threads(),
        if cold.is_some() { "cold: every timed call after all threads wrote 512 MB\n" } else { "" }
    );
    /// `(label, [n, c, h, w], out channels, kernel, stride, padding)`.
    type Shape = (&'static str, [usize; 4], usize, usize, usize, usize);
    let shapes: &[Shape] = &[
        ("stem 7x7/2", [4, 3, 224, 224], 64, 7, 2, 3),
        ("stem 3x3/2 3>32", [4, 3, 224, 224], 32, 3, 2, 1),
        ("vgg 3x3 3>64@224", [4, 3, 224, 224], 64, 3, 1, 1),
        ("3x3 64@56", [4, 64, 56, 56], 64, 3, 1, 1),
        ("3x3 128@28", [4, 128, 28, 28], 128, 3, 1, 1),
        ("3x3 256@14", [4, 256, 14, 14], 256, 3, 1, 1),
        ("3x3 512@7", [4, 512, 7, 7], 512, 3, 1, 1),
        ("3x3/2 128@56", [4, 128, 56, 56], 128, 3, 2, 1),
        ("3x3/2 256@28", [4, 256, 28, 28], 256, 3, 2, 1),
        ("3x3/2 512@14", [4, 512, 14, 14], 512, 3, 2, 1),
        ("wrn 3x3/2 320>640@16", [32, 320, 16, 16], 640, 3, 2, 1),
        ("1x1 64>256@56", [4, 64, 56, 56], 256, 1, 1, 0),
        ("1x1 256>64@56", [4, 256, 56, 56], 64, 1, 1, 0),
        ("1x1 128>512@28", [4, 128, 28, 28], 512, 1, 1, 0),
        ("1x1 256>1024@14", [4, 256, 14, 14], 1024, 1, 1, 0),
        ("1x1 1024>256@14", [4, 1024, 14, 14], 256, 1, 1, 0),
        ("1x1 512>2048@7", [4, 512, 7, 7], 2048, 1, 1, 0),
        ("1x1 2048>512@7", [4, 2048, 7, 7], 512, 1, 1, 0),
        ("1x1 16>96@112", [4, 16, 112, 112], 96, 1, 1, 0),
        ("1x1 24>144@56", [4, 24, 56, 56], 144, 1, 1, 0),
        ("1x1 32>192@28", [4, 32, 28, 28], 192, 1, 1, 0),
        ("1x1 40>240@28", [4, 40, 28, 28], 240, 1, 1, 0),
        ("1x1 80>480@14", [4, 80, 14, 14], 480, 1, 1, 0),
        ("1x1 480>80@14", [4, 480, 14, 14], 80, 1, 1, 0),
        // MobileNetV2's expansions onto 14² and 7² (onnxruntime runs the first 2.8× faster).
        ("mbv2 1x1 64>384@14", [4, 64, 14, 14], 384, 1, 1, 0),
        ("mbv2 1x1 96>576@14", [4, 96, 14, 14], 576, 1, 1, 0),
        ("mbv2 1x1 160>960@7", [4, 160, 7, 7], 960, 1, 1, 0),
        ("mbv2 1x1 384>64@14", [4, 384, 14, 14], 64, 1, 1, 0),
        ("mbv2 1x1 32>16@112", [4, 32, 112, 112], 16, 1, 1, 0),
        ("mbv2 1x1 384>96@14", [4, 384, 14, 14], 96, 1, 1, 0),
        ("mbv2 1x1 320>1280@7", [4, 320, 7, 7], 1280, 1, 1, 0),
        ("cifar 3x3 16@32", [32, 16, 32, 32], 16, 3, 1, 1),
        ("cifar 3x3 32@16", [32, 32, 16, 16], 32, 3, 1, 1),
        ("cnn 5x5 16>32@12", [128, 16, 12, 12], 32, 5, 1, 0),
        ("cifar 3x3 64@32", [32, 64, 32, 32], 64, 3, 1, 1),
        ("cifar 3x3 256@8", [32, 256, 8, 8], 256, 3, 1, 1),
        ("cifar 3x3 512@4", [32, 512, 4, 4], 512, 3, 1, 1),
        ("cifar 3x3 128@16", [32, 128, 16, 16], 128, 3, 1, 1),
        ("cifar 3x3/2 256>512", [32, 256, 8, 8], 512, 3, 2, 1),
        ("cifar 1x1/2 256>512", [32, 256, 8, 8], 512, 1, 2, 0),
        ("1x1/2 256>512@56", [4, 256, 56, 56], 512, 1, 2, 0),
        ("1x1/2 512>1024@28", [4, 512, 28, 28], 1024, 1, 2, 0),
        ("1x1/2 1024>2048@14", [4, 1024, 14, 14], 2048, 1, 2, 0),
        // DenseNet-121's growth convolutions: 32 outputs from the bottleneck's 128 channels.
        ("densenet 3x3 128>32@56", [4, 128, 56, 56], 32, 3, 1, 1),
        ("densenet 3x3 128>32@28", [4, 128, 28, 28], 32, 3, 1, 1),
        ("densenet 3x3 128>32@14", [4, 128, 14, 14], 32, 3, 1, 1),
        ("densenet 3x3 128>32@7", [4, 128, 7, 7], 32, 3, 1, 1),
        // Depthwise (groups = channels): EfficientNet-B0's and MobileNetV2's, ConvNeXt-T's 7×7.
        ("dw 3x3 32@112", [4, 32, 112, 112], 32, 3, 1, 1),
        ("dw 3x3/2 96@112", [4, 96, 112, 112], 96, 3, 2, 1),
        ("dw 3x3 144@56", [4, 144, 56, 56], 144, 3, 1, 1),
        ("dw 5x5/2 144@56", [4, 144, 56, 56], 144, 5, 2, 2),
        ("dw 5x5 240@28", [4, 240, 28, 28], 240, 5, 1, 2),
        ("dw 3x3 480@14", [4, 480, 14, 14], 480, 3, 1, 1),
        ("dw 5x5 672@14", [4, 672, 14, 14], 672, 5, 1, 2),
        ("dw 5x5 1152@7", [4, 1152, 7, 7], 1152, 5, 1, 2),
        // MobileNetV2's where onnxruntime's run in half the time: on 7² and of stride 2.
        ("dw 3x3 960@7", [4, 960, 7, 7], 960, 3, 1, 1),
        ("dw 3x3/2 144@56", [4, 144, 56, 56], 144, 3, 2, 1),
        ("dw 3x3/2 576@14", [4, 576, 14, 14], 576, 3, 2, 1),
        ("dw 7x7 96@56", [4, 96, 56, 56], 96, 7, 1, 3),
        ("dw 7x7 192@28", [4, 192, 28, 28], 192, 7, 1, 3),
        ("dw 7x7 384@14", [4, 384, 14, 14], 384, 7, 1, 3),
        ("dw 7x7 768@7", [4, 768, 7, 7], 768, 7, 1, 3),
        // ConvNeXt-T's downsampling: 2×2 of stride 2 (and its 4×4/4 stem).
        ("convnext 2x2/2 96>192", [4, 96, 56, 56], 192, 2, 2, 0),
        ("convnext 2x2/2 384>768", [4, 384, 14, 14], 768, 2, 2, 0),
        ("convnext 4x4/4 3>96", [4, 3, 224, 224], 96, 4, 4, 0),
    ];
    println!(
        "{:<18} {:>9} {:>8} {:>7} {:>10} {:>8} {:>7} {:>10} {:>8} {:>7}",
        "conv", "fwd ms", "GFLOP/s", "peak", "dx ms", "GFLOP/s", "peak", "dW ms", "GFLOP/s", "peak"
    );
    for &(label, [n, c, h, w], o, k, s, pad) in shapes {
        if filter.is_some_and(|f| !label.contains(f)) {
            continue;
        }
        let groups = if label.starts_with("dw") { c } else { 1 };
        let p = Conv2dParams { stride: (s, s), padding: (pad, pad), groups, ..Conv2dParams::default() };
        let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, 1);
        let wt = Tensor::uniform(&[o, c / groups, k, k], -0.1, 0.1, 2);
        let (ho, wo) = ((h + 2 * pad - k) / s + 1, (w + 2 * pad - k) / s + 1);
        let flops = 2.0 * (n * o * ho * wo * (c / groups) * k * k) as f64;
        let fwd = match &mut cold {
            None => bench::median_ms_within(budget_ms, 200, || {
                std::hint::black_box(x.conv2d(&wt, None, p)?);
                Ok(())
            })?,
            Some(thrash) => thrash.median_ms(|| {
                std::hint::black_box(x.conv2d(&wt, None, p)?);
                Ok(())
            })?,
        };
        // The input gradient alone, then the weight gradient alone (what a training step adds): the conv's
        // backward op as the profile times it, the median over the runs.
        let mut backward_ms = |x: &Tensor, wt: &Tensor, wrt: &Tensor| -> Result<f64, Box<dyn std::error::Error>> {
            let op_ms = |y: &Tensor| -> armoury::Result<f64> {
                let (g, prof) = armoury::profile::record(|| y.grad_wrt(&[wrt]));
                std::hint::black_box(g?);
                Ok(prof
                    .entries
                    .iter()
                    .filter(|e| e.phase == armoury::profile::Phase::Backward && e.op.starts_with("conv2d"))
                    .map(|e| e.ms)
                    .sum::<f64>())
            };
            if let Some(thrash) = &mut cold {
                // The forward before the caches are emptied: in a model the backward comes long after it.
                return thrash.median_ms_with(|| Ok(x.conv2d(wt, None, p)?), |y| Ok(op_ms(y)?));
            }
            let mut ms = Vec::new();
            bench::median_ms_within(budget_ms, 200, || {
                ms.push(op_ms(&x.conv2d(wt, None, p)?)?);
                Ok(())
            })?;
            Ok(bench::median(ms))
        };
        let (xv, wv) = (x.variable(), wt.variable());
        let dx = backward_ms(&xv, &wt, &xv)?;
        let dw = backward_ms(&x, &wv, &wv)?;
        let rate = |ms: f64| flops / ms / 1e6;
        let share = |ms: f64| peak.map_or("n/a".to_string(), |pk| format!("{:.0}%", 100.0 * rate(ms) / pk));
        println!(
            "{label:<18} {fwd:>9.2} {:>8.1} {:>7} {dx:>10.2} {:>8.1} {:>7} {dw:>10.2} {:>8.1} {:>7}",
            rate(fwd),
            share(fwd),
            rate(dx),
            share(dx),
            rate(dw),
            share(dw)
        );
    }
    Ok(())
}

/// Empties the caches before each timed call: every pool thread writes its share of a buffer far larger than the
/// caches (so also the other core's), as the layers before a model's convolution do.
struct Thrash {
    buffer: Vec<u8>,
    round: u8,
}

impl Thrash {
    /// Timed calls per figure.
    const REPS: usize = 15;

    fn new() -> Thrash {
        Thrash { buffer: vec![0; 512 << 20], round: 0 }
    }

    fn run(&mut self) {
        use rayon::prelude::*;
        self.round = self.round.wrapping_add(1);
        let v = self.round;
        // Read and written, not filled: `memset` streams large fills past the caches without evicting anything.
        self.buffer.par_chunks_mut(1 << 20).for_each(|c| c.iter_mut().for_each(|b| *b = b.wrapping_add(v)));
        std::hint::black_box(&self.buffer);
    }

    /// The median milliseconds of `f` over [`Thrash::REPS`] calls, each after the caches were emptied.
    fn median_ms(
        &mut self,
        mut f: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
    ) -> Result<f64, Box<dyn std::error::Error>> {
        self.median_ms_with(
            || Ok(()),
            |_| {
                let t = std::time::Instant::now();
                f()?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            },
        )
    }

    /// As [`Thrash::median_ms`] with `setup` run before the caches are emptied and its result handed to `timed`,
    /// which returns the time (as the backward's op time the profile records).
    fn median_ms_with<T>(
        &mut self,
        mut setup: impl FnMut() -> Result<T, Box<dyn std::error::Error>>,
        mut timed: impl FnMut(&T) -> Result<f64, Box<dyn std::error::Error>>,
    ) -> Result<f64, Box<dyn std::error::Error>> {
        timed(&setup()?)?;
        let mut ms = Vec::with_capacity(Self::REPS);
        for _ in 0..Self::REPS {
            let t = setup()?;
            self.run();
            ms.push(timed(&t)?);
        }
        Ok(bench::median(ms))
    }
}

/// GFLOP/s of `x·Wᵀ` (`x` `[m, k]`, `W` `[n, k]`, as a `Linear` layer computes it) on Armoury's kernel, the `gemm`
/// crate and `matrixmultiply`, each the median of the runs that fit in `budget_ms`.
fn gemm_compare(budget_ms: f64) -> Result<(), Box<dyn std::error::Error>> {
    use armoury::Tensor;
    use ndarray::{s, Array2, Ix2};
    let peak = armoury::ops::measured_peak_gflops(1.0);
    println!("measured f32 peak {peak:?} GFLOP/s, {} threads", rayon::current_num_threads());
    println!("{:>5} {:>5} {:>5} {:>10} {:>10} {:>15}", "m", "k", "n", "armoury", "gemm", "matrixmultiply");
    for (m, k, n) in [(1000, 784, 256), (1000, 256, 256), (1000, 3072, 1024), (1000, 1024, 1024), (1024, 1024, 1024)] {
        let x = Tensor::uniform(&[m, k], -1.0, 1.0, 1);
        let w = Tensor::uniform(&[n, k], -1.0, 1.0, 2);
        let wt = w.t()?;
        let xa = x.to_array().into_dimensionality::<Ix2>()?;
        let wa = w.to_array().into_dimensionality::<Ix2>()?;
        let mut c = Array2::<f32>::zeros((m, n));
        let flops = 2.0 * (m * k * n) as f64;
        let ours = bench::median_ms_within(budget_ms, 1000, || {
            std::hint::black_box(x.matmul(&wt)?);
            Ok(())
        })?;
        let crate_gemm = bench::median_ms_within(budget_ms, 1000, || {
            let (b, cv) = (wa.t(), c.view_mut());
            // SAFETY: the views are valid for their shapes and strides; `c` is uniquely borrowed.
            unsafe {
                let (sa, sb, sc) = (xa.strides().to_vec(), b.strides().to_vec(), cv.strides().to_vec());
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    sc[1],
                    sc[0],
                    false,
                    xa.as_ptr(),
                    sa[1],
                    sa[0],
                    b.as_ptr(),
                    sb[1],
                    sb[0],
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::Rayon(0),
                );
            }
            Ok(())
        })?;
        let mm = bench::median_ms_within(budget_ms, 1000, || {
            let half = m / 2;
            let (top, bottom) = c.view_mut().split_at(ndarray::Axis(0), half);
            let (xt, xb) = (xa.slice(s![..half, ..]), xa.slice(s![half.., ..]));
            rayon::join(
                || ndarray::linalg::general_mat_mul(1.0, &xt, &wa.t(), 0.0, &mut { top }),
                || ndarray::linalg::general_mat_mul(1.0, &xb, &wa.t(), 0.0, &mut { bottom }),
            );
            Ok(())
        })?;
        let rate = |ms: f64| flops / ms / 1e6;
        println!("{m:>5} {k:>5} {n:>5} {:>10.1} {:>10.1} {:>15.1}", rate(ours), rate(crate_gemm), rate(mm));
    }
    // The products of ConvNeXt-T's and ViT-B/16's blocks at batch 4, the weight a row-major `[k, n]` initializer
    // as the ONNX graphs hold it (MatMul, not Gemm).
    println!("{:>5} {:>5} {:>5} {:>10} {:>8} {:>10} {:>8}", "m", "k", "n", "x·w ms", "GFLOP/s", "g·wᵀ ms", "GFLOP/s");
    for (m, k, n) in
        [(196, 768, 3072), (196, 3072, 768), (12544, 96, 384), (12544, 384, 96), (784, 384, 1536), (788, 768, 2304)]
    {
        let x = Tensor::uniform(&[m, k], -1.0, 1.0, 1);
        let w = Tensor::uniform(&[k, n], -1.0, 1.0, 2);
        // And the input gradient's product through it, `g·wᵀ` (`wᵀ` a transposed view).
        let (g, wt) = (Tensor::uniform(&[m, n], -1.0, 1.0, 3), w.t()?);
        let ms = bench::median_ms_within(budget_ms, 1000, || {
            std::hint::black_box(x.matmul(&w)?);
            Ok(())
        })?;
        let ms_t = bench::median_ms_within(budget_ms, 1000, || {
            std::hint::black_box(g.matmul(&wt)?);
            Ok(())
        })?;
        let rate = |ms: f64| 2.0 * (m * k * n) as f64 / ms / 1e6;
        println!("{m:>5} {k:>5} {n:>5} {ms:>10.2} {:>8.1} {ms_t:>10.2} {:>8.1}", rate(ms), rate(ms_t));
    }
    Ok(())
}
