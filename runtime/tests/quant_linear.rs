//! `QuantLinear` on the tape: saved bytes per layer (SPEC section 4), the
//! gradients it hands to the autograd, and its errors.

use mxswitch_runtime::linear::QuantLinear;
use mxswitch_runtime::module::{allocate, SplitMix64};
use mxswitch_runtime::plan::{LinearSite, PlanLinear};
use mxswitch_runtime::recipe::linear::{backward, forward, LinearCtx, LinearShape};
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

/// x 256x256, W 512x256: the saved bytes per element the SPEC promises,
/// counted by the runtime under the layer's path.
#[test]
fn saved_bytes_per_element_per_layer() {
    let mut lin = linear(256, 512, "blocks.0.fc1");
    let x = Tensor::from_vec(randn(256 * 256, 1, 1.0), [256, 256], &Device::Cpu).unwrap();
    for kind in RecipeKind::ALL {
        lin.set_recipe(Recipe::new(kind));
        let y = lin.forward(&x).unwrap();
        let saved = y.saved_bytes();
        let per = saved.get("blocks.0.fc1") as f64 / saved.elements("blocks.0.fc1") as f64;
        eprintln!("{kind}: {per} bytes per element");
        assert_eq!(saved.per_element(), per);
        match kind {
            RecipeKind::Mxfp4 => assert!((per - 0.53125).abs() <= 0.001, "{per}"),
            RecipeKind::Fp8 | RecipeKind::Fp8Fnuz => assert!((1.0..=1.01).contains(&per), "{per}"),
            RecipeKind::Mxfp8 => assert!((per - 1.03125).abs() <= 0.001, "{per}"),
            RecipeKind::Bf16 => assert_eq!(per, 2.0),
        }
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
    let w = lin.weight.as_ref().unwrap().to_vec_f32().unwrap();
    let b = lin.bias.as_ref().unwrap().to_vec_f32().unwrap();
    for kind in RecipeKind::ALL {
        let recipe = Recipe::new(kind);
        lin.set_recipe(recipe);
        let y = lin.forward(&x).unwrap();
        let grads = y.backward_with(&dy).unwrap();
        let ctx = LinearCtx {
            layer: "l",
            iteration: 9,
            seed: 0,
            layer_id: 0,
        };
        let s = LinearShape { m, k, n };
        let (y_ref, saved) = forward(&recipe, &xv, &w, Some(&b), s, &ctx).unwrap();
        let g = backward(&recipe, &saved, &w, &dyv, true, s, &ctx).unwrap();
        assert_eq!(y.to_vec_f32().unwrap(), y_ref, "{kind} y");
        let dw = grads
            .get(lin.weight.as_ref().unwrap().id())
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let db = grads
            .get(lin.bias.as_ref().unwrap().id())
            .unwrap()
            .to_vec_f32()
            .unwrap();
        assert_eq!(dw, g.dw, "{kind} dW");
        assert_eq!(db, g.db.unwrap(), "{kind} db");
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
    assert_eq!(lin.weight.as_ref().unwrap().dtype(), DType::F32);
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
    assert!(e.contains("no weights"), "{e}");
    let mut bad = linear(32, 16, "blocks.2.qkv");
    bad.set_recipe(Recipe::new(RecipeKind::Fp8));
    let mut v = vec![1.0; 2 * 32];
    v[3] = f32::INFINITY;
    let x = Tensor::from_vec(v, [2, 32], &Device::Cpu).unwrap();
    let e = bad.forward(&x).unwrap_err().to_string();
    assert!(e.contains("blocks.2.qkv activation, iteration 9"), "{e}");
}
