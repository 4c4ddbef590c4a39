//! Products with a bias: `x·w + b` as one product whose chains start at the bias (PyTorch's linear layers as
//! exported, ONNX's `Gemm`), and the exact GELU before it as one op whose backward applies the GELU's derivative
//! in the product's blocks ([`Tensor::gelu_matmul_bias`]).

use ndarray::{ArrayD, Ix2};

use super::matmul::{backward2, input_grad, kept_packed, product_array, rows, KEY_PACKED, KEY_PACKED_T};
use super::{record, vmath, Op};
use crate::tensor::Tensor;
use crate::Result;

/// `w`, or its transpose.
fn transposed_if(w: &Tensor, transposed: bool) -> Result<Tensor> {
    if transposed {
        w.t()
    } else {
        Ok(w.clone())
    }
}

/// The right operand's inner and outer sizes, `w` or `wᵀ`.
fn kn(w: &Tensor, transposed: bool) -> (usize, usize) {
    match (w.shape(), transposed) {
        (&[r, c], false) => (r, c),
        (&[r, c], true) => (c, r),
        _ => (0, 0),
    }
}

/// Whether `[…, m, k] · w + b` runs as one product ([`bias_product`]): `w` a matrix (or its transpose) of `k`
/// rows, `b` a vector of its columns, on the vector kernels.
fn bias_product_fits(a: &[usize], w: &Tensor, b: &Tensor, transposed: bool) -> bool {
    let (k, n) = kn(w, transposed);
    w.rank() == 2 && a.len() >= 2 && a.last() == Some(&k) && b.shape() == [n] && super::simd::accelerated()
}

/// `a · w + b` (or `a · wᵀ + b`) as one product on `w`'s kept packing whose chains start at the bias, `a`'s rows
/// flattened (the operands [`bias_product_fits`]).
fn bias_product(a: ndarray::ArrayViewD<f32>, w: &Tensor, b: &Tensor, transposed: bool) -> ArrayD<f32> {
    let (k, n) = kn(w, transposed);
    let m = a.len() / k.max(1);
    let mut shape = a.shape().to_vec();
    let a2 = rows(a, m, k);
    let wv = w.value().view().into_dimensionality::<Ix2>().expect("rank checked");
    let (bv, key) = if transposed { (wv.t(), KEY_PACKED_T) } else { (wv, KEY_PACKED) };
    let packed = match kept_packed(w, bv, key) {
        Some(p) => p,
        None => std::sync::Arc::new(super::simd::pack(bv).expect("the vector kernels are on")),
    };
    let bias = b.value().as_standard_layout();
    let start = bias.as_slice().expect("standard layout");
    // SAFETY: the product, not accumulating, writes every element of `c` before reading any.
    let c = unsafe {
        product_array(Ix2(m, n), |c| super::simd::gemm_prepacked(a2.view(), &packed, c, false, Some(start), true))
    };
    *shape.last_mut().expect("rank 2 or more") = n;
    c.into_shape_with_order(ndarray::IxDyn(&shape)).expect("same size")
}

/// The backward of [`Tensor::gelu_matmul_bias`] from the product's right operand `w` (as recorded: `wᵀ` when it
/// was transposed), the GELU's input `z` and output `y`: the gradients of `z`, `w` and `b` where `need` asks. The
/// product's input gradient is multiplied by GELU's derivative row by row as each block of it completes, with
/// the expression of the GELU's own backward, so the bits are the two ops'.
pub(crate) fn gelu_matmul_bias_backward(
    (z, y): (&Tensor, &crate::tensor::Array),
    w: &Tensor,
    bias: &Tensor,
    g: &ArrayD<f32>,
    need: &[bool],
) -> Vec<Option<ArrayD<f32>>> {
    let (k, n) = (w.shape()[0], w.shape()[1]);
    let m = z.numel() / k.max(1);
    let g2 = rows(g.view(), m, n);
    let wv = w.value().view().into_dimensionality::<Ix2>().expect("a matrix");
    let gz = need[0].then(|| {
        let (zs, ys) = (super::shape::standard(z.value()), super::shape::standard(y));
        let after = |r: usize, j: usize, row: &mut [f32]| {
            let at = r * k + j..r * k + j + row.len();
            vmath::zip3_in_place(row, &zs[at.clone()], &ys[at], &|g, x, y| g * vmath::gelu_derivative_from(x, y));
        };
        let c = input_grad(g2.view(), (w, wv), Some(&after));
        c.into_shape_with_order(z.shape()).expect("same size").into_dyn()
    });
    let gw = need[1].then(|| {
        let y2 = rows(y.view(), m, k);
        backward2(y2.view(), (w, wv), g2.view(), &[false, true]).1.expect("asked for")
    });
    let gb = need[2].then(|| super::shape::sum_to_shape(g.clone(), bias.shape()));
    vec![gz, gw, gb]
}

/// Products with a bias.
impl Tensor {
    /// `self · w + b` (or `self · wᵀ + b` when `transposed`) for `self` `[…, m, k]` (its rows flattened), `w` a
    /// matrix and `b` a vector of its columns' count: one product on `w`'s kept packing whose chains start at the
    /// bias ([`crate::nn::plan::Fused::MatMulBias`], ONNX `Gemm`), no pass of its own over the output. Each element
    /// is one fused multiply-add chain from `b[j]`, so it rounds within an ulp or so of the product then the sum,
    /// not bit for bit; the gradients are those of the two ops. Other operands (other ranks, a bias that
    /// broadcasts, the portable level) run as the two ops.
    pub(crate) fn matmul_bias(&self, w: &Tensor, b: &Tensor, transposed: bool) -> Result<Tensor> {
        if !bias_product_fits(self.shape(), w, b, transposed) {
            return self.matmul(&transposed_if(w, transposed)?)?.add(b);
        }
        let value = bias_product(self.value().view(), w, b, transposed);
        // The right operand as a tensor, made after the packing is looked up (a clone of `w` would count as a
        // second holder: `Tensor::is_kept_leaf`).
        Ok(record(value, Op::MatMulBias(self.clone(), transposed_if(w, transposed)?, b.clone())))
    }

    /// The exact GELU of `self`, then `· w + b` ([`Tensor::matmul_bias`]; a transformer's or ConvNeXt's MLP, its
    /// first layer's output through the GELU into its second): one op whose backward applies GELU's derivative to
    /// the product's input gradient as the product makes it, block by block in cache, instead of writing that
    /// gradient out and reading it back with the GELU's input and output in a pass of its own. The values and
    /// gradients are the two ops' bits. Operands `matmul_bias` would run as two ops run as the two ops.
    pub(crate) fn gelu_matmul_bias(&self, w: &Tensor, b: &Tensor, transposed: bool) -> Result<Tensor> {
        if !bias_product_fits(self.shape(), w, b, transposed) {
            return self.gelu(false).matmul_bias(w, b, transposed);
        }
        let y = super::elementwise::map(self.value(), vmath::gelu);
        let value = bias_product(y.view(), w, b, transposed);
        let op =
            Op::GeluMatMulBias { z: self.clone(), y: y.into_shared(), w: transposed_if(w, transposed)?, b: b.clone() };
        Ok(record(value, op))
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{Array2, Ix2};

    use super::*;
    use crate::ops::matmul::kept_packed;
    use crate::ops::matmul::tests::bits;

    /// `x·w + b` as one product: each element the chain of multiply-adds started at `b[j]` — the bits of the packed
    /// product accumulating onto `b` — on `[m, k]`, `[B, m, k]` and `[B, h, w, k]` inputs, `w` as is and
    /// transposed, pieces of the reduction and partial slivers, `a` packed (800 columns) or read in place; the
    /// gradients those of the two ops; a bias that broadcasts (one value) runs as the two ops.
    #[test]
    fn matmul_bias_starts_the_chains_at_the_bias() {
        if !super::super::simd::accelerated() {
            return;
        }
        for (n, transposed) in [(260, false), (260, true), (800, false)] {
            let w = if transposed {
                Tensor::uniform(&[n, 300], -1.0, 1.0, 5)
            } else {
                Tensor::uniform(&[300, n], -1.0, 1.0, 5)
            };
            let b = Tensor::uniform(&[n], -1.0, 1.0, 6);
            let wt = if transposed { w.t().unwrap() } else { w.clone() };
            let wv = wt.value().view().into_dimensionality::<Ix2>().unwrap();
            for shape in [&[37, 300][..], &[3, 13, 300], &[2, 3, 5, 300]] {
                let x = Tensor::uniform(shape, -1.0, 1.0, 7).variable();
                let rows = shape.iter().product::<usize>() / 300;
                let y = x.matmul_bias(&w, &b, transposed).unwrap();
                let mut want = Array2::from_shape_fn((rows, n), |(_, j)| b.value()[[j]]);
                let xr = Array2::from_shape_vec((rows, 300), x.to_vec()).unwrap();
                assert!(super::super::simd::gemm_packed(xr.view(), wv, want.view_mut(), true, true));
                assert_eq!(bits(y.value()), bits(&want), "n {n} transposed {transposed} {shape:?}");
                let two = x.matmul(&wt).unwrap().add(&b).unwrap();
                let worst = y.value().iter().zip(two.value().iter()).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
                assert!(worst < 1e-4, "within rounding of the two ops: {worst}");
                // Gradients: those of the product and the sum.
                let r = Tensor::uniform(y.shape(), -1.0, 1.0, 8);
                let (wv2, bv2) = (w.variable(), b.variable());
                let loss = |y: Tensor| y.mul(&r).unwrap().sum_all();
                let fused = loss(x.matmul_bias(&wv2, &bv2, transposed).unwrap()).grad_wrt(&[&x, &wv2, &bv2]).unwrap();
                let wt2 = if transposed { wv2.t().unwrap() } else { wv2.clone() };
                let apart = loss(x.matmul(&wt2).unwrap().add(&bv2).unwrap()).grad_wrt(&[&x, &wv2, &bv2]).unwrap();
                for (f, a) in fused.iter().zip(&apart) {
                    assert_eq!(bits(f.value()), bits(a.value()));
                }
            }
        }
        let (x, w, one) =
            (Tensor::uniform(&[5, 30], -1.0, 1.0, 9), Tensor::uniform(&[30, 20], -1.0, 1.0, 10), Tensor::ones(&[1]));
        let y = x.matmul_bias(&w, &one, false).unwrap();
        assert_eq!(bits(y.value()), bits(x.matmul(&w).unwrap().add(&one).unwrap().value()));
    }

    /// GELU then `x·w + b` as one op gives the two ops' bits: the forward, and the gradients of the GELU's input,
    /// the weight and the bias — on `w`'s kept packing (the input gradient's GELU derivative applied in the
    /// product's blocks, rows split across jobs and threads) and on `wᵀ` (a transposed view, no kept packing: the
    /// derivative in a pass after), on `[m, k]`, `[B, m, k]` and `[B, h, w, k]` inputs.
    #[test]
    fn gelu_matmul_bias_gives_the_two_ops_bits() {
        for transposed in [false, true] {
            let w = if transposed {
                Tensor::uniform(&[260, 300], -0.2, 0.2, 5)
            } else {
                Tensor::uniform(&[300, 260], -0.2, 0.2, 5)
            };
            let wv = w.variable();
            // A second holder, as the recorded op will be: a weight kept across calls.
            let _slot = wv.clone();
            let b = Tensor::uniform(&[260], -1.0, 1.0, 6).variable();
            if super::super::simd::accelerated() && !transposed {
                let m = wv.value().view().into_dimensionality::<Ix2>().unwrap();
                assert!(kept_packed(&wv, m.t(), KEY_PACKED_T).is_some(), "the fused backward runs on the kept packing");
            }
            for shape in [&[37, 300][..], &[3, 13, 300], &[2, 3, 5, 300]] {
                let z = Tensor::uniform(shape, -4.0, 4.0, 7).variable();
                let r = Tensor::uniform(&[&shape[..shape.len() - 1], &[260]].concat(), -1.0, 1.0, 8);
                let fused = z.gelu_matmul_bias(&wv, &b, transposed).unwrap();
                let two = z.gelu(false).matmul_bias(&wv, &b, transposed).unwrap();
                let what = format!("transposed {transposed} {shape:?}");
                assert_eq!(bits(fused.value()), bits(two.value()), "forward, {what}");
                let loss = |y: Tensor| y.mul(&r).unwrap().sum_all();
                let gf = loss(fused).grad_wrt(&[&z, &wv, &b]).unwrap();
                let gt = loss(two).grad_wrt(&[&z, &wv, &b]).unwrap();
                for (name, (f, t)) in ["z", "w", "b"].iter().zip(gf.iter().zip(&gt)) {
                    assert_eq!(bits(f.value()), bits(t.value()), "∂{name}, {what}");
                }
            }
        }
    }
}
