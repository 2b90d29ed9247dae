//! Precomputed Flux training data in safetensors shards, as MLPerf Training's
//! Flux.1 benchmark keeps it: a folder of `*.safetensors` files, each with
//!
//! | key | shape | what |
//! |---|---|---|
//! | `latent` | `[N, C, H, W]` | VAE latents (C = `data.latent_channels`, H x W = `data.latent_height` x `data.latent_width`) |
//! | `txt` | `[N, Lt, context]` | T5 embeddings (Lt = `data.txt_tokens`, context = `model.context_in_dim`) |
//! | `vec` | `[N, vec]` | CLIP pooled vectors (vec = `model.vec_in_dim`) |
//! | `timestep_id` | `[N]` | validation only: values 0..=7, the sample is evaluated at t = id / 8 |
//!
//! in F32, BF16, F16 or F64 (each key its own), other keys ignored.
//!
//! [`ShardSet::open`] reads and checks only the headers, once; a batch reads
//! its samples' rows from the files, so a set need not fit in memory. Every
//! error is one line that names the file and the key.
//!
//! [`TrainShards`] is the training stream: every sample once per epoch, in a
//! permutation drawn from (seed, epoch), each with its own time t ~ U(0, 1)
//! and noise drawn from (seed, stream position), so that the batch of a step
//! depends only on (seed, step) and a resumed run sees bit-identical data.
//! [`ValShards`] is the validation set: sample i at t = `timestep_id` / 8
//! with noise drawn from i alone, the same in every run. Both build their
//! batches with [`BatchBuilder`], exactly as the synthetic data does.
//!
//! [`write_synthetic_shards`] writes such a folder from the synthetic data's
//! classes, for trying the path without real latents (`examples/make_dataset.rs`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt::Display;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use safetensors::tensor::Dtype;

use mxswitch_models::flux::{
    Batch, BatchBuilder, DataConfig, FluxConfig, SyntheticData, TextTokens,
};
use mxswitch_runtime::formats::bf16;
use mxswitch_runtime::module::SplitMix64;
use mxswitch_runtime::{DType, Error, Result};

use crate::files;
use crate::st_file::{self, printable, OwnedTensor, StEntry};

mod write;
pub use write::{write_synthetic_shards, ShardDType, SyntheticShards, WrittenShards};

/// The key of the latents.
pub const LATENT: &str = "latent";
/// The key of the text tokens.
pub const TXT: &str = "txt";
/// The key of the pooled vectors.
pub const VEC: &str = "vec";
/// The key of a validation sample's time step.
pub const TIMESTEP_ID: &str = "timestep_id";
/// Validation time steps: `timestep_id` is 0..TIMESTEPS, t = id / TIMESTEPS.
pub const TIMESTEPS: u8 = 8;
/// The file name ending of a shard.
const SHARD_SUFFIX: &str = ".safetensors";

/// Domains of the random streams, so that no two purposes share draws.
const PERMUTATION_DOMAIN: u64 = 0x5045_524D_5554_4521;
const TRAIN_NOISE_DOMAIN: u64 = 0x5452_4149_4E4E_4F49;
const VAL_NOISE_DOMAIN: u64 = 0x5641_4C4E_4F49_5345;
const WRITE_TRAIN_DOMAIN: u64 = 0x5752_4954_4554_524E;
const WRITE_VAL_DOMAIN: u64 = 0x5752_4954_4556_414C;
/// The validation noise's seed: fixed, not the run's, so every run and
/// every evaluation sees the same noisy inputs.
const VAL_SEED: u64 = 0x00F1_0057_A1DA_7A00;
/// Epoch permutations kept: a batch that crosses an epoch boundary needs
/// two, and the read-ahead thread and a warm-up step may be one apart.
const CACHED_PERMUTATIONS: usize = 2;

/// Which set a folder of shards is: training data, or validation data with
/// `timestep_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `latent`, `txt` and `vec`.
    Train,
    /// `latent`, `txt`, `vec` and `timestep_id`.
    Val,
}

/// An error about the shard at `path`.
fn shard_err(path: &Path, what: impl Display) -> Error {
    Error::Io(format!("data shard {}: {what}", path.display()))
}

/// An error about the folder `dir`.
fn dir_err(dir: &Path, what: impl Display) -> Error {
    Error::Io(format!("data folder {}: {what}", dir.display()))
}

/// A seed for the stream `index` of `domain` under `seed`: distinct indexes
/// give distinct seeds (both steps are bijections of the index).
fn mix(seed: u64, domain: u64, index: u64) -> u64 {
    let base = SplitMix64::new(seed ^ domain).next_u64();
    SplitMix64::new(base.wrapping_add(index.wrapping_mul(0xD134_2543_DE82_EF95))).next_u64()
}

/// One float key of a shard: where its rows lie in the file.
#[derive(Clone, Debug)]
struct Rows {
    key: &'static str,
    dtype: Dtype,
    offset: u64,
    /// Values per sample.
    row_len: usize,
}

impl Rows {
    fn row_bytes(&self) -> usize {
        self.row_len * self.dtype.size()
    }
}

/// What a file was when the set was opened, to notice a later change.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    len: u64,
    modified: Option<SystemTime>,
    /// Device and inode: a file replaced by another under the same name.
    #[cfg(unix)]
    node: (u64, u64),
}

impl Identity {
    fn of(meta: &fs::Metadata) -> Identity {
        Identity {
            len: meta.len(),
            modified: meta.modified().ok(),
            #[cfg(unix)]
            node: {
                use std::os::unix::fs::MetadataExt;
                (meta.dev(), meta.ino())
            },
        }
    }
}

/// One checked shard.
#[derive(Clone, Debug)]
struct Shard {
    path: PathBuf,
    name: OsString,
    identity: Identity,
    samples: u64,
    latent: Rows,
    txt: Rows,
    vec: Rows,
    /// Validation sets only: each sample's time step, 0..TIMESTEPS.
    timestep_ids: Vec<u8>,
}

/// An opened, checked folder of shards (headers read and validated; tensor
/// data read lazily per sample).
#[derive(Clone, Debug)]
pub struct ShardSet {
    dir: PathBuf,
    role: Role,
    shards: Vec<Shard>,
    /// The set's index of each shard's first sample.
    starts: Vec<u64>,
    total: u64,
    data: DataConfig,
    context: usize,
    vec_dim: usize,
}

/// The shard files of `dir`: its `*.safetensors` entries, hidden ones
/// (`.name`, such as macOS's `._name`) left out, sorted by file name.
fn shard_files(dir: &Path) -> Result<Vec<(OsString, PathBuf)>> {
    let meta = match fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(dir_err(dir, "it does not exist"))
        }
        Err(e) => return Err(dir_err(dir, e)),
    };
    if !meta.is_dir() {
        return Err(dir_err(dir, "it is not a folder"));
    }
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| dir_err(dir, e))? {
        let entry = entry.map_err(|e| dir_err(dir, e))?;
        let name = entry.file_name();
        let text = name.to_string_lossy();
        if text.ends_with(SHARD_SUFFIX) && !text.starts_with('.') {
            found.push((name, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// "F32, BF16, F16 or F64": the float dtypes a shard may hold.
fn is_float(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F64)
}

fn is_integer(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::U8
            | Dtype::I8
            | Dtype::U16
            | Dtype::I16
            | Dtype::U32
            | Dtype::I32
            | Dtype::U64
            | Dtype::I64
    )
}

/// "[N, 8, 64]".
fn expected_shape(want: &[(usize, &str)]) -> String {
    let dims: Vec<String> = std::iter::once("N".to_string())
        .chain(want.iter().map(|(v, _)| v.to_string()))
        .collect();
    format!("[{}]", dims.join(", "))
}

/// Checks a key's shape is [N, want...] and returns N; the error names the
/// config field that decides the dimension that differs.
fn check_shape(path: &Path, entry: &StEntry, want: &[(usize, &str)]) -> Result<u64> {
    let key = printable(&entry.name);
    let shape = &entry.shape;
    let expected = expected_shape(want);
    if shape.len() != want.len() + 1 {
        let fields: Vec<String> = want.iter().map(|(v, f)| format!("{f} = {v}")).collect();
        let by = match fields.is_empty() {
            true => String::new(),
            false => format!(" by {}", fields.join(" by ")),
        };
        return Err(shard_err(
            path,
            format!(
                "key `{key}` has shape {shape:?}, expected {expected} (N samples{by}): it has {} dimensions, not {}",
                shape.len(),
                want.len() + 1
            ),
        ));
    }
    for (i, ((v, field), got)) in want.iter().zip(&shape[1..]).enumerate() {
        if v != got {
            return Err(shard_err(
                path,
                format!(
                    "key `{key}` has shape {shape:?}, expected {expected}: dimension {} is {got}, but {field} is {v}",
                    i + 1
                ),
            ));
        }
    }
    Ok(shape[0] as u64)
}

/// Reads `len` bytes at `offset` of `file`.
fn read_bytes(file: &mut File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(&mut buf)?;
    Ok(buf)
}

/// A read failure in words: a short read means the file shrank.
fn read_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            "the file ends early: it shrank after the set was opened; restart so it is checked again".into()
        }
        _ => format!("reading it failed: {e}"),
    }
}

/// Little-endian values of a float `dtype` as f32 (F64 rounded to nearest).
fn floats(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    st_file::floats(dtype, bytes)
        .unwrap_or_else(|| unreachable!("{dtype:?} was refused when the shard was opened"))
}

/// Little-endian values of an integer or float `dtype` as f64 (exact for
/// every integer that could be a valid time step id).
fn numbers(dtype: Dtype, bytes: &[u8]) -> Vec<f64> {
    let n = dtype.size();
    bytes
        .chunks_exact(n)
        .map(|b| match dtype {
            Dtype::U8 => b[0] as f64,
            Dtype::I8 => b[0] as i8 as f64,
            Dtype::U16 => u16::from_le_bytes([b[0], b[1]]) as f64,
            Dtype::I16 => i16::from_le_bytes([b[0], b[1]]) as f64,
            Dtype::U32 => u32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
            Dtype::I32 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
            Dtype::U64 => u64::from_le_bytes(b.try_into().expect("8 bytes")) as f64,
            Dtype::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")) as f64,
            Dtype::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")),
            float => floats(float, b)[0] as f64,
        })
        .collect()
}

impl Shard {
    /// Opens and checks the shard at `path`.
    fn open(
        path: &Path,
        name: OsString,
        model: &FluxConfig,
        data: &DataConfig,
        role: Role,
    ) -> Result<Shard> {
        let meta = fs::metadata(path).map_err(|e| shard_err(path, e))?;
        if !meta.is_file() {
            return Err(shard_err(path, "it is not a regular file"));
        }
        let mut file = File::open(path).map_err(|e| shard_err(path, e))?;
        // The file opened may not be the one looked at (a rename in between).
        let meta = file.metadata().map_err(|e| shard_err(path, e))?;
        let identity = Identity::of(&meta);
        let header = st_file::read_header(&mut file, meta.len())
            .map_err(|r| shard_err(path, format!("not a safetensors file: {r}")))?;
        let keys = match role {
            Role::Train => "`latent`, `txt` and `vec`",
            Role::Val => "`latent`, `txt`, `vec` and `timestep_id`",
        };
        let get = |key: &str| {
            header.get(key).ok_or_else(|| {
                shard_err(
                    path,
                    format!("key `{key}` is missing (a shard holds {keys})"),
                )
            })
        };
        let float_rows = |key: &'static str, want: &[(usize, &str)]| -> Result<(Rows, u64)> {
            let entry = get(key)?;
            if !is_float(entry.dtype) {
                return Err(shard_err(
                    path,
                    format!(
                        "key `{key}` is {:?}, expected a float dtype: F32, BF16, F16 or F64",
                        entry.dtype
                    ),
                ));
            }
            let n = check_shape(path, entry, want)?;
            let rows = Rows {
                key,
                dtype: entry.dtype,
                offset: entry.offset,
                row_len: want.iter().map(|(v, _)| v).product(),
            };
            Ok((rows, n))
        };
        let (latent, n) = float_rows(
            LATENT,
            &[
                (data.latent_channels, "data.latent_channels"),
                (data.latent_height, "data.latent_height"),
                (data.latent_width, "data.latent_width"),
            ],
        )?;
        let same_n = |key: &str, got: u64| {
            if got == n {
                return Ok(());
            }
            Err(shard_err(
                path,
                format!(
                    "key `{key}` holds {got} samples (dimension 0) but `{LATENT}` holds {n}: every key has one row per sample"
                ),
            ))
        };
        let (txt, n_txt) = float_rows(
            TXT,
            &[
                (data.txt_tokens, "data.txt_tokens"),
                (model.context_in_dim, "model.context_in_dim"),
            ],
        )?;
        same_n(TXT, n_txt)?;
        let (vec, n_vec) = float_rows(VEC, &[(model.vec_in_dim, "model.vec_in_dim")])?;
        same_n(VEC, n_vec)?;
        let timestep_ids = match role {
            Role::Train => Vec::new(),
            Role::Val => {
                let entry = get(TIMESTEP_ID)?;
                if !is_integer(entry.dtype) && !is_float(entry.dtype) {
                    return Err(shard_err(
                        path,
                        format!(
                            "key `{TIMESTEP_ID}` is {:?}, expected an integer dtype (or a float one holding whole numbers)",
                            entry.dtype
                        ),
                    ));
                }
                same_n(TIMESTEP_ID, check_shape(path, entry, &[])?)?;
                let bytes =
                    read_bytes(&mut file, entry.offset, entry.len as usize).map_err(|e| {
                        shard_err(path, format!("key `{TIMESTEP_ID}`: {}", read_reason(&e)))
                    })?;
                numbers(entry.dtype, &bytes)
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| {
                        if v.fract() == 0.0 && (0.0..TIMESTEPS as f64).contains(&v) {
                            return Ok(v as u8);
                        }
                        Err(shard_err(
                            path,
                            format!(
                                "key `{TIMESTEP_ID}`, sample {i}: it is {v}, expected a whole number 0..={} (the sample is evaluated at t = timestep_id / {TIMESTEPS})",
                                TIMESTEPS - 1
                            ),
                        ))
                    })
                    .collect::<Result<Vec<u8>>>()?
            }
        };
        Ok(Shard {
            path: path.to_path_buf(),
            name,
            identity,
            samples: n,
            latent,
            txt,
            vec,
            timestep_ids,
        })
    }

    /// Opens the file again for reading samples, refusing one that changed
    /// since the set was opened (its size, time or identity).
    fn reopen(&self) -> Result<File> {
        let changed = |what: String| {
            shard_err(
                &self.path,
                format!("the file changed after the set was opened ({what}); restart so it is checked again"),
            )
        };
        let file = File::open(&self.path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => changed("it no longer exists".into()),
            _ => shard_err(&self.path, e),
        })?;
        let now = Identity::of(&file.metadata().map_err(|e| shard_err(&self.path, e))?);
        if now.len != self.identity.len {
            return Err(changed(format!(
                "{} bytes then, {} now",
                self.identity.len, now.len
            )));
        }
        if now != self.identity {
            return Err(changed("it was modified or replaced".into()));
        }
        Ok(file)
    }

    /// Sample `local` of `rows`, as f32, checked finite.
    fn read_row(&self, file: &mut File, rows: &Rows, local: u64) -> Result<Vec<f32>> {
        let at = rows.offset + local * rows.row_bytes() as u64;
        let bytes = read_bytes(file, at, rows.row_bytes()).map_err(|e| {
            shard_err(
                &self.path,
                format!("key `{}`, sample {local}: {}", rows.key, read_reason(&e)),
            )
        })?;
        let values = floats(rows.dtype, &bytes);
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            let how = match rows.dtype {
                Dtype::F64 if !v.is_nan() => " in f32 (out of its range)",
                _ => "",
            };
            return Err(shard_err(
                &self.path,
                format!(
                    "key `{}`, sample {local}: element {i} is {v}{how}; the data must be finite",
                    rows.key
                ),
            ));
        }
        Ok(values)
    }
}

/// One sample's values.
struct Sample {
    latent: Vec<f32>,
    txt: Vec<f32>,
    vec: Vec<f32>,
    /// Validation sets only.
    timestep_id: u8,
}

impl Sample {
    /// Appends this sample to `out` with its noise and timestep t.
    fn push_to(&self, out: &mut BatchBuilder, noise: &[f32], t: f32) -> Result<()> {
        out.push(
            &self.latent,
            noise,
            t,
            TextTokens::F32(&self.txt),
            &self.vec,
        )
    }
}

/// Reads samples for one batch, opening each shard it touches once.
struct Reader<'a> {
    set: &'a ShardSet,
    open: HashMap<usize, File>,
}

impl<'a> Reader<'a> {
    fn new(set: &'a ShardSet) -> Self {
        Reader {
            set,
            open: HashMap::new(),
        }
    }

    /// Sample `index` of the set.
    fn sample(&mut self, index: u64) -> Result<Sample> {
        let k = self.set.starts.partition_point(|&s| s <= index) - 1;
        let shard = &self.set.shards[k];
        let local = index - self.set.starts[k];
        let file = match self.open.entry(k) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(shard.reopen()?),
        };
        Ok(Sample {
            latent: shard.read_row(file, &shard.latent, local)?,
            txt: shard.read_row(file, &shard.txt, local)?,
            vec: shard.read_row(file, &shard.vec, local)?,
            timestep_id: shard.timestep_ids.get(local as usize).copied().unwrap_or(0),
        })
    }
}

impl ShardSet {
    /// Open every `*.safetensors` file in `dir` (sorted by file name; hidden
    /// `.name` files left out) and check each header against the model and
    /// data configs: `latent` `[N, data.latent_channels, data.latent_height,
    /// data.latent_width]`, `txt` `[N, data.txt_tokens, model.context_in_dim]`,
    /// `vec` `[N, model.vec_in_dim]`, the same N for every key of a shard,
    /// in F32, BF16, F16 or F64; for [`Role::Val`] also `timestep_id` `[N]`
    /// in any integer dtype (or a float one holding whole numbers), values
    /// 0..=7, read here. Other keys are ignored. A shard of N = 0 is
    /// accepted and adds nothing; a set of no samples at all is refused.
    /// Errors are one line, `data shard <file>: key ``txt`` ...` or
    /// `data folder <dir>: ...`.
    pub fn open(dir: &Path, model: &FluxConfig, data: &DataConfig, role: Role) -> Result<ShardSet> {
        let files = shard_files(dir)?;
        if files.is_empty() {
            return Err(dir_err(
                dir,
                format!("it holds no `*{SHARD_SUFFIX}` shards"),
            ));
        }
        let mut shards = Vec::with_capacity(files.len());
        let (mut starts, mut total) = (Vec::with_capacity(files.len()), 0u64);
        for (name, path) in files {
            let shard = Shard::open(&path, name, model, data, role)?;
            starts.push(total);
            total += shard.samples;
            shards.push(shard);
        }
        if total == 0 {
            return Err(dir_err(
                dir,
                match shards.len() {
                    1 => "its one shard holds no samples (N = 0)".to_string(),
                    n => format!("its {n} shards hold no samples (N = 0 in each)"),
                },
            ));
        }
        if total > u32::MAX as u64 {
            return Err(dir_err(
                dir,
                format!(
                    "its shards hold {total} samples, more than the {} a set may",
                    u32::MAX
                ),
            ));
        }
        Ok(ShardSet {
            dir: dir.to_path_buf(),
            role,
            shards,
            starts,
            total,
            data: data.clone(),
            context: model.context_in_dim,
            vec_dim: model.vec_in_dim,
        })
    }

    /// Samples in all shards.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Never true for an opened set (one of no samples is refused).
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The number of shard files.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// How the set was opened.
    pub fn role(&self) -> Role {
        self.role
    }

    /// A short stable fingerprint of the set: 16 hex digits of a hash of
    /// each shard's file name, size in bytes, sample count and key dtypes,
    /// for a checkpoint to refuse a resume on different data. The bytes are
    /// not hashed (that would read the whole set), so an edit that keeps
    /// every size is not seen.
    pub fn fingerprint(&self) -> String {
        // FNV-1a, 64 bits: stable across builds and platforms.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                h ^= b as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        for s in &self.shards {
            eat(s.name.as_encoded_bytes());
            eat(&[0]);
            eat(&s.identity.len.to_le_bytes());
            eat(&s.samples.to_le_bytes());
            for rows in [&s.latent, &s.txt, &s.vec] {
                eat(format!("{:?}", rows.dtype).as_bytes());
                eat(&[0]);
            }
        }
        format!("{h:016x}")
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn builder(&self, act: DType, capacity: usize) -> BatchBuilder {
        BatchBuilder::new(&self.data, self.context, self.vec_dim, act, capacity)
    }

    fn latent_len(&self) -> usize {
        self.data.latent_channels * self.data.latent_height * self.data.latent_width
    }
}

/// `n` normals from `rng`.
fn normals(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal()).collect()
}

/// The permutation of 0..n for `epoch`: Fisher-Yates from (seed, epoch).
fn permutation(n: u32, seed: u64, epoch: u64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n).collect();
    let mut rng = SplitMix64::new(mix(seed, PERMUTATION_DOMAIN, epoch));
    for i in (1..p.len()).rev() {
        // Lemire's multiply-shift: uniform in 0..=i without a division.
        let j = ((rng.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize;
        p.swap(i, j);
    }
    p
}

/// Training batches drawn from a shard set. `Send + Sync`: a helper thread
/// may build the next batch while a step runs.
#[derive(Debug)]
pub struct TrainShards {
    set: ShardSet,
    seed: u64,
    batch: usize,
    /// The latest epochs' permutations, newest last.
    permutations: Mutex<Vec<(u64, Arc<Vec<u32>>)>>,
}

impl TrainShards {
    /// The stream of `set` under `seed`, `batch` samples a step (at least 1).
    pub fn new(set: ShardSet, seed: u64, batch: usize) -> Result<TrainShards> {
        if batch == 0 {
            return Err(Error::InvalidOption(
                "a training batch needs at least one sample".into(),
            ));
        }
        Ok(TrainShards {
            set,
            seed,
            batch,
            permutations: Mutex::new(Vec::new()),
        })
    }

    /// The set.
    pub fn set(&self) -> &ShardSet {
        &self.set
    }

    /// Samples per step.
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// Epoch `epoch`'s order of the set's samples, built once and cached:
    /// a batch looks it up instead of rebuilding an O(N) permutation.
    fn permutation(&self, epoch: u64) -> Arc<Vec<u32>> {
        let lock = || self.permutations.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = lock().iter().find(|(e, _)| *e == epoch) {
            return p.clone();
        }
        // Built outside the lock: another thread's batch need not wait.
        let p = Arc::new(permutation(self.set.total as u32, self.seed, epoch));
        let mut cache = lock();
        if !cache.iter().any(|(e, _)| *e == epoch) {
            if cache.len() == CACHED_PERMUTATIONS {
                cache.remove(0);
            }
            cache.push((epoch, p.clone()));
        }
        p
    }

    /// The set's sample at position `pos` of the stream.
    fn sample_at(&self, pos: u64) -> u64 {
        let n = self.set.total;
        self.permutation(pos / n)[(pos % n) as usize] as u64
    }

    /// The batch of training step `step`: the samples at positions
    /// step*B .. step*B+B of the stream that visits every sample once per
    /// epoch, in a permutation drawn from (seed, epoch) (a batch may cross
    /// into the next epoch). Each sample gets t ~ U(0,1) and Gaussian noise
    /// drawn from (seed, position), so the batch depends only on
    /// (seed, step) and resume is bit-identical.
    pub fn batch(&self, step: u64, act: DType) -> Result<Batch> {
        self.batch_part(step, act, 0..self.batch)
    }

    /// The samples `part` of step `step`'s batch: a data-parallel rank's
    /// share, the same samples whichever rank reads them.
    pub fn batch_part(&self, step: u64, act: DType, part: std::ops::Range<usize>) -> Result<Batch> {
        let b = self.batch as u64;
        let first = step
            .checked_mul(b)
            .filter(|f| f.checked_add(b).is_some())
            .ok_or_else(|| {
                Error::InvalidOption(format!("step {step} is past the end of the data stream"))
            })?;
        let mut reader = Reader::new(&self.set);
        let mut out = self.set.builder(act, part.len());
        let end = first + (part.end as u64).min(b);
        for pos in first + part.start as u64..end {
            let sample = reader.sample(self.sample_at(pos))?;
            let mut rng = SplitMix64::new(mix(self.seed, TRAIN_NOISE_DOMAIN, pos));
            let t = rng.next_f64() as f32;
            let noise = normals(&mut rng, self.set.latent_len());
            sample.push_to(&mut out, &noise, t)?;
        }
        out.finish()
    }

    /// Epoch (counted from 0: the one in progress) and samples seen after
    /// `steps` steps, for messages and metrics.
    pub fn position(&self, steps: u64) -> (u64, u64) {
        let seen = steps.saturating_mul(self.batch as u64);
        (seen / self.set.total, seen)
    }
}

/// The validation set: fixed t and noise per sample.
#[derive(Debug)]
pub struct ValShards {
    set: ShardSet,
}

impl ValShards {
    /// The validation set of `set`, which must have been opened as
    /// [`Role::Val`] (its `timestep_id` read and checked).
    pub fn new(set: ShardSet) -> Result<ValShards> {
        if set.role != Role::Val {
            return Err(dir_err(
                &set.dir,
                "it was opened as training data; open it with Role::Val for its `timestep_id`",
            ));
        }
        Ok(ValShards { set })
    }

    /// The set.
    pub fn set(&self) -> &ShardSet {
        &self.set
    }

    /// Samples in the set.
    pub fn len(&self) -> u64 {
        self.set.total
    }

    /// Never true for an opened set.
    pub fn is_empty(&self) -> bool {
        self.set.total == 0
    }

    /// Samples `range` of the set, in order: sample i at
    /// t = timestep_id / 8 with noise drawn from i alone.
    fn batch_of(&self, range: std::ops::Range<u64>, act: DType) -> Result<Batch> {
        let mut reader = Reader::new(&self.set);
        let mut out = self.set.builder(act, (range.end - range.start) as usize);
        for i in range {
            let sample = reader.sample(i)?;
            let mut rng = SplitMix64::new(mix(VAL_SEED, VAL_NOISE_DOMAIN, i));
            let noise = normals(&mut rng, self.set.latent_len());
            let t = sample.timestep_id as f32 / TIMESTEPS as f32;
            sample.push_to(&mut out, &noise, t)?;
        }
        out.finish()
    }

    /// The set in order, in batches of at most `batch` samples (the last
    /// may be smaller): sample i at t = timestep_id/8 with noise drawn from
    /// i alone (a fixed seed, not the run's), so every run and every
    /// evaluation sees the same noisy inputs. A `batch` of 0 yields one error.
    pub fn batches(&self, batch: usize, act: DType) -> impl Iterator<Item = Result<Batch>> + '_ {
        let total = self.set.total;
        let mut next = Some(0u64);
        std::iter::from_fn(move || {
            let start = next.filter(|&s| s < total)?;
            if batch == 0 {
                next = None;
                return Some(Err(Error::InvalidOption(
                    "a validation batch needs at least one sample".into(),
                )));
            }
            let end = total.min(start + batch as u64);
            next = Some(end);
            Some(self.batch_of(start..end, act))
        })
    }
}

#[cfg(test)]
mod tests;
