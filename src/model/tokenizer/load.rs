//! Building a `Tokenizer` from GGUF metadata, with llama.cpp's defaults and its rules for which
//! tokens are special and which end a generation (`llama_vocab::impl::load`).

use std::path::PathBuf;

use super::bpe::Bpe;
use super::hash::StrMap;
use super::pretok::{PreConfig, PreTokenizer, pre_config};
use super::unicode::char_to_byte;
use super::{Model, TokenData, Tokenizer, TokenizerError, attr};
use crate::model::gguf::{Array, GgufFile, Value};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// Token texts that end a turn, in the order preferred when the file names no EOT token.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];

/// Token texts that end a generation wherever they are in a vocabulary (llama.cpp keeps this
/// list because converted models rarely say; see ggml-org/llama.cpp#9606).
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

struct Meta<'a> {
    f: &'a GgufFile,
}

impl<'a> Meta<'a> {
    fn path(&self) -> PathBuf {
        self.f.path().to_path_buf()
    }

    fn bad(&self, key: &str, problem: impl Into<String>) -> TokenizerError {
        TokenizerError::BadKey {
            path: self.path(),
            key: key.to_string(),
            problem: problem.into(),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, TokenizerError> {
        match self.f.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.bad(key, format!("should be a string, is {:?}", v.ty()))),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.f.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(key, format!("should be a bool, is {:?}", v.ty()))),
        }
    }

    /// A token id: any integer type; None if absent.
    fn id(&self, key: &str) -> Result<Option<i64>, TokenizerError> {
        match self.f.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("should be a token id, is {:?}", v.ty()))),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&'a Array>, TokenizerError> {
        match self.f.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.bad(key, format!("should be an array, is {:?}", v.ty()))),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>, TokenizerError> {
        match self.array(key)? {
            None => Ok(None),
            Some(a) => a
                .strings()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("should hold strings, holds {:?}", a.ty))),
        }
    }
}

enum Kind {
    Spm,
    Bpe(String, PreConfig),
}

pub(super) fn load(f: &GgufFile) -> Result<Tokenizer, TokenizerError> {
    let m = Meta { f };
    let model = m
        .str(KEY_MODEL)?
        .ok_or_else(|| TokenizerError::MissingKey {
            path: m.path(),
            key: KEY_MODEL.into(),
        })?;
    let pre_name = m.str(KEY_PRE)?.unwrap_or("");

    // Per-type defaults, which the file's keys then override.
    let (kind, bos, eos, unk): (Kind, Option<u32>, Option<u32>, Option<u32>) = match model {
        "llama" => (Kind::Spm, Some(1), Some(2), Some(0)),
        "gpt2" | "gemma4" => {
            let name = if model == "gemma4" {
                "gemma4"
            } else {
                pre_name
            };
            let Some(cfg) = pre_config(name) else {
                return Err(TokenizerError::UnsupportedPre {
                    path: m.path(),
                    pre: name.to_string(),
                });
            };
            let default = if model == "gpt2" && !cfg.no_default_bos {
                Some(11)
            } else {
                None
            };
            let eos = if model == "gpt2" { Some(11) } else { None };
            (Kind::Bpe(name.to_string(), cfg), default, eos, None)
        }
        other => {
            return Err(TokenizerError::UnsupportedModel {
                path: m.path(),
                model: other.to_string(),
            });
        }
    };
    if pre_name.is_empty() && model == "gpt2" {
        tracing::warn!(
            "{}: no pre-tokenizer type (tokenizer.ggml.pre); using 'default', quality may suffer",
            f.path().display()
        );
    }
    let (mut add_bos, mut add_eos, mut add_space_prefix, clean_spaces) = match &kind {
        Kind::Spm => (true, false, true, false),
        Kind::Bpe(_, cfg) => (cfg.add_bos, false, false, cfg.clean_spaces),
    };
    if let Some(v) = m.bool("tokenizer.ggml.add_space_prefix")? {
        add_space_prefix = v;
    }

    let texts = m
        .strings(KEY_TOKENS)?
        .ok_or_else(|| TokenizerError::MissingKey {
            path: m.path(),
            key: KEY_TOKENS.into(),
        })?;
    let n = texts.len();
    if n == 0 || n > u32::MAX as usize / 2 {
        return Err(m.bad(KEY_TOKENS, format!("holds {n} tokens")));
    }
    let scores = match m.array(KEY_SCORES)? {
        None => None,
        Some(a) => {
            let s = a
                .f32s()
                .or_else(|| a.ints().map(|v| v.into_iter().map(|x| x as f32).collect()))
                .ok_or_else(|| {
                    m.bad(
                        KEY_SCORES,
                        format!("should hold f32 or i32, holds {:?}", a.ty),
                    )
                })?;
            if s.len() < n {
                return Err(m.bad(
                    KEY_SCORES,
                    format!("has {} entries for {n} tokens", s.len()),
                ));
            }
            Some(s)
        }
    };
    let types = match m.array(KEY_TYPES)? {
        None => None,
        Some(a) => {
            let t = a.ints().ok_or_else(|| {
                m.bad(KEY_TYPES, format!("should hold integers, holds {:?}", a.ty))
            })?;
            if t.len() < n {
                return Err(m.bad(KEY_TYPES, format!("has {} entries for {n} tokens", t.len())));
            }
            Some(t)
        }
    };

    let mut tokens = Vec::with_capacity(n);
    let mut token_to_id: StrMap<u32> = StrMap::default();
    token_to_id.reserve(n);
    for (i, &t) in texts.iter().enumerate() {
        // llama.cpp renames empty tokens so that each has a distinct, findable text.
        let text: Box<str> = if t.is_empty() {
            format!("[EMPTY_{i}]").into()
        } else {
            t.into()
        };
        let attr = match types.as_ref().map(|t| t[i]) {
            None | Some(1) => attr::NORMAL,
            Some(2) => attr::UNKNOWN,
            Some(3) => attr::CONTROL,
            Some(4) => attr::USER_DEFINED,
            Some(5) => attr::UNUSED,
            Some(6) => attr::BYTE,
            Some(_) => 0,
        };
        // A text that appears twice maps to its last id, as in llama.cpp.
        token_to_id.insert(text.clone(), i as u32);
        tokens.push(TokenData {
            text,
            score: scores.as_ref().map_or(0.0, |s| s[i]),
            attr,
        });
    }

    let mut ids = read_ids(&m, n, [bos, eos, unk])?;
    if let Some(v) = m.bool("tokenizer.ggml.add_bos_token")? {
        add_bos = v;
    }
    if let Some(v) = m.bool("tokenizer.ggml.add_eos_token")? {
        add_eos = v;
    }
    // Gemma 4 needs BOS whatever its conversion says (ggml-org/llama.cpp#21500).
    if matches!(&kind, Kind::Bpe(name, _) if name == "gemma4" || name == "granite-embed-multi-311m")
    {
        add_bos = true;
    }
    detect_by_text(&mut ids, &mut tokens, &token_to_id);
    // Control tokens named "unused" are placeholders.
    for t in tokens.iter_mut() {
        if t.attr & attr::CONTROL != 0 && t.text.contains("unused") {
            t.attr |= attr::UNUSED;
        }
    }
    let eog = end_of_generation(&ids, &mut tokens, &token_to_id);

    // Special tokens, longest first (ties by id, for a deterministic order).
    let mut special: Vec<u32> = (0..n as u32)
        .filter(|&id| {
            tokens[id as usize].attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
        })
        .collect();
    special.sort_by_key(|&id| std::cmp::Reverse(tokens[id as usize].text.len()));

    let escape_whitespace = matches!(kind, Kind::Bpe(_, cfg) if cfg.escape_whitespace);
    let mut pieces = Vec::new();
    let mut piece_ends = Vec::with_capacity(n);
    for t in &tokens {
        piece_of(t, &kind, escape_whitespace, &mut pieces);
        let end = u32::try_from(pieces.len())
            .map_err(|_| m.bad(KEY_TOKENS, "token texts exceed 4 GiB"))?;
        piece_ends.push(end);
    }

    set_strip_attributes(&m, &mut tokens, &token_to_id, &special)?;

    let model = match kind {
        Kind::Spm => {
            let mut byte_tokens = [None; 256];
            for (b, slot) in byte_tokens.iter_mut().enumerate() {
                *slot = token_to_id
                    .get(format!("<0x{b:02X}>").as_str())
                    .or_else(|| {
                        std::str::from_utf8(&[b as u8])
                            .ok()
                            .and_then(|s| token_to_id.get(s))
                    })
                    .copied();
            }
            let pairs = super::spm::JoinablePairs::new(tokens.iter().map(|t| &*t.text));
            Model::Spm {
                byte_tokens: Box::new(byte_tokens),
                pairs,
            }
        }
        Kind::Bpe(name, cfg) => {
            let merges = match m.strings(KEY_MERGES)? {
                Some(v) => v,
                None => {
                    return Err(TokenizerError::MissingKey {
                        path: m.path(),
                        key: KEY_MERGES.into(),
                    });
                }
            };
            let pre = PreTokenizer::new(cfg.patterns).map_err(|e| TokenizerError::Pattern {
                path: m.path(),
                pre: name.clone(),
                pattern: e.pattern,
                message: e.message,
            })?;
            let (bpe, malformed) = Bpe::new(pre, cfg, &token_to_id, n, &merges);
            if malformed > 0 {
                tracing::warn!(
                    "{}: {malformed} merges have no space; ignored",
                    f.path().display()
                );
            }
            tracing::debug!("{} merges", bpe.n_merges());
            Model::Bpe(Box::new(bpe))
        }
    };

    Ok(Tokenizer {
        model,
        tokens,
        token_to_id,
        bos: ids.bos,
        eos: ids.eos,
        eot: ids.eot,
        eom: ids.eom,
        unk: ids.unk,
        pad: ids.pad,
        add_bos,
        add_eos,
        add_space_prefix,
        clean_spaces,
        eog,
        special,
        pieces,
        piece_ends,
    })
}

/// The special tokens a file may name by id.
#[derive(Default)]
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    fim_pre: Option<u32>,
    fim_suf: Option<u32>,
    fim_mid: Option<u32>,
    fim_pad: Option<u32>,
    fim_rep: Option<u32>,
    fim_sep: Option<u32>,
}

/// The ids the file gives, over the type's defaults (`[bos, eos, unk]`); ids outside the
/// vocabulary are ignored with a warning, as llama.cpp does.
fn read_ids(
    m: &Meta,
    n: usize,
    [bos, eos, unk]: [Option<u32>; 3],
) -> Result<SpecialIds, TokenizerError> {
    let in_vocab = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
    let mut ids = SpecialIds {
        bos: in_vocab(bos),
        eos: in_vocab(eos),
        unk: in_vocab(unk),
        ..SpecialIds::default()
    };
    type Slot = fn(&mut SpecialIds) -> &mut Option<u32>;
    let keys: [(&str, Slot); 15] = [
        ("tokenizer.ggml.bos_token_id", |i| &mut i.bos),
        ("tokenizer.ggml.eos_token_id", |i| &mut i.eos),
        ("tokenizer.ggml.eot_token_id", |i| &mut i.eot),
        ("tokenizer.ggml.eom_token_id", |i| &mut i.eom),
        ("tokenizer.ggml.unknown_token_id", |i| &mut i.unk),
        ("tokenizer.ggml.padding_token_id", |i| &mut i.pad),
        ("tokenizer.ggml.fim_pre_token_id", |i| &mut i.fim_pre),
        ("tokenizer.ggml.fim_suf_token_id", |i| &mut i.fim_suf),
        ("tokenizer.ggml.fim_mid_token_id", |i| &mut i.fim_mid),
        ("tokenizer.ggml.fim_pad_token_id", |i| &mut i.fim_pad),
        ("tokenizer.ggml.fim_rep_token_id", |i| &mut i.fim_rep),
        ("tokenizer.ggml.fim_sep_token_id", |i| &mut i.fim_sep),
        // Older names of the first three FIM keys.
        ("tokenizer.ggml.prefix_token_id", |i| &mut i.fim_pre),
        ("tokenizer.ggml.suffix_token_id", |i| &mut i.fim_suf),
        ("tokenizer.ggml.middle_token_id", |i| &mut i.fim_mid),
    ];
    for (key, slot) in keys {
        let slot = slot(&mut ids);
        if let Some(v) = m.id(key)? {
            match u32::try_from(v) {
                Ok(v) if (v as usize) < n => *slot = Some(v),
                _ => tracing::warn!(
                    "{}: {key} = {v} is outside the vocabulary; ignored",
                    m.f.path().display()
                ),
            }
        }
    }
    Ok(ids)
}

/// Finds the end-of-turn, end-of-message and FIM tokens the file does not name, by their text
/// (llama.cpp does the same: converters rarely record them). Each found is made a control token.
fn detect_by_text(ids: &mut SpecialIds, tokens: &mut [TokenData], token_to_id: &StrMap<u32>) {
    let slots: [(&mut Option<u32>, &[&str]); 8] = [
        (&mut ids.eot, EOT_NAMES),
        (&mut ids.eom, &["<|eom_id|>"]),
        (&mut ids.fim_pre, FIM_PRE_NAMES),
        (&mut ids.fim_suf, FIM_SUF_NAMES),
        (&mut ids.fim_mid, FIM_MID_NAMES),
        (&mut ids.fim_pad, FIM_PAD_NAMES),
        (&mut ids.fim_rep, FIM_REP_NAMES),
        (&mut ids.fim_sep, FIM_SEP_NAMES),
    ];
    for (slot, names) in slots {
        if slot.is_some() {
            continue;
        }
        if let Some(id) = names.iter().find_map(|s| token_to_id.get(*s).copied()) {
            *slot = Some(id);
            tokens[id as usize].attr |= attr::CONTROL;
        }
    }
}

/// llama.cpp's end-of-generation set: FIM padding/repo/separator tokens, every token whose text
/// is in `EOG_NAMES` (made control tokens), EOS, EOT and EOM; minus gpt-oss's and solar-open's
/// "<|end|>" (it ends a message there, not the generation) and Gemma 4's ordinary "</s>". Sorted.
fn end_of_generation(
    ids: &SpecialIds,
    tokens: &mut [TokenData],
    token_to_id: &StrMap<u32>,
) -> Vec<u32> {
    let mut eog: Vec<u32> = [ids.fim_pad, ids.fim_rep, ids.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for name in EOG_NAMES {
        if let Some(&id) = token_to_id.get(*name) {
            eog.push(id);
            tokens[id as usize].attr |= attr::CONTROL;
        }
    }
    // gpt-oss's channel markers are always printed (llama.cpp makes them user-defined).
    for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = token_to_id.get(name) {
            tokens[id as usize].attr = attr::USER_DEFINED;
        }
    }
    eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    let find = |eog: &[u32], tokens: &[TokenData], text: &str| {
        eog.iter()
            .copied()
            .find(|&id| &*tokens[id as usize].text == text)
    };
    let has = |eog: &[u32], tokens: &[TokenData], text: &str| find(eog, tokens, text).is_some();
    let call = has(&eog, tokens, "<|call|>") || has(&eog, tokens, "<|calls|>");
    let ret_or_flush = has(&eog, tokens, "<|return|>") || has(&eog, tokens, "<|flush|>");
    if let Some(end) = find(&eog, tokens, "<|end|>")
        && call
        && ret_or_flush
    {
        eog.retain(|&id| id != end);
        tokens[end as usize].attr = attr::USER_DEFINED;
    }
    let normal_s = has(&eog, tokens, "<|tool_response>") || has(&eog, tokens, "<|plamo:eos|>");
    if let Some(s) = find(&eog, tokens, "</s>")
        && normal_s
    {
        eog.retain(|&id| id != s);
        tokens[s as usize].attr = attr::NORMAL;
    }
    eog
}

/// A token's bytes as printed with `special = true` (llama.cpp's `token_to_piece`).
fn piece_of(t: &TokenData, kind: &Kind, escape_whitespace: bool, out: &mut Vec<u8>) {
    let a = t.attr;
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(t.text.as_bytes());
    } else if a & attr::NORMAL != 0 {
        if matches!(kind, Kind::Spm) || escape_whitespace {
            out.extend_from_slice(t.text.replace('▁', " ").as_bytes());
        } else {
            decode_byte_level(&t.text, out);
        }
    } else if a & attr::BYTE != 0 {
        // "<0xAB>"
        if let Some(b) = t
            .text
            .get(3..5)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
        }
    }
    // Unused and undefined tokens print as nothing.
}

/// GPT-2 byte alphabet back to bytes. A character outside the alphabet is spelled out the way
/// llama.cpp does it (it should not occur in a byte-level vocabulary).
fn decode_byte_level(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

/// Per-model whitespace stripping around special tokens, which GGUF files do not record
/// (llama.cpp sets these by model name).
fn set_strip_attributes(
    m: &Meta,
    tokens: &mut [TokenData],
    token_to_id: &StrMap<u32>,
    special: &[u32],
) -> Result<(), TokenizerError> {
    let name = m.str("general.name")?.unwrap_or("").to_lowercase();
    let pre = m.str(KEY_PRE)?.unwrap_or("");
    let arch = m.str("general.architecture")?.unwrap_or("");
    let mut set = |text: &str, bit: u16, on: bool| {
        if let Some(&id) = token_to_id.get(text) {
            let a = &mut tokens[id as usize].attr;
            *a = if on { *a | bit } else { *a & !bit };
        }
    };
    let any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
    if any(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"])
        || any(arch, &["nomic-bert-moe", "jina-bert-v3"])
    {
        set("<mask>", attr::LSTRIP, true);
    } else if any(&name, &["phi-3", "phi3"]) {
        for &id in special {
            tokens[id as usize].attr |= attr::RSTRIP;
        }
        let mut set = |text: &str, on: bool| {
            if let Some(&id) = token_to_id.get(text) {
                let a = &mut tokens[id as usize].attr;
                *a = if on {
                    *a | attr::RSTRIP
                } else {
                    *a & !attr::RSTRIP
                };
            }
        };
        set("</s>", true);
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            set(t, false);
        }
    } else if name.contains("modern-bert") {
        set("[MASK]", attr::LSTRIP, true);
    }
    Ok(())
}
