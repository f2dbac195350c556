use std::fmt;
use std::path::PathBuf;

/// A GGUF file could not be read. Says which file, which field and at which byte offset.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: {problem} (in {field}, at byte {offset})")]
    Malformed {
        path: PathBuf,
        field: String,
        offset: u64,
        problem: Problem,
    },
}

impl GgufError {
    /// The specific problem, for a malformed file.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            GgufError::Malformed { problem, .. } => Some(problem),
            GgufError::Io { .. } => None,
        }
    }
}

/// What is wrong with a malformed GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    BadMagic([u8; 4]),
    UnsupportedVersion(u32),
    /// The file ends before `need` more bytes could be read.
    Truncated {
        need: u64,
        available: u64,
    },
    /// A count or length that cannot fit in what is left of the file.
    CountTooLarge {
        count: u64,
        max: u64,
    },
    InvalidUtf8,
    UnknownValueType(u32),
    NestingTooDeep,
    DuplicateKey(String),
    DuplicateTensor(String),
    /// `general.alignment` of the wrong type, zero, or not a power of two.
    BadAlignment(String),
    TooManyDims(u32),
    ZeroDim,
    SizeOverflow,
    UnknownTensorType(u32),
    /// The first dimension is not a whole number of blocks of the tensor's type.
    NotWholeBlocks {
        type_name: &'static str,
        ne0: u64,
        block: usize,
    },
    Misaligned {
        offset: u64,
        alignment: u64,
    },
    /// Tensor data beyond the end of the file.
    DataOutOfBounds {
        end: u64,
        file_len: u64,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::BadMagic(m) => write!(
                f,
                "not a GGUF file: magic is {:?}, expected \"GGUF\"",
                String::from_utf8_lossy(m)
            ),
            Problem::UnsupportedVersion(v) => {
                write!(f, "GGUF version {v} is not supported (2 and 3 are)")
            }
            Problem::Truncated { need, available } => write!(
                f,
                "file is truncated: {need} more bytes needed, {available} left"
            ),
            Problem::CountTooLarge { count, max } => write!(
                f,
                "count {count} cannot fit in the rest of the file (at most {max})"
            ),
            Problem::InvalidUtf8 => write!(f, "string is not valid UTF-8"),
            Problem::UnknownValueType(t) => write!(f, "unknown metadata value type {t}"),
            Problem::NestingTooDeep => write!(f, "arrays nested too deeply"),
            Problem::DuplicateKey(k) => write!(f, "metadata key {k:?} appears twice"),
            Problem::DuplicateTensor(n) => write!(f, "tensor {n:?} appears twice"),
            Problem::BadAlignment(why) => write!(f, "bad general.alignment: {why}"),
            Problem::TooManyDims(n) => write!(f, "{n} dimensions (GGML allows at most 4)"),
            Problem::ZeroDim => write!(f, "a dimension is zero"),
            Problem::SizeOverflow => write!(f, "tensor size overflows 64 bits"),
            Problem::UnknownTensorType(t) => write!(f, "unknown tensor type id {t}"),
            Problem::NotWholeBlocks {
                type_name,
                ne0,
                block,
            } => write!(
                f,
                "first dimension {ne0} is not a multiple of the {type_name} block size {block}"
            ),
            Problem::Misaligned { offset, alignment } => {
                write!(
                    f,
                    "data offset {offset} is not a multiple of the alignment {alignment}"
                )
            }
            Problem::DataOutOfBounds { end, file_len } => write!(
                f,
                "tensor data ends at byte {end}, past the end of the file ({file_len} bytes)"
            ),
        }
    }
}
