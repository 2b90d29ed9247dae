//! Black Forest Labs' Flux checkpoint naming (`flux/src/flux/model.py`,
//! `modules/layers.py`) against the split layout of [`super::Flux`].
//!
//! Most tensors only change name (`img_qkv` is `img_attn.qkv`, `img_mlp_fc1`
//! is `img_mlp.0`, `final_layer.ada_ln_modulation` is
//! `final_layer.adaLN_modulation.1`, ...). A single block's fused linears are
//! split: `linear1` stacks q, k, v and the MLP input by rows (`qkv`, then
//! `mlp_fc1`), and `linear2` puts the attention projection and the MLP output
//! side by side by columns (`proj`, then `mlp_fc2`; its bias is
//! `mlp_fc2`'s, which is why `proj` has none). Rows or columns of a BFL
//! tensor that no parameter covers (the q, k, v part of `linear1.bias` when
//! `qkv_bias` is false) are zeros going out and must be zeros coming in.
//!
//! A [`Layout`] is computed once from the model's parameter paths and shapes;
//! [`Layout::to_bfl`] and [`Layout::from_bfl`] then move f32 values, exactly,
//! so a round trip gives the same bits. Every mismatch is one line that names
//! the tensor.

use std::collections::BTreeMap;

/// Tensors by name: shape and f32 values, row-major.
pub type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Where one parameter of ours (or a run of zeros) sits in a BFL tensor:
/// `len` rows (axis 0) or columns (axis 1) from `start`.
#[derive(Clone, Debug, PartialEq)]
struct Part {
    ours: Option<String>,
    start: usize,
    len: usize,
}

/// One BFL tensor: its shape, the axis its parts split, and the parts in order.
#[derive(Clone, Debug, PartialEq)]
struct Joined {
    shape: Vec<usize>,
    axis: usize,
    parts: Vec<Part>,
}

/// A BFL tensor being laid out: its axis and its parts with their shapes.
type Group = (usize, Vec<(Part, Vec<usize>)>);

/// The BFL tensors of a model and which of its parameters each is made of.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    tensors: BTreeMap<String, Joined>,
}

/// The BFL tensor, axis and offset of our parameter `path` (of a model of
/// width `hidden`).
fn place(path: &str, hidden: usize) -> (String, usize, usize) {
    if let Some(rest) = path.strip_prefix("single_blocks.") {
        if let Some((n, field)) = rest.split_once('.') {
            let bfl = |name: &str| format!("single_blocks.{n}.{name}");
            match field {
                "qkv.weight" | "qkv.bias" => {
                    return (bfl(&format!("linear1.{}", &field[4..])), 0, 0)
                }
                "mlp_fc1.weight" | "mlp_fc1.bias" => {
                    return (bfl(&format!("linear1.{}", &field[8..])), 0, 3 * hidden)
                }
                "proj.weight" => return (bfl("linear2.weight"), 1, 0),
                "mlp_fc2.weight" => return (bfl("linear2.weight"), 1, hidden),
                "mlp_fc2.bias" => return (bfl("linear2.bias"), 0, 0),
                _ => {}
            }
        }
    }
    (rename(path), 0, 0)
}

/// The BFL name of a parameter that is a whole BFL tensor.
fn rename(path: &str) -> String {
    if let Some(rest) = path.strip_prefix("final_layer.ada_ln_modulation.") {
        return format!("final_layer.adaLN_modulation.1.{rest}");
    }
    if let Some(rest) = path.strip_prefix("double_blocks.") {
        if let Some((n, field)) = rest.split_once('.') {
            for stream in ["img_", "txt_"] {
                let Some(f) = field.strip_prefix(stream) else {
                    continue;
                };
                for (ours, theirs) in [
                    ("qkv.", "attn.qkv."),
                    ("proj.", "attn.proj."),
                    ("norm.", "attn.norm."),
                    ("mlp_fc1.", "mlp.0."),
                    ("mlp_fc2.", "mlp.2."),
                ] {
                    if let Some(tail) = f.strip_prefix(ours) {
                        return format!("double_blocks.{n}.{stream}{theirs}{tail}");
                    }
                }
            }
        }
    }
    path.to_string()
}

impl Layout {
    /// The layout of a model with `params` (path and shape of every
    /// parameter) and hidden width `hidden`.
    pub fn new(params: &[(String, Vec<usize>)], hidden: usize) -> Result<Layout, String> {
        let mut groups: BTreeMap<String, Group> = BTreeMap::new();
        for (path, shape) in params {
            let (bfl, axis, start) = place(path, hidden);
            let len = match (axis, shape.len()) {
                (0, 0) => 1,
                (0, _) => shape[0],
                (1, 2) => shape[1],
                _ => {
                    return Err(format!(
                        "parameter `{path}` of shape {shape:?} cannot be joined by columns"
                    ))
                }
            };
            let g = groups.entry(bfl).or_insert((axis, Vec::new()));
            g.1.push((
                Part {
                    ours: Some(path.clone()),
                    start,
                    len,
                },
                shape.clone(),
            ));
        }
        let mut tensors = BTreeMap::new();
        for (bfl, (axis, mut parts)) in groups {
            parts.sort_by_key(|(p, _)| p.start);
            let first = parts[0].1.clone();
            // The dimensions the parts must share: all but the split one.
            let other = |s: &[usize]| -> Vec<usize> {
                let mut s = s.to_vec();
                if !s.is_empty() {
                    s.remove(axis);
                }
                s
            };
            let mut joined = Vec::new();
            let mut at = 0;
            for (p, shape) in parts {
                if other(&shape) != other(&first) {
                    return Err(format!(
                        "parameters joined into `{bfl}` disagree on their shapes ({shape:?} against {first:?})"
                    ));
                }
                if p.start < at {
                    return Err(format!("parameters joined into `{bfl}` overlap"));
                }
                if p.start > at {
                    joined.push(Part {
                        ours: None,
                        start: at,
                        len: p.start - at,
                    });
                }
                at = p.start + p.len;
                joined.push(p);
            }
            let mut shape = first;
            if !shape.is_empty() {
                shape[axis] = at;
            }
            tensors.insert(
                bfl,
                Joined {
                    shape,
                    axis,
                    parts: joined,
                },
            );
        }
        Ok(Layout { tensors })
    }

    /// The BFL names and shapes, sorted by name.
    pub fn shapes(&self) -> impl Iterator<Item = (&str, &[usize])> {
        self.tensors
            .iter()
            .map(|(n, j)| (n.as_str(), j.shape.as_slice()))
    }

    /// Our parameters (by path) as BFL tensors. Every parameter must be there
    /// with its shape.
    pub fn to_bfl(&self, ours: &Tensors) -> Result<Tensors, String> {
        let mut out = Tensors::new();
        for (name, j) in &self.tensors {
            let mut values = vec![0.0f32; j.shape.iter().product()];
            for p in &j.parts {
                let Some(path) = &p.ours else { continue };
                let (shape, v) = ours
                    .get(path)
                    .ok_or_else(|| format!("parameter `{path}` is missing"))?;
                if shape.iter().product::<usize>() != v.len() {
                    return Err(format!(
                        "parameter `{path}` holds {} values for its shape {shape:?}",
                        v.len()
                    ));
                }
                j.each_row(p, |whole, mine| values[whole].copy_from_slice(&v[mine]));
            }
            out.insert(name.clone(), (j.shape.clone(), values));
        }
        Ok(out)
    }

    /// BFL tensors as our parameters (by path). Every BFL tensor of the
    /// layout must be present with its shape, no other may be, and rows or
    /// columns no parameter covers must be zeros.
    pub fn from_bfl(&self, theirs: &Tensors) -> Result<Tensors, String> {
        let missing: Vec<&String> = self
            .tensors
            .keys()
            .filter(|n| !theirs.contains_key(*n))
            .collect();
        if let Some(first) = missing.first() {
            return Err(format!(
                "tensor `{first}` is missing{}",
                more(missing.len())
            ));
        }
        let extra: Vec<&String> = theirs
            .keys()
            .filter(|n| !self.tensors.contains_key(*n))
            .collect();
        if let Some(first) = extra.first() {
            return Err(format!(
                "tensor `{first}` is not a tensor of this model{}",
                more(extra.len())
            ));
        }
        let mut out = Tensors::new();
        for (name, j) in &self.tensors {
            let (shape, v) = &theirs[name];
            if shape != &j.shape {
                return Err(format!(
                    "tensor `{name}` has shape {shape:?}, but this model needs {:?}",
                    j.shape
                ));
            }
            for p in &j.parts {
                let mut part = vec![0.0f32; j.part_len(p)];
                j.each_row(p, |whole, mine| part[mine].copy_from_slice(&v[whole]));
                match &p.ours {
                    Some(path) => {
                        out.insert(path.clone(), (j.part_shape(p), part));
                    }
                    None if part.iter().any(|&x| x != 0.0) => {
                        return Err(format!(
                            "tensor `{name}` holds nonzero values at {} {}..{}, where this model has no parameter",
                            ["rows", "columns"][j.axis],
                            p.start,
                            p.start + p.len
                        ))
                    }
                    None => {}
                }
            }
        }
        Ok(out)
    }
}

impl Joined {
    /// Rows of the tensor (axis 0 splits them; axis 1 keeps them whole).
    fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Elements of one row of the tensor.
    fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    fn part_shape(&self, p: &Part) -> Vec<usize> {
        let mut s = self.shape.clone();
        if !s.is_empty() {
            s[self.axis] = p.len;
        }
        s
    }

    fn part_len(&self, p: &Part) -> usize {
        self.part_shape(p).iter().product()
    }

    /// Calls `f(whole, part)` with matching index ranges of the whole
    /// tensor's values and the part's, contiguous run by contiguous run.
    fn each_row(
        &self,
        p: &Part,
        mut f: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
    ) {
        let row = self.row_len();
        if self.axis == 0 {
            f(p.start * row..(p.start + p.len) * row, 0..p.len * row);
        } else {
            for r in 0..self.rows() {
                f(
                    r * row + p.start..r * row + p.start + p.len,
                    r * p.len..(r + 1) * p.len,
                );
            }
        }
    }
}

/// ", and N more" for a list of `n` names of which one was given.
fn more(n: usize) -> String {
    if n > 1 {
        format!(" (and {} more)", n - 1)
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(hidden: usize, mlp: usize, qkv_bias: bool) -> Vec<(String, Vec<usize>)> {
        let (h, m) = (hidden, mlp);
        let mut p = vec![
            ("img_in.weight".to_string(), vec![h, 4]),
            ("double_blocks.0.img_qkv.weight".into(), vec![3 * h, h]),
            ("double_blocks.0.img_norm.query_norm.scale".into(), vec![2]),
            ("double_blocks.0.txt_mlp_fc2.bias".into(), vec![h]),
            (
                "final_layer.ada_ln_modulation.weight".into(),
                vec![2 * h, h],
            ),
            ("single_blocks.1.qkv.weight".into(), vec![3 * h, h]),
            ("single_blocks.1.mlp_fc1.weight".into(), vec![m, h]),
            ("single_blocks.1.mlp_fc1.bias".into(), vec![m]),
            ("single_blocks.1.proj.weight".into(), vec![h, h]),
            ("single_blocks.1.mlp_fc2.weight".into(), vec![h, m]),
            ("single_blocks.1.mlp_fc2.bias".into(), vec![h]),
        ];
        if qkv_bias {
            p.push(("single_blocks.1.qkv.bias".into(), vec![3 * h]));
        }
        p
    }

    /// Distinct values for every parameter, so a misplaced one shows.
    fn values(params: &[(String, Vec<usize>)]) -> Tensors {
        let mut next = 1.0f32;
        params
            .iter()
            .map(|(n, s)| {
                let v = (0..s.iter().product::<usize>())
                    .map(|_| {
                        next += 1.0;
                        next
                    })
                    .collect();
                (n.clone(), (s.clone(), v))
            })
            .collect()
    }

    #[test]
    fn names_follow_the_upstream_checkpoint() {
        let l = Layout::new(&params(2, 3, true), 2).unwrap();
        let names: Vec<&str> = l.shapes().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "double_blocks.0.img_attn.norm.query_norm.scale",
                "double_blocks.0.img_attn.qkv.weight",
                "double_blocks.0.txt_mlp.2.bias",
                "final_layer.adaLN_modulation.1.weight",
                "img_in.weight",
                "single_blocks.1.linear1.bias",
                "single_blocks.1.linear1.weight",
                "single_blocks.1.linear2.bias",
                "single_blocks.1.linear2.weight",
            ]
        );
        let shape = |n: &str| l.shapes().find(|(m, _)| *m == n).unwrap().1.to_vec();
        assert_eq!(shape("single_blocks.1.linear1.weight"), [3 * 2 + 3, 2]);
        assert_eq!(shape("single_blocks.1.linear2.weight"), [2, 2 + 3]);
    }

    #[test]
    fn fused_linears_stack_rows_and_columns_in_upstream_order() {
        let (h, m) = (2, 3);
        let p = params(h, m, true);
        let ours = values(&p);
        let bfl = Layout::new(&p, h).unwrap().to_bfl(&ours).unwrap();
        let v = |t: &Tensors, n: &str| t[n].1.clone();
        let l1 = v(&bfl, "single_blocks.1.linear1.weight");
        let qkv = v(&ours, "single_blocks.1.qkv.weight");
        assert_eq!(&l1[..3 * h * h], &qkv[..]);
        assert_eq!(
            &l1[3 * h * h..],
            &v(&ours, "single_blocks.1.mlp_fc1.weight")[..]
        );
        let l2 = v(&bfl, "single_blocks.1.linear2.weight");
        let (proj, fc2) = (
            v(&ours, "single_blocks.1.proj.weight"),
            v(&ours, "single_blocks.1.mlp_fc2.weight"),
        );
        for r in 0..h {
            assert_eq!(&l2[r * (h + m)..r * (h + m) + h], &proj[r * h..(r + 1) * h]);
            assert_eq!(
                &l2[r * (h + m) + h..(r + 1) * (h + m)],
                &fc2[r * m..(r + 1) * m]
            );
        }
        assert_eq!(
            v(&bfl, "single_blocks.1.linear2.bias"),
            v(&ours, "single_blocks.1.mlp_fc2.bias")
        );
    }

    #[test]
    fn a_round_trip_gives_the_same_bits() {
        for qkv_bias in [true, false] {
            let p = params(4, 6, qkv_bias);
            let l = Layout::new(&p, 4).unwrap();
            let ours = values(&p);
            let back = l.from_bfl(&l.to_bfl(&ours).unwrap()).unwrap();
            assert_eq!(back, ours);
        }
    }

    #[test]
    fn without_qkv_bias_the_uncovered_rows_are_zeros_both_ways() {
        let p = params(2, 3, false);
        let l = Layout::new(&p, 2).unwrap();
        let mut bfl = l.to_bfl(&values(&p)).unwrap();
        let bias = &mut bfl.get_mut("single_blocks.1.linear1.bias").unwrap().1;
        assert!(bias[..6].iter().all(|&x| x == 0.0));
        bias[1] = 0.5;
        let e = l.from_bfl(&bfl).unwrap_err();
        assert_eq!(
            e,
            "tensor `single_blocks.1.linear1.bias` holds nonzero values at rows 0..6, where this model has no parameter"
        );
    }

    #[test]
    fn missing_extra_and_misshapen_tensors_are_named() {
        let p = params(2, 3, true);
        let l = Layout::new(&p, 2).unwrap();
        let good = l.to_bfl(&values(&p)).unwrap();
        let mut t = good.clone();
        t.remove("img_in.weight");
        t.remove("single_blocks.1.linear2.bias");
        assert_eq!(
            l.from_bfl(&t).unwrap_err(),
            "tensor `img_in.weight` is missing (and 1 more)"
        );
        let mut t = good.clone();
        t.insert("guidance_in.in_layer.weight".into(), (vec![1], vec![0.0]));
        assert_eq!(
            l.from_bfl(&t).unwrap_err(),
            "tensor `guidance_in.in_layer.weight` is not a tensor of this model"
        );
        let mut t = good;
        t.insert("img_in.weight".into(), (vec![4, 2], vec![0.0; 8]));
        assert_eq!(
            l.from_bfl(&t).unwrap_err(),
            "tensor `img_in.weight` has shape [4, 2], but this model needs [2, 4]"
        );
    }
}
