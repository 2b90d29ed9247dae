//! Flux weights in Black Forest Labs' naming (issue 16): `train --init-from`
//! and `mxswitch export`, against a fixture that
//! `tests/fixtures/make_flux_weights.py` wrote from upstream's module
//! definitions (not from our mapping), for `tests/configs/flux-micro.ron`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mxswitch::models::flux::{Flux, RunConfig};
use mxswitch::runtime::module::{allocate, allocated, try_visit_params};
use mxswitch::runtime::optim::{AdamW, AdamWConfig};
use mxswitch::st_file::{self, OwnedTensor};
use mxswitch::train::{
    export, read_checkpoint, save_checkpoint, train, ExportDType, FluxWeights, RunFlags, RunRecord,
    TrainOptions,
};
use safetensors::tensor::Dtype;

const FIXTURE: &str = "tests/fixtures/flux-micro-bfl.safetensors";
const CONFIG: &str = "tests/configs/flux-micro.ron";

fn micro() -> RunConfig {
    RunConfig::load(CONFIG).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "mxswitch-flux-weights-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn options(out: &Path, iters: u64, init_from: Option<&Path>) -> TrainOptions {
    TrainOptions {
        iters: Some(iters),
        init_from: init_from.map(Path::to_path_buf),
        ..TrainOptions::new(micro(), out)
    }
}

/// Every parameter of an allocated model, by path, as f32 bits.
fn param_bits(model: &mut Flux) -> HashMap<String, Vec<u32>> {
    let mut out = HashMap::new();
    try_visit_params(model, |slot| {
        let v = allocated(&slot)?.to_vec_f32()?;
        out.insert(slot.path.clone(), v.iter().map(|x| x.to_bits()).collect());
        Ok(())
    })
    .unwrap();
    out
}

/// A micro model holding the weights of `file`.
fn model_from(file: &Path) -> Flux {
    let cfg = micro();
    let mut model = Flux::new(&cfg.model);
    allocate(&mut model, 0).unwrap();
    FluxWeights::read(file, &cfg.model)
        .unwrap()
        .put_into(&mut model)
        .unwrap();
    model
}

/// The tensors of a safetensors file by name: dtype, shape and bytes.
fn tensors_of(file: &Path) -> HashMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(file).unwrap();
    let (tensors, _) = st_file::parse(&bytes).unwrap();
    tensors
        .into_iter()
        .map(|t| (t.name, (t.dtype, t.shape, t.data.to_vec())))
        .collect()
}

/// The fixture with `edit` applied to its tensor list, written to `out`.
fn edited_fixture(out: &Path, edit: impl FnOnce(&mut Vec<OwnedTensor>)) {
    let mut list: Vec<_> = tensors_of(Path::new(FIXTURE))
        .into_iter()
        .map(|(n, (d, s, b))| (n, d, s, b))
        .collect();
    edit(&mut list);
    let f = std::fs::File::create(out).unwrap();
    st_file::write_owned(f, &list, &HashMap::new()).unwrap();
}

#[test]
fn the_fixture_exports_back_to_its_own_bytes() {
    let dir = tmp("fixture");
    let cfg = micro();
    let mut model = model_from(Path::new(FIXTURE));
    // A checkpoint at iteration 0 holding exactly the fixture's weights.
    let flags = RunFlags {
        config: Some(&cfg),
        iters: None,
        switch_at: None,
        seed: None,
    };
    let run = RunRecord::new(&flags, AdamWConfig::default(), 1.0).unwrap();
    let ckpt = dir.join("checkpoint.safetensors");
    let opt = AdamW::new(AdamWConfig::default()).unwrap();
    save_checkpoint(
        &ckpt,
        &mut model,
        &opt,
        0,
        0,
        &serde_json::to_string(&run).unwrap(),
    )
    .unwrap();
    let out = dir.join("flux.safetensors");
    export(&ckpt, &out, ExportDType::BF16).unwrap();
    let (want, got) = (tensors_of(Path::new(FIXTURE)), tensors_of(&out));
    let mut names: Vec<_> = got.keys().collect();
    names.sort();
    let mut fixture_names: Vec<_> = want.keys().collect();
    fixture_names.sort();
    assert_eq!(names, fixture_names);
    for (name, t) in &want {
        assert_eq!(&got[name], t, "tensor {name}");
    }
}

#[test]
fn an_f32_export_reads_back_bit_for_bit() {
    let dir = tmp("f32");
    let trained = train(&options(&dir, 2, None)).unwrap();
    let out = dir.join("flux.safetensors");
    export(&trained.checkpoint, &out, ExportDType::F32).unwrap();
    let ckpt = read_checkpoint(&trained.checkpoint, u64::MAX).unwrap();
    let want: HashMap<String, Vec<u32>> = ckpt
        .params()
        .into_iter()
        .map(|(n, (_, v))| (n, v.iter().map(|x| x.to_bits()).collect()))
        .collect();
    assert_eq!(param_bits(&mut model_from(&out)), want);
    // And a BF16 export is each weight rounded to nearest even.
    let bf = dir.join("flux-bf16.safetensors");
    export(&trained.checkpoint, &bf, ExportDType::BF16).unwrap();
    let rounded = param_bits(&mut model_from(&bf));
    for (name, bits) in &want {
        let r: Vec<u32> = bits
            .iter()
            .map(|&b| (mxswitch::runtime::formats::bf16::from_f32(f32::from_bits(b)) as u32) << 16)
            .collect();
        assert_eq!(&rounded[name], &r, "{name}");
    }
}

#[test]
fn init_from_trains_from_the_file_s_weights() {
    let (a, b, c) = (tmp("init-a"), tmp("init-b"), tmp("init-c"));
    let from_file = train(&options(&a, 1, Some(Path::new(FIXTURE)))).unwrap();
    let again = train(&options(&b, 1, Some(Path::new(FIXTURE)))).unwrap();
    let seeded = train(&options(&c, 1, None)).unwrap();
    assert_eq!(from_file.metrics[0].loss, again.metrics[0].loss);
    assert_ne!(from_file.metrics[0].loss, seeded.metrics[0].loss);
}

/// `train --init-from` with `file` fails with `want` in its message, and
/// creates no output folder.
fn refused(file: &Path, want: &str) {
    let out = file.with_extension("out");
    let e = train(&options(&out, 1, Some(file)))
        .unwrap_err()
        .to_string();
    assert!(e.contains(want), "{e}");
    assert!(!e.contains('\n'), "{e}");
    assert!(!out.exists(), "{} was created", out.display());
}

#[test]
fn bad_weights_files_are_named_in_one_line_before_any_output() {
    let dir = tmp("bad");
    let f = dir.join("missing.safetensors");
    edited_fixture(&f, |l| l.retain(|t| t.0 != "single_blocks.0.linear2.bias"));
    refused(&f, "tensor `single_blocks.0.linear2.bias` is missing");
    let f = dir.join("extra.safetensors");
    edited_fixture(&f, |l| {
        l.push(("vae.decoder".into(), Dtype::BF16, vec![1], vec![0, 0]))
    });
    refused(&f, "tensor `vae.decoder` is not a tensor of this model");
    let f = dir.join("misshapen.safetensors");
    edited_fixture(&f, |l| {
        let t = l.iter_mut().find(|t| t.0 == "img_in.weight").unwrap();
        t.2 = vec![t.2[1], t.2[0]];
    });
    refused(
        &f,
        "tensor `img_in.weight` has shape [16, 32], but this model needs [32, 16]",
    );
    let f = dir.join("f16.safetensors");
    edited_fixture(&f, |l| {
        l.iter_mut().find(|t| t.0 == "txt_in.bias").unwrap().1 = Dtype::F16
    });
    refused(
        &f,
        "tensor `txt_in.bias` is F16; Flux weights are read as F32 or BF16",
    );
    let f = dir.join("text.safetensors");
    std::fs::write(&f, "not weights").unwrap();
    refused(&f, "not a safetensors file");
    refused(&dir.join("absent.safetensors"), "absent.safetensors");
}

#[test]
fn init_from_and_resume_are_refused_together() {
    let dir = tmp("both");
    let first = train(&options(&dir.join("run"), 1, None)).unwrap();
    let mut o = options(&dir.join("run"), 2, Some(Path::new(FIXTURE)));
    o.resume = Some(first.checkpoint);
    let e = train(&o).unwrap_err().to_string();
    assert!(e.contains("--init-from starts a new run"), "{e}");
}

#[test]
fn export_refuses_its_own_checkpoint_and_a_bad_one_without_writing() {
    let dir = tmp("export");
    let trained = train(&options(&dir.join("run"), 1, None)).unwrap();
    let e = export(&trained.checkpoint, &trained.checkpoint, ExportDType::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("is the checkpoint itself"), "{e}");
    let out = dir.join("out.safetensors");
    let e = export(Path::new(FIXTURE), &out, ExportDType::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("metadata `iteration` is missing"), "{e}");
    assert!(!out.exists());
}
