//! Gradient clipping by global norm ([`clip_grad_norm`]), and the clip
//! factor alone ([`clip_grad_factor`]) for an AdamW step that applies it
//! as it reads the gradients.

use super::GROUP_BYTES;
use crate::storage::Storage;
use crate::{Device, Gradients, ParamId, Result, Tensor};

/// Scales all gradients by `max_norm / (norm + 1e-6)` when their global L2
/// norm exceeds `max_norm` (as `torch.nn.utils.clip_grad_norm_`) and returns
/// the norm before clipping. A non-finite norm leaves the gradients as they
/// are, so the caller can see it and skip the step instead of writing NaN
/// into every weight.
///
/// Multi-tensor: the squares of each device's gradients are summed by one
/// backend call (on a GPU two launches and one read-back, the one wait of
/// the step) and the gradients are scaled by one call per [`GROUP_BYTES`].
/// On the CPU the norm has the bits of the per-gradient sums in id order
/// (each gradient's f32 sum of squares, added in f64); on a GPU it is the
/// f64 sum of the exact squares in a fixed order (deterministic, within
/// about 1e-6 relative of the CPU's for f32 gradients). The scaled
/// gradients have the bits of `g.mul_scalar(coef)` on either.
pub fn clip_grad_norm(grads: &mut Gradients, max_norm: f32) -> Result<f32> {
    clip_grad_norm_in_groups(grads, max_norm, GROUP_BYTES)
}

/// [`clip_grad_norm`] with at most `group_bytes` of scaled gradients per
/// call (at least one gradient per call); the values do not depend on it.
pub fn clip_grad_norm_in_groups(
    grads: &mut Gradients,
    max_norm: f32,
    group_bytes: usize,
) -> Result<f32> {
    let (devices, norm) = norm_by_device(grads)?;
    if let Some(coef) = factor(norm, max_norm) {
        for (_, list) in &devices {
            for group in byte_groups(list, grads, group_bytes) {
                scale_group(grads, group, coef)?;
            }
        }
    }
    Ok(norm)
}

/// The clipping of [`clip_grad_norm`] without the scaling pass: returns the
/// global norm (the same bits) and the factor `max_norm / (norm + 1e-6)`
/// that [`clip_grad_norm`] would multiply every gradient by, or `None`
/// where it would leave them (a non-finite norm, or a factor of at least
/// 1). The gradients are not touched: pass the factor to
/// [`AdamW::step_scaled`](super::AdamW::step_scaled), which applies it to
/// each gradient element as it reads it, with the bits of clipping first.
pub fn clip_grad_factor(grads: &Gradients, max_norm: f32) -> Result<(f32, Option<f32>)> {
    let (_, norm) = norm_by_device(grads)?;
    Ok((norm, factor(norm, max_norm)))
}

/// The clip factor of `norm` against `max_norm`, `None` for no clipping.
fn factor(norm: f32, max_norm: f32) -> Option<f32> {
    let coef = max_norm / (norm + 1e-6);
    (norm.is_finite() && coef < 1.0).then_some(coef)
}

/// Each device with its gradient ids, in id order.
type ByDevice = Vec<(Device, Vec<ParamId>)>;

/// Each device's gradient ids (in id order) and the global L2 norm.
fn norm_by_device(grads: &Gradients) -> Result<(ByDevice, f32)> {
    let mut ids: Vec<ParamId> = grads.iter().map(|(id, _)| id).collect();
    ids.sort_unstable();
    // Each device's gradients, in id order.
    let mut devices: ByDevice = Vec::new();
    for id in ids {
        let d = grads.get(id).expect("id taken from the map").device();
        match devices.iter_mut().find(|(dev, _)| *dev == d) {
            Some((_, list)) => list.push(id),
            None => devices.push((d, vec![id])),
        }
    }
    let mut sum_sq = 0f64;
    for (_, list) in &devices {
        let views: Vec<_> = list
            .iter()
            .map(|&id| {
                let g = grads.get(id).expect("id taken from the map");
                (g.storage(), g.layout())
            })
            .collect();
        sum_sq += Storage::sum_squares(&views)?;
    }
    Ok((devices, sum_sq.sqrt() as f32))
}

/// `ids` cut into runs of at most `budget` bytes of gradient values (a
/// larger gradient alone).
pub(super) fn byte_groups<'i>(
    ids: &'i [ParamId],
    grads: &Gradients,
    budget: usize,
) -> Vec<&'i [ParamId]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, &id) in ids.iter().enumerate() {
        let g = grads.get(id).expect("id taken from the map");
        let b = g.elem_count() * g.dtype().size_in_bytes();
        if i > start && bytes + b > budget {
            out.push(&ids[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += b;
    }
    if start < ids.len() {
        out.push(&ids[start..]);
    }
    out
}

/// Replaces the gradients of `ids` (one device) by themselves times `coef`.
fn scale_group(grads: &mut Gradients, ids: &[ParamId], coef: f32) -> Result<()> {
    let scaled = {
        let views: Vec<_> = ids
            .iter()
            .map(|&id| {
                let g = grads.get(id).expect("id taken from the map");
                (g.storage(), g.layout())
            })
            .collect();
        Storage::scale_all(&views, coef)?
    };
    for (&id, out) in ids.iter().zip(scaled) {
        let shape = grads
            .get(id)
            .expect("id taken from the map")
            .shape()
            .clone();
        grads.insert(id, Tensor::untracked(out, shape));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{AdamW, AdamWConfig};
    use super::*;
    use crate::module::SplitMix64;
    use crate::{DType, Param};

    /// Values with exact zeros, negative zeros and tiny negatives (whose
    /// scaled value rounds to -0), so the sign of zero is exercised.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n)
            .map(|i| match i % 13 {
                3 => 0.0,
                7 => -0.0,
                11 => -1e-45,
                _ => r.normal() * 3.0,
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// (dims, parameter dtype, gradient dtype)
    const CASES: [(&[usize], DType, DType); 5] = [
        (&[37, 29], DType::F32, DType::F32),
        (&[300, 257], DType::F32, DType::F32),
        (&[333], DType::BF16, DType::BF16),
        (&[123, 45], DType::F32, DType::BF16),
        (&[4097], DType::BF16, DType::F32),
    ];

    fn params() -> Vec<Param> {
        CASES
            .iter()
            .enumerate()
            .map(|(i, (dims, wdt, _))| {
                let n = dims.iter().product();
                let t = Tensor::from_vec(values(n, i as u64), dims.to_vec(), &Device::Cpu).unwrap();
                Param::new(t.to_dtype(*wdt).unwrap()).unwrap()
            })
            .collect()
    }

    fn grads(ps: &[Param], s: u64) -> Gradients {
        let mut g = Gradients::default();
        for (i, (dims, _, gdt)) in CASES.iter().enumerate() {
            let n = dims.iter().product();
            let t = Tensor::from_vec(
                values(n, 100 * s + 7 + i as u64),
                dims.to_vec(),
                &Device::Cpu,
            )
            .unwrap();
            g.insert(ps[i].id(), t.to_dtype(*gdt).unwrap());
        }
        g
    }

    /// Clip fused into AdamW (`clip_grad_factor` then `step_scaled`) has
    /// the bits of clip then AdamW (`clip_grad_norm` then `step`): values,
    /// moments and norms, clipped (several factors) or not.
    #[test]
    fn clip_fused_into_adamw_has_the_bits_of_clip_then_adamw() {
        let cfg = AdamWConfig {
            lr: 3e-3,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        };
        for max_norm in [1.0, 0.37, 50.0, 1e9] {
            let (mut a, mut b) = (params(), params());
            let (mut oa, mut ob) = (AdamW::new(cfg).unwrap(), AdamW::new(cfg).unwrap());
            for s in 0..3 {
                let mut ga = grads(&a, s);
                let gb = grads(&b, s);
                let na = clip_grad_norm(&mut ga, max_norm).unwrap();
                oa.step(a.iter_mut(), &ga).unwrap();
                let (nb, mul) = clip_grad_factor(&gb, max_norm).unwrap();
                assert_eq!(na.to_bits(), nb.to_bits());
                assert_eq!(mul.is_some(), max_norm < 1e9, "max_norm {max_norm}");
                ob.step_scaled(b.iter_mut(), &gb, mul).unwrap();
                for i in 0..CASES.len() {
                    let what = format!("max_norm {max_norm}, step {s}, parameter {i}");
                    let (va, vb) = (a[i].tensor().to_vec_f32(), b[i].tensor().to_vec_f32());
                    assert_eq!(bits(&va.unwrap()), bits(&vb.unwrap()), "{what}");
                    let (sa, sb) = (
                        oa.state(a[i].id()).unwrap().unwrap(),
                        ob.state(b[i].id()).unwrap().unwrap(),
                    );
                    assert_eq!(sa.0, sb.0, "{what}");
                    assert_eq!(bits(&sa.1), bits(&sb.1), "{what}: m");
                    assert_eq!(bits(&sa.2), bits(&sb.2), "{what}: v");
                }
            }
        }
    }
}
