//! The tokenizer, built from a GGUF file's `tokenizer.ggml.*` metadata, behaving as llama.cpp's
//! (`src/llama-vocab.cpp`, `src/unicode.cpp`): the same special-token splitting, the same
//! SentencePiece-style bigram merging with byte fallback, the same byte-level BPE with each
//! model's pre-tokenizer, and the same decoding. The conformance tests run llama.cpp's own
//! vocabulary test files (`tests/it/tokenizer_conformance.rs`).
//!
//! Supported: `tokenizer.ggml.model` = `llama` (SPM), `gpt2` (byte-level BPE, most
//! `tokenizer.ggml.pre` variants) and `gemma4` (BPE over raw UTF-8 with `▁` for spaces).
//! BERT (WordPiece), T5 (Unigram), RWKV and PLaMo-2 vocabularies are refused with a clear error.

mod bpe;
mod hash;
mod load;
mod pretok;
mod special;
mod spm;
mod stream;
mod unicode;
mod unicode_data;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use stream::StreamDecoder;

use bpe::Bpe;

/// What a token is, from `tokenizer.ggml.token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenKind {
    Normal,
    /// The unknown token (`<unk>`).
    Unknown,
    /// Control tokens (`<|im_start|>`, `</s>`): parsed from text only on request, printed only
    /// on request.
    Control,
    /// Tokens added by the model's authors that are always matched whole in text.
    UserDefined,
    /// Placeholders never produced by the tokenizer (also tokens of undefined type).
    Unused,
    /// `<0xAB>`: one raw byte (SentencePiece byte fallback).
    Byte,
}

/// A tokenizer that cannot be built from a file: what is wrong, with which key, in which file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: metadata key `{key}` is missing; the file has no usable tokenizer")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata key `{key}` {problem}")]
    BadKey {
        path: PathBuf,
        key: String,
        problem: String,
    },
    #[error(
        "{path}: tokenizer model `{model}` (key tokenizer.ggml.model) is not supported; \
         supported are llama (SentencePiece), gpt2 (byte-level BPE) and gemma4"
    )]
    UnsupportedModel { path: PathBuf, model: String },
    #[error("{path}: pre-tokenizer `{pre}` (key tokenizer.ggml.pre) is not supported by hipscope")]
    UnsupportedPre { path: PathBuf, pre: String },
    #[error("{path}: pre-tokenizer `{pre}`: pattern {pattern:?} does not compile: {message}")]
    Pattern {
        path: PathBuf,
        pre: String,
        pattern: String,
        message: String,
    },
}

/// Token attribute bits, as llama.cpp keeps them: a token can be, say, control and unused.
mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    /// Whitespace before the token is dropped when it is matched in text.
    pub const LSTRIP: u16 = 1 << 7;
    /// Whitespace after the token is dropped when it is matched in text.
    pub const RSTRIP: u16 = 1 << 8;
}

#[derive(Clone, Debug)]
struct TokenData {
    text: Box<str>,
    score: f32,
    attr: u16,
}

enum Model {
    Spm {
        /// `<0xAB>` (or the raw byte) token of each byte.
        byte_tokens: Box<[Option<u32>; 256]>,
        pairs: spm::JoinablePairs,
    },
    Bpe(Box<Bpe>),
}

/// A model's tokenizer. Cheap to share (`&Tokenizer` is `Sync`); encoding allocates per call.
pub struct Tokenizer {
    model: Model,
    tokens: Vec<TokenData>,
    token_to_id: hash::StrMap<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    /// Tokens that end a generation, sorted.
    eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first: the order in which they
    /// are looked for in text.
    special: Vec<u32>,
    /// Each token's decoded bytes (as printed with `special = true`), concatenated.
    pieces: Vec<u8>,
    piece_ends: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    /// A summary: the tables run to megabytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let model = match &self.model {
            Model::Spm { .. } => "SPM".to_string(),
            Model::Bpe(b) => format!("BPE ({} merges)", b.n_merges()),
        };
        f.debug_struct("Tokenizer")
            .field("model", &model)
            .field("n_vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(file: &crate::model::gguf::GgufFile) -> Result<Tokenizer, TokenizerError> {
        load::load(file)
    }

    /// Tokenizes `text`. `add_special` adds BOS/EOS where the model's `add_bos_token` /
    /// `add_eos_token` say so; `parse_special` lets control tokens written in the text (such as
    /// `<|im_start|>`) become those tokens. User-defined tokens are always matched.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            // llama.cpp asserts a BOS exists here; a model without one gets none.
            out.extend(self.bos);
        }
        match &self.model {
            Model::Spm { byte_tokens, pairs } => {
                // A space is prefixed to text at the start and after each special token, as
                // SentencePiece does to the start of every sentence.
                let mut prev_special = true;
                for frag in &fragments {
                    match *frag {
                        special::Fragment::Text(t) => {
                            let prefix = self.add_space_prefix && prev_special;
                            spm::tokenize(self, byte_tokens, pairs, t, prefix, &mut out);
                            prev_special = false;
                        }
                        special::Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Model::Bpe(bpe) => {
                for frag in &fragments {
                    match *frag {
                        special::Fragment::Text(t) => bpe.tokenize(self, t, &mut out),
                        special::Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End of turn (`<|eot_id|>`, `<|im_end|>`, ...). Where the file does not name it and the
    /// vocabulary has several candidates, llama.cpp takes whichever its hash map yields first;
    /// this takes the first of its list (`<|eot_id|>`, `<|im_end|>`, `<|end|>`, ...). Both are
    /// in the end-of-generation set either way.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// End of message (Llama 3.1 tool calls: `<|eom_id|>`).
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Whether the model adds BOS to a prompt (`tokenizer.ggml.add_bos_token`, or the default of
    /// its tokenizer type).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether generating `id` ends the generation (llama.cpp's `llama_vocab_is_eog`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation tokens, sorted.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// The kind of token `id`; ids outside the vocabulary read as `Unused`.
    pub fn kind(&self, id: u32) -> TokenKind {
        let a = self.attr(id);
        if a & attr::BYTE != 0 {
            TokenKind::Byte
        } else if a & attr::UNKNOWN != 0 {
            TokenKind::Unknown
        } else if a & attr::UNUSED != 0 {
            TokenKind::Unused
        } else if a & attr::CONTROL != 0 {
            TokenKind::Control
        } else if a & attr::USER_DEFINED != 0 {
            TokenKind::UserDefined
        } else if a & attr::NORMAL != 0 {
            TokenKind::Normal
        } else {
            TokenKind::Unused
        }
    }

    /// The token's string as stored in the vocabulary (`Ġ` for a GPT-2 space, `▁` for a
    /// SentencePiece one); empty for ids outside the vocabulary.
    pub fn token_text(&self, id: u32) -> &str {
        self.tokens.get(id as usize).map_or("", |t| &t.text)
    }

    /// The token's score (SentencePiece log-probability; 0 where the file has none).
    pub fn score(&self, id: u32) -> f32 {
        self.tokens.get(id as usize).map_or(0.0, |t| t.score)
    }

    /// The id of the token whose vocabulary string is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// The bytes token `id` stands for (llama.cpp's `llama_token_to_piece` without stripping).
    /// With `special = false`, control and unknown tokens give nothing.
    pub fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        self.piece_bytes(id, special).to_vec()
    }

    /// Decodes `ids` to text as llama.cpp's `llama_detokenize` does (leading-space removal for
    /// SentencePiece, the model's `clean_up_tokenization_spaces`). Invalid UTF-8 (a sequence cut
    /// off mid-character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, special)).into_owned()
    }

    fn attr(&self, id: u32) -> u16 {
        self.tokens.get(id as usize).map_or(0, |t| t.attr)
    }

    fn piece_bytes(&self, id: u32, special: bool) -> &[u8] {
        let i = id as usize;
        if i >= self.tokens.len()
            || (!special && self.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0)
        {
            return &[];
        }
        let start = if i == 0 {
            0
        } else {
            self.piece_ends[i - 1] as usize
        };
        &self.pieces[start..self.piece_ends[i] as usize]
    }

    fn detokenize(&self, ids: &[u32], special: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let mut p = self.piece_bytes(id, special);
            // SentencePiece prefixed a space when encoding; drop it from the first token.
            if i == 0 && self.add_space_prefix {
                p = p.strip_prefix(b" ").unwrap_or(p);
            }
            out.extend_from_slice(p);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut out);
        }
        out
    }
}

/// HF's `clean_up_tokenization_spaces`, byte for byte as llama.cpp does it: " ?", " !", " .",
/// " ," lose their space; a lone apostrophe between spaces loses both; " 's", " 'm", " 're",
/// " 've" lose theirs. Each pass compares against the bytes as they were before the pass.
fn clean_up_spaces(text: &mut Vec<u8>) {
    if text.is_empty() {
        return;
    }
    let mut t = std::mem::take(text);
    // Pass 1.
    let mut out = vec![t[0]];
    for i in 1..t.len() {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // Pass 2: " ' " → "'". The space after is consumed here, so the next byte sees a NUL, not a
    // space, before it.
    t = out;
    let mut out = vec![t[0]];
    let mut i = 1;
    while i < t.len() {
        let x = t[i];
        if x == b'\'' && i + 1 < t.len() && t[i - 1] == b' ' && t[i + 1] == b' ' {
            out.pop();
            i += 1;
            t[i] = 0;
        }
        out.push(x);
        i += 1;
    }
    // Pass 3.
    t = out;
    let mut out = vec![t[0]];
    for i in 1..t.len() {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < t.len() {
            let x1 = t[i + 1];
            let x2 = t.get(i + 2).copied();
            let drop = matches!(x1, b's' | b'm')
                || (i + 2 < t.len() && matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))));
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}
