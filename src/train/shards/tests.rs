//! Unit tests of the shard reader and writer's private pieces.

use super::write::encode;
use super::*;

/// Every epoch's permutation is one, and the multiply-shift draw covers
/// the whole range (a bias or an off-by-one would leave one fixed).
#[test]
fn permutations_are_permutations_and_differ_by_epoch_and_seed() {
    for n in [1u32, 2, 7, 1000] {
        let p = permutation(n, 3, 0);
        let mut sorted = p.clone();
        sorted.sort();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    }
    assert_ne!(permutation(1000, 3, 0), permutation(1000, 3, 1));
    assert_ne!(permutation(1000, 3, 0), permutation(1000, 4, 0));
    assert_eq!(permutation(1000, 3, 5), permutation(1000, 3, 5));
    // Every position receives every value across epochs.
    let mut seen = [[false; 5]; 5];
    for e in 0..200 {
        for (i, &v) in permutation(5, 0, e).iter().enumerate() {
            seen[i][v as usize] = true;
        }
    }
    assert!(seen.iter().flatten().all(|&s| s), "{seen:?}");
}

#[test]
fn stream_seeds_are_distinct() {
    let mut seeds: Vec<u64> = (0..10_000).map(|i| mix(7, TRAIN_NOISE_DOMAIN, i)).collect();
    seeds.extend((0..10_000).map(|i| mix(7, VAL_NOISE_DOMAIN, i)));
    seeds.extend((0..10_000).map(|i| mix(8, TRAIN_NOISE_DOMAIN, i)));
    let n = seeds.len();
    seeds.sort();
    seeds.dedup();
    assert_eq!(seeds.len(), n);
}

#[test]
fn every_float_dtype_reads_as_f32() {
    let v = [1.5f32, -0.25, 3072.0];
    let f16: Vec<u8> = v
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    let f64: Vec<u8> = v.iter().flat_map(|&x| (x as f64).to_le_bytes()).collect();
    assert_eq!(floats(Dtype::F16, &f16), v);
    assert_eq!(floats(Dtype::F64, &f64), v);
    assert_eq!(floats(Dtype::BF16, &encode(&v, ShardDType::BF16)), v);
    assert_eq!(floats(Dtype::F32, &encode(&v, ShardDType::F32)), v);
    assert_eq!(numbers(Dtype::I8, &[0xff]), [-1.0]);
    assert_eq!(numbers(Dtype::U16, &[7, 0]), [7.0]);
}

/// The cache holds the latest epochs and hands out the same permutation
/// it built, so a batch does not rebuild one.
#[test]
fn the_permutation_cache_keeps_the_latest_epochs() {
    let cfg = mxswitch_models::flux::RunConfig::load("flux-tiny").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = SyntheticShards {
        samples: 6,
        shards: 1,
        seed: 0,
        val: false,
        dtype: ShardDType::F32,
        overwrite: false,
    };
    write_synthetic_shards(dir.path(), &cfg.model, &cfg.data, &opts).unwrap();
    let set = ShardSet::open(dir.path(), &cfg.model, &cfg.data, Role::Train).unwrap();
    let data = TrainShards::new(set, 1, 4).unwrap();
    let a = data.permutation(0);
    assert!(Arc::ptr_eq(&a, &data.permutation(0)));
    data.permutation(1);
    data.permutation(2);
    let epochs: Vec<u64> = data
        .permutations
        .lock()
        .unwrap()
        .iter()
        .map(|(e, _)| *e)
        .collect();
    assert_eq!(epochs, [1, 2]);
    assert!(!Arc::ptr_eq(&a, &data.permutation(0)));
    assert_eq!(*a, *data.permutation(0));
}

/// The f32 values of `key` in the shards of `dir`, concatenated in file
/// order, read whole with `st_file::parse` (not through the set).
fn whole_key(dir: &Path, key: &str) -> Vec<f32> {
    let mut out = Vec::new();
    for (_, path) in shard_files(dir).unwrap() {
        let bytes = std::fs::read(path).unwrap();
        let (tensors, _) = st_file::parse(&bytes).unwrap();
        let t = tensors.iter().find(|t| t.name == key).unwrap();
        out.extend(floats(t.dtype, t.data));
    }
    out
}

/// One element of a training and a validation batch, computed by hand:
/// the sample the permutation puts there, its x0 from the file, t and
/// noise from their streams, x_t = (1 - t) x0 + t noise and the target
/// noise - x0, at the patchified place of (c, y, x); bit for bit.
#[test]
fn a_batch_element_is_the_hand_computed_rectified_flow_sample() {
    let cfg = mxswitch_models::flux::RunConfig::load("flux-tiny").unwrap();
    let (model, data) = (&cfg.model, &cfg.data);
    let (c, h, w) = (16, 8, 8);
    let (ch, y, x) = (5, 3, 6);
    let elem = ch * h * w + y * w + x;
    // Patch (y/2, x/2) of the 4 x 4, feature (c, ph, pw).
    let (token, feature) = ((y / 2) * (w / 2) + x / 2, ch * 4 + (y % 2) * 2 + x % 2);
    let at = |j: usize| (j * 16 + token) * 4 * c + feature;
    for val in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let opts = SyntheticShards {
            samples: 10,
            shards: 3,
            seed: 4,
            val,
            dtype: ShardDType::F32,
            overwrite: false,
        };
        write_synthetic_shards(dir.path(), model, data, &opts).unwrap();
        let latents = whole_key(dir.path(), LATENT);
        let vecs = whole_key(dir.path(), VEC);
        let role = if val { Role::Val } else { Role::Train };
        let set = ShardSet::open(dir.path(), model, data, role).unwrap();
        let (batch, j, sample, t, noise) = if val {
            let v = ValShards::new(set).unwrap();
            let batch = v.batches(4, DType::F32).nth(1).unwrap().unwrap();
            let i = 6u64;
            let mut rng = SplitMix64::new(mix(VAL_SEED, VAL_NOISE_DOMAIN, i));
            let noise = normals(&mut rng, c * h * w);
            (batch, 2, i, (i % 8) as f32 / 8.0, noise)
        } else {
            let s = TrainShards::new(set, 9, 4).unwrap();
            // Step 2 holds positions 8..12, crossing into epoch 1.
            let batch = s.batch(2, DType::F32).unwrap();
            let (j, pos) = (3, 11);
            let mut rng = SplitMix64::new(mix(9, TRAIN_NOISE_DOMAIN, pos));
            let t = rng.next_f64() as f32;
            let noise = normals(&mut rng, c * h * w);
            let sample = permutation(10, 9, 1)[1] as u64;
            (batch, j, sample, t, noise)
        };
        let x0 = latents[sample as usize * c * h * w + elem];
        let n = noise[elem];
        assert_eq!(batch.timesteps[j], t);
        let img = batch.img.to_vec_f32().unwrap()[at(j)];
        let target = batch.target.to_vec_f32().unwrap()[at(j)];
        assert_eq!(
            img.to_bits(),
            ((1.0 - t) * x0 + t * n).to_bits(),
            "val {val}"
        );
        assert_eq!(target.to_bits(), (n - x0).to_bits(), "val {val}");
        let y = batch.y.to_vec_f32().unwrap();
        let v = model.vec_in_dim;
        assert_eq!(
            y[j * v..(j + 1) * v],
            vecs[sample as usize * v..(sample as usize + 1) * v]
        );
    }
}

#[test]
fn the_readers_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<TrainShards>();
    both::<ValShards>();
    both::<ShardSet>();
}
