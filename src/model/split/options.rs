//! How a model is split over several GPUs: `--split-mode none|layer`, `--tensor-split A,B,…` and
//! `--main-gpu N`, with llama.cpp's meanings (`common/arg.cpp`), resolved by the app
//! (`app/settings.rs`: flags › environment › config › defaults) and passed down as
//! [`SplitOptions`].

use std::fmt;
use std::str::FromStr;

/// `--split-mode`: llama.cpp's `none` and `layer` (`row` is not implemented: README says what it
/// would take).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitMode {
    /// Not asked: one GPU, unless the model does not fit it and there are others (then `layer`,
    /// in proportion to each GPU's free memory, said at start).
    #[default]
    Auto,
    /// One GPU: `--main-gpu` (or `--device`), else the largest.
    None,
    /// Layers over every GPU of the runtime, in proportion to `--tensor-split` or to free memory.
    Layer,
}

impl SplitMode {
    pub const ALLOWED: &'static str = "\"none\" or \"layer\"";

    pub fn name(self) -> &'static str {
        match self {
            SplitMode::Auto => "auto",
            SplitMode::None => "none",
            SplitMode::Layer => "layer",
        }
    }
}

impl FromStr for SplitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<SplitMode, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(SplitMode::None),
            "layer" => Ok(SplitMode::Layer),
            "auto" => Ok(SplitMode::Auto),
            "row" => Err("split mode \"row\" is not implemented; use none or layer".into()),
            other => Err(format!("split mode {other:?}: use none or layer")),
        }
    }
}

impl fmt::Display for SplitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--tensor-split 3,1`: the share of the layers each GPU takes, in the runtime's order
/// (proportions, not necessarily summing to 1; a GPU beyond the list takes none).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TensorSplit(pub Vec<f64>);

impl FromStr for TensorSplit {
    type Err = String;
    fn from_str(s: &str) -> Result<TensorSplit, String> {
        let bad = || format!("tensor split {s:?}: give proportions per GPU, such as 3,1");
        let v = s
            .split([',', '/'])
            .map(|x| x.trim().parse::<f64>().map_err(|_| bad()))
            .collect::<Result<Vec<f64>, String>>()?;
        if v.is_empty()
            || v.len() > 64
            || v.iter().any(|x| !x.is_finite() || *x < 0.0)
            || v.iter().sum::<f64>() <= 0.0
        {
            return Err(bad());
        }
        Ok(TensorSplit(v))
    }
}

impl fmt::Display for TensorSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|x| x.to_string()).collect();
        f.write_str(&parts.join(","))
    }
}

/// The split settings, as resolved.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitOptions {
    pub mode: SplitMode,
    /// `None`: in proportion to each GPU's free memory.
    pub tensor_split: Option<TensorSplit>,
    /// llama.cpp's `--main-gpu`: the GPU used with `--split-mode none` (the same as `--device`,
    /// which it fills in); with `layer` it changes nothing, as in llama.cpp.
    pub main_gpu: Option<u32>,
    /// llama.cpp's `--no-op-offload`: a prompt batch's CPU layers stay on the CPU instead of
    /// running on the GPU with their weights streamed up ([`super::Placement::op_offload`]).
    pub no_op_offload: bool,
    /// `HIPSCOPE_OP_OFFLOAD_MIN_BATCH` (llama.cpp's `GGML_OP_OFFLOAD_MIN_BATCH`): the fewest
    /// tokens of a batch whose CPU layers run on the GPU; `None`: [`super::OFFLOAD_MIN_BATCH`].
    pub offload_min_batch: Option<usize>,
}

impl SplitOptions {
    /// Op offload's smallest batch, `None` when it is off.
    pub fn op_offload(&self) -> Option<usize> {
        (!self.no_op_offload).then(|| self.offload_min_batch.unwrap_or(super::OFFLOAD_MIN_BATCH))
    }

    /// The shares of `n` GPUs: `--tensor-split` (padded with zeros, as llama.cpp does), else
    /// `free` (each GPU's free memory).
    pub fn shares(&self, free: &[u64]) -> Vec<f64> {
        match &self.tensor_split {
            Some(t) => (0..free.len())
                .map(|i| t.0.get(i).copied().unwrap_or(0.0))
                .collect(),
            None => free.iter().map(|&b| b.max(1) as f64).collect(),
        }
    }
}

/// `--tensor-split`'s parser (clap's value parser).
pub fn parse_tensor_split(s: &str) -> Result<TensorSplit, String> {
    s.parse()
}

/// `--split-mode`'s parser (clap's value parser).
pub fn parse_split_mode(s: &str) -> Result<SplitMode, String> {
    s.parse()
}
