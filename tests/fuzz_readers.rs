//! Property test of the readers of untrusted bytes (issue 11; the shard reader since issue 16): each gets 10,000 inputs
//! mutated from the committed fuzz seeds by a seeded mutator, and none may
//! panic or make a huge single allocation. It is the fuzz targets' harness
//! (`fuzz/src/lib.rs`) run without libFuzzer, so it needs no nightly flags
//! and a failure reproduces from its input number.
//!
//! `cargo test --test fuzz_readers -- --ignored write_seed_corpus` rewrites
//! the generated seeds (safetensors files and the micro checkpoint).

#[path = "../fuzz/src/lib.rs"]
mod harness;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

use harness::{CheckpointTarget, Stage};
use mxswitch::models::flux::config::MAX_BLOCKS;
use mxswitch::models::flux::DoubleBlock;
use mxswitch::runtime::module::SplitMix64;
use mxswitch::st_file::{self, StTensor};
use safetensors::tensor::Dtype;

/// Inputs per reader.
const INPUTS: usize = 10_000;

/// No reader should need a single allocation this large for an input of at
/// most a few tens of KB: a bigger one means a size taken from the input
/// was trusted (the config loader must build its plan without weights; its
/// largest legitimate allocation, the block vector of a config at the
/// validation bound, is checked to stay under this).
const MAX_ALLOCATION: usize = 16 << 20;

thread_local! {
    /// The largest allocation this thread asked for since the last reset.
    static PEAK_REQUEST: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, noting the largest request of each thread.
struct PeakRequest;

unsafe impl GlobalAlloc for PeakRequest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

fn note(size: usize) {
    // `try_with`: a thread being torn down has no slot left; skip it.
    let _ = PEAK_REQUEST.try_with(|p| p.set(p.get().max(size)));
}

#[global_allocator]
static ALLOCATOR: PeakRequest = PeakRequest;

/// Bytes that often sit on a boundary: zero, sign bits, all ones, and the
/// punctuation of JSON and RON.
const INTERESTING_BYTES: &[u8] = &[
    0x00, 0xff, 0x7f, 0x80, 0x01, 0xfe, b'"', b'\\', b',', b':', b'-', b'.', b'0', b'9', b'{',
    b'}', b'[', b']', b'(', b')', b' ', b'e',
];

/// Numbers to put in place of a number of the text: limits of u32, u64,
/// i64 and f32/f64, negative, fractional and non-finite values.
const INTERESTING_NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "-1",
    "-0",
    "7",
    "31",
    "32",
    "33",
    "255",
    "1000",
    "1001",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e12",
    "1000000000000",
    "1e39",
    "1e308",
    "1e309",
    "-1e308",
    "0.5",
    "1.5",
    "NaN",
    "inf",
    "-inf",
    "0x10",
];

/// Strings to put in place of a string of the text: dtypes, recipes,
/// options, header keys and odd names.
const INTERESTING_STRINGS: &[&str] = &[
    "",
    "F32",
    "F16",
    "BF16",
    "F64",
    "U8",
    "I8",
    "I64",
    "BOOL",
    "F8_E4M3",
    "Q9",
    "mxfp4",
    "fp8",
    "bf16",
    "mxfp8",
    "fp8_fnuz",
    "rceil",
    "floor",
    "deep_to_shallow",
    "shallow_to_deep",
    "f32",
    "__metadata__",
    "shape",
    "dtype",
    "data_offsets",
    "iteration",
    "samples",
    "run",
    "adamw.steps",
    "param.img_in.weight",
    "adamw.m.img_in.weight",
    "\u{1b}[31m",
    "\u{202e}",
];

/// A seeded mutator in the manner of libFuzzer's: byte-level mutations for
/// any input, token-level ones (numbers, strings) so text formats get past
/// their parser, and for safetensors files both layout mutations (the 8-byte
/// header length, the JSON header with the length kept consistent, the data
/// section) and content mutations written back as a valid file, which reach
/// the checkpoint's own checks.
struct Mutator {
    rng: SplitMix64,
}

/// Which reader an input is for: picks the structure-aware mutations.
#[derive(Clone, Copy, PartialEq)]
enum Format {
    /// A safetensors file (also every checkpoint).
    Safetensors,
    /// RON text.
    Text,
}

impl Mutator {
    fn new(seed: u64) -> Mutator {
        Mutator {
            rng: SplitMix64::new(seed),
        }
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// One to four mutations of a seed; `others` are splicing partners.
    fn mutate(&mut self, seed: &[u8], others: &[Vec<u8>], format: Format) -> Vec<u8> {
        let mut b = seed.to_vec();
        for _ in 0..1 + self.below(4) {
            match (format, self.below(3)) {
                (Format::Safetensors, 0) => self.mutate_tensors(&mut b),
                (Format::Safetensors, 1) => self.mutate_layout(&mut b),
                // Tokens keep RON well-formed, so validation is reached.
                (Format::Text, 0) => replace_token(self, &mut b, Token::Number),
                _ => self.mutate_any(&mut b, others),
            }
        }
        b
    }

    fn mutate_any(&mut self, b: &mut Vec<u8>, others: &[Vec<u8>]) {
        let len = b.len();
        match self.below(10) {
            0 if len > 0 => {
                let i = self.below(len);
                b[i] ^= 1 << self.below(8);
            }
            1 if len > 0 => {
                let i = self.below(len);
                b[i] = *self.pick(INTERESTING_BYTES);
            }
            2 => {
                let at = self.below(len + 1);
                let n = 1 + self.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| self.rng.next_u64() as u8).collect();
                b.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let at = self.below(len);
                let n = 1 + self.below((len - at).min(64));
                b.drain(at..at + n);
            }
            4 => b.truncate(self.below(len + 1)),
            5 if !others.is_empty() => {
                // Prefix of this input, suffix of another.
                let other = self.pick(others);
                let (cut, from) = (self.below(len + 1), self.below(other.len() + 1));
                b.truncate(cut);
                b.extend_from_slice(&other[from..]);
            }
            6 if len > 0 => {
                // Copy a chunk of the input elsewhere in it.
                let at = self.below(len);
                let n = 1 + self.below((len - at).min(64));
                let chunk = b[at..at + n].to_vec();
                let to = self.below(len + 1);
                b.splice(to..to, chunk);
            }
            7 | 8 => replace_token(self, b, Token::Number),
            _ => replace_token(self, b, Token::String),
        }
    }

    /// Mutations that know the layout: the header length, the JSON header
    /// (length fixed up so the file still splits), or the data section.
    fn mutate_layout(&mut self, b: &mut Vec<u8>) {
        let Some((header, data)) = split_safetensors(b) else {
            return self.mutate_any(b, &[]);
        };
        let (mut header, mut data) = (header.to_vec(), data.to_vec());
        match self.below(6) {
            0 => {
                let n = header.len() as u64;
                let total = (header.len() + data.len()) as u64;
                let len = *self.pick(&[
                    0,
                    1,
                    2,
                    n.wrapping_sub(1),
                    n + 1,
                    total,
                    total + 1,
                    u32::MAX as u64,
                    1 << 32,
                    i64::MAX as u64,
                    1 << 63,
                    u64::MAX,
                    u64::MAX - 7,
                ]);
                b[..8].copy_from_slice(&len.to_le_bytes());
                return;
            }
            1 => {
                let n = data.len();
                data.truncate(self.below(n + 1));
            }
            2 => data.extend((0..1 + self.below(8)).map(|_| self.rng.next_u64() as u8)),
            3 => replace_token(self, &mut header, Token::String),
            _ => replace_token(self, &mut header, Token::Number),
        }
        if self.below(4) == 0 {
            self.mutate_any(&mut header, &[]);
        }
        *b = join_safetensors(&header, &data);
    }

    /// Mutations of a file's content that keep it a well-formed safetensors
    /// file, so the checkpoint reader's own checks are reached: a tensor
    /// dropped, renamed, duplicated, reshaped, retyped or given odd values,
    /// or a metadata entry dropped, added or edited as text. A file that does
    /// not parse gets a layout mutation instead.
    fn mutate_tensors(&mut self, b: &mut Vec<u8>) {
        let Ok((tensors, metadata)) = st_file::parse(b) else {
            return self.mutate_layout(b);
        };
        let mut tensors: Vec<st_file::OwnedTensor> = tensors
            .into_iter()
            .map(|t| (t.name, t.dtype, t.shape, t.data.to_vec()))
            .collect();
        let mut metadata: Vec<(String, String)> = metadata.into_iter().collect();
        metadata.sort();
        let n = tensors.len();
        match self.below(8) {
            0 if n > 0 => {
                tensors.remove(self.below(n));
            }
            1 if n > 0 => {
                let i = self.below(n);
                let name = &mut tensors[i].0;
                match self.below(3) {
                    0 => *name = self.pick(INTERESTING_STRINGS).to_string(),
                    1 => name.truncate(self.below(name.len() + 1)),
                    _ => name.push_str(".0"),
                }
            }
            2 if n > 0 => {
                let mut t = tensors[self.below(n)].clone();
                t.0 = tensors[self.below(n)].0.clone() + "x";
                tensors.push(t);
            }
            3 if n > 0 => {
                let i = self.below(n);
                let shape = &mut tensors[i].2;
                match self.below(4) {
                    0 => *shape = vec![shape.iter().product()],
                    1 => shape.push(1),
                    2 => shape.reverse(),
                    _ => *shape = vec![0],
                }
            }
            4 if n > 0 => {
                let i = self.below(n);
                tensors[i].1 = *self.pick(&[
                    Dtype::F32,
                    Dtype::F16,
                    Dtype::BF16,
                    Dtype::F64,
                    Dtype::U8,
                    Dtype::I32,
                ]);
            }
            5 if n > 0 => {
                // NaN, infinity and the largest finite value as f32 elements.
                let data = &mut tensors[self.below(n)].3;
                if data.len() >= 4 {
                    let at = self.below(data.len() / 4) * 4;
                    let v = *self.pick(&[f32::NAN, f32::INFINITY, f32::MAX, -0.0, 1e-45]);
                    data[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            6 if !metadata.is_empty() => {
                let i = self.below(metadata.len());
                match self.below(4) {
                    0 => {
                        metadata.remove(i);
                    }
                    1 => metadata.push((
                        self.pick(INTERESTING_STRINGS).to_string(),
                        metadata[i].1.clone(),
                    )),
                    _ => {
                        let mut value = metadata[i].1.clone().into_bytes();
                        if self.below(2) == 0 {
                            replace_token(self, &mut value, Token::Number);
                        } else {
                            self.mutate_any(&mut value, &[]);
                        }
                        metadata[i].1 = String::from_utf8_lossy(&value).into_owned();
                    }
                }
            }
            _ => {
                let key = self.pick(INTERESTING_STRINGS).to_string();
                metadata.push((key, self.pick(INTERESTING_NUMBERS).to_string()));
            }
        }
        // Each tensor's bytes fit its (new) dtype and shape again.
        for (_, dtype, shape, data) in &mut tensors {
            let len = shape
                .iter()
                .try_fold(dtype.size(), |n, &d| n.checked_mul(d));
            data.resize(len.unwrap_or(0).min(1 << 16), 0);
        }
        let mut out = Vec::new();
        if st_file::write_owned(&mut out, &tensors, &metadata.into_iter().collect()).is_ok() {
            *b = out;
        }
    }
}

/// `(header, data)` of a file whose 8-byte length fits it.
fn split_safetensors(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = b.split_first_chunk::<8>()?;
    let n = usize::try_from(u64::from_le_bytes(*len)).ok()?;
    (n <= rest.len()).then(|| rest.split_at(n))
}

fn join_safetensors(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.extend_from_slice(data);
    b
}

#[derive(Clone, Copy)]
enum Token {
    /// A run of digits (with sign, point and exponent).
    Number,
    /// The text between two quotes.
    String,
}

/// Replace a random token of `b` with an interesting one; an input without
/// such a token gets a byte flip.
fn replace_token(m: &mut Mutator, b: &mut Vec<u8>, kind: Token) {
    let spans = token_spans(b, kind);
    if spans.is_empty() {
        if !b.is_empty() {
            let i = m.below(b.len());
            b[i] ^= 0x20;
        }
        return;
    }
    let (start, end) = *m.pick(&spans);
    let new = match kind {
        Token::Number => m.pick(INTERESTING_NUMBERS).as_bytes().to_vec(),
        // The scan skips escaped quotes, so the strings of the run record
        // (JSON inside a JSON string) are not tokens of their own; its
        // numbers are, and `mutate_tensors` edits it as text.
        Token::String => m.pick(INTERESTING_STRINGS).as_bytes().to_vec(),
    };
    b.splice(start..end, new);
}

/// Byte ranges of the tokens of one kind.
fn token_spans(b: &[u8], kind: Token) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match kind {
            Token::Number if b[i].is_ascii_digit() => {
                let start = if i > 0 && b[i - 1] == b'-' { i - 1 } else { i };
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    i += 1;
                }
                spans.push((start, i));
            }
            Token::String if b[i] == b'"' => {
                let start = i + 1;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                spans.push((start, i.min(b.len())));
                i += 1;
            }
            _ => i += 1,
        }
    }
    spans
}

/// The committed seeds of one fuzz target (`seed-*`), with `extra` files;
/// seeds named `seed-bad-*` are inputs the reader must reject.
fn seeds(target: &str, extra: &[PathBuf]) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| file_name(p).starts_with("seed-"))
        .chain(extra.iter().cloned())
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no seeds in {}", dir.display());
    paths
        .into_iter()
        .map(|p| (file_name(&p), std::fs::read(&p).unwrap()))
        .collect()
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// The built-in presets, which are config seeds too.
fn presets() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/configs");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ron"))
        .collect()
}

/// Feed every seed and `INPUTS` mutations of them to `read`; fail on the
/// first panic or oversized allocation with the input saved to a file.
/// `step_after` says what `Stage::Used` means for this reader, if anything.
/// Returns how many inputs reached each stage.
fn run(
    name: &str,
    format: Format,
    seeds: &[(String, Vec<u8>)],
    step_after: Option<&str>,
    mut read: impl FnMut(&[u8]) -> Stage,
) -> HashMap<Stage, usize> {
    let t0 = Instant::now();
    let mut check = |what: &str, input: &[u8]| -> Stage {
        PEAK_REQUEST.with(|p| p.set(0));
        let result = catch_unwind(AssertUnwindSafe(|| read(input)));
        let peak = PEAK_REQUEST.with(|p| p.get());
        let failure = match &result {
            Err(panic) => Some(format!("panicked: {}", panic_message(panic.as_ref()))),
            Ok(_) if peak > MAX_ALLOCATION => Some(format!(
                "asked for one allocation of {peak} bytes (limit {MAX_ALLOCATION})"
            )),
            Ok(_) => None,
        };
        if let Some(failure) = failure {
            let saved = save_failure(name, what, input);
            panic!(
                "{name} {failure}\n  input: {what}, {} bytes, saved to {}\n  first bytes: {}",
                input.len(),
                saved.display(),
                hex(&input[..input.len().min(256)])
            );
        }
        result.unwrap()
    };

    for (seed_name, bytes) in seeds {
        let stage = check(seed_name, bytes);
        let want_rejected = seed_name.starts_with("seed-bad-");
        assert_eq!(
            stage == Stage::Rejected,
            want_rejected,
            "{name}: seed {seed_name} reached {stage:?}; the seed corpus is stale (regenerate it with --ignored write_seed_corpus)"
        );
    }
    let bodies: Vec<Vec<u8>> = seeds.iter().map(|(_, b)| b.clone()).collect();
    let mut m = Mutator::new(0x11_f022 ^ name.len() as u64);
    let mut stages = HashMap::new();
    for i in 0..INPUTS {
        let from = m.below(seeds.len());
        let input = m.mutate(&seeds[from].1, &bodies, format);
        let stage = check(&format!("mutation {i} of {}", seeds[from].0), &input);
        *stages.entry(stage).or_insert(0) += 1;
    }
    let count = |s| stages.get(&s).copied().unwrap_or(0);
    let after = match step_after {
        Some(step) => format!(" ({} also {step})", count(Stage::Used)),
        None => String::new(),
    };
    // Written to stderr directly, which the test harness does not capture,
    // so every run shows how deep the mutations reached.
    let _ = writeln!(
        std::io::stderr(),
        "{name}: {INPUTS} mutated inputs in {:.1} s: {} rejected, {} accepted by the reader{after}",
        t0.elapsed().as_secs_f64(),
        count(Stage::Rejected),
        count(Stage::Parsed) + count(Stage::Used),
    );
    stages
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".into())
}

fn save_failure(name: &str, what: &str, input: &[u8]) -> PathBuf {
    let tag: String = what
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{tag}.bin"));
    std::fs::write(&path, input).unwrap();
    path
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// At least `share` of the inputs reached `stage` or a later one: the
/// mutations do not all die at the first check.
fn assert_reached(name: &str, stages: &HashMap<Stage, usize>, stage: Stage, share: f64) {
    let deeper = |s: &Stage| match stage {
        Stage::Rejected => true,
        Stage::Parsed => *s != Stage::Rejected,
        Stage::Used => *s == Stage::Used,
    };
    let n: usize = stages
        .iter()
        .filter(|(s, _)| deeper(s))
        .map(|(_, n)| n)
        .sum();
    assert!(
        n as f64 >= share * INPUTS as f64,
        "{name}: only {n} of {INPUTS} mutated inputs reached {stage:?}: {stages:?}"
    );
}

#[test]
fn safetensors_reader_survives_mutated_files() {
    let seeds = seeds("safetensors_reader", &[]);
    let stages = run(
        "safetensors_reader",
        Format::Safetensors,
        &seeds,
        None,
        harness::safetensors_reader,
    );
    assert_reached("safetensors_reader", &stages, Stage::Parsed, 0.05);
}

#[test]
fn config_loader_survives_mutated_configs() {
    // The largest allocation a valid config may cause: its block vector.
    let blocks = MAX_BLOCKS * std::mem::size_of::<DoubleBlock>();
    assert!(blocks < MAX_ALLOCATION, "{blocks} bytes of blocks");
    let seeds = seeds("config_loader", &presets());
    let stages = run(
        "config_loader",
        Format::Text,
        &seeds,
        Some("built into a plan"),
        harness::config_loader,
    );
    // Validation is strict (most changed numbers break a cross-field rule),
    // so only a few percent of mutated configs pass it.
    assert_reached("config_loader", &stages, Stage::Used, 0.02);
}

#[test]
fn checkpoint_loader_survives_mutated_checkpoints() {
    let seeds = seeds("checkpoint_loader", &[]);
    let mut target = CheckpointTarget::new();
    let restored = Some("restored into the micro model");
    let stages = run(
        "checkpoint_loader",
        Format::Safetensors,
        &seeds,
        restored,
        |b| target.load(b),
    );
    assert_reached("checkpoint_loader", &stages, Stage::Parsed, 0.05);
    assert_reached("checkpoint_loader", &stages, Stage::Used, 0.02);
}

#[test]
fn shard_reader_survives_mutated_shards() {
    let seeds = seeds("shard_reader", &[]);
    let mut target = harness::ShardTarget::new();
    let stages = run(
        "shard_reader",
        Format::Safetensors,
        &seeds,
        Some("read whole"),
        |b| target.load(b),
    );
    assert_reached("shard_reader", &stages, Stage::Parsed, 0.02);
    assert_reached("shard_reader", &stages, Stage::Used, 0.02);
}

/// Rewrites the generated seeds: small safetensors files from both writers,
/// the micro model's checkpoint from a real training run and a validation
/// shard for it from the synthetic dataset writer.
#[test]
#[ignore = "writes the seed corpus under fuzz/corpus; run by hand"]
fn write_seed_corpus() {
    write_safetensors_seeds();
    write_checkpoint_seeds();
    write_shard_seeds();
}

fn write_shard_seeds() {
    use mxswitch::models::flux::RunConfig;
    use mxswitch::train::shards::{write_synthetic_shards, ShardDType, SyntheticShards};

    let dir = corpus_dir("shard_reader");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = RunConfig::from_ron(harness::MICRO_CONFIG, "seed-micro.ron").unwrap();
    for (dtype, name) in [(ShardDType::F32, "f32"), (ShardDType::BF16, "bf16")] {
        let out = tempfile::tempdir().unwrap();
        let opts = SyntheticShards {
            samples: 5,
            shards: 1,
            seed: 3,
            val: true,
            dtype,
            overwrite: false,
        };
        let written = write_synthetic_shards(out.path(), &cfg.model, &cfg.data, &opts).unwrap();
        let bytes = std::fs::read(&written.written[0].0).unwrap();
        std::fs::write(dir.join(format!("seed-val-{name}.safetensors")), bytes).unwrap();
    }
}

fn write_safetensors_seeds() {
    use safetensors::tensor::TensorView;

    let dir = corpus_dir("safetensors_reader");
    let f32s: Vec<u8> = [1.0f32, -2.5, 0.0, f32::MAX, f32::MIN_POSITIVE, -0.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let i64s: Vec<u8> = [i64::MIN, -1, 0, i64::MAX]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let tensor = |name: &str, dtype, shape: &[usize], data| StTensor {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        data,
    };
    let mixed = [
        tensor("w.f32", Dtype::F32, &[2, 3], &f32s[..]),
        tensor("w.bf16", Dtype::BF16, &[2, 2], &f32s[..8]),
        tensor("w.f16", Dtype::F16, &[3], &f32s[8..14]),
        tensor("b.i64", Dtype::I64, &[4], &i64s[..]),
        tensor("u8", Dtype::U8, &[1, 1, 5], &[0, 1, 127, 128, 255]),
        tensor("flags", Dtype::BOOL, &[2], &[0, 1]),
        tensor("scalar", Dtype::F64, &[], &i64s[8..16]),
        tensor("empty", Dtype::F32, &[0, 4], &[]),
        tensor("fp8", Dtype::F8_E4M3, &[2], &[0x38, 0xb8]),
    ];
    let meta = HashMap::from([
        ("format".to_string(), "mxswitch".to_string()),
        ("note".to_string(), "{\"nested\": [1, 2]}".to_string()),
    ]);
    let write_to = |name: &str, tensors: &[StTensor], meta: &HashMap<String, String>| {
        let mut bytes = Vec::new();
        st_file::write(&mut bytes, tensors, meta).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    write_to("seed-mixed.safetensors", &mixed, &meta);
    write_to("seed-metadata-only.safetensors", &[], &meta);
    write_to("seed-no-tensors.safetensors", &[], &HashMap::new());

    // The safetensors library's own layout (header padded with spaces).
    let views: Vec<(String, TensorView)> = mixed[..4]
        .iter()
        .map(|t| {
            let view = TensorView::new(t.dtype, t.shape.clone(), t.data).unwrap();
            (t.name.clone(), view)
        })
        .collect();
    let bytes = safetensors::serialize(views, &None).unwrap();
    std::fs::write(dir.join("seed-library.safetensors"), bytes).unwrap();
}

fn write_checkpoint_seeds() {
    use mxswitch::models::flux::RunConfig;
    use mxswitch::train::{train, TrainOptions};

    let dir = corpus_dir("checkpoint_loader");
    let cfg = RunConfig::from_ron(harness::MICRO_CONFIG, "seed-micro.ron").unwrap();
    let out = tempfile::tempdir().unwrap();
    // Two iterations, so the checkpoint is past the switch.
    train(&TrainOptions {
        iters: Some(2),
        switch_at: Some(1),
        ..TrainOptions::new(cfg, out.path())
    })
    .unwrap();
    let bytes = std::fs::read(out.path().join("checkpoint.safetensors")).unwrap();
    std::fs::write(dir.join("seed-micro-2-iters.safetensors"), bytes).unwrap();
}
