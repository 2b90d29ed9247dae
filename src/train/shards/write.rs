//! [`write_synthetic_shards`]: a folder of shards with learnable structure,
//! from the synthetic data's classes, in the layout the reader checks.

use super::*;

/// The element type [`write_synthetic_shards`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardDType {
    /// f32.
    F32,
    /// Rounded to nearest even BF16.
    BF16,
}

/// What [`write_synthetic_shards`] writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntheticShards {
    /// Samples in all shards (at least `shards`).
    pub samples: u64,
    /// Files to spread them over, as evenly as they go (at least 1).
    pub shards: usize,
    /// Seed of the classes and of the samples.
    pub seed: u64,
    /// A validation set: adds `timestep_id` = i % 8 (I64).
    pub val: bool,
    /// Element type of `latent`, `txt` and `vec`.
    pub dtype: ShardDType,
    /// Replace the shards the folder already holds.
    pub overwrite: bool,
}

/// What [`write_synthetic_shards`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenShards {
    /// The shards written, in order, each with its number of samples.
    pub written: Vec<(PathBuf, u64)>,
    /// Older shards removed (with `overwrite`), so that the folder holds
    /// exactly the new set.
    pub removed: Vec<PathBuf>,
}

/// The little-endian bytes of `values` in `dtype`.
pub(super) fn encode(values: &[f32], dtype: ShardDType) -> Vec<u8> {
    match dtype {
        ShardDType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ShardDType::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

/// Write a dataset of `opts.samples` samples in `opts.shards` files
/// (`shard-00000.safetensors`, ...) into `dir` (created if missing), with
/// learnable structure: the synthetic data's classes under `opts.seed`, a
/// latent being its class pattern plus a little noise and the text and
/// pooled vector the class's. A training and a validation set written with
/// the same seed share the classes and differ in their samples. Each shard
/// is built in memory and appears whole or not at all. A folder that holds
/// shards already is refused unless `opts.overwrite`, which also removes
/// the old shards the new set does not replace.
pub fn write_synthetic_shards(
    dir: &Path,
    model: &FluxConfig,
    data: &DataConfig,
    opts: &SyntheticShards,
) -> Result<WrittenShards> {
    if opts.shards == 0 || opts.samples < opts.shards as u64 {
        return Err(Error::InvalidOption(format!(
            "{} samples in {} shards: give at least one shard and at least one sample per shard",
            opts.samples, opts.shards
        )));
    }
    if dir.exists() && !dir.is_dir() {
        return Err(dir_err(dir, "it is not a folder"));
    }
    fs::create_dir_all(dir).map_err(|e| dir_err(dir, format!("cannot create it: {e}")))?;
    let existing = shard_files(dir)?;
    if !existing.is_empty() && !opts.overwrite {
        let mut names: Vec<String> = existing
            .iter()
            .take(4)
            .map(|(n, _)| n.to_string_lossy().into_owned())
            .collect();
        if existing.len() > 4 {
            names.push(format!("and {} more", existing.len() - 4));
        }
        return Err(dir_err(
            dir,
            format!(
                "it already holds shards ({}); give --overwrite to replace them",
                names.join(", ")
            ),
        ));
    }
    let synthetic = SyntheticData::new(model, data, opts.seed);
    let domain = match opts.val {
        true => WRITE_VAL_DOMAIN,
        false => WRITE_TRAIN_DOMAIN,
    };
    let st_dtype = match opts.dtype {
        ShardDType::F32 => Dtype::F32,
        ShardDType::BF16 => Dtype::BF16,
    };
    let (c, h, w) = (data.latent_channels, data.latent_height, data.latent_width);
    let metadata = HashMap::from([
        (
            "generator".to_string(),
            "mxswitch write_synthetic_shards".to_string(),
        ),
        ("seed".to_string(), opts.seed.to_string()),
    ]);
    let k = opts.shards as u64;
    let mut written = Vec::with_capacity(opts.shards);
    for s in 0..k {
        let range = (s * opts.samples / k)..((s + 1) * opts.samples / k);
        let n = (range.end - range.start) as usize;
        let (mut latent, mut txt, mut vec, mut ids) = (
            Vec::with_capacity(n * c * h * w),
            Vec::with_capacity(n * data.txt_tokens * model.context_in_dim),
            Vec::with_capacity(n * model.vec_in_dim),
            Vec::with_capacity(n * 8),
        );
        for i in range {
            let mut rng = SplitMix64::new(mix(opts.seed, domain, i));
            let class = (rng.next_u64() % synthetic.classes() as u64) as usize;
            latent.extend(synthetic.class_latent(class, &mut rng));
            txt.extend_from_slice(synthetic.class_text(class));
            vec.extend_from_slice(synthetic.class_vector(class));
            ids.extend_from_slice(&((i % TIMESTEPS as u64) as i64).to_le_bytes());
        }
        let mut tensors: Vec<OwnedTensor> = vec![
            (
                LATENT.into(),
                st_dtype,
                vec![n, c, h, w],
                encode(&latent, opts.dtype),
            ),
            (
                TXT.into(),
                st_dtype,
                vec![n, data.txt_tokens, model.context_in_dim],
                encode(&txt, opts.dtype),
            ),
            (
                VEC.into(),
                st_dtype,
                vec![n, model.vec_in_dim],
                encode(&vec, opts.dtype),
            ),
        ];
        if opts.val {
            tensors.push((TIMESTEP_ID.into(), Dtype::I64, vec![n], ids));
        }
        let path = dir.join(format!("shard-{s:05}{SHARD_SUFFIX}"));
        files::write_atomically(&path, |f| st_file::write_owned(f, &tensors, &metadata))?;
        written.push((path, n as u64));
    }
    let mut removed = Vec::new();
    for (_, path) in existing {
        if !written.iter().any(|(p, _)| *p == path) {
            fs::remove_file(&path)
                .map_err(|e| shard_err(&path, format!("cannot remove this old shard: {e}")))?;
            removed.push(path);
        }
    }
    Ok(WrittenShards { written, removed })
}
