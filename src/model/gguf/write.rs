//! The writer: a header with metadata and tensor infos, then the tensors' data streamed in order,
//! each padded to the alignment, so that a multi-gigabyte model never has to sit in memory whole.

use std::io::{self, Write};

use super::value::{Value, ValueType};
use super::{DEFAULT_ALIGNMENT, MAGIC};
use crate::gpu::quant::GgmlType;

/// A tensor to be written: its name, GGML-order dims and type.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dims: &[u64], ty: GgmlType) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
        }
    }

    /// Bytes of data, or None if the dims are not whole blocks of the type.
    pub fn size(&self) -> Option<u64> {
        let n = self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        if self.dims.first().copied().unwrap_or(1) % self.ty.block_len() as u64 != 0 {
            return None;
        }
        self.ty.bytes_for(n)
    }
}

/// Writes a GGUF v3 file: `new` writes the header, `write_tensor` each tensor's data in the order
/// given, `finish` checks that all were written.
pub struct GgufWriter<W: Write> {
    out: W,
    sizes: Vec<(String, u64)>,
    next: usize,
    alignment: u64,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl<W: Write> GgufWriter<W> {
    pub fn new(
        mut out: W,
        metadata: &[(String, Value)],
        tensors: &[TensorSpec],
    ) -> io::Result<GgufWriter<W>> {
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => *a as u64,
            Some(_) => {
                return Err(invalid(
                    "general.alignment must be a u32 power of two".into(),
                ));
            }
        };
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            put_string(&mut h, key);
            h.extend_from_slice(&(value.ty() as u32).to_le_bytes());
            put_value(&mut h, value)?;
        }
        let mut sizes = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for t in tensors {
            let size = t.size().ok_or_else(|| {
                invalid(format!(
                    "tensor {}: dims {:?} are not whole {} blocks",
                    t.name, t.dims, t.ty
                ))
            })?;
            put_string(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + size).div_ceil(alignment) * alignment;
            sizes.push((t.name.clone(), size));
        }
        let padded = (h.len() as u64).div_ceil(alignment) * alignment;
        h.resize(padded as usize, 0);
        out.write_all(&h)?;
        Ok(GgufWriter {
            out,
            sizes,
            next: 0,
            alignment,
        })
    }

    /// Writes the next tensor's data; its length must be that tensor's size.
    pub fn write_tensor(&mut self, data: &[u8]) -> io::Result<()> {
        let (name, size) = self
            .sizes
            .get(self.next)
            .ok_or_else(|| invalid("more tensor data than tensors declared".into()))?;
        if data.len() as u64 != *size {
            return Err(invalid(format!(
                "tensor {name}: {} bytes given, {size} expected",
                data.len()
            )));
        }
        self.out.write_all(data)?;
        let pad = size.div_ceil(self.alignment) * self.alignment - size;
        self.out.write_all(&vec![0u8; pad as usize])?;
        self.next += 1;
        Ok(())
    }

    /// Bytes of tensor data (with each tensor's padding) still to be written: the length the
    /// file grows by until `finish`.
    pub fn data_left(&self) -> u64 {
        self.sizes[self.next..]
            .iter()
            .map(|(_, size)| size.div_ceil(self.alignment) * self.alignment)
            .sum()
    }

    /// Checks that every declared tensor was written, flushes, and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        if self.next != self.sizes.len() {
            return Err(invalid(format!(
                "{} of {} tensors written",
                self.next,
                self.sizes.len()
            )));
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

fn put_string(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.push(*x as u8),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(*x as u8),
        Value::String(s) => put_string(h, s),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            if let Some(bad) = a.items.iter().find(|i| i.ty() != a.ty) {
                return Err(invalid(format!(
                    "array of {:?} holds a {:?}",
                    a.ty,
                    bad.ty()
                )));
            }
            h.extend_from_slice(&(a.ty as u32).to_le_bytes());
            h.extend_from_slice(&(a.items.len() as u64).to_le_bytes());
            for item in &a.items {
                put_value(h, item)?;
            }
        }
    }
    Ok(())
}

/// Convenience: an array value of strings.
pub fn string_array<S: AsRef<str>>(items: &[S]) -> Value {
    Value::Array(super::Array {
        ty: ValueType::String,
        items: items
            .iter()
            .map(|s| Value::String(s.as_ref().into()))
            .collect(),
    })
}
