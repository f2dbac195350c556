use super::*;

fn words<'a>(pre: &PreTokenizer, text: &'a str) -> Vec<&'a str> {
    pre.split(text).into_iter().map(|r| &text[r]).collect()
}

#[test]
fn every_supported_pattern_compiles() {
    let names = [
        "default",
        "llama3",
        "dbrx",
        "jais-2",
        "deepseek-llm",
        "deepseek-v3",
        "deepseek-coder",
        "falcon",
        "starcoder",
        "smollm",
        "gpt-2",
        "trillion",
        "qwen2",
        "stablelm2",
        "qwen35",
        "laguna",
        "poro-chat",
        "bloom",
        "viking",
        "chatglm-bpe",
        "glm4",
        "tekken",
        "chameleon",
        "gpt-4o",
        "superbpe",
        "bailingmoe",
        "seed-coder",
        "ufakzeka",
        "exaone-moe",
        "minicpm5",
        "gemma4",
        "sarvam-moe",
    ];
    for n in names {
        let cfg = pre_config(n).expect(n);
        if let Err(e) = PreTokenizer::new(cfg.patterns) {
            panic!("{n}: {} does not compile: {}", e.pattern, e.message);
        }
    }
    assert!(pre_config("kimi-k2").is_none());
}

// The expected splits below are what the published regexes give (checked with Python's
// `regex` module, which implements them as HF tokenizers do).
#[test]
fn gpt2_splits_like_its_regex() {
    let pre = PreTokenizer::new(&[GPT2]).unwrap();
    assert_eq!(
        words(&pre, "Hello world, it's 2024!  ok\n\nbye"),
        [
            "Hello", " world", ",", " it", "'s", " 2024", "!", " ", " ok", "\n", "\n", "bye"
        ]
    );
    assert_eq!(words(&pre, "   "), ["   "]);
    assert_eq!(words(&pre, "a   b"), ["a", "  ", " b"]);
}

#[test]
fn llama3_groups_digits_by_three_and_keeps_newlines_with_punctuation() {
    let pre = PreTokenizer::new(&[LLAMA3]).unwrap();
    assert_eq!(words(&pre, "1234567"), ["123", "456", "7"]);
    assert_eq!(words(&pre, "I'M here"), ["I", "'M", " here"]);
    assert_eq!(words(&pre, "x.)\n\ny"), ["x", ".)\n\n", "y"]);
    assert_eq!(words(&pre, "a \n b"), ["a", " \n", " b"]);
    let qwen = PreTokenizer::new(&[QWEN2]).unwrap();
    assert_eq!(words(&qwen, "123"), ["1", "2", "3"]);
}

#[test]
fn regex_patterns_use_collapsed_categories() {
    // smollm: digits are isolated first, then GPT-2 splits the rest.
    let pre = PreTokenizer::new(pre_config("smollm").unwrap().patterns).unwrap();
    assert_eq!(words(&pre, "ab12 ٣x"), ["ab", "1", "2", " ", "٣", "x"]);
    // default: punctuation runs first (the Arabic-Indic digit is \p{N} via its stand-in).
    let pre = PreTokenizer::new(pre_config("default").unwrap().patterns).unwrap();
    assert_eq!(
        words(&pre, "a,,b «x»"),
        ["a", ",,", "b", " ", "«", "x", "»"]
    );
}

#[test]
fn collapse_rewrites_classes_inside_and_outside_brackets() {
    assert_eq!(
        collapse_pattern("\\p{N}+[^\\s\\p{L}]").unwrap(),
        "[\\x{E0D1}0-9]+[^\\s\\x{E0D2}A-Za-z]"
    );
    assert!(collapse_pattern("\\p{L}é").is_err());
}

#[test]
fn split_covers_the_text() {
    let pre = PreTokenizer::new(pre_config("deepseek-llm").unwrap().patterns).unwrap();
    let text = "Hello 世界!\r\n  123 çà   ";
    let joined: String = words(&pre, text).concat();
    assert_eq!(joined, text);
}
