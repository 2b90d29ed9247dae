//! Precomputed Flux data in safetensors shards (`train --data` and
//! `--val-data`): the checks of a folder of shards, the training stream
//! (epochs, seeds, resume), the validation set and the synthetic writer,
//! on flux-tiny's shapes (latent [N, 16, 8, 8], txt [N, 8, 64], vec [N, 32]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mxswitch::models::flux::{Batch, RunConfig};
use mxswitch::runtime::formats::bf16;
use mxswitch::runtime::module::SplitMix64;
use mxswitch::runtime::{DType, Tensor};
use mxswitch::st_file::{self, OwnedTensor};
use mxswitch::train::shards::{
    write_synthetic_shards, Role, ShardDType, ShardSet, SyntheticShards, TrainShards, ValShards,
};
use safetensors::tensor::Dtype;

fn tiny() -> RunConfig {
    RunConfig::load("flux-tiny").unwrap()
}

const LATENT: usize = 16 * 8 * 8;
const TXT: usize = 8 * 64;
const VEC: usize = 32;

/// Values of one sample's keys: latent, txt, vec.
struct Values {
    latent: Vec<f32>,
    txt: Vec<f32>,
    vec: Vec<f32>,
}

/// `n` samples of seeded normal values; `vec[0]` of sample i is `id0 + i`,
/// so a batch's `y` tells which samples it holds.
fn values(n: usize, id0: usize, seed: u64) -> Values {
    let mut rng = SplitMix64::new(seed);
    let mut draw = |len: usize| (0..len).map(|_| rng.normal()).collect::<Vec<f32>>();
    let (latent, txt, mut vec) = (draw(n * LATENT), draw(n * TXT), draw(n * VEC));
    for i in 0..n {
        vec[i * VEC] = (id0 + i) as f32;
    }
    Values { latent, txt, vec }
}

fn bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The three float keys of `n` samples, as F32.
fn float_keys(n: usize, v: &Values) -> Vec<OwnedTensor> {
    vec![
        (
            "latent".into(),
            Dtype::F32,
            vec![n, 16, 8, 8],
            bytes_f32(&v.latent),
        ),
        ("txt".into(), Dtype::F32, vec![n, 8, 64], bytes_f32(&v.txt)),
        ("vec".into(), Dtype::F32, vec![n, 32], bytes_f32(&v.vec)),
    ]
}

fn ids_i64(ids: &[i64]) -> OwnedTensor {
    let bytes = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    ("timestep_id".into(), Dtype::I64, vec![ids.len()], bytes)
}

fn write(path: &Path, tensors: &[OwnedTensor]) {
    let mut bytes = Vec::new();
    st_file::write_owned(&mut bytes, tensors, &HashMap::new()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A good training shard of `n` samples with ids from `id0`.
fn good(path: &Path, n: usize, id0: usize) {
    write(path, &float_keys(n, &values(n, id0, id0 as u64 + 1)));
}

fn open(dir: &Path, role: Role) -> mxswitch::runtime::Result<ShardSet> {
    let cfg = tiny();
    ShardSet::open(dir, &cfg.model, &cfg.data, role)
}

fn open_err(dir: &Path, role: Role) -> String {
    let e = open(dir, role).unwrap_err().to_string();
    assert!(!e.contains('\n'), "not one line: {e}");
    e
}

fn same(a: &Batch, b: &Batch) -> bool {
    let bits = |t: &Tensor| -> Vec<u32> {
        t.to_vec_f32()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    a.timesteps == b.timesteps
        && a.patches_hw == b.patches_hw
        && bits(&a.img) == bits(&b.img)
        && bits(&a.txt) == bits(&b.txt)
        && bits(&a.y) == bits(&b.y)
        && bits(&a.target) == bits(&b.target)
}

/// The sample ids a batch holds (from `vec[0]`).
fn ids(b: &Batch) -> Vec<usize> {
    b.y.to_vec_f32()
        .unwrap()
        .chunks(VEC)
        .map(|r| r[0] as usize)
        .collect()
}

#[test]
fn a_bad_shard_is_one_line_naming_the_file_and_the_key() {
    type Edit = fn(&mut Vec<OwnedTensor>);
    let cases: Vec<(Role, Edit, &str)> = vec![
        (
            Role::Train,
            |t| t[1].2 = vec![4, 8, 32],
            "key `txt` has shape [4, 8, 32], expected [N, 8, 64]: dimension 2 is 32, but model.context_in_dim is 64",
        ),
        (
            Role::Train,
            |t| t[0].2 = vec![4, 16, 4, 16],
            "key `latent` has shape [4, 16, 4, 16], expected [N, 16, 8, 8]: dimension 2 is 4, but data.latent_height is 8",
        ),
        (
            Role::Train,
            |t| t[2].2 = vec![128],
            "key `vec` has shape [128], expected [N, 32] (N samples by model.vec_in_dim = 32): it has 1 dimensions, not 2",
        ),
        (
            Role::Train,
            |t| t[0].1 = Dtype::I32,
            "key `latent` is I32, expected a float dtype: F32, BF16, F16 or F64",
        ),
        (
            Role::Train,
            |t| {
                t.remove(2);
            },
            "key `vec` is missing (a shard holds `latent`, `txt` and `vec`)",
        ),
        (
            Role::Train,
            |t| {
                t[1].2 = vec![5, 8, 64];
            },
            "key `txt` holds 5 samples (dimension 0) but `latent` holds 4: every key has one row per sample",
        ),
        (
            Role::Train,
            |t| {
                t[2].2 = vec![2, 32];
            },
            "key `vec` holds 2 samples (dimension 0) but `latent` holds 4",
        ),
        (
            Role::Val,
            |_| {},
            "key `timestep_id` is missing (a shard holds `latent`, `txt`, `vec` and `timestep_id`)",
        ),
        (
            Role::Val,
            |t| t.push(ids_i64(&[0, 7, 8, 1])),
            "key `timestep_id`, sample 2: it is 8, expected a whole number 0..=7",
        ),
        (
            Role::Val,
            |t| t.push(ids_i64(&[0, -1, 3, 1])),
            "key `timestep_id`, sample 1: it is -1, expected a whole number 0..=7",
        ),
        (
            Role::Val,
            |t| {
                let v = bytes_f32(&[0.0, 1.0, 2.5, 3.0]);
                t.push(("timestep_id".into(), Dtype::F32, vec![4], v));
            },
            "key `timestep_id`, sample 2: it is 2.5",
        ),
        (
            Role::Val,
            |t| t.push(("timestep_id".into(), Dtype::BOOL, vec![4], vec![0; 4])),
            "key `timestep_id` is BOOL, expected an integer dtype",
        ),
        (
            Role::Val,
            |t| t.push(ids_i64(&[0, 1, 2])),
            "key `timestep_id` holds 3 samples (dimension 0) but `latent` holds 4",
        ),
    ];
    for (role, edit, needle) in cases {
        let dir = tempfile::tempdir().unwrap();
        // A good shard first: the error names the bad one.
        good(&dir.path().join("a.safetensors"), 3, 0);
        let mut t = float_keys(4, &values(4, 3, 9));
        if role == Role::Val {
            // The good shard needs ids too, except in the cases about them.
            let mut a = float_keys(3, &values(3, 0, 1));
            a.push(ids_i64(&[0, 1, 2]));
            write(&dir.path().join("a.safetensors"), &a);
        }
        edit(&mut t);
        // Keep each tensor's bytes the size its (edited) dtype and shape need.
        for (_, dtype, shape, bytes) in &mut t {
            bytes.resize(shape.iter().product::<usize>() * dtype.size(), 0);
        }
        let bad = dir.path().join("b.safetensors");
        write(&bad, &t);
        let e = open_err(dir.path(), role);
        let prefix = format!("data shard {}: ", bad.display());
        assert!(e.starts_with(&prefix), "{e}");
        assert!(e.contains(needle), "`{needle}` not in `{e}`");
    }
}

#[test]
fn extra_keys_other_files_and_float_ids_are_fine() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = float_keys(4, &values(4, 0, 1));
    t.push(("caption_ids".into(), Dtype::I32, vec![4, 3], vec![0; 48]));
    t.push((
        "timestep_id".into(),
        Dtype::BF16,
        vec![4],
        [0.0f32, 7.0, 3.0, 1.0]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    ));
    write(&dir.path().join("x.safetensors"), &t);
    std::fs::write(dir.path().join("README.txt"), "not a shard").unwrap();
    std::fs::write(dir.path().join("._x.safetensors"), "macOS resource fork").unwrap();
    assert_eq!(open(dir.path(), Role::Train).unwrap().len(), 4);
    let val = ValShards::new(open(dir.path(), Role::Val).unwrap()).unwrap();
    let b = val.batches(8, DType::F32).next().unwrap().unwrap();
    assert_eq!(b.timesteps, [0.0, 7.0 / 8.0, 3.0 / 8.0, 1.0 / 8.0]);
}

#[test]
fn a_truncated_or_foreign_file_is_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.safetensors");
    good(&p, 3, 0);
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let e = open_err(dir.path(), Role::Train);
    assert_eq!(
        e,
        format!(
            "data shard {}: not a safetensors file: its data section does not match the sizes in its header (truncated, or trailing bytes)",
            p.display()
        )
    );
    std::fs::write(&p, "hello, this is a text file and not safetensors").unwrap();
    let e = open_err(dir.path(), Role::Train);
    assert!(
        e.starts_with(&format!(
            "data shard {}: not a safetensors file: ",
            p.display()
        )),
        "{e}"
    );
    std::fs::write(&p, [1, 2, 3]).unwrap();
    let e = open_err(dir.path(), Role::Train);
    assert!(
        e.ends_with("it is 3 bytes long, too short for the 8-byte header size"),
        "{e}"
    );
}

#[test]
fn an_empty_or_missing_folder_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
    assert_eq!(
        open_err(dir.path(), Role::Train),
        format!(
            "data folder {}: it holds no `*.safetensors` shards",
            dir.path().display()
        )
    );
    let missing = dir.path().join("nope");
    assert_eq!(
        open_err(&missing, Role::Train),
        format!("data folder {}: it does not exist", missing.display())
    );
    let file = dir.path().join("notes.txt");
    assert_eq!(
        open_err(&file, Role::Train),
        format!("data folder {}: it is not a folder", file.display())
    );
}

/// Policy: a shard of N = 0 is accepted and adds nothing; a set of no
/// samples at all is refused.
#[test]
fn empty_shards_add_nothing_and_an_empty_set_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    good(&dir.path().join("a.safetensors"), 0, 0);
    assert_eq!(
        open_err(dir.path(), Role::Train),
        format!(
            "data folder {}: its one shard holds no samples (N = 0)",
            dir.path().display()
        )
    );
    good(&dir.path().join("b.safetensors"), 3, 0);
    good(&dir.path().join("c.safetensors"), 0, 0);
    good(&dir.path().join("d.safetensors"), 2, 3);
    let set = open(dir.path(), Role::Train).unwrap();
    assert_eq!((set.len(), set.shards()), (5, 4));
    let data = TrainShards::new(set, 0, 5).unwrap();
    let mut got = ids(&data.batch(0, DType::F32).unwrap());
    got.sort();
    assert_eq!(got, [0, 1, 2, 3, 4]);
}

#[test]
fn a_non_finite_value_fails_the_batch_naming_file_key_and_sample() {
    let dir = tempfile::tempdir().unwrap();
    good(&dir.path().join("a.safetensors"), 2, 0);
    let mut v = values(4, 2, 5);
    v.txt[3 * TXT + 17] = f32::NAN;
    let mut t = float_keys(4, &v);
    t.push(ids_i64(&[0, 1, 2, 3]));
    let bad = dir.path().join("b.safetensors");
    write(&bad, &t);
    let mut a = float_keys(2, &values(2, 0, 1));
    a.push(ids_i64(&[0, 1]));
    write(&dir.path().join("a.safetensors"), &a);
    // Found when the sample is read, not when the set is opened.
    let val = ValShards::new(open(dir.path(), Role::Val).unwrap()).unwrap();
    let results: Vec<_> = val.batches(2, DType::F32).collect();
    assert!(results[0].is_ok() && results[1].is_ok());
    let e = results[2].as_ref().unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "data shard {}: key `txt`, sample 3: element 17 is NaN; the data must be finite",
            bad.display()
        )
    );
    // An F64 value past f32's range is not finite in f32.
    let mut t = float_keys(1, &values(1, 0, 1));
    let mut big = vec![0u8; VEC * 8];
    big[8 * 4..8 * 5].copy_from_slice(&1e300f64.to_le_bytes());
    t[2] = ("vec".into(), Dtype::F64, vec![1, 32], big);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.safetensors");
    write(&p, &t);
    let data = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 0, 1).unwrap();
    let e = data.batch(0, DType::F32).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "data shard {}: key `vec`, sample 0: element 4 is inf in f32 (out of its range); the data must be finite",
            p.display()
        )
    );
}

#[test]
fn a_file_that_changed_after_open_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.safetensors");
    good(&p, 4, 0);
    let data = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 0, 2).unwrap();
    data.batch(0, DType::F32).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let e = data.batch(1, DType::F32).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "data shard {}: the file changed after the set was opened ({len} bytes then, {} now); restart so it is checked again",
            p.display(),
            len / 2
        )
    );
    // Replaced by another file of the same size.
    good(&p, 4, 0);
    let data = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 0, 2).unwrap();
    let other = dir.path().join("other");
    good(&other, 4, 10);
    std::fs::rename(&other, &p).unwrap();
    let e = data.batch(0, DType::F32).unwrap_err().to_string();
    assert!(e.contains("it was modified or replaced"), "{e}");
    std::fs::remove_file(&p).unwrap();
    let e = data.batch(0, DType::F32).unwrap_err().to_string();
    assert!(e.contains("(it no longer exists)"), "{e}");
}

/// Three shards of 4, 1 and 5 samples: each epoch of the stream visits all
/// ten once, and the epochs' orders differ.
#[test]
fn one_epoch_visits_every_sample_once_and_epochs_differ() {
    let dir = tempfile::tempdir().unwrap();
    good(&dir.path().join("a.safetensors"), 4, 0);
    good(&dir.path().join("b.safetensors"), 1, 4);
    good(&dir.path().join("c.safetensors"), 5, 5);
    let data = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 11, 3).unwrap();
    // 10 steps of 3: three whole epochs, batches crossing their ends.
    let stream: Vec<usize> = (0..10)
        .flat_map(|s| ids(&data.batch(s, DType::F32).unwrap()))
        .collect();
    let epochs: Vec<&[usize]> = stream.chunks(10).take(3).collect();
    for e in &epochs {
        let mut sorted = e.to_vec();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>(), "{stream:?}");
    }
    assert_ne!(epochs[0], epochs[1]);
    assert_ne!(epochs[1], epochs[2]);
    assert_ne!(epochs[0], (0..10).collect::<Vec<_>>(), "not shuffled");
    assert_eq!(data.position(0), (0, 0));
    assert_eq!(data.position(3), (0, 9));
    assert_eq!(data.position(4), (1, 12));
    assert_eq!(data.position(10), (3, 30));
}

/// The resume property: the batch of a step depends only on (seed, step),
/// not on the open, the order of the calls or earlier batches.
#[test]
fn the_same_seed_gives_bit_identical_batches_and_another_seed_differs() {
    let dir = tempfile::tempdir().unwrap();
    good(&dir.path().join("a.safetensors"), 5, 0);
    good(&dir.path().join("b.safetensors"), 4, 5);
    let a = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 7, 4).unwrap();
    let b = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 7, 4).unwrap();
    let c = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 8, 4).unwrap();
    let forward: Vec<Batch> = (0..6).map(|s| a.batch(s, DType::F32).unwrap()).collect();
    for s in (0..6).rev() {
        assert!(
            same(&forward[s as usize], &b.batch(s, DType::F32).unwrap()),
            "step {s}"
        );
    }
    // A resume at step 4 (fresh stream, no earlier batch built).
    let resumed = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 7, 4).unwrap();
    assert!(same(&forward[4], &resumed.batch(4, DType::F32).unwrap()));
    for s in 0..6 {
        let other = c.batch(s, DType::F32).unwrap();
        assert!(!same(&forward[s as usize], &other), "step {s}");
        assert_ne!(forward[s as usize].timesteps, other.timesteps);
    }
    // Different steps differ too, and t is in (0, 1).
    assert!(!same(&forward[0], &forward[1]));
    assert!(forward
        .iter()
        .flat_map(|b| &b.timesteps)
        .all(|&t| t > 0.0 && t < 1.0));
}

#[test]
fn batches_come_in_the_activation_dtype_with_an_f32_target() {
    let dir = tempfile::tempdir().unwrap();
    good(&dir.path().join("a.safetensors"), 5, 0);
    let data = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 1, 2).unwrap();
    let (f, h) = (
        data.batch(3, DType::F32).unwrap(),
        data.batch(3, DType::BF16).unwrap(),
    );
    assert_eq!(f.img.dims(), [2, 16, 64]);
    assert_eq!(f.txt.dims(), [2, 8, 64]);
    assert_eq!(f.y.dims(), [2, 32]);
    assert_eq!(f.patches_hw, (4, 4));
    for (x, y) in [(&f.img, &h.img), (&f.txt, &h.txt), (&f.y, &h.y)] {
        assert_eq!(y.dtype(), DType::BF16);
        assert_eq!(
            x.to_dtype(DType::BF16).unwrap().to_vec_bf16_bits().unwrap(),
            y.to_vec_bf16_bits().unwrap()
        );
    }
    assert_eq!(h.target.dtype(), DType::F32);
    assert_eq!(
        f.target.to_vec_f32().unwrap(),
        h.target.to_vec_f32().unwrap()
    );
}

/// The same values in F32, F64 and (rounded to F16 first) F16 files give
/// the same batches: every float dtype is read exactly.
#[test]
fn every_float_dtype_reads_the_same_values() {
    let mut v = values(3, 0, 4);
    for x in v.latent.iter_mut().chain(&mut v.txt).chain(&mut v.vec) {
        *x = half::f16::from_f32(*x).to_f32();
    }
    let f32_keys = float_keys(3, &v);
    let batch_of = |tensors: &[OwnedTensor]| {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("s.safetensors"), tensors);
        let data = TrainShards::new(open(dir.path(), Role::Train).unwrap(), 2, 3).unwrap();
        data.batch(1, DType::F32).unwrap()
    };
    let base = batch_of(&f32_keys);
    for dtype in [Dtype::F64, Dtype::F16] {
        let keys: Vec<OwnedTensor> = f32_keys
            .iter()
            .map(|(name, _, shape, bytes)| {
                let vals = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()));
                let data: Vec<u8> = match dtype {
                    Dtype::F64 => vals.flat_map(|x| (x as f64).to_le_bytes()).collect(),
                    _ => vals
                        .flat_map(|x| half::f16::from_f32(x).to_le_bytes())
                        .collect(),
                };
                (name.clone(), dtype, shape.clone(), data)
            })
            .collect();
        assert!(same(&base, &batch_of(&keys)), "{dtype:?}");
    }
}

fn synthetic(samples: u64, shards: usize, val: bool, dtype: ShardDType) -> SyntheticShards {
    SyntheticShards {
        samples,
        shards,
        seed: 5,
        val,
        dtype,
        overwrite: false,
    }
}

/// Samples with timestep_id 0 are evaluated at t = 0, so their `img` is x0
/// itself: there a BF16 set must show exactly the F32 set's latents rounded,
/// and everywhere its text and vectors.
#[test]
fn a_bf16_dataset_reads_as_the_f32_one_rounded() {
    let cfg = tiny();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let sets: Vec<ValShards> = [ShardDType::F32, ShardDType::BF16]
        .into_iter()
        .zip(&dirs)
        .map(|(dtype, dir)| {
            let s = synthetic(24, 3, true, dtype);
            write_synthetic_shards(dir.path(), &cfg.model, &cfg.data, &s).unwrap();
            ValShards::new(open(dir.path(), Role::Val).unwrap()).unwrap()
        })
        .collect();
    let (f, b) = (
        sets[0].batches(24, DType::F32).next().unwrap().unwrap(),
        sets[1].batches(24, DType::F32).next().unwrap().unwrap(),
    );
    let round = |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(bf16::round).collect() };
    assert_eq!(
        round(f.txt.to_vec_f32().unwrap()),
        b.txt.to_vec_f32().unwrap()
    );
    assert_eq!(round(f.y.to_vec_f32().unwrap()), b.y.to_vec_f32().unwrap());
    let (fi, bi) = (f.img.to_vec_f32().unwrap(), b.img.to_vec_f32().unwrap());
    let mut checked = 0;
    for (i, (fr, br)) in fi.chunks(16 * 64).zip(bi.chunks(16 * 64)).enumerate() {
        if f.timesteps[i] == 0.0 {
            assert_eq!(round(fr.to_vec()), br, "sample {i}");
            assert_ne!(fr, br, "sample {i}: the F32 set is already BF16");
            checked += 1;
        }
    }
    assert_eq!(checked, 3);
    assert_ne!(sets[0].set().fingerprint(), sets[1].set().fingerprint());
}

/// A validation set of 10 in batches of 4: 4, 4 and 2 samples at
/// t = timestep_id / 8, with the same noise in every open and whatever the
/// batch size (a sample's noise comes from its index alone).
type Part = fn(&Batch) -> &Tensor;

fn img(b: &Batch) -> &Tensor {
    &b.img
}

fn target(b: &Batch) -> &Tensor {
    &b.target
}

/// One part of batches, concatenated, as bits.
fn flat(bs: &[Batch], f: Part) -> Vec<u32> {
    bs.iter()
        .flat_map(|b| f(b).to_vec_f32().unwrap())
        .map(f32::to_bits)
        .collect()
}

#[test]
fn val_batches_are_fixed_by_the_sample_index() {
    let dir = tempfile::tempdir().unwrap();
    let id_list = [3i64, 0, 7, 7, 1, 2, 6, 5, 4, 0];
    let mut a = float_keys(6, &values(6, 0, 1));
    a.push(ids_i64(&id_list[..6]));
    write(&dir.path().join("a.safetensors"), &a);
    let mut b = float_keys(4, &values(4, 6, 2));
    b.push(ids_i64(&id_list[6..]));
    write(&dir.path().join("b.safetensors"), &b);
    let val = ValShards::new(open(dir.path(), Role::Val).unwrap()).unwrap();
    assert_eq!(val.len(), 10);
    let by4: Vec<Batch> = val.batches(4, DType::F32).map(|b| b.unwrap()).collect();
    let sizes: Vec<usize> = by4.iter().map(|b| b.timesteps.len()).collect();
    assert_eq!(sizes, [4, 4, 2]);
    let ts: Vec<f32> = by4.iter().flat_map(|b| b.timesteps.clone()).collect();
    let want: Vec<f32> = id_list.iter().map(|&i| i as f32 / 8.0).collect();
    assert_eq!(ts, want);
    let order: Vec<usize> = by4.iter().flat_map(ids).collect();
    assert_eq!(order, (0..10).collect::<Vec<_>>());
    // One batch of all, and batches of 3 from another open, agree per sample.
    let again = ValShards::new(open(dir.path(), Role::Val).unwrap()).unwrap();
    let whole = again.batches(100, DType::F32).next().unwrap().unwrap();
    let by3: Vec<Batch> = again.batches(3, DType::F32).map(|b| b.unwrap()).collect();
    assert_eq!(by3.len(), 4);
    for f in [img as Part, target] {
        let one = flat(std::slice::from_ref(&whole), f);
        assert_eq!(flat(&by4, f), one);
        assert_eq!(flat(&by3, f), one);
    }
    // A second pass over the same open is the same too.
    let second: Vec<Batch> = val.batches(4, DType::F32).map(|b| b.unwrap()).collect();
    assert_eq!(flat(&second, target), flat(&by4, target));
    assert!(val.batches(0, DType::F32).next().unwrap().is_err());
    assert_eq!(val.batches(0, DType::F32).count(), 1);
    // A training set is no validation set.
    let e = ValShards::new(open(dir.path(), Role::Train).unwrap()).unwrap_err();
    assert!(e.to_string().contains("opened as training data"), "{e}");
}

#[test]
fn written_shards_open_as_train_and_val_sets_and_are_not_overwritten() {
    let cfg = tiny();
    let root = tempfile::tempdir().unwrap();
    let (train_dir, val_dir) = (root.path().join("train"), root.path().join("val"));
    let w = |dir: &Path, s: SyntheticShards| write_synthetic_shards(dir, &cfg.model, &cfg.data, &s);
    let written = w(&train_dir, synthetic(30, 4, false, ShardDType::F32)).unwrap();
    let names: Vec<PathBuf> = (0..4)
        .map(|i| train_dir.join(format!("shard-0000{i}.safetensors")))
        .collect();
    let counts: Vec<u64> = written.written.iter().map(|(_, n)| *n).collect();
    assert_eq!(counts, [7, 8, 7, 8]);
    let paths: Vec<PathBuf> = written.written.into_iter().map(|(p, _)| p).collect();
    assert_eq!(paths, names);
    assert!(written.removed.is_empty());
    w(&val_dir, synthetic(16, 2, true, ShardDType::BF16)).unwrap();
    let train = open(&train_dir, Role::Train).unwrap();
    assert_eq!((train.len(), train.shards()), (30, 4));
    let e = open_err(&train_dir, Role::Val);
    assert!(e.contains("key `timestep_id` is missing"), "{e}");
    let val = ValShards::new(open(&val_dir, Role::Val).unwrap()).unwrap();
    let b = val.batches(16, DType::F32).next().unwrap().unwrap();
    let want: Vec<f32> = (0..16).map(|i| (i % 8) as f32 / 8.0).collect();
    assert_eq!(b.timesteps, want);

    // Refused without overwrite, the files untouched.
    let fingerprint = train.fingerprint();
    let e = w(&train_dir, synthetic(8, 2, false, ShardDType::F32))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "data folder {}: it already holds shards (shard-00000.safetensors, shard-00001.safetensors, shard-00002.safetensors, shard-00003.safetensors); give --overwrite to replace them",
            train_dir.display()
        )
    );
    assert_eq!(
        open(&train_dir, Role::Train).unwrap().fingerprint(),
        fingerprint
    );
    // With overwrite the folder holds exactly the new set.
    let mut s = synthetic(8, 2, false, ShardDType::F32);
    s.overwrite = true;
    let again = w(&train_dir, s).unwrap();
    assert_eq!(again.removed, names[2..]);
    let train = open(&train_dir, Role::Train).unwrap();
    assert_eq!((train.len(), train.shards()), (8, 2));
    assert_ne!(train.fingerprint(), fingerprint);
    let left: Vec<String> = std::fs::read_dir(&train_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");

    for (samples, shards) in [(0, 1), (3, 4), (5, 0)] {
        let e = w(
            &root.path().join("x"),
            synthetic(samples, shards, false, ShardDType::F32),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("at least one sample per shard"), "{e}");
    }
}

/// The written data has the structure the model can learn: each class's
/// samples share text and vector, and their latents sit near one pattern.
#[test]
fn written_samples_are_their_class_pattern_plus_a_little_noise() {
    let cfg = tiny();
    let dir = tempfile::tempdir().unwrap();
    write_synthetic_shards(
        dir.path(),
        &cfg.model,
        &cfg.data,
        &synthetic(64, 1, true, ShardDType::F32),
    )
    .unwrap();
    let val = ValShards::new(open(dir.path(), Role::Val).unwrap()).unwrap();
    let b = val.batches(64, DType::F32).next().unwrap().unwrap();
    let (img, y) = (b.img.to_vec_f32().unwrap(), b.y.to_vec_f32().unwrap());
    // Group the t = 0 samples (img = x0) by their pooled vector.
    let mut classes: HashMap<Vec<u32>, Vec<&[f32]>> = HashMap::new();
    for i in (0..64).filter(|i| b.timesteps[*i] == 0.0) {
        let key = y[i * VEC..(i + 1) * VEC]
            .iter()
            .map(|v| v.to_bits())
            .collect();
        classes
            .entry(key)
            .or_default()
            .push(&img[i * LATENT..(i + 1) * LATENT]);
    }
    let groups: Vec<&Vec<&[f32]>> = classes.values().filter(|g| g.len() > 1).collect();
    assert!(!groups.is_empty(), "no class seen twice among 8 samples");
    for g in groups {
        let far = g[0]
            .iter()
            .zip(g[1])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(far > 0.0 && far < 0.5, "{far}");
    }
    assert!(classes.len() > 1, "one class only");
}

#[test]
fn the_fingerprint_is_stable_and_sees_names_sizes_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    good(&dir.path().join("a.safetensors"), 3, 0);
    good(&dir.path().join("b.safetensors"), 2, 3);
    let f = open(dir.path(), Role::Train).unwrap().fingerprint();
    assert_eq!(f.len(), 16);
    assert!(f.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(open(dir.path(), Role::Train).unwrap().fingerprint(), f);
    assert_eq!(open(dir.path(), Role::Train).unwrap().dir(), dir.path());
    std::fs::rename(
        dir.path().join("b.safetensors"),
        dir.path().join("c.safetensors"),
    )
    .unwrap();
    let renamed = open(dir.path(), Role::Train).unwrap().fingerprint();
    assert_ne!(renamed, f);
    good(&dir.path().join("c.safetensors"), 3, 3);
    let grown = open(dir.path(), Role::Train).unwrap().fingerprint();
    assert_ne!(grown, renamed);
    assert_ne!(grown, f);
}
