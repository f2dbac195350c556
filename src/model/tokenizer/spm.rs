//! SentencePiece-style tokenization (`tokenizer.ggml.model = llama`): spaces become `▁`, the
//! text starts as one symbol per character, and the adjacent pair whose concatenation is the
//! highest-scoring token is merged until no pair is a token. Characters that end up in no token
//! fall back to their bytes (`<0xAB>` tokens).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::Tokenizer;
use super::unicode::utf8_len;

/// A run of the text; `len == 0` once merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of `left` and `right`, valid while they still span `len` bytes together.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Highest score first; among equal scores, leftmost first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Tokenizes one fragment of text (between special tokens) and appends the ids to `out`.
pub(super) fn tokenize(
    tok: &Tokenizer,
    byte_tokens: &[Option<u32>; 256],
    fragment: &str,
    space_prefix: bool,
    out: &mut Vec<u32>,
) {
    let mut text = String::with_capacity(fragment.len() + 3);
    if space_prefix {
        text.push('▁');
    }
    for c in fragment.chars() {
        text.push(if c == ' ' { '▁' } else { c });
    }
    let bytes = text.as_bytes();

    let mut symbols = Vec::with_capacity(text.len());
    let mut offs = 0;
    while offs < bytes.len() {
        let len = utf8_len(bytes[offs]).min(bytes.len() - offs);
        let i = symbols.len();
        symbols.push(Symbol {
            start: offs,
            len,
            prev: i.checked_sub(1),
            next: (offs + len < bytes.len()).then_some(i + 1),
        });
        offs += len;
    }

    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], l: Option<usize>, r| {
        let (Some(l), Some(r)): (Option<usize>, Option<usize>) = (l, r) else {
            return;
        };
        let (a, b) = (symbols[l], symbols[r]);
        let span = &text[a.start..b.start + b.len];
        if let Some(id) = tok.token_id(span) {
            queue.push(Bigram {
                score: tok.score(id),
                left: l,
                right: r,
                len: span.len(),
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, Some(i - 1), Some(i));
    }

    while let Some(bg) = queue.pop() {
        let (l, r) = (symbols[bg.left], symbols[bg.right]);
        // Stale: one side was merged away or grew since this pair was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != bg.len {
            continue;
        }
        symbols[bg.left].len += r.len;
        symbols[bg.right].len = 0;
        symbols[bg.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(bg.left);
        }
        try_add(&mut queue, &symbols, l.prev, Some(bg.left));
        try_add(&mut queue, &symbols, Some(bg.left), r.next);
    }

    let mut i = (!symbols.is_empty()).then_some(0);
    while let Some(k) = i {
        let s = symbols[k];
        let piece = &text[s.start..s.start + s.len];
        match tok.token_id(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    // llama.cpp fails the whole call when a byte has no token; the unknown
                    // token (when there is one) is the closest to what SentencePiece does.
                    if let Some(id) = byte_tokens[b as usize].or(tok.unk) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}
