//! Einstein summation, lowered onto the ops that have gradients: sums, permutes, reshapes, broadcasts and
//! (batched) matrix products — so `einsum` needs no backward of its own.
//!
//! The operands are contracted left to right. For each pair, an index is a *batch* index when both operands and
//! the result keep it, a *contracted* one when both have it and nothing later needs it, a *free* one when only one
//! operand has it; an index only one operand has and nothing later needs is summed out first. The pair becomes one
//! `[batch, rows, k]·[batch, k, cols]` product. What is not supported — an index repeated within one operand (a
//! diagonal) — is an error naming the equation.

use std::collections::HashMap;

use crate::tensor::Tensor;
use crate::{Error, Result};

/// An index: a letter's code, or `ELLIPSIS + j` for the `j`-th axis the ellipses stand for (right-aligned across
/// the operands, as broadcasting aligns them).
type Label = u32;
const ELLIPSIS: Label = 1 << 16;

/// A parsed equation: each operand's indices (ellipses expanded) and the result's.
struct Spec {
    inputs: Vec<Vec<Label>>,
    output: Vec<Label>,
}

fn unsupported(eq: &str, why: impl std::fmt::Display) -> Error {
    Error::invalid("einsum", format!("equation '{eq}': {why}"))
}

fn show(l: Label) -> String {
    match char::from_u32(l) {
        Some(c) if l < ELLIPSIS => c.to_string(),
        _ => "...".into(),
    }
}

/// The letters of one term, and whether (and where) it has an ellipsis.
fn term(eq: &str, t: &str) -> Result<(Vec<Label>, Option<usize>)> {
    let mut letters = Vec::new();
    let mut ellipsis = None;
    let mut rest = t;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("...") {
            if ellipsis.replace(letters.len()).is_some() {
                return Err(unsupported(eq, format!("term '{t}' has two ellipses")));
            }
            rest = r;
            continue;
        }
        let c = rest.chars().next().expect("not empty");
        if !c.is_ascii_alphabetic() {
            return Err(unsupported(eq, format!("'{c}' in term '{t}' is not an index letter")));
        }
        letters.push(c as Label);
        rest = &rest[c.len_utf8()..];
    }
    Ok((letters, ellipsis))
}

fn parse(eq: &str, shapes: &[&[usize]]) -> Result<Spec> {
    let compact: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match compact.split_once("->") {
        Some((l, r)) if !r.contains("->") => (l, Some(r)),
        Some(_) => return Err(unsupported(eq, "more than one '->'")),
        None => (compact.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != shapes.len() {
        return Err(unsupported(eq, format!("{} terms for {} operands", terms.len(), shapes.len())));
    }
    let parsed = terms.iter().map(|t| term(eq, t)).collect::<Result<Vec<_>>>()?;
    // How many axes each ellipsis stands for, and the most any does.
    let mut spans = Vec::with_capacity(shapes.len());
    for (i, ((letters, ellipsis), shape)) in parsed.iter().zip(shapes).enumerate() {
        let span = shape.len().checked_sub(letters.len()).filter(|&s| ellipsis.is_some() || s == 0);
        let Some(span) = span else {
            return Err(unsupported(
                eq,
                format!("operand {} has shape {shape:?}, term '{}' names {} axes", i + 1, terms[i], letters.len()),
            ));
        };
        spans.push(span);
    }
    let widest = spans.iter().copied().max().unwrap_or(0);
    let ellipsis_labels = |span: usize| (widest - span..widest).map(|j| ELLIPSIS + j as Label);
    let mut inputs = Vec::with_capacity(shapes.len());
    for (i, ((letters, ellipsis), &span)) in parsed.iter().zip(&spans).enumerate() {
        let mut labels = letters.clone();
        if let Some(at) = *ellipsis {
            labels.splice(at..at, ellipsis_labels(span));
        }
        if let Some(l) = letters.iter().enumerate().find_map(|(j, l)| letters[..j].contains(l).then_some(*l)) {
            return Err(unsupported(
                eq,
                format!("index '{}' repeats within operand {} (diagonals are not supported)", show(l), i + 1),
            ));
        }
        inputs.push(labels);
    }
    let output = match rhs {
        Some(r) => {
            let (letters, ellipsis) = term(eq, r)?;
            let mut out = letters.clone();
            if let Some(at) = ellipsis {
                out.splice(at..at, ellipsis_labels(widest));
            }
            for (j, l) in letters.iter().enumerate() {
                if letters[..j].contains(l) {
                    return Err(unsupported(eq, format!("index '{}' repeats in the result", show(*l))));
                }
                if !inputs.iter().any(|i| i.contains(l)) {
                    return Err(unsupported(eq, format!("index '{}' of the result is in no operand", show(*l))));
                }
            }
            out
        }
        None => {
            // NumPy's implicit form: the ellipsis axes, then the letters used once, in alphabetical order.
            let mut once: Vec<Label> = Vec::new();
            for l in inputs.iter().flatten().filter(|&&l| l < ELLIPSIS) {
                if inputs.iter().flatten().filter(|&&m| m == *l).count() == 1 {
                    once.push(*l);
                }
            }
            once.sort_unstable();
            ellipsis_labels(widest).chain(once).collect()
        }
    };
    Ok(Spec { inputs, output })
}

/// Every index's size, with NumPy's broadcasting: a size of 1 stretches to the others.
fn sizes(eq: &str, spec: &Spec, shapes: &[&[usize]]) -> Result<HashMap<Label, usize>> {
    let mut sizes: HashMap<Label, usize> = HashMap::new();
    for (i, (labels, shape)) in spec.inputs.iter().zip(shapes).enumerate() {
        for (&l, &d) in labels.iter().zip(shape.iter()) {
            let s = sizes.entry(l).or_insert(d);
            if *s == 1 {
                *s = d;
            } else if d != 1 && d != *s {
                return Err(unsupported(
                    eq,
                    format!("index '{}' has size {d} in operand {} and {} elsewhere", show(l), i + 1, *s),
                ));
            }
        }
    }
    Ok(sizes)
}

/// `t` (with indices `labels`) summed over the indices `drop`, and its remaining indices.
fn sum_out(t: Tensor, labels: Vec<Label>, drop: impl Fn(Label) -> bool) -> Result<(Tensor, Vec<Label>)> {
    let axes: Vec<usize> = (0..labels.len()).filter(|&a| drop(labels[a])).collect();
    if axes.is_empty() {
        return Ok((t, labels));
    }
    let kept = labels.into_iter().filter(|&l| !drop(l)).collect();
    Ok((t.sum(&axes, false)?, kept))
}

/// `t` with its axes in the order of `want` (a permutation of `labels`), each broadcast to its index's size.
fn arrange(t: &Tensor, labels: &[Label], want: &[Label], sizes: &HashMap<Label, usize>) -> Result<Tensor> {
    let perm: Vec<usize> =
        want.iter().map(|l| labels.iter().position(|m| m == l).expect("a permutation of the labels")).collect();
    let t = if perm.iter().enumerate().all(|(i, &p)| i == p) { t.clone() } else { t.permute(&perm)? };
    let full: Vec<usize> = want.iter().map(|l| sizes[l]).collect();
    if t.shape() == full.as_slice() {
        Ok(t)
    } else {
        t.broadcast_to(&full)
    }
}

/// Contracts two operands, keeping the indices in `keep` that either has.
fn contract(
    (a, la): (Tensor, Vec<Label>),
    (b, lb): (Tensor, Vec<Label>),
    keep: &dyn Fn(Label) -> bool,
    sizes: &HashMap<Label, usize>,
) -> Result<(Tensor, Vec<Label>)> {
    let (a, la) = sum_out(a, la, |l| !keep(l) && !lb.contains(&l))?;
    let (b, lb) = sum_out(b, lb, |l| !keep(l) && !la.contains(&l))?;
    let batch: Vec<Label> = la.iter().copied().filter(|l| lb.contains(l) && keep(*l)).collect();
    let inner: Vec<Label> = la.iter().copied().filter(|l| lb.contains(l) && !keep(*l)).collect();
    let rows: Vec<Label> = la.iter().copied().filter(|l| !lb.contains(l)).collect();
    let cols: Vec<Label> = lb.iter().copied().filter(|l| !la.contains(l)).collect();
    let size = |ls: &[Label]| ls.iter().map(|l| sizes[l]).product::<usize>();
    let (p, m, k, n) = (size(&batch), size(&rows), size(&inner), size(&cols));
    let a = arrange(&a, &la, &[&batch[..], &rows, &inner].concat(), sizes)?;
    let b = arrange(&b, &lb, &[&batch[..], &inner, &cols].concat(), sizes)?;
    let y = if batch.is_empty() {
        a.reshape(&[m, k])?.matmul(&b.reshape(&[k, n])?)?
    } else {
        a.reshape(&[p, m, k])?.matmul(&b.reshape(&[p, k, n])?)?
    };
    let labels = [&batch[..], &rows, &cols].concat();
    let shape: Vec<usize> = labels.iter().map(|l| sizes[l]).collect();
    Ok((y.reshape(&shape)?, labels))
}

/// The shape of `einsum(equation, operands)` for operands of these shapes: the shape rule of [`Tensor::einsum`]
/// (and of ONNX's Einsum), with the same errors.
pub(crate) fn einsum_shape(equation: &str, shapes: &[&[usize]]) -> Result<Vec<usize>> {
    if shapes.is_empty() {
        return Err(unsupported(equation, "no operands"));
    }
    let spec = parse(equation, shapes)?;
    let sizes = sizes(equation, &spec, shapes)?;
    Ok(spec.output.iter().map(|l| sizes[l]).collect())
}

/// Einstein summation.
impl Tensor {
    /// Einstein summation over `operands` (NumPy's and PyTorch's `einsum`, ONNX's Einsum): index letters
    /// (`a`–`z`, `A`–`Z`), an optional `...` per term for broadcast leading axes, and `->` before the result's
    /// indices (without it, the result is the ellipsis axes and the letters used once, alphabetically). Sizes of 1
    /// broadcast. Examples: `"bhqd,bhkd->bhqk"` (attention scores), `"bhqk,bhkd->bhqd"`, `"...ij,...jk->...ik"`,
    /// `"ij->ji"`, `"bij->b"`.
    ///
    /// Lowered onto sums, permutes, reshapes and (batched) [`Tensor::matmul`], so its gradient is theirs. An index
    /// repeated within one operand (a diagonal, `"ii->i"`) is not supported: an [`Error::InvalidArgument`] naming the
    /// equation, as is any malformed equation.
    pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
        let shapes: Vec<&[usize]> = operands.iter().map(|t| t.shape()).collect();
        if operands.is_empty() {
            return Err(unsupported(equation, "no operands"));
        }
        let spec = parse(equation, &shapes)?;
        let sizes = sizes(equation, &spec, &shapes)?;
        let output = &spec.output;
        let mut acc = (operands[0].clone(), spec.inputs[0].clone());
        if operands.len() == 1 {
            acc = sum_out(acc.0, acc.1, |l| !output.contains(&l))?;
        }
        for (i, t) in operands.iter().enumerate().skip(1) {
            let later = &spec.inputs[i + 1..];
            let keep = |l: Label| output.contains(&l) || later.iter().any(|ls| ls.contains(&l));
            acc = contract(acc, ((*t).clone(), spec.inputs[i].clone()), &keep, &sizes)?;
        }
        let (t, labels) = acc;
        arrange(&t, &labels, output, &sizes)
    }
}
