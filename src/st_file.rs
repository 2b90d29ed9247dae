//! The one safetensors reader and writer of the crate, used by `quantize`
//! and by training checkpoints.
//!
//! The reader parses the header itself with checked arithmetic, so no byte
//! string (a truncated file, a hostile header with sizes near `u64::MAX`)
//! can make it panic, and every rejection is a reason in words. The writer
//! streams the tensors into any `Write`, so an output need not be built in
//! memory a second time.

use std::collections::HashMap;
use std::io::{self, Write};

use mxswitch_runtime::formats::bf16;
use safetensors::tensor::{Dtype, SafeTensorError};
use serde_json::{Map, Value};

/// One tensor of a safetensors file: little-endian element bytes, as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct StTensor<'a> {
    /// The tensor's key in the header (any UTF-8 string).
    pub name: String,
    /// Element type, as the header's `dtype` names it (`F32`, `BF16`, ...).
    pub dtype: Dtype,
    /// Dimensions, outermost first; `[]` for a scalar.
    pub shape: Vec<usize>,
    /// The element bytes, exactly `shape`'s element count times the dtype's
    /// size (checked by [`parse`]), borrowed from the file's bytes.
    pub data: &'a [u8],
}

/// A float tensor's little-endian values as f32: F32 as stored, BF16 and
/// F16 widened exactly, F64 rounded to nearest; `None` for any other dtype.
pub fn floats(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    let x = match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect(),
        _ => return None,
    };
    Some(x)
}

/// Why a header size does not fit (the first 8 bytes of any other file give
/// some huge number).
const BAD_HEADER_SIZE: &str =
    "the header size in its first 8 bytes does not fit the file (truncated, or not safetensors)";
/// Why the data section does not match the header.
const BAD_DATA_SIZE: &str =
    "its data section does not match the sizes in its header (truncated, or trailing bytes)";
/// The key of the string-to-string map beside the tensors.
const METADATA_KEY: &str = "__metadata__";

/// The tensors of a safetensors file sorted by name, and its `__metadata__`
/// map (empty if absent). The error is the reason, in words, that the bytes
/// are not a usable safetensors file; tensor names in it are [`printable`].
pub fn parse(bytes: &[u8]) -> Result<(Vec<StTensor<'_>>, HashMap<String, String>), String> {
    let Some((size, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(too_short(bytes.len() as u64));
    };
    let header_len = u64::from_le_bytes(*size);
    let (header, data) = usize::try_from(header_len)
        .ok()
        .filter(|&n| n <= rest.len())
        .map(|n| rest.split_at(n))
        .ok_or(BAD_HEADER_SIZE)?;
    let (entries, metadata) = parse_layout(header, data.len())?;
    let tensors = entries
        .into_iter()
        .map(|e| StTensor {
            data: &data[e.start..e.end],
            name: e.name,
            dtype: e.dtype,
            shape: e.shape,
        })
        .collect();
    Ok((tensors, metadata))
}

/// The largest header [`read_header`] reads (the safetensors library's limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A tensor's entry in a safetensors header: what it is and where its bytes
/// lie in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct StEntry {
    /// The tensor's key (any UTF-8 string).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Byte position of the first element in the file.
    pub offset: u64,
    /// Bytes of data: the element count times the dtype's size.
    pub len: u64,
}

/// The header of a safetensors file, read without its data section.
#[derive(Clone, Debug, PartialEq)]
pub struct StHeader {
    /// The tensors sorted by name.
    pub tensors: Vec<StEntry>,
    /// The `__metadata__` map (empty if absent).
    pub metadata: HashMap<String, String>,
}

impl StHeader {
    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&StEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Reads and checks only the header of the safetensors file `r` of
/// `file_len` bytes: its first 8 bytes and the header they size, never the
/// data section. Every check of [`parse`] is made (the data offsets must
/// tile a data section of the size the file has), with the same reasons,
/// and a header over [`MAX_HEADER_BYTES`] is refused too. An I/O error is
/// a reason in the same way.
pub fn read_header(mut r: impl io::Read, file_len: u64) -> Result<StHeader, String> {
    let io_err = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => "it ended while its header was read (it shrank)".into(),
        _ => format!("reading its header failed: {e}"),
    };
    if file_len < 8 {
        return Err(too_short(file_len));
    }
    let mut size = [0u8; 8];
    r.read_exact(&mut size).map_err(io_err)?;
    let header_len = u64::from_le_bytes(size);
    if header_len > file_len - 8 {
        return Err(BAD_HEADER_SIZE.into());
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(format!(
            "its header is {header_len} bytes, more than the {MAX_HEADER_BYTES} safetensors allows"
        ));
    }
    let data_len =
        usize::try_from(file_len - 8 - header_len).map_err(|_| BAD_DATA_SIZE.to_string())?;
    let mut header = vec![0u8; header_len as usize];
    r.read_exact(&mut header).map_err(io_err)?;
    let (entries, metadata) = parse_layout(&header, data_len)?;
    let data_start = 8 + header_len;
    let tensors = entries
        .into_iter()
        .map(|e| StEntry {
            offset: data_start + e.start as u64,
            len: (e.end - e.start) as u64,
            name: e.name,
            dtype: e.dtype,
            shape: e.shape,
        })
        .collect();
    Ok(StHeader { tensors, metadata })
}

fn too_short(len: u64) -> String {
    format!("it is {len} bytes long, too short for the 8-byte header size")
}

/// A checked header entry with its range in the data section.
struct Placed {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// The checks [`parse`] and [`read_header`] share: the header text is a
/// JSON object of valid entries whose data ranges tile a data section of
/// `data_len` bytes exactly. The entries come sorted by name.
fn parse_layout(
    header: &[u8],
    data_len: usize,
) -> Result<(Vec<Placed>, HashMap<String, String>), String> {
    let header = std::str::from_utf8(header).map_err(|_| "its header is not UTF-8 text")?;
    let entries = match serde_json::from_str::<Value>(header) {
        Ok(Value::Object(entries)) => entries,
        Ok(_) => return Err("its header is JSON but not an object of tensors".into()),
        Err(_) => return Err("its header is not JSON".into()),
    };
    let mut metadata = HashMap::new();
    let mut found: Vec<Placed> = Vec::with_capacity(entries.len());
    for (name, entry) in entries {
        if name == METADATA_KEY {
            metadata = parse_metadata(entry)?;
            continue;
        }
        let info = parse_entry(&name, &entry)?;
        found.push(Placed {
            name,
            dtype: info.dtype,
            shape: info.shape,
            start: info.start,
            end: info.end,
        });
    }
    // Tensors must tile the data section exactly, in offset order.
    found.sort_by_key(|p| (p.start, p.end));
    let mut pos = 0;
    for p in &found {
        if p.end > data_len {
            return Err(BAD_DATA_SIZE.into());
        }
        if p.start != pos {
            return Err(format!(
                "the data of tensor `{}` {} another tensor's (its data offsets are invalid)",
                printable(&p.name),
                if p.start < pos {
                    "overlaps"
                } else {
                    "leaves a gap after"
                }
            ));
        }
        pos = p.end;
    }
    if pos != data_len {
        return Err(BAD_DATA_SIZE.into());
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((found, metadata))
}

/// One header entry, checked: its dtype, shape and a data range whose
/// length is what the dtype and shape need.
struct EntryInfo {
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

fn parse_entry(name: &str, entry: &Value) -> Result<EntryInfo, String> {
    let shown = printable(name);
    let field = |key: &str| {
        entry
            .get(key)
            .ok_or_else(|| format!("tensor `{shown}` has no `{key}` in the header"))
    };
    let dtype_value = field("dtype")?;
    let dtype = serde_json::from_value::<Dtype>(dtype_value.clone()).map_err(|_| {
        format!("tensor `{shown}` has dtype {dtype_value}, which this reader does not support")
    })?;
    let shape = usizes(field("shape")?)
        .ok_or_else(|| format!("the shape of tensor `{shown}` is not a list of sizes"))?;
    let offsets = usizes(field("data_offsets")?).filter(|o| o.len() == 2);
    let Some(&[start, end]) = offsets.as_deref() else {
        return Err(format!(
            "the data offsets of tensor `{shown}` are not two byte positions"
        ));
    };
    let need = byte_len(dtype, &shape).ok_or_else(|| {
        format!("tensor `{shown}` has shape {shape:?}, whose size in bytes overflows")
    })?;
    let Some(span) = end.checked_sub(start) else {
        return Err(format!(
            "the data offsets of tensor `{shown}` end before they start"
        ));
    };
    if span != need {
        return Err(format!(
            "tensor `{shown}` is {dtype:?} of shape {shape:?}, which needs {need} bytes, \
             but its data offsets span {span}"
        ));
    }
    Ok(EntryInfo {
        dtype,
        shape,
        start,
        end,
    })
}

/// A JSON array of non-negative integers that fit `usize`.
fn usizes(v: &Value) -> Option<Vec<usize>> {
    v.as_array()?
        .iter()
        .map(|d| usize::try_from(d.as_u64()?).ok())
        .collect()
}

fn parse_metadata(v: Value) -> Result<HashMap<String, String>, String> {
    let bad = || format!("its `{METADATA_KEY}` is not a map of strings to strings");
    let Value::Object(map) = v else {
        return Err(bad());
    };
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(bad()),
        })
        .collect()
}

/// Bytes of a tensor of `dtype` and `shape`; `None` on overflow.
fn byte_len(dtype: Dtype, shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
}

/// A tensor name fit for a terminal: control characters (escape sequences,
/// line breaks) and bidirectional overrides are shown as `\x1b` or `\u{202e}`.
pub fn printable(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            let code = u32::from(c);
            if code < 0x100 {
                out.push_str(&format!("\\x{code:02x}"));
            } else {
                out.push_str(&format!("\\u{{{code:x}}}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A safetensors library error in words (its own `Display` is `Debug`).
pub fn explain(err: SafeTensorError) -> String {
    match err {
        SafeTensorError::InvalidHeader => "its header is not UTF-8 text".into(),
        SafeTensorError::InvalidHeaderStart => "its header does not start with `{`".into(),
        SafeTensorError::InvalidHeaderDeserialization => {
            "its header is not a valid safetensors header".into()
        }
        SafeTensorError::HeaderTooLarge => "its header is larger than safetensors allows".into(),
        SafeTensorError::HeaderTooSmall => "it is too short for the 8-byte header size".into(),
        SafeTensorError::InvalidHeaderLength => BAD_HEADER_SIZE.into(),
        SafeTensorError::TensorNotFound(name) => {
            format!("it holds no tensor `{}`", printable(&name))
        }
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's dtype, shape and data offsets do not agree".into()
        }
        SafeTensorError::InvalidOffset(name) => {
            format!(
                "the data offsets of tensor `{}` are invalid",
                printable(&name)
            )
        }
        SafeTensorError::IoError(e) => e.to_string(),
        SafeTensorError::JsonError(e) => format!("its header is not valid JSON ({e})"),
        SafeTensorError::InvalidTensorView(dtype, shape, len) => {
            tensor_size_mismatch(dtype, &shape, len)
        }
        SafeTensorError::MetadataIncompleteBuffer => BAD_DATA_SIZE.into(),
        SafeTensorError::ValidationOverflow => {
            "a tensor's shape is so large that its size in bytes overflows".into()
        }
    }
}

fn tensor_size_mismatch(dtype: Dtype, shape: &[usize], len: usize) -> String {
    match byte_len(dtype, shape) {
        Some(need) => {
            format!("a {dtype:?} tensor of shape {shape:?} needs {need} bytes, not {len}")
        }
        None => format!("a {dtype:?} tensor of shape {shape:?} is too large to address"),
    }
}

/// A tensor that owns its bytes: name, dtype, shape and little-endian data,
/// for callers that build or edit tensors before writing them.
pub type OwnedTensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// [`write()`] for owned tensors: the same file, from borrowed views of them.
pub fn write_owned(
    w: impl Write,
    tensors: &[OwnedTensor],
    metadata: &HashMap<String, String>,
) -> io::Result<()> {
    let views: Vec<StTensor> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| StTensor {
            name: name.clone(),
            dtype: *dtype,
            shape: shape.clone(),
            data,
        })
        .collect();
    write(w, &views, metadata)
}

/// Write `tensors` and `metadata` as a safetensors file to `w`. Tensors are
/// laid out by decreasing element size, then by name, so that every tensor
/// is aligned to its element size (as the safetensors library lays them out).
/// Fails with `InvalidInput` on a duplicate name or a tensor whose bytes do
/// not fill its shape.
pub fn write(
    w: impl Write,
    tensors: &[StTensor],
    metadata: &HashMap<String, String>,
) -> io::Result<()> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let mut order: Vec<&StTensor> = tensors.iter().collect();
    order.sort_by(|a, b| (b.dtype.size().cmp(&a.dtype.size())).then_with(|| a.name.cmp(&b.name)));
    let mut header = Map::new();
    if !metadata.is_empty() {
        let meta = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        header.insert(METADATA_KEY.into(), Value::Object(meta));
    }
    let mut pos = 0usize;
    for t in &order {
        if byte_len(t.dtype, &t.shape) != Some(t.data.len()) {
            return Err(invalid(format!(
                "tensor `{}`: {}",
                printable(&t.name),
                tensor_size_mismatch(t.dtype, &t.shape, t.data.len())
            )));
        }
        let end = pos + t.data.len();
        let entry = serde_json::json!({
            "dtype": t.dtype,
            "shape": t.shape,
            "data_offsets": [pos, end],
        });
        if t.name == METADATA_KEY || header.insert(t.name.clone(), entry).is_some() {
            return Err(invalid(format!(
                "two tensors are named `{}`",
                printable(&t.name)
            )));
        }
        pos = end;
    }
    let mut header = serde_json::to_vec(&Value::Object(header)).map_err(io::Error::other)?;
    // Pad with spaces so the data section starts 8-byte aligned.
    header.resize(header.len().div_ceil(8) * 8, b' ');
    let mut w = io::BufWriter::new(w);
    w.write_all(&(header.len() as u64).to_le_bytes())?;
    w.write_all(&header)?;
    for t in order {
        w.write_all(t.data)?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file from a raw header and data section.
    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        b
    }

    fn err(bytes: &[u8]) -> String {
        parse(bytes).unwrap_err()
    }

    #[test]
    fn round_trips_through_the_safetensors_library() {
        let a: Vec<u8> = [1.0f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let tensors = [
            StTensor {
                name: "b".into(),
                dtype: Dtype::U8,
                shape: vec![3],
                data: &[1, 2, 3],
            },
            StTensor {
                name: "a".into(),
                dtype: Dtype::F32,
                shape: vec![1, 2],
                data: &a,
            },
            StTensor {
                name: "empty".into(),
                dtype: Dtype::F16,
                shape: vec![0, 4],
                data: &[],
            },
        ];
        let meta = HashMap::from([("k".to_string(), "v".to_string())]);
        let mut bytes = Vec::new();
        write(&mut bytes, &tensors, &meta).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("a").unwrap().data(), &a[..]);
        assert_eq!(st.tensor("b").unwrap().shape(), [3]);
        let (read, read_meta) = parse(&bytes).unwrap();
        assert_eq!(read_meta, meta);
        let names: Vec<&str> = read.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "empty"]);
        assert_eq!(read[0], tensors[1]);
        assert_eq!(read[1], tensors[0]);
        assert_eq!(read[2].shape, [0, 4]);
    }

    #[test]
    fn reads_what_the_safetensors_library_writes() {
        let data = [7u8, 8, 9, 10];
        let view = safetensors::tensor::TensorView::new(Dtype::I16, vec![2], &data).unwrap();
        let bytes = safetensors::serialize([("x", view)], &None).unwrap();
        let (t, meta) = parse(&bytes).unwrap();
        assert!(meta.is_empty());
        assert_eq!(t[0].name, "x");
        assert_eq!(t[0].dtype, Dtype::I16);
        assert_eq!(t[0].data, data);
    }

    #[test]
    fn writer_refuses_bad_tensors() {
        let bad = [StTensor {
            name: "w\x1b".into(),
            dtype: Dtype::F32,
            shape: vec![2],
            data: &[0; 4],
        }];
        let e = write(Vec::new(), &bad, &HashMap::new()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            e.to_string(),
            "tensor `w\\x1b`: a F32 tensor of shape [2] needs 8 bytes, not 4"
        );
        let t = StTensor {
            name: "d".into(),
            dtype: Dtype::U8,
            shape: vec![1],
            data: &[0],
        };
        let e = write(Vec::new(), &[t.clone(), t], &HashMap::new()).unwrap_err();
        assert!(e.to_string().contains("two tensors are named `d`"), "{e}");
    }

    #[test]
    fn every_rejection_is_in_words() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![1, 2, 3], "it is 3 bytes long, too short"),
            (u64::MAX.to_le_bytes().to_vec(), "does not fit the file"),
            (
                b"hello, this is not safetensors".to_vec(),
                "does not fit the file",
            ),
            (file("{\"a\":", b""), "its header is not JSON"),
            (file("[1,2]", b""), "not an object of tensors"),
            (
                {
                    let mut b = 2u64.to_le_bytes().to_vec();
                    b.extend_from_slice(&[0xff, 0xfe]);
                    b
                },
                "not UTF-8",
            ),
            (
                file(r#"{"x":{"shape":[1],"data_offsets":[0,1]}}"#, &[0]),
                "tensor `x` has no `dtype`",
            ),
            (
                file(
                    r#"{"x":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}"#,
                    &[0],
                ),
                "tensor `x` has dtype \"Q9\", which this reader does not support",
            ),
            (
                file(
                    r#"{"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
                    &[0],
                ),
                "the shape of tensor `x` is not a list of sizes",
            ),
            (
                file(
                    r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0]}}"#,
                    &[0],
                ),
                "not two byte positions",
            ),
            (
                file(
                    r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}}"#,
                    &[0],
                ),
                "end before they start",
            ),
            (
                file(
                    r#"{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}}"#,
                    &[0],
                ),
                "needs 2 bytes, but its data offsets span 1",
            ),
            (
                file(
                    r#"{"x":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,1]}}"#,
                    &[0],
                ),
                "overflows",
            ),
            (
                file(
                    r#"{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
                    &[0],
                ),
                "truncated",
            ),
            (
                file(
                    r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
                    &[0, 0],
                ),
                "trailing bytes",
            ),
            (
                file(
                    r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"y":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
                    &[0],
                ),
                "overlaps another tensor's",
            ),
            (
                file(
                    r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
                    &[0, 0],
                ),
                "leaves a gap",
            ),
            (
                file(r#"{"__metadata__":{"k":1}}"#, b""),
                "`__metadata__` is not a map of strings to strings",
            ),
        ];
        for (bytes, needle) in cases {
            let e = err(&bytes);
            assert!(e.contains(needle), "`{needle}` not in `{e}`");
        }
    }

    #[test]
    fn hostile_offsets_near_usize_max_do_not_panic() {
        let max = u64::MAX;
        for header in [
            format!(
                r#"{{"x":{{"dtype":"U8","shape":[{}],"data_offsets":[0,{}]}}}}"#,
                max - 8,
                max - 8
            ),
            format!(
                r#"{{"x":{{"dtype":"U8","shape":[1],"data_offsets":[{},{max}]}}}}"#,
                max - 1
            ),
            format!(r#"{{"x":{{"dtype":"U8","shape":[{max}],"data_offsets":[0,{max}]}}}}"#),
        ] {
            let e = err(&file(&header, &[0; 16]));
            assert!(e.contains("truncated"), "{e}");
        }
    }

    #[test]
    fn no_byte_string_panics() {
        // Every prefix and many one-byte corruptions of a valid file.
        let tensors = [StTensor {
            name: "w".into(),
            dtype: Dtype::BF16,
            shape: vec![2, 2],
            data: &[1, 2, 3, 4, 5, 6, 7, 8],
        }];
        let mut good = Vec::new();
        write(
            &mut good,
            &tensors,
            &HashMap::from([("a".into(), "b".into())]),
        )
        .unwrap();
        for n in 0..good.len() {
            let _ = parse(&good[..n]);
        }
        for i in 0..good.len() {
            for v in [0u8, b'9', b'"', b'-', 0xff] {
                let mut b = good.clone();
                b[i] = v;
                let _ = parse(&b);
            }
        }
        assert!(parse(&good).is_ok());
    }

    /// `read_header` makes parse's checks with parse's reasons: on every
    /// prefix and many corruptions of a valid file, and on parse's own
    /// rejection cases, both fail alike or both find the same tensors.
    #[test]
    fn read_header_agrees_with_parse() {
        let a: Vec<u8> = (0..24).collect();
        let tensors = [
            StTensor {
                name: "w".into(),
                dtype: Dtype::F32,
                shape: vec![2, 3],
                data: &a,
            },
            StTensor {
                name: "b".into(),
                dtype: Dtype::BF16,
                shape: vec![2],
                data: &[9, 8, 7, 6],
            },
        ];
        let mut good = Vec::new();
        write(
            &mut good,
            &tensors,
            &HashMap::from([("k".into(), "v".into())]),
        )
        .unwrap();
        let mut corpus: Vec<Vec<u8>> = (0..=good.len()).map(|n| good[..n].to_vec()).collect();
        for i in 0..good.len() {
            for v in [0u8, b'9', b'"', b'-', b']', 0xff] {
                let mut b = good.clone();
                b[i] = v;
                corpus.push(b);
            }
        }
        let mut grown = good.clone();
        grown.push(0);
        corpus.push(grown);
        let (mut oks, mut errs) = (0, 0);
        for bytes in &corpus {
            match (parse(bytes), read_header(&bytes[..], bytes.len() as u64)) {
                (Ok((ts, meta)), Ok(h)) => {
                    oks += 1;
                    assert_eq!(h.metadata, meta);
                    assert_eq!(h.tensors.len(), ts.len());
                    for (e, t) in h.tensors.iter().zip(&ts) {
                        assert_eq!((&e.name, e.dtype, &e.shape), (&t.name, t.dtype, &t.shape));
                        let (at, len) = (e.offset as usize, e.len as usize);
                        assert_eq!(&bytes[at..at + len], t.data);
                    }
                }
                (Err(p), Err(h)) => {
                    errs += 1;
                    assert_eq!(p, h);
                }
                (p, h) => panic!("parse {:?} but read_header {h:?}", p.map(|_| ())),
            }
        }
        assert!(oks >= 1 && errs > 100, "{oks} {errs}");
        assert_eq!(
            read_header(&good[..], good.len() as u64)
                .unwrap()
                .get("b")
                .unwrap()
                .len,
            4
        );
    }

    /// The data section is never read, a header over the limit is refused
    /// before it is read, and a file that ends early is a reason in words.
    #[test]
    fn read_header_reads_only_the_header() {
        let tensors = [StTensor {
            name: "x".into(),
            dtype: Dtype::U8,
            shape: vec![1000],
            data: &[5; 1000],
        }];
        let mut good = Vec::new();
        write(&mut good, &tensors, &HashMap::new()).unwrap();
        let header_end = good.len() - 1000;
        let h = read_header(&good[..header_end], good.len() as u64).unwrap();
        assert_eq!(
            (h.tensors[0].offset, h.tensors[0].len),
            (header_end as u64, 1000)
        );
        let e = read_header(&good[..20], good.len() as u64).unwrap_err();
        assert_eq!(e, "it ended while its header was read (it shrank)");
        let huge = (MAX_HEADER_BYTES + 1).to_le_bytes();
        let e = read_header(&huge[..], 1 << 40).unwrap_err();
        assert!(
            e.contains("more than the 100000000 safetensors allows"),
            "{e}"
        );
        assert_eq!(
            read_header(&[0u8; 3][..], 3).unwrap_err(),
            "it is 3 bytes long, too short for the 8-byte header size"
        );
    }

    #[test]
    fn printable_escapes_controls_and_keeps_the_rest() {
        assert_eq!(printable("layer.0.w"), "layer.0.w");
        assert_eq!(printable("größe→"), "größe→");
        assert_eq!(printable("a\x1b[31mb\n\t"), "a\\x1b[31mb\\x0a\\x09");
        assert_eq!(printable("x\u{202e}y\u{85}"), "x\\u{202e}y\\x85");
    }

    #[test]
    fn explain_maps_library_errors_to_words() {
        for e in [
            SafeTensorError::HeaderTooSmall,
            SafeTensorError::MetadataIncompleteBuffer,
            SafeTensorError::ValidationOverflow,
            SafeTensorError::InvalidHeaderDeserialization,
            SafeTensorError::TensorInvalidInfo,
            SafeTensorError::InvalidTensorView(Dtype::F32, vec![3], 4),
            SafeTensorError::InvalidOffset("w\x07".into()),
        ] {
            let debug = format!("{e:?}");
            let words = explain(e);
            assert_ne!(words, debug);
            assert!(
                !words.contains("Metadata") && !words.contains("Header"),
                "{words}"
            );
            assert!(!words.contains('\x07'), "{words}");
        }
        assert_eq!(
            explain(SafeTensorError::InvalidTensorView(Dtype::F32, vec![3], 4)),
            "a F32 tensor of shape [3] needs 12 bytes, not 4"
        );
    }
}
