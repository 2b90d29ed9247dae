//! AdamW and gradient clipping: a worked example by hand, a multi-step
//! comparison against dfdx's decoupled-weight-decay Adam on a linear
//! regression, and the clipping rules.

mod common;

use common::{assert_close, Rng};
use mxswitch_runtime::optim::{clip_grad_norm, AdamW, AdamWConfig};
use mxswitch_runtime::{Device, Gradients, Param, Tensor};

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape, &Device::Cpu).unwrap()
}

/// Three steps on w0 = 1 with lr 0.1, betas (0.9, 0.999), eps 1e-8,
/// weight decay 0.1 and gradients 0.5, -0.25, 1.0, by hand:
///
/// step 1: w = 1 * (1 - 0.1 * 0.1) = 0.99; m = 0.05, v = 2.5e-4;
///         m^ = 0.05 / 0.1 = 0.5, sqrt(v^) = sqrt(2.5e-4 / 1e-3) = 0.5;
///         w = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.890000002
/// step 2: w = 0.8811; m = 0.045 - 0.025 = 0.02, v = 2.4975e-4 + 6.25e-5 = 3.1225e-4;
///         m^ = 0.02 / 0.19 = 0.1052632, sqrt(v^) = sqrt(3.1225e-4 / 1.999e-3) = 0.3952254;
///         w = 0.8811 - 0.1 * 0.2663380 = 0.8544663
/// step 3: w = 0.8459216; m = 0.018 + 0.1 = 0.118, v = 3.1194e-4 + 1e-3 = 1.3119e-3;
///         m^ = 0.118 / 0.271 = 0.4354244, sqrt(v^) = sqrt(1.3119e-3 / 2.997e-3) = 0.6616277;
///         w = 0.8459216 - 0.1 * 0.6581107 = 0.7801105
#[test]
fn adamw_worked_example() {
    let mut w = Param::new(t(&[1.0], &[1])).unwrap();
    let cfg = AdamWConfig {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = AdamW::new(cfg).unwrap();
    let expected = [0.89_f32, 0.854_466_3, 0.780_110_5];
    for (g, want) in [0.5f32, -0.25, 1.0].into_iter().zip(expected) {
        let mut grads = Gradients::default();
        grads.insert(w.id(), t(&[g], &[1]));
        opt.step([&mut w], &grads).unwrap();
        let got = w.to_scalar_f32().unwrap();
        println!("w = {got} (hand: {want})");
        assert!((got - want).abs() <= 1e-6, "w = {got}, by hand {want}");
    }
    assert_eq!(opt.steps(w.id()), 3);
}

#[test]
fn adamw_skips_parameters_without_gradient_and_rejects_bad_config() {
    let mut a = Param::new(t(&[1.0, 2.0], &[2])).unwrap();
    let mut b = Param::new(t(&[3.0], &[1])).unwrap();
    let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
    let mut grads = Gradients::default();
    grads.insert(a.id(), t(&[1.0, -1.0], &[2]));
    opt.step([&mut a, &mut b], &grads).unwrap();
    assert_eq!(
        b.to_vec_f32().unwrap(),
        vec![3.0],
        "no gradient: no update, no decay"
    );
    assert_eq!((opt.steps(a.id()), opt.steps(b.id())), (1, 0));
    assert_ne!(a.to_vec_f32().unwrap(), vec![1.0, 2.0]);
    grads.insert(b.id(), t(&[1.0, 1.0], &[2]));
    assert!(
        opt.step([&mut b], &grads).is_err(),
        "gradient shape must match"
    );
    assert!(AdamW::new(AdamWConfig {
        beta1: 1.0,
        ..AdamWConfig::default()
    })
    .is_err());
    assert!(AdamW::new(AdamWConfig {
        lr: -1.0,
        ..AdamWConfig::default()
    })
    .is_err());
}

/// Five steps of linear regression (y = x W^T + b, MSE loss) trained with
/// our linear, mse_loss and AdamW, against dfdx's `Linear`, `mse_loss` and
/// `Adam` with `WeightDecay::Decoupled` (the same update as torch's AdamW).
/// Tolerance 1e-5 * max(1, |dfdx|) on every weight after every step.
#[test]
fn adamw_matches_dfdx_on_linear_regression() {
    use dfdx::nn::{DeviceBuildExt, Module, ZeroGrads};
    use dfdx::optim::{Adam, AdamConfig, Optimizer, WeightDecay};
    use dfdx::prelude::{mse_loss, Backward, Cpu, Rank2, TensorFromVec, Trace};

    let dev: Cpu = Default::default();
    let mut model = dev.build_module::<dfdx::nn::builders::Linear<4, 3>, f32>();
    let mut theirs = Adam::new(
        &model,
        AdamConfig {
            lr: 1e-2,
            betas: [0.9, 0.95],
            eps: 1e-8,
            weight_decay: Some(WeightDecay::Decoupled(0.1)),
        },
    );
    let mut w = Param::new(t(&model.weight.as_vec(), &[3, 4])).unwrap();
    let mut b = Param::new(t(&model.bias.as_vec(), &[3])).unwrap();
    let cfg = AdamWConfig {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut ours = AdamW::new(cfg).unwrap();

    let mut rng = Rng::new(31);
    let mut their_grads = model.alloc_grads();
    for step in 0..5 {
        let (x, target) = (rng.vec(6 * 4, -1.0, 1.0), rng.vec(6 * 3, -1.0, 1.0));
        let y = model.forward(
            dev.tensor_from_vec(x.clone(), Rank2::<6, 4>::default())
                .trace(their_grads),
        );
        their_grads = mse_loss(
            y,
            dev.tensor_from_vec(target.clone(), Rank2::<6, 3>::default()),
        )
        .backward();
        theirs.update(&mut model, &their_grads).unwrap();
        model.zero_grads(&mut their_grads);

        let y = mxswitch_runtime::ops::linear(&t(&x, &[6, 4]), &w, Some(&b)).unwrap();
        let grads = mxswitch_runtime::ops::mse_loss(&y, &t(&target, &[6, 3]))
            .unwrap()
            .backward()
            .unwrap();
        ours.step([&mut w, &mut b], &grads).unwrap();

        assert_close(
            &format!("step {step} W"),
            &w.to_vec_f32().unwrap(),
            &model.weight.as_vec(),
            1e-5,
        );
        assert_close(
            &format!("step {step} b"),
            &b.to_vec_f32().unwrap(),
            &model.bias.as_vec(),
            1e-5,
        );
    }
}

#[test]
fn clip_grad_norm_scales_down_only_above_the_limit() {
    let (a, b) = (
        Param::new(t(&[0.0; 2], &[2])).unwrap(),
        Param::new(t(&[0.0], &[1])).unwrap(),
    );
    let mut grads = Gradients::default();
    grads.insert(a.id(), t(&[3.0, 0.0], &[2]));
    grads.insert(b.id(), t(&[4.0], &[1]));
    // Global norm sqrt(9 + 16) = 5.
    let norm = clip_grad_norm(&mut grads, 1.0).unwrap();
    assert_eq!(norm, 5.0);
    let scale = 1.0 / (5.0 + 1e-6);
    assert_eq!(
        grads.get(a.id()).unwrap().to_vec_f32().unwrap(),
        vec![3.0 * scale, 0.0]
    );
    assert_eq!(
        grads.get(b.id()).unwrap().to_vec_f32().unwrap(),
        vec![4.0 * scale]
    );
    // Now under the limit: returned, left alone.
    let norm = clip_grad_norm(&mut grads, 10.0).unwrap();
    assert!((norm - 1.0).abs() < 1e-6);
    assert_eq!(
        grads.get(b.id()).unwrap().to_vec_f32().unwrap(),
        vec![4.0 * scale]
    );
    // A non-finite norm is reported and the gradients are not scaled to NaN.
    grads.insert(a.id(), t(&[f32::INFINITY, 1.0], &[2]));
    assert!(clip_grad_norm(&mut grads, 1.0).unwrap().is_infinite());
    assert_eq!(grads.get(a.id()).unwrap().to_vec_f32().unwrap()[1], 1.0);
}
