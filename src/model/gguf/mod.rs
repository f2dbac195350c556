//! GGUF model files: reading (memory-mapped, every offset and size checked) and writing.
//!
//! Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>. A file is a header (magic,
//! version, tensor count, metadata count), the metadata key/value pairs, the tensor infos, padding to
//! `general.alignment`, then the tensor data. Versions 2 and 3 are read (version 1, with 32-bit
//! counts, predates every model in circulation); version 3 is written.

mod error;
pub mod ftype;
mod read;
mod value;
mod write;

pub use error::{GgufError, Problem};
pub use read::{GgufFile, TensorInfo};
pub use value::{Array, Value, ValueType};
pub use write::{GgufWriter, TensorSpec, string_array};

/// `GGUF` in file order.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays accepted (real files use one level; this bounds recursion).
pub const MAX_ARRAY_DEPTH: usize = 8;

#[cfg(test)]
mod tests;
