//! `QuantLinear` on the tape: saved bytes per layer (SPEC section 4), the
//! gradients it hands to the autograd, and its errors.

use mxswitch_runtime::cpu::CpuStorage;
use mxswitch_runtime::linear::QuantLinear;
use mxswitch_runtime::module::{allocate, SplitMix64};
use mxswitch_runtime::plan::{LinearSite, PlanLinear};
use mxswitch_runtime::qlinear::{backward, forward, LinearCall, LinearCtx, LinearShape};
use mxswitch_runtime::recipe::{Recipe, RecipeKind};
use mxswitch_runtime::{DType, Device, Tensor};

fn randn(n: usize, seed: u64, std: f32) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| r.normal() * std).collect()
}

fn linear(k: usize, n: usize, path: &str) -> QuantLinear {
    let mut lin = QuantLinear::new(k, n, true);
    allocate(&mut lin, 3).unwrap();
    lin.set_position(&LinearSite::new(path, Some(0)), 0, 9);
    lin
}

/// The recipes of SPEC sections 4 and 4a's examples, each with the range of
/// its saved bytes per element (FP8's two f32 scales add a little to 1.0).
fn recipes() -> Vec<(Recipe, f64, f64)> {
    let mx4 = Recipe::new(RecipeKind::Mxfp4);
    let o = |r: Recipe, k, v| r.with_option(k, v).unwrap();
    vec![
        (Recipe::new(RecipeKind::Bf16), 2.0, 2.0),
        (Recipe::new(RecipeKind::Fp8), 1.0, 1.01),
        (Recipe::new(RecipeKind::Fp8Fnuz), 1.0, 1.01),
        (mx4, 0.53125, 0.53125),
        (Recipe::new(RecipeKind::Mxfp8), 1.03125, 1.03125),
        (o(mx4, "fprop", "bf16"), 0.53125, 0.53125),
        // dgrad in BF16 keeps no W: the tape keeps the master weight, and
        // only x (in MXFP4) counts.
        (o(mx4, "dgrad", "bf16"), 0.53125, 0.53125),
        (o(o(mx4, "dgrad", "fp8"), "wgrad", "fp8"), 1.0, 1.01),
        // NVFP4: 0.5 + 1/16, and the f32 tensor scale of x and of W.
        (Recipe::new(RecipeKind::Nvfp4), 0.5625, 0.5626),
        // FP8 rowwise: 1 byte plus two f32 per row of K elements (x along
        // M and W along N each have K rows here): 1 + 16 * 256 / 196608.
        (Recipe::new(RecipeKind::Fp8Rowwise), 1.0208, 1.0209),
        // FP8 128-block: 1 byte plus two f32 per 128 elements.
        (Recipe::new(RecipeKind::Fp8Block), 1.0625, 1.0625),
        (o(mx4, "dgrad", "fp8_block"), 0.53125, 1.0625),
        (
            o(Recipe::new(RecipeKind::Fp8), "wgrad", "nvfp4"),
            0.5625,
            1.01,
        ),
    ]
}

/// x 256x256, W 512x256: the saved bytes per element the SPEC promises,
/// counted by the runtime under the layer's path.
#[test]
fn saved_bytes_per_element_per_layer() {
    let mut lin = linear(256, 512, "blocks.0.fc1");
    let x = Tensor::from_vec(randn(256 * 256, 1, 1.0), [256, 256], &Device::Cpu).unwrap();
    for (recipe, lo, hi) in recipes() {
        lin.set_recipe(recipe);
        let y = lin.forward(&x).unwrap();
        let saved = y.saved_bytes();
        let per = saved.get("blocks.0.fc1") as f64 / saved.elements("blocks.0.fc1") as f64;
        eprintln!("{recipe}: {per} bytes per element");
        assert_eq!(saved.per_element(), per);
        assert!((lo..=hi).contains(&per), "{recipe}: {per}");
    }
}

fn values(s: CpuStorage) -> Vec<f32> {
    match s {
        CpuStorage::F32(v) => v,
        other => panic!("expected f32 values, got {other:?}"),
    }
}

/// The tape hands back exactly what the recipe's backward computes.
#[test]
fn gradients_are_the_recipes() {
    let (m, k, n) = (48, 64, 40);
    let mut lin = linear(k, n, "l");
    let xv = randn(m * k, 5, 1.0);
    let dyv = randn(m * n, 6, 0.01);
    let x = Tensor::from_vec(xv.clone(), [m, k], &Device::Cpu).unwrap();
    let dy = Tensor::from_vec(dyv.clone(), [m, n], &Device::Cpu).unwrap();
    let w = CpuStorage::F32(lin.params.weight.as_ref().unwrap().to_vec_f32().unwrap());
    let b = CpuStorage::F32(lin.params.bias.as_ref().unwrap().to_vec_f32().unwrap());
    for (recipe, ..) in recipes() {
        lin.set_recipe(recipe);
        let y = lin.forward(&x).unwrap();
        let grads = y.backward_with(&dy).unwrap();
        let call = LinearCall {
            recipe: &recipe,
            shape: LinearShape { m, k, n },
            ctx: LinearCtx {
                layer: "l",
                iteration: 9,
                seed: 0,
                layer_id: 0,
            },
        };
        let xs = CpuStorage::F32(xv.clone());
        let (y_ref, saved) = forward(&call, &xs, &w, Some(&b)).unwrap();
        let dys = CpuStorage::F32(dyv.clone());
        let g = backward(&call, &saved, Some(&w), &dys).unwrap();
        assert_eq!(y.to_vec_f32().unwrap(), values(y_ref), "{recipe} y");
        let dw = grads
            .get(lin.params.weight.as_ref().unwrap().id())
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let db = grads
            .get(lin.params.bias.as_ref().unwrap().id())
            .unwrap()
            .to_vec_f32()
            .unwrap();
        assert_eq!(dw, values(g.dw), "{recipe} dW");
        assert_eq!(db, values(g.db.unwrap()), "{recipe} db");
    }
}

/// BF16 activations in, BF16 out; the master weight stays f32.
#[test]
fn activation_dtype_is_kept() {
    let mut lin = linear(32, 16, "l");
    lin.set_recipe(Recipe::new(RecipeKind::Mxfp4));
    let x = Tensor::from_vec(randn(4 * 32, 7, 1.0), [2, 2, 32], &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let y = lin.forward(&x).unwrap();
    assert_eq!((y.dims(), y.dtype()), (&[2usize, 2, 16][..], DType::BF16));
    assert_eq!(lin.params.weight.as_ref().unwrap().dtype(), DType::F32);
}

#[test]
fn errors_name_the_layer_and_shapes() {
    let lin = linear(32, 16, "blocks.1.proj");
    let x = Tensor::from_vec(vec![0.0; 3 * 30], [3, 30], &Device::Cpu).unwrap();
    let e = lin.forward(&x).unwrap_err().to_string();
    assert!(
        e.contains("blocks.1.proj") && e.contains("[3, 30]") && e.contains("[16, 32]"),
        "{e}"
    );
    let empty = QuantLinear::new(8, 8, false);
    let e = empty.forward(&x).unwrap_err().to_string();
    assert!(
        e.contains("no weights") && !e.contains("invalid option"),
        "{e}"
    );
    let mut bad = linear(32, 16, "blocks.2.qkv");
    bad.set_recipe(Recipe::new(RecipeKind::Fp8));
    let mut v = vec![1.0; 2 * 32];
    v[3] = f32::INFINITY;
    let x = Tensor::from_vec(v, [2, 32], &Device::Cpu).unwrap();
    let e = bad.forward(&x).unwrap_err().to_string();
    assert!(e.contains("blocks.2.qkv activation, iteration 9"), "{e}");
}

/// A `Dense` with BF16 activations is the `bf16` recipe's linear, bit for
/// bit, and its saved input is not one of the plan's saved bytes; with f32
/// activations it stays the f32 linear.
#[test]
fn dense_runs_bf16_with_bf16_activations() {
    use mxswitch_runtime::module::Dense;
    let (m, k, n) = (24, 64, 40);
    let mut dense = Dense::new(k, n, true);
    allocate(&mut dense, 3).unwrap();
    let mut lin = linear(k, n, "l");
    for (to, from) in [
        (&mut lin.params.weight, &dense.params.weight),
        (&mut lin.params.bias, &dense.params.bias),
    ] {
        let t = from.as_ref().unwrap().tensor().clone();
        to.as_mut().unwrap().set(t).unwrap();
    }
    lin.set_recipe(Recipe::new(RecipeKind::Bf16));
    let x32 = Tensor::from_vec(randn(m * k, 8, 1.0), [m, k], &Device::Cpu).unwrap();
    let x = x32.to_dtype(DType::BF16).unwrap();
    let y = dense.forward(&x).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(
        y.to_vec_f32().unwrap(),
        lin.forward(&x).unwrap().to_vec_f32().unwrap()
    );
    let dy = Tensor::from_vec(randn(m * n, 9, 0.01), [m, n], &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let (gd, gl) = (
        y.backward_with(&dy).unwrap(),
        lin.forward(&x).unwrap().backward_with(&dy).unwrap(),
    );
    let id = |l: &mxswitch_runtime::module::LinearParams| l.weight.as_ref().unwrap().id();
    assert_eq!(
        gd.get(id(&dense.params)).unwrap().to_vec_f32().unwrap(),
        gl.get(id(&lin.params)).unwrap().to_vec_f32().unwrap(),
        "dW"
    );
    assert_eq!(
        y.saved_bytes().per_element(),
        0.0,
        "a Dense is not a plan linear"
    );
    // f32 activations: the f32 linear, not rounded to BF16.
    let y32 = dense.forward(&x32).unwrap();
    let bf = y32.to_dtype(DType::BF16).unwrap().to_vec_f32().unwrap();
    assert_ne!(y32.to_vec_f32().unwrap(), bf, "an f32 output");
}
