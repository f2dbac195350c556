//! Slash commands typed into the input line.

use std::path::PathBuf;

/// A parsed slash command.
#[derive(Clone, Debug, PartialEq)]
pub enum SlashCommand {
    Clear,
    Regen,
    /// `/system` alone opens the editor; with text it sets the prompt directly.
    System(Option<String>),
    /// `/set` alone opens the sampler form; `/set KEY VALUE` changes one setting.
    Set(Option<(String, String)>),
    /// `/set save`: keep the sampler settings as the defaults (in the config file).
    KeepSettings,
    /// `/set ctx N`: load the model again with a context of N tokens (0: the model's own).
    Context(usize),
    /// `/model` alone opens the picker; with a path it loads that file.
    Model(Option<PathBuf>),
    /// `/save [PATH]`: export the conversation as Markdown; `/save! PATH` replaces an existing
    /// file.
    Save {
        path: Option<PathBuf>,
        overwrite: bool,
    },
    /// `/copy` copies the last answer; `/copy code [N]` its N-th code block (1-based, default last).
    Copy(CopyTarget),
    /// `/trace on [FILE]` (`Some`: start the timeline file, to FILE or a fresh one) or
    /// `/trace off` (`None`).
    Trace(Option<Option<PathBuf>>),
    Help,
    Quit,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyTarget {
    Answer,
    /// 1-based index; `None` is the last block.
    Code(Option<usize>),
}

/// What was typed, once classified.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    /// A message for the model (a leading `//` sends a literal `/`).
    Message(String),
    Command(SlashCommand),
    /// A slash command that is unknown or malformed: the message says what was wrong.
    Invalid(String),
}

/// Every command with its arguments and what it does, for `/help`, Tab completion and error
/// messages; the README's command list is held to it by a test.
pub const COMMANDS: &[(&str, &str)] = &[
    (
        "/clear",
        "forget the conversation (the system prompt stays)",
    ),
    ("/regen", "drop the last answer and generate it again"),
    (
        "/system [TEXT]",
        "set the system prompt (no text: open the editor)",
    ),
    (
        "/set [KEY VALUE]",
        "change a sampler setting, e.g. /set temp 0.7, /set seed random (no args: the form)",
    ),
    (
        "/set ctx N",
        "the context, in tokens: the model is loaded again, the conversation kept",
    ),
    (
        "/set save",
        "keep the sampler settings as the defaults (in the config file)",
    ),
    ("/model [PATH]", "pick a model (no path: the picker)"),
    (
        "/save [PATH]",
        "export the conversation as Markdown (/save! PATH replaces a file)",
    ),
    (
        "/copy [code [N]]",
        "copy the last answer, or its N-th code block (OSC 52)",
    ),
    (
        "/trace on|off [FILE]",
        "write a timeline of every op to FILE (Perfetto / chrome://tracing; docs/PROFILING.md)",
    ),
    ("/help", "show keys and commands"),
    ("/quit", "quit (also /exit)"),
];

/// Classifies a submitted input.
pub fn parse(input: &str) -> Parsed {
    let trimmed = input.trim();
    if let Some(rest) = trimmed.strip_prefix("//") {
        return Parsed::Message(format!("/{rest}"));
    }
    let Some(body) = trimmed.strip_prefix('/') else {
        return Parsed::Message(input.trim_end().to_string());
    };
    let (name, args) = match body.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (body, ""),
    };
    let arg = (!args.is_empty()).then(|| args.to_string());
    let cmd = match name {
        "clear" | "reset" => no_args(name, args, SlashCommand::Clear),
        "regen" | "regenerate" | "retry" => no_args(name, args, SlashCommand::Regen),
        "system" => Ok(SlashCommand::System(arg)),
        "set" => parse_set(args),
        "model" | "models" | "load" => Ok(SlashCommand::Model(arg.map(|a| expand_home(&a)))),
        "save" | "export" | "save!" | "export!" => Ok(SlashCommand::Save {
            path: arg.map(|a| expand_home(&a)),
            overwrite: name.ends_with('!'),
        }),
        "copy" => parse_copy(args),
        "trace" => parse_trace(args),
        "help" | "?" => Ok(SlashCommand::Help),
        "quit" | "exit" | "q" => no_args(name, args, SlashCommand::Quit),
        "" => Err(
            "an empty command: type /help to list them, or // to send a message that starts with /"
                .to_string(),
        ),
        other => Err(format!(
            "unknown command /{other}: type /help to list them, or // to send a message that starts with /"
        )),
    };
    match cmd {
        Ok(c) => Parsed::Command(c),
        Err(e) => Parsed::Invalid(e),
    }
}

fn parse_trace(args: &str) -> Result<SlashCommand, String> {
    let (what, file) = match args.split_once(char::is_whitespace) {
        Some((w, f)) => (w, Some(f.trim())),
        None => (args, None),
    };
    match (what, file) {
        ("on", f) => Ok(SlashCommand::Trace(Some(
            f.filter(|f| !f.is_empty()).map(expand_home),
        ))),
        ("off", None) => Ok(SlashCommand::Trace(None)),
        ("off", Some(_)) => Err("/trace off takes no file".to_string()),
        _ => Err("/trace on [FILE] starts a timeline file, /trace off stops it".to_string()),
    }
}

fn no_args(name: &str, args: &str, cmd: SlashCommand) -> Result<SlashCommand, String> {
    if args.is_empty() {
        Ok(cmd)
    } else {
        Err(format!("/{name} takes no arguments (got `{args}`)"))
    }
}

/// The names `/set` takes for the context length (as `-c`/`--ctx-size` and `ctx_size`).
pub const CONTEXT_KEYS: &[&str] = &["ctx", "context", "ctx_size", "ctx-size", "c"];

fn parse_set(args: &str) -> Result<SlashCommand, String> {
    if args.is_empty() {
        return Ok(SlashCommand::Set(None));
    }
    if args == "save" {
        return Ok(SlashCommand::KeepSettings);
    }
    let mut parts = args.splitn(2, char::is_whitespace);
    let key = parts.next().unwrap_or_default().trim();
    let value = parts.next().unwrap_or_default().trim();
    // `/set temp=0.7` is accepted as well.
    let (key, value) = match key.split_once('=') {
        Some((k, v)) if value.is_empty() => (k, v),
        _ => (key, value),
    };
    if value.is_empty() {
        return Err(format!(
            "/set {key} needs a value, e.g. /set temp 0.7 (/set alone opens the form)"
        ));
    }
    if CONTEXT_KEYS.contains(&key) {
        let max = crate::model::loader::MAX_CTX;
        return match value.parse::<usize>() {
            Ok(n) if n <= max => Ok(SlashCommand::Context(n)),
            _ => Err(format!(
                "/set {key}: `{value}` is not allowed: 0 (the model's own context, at most 4096) or a whole number of tokens up to {max}"
            )),
        };
    }
    Ok(SlashCommand::Set(Some((
        key.to_string(),
        value.to_string(),
    ))))
}

fn parse_copy(args: &str) -> Result<SlashCommand, String> {
    let mut words = args.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (None, _, _) | (Some("answer"), None, _) => Ok(SlashCommand::Copy(CopyTarget::Answer)),
        (Some("code"), None, _) => Ok(SlashCommand::Copy(CopyTarget::Code(None))),
        (Some("code"), Some(n), None) => match n.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(SlashCommand::Copy(CopyTarget::Code(Some(n)))),
            _ => Err(format!(
                "/copy code takes a block number from 1 (got `{n}`)"
            )),
        },
        _ => Err(format!("/copy takes `code [N]` or nothing (got `{args}`)")),
    }
}

/// `~/x` → `$HOME/x`, as a shell would.
fn expand_home(p: &str) -> PathBuf {
    if let Some(rest) = p.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_a_message() {
        assert_eq!(parse("hello"), Parsed::Message("hello".into()));
        assert_eq!(
            parse("  two\nlines  "),
            Parsed::Message("  two\nlines".into())
        );
    }

    #[test]
    fn double_slash_sends_a_literal_slash() {
        assert_eq!(
            parse("//etc/passwd?"),
            Parsed::Message("/etc/passwd?".into())
        );
    }

    /// The README's "Commands:" paragraph (section "## Chat") names every command as the help
    /// screen writes it, and no command the program does not have.
    #[test]
    fn readme_command_list_matches_the_program() {
        let readme = include_str!("../../README.md");
        let chat = &readme[readme.find("## Chat").expect("a Chat section")..];
        let start = chat
            .find("\nCommands:")
            .expect("a Commands: paragraph in Chat")
            + 1;
        let para = &chat[start..start + chat[start..].find("\n\n").unwrap_or(chat.len() - start)];
        for (usage, _) in COMMANDS {
            assert!(
                para.contains(&format!("`{usage}`")),
                "README lacks `{usage}`:\n{para}"
            );
        }
        let names: Vec<&str> = COMMANDS
            .iter()
            .filter_map(|(u, _)| u.split_whitespace().next())
            .collect();
        for span in para.split('`').skip(1).step_by(2) {
            let name = span.split_whitespace().next().unwrap_or("");
            if span == "/" || span.starts_with("//") || !span.starts_with('/') {
                continue;
            }
            assert!(
                names.contains(&name),
                "README's `{span}`: no {name} in COMMANDS"
            );
            // An example with its values (not a usage line) is one the program takes.
            if !COMMANDS.iter().any(|(u, _)| u == &span) {
                assert!(
                    matches!(parse(span), Parsed::Command(_)),
                    "README's `{span}` does not parse: {:?}",
                    parse(span)
                );
            }
        }
    }

    #[test]
    fn item7_set_ctx_takes_a_whole_number_of_tokens() {
        use SlashCommand::*;
        assert_eq!(parse("/set ctx 2048"), Parsed::Command(Context(2048)));
        assert_eq!(parse("/set context=0"), Parsed::Command(Context(0)));
        assert_eq!(parse("/set c 512"), Parsed::Command(Context(512)));
        for bad in [
            "/set ctx big",
            "/set ctx -4",
            "/set ctx 16777217",
            "/set ctx 1.5",
        ] {
            let Parsed::Invalid(m) = parse(bad) else {
                panic!("{bad} parsed")
            };
            assert!(m.contains("up to 16777216"), "{m}");
        }
    }

    #[test]
    fn commands_parse_with_and_without_arguments() {
        use SlashCommand::*;
        assert_eq!(parse("/clear"), Parsed::Command(Clear));
        assert_eq!(parse("/regen"), Parsed::Command(Regen));
        assert_eq!(parse("/system"), Parsed::Command(System(None)));
        assert_eq!(
            parse("/system You are terse."),
            Parsed::Command(System(Some("You are terse.".into())))
        );
        assert_eq!(parse("/set"), Parsed::Command(Set(None)));
        assert_eq!(parse("/set save"), Parsed::Command(KeepSettings));
        assert_eq!(parse("/trace on"), Parsed::Command(Trace(Some(None))));
        assert_eq!(
            parse("/trace on /tmp/t.json"),
            Parsed::Command(Trace(Some(Some(PathBuf::from("/tmp/t.json")))))
        );
        assert_eq!(parse("/trace off"), Parsed::Command(Trace(None)));
        assert!(matches!(parse("/trace"), Parsed::Invalid(_)));
        assert!(matches!(parse("/trace off x"), Parsed::Invalid(_)));
        assert_eq!(
            parse("/set temp 0.7"),
            Parsed::Command(Set(Some(("temp".into(), "0.7".into()))))
        );
        assert_eq!(
            parse("/set top_k=20"),
            Parsed::Command(Set(Some(("top_k".into(), "20".into()))))
        );
        assert_eq!(parse("/model"), Parsed::Command(Model(None)));
        assert_eq!(
            parse("/model /m/x.gguf"),
            Parsed::Command(Model(Some("/m/x.gguf".into())))
        );
        assert_eq!(
            parse("/save"),
            Parsed::Command(Save {
                path: None,
                overwrite: false
            })
        );
        assert_eq!(
            parse("/save! /tmp/x.md"),
            Parsed::Command(Save {
                path: Some(PathBuf::from("/tmp/x.md")),
                overwrite: true
            })
        );
        assert_eq!(parse("/help"), Parsed::Command(Help));
        assert_eq!(parse("/quit"), Parsed::Command(Quit));
        assert_eq!(parse("/exit"), Parsed::Command(Quit));
        assert_eq!(parse("/copy"), Parsed::Command(Copy(CopyTarget::Answer)));
        assert_eq!(
            parse("/copy code 2"),
            Parsed::Command(Copy(CopyTarget::Code(Some(2))))
        );
    }

    #[test]
    fn bad_commands_say_what_is_wrong() {
        let Parsed::Invalid(m) = parse("/frobnicate now") else {
            panic!("accepted an unknown command")
        };
        assert!(m.contains("unknown command /frobnicate"), "{m}");
        assert!(m.contains("/help"), "{m}");
        let Parsed::Invalid(m) = parse("/set temp") else {
            panic!()
        };
        assert!(m.contains("needs a value"), "{m}");
        let Parsed::Invalid(m) = parse("/clear everything") else {
            panic!()
        };
        assert!(m.contains("takes no arguments"), "{m}");
        let Parsed::Invalid(m) = parse("/copy code 0") else {
            panic!()
        };
        assert!(m.contains("from 1"), "{m}");
    }
}
