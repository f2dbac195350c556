//! Byte-pair encoding (`tokenizer.ggml.model = gpt2`, `gemma4`): the pre-tokenizer splits text
//! into words; within each word, starting from single characters (of GPT-2's byte alphabet, or
//! raw UTF-8 for SPM-style vocabularies), the adjacent pair with the lowest merge rank is merged
//! until no pair has one. A priority queue keeps this O(n log n) in the word length.
//!
//! Merges are keyed by the ids of their two sides: every string that is a token or a side of a
//! merge gets an id (a token's is its token id), and each merge knows the id of its result, so
//! merging never builds or hashes strings.

use std::collections::BinaryHeap;

use super::Tokenizer;
use super::hash::{IdMap, StrMap};
use super::pretok::{PreConfig, PreTokenizer};
use super::unicode::{BYTE_TO_CHAR, utf8_len};

const NO_PIECE: u32 = u32::MAX;

pub(super) struct Bpe {
    pub(super) pre: PreTokenizer,
    pub(super) cfg: PreConfig,
    /// Ids of strings that are sides of merges but not tokens (ids from `n_vocab` up).
    extra: StrMap<u32>,
    /// `(left id << 32 | right id)` → (rank, id of the merged string or `NO_PIECE`).
    merges: IdMap<(u32, u32)>,
    /// Piece id of each byte's single-character string (byte-level vocabularies).
    byte_pieces: [u32; 256],
}

fn key(l: u32, r: u32) -> u64 {
    (l as u64) << 32 | r as u64
}

impl Bpe {
    /// `merges` are "left right" strings in rank order. Returns the number of merge entries
    /// that have no space to split at (llama.cpp keeps them as unusable entries).
    pub(super) fn new(
        pre: PreTokenizer,
        cfg: PreConfig,
        token_to_id: &StrMap<u32>,
        n_vocab: usize,
        merges: &[&str],
    ) -> (Bpe, usize) {
        let mut extra: StrMap<u32> = StrMap::default();
        let mut next_id = n_vocab as u32;
        let mut intern = |s: &str, extra: &mut StrMap<u32>| -> u32 {
            if let Some(&id) = token_to_id.get(s) {
                return id;
            }
            if let Some(&id) = extra.get(s) {
                return id;
            }
            let id = next_id;
            next_id += 1;
            extra.insert(s.into(), id);
            id
        };
        let mut pairs = Vec::with_capacity(merges.len());
        let mut malformed = 0;
        for (rank, m) in merges.iter().enumerate() {
            // Split at the first space after the first byte, so that a left side may start
            // with a space (vocabularies with raw spaces).
            let Some(sp) = m.as_bytes().iter().skip(1).position(|&b| b == b' ') else {
                malformed += 1;
                continue;
            };
            let (l, r) = (&m[..sp + 1], &m[sp + 2..]);
            let (li, ri) = (intern(l, &mut extra), intern(r, &mut extra));
            pairs.push((rank, li, ri, l, r));
        }
        let mut merged = IdMap::default();
        merged.reserve(pairs.len());
        let mut joined = String::new();
        for (rank, li, ri, l, r) in pairs {
            joined.clear();
            joined.push_str(l);
            joined.push_str(r);
            let result = token_to_id
                .get(joined.as_str())
                .or_else(|| extra.get(joined.as_str()))
                .copied()
                .unwrap_or(NO_PIECE);
            // The first occurrence of a pair keeps its rank, as llama.cpp's `emplace` does.
            merged.entry(key(li, ri)).or_insert((rank as u32, result));
        }
        let mut byte_pieces = [NO_PIECE; 256];
        for (b, p) in byte_pieces.iter_mut().enumerate() {
            let mut buf = [0u8; 4];
            let s = BYTE_TO_CHAR[b].encode_utf8(&mut buf);
            *p = token_to_id
                .get(&*s)
                .or_else(|| extra.get(&*s))
                .copied()
                .unwrap_or(NO_PIECE);
        }
        (
            Bpe {
                pre,
                cfg,
                extra,
                merges: merged,
                byte_pieces,
            },
            malformed,
        )
    }

    pub(super) fn n_merges(&self) -> usize {
        self.merges.len()
    }

    fn piece_id(&self, tok: &Tokenizer, s: &str) -> u32 {
        tok.token_to_id
            .get(s)
            .or_else(|| self.extra.get(s))
            .copied()
            .unwrap_or(NO_PIECE)
    }

    /// Tokenizes one fragment of text (between special tokens), appending to `out`.
    pub(super) fn tokenize(&self, tok: &Tokenizer, fragment: &str, out: &mut Vec<u32>) {
        let escaped;
        let text = if self.cfg.escape_whitespace {
            escaped = fragment.replace(' ', "▁");
            escaped.as_str()
        } else {
            fragment
        };
        let mut word = Word::default();
        for range in self.pre.split(text) {
            self.word(tok, &text[range], &mut word, out);
        }
    }

    fn word(&self, tok: &Tokenizer, raw: &str, w: &mut Word, out: &mut Vec<u32>) {
        w.symbols.clear();
        w.queue.clear();
        // The word as the vocabulary spells it: GPT-2's byte alphabet, or the raw text.
        let encoded;
        let spelled: &str = if self.cfg.byte_encode {
            encoded = raw
                .bytes()
                .map(|b| BYTE_TO_CHAR[b as usize])
                .collect::<String>();
            &encoded
        } else {
            raw
        };
        if self.cfg.ignore_merges
            && let Some(id) = tok.token_id(spelled)
        {
            out.push(id);
            return;
        }
        if self.cfg.newline_words
            && raw.bytes().all(|b| b == b'\n')
            && let Some(id) = tok.token_id(spelled)
        {
            out.push(id);
            return;
        }
        // Symbols are spans of `spelled`: one character each to start with.
        let bytes = spelled.as_bytes();
        let mut offs = 0;
        while offs < bytes.len() {
            let len = utf8_len(bytes[offs]).min(bytes.len() - offs);
            let piece = if self.cfg.byte_encode {
                // One alphabet character is one raw byte.
                self.byte_pieces[raw.as_bytes()[w.symbols.len()] as usize]
            } else {
                self.piece_id(tok, &spelled[offs..offs + len])
            };
            w.symbols.push(Symbol {
                start: offs as u32,
                len: len as u32,
                next: (offs + len < bytes.len()).then_some(w.symbols.len() as u32 + 1),
                prev: (w.symbols.len() as u32).checked_sub(1),
                piece,
            });
            offs += len;
        }
        for i in 1..w.symbols.len() as u32 {
            self.add_pair(w, i - 1, i);
        }
        while let Some(std::cmp::Reverse(p)) = w.queue.pop() {
            let (l, r) = (w.symbols[p.left as usize], w.symbols[p.right as usize]);
            if l.len == 0 || r.len == 0 || l.len + r.len != p.len {
                continue; // stale
            }
            let left = &mut w.symbols[p.left as usize];
            left.len += r.len;
            left.next = r.next;
            left.piece = p.result;
            w.symbols[p.right as usize].len = 0;
            if let Some(n) = r.next {
                w.symbols[n as usize].prev = Some(p.left);
            }
            if let Some(prev) = l.prev {
                self.add_pair(w, prev, p.left);
            }
            if let Some(next) = r.next {
                self.add_pair(w, p.left, next);
            }
        }
        for s in w.symbols.iter().filter(|s| s.len > 0) {
            if (s.piece as usize) < tok.n_vocab() {
                out.push(s.piece);
                continue;
            }
            // Not a token: its bytes one by one, each as the token of that byte if there is one.
            let text = &spelled[s.start as usize..(s.start + s.len) as usize];
            for b in text.bytes() {
                let id = if self.cfg.byte_encode {
                    // llama.cpp looks up the single *byte* of the spelled text: only ASCII bytes
                    // can be tokens that way.
                    b.is_ascii()
                        .then(|| tok.token_id(std::str::from_utf8(&[b]).unwrap_or("")))
                        .flatten()
                } else {
                    tok.token_id(&format!("<0x{b:02X}>"))
                };
                out.extend(id);
            }
        }
    }

    fn add_pair(&self, w: &mut Word, l: u32, r: u32) {
        let (a, b) = (w.symbols[l as usize], w.symbols[r as usize]);
        if a.piece == NO_PIECE || b.piece == NO_PIECE {
            return;
        }
        if let Some(&(rank, result)) = self.merges.get(&key(a.piece, b.piece)) {
            w.queue.push(std::cmp::Reverse(Pair {
                rank,
                left: l,
                right: r,
                len: a.len + b.len,
                result,
            }));
        }
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: Option<u32>,
    next: Option<u32>,
    /// Id of the symbol's string (a token id, an extra id, or `NO_PIECE`).
    piece: u32,
}

/// A candidate merge; ordered by rank, then position (leftmost first), as llama.cpp.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Pair {
    rank: u32,
    left: u32,
    right: u32,
    len: u32,
    result: u32,
}

/// Scratch space reused across the words of one call.
#[derive(Default)]
struct Word {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<std::cmp::Reverse<Pair>>,
}
