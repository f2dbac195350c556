//! The Markdown renderer against hand-written expectations.

use super::*;

fn text(lines: &[Line<'_>]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
        .collect()
}

fn widths(lines: &[Line<'_>]) -> Vec<usize> {
    lines.iter().map(|l| l.width()).collect()
}

#[test]
fn prose_wraps_at_word_boundaries() {
    let t = Theme::default();
    let lines = render("the quick brown fox jumps over the lazy dog", 16, &t);
    assert_eq!(
        text(&lines),
        ["the quick brown", "fox jumps over", "the lazy dog"]
    );
}

#[test]
fn a_word_longer_than_the_width_is_broken() {
    let t = Theme::default();
    let lines = render("abcdefghijklmnopqrstuvwxyz end", 10, &t);
    assert_eq!(text(&lines), ["abcdefghij", "klmnopqrst", "uvwxyz end"]);
}

#[test]
fn wide_characters_count_two_columns() {
    let t = Theme::default();
    // Eight CJK characters are 16 columns.
    let lines = render("日本語のテキスト", 10, &t);
    assert!(widths(&lines).iter().all(|&w| w <= 10), "{lines:?}");
    assert_eq!(text(&lines).concat(), "日本語のテキスト");
}

#[test]
fn code_blocks_are_framed_unwrapped_and_padded() {
    let t = Theme::default();
    let md = "Intro.\n\n```rust\nfn main() {\n    println!(\"hi\");\n}\n```\n\nAfter.";
    let lines = render(md, 24, &t);
    assert_eq!(
        text(&lines),
        [
            "Intro.",
            "",
            "╭─ rust ────────────────",
            "│ fn main() {           ",
            "│     println!(\"hi\");   ",
            "│ }                     ",
            "╰───────────────────────",
            "",
            "After.",
        ]
    );
    // Code carries the code style (background), distinct from prose.
    let code_span = &lines[3].spans[1];
    assert_eq!(code_span.style, t.code_block);
}

#[test]
fn an_unclosed_fence_renders_as_code_while_streaming() {
    let t = Theme::default();
    let lines = render("Here:\n\n```py\nprint(1)\nprint(2", 20, &t);
    let txt = text(&lines);
    assert!(txt.iter().any(|l| l.starts_with("│ print(1)")), "{txt:?}");
    assert!(txt.iter().any(|l| l.starts_with("│ print(2")), "{txt:?}");
}

#[test]
fn long_code_lines_break_at_the_width() {
    let t = Theme::default();
    let lines = render("```\nabcdefghijklmnopqrstuvwxyz\n```", 12, &t);
    let txt = text(&lines);
    assert_eq!(txt[1], "│ abcdefghij");
    assert_eq!(txt[2], "│ klmnopqrst");
    assert_eq!(txt[3], "│ uvwxyz    ");
    assert!(widths(&lines).iter().all(|&w| w <= 12));
}

#[test]
fn lists_have_bullets_and_hanging_indent() {
    let t = Theme::default();
    let md = "- first item that wraps around\n- second\n\n1. one\n2. two";
    let lines = render(md, 16, &t);
    assert_eq!(
        text(&lines),
        [
            "• first item",
            "  that wraps",
            "  around",
            "• second",
            "",
            "1. one",
            "2. two"
        ]
    );
}

#[test]
fn nested_lists_indent_further() {
    let t = Theme::default();
    let lines = render("- a\n  - b\n- c", 20, &t);
    assert_eq!(text(&lines), ["• a", "  ◦ b", "• c"]);
}

#[test]
fn headings_quotes_rules_and_links() {
    let t = Theme::default();
    let md = "# Title\n\n> quoted text\n\n---\n\nsee [docs](https://x.y)";
    let lines = render(md, 20, &t);
    assert_eq!(
        text(&lines),
        [
            "# Title",
            "",
            "│ quoted text",
            "",
            "────────────────────",
            "",
            "see docs",
            "(https://x.y)",
        ]
    );
    assert_eq!(lines[0].spans[0].style, t.heading);
}

#[test]
fn emphasis_is_styled_not_marked() {
    let t = Theme::default();
    let lines = render("a **bold** and *it*", 40, &t);
    assert_eq!(text(&lines), ["a bold and it"]);
    let bold = lines[0].spans.iter().find(|s| s.content == "bold").unwrap();
    assert!(bold.style.add_modifier.contains(Modifier::BOLD));
    let it = lines[0].spans.iter().find(|s| s.content == "it").unwrap();
    assert!(it.style.add_modifier.contains(Modifier::ITALIC));
}

#[test]
fn tables_render_as_rows() {
    let t = Theme::default();
    let lines = render(
        "| name | n |\n|---|---|\n| x | 10 |\n| longer | 2 |",
        30,
        &t,
    );
    assert_eq!(
        text(&lines),
        ["name   │ n", "───────────", "x      │ 10", "longer │ 2"]
    );
    // A table cut off mid-row while streaming still shows what has arrived.
    let lines = render("| a | b |\n|---|---|\n| 1 | 2", 30, &t);
    assert_eq!(text(&lines), ["a │ b", "─────", "1 │ 2"]);
}

#[test]
fn plain_text_keeps_newlines_and_wraps() {
    let lines = render_plain("# not a heading\n\nsecond line here", 10, Style::new());
    assert_eq!(
        text(&lines),
        ["# not a", "heading", "", "second", "line here"]
    );
}

#[test]
fn every_line_fits_the_width() {
    let t = Theme::default();
    let md = "Some text with `inline code` and a [link](http://example.com/a/very/long/path).\n\n\
              > a quote that goes on and on and on to wrap\n\n\
              1. item with a very long body that wraps several times over\n\
              2. another\n   - nested with more words than fit\n\n\
              ```\nlet x = 1;\n```";
    for w in [8u16, 13, 21, 40, 79] {
        for line in render(md, w, &t) {
            assert!(line.width() <= usize::from(w), "w={w}: {line:?}");
        }
    }
}

#[test]
fn streams_are_cut_after_blank_lines_outside_fences() {
    assert_eq!(stable_prefix_len("one line"), 0);
    assert_eq!(stable_prefix_len("para one\n\npara two"), 10);
    // A blank line inside an open fence is not a cut.
    let t = "intro\n\n```\ncode\n\nmore code";
    assert_eq!(stable_prefix_len(t), 7);
    // Once the fence closes, the next blank line is.
    let t = "intro\n\n```\ncode\n\nx\n```\n\nafter";
    assert_eq!(&t[stable_prefix_len(t)..], "after");
    assert_eq!(stable_prefix_len("~~~\na\n\nb"), 0);
}

#[test]
fn a_stream_cut_renders_like_the_whole() {
    let t = Theme::default();
    let doc = "# Title\n\nSome text that wraps around.\n\n```rust\nfn x() {}\n\nfn y() {}\n```\n\n- a\n- b\n\nlast para";
    let whole = text(&render(doc, 30, &t));
    let cut = stable_prefix_len(doc);
    let mut parts = text(&render(&doc[..cut], 30, &t));
    parts.push(String::new());
    parts.extend(text(&render(&doc[cut..], 30, &t)));
    assert_eq!(parts, whole);
}

#[test]
fn code_blocks_are_extracted_in_order() {
    let md = "x\n```sh\nls -l\n```\ny\n```\na\nb\n```";
    assert_eq!(code_blocks(md), ["ls -l\n", "a\nb\n"]);
    assert_eq!(code_blocks("```\nunclosed"), ["unclosed"]);
    assert!(code_blocks("no code").is_empty());
}
