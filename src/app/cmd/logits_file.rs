//! llama-perplexity's logits file (`--kl-divergence-base FILE`), read and written byte for byte
//! as llama.cpp b11434 does (tools/perplexity/perplexity.cpp), so that a model run in hipscope
//! can be compared with the same model run in llama.cpp, in either direction.
//!
//! Layout (native little-endian): `_logits_`, `n_ctx: i32`, `n_vocab: i32`, `n_chunk: i32`, the
//! `n_chunk * n_ctx` evaluated tokens (`i32`, as tokenized, before any BOS replacement), then
//! for every chunk and every scored position (the second half of the chunk but its last token)
//! one row of `nv = 2 * ceil(n_vocab / 2) + 4` `u16`s: two `f32`s (`scale`, `min_log_prob`) and
//! the log-softmax of each vocabulary entry quantized as `(log_p - min_log_prob) / scale`,
//! clamped to 16 nats below the top.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};

const MAGIC: &[u8; 8] = b"_logits_";

/// llama.cpp's `nearest_int`: round to nearest (ties to even) through the f32 mantissa.
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// `u16`s per scored row for a vocabulary of `n_vocab`.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Positions of a chunk of `n_ctx` tokens whose next token is scored: `n_ctx/2 .. n_ctx-1`.
pub fn scored_range(n_ctx: usize) -> std::ops::Range<usize> {
    n_ctx / 2..n_ctx - 1
}

/// Writes one row: the quantized log-softmax of `logits` into `row` (`row_len` long). Returns the
/// negative log-likelihood of `target`, as llama.cpp computes it in this mode.
pub fn encode_row(logits: &[f32], target: usize, row: &mut [u16]) -> f64 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let min = logits
        .iter()
        .copied()
        .fold(logits[0], f32::min)
        .max(max - 16.0);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    let log_sum = sum.ln() as f32;
    let min_log_prob = min - max - log_sum;
    let scale = (max - min) / 65535.0;
    let (head, body) = row.split_at_mut(4);
    let (s, m) = (scale.to_le_bytes(), min_log_prob.to_le_bytes());
    head[0] = u16::from_le_bytes([s[0], s[1]]);
    head[1] = u16::from_le_bytes([s[2], s[3]]);
    head[2] = u16::from_le_bytes([m[0], m[1]]);
    head[3] = u16::from_le_bytes([m[2], m[3]]);
    body.fill(0);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (q, &l) in body.iter_mut().zip(logits) {
            *q = if l > min {
                nearest_int(inv * (l - min)) as u16
            } else {
                0
            };
        }
    }
    (max + log_sum - logits[target]) as f64
}

/// The header of a logits file and the tokens it evaluated.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// `n_chunk * n_ctx` tokens.
    pub tokens: Vec<u32>,
}

impl Header {
    /// Bytes the whole file must have.
    fn file_len(&self) -> u64 {
        let rows = (self.n_chunk * scored_range(self.n_ctx).len()) as u64;
        20 + 4 * (self.n_chunk * self.n_ctx) as u64 + rows * 2 * row_len(self.n_vocab) as u64
    }
}

/// Reads a logits file chunk by chunk.
pub struct Reader {
    pub header: Header,
    path: PathBuf,
    inner: BufReader<File>,
}

fn read_i32(r: &mut impl Read) -> std::io::Result<i32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(i32::from_le_bytes(b))
}

impl Reader {
    /// Opens `path` and checks its header and length against each other.
    pub fn open(path: &Path) -> anyhow::Result<Reader> {
        let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = f.metadata()?.len();
        let mut inner = BufReader::with_capacity(1 << 20, f);
        let what = || format!("{} is not a llama-perplexity logits file", path.display());
        let mut magic = [0u8; 8];
        inner.read_exact(&mut magic).with_context(what)?;
        ensure!(
            &magic == MAGIC,
            "{}: it does not start with `_logits_`",
            what()
        );
        let (n_ctx, n_vocab, n_chunk) = (
            read_i32(&mut inner).with_context(what)?,
            read_i32(&mut inner).with_context(what)?,
            read_i32(&mut inner).with_context(what)?,
        );
        ensure!(
            (2..=1 << 24).contains(&n_ctx) && (1..=1 << 24).contains(&n_vocab) && n_chunk >= 1,
            "{}: its header says n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}",
            what()
        );
        let (n_ctx, n_vocab, n_chunk) = (n_ctx as usize, n_vocab as usize, n_chunk as usize);
        let mut header = Header {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens: Vec::new(),
        };
        let want = header.file_len();
        ensure!(
            len == want,
            "{}: {len} bytes, but a file of {n_chunk} chunks of {n_ctx} tokens over a vocabulary \
             of {n_vocab} has {want}",
            path.display()
        );
        let mut raw = vec![0u8; 4 * n_chunk * n_ctx];
        inner.read_exact(&mut raw)?;
        for (i, b) in raw.chunks_exact(4).enumerate() {
            let t = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if !(0..n_vocab as i64).contains(&(t as i64)) {
                bail!(
                    "{}: token {i} is {t}, outside the vocabulary of {n_vocab}",
                    path.display()
                );
            }
            header.tokens.push(t as u32);
        }
        Ok(Reader {
            header,
            path: path.to_owned(),
            inner,
        })
    }

    /// Reads the next chunk's rows into `rows` (resized to `scored * row_len`).
    pub fn next_chunk(&mut self, rows: &mut Vec<u16>) -> anyhow::Result<()> {
        let n = scored_range(self.header.n_ctx).len() * row_len(self.header.n_vocab);
        let mut raw = vec![0u8; 2 * n];
        self.inner
            .read_exact(&mut raw)
            .with_context(|| format!("reading log-probabilities from {}", self.path.display()))?;
        rows.clear();
        rows.extend(
            raw.chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        );
        Ok(())
    }
}

/// Writes a logits file as llama-perplexity `--kl-divergence-base` does.
pub struct Writer {
    n_vocab: usize,
    /// Beside the file's name until `finish`: an interrupted run leaves no torn logits file.
    out: BufWriter<crate::gpu::atomic_file::Pending>,
    row: Vec<u16>,
}

impl Writer {
    /// Creates `path` and writes the header: `n_chunk` chunks of `n_ctx` from `tokens`.
    pub fn create(
        path: &Path,
        n_ctx: usize,
        n_vocab: usize,
        n_chunk: usize,
        tokens: &[u32],
    ) -> anyhow::Result<Writer> {
        let f = crate::gpu::atomic_file::Pending::create(path)
            .with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, f);
        out.write_all(MAGIC)?;
        for v in [n_ctx, n_vocab, n_chunk] {
            out.write_all(&(v as i32).to_le_bytes())?;
        }
        for &t in &tokens[..n_chunk * n_ctx] {
            out.write_all(&(t as i32).to_le_bytes())?;
        }
        Ok(Writer {
            n_vocab,
            out,
            row: vec![0; row_len(n_vocab)],
        })
    }

    /// Appends one scored row; returns the target's negative log-likelihood.
    pub fn row(&mut self, logits: &[f32], target: usize) -> anyhow::Result<f64> {
        let nll = encode_row(&logits[..self.n_vocab], target, &mut self.row);
        let bytes: Vec<u8> = self.row.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.out.write_all(&bytes)?;
        Ok(nll)
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.out.flush()?;
        self.out
            .into_inner()
            .map_err(|e| e.into_error())?
            .commit(crate::gpu::atomic_file::Replace::Allow)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even_like_llama_cpp() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.4999), 2);
        assert_eq!(nearest_int(65535.0), 65535);
    }

    #[test]
    fn a_row_decodes_to_the_log_softmax_within_half_a_step() {
        let logits: Vec<f32> = (0..101)
            .map(|i| ((i * 37 % 101) as f32) * 0.3 - 9.0)
            .collect();
        let mut row = vec![0u16; row_len(logits.len())];
        assert_eq!(row.len(), 2 * 51 + 4);
        let nll = encode_row(&logits, 7, &mut row);
        let f = |a: u16, b: u16| {
            let [x, y] = a.to_le_bytes();
            let [z, w] = b.to_le_bytes();
            f32::from_le_bytes([x, y, z, w])
        };
        let (scale, min_lp) = (f(row[0], row[1]), f(row[2], row[3]));
        let max = logits.iter().copied().fold(f32::MIN, f32::max) as f64;
        let lse = max
            + logits
                .iter()
                .map(|&l| (l as f64 - max).exp())
                .sum::<f64>()
                .ln();
        for (i, &l) in logits.iter().enumerate() {
            let want = (l as f64 - lse).max(max - 16.0 - lse);
            let got = (scale * row[4 + i] as f32 + min_lp) as f64;
            assert!((got - want).abs() <= scale as f64, "{i}: {got} vs {want}");
        }
        assert!((nll - (lse - logits[7] as f64)).abs() < 1e-4);
        assert_eq!(row[4 + 101], 0, "the padding entry is zero");
    }
}
