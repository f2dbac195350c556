use super::*;

fn template(source: &str, bos: &str, eos: &str, add_bos: bool) -> ChatTemplate {
    ChatTemplate::from_source(
        "test".into(),
        source.into(),
        bos.into(),
        eos.into(),
        add_bos,
        false,
    )
    .expect("parses")
}

fn chat() -> Vec<Message> {
    vec![
        Message::new("system", "Be brief."),
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello."),
        Message::new("user", "Bye"),
    ]
}

#[test]
fn chatml_asset_renders_chatml() {
    let t = template(Format::ChatMl.source(), "", "", false);
    assert_eq!(
        t.render_at(&chat(), true, 0).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert!(
        !t.render_at(&chat(), false, 0)
            .unwrap()
            .ends_with("assistant\n")
    );
    assert!(t.supports_system_role());
}

#[test]
fn blocks_trim_and_strip_like_hugging_face() {
    // trim_blocks: the newline after a block tag goes; lstrip_blocks: so does the
    // indentation before it. Expressions keep their whitespace. (The template shows only
    // user messages, so a system message would be merged into the first one.)
    let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    let t = template(src, "", "", false);
    assert_eq!(
        t.render_at(&chat()[1..], false, 0).unwrap(),
        "[Hi]\n[Bye]\n"
    );
}

#[test]
fn system_message_merged_when_the_template_drops_it() {
    let src = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}";
    let t = template(src, "", "", false);
    assert!(!t.supports_system_role());
    assert_eq!(
        t.render_at(&chat(), false, 0).unwrap(),
        "<user>Be brief.\nHi<assistant>Hello.<user>Bye"
    );
    // A lone system message is dropped.
    assert_eq!(t.render_at(&chat()[..1], false, 0).unwrap(), "");
}

#[test]
fn bos_text_is_left_to_the_tokenizer() {
    let src = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}";
    let adds = template(src, "<s>", "</s>", true);
    assert_eq!(adds.render_at(&chat()[1..2], false, 0).unwrap(), "Hi</s>");
    let keeps = template(src, "<s>", "</s>", false);
    assert_eq!(
        keeps.render_at(&chat()[1..2], false, 0).unwrap(),
        "<s>Hi</s>"
    );
}

#[test]
fn errors_name_the_template_line() {
    let e = ChatTemplate::from_source(
        "model.gguf (tokenizer.chat_template)".into(),
        "line one\n{% for x in %}\n".into(),
        String::new(),
        String::new(),
        false,
        false,
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, TemplateError::Parse { line: Some(2), .. }),
        "{msg}"
    );
    assert!(
        msg.contains("model.gguf") && msg.contains("line 2"),
        "{msg}"
    );

    let t = template(
        "a\nb\n{{ raise_exception('roles must alternate') }}",
        "",
        "",
        false,
    );
    let e = t.render_at(&chat(), true, 0).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, TemplateError::Render { line: Some(3), .. }),
        "{msg}"
    );
    assert!(msg.contains("roles must alternate"), "{msg}");
}

#[test]
fn python_methods_and_filters() {
    // Booleans print as Python prints them ("True"), as in jinja2.
    let src = "{{ messages[0].content.strip().upper() }}|{{ 'a,b'.split(',') | tojson }}|\
               {{ {'k': [1, 2.5, none, true], 'q': 'x\"y'} | tojson }}|{{ messages[1].content.startswith('H') }}";
    let t = template(src, "", "", false);
    let msgs = [Message::new("user", "  hey "), Message::new("user", "Hi")];
    assert_eq!(
        t.render_at(&msgs, false, 0).unwrap(),
        "HEY|[\"a\", \"b\"]|{\"k\": [1, 2.5, null, true], \"q\": \"x\\\"y\"}|True"
    );
    let t = template(
        "{{ {'a': {'b': 1}, 'c': []} | tojson(indent=2) }}",
        "",
        "",
        false,
    );
    assert_eq!(
        t.render_at(&[], false, 0).unwrap(),
        "{\n  \"a\": {\n    \"b\": 1\n  },\n  \"c\": []\n}"
    );
}

#[test]
fn strftime_formats_dates() {
    // 2024-07-26 12:00 UTC.
    assert_eq!(
        utc_strftime("%d %b %Y, %A %H:%M:%S %%", 1_721_995_200),
        "26 Jul 2024, Friday 12:00:00 %"
    );
    assert_eq!(utc_strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
    assert_eq!(utc_strftime("%e %B %y", 951_782_400), "29 February 00");
    // The local-time version agrees on the year at noon UTC in every time zone.
    let local = strftime("%Y", 1_721_995_200).unwrap();
    assert_eq!(local, "2024");
    let t = template("{{ strftime_now('%Y') }}|{{ date_string }}", "", "", false);
    let out = t.render_at(&[], false, 1_721_995_200).unwrap();
    assert!(
        out.starts_with("2024|") && out.ends_with("Jul 2024"),
        "{out}"
    );
}

#[test]
fn tools_is_none_and_undefined_is_lenient() {
    let t = template(
        "{% if tools is not none %}tools{% endif %}{{ missing }}{% if missing is defined %}x{% endif %}ok",
        "",
        "",
        false,
    );
    assert_eq!(t.render_at(&[], false, 0).unwrap(), "ok");
}

/// The built-in formats, as llama.cpp's `llm_chat_apply_template` writes its `llama3` and
/// `gemma` templates (src/llama-chat.cpp): trimmed messages, Gemma's system message before the
/// first user message, its `model` role. (tests/base_model_chat.rs compares them with a real
/// llama-server.)
#[test]
fn builtin_formats_render_as_llama_cpp_writes_them() {
    let render = |f: Format| template(f.source(), "", "", false).render_at(&chat(), true, 0);
    assert_eq!(
        render(Format::Llama3).unwrap(),
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    assert_eq!(
        render(Format::Gemma).unwrap(),
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    assert_eq!(render(Format::Plain).unwrap(), "Be brief.\n\nHiHello.Bye");
    for f in [Format::Gemma, Format::Llama3, Format::ChatMl, Format::Plain] {
        assert!(
            template(f.source(), "", "", false).supports_system_role(),
            "{f:?} keeps the system text"
        );
    }
}
