//! The runtime side of the DSL on a real model (flux-tiny): warm-up proves
//! every recipe ran, starts each recipe's step from the same state and
//! restores everything bit for bit; a switch touches
//! no parameter, id or optimizer state, and it does change the output.

use mxswitch::models::flux::{Flux, FluxInput, RunConfig, SyntheticData};
use mxswitch::runtime::module::{allocate, optimizer_step, Parameters};
use mxswitch::runtime::ops::mse_loss;
use mxswitch::runtime::optim::{AdamW, AdamWConfig};
use mxswitch::runtime::schedule_config::ToSchedule;
use mxswitch::runtime::warmup::warmup;
use mxswitch::runtime::{DType, ParamId, Result, Tensor};

struct Setup {
    model: Flux,
    opt: AdamW,
    data: SyntheticData,
    schedule: mxswitch::runtime::schedule::Schedule,
}

fn setup() -> Setup {
    let cfg = RunConfig::load("flux-tiny").unwrap();
    let mut model = Flux::new(&cfg.model);
    allocate(&mut model, 1).unwrap();
    let opt = AdamW::new(AdamWConfig {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    })
    .unwrap();
    let data = SyntheticData::new(&cfg.model, &cfg.data, 1);
    let schedule = cfg.schedule.to_schedule().unwrap();
    Setup {
        model,
        opt,
        data,
        schedule,
    }
}

fn output(model: &Flux, data: &SyntheticData, iter: u64) -> Result<Tensor> {
    let b = data.batch(iter, DType::F32)?;
    model.forward(&FluxInput {
        img: &b.img,
        txt: &b.txt,
        timesteps: &b.timesteps,
        y: &b.y,
        guidance: None,
        patches_hw: b.patches_hw,
    })
}

/// One optimizer step on the batch of `iter`.
fn step(model: &mut Flux, opt: &mut AdamW, data: &SyntheticData, iter: u64) -> Result<()> {
    let b = data.batch(iter, DType::F32)?;
    let loss = mse_loss(&output(model, data, iter)?, &b.target)?;
    optimizer_step(model, opt, &loss.backward()?)
}

/// Every parameter's id and value bits, and its optimizer state, in visit order.
#[allow(clippy::type_complexity)]
fn state(
    model: &mut Flux,
    opt: &AdamW,
) -> Vec<(ParamId, Vec<u32>, Option<(u64, Vec<u32>, Vec<u32>)>)> {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut out = Vec::new();
    model.visit_params("", &mut |slot| {
        let p = slot.param.as_ref().unwrap();
        let s = opt
            .state(p.id())
            .unwrap()
            .map(|(n, m, v)| (n, bits(&m), bits(&v)));
        out.push((p.id(), bits(&p.to_vec_f32().unwrap()), s));
    });
    out
}

#[test]
fn warmup_runs_every_recipe_and_restores_everything() {
    let Setup {
        mut model,
        mut opt,
        data,
        schedule,
    } = setup();
    step(&mut model, &mut opt, &data, 0).unwrap(); // some optimizer state to restore
    let before = state(&mut model, &opt);
    let mut seen = Vec::new();
    let report = warmup(&mut model, &mut opt, &schedule, 1, |m, o| {
        seen.push(state(m, o));
        step(m, o, &data, 1)
    })
    .unwrap();
    // The fp8 step must not start from the mxfp4 step's update: that would
    // keep a second copy of every parameter on the device during it.
    assert_eq!(seen.len(), 2, "one step per recipe");
    assert!(
        seen.iter().all(|s| *s == before),
        "each warm-up step starts from the parameters and moments of the start"
    );
    assert_eq!(
        report
            .runs
            .iter()
            .map(|(k, _)| k.name())
            .collect::<Vec<_>>(),
        ["mxfp4", "fp8"]
    );
    // 24 linears, each one forward and one backward.
    assert!(report.runs.iter().all(|(_, n)| *n == 48), "{report}");
    assert_eq!(
        state(&mut model, &opt),
        before,
        "warm-up must restore parameters and optimizer state"
    );
    assert_eq!(
        model.apply(1).changed,
        0,
        "warm-up leaves the schedule's recipes of the start iteration"
    );
}

#[test]
fn warmup_fails_when_a_recipe_never_ran() {
    let Setup {
        mut model,
        mut opt,
        data: _,
        schedule,
    } = setup();
    // A "training step" that never reaches the quantized linears.
    let err = warmup(&mut model, &mut opt, &schedule, 0, |_, _| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no `mxfp4` linear kernel ran"), "{err}");
}

#[test]
fn a_switch_touches_only_the_recipes_and_changes_the_output() {
    let Setup {
        mut model,
        mut opt,
        data,
        schedule,
    } = setup();
    model.apply_with(&schedule, 0).unwrap();
    for it in 0..3 {
        step(&mut model, &mut opt, &data, it).unwrap(); // the zero-initialized output layer moves
    }
    let before = state(&mut model, &opt);
    let y_mx = output(&model, &data, 9).unwrap().to_vec_f32().unwrap();
    let report = model.apply_with(&schedule, 40).unwrap();
    assert_eq!(
        report.to_string(),
        "4/4 layers (24/24 linears) now fp8 at iteration 40"
    );
    assert_eq!(
        state(&mut model, &opt),
        before,
        "apply must not touch parameters, ids or optimizer state"
    );
    let y_fp8 = output(&model, &data, 9).unwrap().to_vec_f32().unwrap();
    assert_ne!(y_mx, y_fp8, "the flip must change which kernels run");
    model.apply_with(&schedule, 0).unwrap();
    assert_eq!(
        output(&model, &data, 9).unwrap().to_vec_f32().unwrap(),
        y_mx,
        "back at 0, mxfp4 again"
    );
}
