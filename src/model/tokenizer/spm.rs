//! SentencePiece-style tokenization (`tokenizer.ggml.model = llama`): spaces become `▁`, the
//! text starts as one symbol per character, and the adjacent pair whose concatenation is the
//! highest-scoring token is merged until no pair is a token. Characters that end up in no token
//! fall back to their bytes (`<0xAB>` tokens).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::Tokenizer;
use super::hash::IdSet;
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
/// Kept small: the queue holds one per character of a segment.
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    len: u32,
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

/// Adjacent character pairs that occur inside some token. Where two neighbouring characters
/// are not such a pair, no merge can ever join them, so the text can be cut there and each part
/// merged alone: the same merges happen in the same order within each part, and the queues stay
/// small (one text-long queue is several times slower).
#[derive(Debug, Default)]
pub(super) struct JoinablePairs(IdSet);

fn pair_key(a: char, b: char) -> u64 {
    (a as u64) << 32 | b as u64
}

impl JoinablePairs {
    pub(super) fn new<'a>(texts: impl Iterator<Item = &'a str>) -> JoinablePairs {
        let mut set = IdSet::default();
        for t in texts {
            let mut chars = t.chars();
            if let Some(mut prev) = chars.next() {
                for c in chars {
                    set.insert(pair_key(prev, c));
                    prev = c;
                }
            }
        }
        JoinablePairs(set)
    }

    fn joinable(&self, a: char, b: char) -> bool {
        self.0.contains(&pair_key(a, b))
    }
}

/// Tokenizes one fragment of text (between special tokens) and appends the ids to `out`.
pub(super) fn tokenize(
    tok: &Tokenizer,
    byte_tokens: &[Option<u32>; 256],
    pairs: &JoinablePairs,
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
    let mut scratch = Scratch::default();
    let mut start = 0;
    let mut prev: Option<char> = None;
    for (i, c) in text.char_indices() {
        if let Some(p) = prev
            && !pairs.joinable(p, c)
        {
            merge_segment(tok, byte_tokens, &text[start..i], &mut scratch, out);
            start = i;
        }
        prev = Some(c);
    }
    merge_segment(tok, byte_tokens, &text[start..], &mut scratch, out);
}

#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

/// The bigram merge over one segment of escaped text.
fn merge_segment(
    tok: &Tokenizer,
    byte_tokens: &[Option<u32>; 256],
    text: &str,
    scratch: &mut Scratch,
    out: &mut Vec<u32>,
) {
    let bytes = text.as_bytes();
    let symbols = &mut scratch.symbols;
    let queue = &mut scratch.queue;
    symbols.clear();
    queue.clear();
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

    let try_add = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], l: Option<usize>, r| {
        let (Some(l), Some(r)): (Option<usize>, Option<usize>) = (l, r) else {
            return;
        };
        let (a, b) = (symbols[l], symbols[r]);
        let span = &text[a.start..b.start + b.len];
        if let Some(id) = tok.token_id(span) {
            queue.push(Bigram {
                score: tok.score(id),
                left: l as u32,
                right: r as u32,
                len: span.len() as u32,
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(queue, symbols, Some(i - 1), Some(i));
    }

    while let Some(bg) = queue.pop() {
        let (li, ri) = (bg.left as usize, bg.right as usize);
        let (l, r) = (symbols[li], symbols[ri]);
        // Stale: one side was merged away or grew since this pair was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != bg.len as usize {
            continue;
        }
        symbols[li].len += r.len;
        symbols[ri].len = 0;
        symbols[li].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(li);
        }
        try_add(queue, symbols, l.prev, Some(li));
        try_add(queue, symbols, Some(li), r.next);
    }

    let mut i = (!symbols.is_empty()).then_some(0);
    while let Some(k) = i {
        let s = symbols[k];
        let piece = &text[s.start..s.start + s.len];
        match tok.token_id(piece) {
            Some(id) => out.push(id),
            // Not a token (a single character): its bytes as byte tokens. Where a byte has
            // none, llama.cpp fails the whole call; SentencePiece gives the unknown token.
            None if piece.bytes().all(|b| byte_tokens[b as usize].is_some()) => {
                out.extend(piece.bytes().filter_map(|b| byte_tokens[b as usize]));
            }
            None => out.extend(tok.unk),
        }
        i = s.next;
    }
}
