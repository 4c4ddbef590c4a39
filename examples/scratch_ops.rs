// Scratch per-op timing (temporary; deleted after the performance work).
use std::time::Instant;
use armoury::ops::{Conv2dParams, Pool2dParams, Reduction};
use armoury::{Tensor, no_grad};

fn t<T>(name: &str, reps: usize, mut f: impl FnMut() -> T) -> T {
    let mut r = f();
    let mut ts = vec![];
    for _ in 0..reps { let s = Instant::now(); r = f(); ts.push(s.elapsed().as_secs_f64() * 1e6); }
    ts.sort_by(f64::total_cmp);
    println!("{name:<28} {:>9.1} us", ts[reps / 2]);
    r
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let b: usize = std::env::args().nth(1).unwrap_or("64".into()).parse()?;
    let reps = 50;
    let x = Tensor::uniform(&[b, 1, 28, 28], 0.0, 1.0, 1);
    let w1 = Tensor::uniform(&[16, 1, 5, 5], -0.2, 0.2, 2);
    let b1 = Tensor::uniform(&[16], -0.2, 0.2, 3);
    let w2 = Tensor::uniform(&[32, 16, 5, 5], -0.05, 0.05, 4);
    let b2 = Tensor::uniform(&[32], -0.2, 0.2, 5);
    let f1 = Tensor::uniform(&[128, 512], -0.05, 0.05, 6);
    let fb1 = Tensor::uniform(&[128], -0.05, 0.05, 7);
    let f2 = Tensor::uniform(&[10, 128], -0.05, 0.05, 8);
    let fb2 = Tensor::uniform(&[10], -0.05, 0.05, 9);
    let p = Conv2dParams::default();
    let pp = Pool2dParams::square(2);
    no_grad(|| -> armoury::Result<()> {
        let c1 = t("conv1", reps, || x.conv2d(&w1, Some(&b1), p).unwrap());
        let r1 = t("relu1", reps, || c1.relu());
        let p1 = t("pool1", reps, || r1.max_pool2d(pp).unwrap());
        let c2 = t("conv2", reps, || p1.conv2d(&w2, Some(&b2), p).unwrap());
        let r2 = t("relu2", reps, || c2.relu());
        let p2 = t("pool2", reps, || r2.max_pool2d(pp).unwrap());
        let fl = p2.flatten_from(1)?;
        let h = t("fc1 matmul", reps, || fl.matmul(&f1.t().unwrap()).unwrap());
        let h = t("fc1 bias", reps, || h.add(&fb1).unwrap());
        let h = t("fc1 relu", reps, || h.relu());
        let z = t("fc2", reps, || h.matmul(&f2.t().unwrap()).unwrap().add(&fb2).unwrap());
        let labels = vec![3usize; b];
        t("ce", reps, || z.cross_entropy(&labels, Reduction::None).unwrap());
        Ok(())
    })?;
    let fwd = |xv: &Tensor| -> Tensor {
        let c1 = xv.conv2d(&w1, Some(&b1), p).unwrap().relu().max_pool2d(pp).unwrap();
        let c2 = c1.conv2d(&w2, Some(&b2), p).unwrap().relu().max_pool2d(pp).unwrap();
        let h = c2.flatten_from(1).unwrap().matmul(&f1.t().unwrap()).unwrap().add(&fb1).unwrap().relu();
        h.matmul(&f2.t().unwrap()).unwrap().add(&fb2).unwrap()
    };
    let labels = vec![3usize; b];
    t("whole fwd (tracked)", reps, || { let xv = x.variable(); fwd(&xv) });
    t("whole fwd+grad", reps, || { let xv = x.variable(); let l = fwd(&xv).cross_entropy(&labels, Reduction::None).unwrap(); l.grad_wrt(&[&xv]).unwrap() });
    Ok(())
}
