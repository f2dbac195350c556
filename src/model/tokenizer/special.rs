//! Splitting text at special tokens written in it, before the model's tokenizer sees it.
//!
//! As llama.cpp's `tokenizer_st_partition`: each special token in turn, longest first, is looked
//! for in every piece of text not yet claimed, splitting it. Control and unknown tokens are
//! looked for only with `parse_special`; user-defined tokens always (HF tokenizers split "added
//! tokens" before anything else). A token with the lstrip/rstrip attribute swallows the ASCII
//! whitespace before/after it.

use super::{Tokenizer, attr};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// C's `isspace` in the "C" locale, which llama.cpp uses for the strip attributes.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r')
}

impl Tokenizer {
    pub(super) fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(text));
        let mut next = Vec::new();
        for &id in &self.special {
            let data = &self.tokens[id as usize];
            if !parse_special && data.attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle: &str = &data.text;
            // Cheap exit for the common case: the token occurs nowhere.
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
            {
                continue;
            }
            let lstrip = data.attr & attr::LSTRIP != 0;
            let rstrip = data.attr & attr::RSTRIP != 0;
            next.clear();
            for f in &frags {
                let Fragment::Text(mut rest) = *f else {
                    next.push(*f);
                    continue;
                };
                while let Some(at) = rest.find(needle) {
                    let mut left = &rest[..at];
                    if lstrip {
                        left = left.trim_end_matches(is_c_space);
                    }
                    if !left.is_empty() {
                        next.push(Fragment::Text(left));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[at + needle.len()..];
                    if rstrip {
                        rest = rest.trim_start_matches(is_c_space);
                    }
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }
}
