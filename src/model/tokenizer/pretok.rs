//! (Over 700 lines on purpose: the hand-written splitters share one cursor and one set of
//! character-class helpers; the tests are in `pretok/tests.rs`.)
//!
//! Pre-tokenizers: split text into the words that BPE merges within.
//!
//! Each variant (`tokenizer.ggml.pre`) is a list of patterns applied in turn, each splitting the
//! pieces the previous one left (the HF "Split, Isolated" behaviour: matches and the gaps between
//! them both become pieces). Four common patterns (GPT-2, Llama-3, Qwen2, Qwen3.5) are matched by
//! hand-written splitters, as llama.cpp does: the regex semantics llama.cpp actually implements
//! there differ from a regex engine's in corner cases (how `\s+(?!\S)` ends at a fragment end,
//! codepoints of no category), and conformance means matching llama.cpp. The other patterns go
//! through `fancy-regex` over the same "collapsed" text llama.cpp gives `std::regex`: every
//! non-ASCII codepoint replaced by one stand-in character per category, and `\p{..}` classes
//! rewritten to match those stand-ins.

use std::ops::Range;

use fancy_regex::Regex;

use super::unicode::{self, Flags, LETTER, MARK, NUMBER, PUNCTUATION, SYMBOL};

/// How one pre-tokenizer variant behaves, beyond its patterns.
#[derive(Clone, Copy, Debug)]
pub(super) struct PreConfig {
    pub(super) patterns: &'static [&'static str],
    /// Words are mapped to GPT-2's byte alphabet before merging (false: raw UTF-8, SPM-style).
    pub(super) byte_encode: bool,
    /// Spaces become `▁` before splitting (SPM-style BPE such as Gemma 4).
    pub(super) escape_whitespace: bool,
    /// A word that is itself a token is emitted whole, without merging (HF `ignore_merges`).
    pub(super) ignore_merges: bool,
    /// `clean_up_tokenization_spaces` when decoding.
    pub(super) clean_spaces: bool,
    /// Default for `add_bos_token` when the file does not say.
    pub(super) add_bos: bool,
    /// The variant has no BOS token unless the file names one.
    pub(super) no_default_bos: bool,
    /// Gemma 4: a word made only of newlines is a token of its own when the vocabulary has it.
    pub(super) newline_words: bool,
}

const BASE: PreConfig = PreConfig {
    patterns: &[],
    byte_encode: true,
    escape_whitespace: false,
    ignore_merges: false,
    clean_spaces: true,
    add_bos: false,
    no_default_bos: false,
    newline_words: false,
};

// The patterns, as each model's tokenizer.json gives them (case-insensitive groups spelled out,
// possessive quantifiers made greedy: neither regex engine here has them).
const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const NEWLINES: &str = "[^\\n]+|[\\n]+";
const JAIS2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}";
const DEEPSEEK3_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const CJK_KANA: &str = "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+";
const BLOOM: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+";
const TEKKEN: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GPT4O: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// The variants supported, by `tokenizer.ggml.pre` value (BPE vocabularies only).
pub(super) fn pre_config(name: &str) -> Option<PreConfig> {
    let keep_spaces = PreConfig {
        clean_spaces: false,
        ..BASE
    };
    Some(match name {
        "" | "default" => PreConfig {
            patterns: &[
                "[\\p{P}\\$\\+<=>\\^~\\|]+",
                GPT2,
                "\\p{N}+",
                "[0-9][0-9][0-9]",
            ],
            ..BASE
        },
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreConfig {
            patterns: &[LLAMA3],
            ignore_merges: true,
            add_bos: true,
            ..BASE
        },
        "dbrx" | "smaug-bpe" => PreConfig {
            patterns: &[LLAMA3],
            ..BASE
        },
        "jais-2" => PreConfig {
            patterns: &[JAIS2],
            ..BASE
        },
        "deepseek-llm" => PreConfig {
            patterns: &[
                "[\r\n]",
                "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
                "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
                "\\s+$",
                "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
                "\\p{N}+",
            ],
            ..keep_spaces
        },
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => PreConfig {
            patterns: &["\\p{N}{1,3}", CJK_KANA, DEEPSEEK3_MAIN],
            ..keep_spaces
        },
        "deepseek-coder" => PreConfig {
            patterns: &[
                "[\r\n]",
                "\\s?\\p{L}+",
                "\\s?\\p{P}+",
                "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
                "\\p{N}",
            ],
            ..keep_spaces
        },
        "falcon" => PreConfig {
            patterns: &[
                "[\\p{P}\\$\\+<=>\\^~\\|`]+",
                "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
                "[0-9][0-9][0-9]",
            ],
            ..BASE
        },
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => PreConfig {
            patterns: &["\\p{N}", GPT2],
            ..BASE
        },
        "command-r" | "smollm" => PreConfig {
            patterns: &["\\p{N}", GPT2],
            ..keep_spaces
        },
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "jina-v1-en" | "jina-v2-code"
        | "roberta-bpe" | "mpt" | "olmo" | "jais" => PreConfig {
            patterns: &[GPT2],
            ..BASE
        },
        "trillion" | "granite-docling" => PreConfig {
            patterns: &[GPT2],
            ..keep_spaces
        },
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
        | "grok-2" => PreConfig {
            patterns: &[QWEN2],
            ..keep_spaces
        },
        "stablelm2" | "megrez" => PreConfig {
            patterns: &[QWEN2],
            ..BASE
        },
        "qwen35" => PreConfig {
            patterns: &[QWEN35],
            ..keep_spaces
        },
        "laguna" => PreConfig {
            patterns: &[NEWLINES, QWEN2],
            ..keep_spaces
        },
        "poro-chat" => PreConfig {
            patterns: &[BLOOM],
            ..keep_spaces
        },
        "bloom" | "gpt3-finnish" => PreConfig {
            patterns: &[BLOOM],
            ..BASE
        },
        "viking" => PreConfig {
            patterns: &[BLOOM, "\\p{N}"],
            ..keep_spaces
        },
        "chatglm-bpe" => PreConfig {
            patterns: &[LLAMA3],
            no_default_bos: true,
            ..BASE
        },
        "glm4" | "glm5" => PreConfig {
            patterns: &[LLAMA3],
            no_default_bos: true,
            ignore_merges: true,
            ..BASE
        },
        "tekken" => PreConfig {
            patterns: &[TEKKEN],
            ignore_merges: true,
            add_bos: true,
            ..keep_spaces
        },
        "chameleon" => PreConfig {
            patterns: &[
                "<sentinel:[0-9]+>",
                "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                "([\\t\\n]|    |  )",
                "\\p{N}",
                "[\\p{P}!-/:-@\\[-`{-~]",
                GPT2,
            ],
            add_bos: true,
            ..keep_spaces
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => PreConfig {
            patterns: &[GPT4O],
            ..keep_spaces
        },
        "superbpe" => PreConfig {
            patterns: &["\\p{N}+", "(?=(\\d{3})+(?!\\d))"],
            ..keep_spaces
        },
        "bailingmoe" | "bailingmoe2" | "llada-moe" => PreConfig {
            patterns: &[
                "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
            ],
            ..keep_spaces
        },
        "seed-coder" => PreConfig {
            patterns: &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            ..keep_spaces
        },
        "ufakzeka" => PreConfig {
            patterns: &[
                "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            ..keep_spaces
        },
        "exaone-moe" => PreConfig {
            patterns: &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
            ],
            ..BASE
        },
        "minicpm5" => PreConfig {
            patterns: &[
                "\\p{N}{1,3}",
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            ignore_merges: true,
            ..BASE
        },
        "gemma4" | "granite-embed-multi-311m" => PreConfig {
            patterns: &[NEWLINES],
            byte_encode: false,
            escape_whitespace: true,
            add_bos: true,
            newline_words: true,
            ..BASE
        },
        "sarvam-moe" => PreConfig {
            patterns: &[NEWLINES],
            byte_encode: false,
            escape_whitespace: true,
            ..keep_spaces
        },
        _ => return None,
    })
}

/// One compiled pattern.
#[derive(Debug)]
enum Splitter {
    Gpt2,
    /// Llama-3 style: `digits` per number piece (3 or 1), `marks` joins combining marks to
    /// letters (Qwen3.5).
    Llama3 {
        digits: usize,
        marks: bool,
    },
    Newlines,
    Regex {
        re: Regex,
        /// Matched against the category-collapsed text (the pattern uses `\p{..}`).
        collapsed: bool,
    },
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub(super) struct PreTokenizer {
    splitters: Vec<Splitter>,
}

/// A pattern that does not compile: the pattern and the regex engine's message.
#[derive(Debug)]
pub(super) struct PatternError {
    pub(super) pattern: String,
    pub(super) message: String,
}

const UNICODE_CLASSES: [(&str, u16); 10] = [
    ("\\p{N}", NUMBER),
    ("\\p{L}", LETTER),
    ("\\p{P}", PUNCTUATION),
    ("\\p{M}", MARK),
    ("\\p{S}", SYMBOL),
    ("\\p{Lu}", LETTER),
    ("\\p{Ll}", LETTER),
    ("\\p{Lt}", LETTER),
    ("\\p{Lm}", LETTER),
    ("\\p{Lo}", LETTER),
];

/// The stand-in character of a category in collapsed text. Private-use characters are neither
/// word characters nor whitespace nor digits to the regex engine, as llama.cpp's stand-in bytes
/// are not to `std::regex`.
fn stand_in(category: u16) -> char {
    let offset = match category {
        NUMBER => 1,
        LETTER => 2,
        PUNCTUATION => 3,
        MARK => 4,
        SYMBOL => 5,
        _ => 0,
    };
    char::from_u32(0xE0D0 + offset).unwrap_or('\u{E0D0}')
}

/// The members of a category class in collapsed text: its stand-in and its ASCII members.
fn class_members(category: u16) -> String {
    let ascii = match category {
        NUMBER => "0-9",
        LETTER => "A-Za-z",
        PUNCTUATION => {
            "\\x21-\\x23\\x25-\\x2A\\x2C-\\x2F\\x3A-\\x3B\\x3F-\\x40\\x5B-\\x5D\\x5F\\x7B\\x7D"
        }
        SYMBOL => "\\x24\\x2B\\x3C-\\x3E\\x5E\\x60\\x7C\\x7E",
        _ => "",
    };
    format!("\\x{{{:X}}}{ascii}", stand_in(category) as u32)
}

/// Rewrites `\p{..}` classes to match collapsed text. Tracks whether it is inside `[...]` the
/// way llama.cpp does (an unescaped `[` opens, an unescaped `]` closes).
fn collapse_pattern(pattern: &str) -> Result<String, String> {
    if !pattern.is_ascii() {
        return Err("a pattern with \\p{..} classes must be ASCII".into());
    }
    let b = pattern.as_bytes();
    let mut out = String::new();
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let escaped = i > 0 && b[i - 1] == b'\\';
        if b[i] == b'[' && !escaped {
            inside = true;
        } else if b[i] == b']' && inside && !escaped {
            inside = false;
        } else if b[i] == b'\\'
            && b.get(i + 1) == Some(&b'p')
            && b.get(i + 2) == Some(&b'{')
            && let Some(close) = pattern[i..].find('}').map(|c| c + i)
            && let Some(&(_, cat)) = UNICODE_CLASSES
                .iter()
                .find(|(n, _)| *n == &pattern[i..=close])
        {
            if inside {
                out.push_str(&class_members(cat));
            } else {
                out.push('[');
                out.push_str(&class_members(cat));
                out.push(']');
            }
            i = close + 1;
            continue;
        }
        out.push(b[i] as char);
        i += 1;
    }
    Ok(out)
}

impl PreTokenizer {
    pub(super) fn new(patterns: &[&str]) -> Result<PreTokenizer, PatternError> {
        let mut splitters = Vec::with_capacity(patterns.len());
        for &p in patterns {
            let err = |message: String| PatternError {
                pattern: p.to_string(),
                message,
            };
            let s = match p {
                GPT2 => Splitter::Gpt2,
                LLAMA3 => Splitter::Llama3 {
                    digits: 3,
                    marks: false,
                },
                QWEN2 => Splitter::Llama3 {
                    digits: 1,
                    marks: false,
                },
                QWEN35 => Splitter::Llama3 {
                    digits: 1,
                    marks: true,
                },
                NEWLINES => Splitter::Newlines,
                _ => {
                    let collapsed = UNICODE_CLASSES.iter().any(|(n, _)| p.contains(n));
                    let source = if collapsed {
                        collapse_pattern(p).map_err(err)?
                    } else {
                        p.to_string()
                    };
                    let re = Regex::new(&source).map_err(|e| err(e.to_string()))?;
                    Splitter::Regex { re, collapsed }
                }
            };
            splitters.push(s);
        }
        Ok(PreTokenizer { splitters })
    }

    /// Splits `text` into words, as byte ranges of `text` in order, covering it entirely.
    pub(super) fn split(&self, text: &str) -> Vec<Range<usize>> {
        let chars = Chars::new(text);
        // Piece lengths in codepoints, refined by each splitter in turn.
        let mut pieces = vec![chars.cps.len()];
        let mut collapsed: Option<Indexed> = None;
        let mut wide: Option<Indexed> = None;
        for s in &self.splitters {
            pieces = match s {
                Splitter::Gpt2 => split_gpt2(&chars, &pieces),
                Splitter::Llama3 { digits, marks } => {
                    split_llama3(&chars, &pieces, *digits, *marks)
                }
                Splitter::Newlines => split_newlines(&chars, &pieces),
                Splitter::Regex {
                    re,
                    collapsed: true,
                } => {
                    let t = collapsed.get_or_insert_with(|| Indexed::collapsed(&chars));
                    split_regex(re, t, &pieces)
                }
                Splitter::Regex { re, .. } => {
                    let t = wide.get_or_insert_with(|| Indexed::wide(&chars));
                    split_regex(re, t, &pieces)
                }
            };
        }
        let mut out = Vec::with_capacity(pieces.len());
        let mut start = 0;
        for len in pieces {
            if len > 0 {
                out.push(chars.byte_pos[start]..chars.byte_pos[start + len]);
            }
            start += len;
        }
        out
    }
}

/// The codepoints of a text with their flags and byte positions.
struct Chars {
    cps: Vec<u32>,
    flags: Vec<Flags>,
    /// Byte offset of each codepoint, plus the text length at the end.
    byte_pos: Vec<usize>,
}

impl Chars {
    fn new(text: &str) -> Chars {
        let mut cps = Vec::with_capacity(text.len());
        let mut byte_pos = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cps.push(c as u32);
            byte_pos.push(i);
        }
        byte_pos.push(text.len());
        let flags = cps.iter().map(|&c| Flags::of(c)).collect();
        Chars {
            cps,
            flags,
            byte_pos,
        }
    }
}

/// A view of one piece `[ini, end)`: reads outside it give "nothing there".
struct Piece<'a> {
    c: &'a Chars,
    ini: usize,
    end: usize,
}

const OUT_OF_RANGE: u32 = u32::MAX;

impl Piece<'_> {
    fn cp(&self, pos: usize) -> u32 {
        if (self.ini..self.end).contains(&pos) {
            self.c.cps[pos]
        } else {
            OUT_OF_RANGE
        }
    }
    fn flags(&self, pos: usize) -> Flags {
        if (self.ini..self.end).contains(&pos) {
            self.c.flags[pos]
        } else {
            Flags::NONE
        }
    }
}

/// Runs `f(piece, emit)` over each piece; `emit(end)` closes a word at codepoint `end`.
fn each_piece(
    c: &Chars,
    pieces: &[usize],
    mut f: impl FnMut(&Piece, &mut dyn FnMut(usize)),
) -> Vec<usize> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut start = 0;
    for &len in pieces {
        let p = Piece {
            c,
            ini: start,
            end: start + len,
        };
        let mut prev = start;
        let mut emit = |end: usize| {
            if end > prev {
                out.push(end - prev);
            }
            prev = end;
        };
        f(&p, &mut emit);
        start += len;
    }
    out
}

fn is_cr_lf(cp: u32) -> bool {
    cp == '\r' as u32 || cp == '\n' as u32
}

/// `'s|'t|'m|'d` or `'re|'ve|'ll` at `pos` (after `lower`): the contraction's length.
fn contraction(p: &Piece, pos: usize, lower: impl Fn(u32) -> u32) -> Option<usize> {
    if p.cp(pos) != '\'' as u32 || pos + 1 >= p.end {
        return None;
    }
    let is = |cp: u32, c: char| cp == c as u32;
    let n1 = lower(p.cp(pos + 1));
    if is(n1, 's') || is(n1, 't') || is(n1, 'm') || is(n1, 'd') {
        return Some(2);
    }
    if pos + 2 < p.end {
        let n2 = lower(p.cp(pos + 2));
        if (is(n1, 'r') && is(n2, 'e'))
            || (is(n1, 'v') && is(n2, 'e'))
            || (is(n1, 'l') && is(n2, 'l'))
        {
            return Some(3);
        }
    }
    None
}

/// Whitespace handling shared by the splitters: `\s+(?!\S)` leaves the last whitespace to the
/// next word when something follows in the piece, else `\s+` takes the run. Returns the end of
/// the word, or None if `pos` is not whitespace.
fn whitespace_run(p: &Piece, pos: usize) -> Option<usize> {
    let mut n = 0;
    while p.flags(pos + n).is_whitespace() {
        n += 1;
    }
    if n > 1 && p.cp(pos + n) != OUT_OF_RANGE {
        Some(pos + n - 1)
    } else if n > 0 {
        Some(pos + n)
    } else {
        None
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(c: &Chars, pieces: &[usize]) -> Vec<usize> {
    each_piece(c, pieces, |p, emit| {
        let mut pos = p.ini;
        while pos < p.end {
            let cp = p.cp(pos);
            if let Some(n) = contraction(p, pos, |c| c) {
                pos += n;
                emit(pos);
                continue;
            }
            let space = cp == ' ' as u32;
            // An optional leading space joins the run of one class that follows it.
            let mut f = if space {
                p.flags(pos + 1)
            } else {
                p.flags(pos)
            };
            let other =
                |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
            let class: Option<fn(Flags) -> bool> = if f.is_letter() {
                Some(Flags::is_letter)
            } else if f.is_number() {
                Some(Flags::is_number)
            } else if other(f) {
                Some(other)
            } else {
                None
            };
            if let Some(class) = class {
                pos += usize::from(space);
                while class(f) {
                    pos += 1;
                    f = p.flags(pos);
                }
                emit(pos);
                continue;
            }
            if let Some(end) = whitespace_run(p, pos) {
                pos = end;
                emit(pos);
                continue;
            }
            pos += 1;
            emit(pos);
        }
    })
}

/// Llama-3 / Qwen2 / Qwen3.5:
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
/// (Qwen: `\p{N}` one digit at a time; Qwen3.5: marks count as letters).
fn split_llama3(c: &Chars, pieces: &[usize], digits: usize, marks: bool) -> Vec<usize> {
    let wordy = |f: Flags| f.is_letter() || (marks && f.is_mark());
    each_piece(c, pieces, |p, emit| {
        let mut pos = p.ini;
        while pos < p.end {
            let cp = p.cp(pos);
            let flags = p.flags(pos);
            if let Some(n) = contraction(p, pos, unicode::ascii_lower) {
                pos += n;
                emit(pos);
                continue;
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(is_cr_lf(cp) || flags.is_number()) && (wordy(flags) || wordy(p.flags(pos + 1))) {
                pos += 1;
                while wordy(p.flags(pos)) {
                    pos += 1;
                }
                emit(pos);
                continue;
            }
            // \p{N}{1,digits}
            if flags.is_number() {
                let mut group = pos;
                while p.flags(pos).is_number() {
                    pos += 1;
                    if pos - group >= digits {
                        emit(pos);
                        group = pos;
                    }
                }
                emit(pos);
                continue;
            }
            // ' '?[^\s\p{L}\p{N}]+[\r\n]*
            let other = |f: Flags| !(f.is_whitespace() || wordy(f) || f.is_number());
            let space = cp == ' ' as u32;
            let mut f2 = if space { p.flags(pos + 1) } else { flags };
            if other(f2) && flags.any() {
                pos += usize::from(space);
                while other(f2) && f2.any() {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                while is_cr_lf(p.cp(pos)) {
                    pos += 1;
                }
                emit(pos);
                continue;
            }
            // \s*[\r\n]+ : through the last CR/LF of the whitespace run.
            let mut n = 0;
            let mut last_cr_lf = None;
            while p.flags(pos + n).is_whitespace() {
                if is_cr_lf(p.cp(pos + n)) {
                    last_cr_lf = Some(pos + n + 1);
                }
                n += 1;
            }
            if let Some(end) = last_cr_lf {
                pos = end;
                emit(pos);
                continue;
            }
            if let Some(end) = whitespace_run(p, pos) {
                pos = end;
                emit(pos);
                continue;
            }
            pos += 1;
            emit(pos);
        }
    })
}

/// `[^\n]+|[\n]+`: runs of newlines and runs of anything else.
fn split_newlines(c: &Chars, pieces: &[usize]) -> Vec<usize> {
    each_piece(c, pieces, |p, emit| {
        let mut pos = p.ini;
        while pos < p.end {
            let nl = p.cp(pos) == '\n' as u32;
            while pos < p.end && (p.cp(pos) == '\n' as u32) == nl {
                pos += 1;
            }
            emit(pos);
        }
    })
}

/// A text rewritten one character per codepoint, with the byte offset of each.
struct Indexed {
    text: String,
    byte_pos: Vec<usize>,
}

impl Indexed {
    fn build(c: &Chars, map: impl Fn(u32, Flags) -> char) -> Indexed {
        let mut text = String::with_capacity(c.cps.len() * 2);
        let mut byte_pos = Vec::with_capacity(c.cps.len() + 1);
        for (&cp, &f) in c.cps.iter().zip(&c.flags) {
            byte_pos.push(text.len());
            text.push(map(cp, f));
        }
        byte_pos.push(text.len());
        Indexed { text, byte_pos }
    }

    /// Non-ASCII codepoints as their category's stand-in; non-ASCII whitespace as `\v`, which
    /// `\s` matches (llama.cpp: `std::regex`'s `\s` is ASCII-only).
    fn collapsed(c: &Chars) -> Indexed {
        Indexed::build(c, |cp, f| match char::from_u32(cp) {
            Some(ch) if cp < 0x80 => ch,
            _ if f.is_whitespace() => '\u{0B}',
            _ => stand_in(f.category()),
        })
    }

    /// The text itself, non-ASCII whitespace as `\v`.
    fn wide(c: &Chars) -> Indexed {
        Indexed::build(c, |cp, f| match char::from_u32(cp) {
            Some(ch) if cp < 0x80 || !f.is_whitespace() => ch,
            _ => '\u{0B}',
        })
    }

    fn char_index(&self, byte: usize) -> usize {
        self.byte_pos.partition_point(|&b| b < byte)
    }
}

/// Splits each piece at the regex's matches: matches and the gaps between them become pieces.
fn split_regex(re: &Regex, t: &Indexed, pieces: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut start = 0;
    for &len in pieces {
        let base = t.byte_pos[start];
        let slice = &t.text[base..t.byte_pos[start + len]];
        let mut done = start;
        for m in re.find_iter(slice) {
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    // Only the backtracking limit fails at match time: keep the rest whole.
                    tracing::warn!("pre-tokenizer pattern gave up on a piece: {e}");
                    break;
                }
            };
            let (ms, me) = (t.char_index(base + m.start()), t.char_index(base + m.end()));
            if ms > done {
                out.push(ms - done);
            }
            out.push(me - ms);
            done = me;
        }
        if start + len > done {
            out.push(start + len - done);
        }
        start += len;
    }
    out
}

#[cfg(test)]
mod tests;
