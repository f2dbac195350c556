//! The reader: parses the header from a byte slice (a memory map, or bytes in memory), checking
//! every count, length, offset and size against what the file can hold before using it.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::error::{GgufError, Problem};
use super::value::{Array, Value, ValueType};
use super::{DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};
use crate::gpu::quant::GgmlType;

/// One tensor's description; its data is at `GgufFile::data_offset() + offset`.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGML order: `dims[0]` is the innermost (row length).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        // Checked at parse time not to overflow.
        self.dims.iter().product()
    }

    /// Elements per row (`dims[0]`) and number of rows (the product of the rest).
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.dims.first().copied().unwrap_or(1) as usize;
        let rows = self.dims.iter().skip(1).product::<u64>() as usize;
        (rows, cols)
    }
}

enum Storage {
    /// The map, the file it maps (kept open to notice it changing under the map), and the
    /// file's size and modification time when it was mapped.
    Mapped(Mmap, File, (u64, Option<std::time::SystemTime>)),
    Owned(Vec<u8>),
}

/// An open GGUF file: the parsed header and the tensor data, memory-mapped (or owned, for
/// files built in memory).
pub struct GgufFile {
    path: PathBuf,
    storage: Storage,
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

fn file_stamp(f: &File) -> std::io::Result<(u64, Option<std::time::SystemTime>)> {
    let m = f.metadata()?;
    Ok((m.len(), m.modified().ok()))
}

/// What a non-regular file is, in words.
fn describe_kind(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

impl GgufFile {
    /// Opens and memory-maps a GGUF file and parses its header. Tensor data is not copied.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |cause| GgufError::Io {
            path: path.to_path_buf(),
            cause,
        };
        // Opening a FIFO blocks until someone writes to it, and a device has no size to map:
        // only a regular file (after links) is opened at all.
        let kind = std::fs::metadata(path).map_err(io)?.file_type();
        if !kind.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "not a regular file ({}); a model is a .gguf file",
                    describe_kind(&kind)
                ),
            )));
        }
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // mmap of an empty file fails on some systems; report it as what it is.
            return Self::from_bytes(path, Vec::new());
        }
        // SAFETY: the map is read-only. If another process truncates the file while it is mapped,
        // reads past the new end fault; that is the accepted risk of mmap for model files
        // (llama.cpp takes the same one).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = parse(path, &map)?;
        let stamp = file_stamp(&file).map_err(io)?;
        Ok(Self::assemble(
            path,
            Storage::Mapped(map, file, stamp),
            header,
        ))
    }

    /// Whether the mapped file is still the one that was mapped: a file truncated or
    /// overwritten in place (a download or a copy onto it) faults when a page past its new end is
    /// read (SIGBUS). Checked before every forward step, so that a change is refused with this
    /// message instead. (A file replaced by a rename leaves the map valid and passes.)
    pub fn check_unchanged(&self) -> Result<(), GgufError> {
        let Storage::Mapped(_, file, was) = &self.storage else {
            return Ok(());
        };
        let now = file_stamp(file).map_err(|cause| GgufError::Io {
            path: self.path.clone(),
            cause,
        })?;
        if now == *was {
            return Ok(());
        }
        Err(GgufError::Io {
            path: self.path.clone(),
            cause: std::io::Error::other(format!(
                "the model file changed on disk while in use ({} bytes, now {}); hipscope stops \
                 using it rather than read a page that is no longer there. Load it again \
                 (/model) once it is complete",
                was.0, now.0
            )),
        })
    }

    /// Parses a GGUF file held in memory (`path` is only used to label errors).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let header = parse(path, &bytes)?;
        Ok(Self::assemble(path, Storage::Owned(bytes), header))
    }

    fn assemble(path: &Path, storage: Storage, h: Header) -> GgufFile {
        let key_index = h
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = h
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        GgufFile {
            path: path.to_path_buf(),
            storage,
            version: h.version,
            metadata: h.metadata,
            key_index,
            tensors: h.tensors,
            tensor_index,
            alignment: h.alignment,
            data_offset: h.data_offset,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the tensor data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped(m, _, _) => m,
            Storage::Owned(v) => v,
        }
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key).and_then(Value::as_array)
    }

    /// `general.architecture`, the key prefix of the model's hyperparameters.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's data. Its range was checked against the file when the header was parsed.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.bytes()[start..start + t.size as usize]
    }

    /// The weight type most matrices (by bytes) have: a file's type when `general.file_type`
    /// does not say it ([`GgufFile::type_label`]).
    pub fn dominant_type(&self) -> Option<GgmlType> {
        let mut by_type: HashMap<GgmlType, u64> = HashMap::new();
        for t in self.tensors.iter().filter(|t| t.dims.len() >= 2) {
            *by_type.entry(t.ty).or_default() += t.size;
        }
        by_type.into_iter().max_by_key(|&(_, b)| b).map(|(t, _)| t)
    }

    /// What the file's weights are, as llama.cpp names them: from `general.file_type`
    /// ("Q4_K - Medium", `ftype.rs`), else (no key, or a value llama.cpp does not know) the type
    /// most of the matrices' bytes have ("Q4_0"). `None` for a file without matrices.
    pub fn type_label(&self) -> Option<String> {
        self.get_u64("general.file_type")
            .and_then(|v| u32::try_from(v).ok())
            .and_then(super::ftype::ftype_name)
            .map(str::to_string)
            .or_else(|| self.dominant_type().map(|t| t.name().to_string()))
    }

    /// Total number of weights.
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(TensorInfo::n_elements).sum()
    }
}

impl AsRef<[u8]> for GgufFile {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

struct Header {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A cursor over the file that checks every read and names the field being read in errors.
struct Cursor<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
    field: String,
}

impl<'a> Cursor<'a> {
    fn err(&self, problem: Problem) -> GgufError {
        self.err_at(self.pos as u64, problem)
    }

    fn err_at(&self, offset: u64, problem: Problem) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            field: self.field.clone(),
            offset,
            problem,
        }
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.err(Problem::Truncated {
                need: n,
                available: self.remaining(),
            }));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, GgufError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count of items each at least `min_size` bytes long: refused if the rest of the file
    /// cannot hold that many, so that no hostile count drives an allocation.
    fn count(&mut self, min_size: u64) -> Result<u64, GgufError> {
        let at = self.pos as u64;
        let n = self.u64()?;
        let max = self.remaining() / min_size.max(1);
        if n > max {
            return Err(self.err_at(at, Problem::CountTooLarge { count: n, max }));
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.count(1)?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err_at(at, Problem::InvalidUtf8))
    }

    fn value_type(&mut self) -> Result<ValueType, GgufError> {
        let at = self.pos as u64;
        let t = self.u32()?;
        ValueType::from_u32(t).ok_or_else(|| self.err_at(at, Problem::UnknownValueType(t)))
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8()?),
            ValueType::I8 => Value::I8(self.u8()? as i8),
            ValueType::U16 => Value::U16(self.u16()?),
            ValueType::I16 => Value::I16(self.u16()? as i16),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(self.u32()? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32()?)),
            // Any non-zero byte is true, as in C.
            ValueType::Bool => Value::Bool(self.u8()? != 0),
            ValueType::String => Value::String(self.string()?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(self.u64()? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64()?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(Problem::NestingTooDeep));
                }
                let item_ty = self.value_type()?;
                let n = self.count(item_ty.min_size())?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(item_ty, depth + 1)?);
                }
                Value::Array(Array { ty: item_ty, items })
            }
        })
    }
}

fn parse(path: &Path, buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor {
        path,
        buf,
        pos: 0,
        field: "magic".into(),
    };
    let magic = c.array::<4>()?;
    if magic != MAGIC {
        return Err(c.err_at(0, Problem::BadMagic(magic)));
    }
    c.field = "version".into();
    let version = c.u32()?;
    if version != 2 && version != 3 {
        return Err(c.err_at(4, Problem::UnsupportedVersion(version)));
    }
    // A tensor info takes at least: name length (8) + n_dims (4) + one dim (8) + type (4) +
    // offset (8); a key/value pair at least: key length (8) + type (4) + a one-byte value.
    c.field = "tensor_count".into();
    let n_tensors = c.count(32)?;
    c.field = "metadata_kv_count".into();
    let n_kv = c.count(13)?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    let mut seen = HashMap::new();
    for i in 0..n_kv {
        c.field = format!("metadata key #{i}");
        let key_at = c.pos as u64;
        let key = c.string()?;
        c.field = format!("metadata value of {key:?}");
        let ty = c.value_type()?;
        let value = c.value(ty, 0)?;
        if seen.insert(key.clone(), ()).is_some() {
            c.field = format!("metadata key #{i}");
            return Err(c.err_at(key_at, Problem::DuplicateKey(key)));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            c.field = "general.alignment".into();
            return Err(c.err(Problem::BadAlignment(format!(
                "{} (must be a u32 power of two)",
                v.summary()
            ))));
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut tensor_names = HashMap::new();
    for i in 0..n_tensors {
        c.field = format!("tensor info #{i}");
        let info_at = c.pos as u64;
        let name = c.string()?;
        c.field = format!("tensor info #{i} ({name:?})");
        let dims_at = c.pos as u64;
        let n_dims = c.u32()?;
        if n_dims as usize > MAX_DIMS {
            return Err(c.err_at(dims_at, Problem::TooManyDims(n_dims)));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64()?);
        }
        if dims.contains(&0) {
            return Err(c.err_at(dims_at, Problem::ZeroDim));
        }
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| c.err_at(dims_at, Problem::SizeOverflow))?;
        let type_at = c.pos as u64;
        let type_id = c.u32()?;
        let ty = GgmlType::from_id(type_id)
            .ok_or_else(|| c.err_at(type_at, Problem::UnknownTensorType(type_id)))?;
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % ty.block_len() as u64 != 0 {
            return Err(c.err_at(
                dims_at,
                Problem::NotWholeBlocks {
                    type_name: ty.name(),
                    ne0,
                    block: ty.block_len(),
                },
            ));
        }
        let size = ty
            .bytes_for(n_elements)
            .ok_or_else(|| c.err_at(dims_at, Problem::SizeOverflow))?;
        let offset_at = c.pos as u64;
        let offset = c.u64()?;
        if offset % alignment != 0 {
            return Err(c.err_at(offset_at, Problem::Misaligned { offset, alignment }));
        }
        if tensor_names.insert(name.clone(), ()).is_some() {
            return Err(c.err_at(info_at, Problem::DuplicateTensor(name)));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            size,
        });
    }

    c.field = "tensor data".into();
    let header_end = c.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for t in &tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.size))
            .ok_or_else(|| c.err_at(header_end, Problem::SizeOverflow))?;
        if end > file_len {
            c.field = format!("tensor data of {:?}", t.name);
            return Err(c.err_at(
                data_offset.saturating_add(t.offset),
                Problem::DataOutOfBounds { end, file_len },
            ));
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
