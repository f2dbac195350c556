//! Tab completion in the message box: slash command names, and file paths after `/model` and
//! `/save` (the app layer lists the folder: the view does no I/O).

use super::commands::COMMANDS;
use super::msg::Effect;
use super::state::App;

/// What Tab should complete, from the text before the cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The command name typed so far (with its `/`).
    Command(String),
    /// The path typed so far after `/model ` or `/save `.
    Path(String),
}

/// What the text before the cursor (`line`, the box's only line) asks to complete.
pub fn target(line: &str) -> Option<Target> {
    let body = line.strip_prefix('/')?;
    if body.starts_with('/') {
        return None;
    }
    match body.split_once(' ') {
        None => Some(Target::Command(line.to_string())),
        Some((name, rest)) => {
            let takes_path = matches!(name, "model" | "models" | "load" | "save" | "export");
            (takes_path && !rest.starts_with(' ')).then(|| Target::Path(rest.to_string()))
        }
    }
}

/// The command names (`/clear`, …) that start with `typed`.
pub fn commands(typed: &str) -> Vec<String> {
    COMMANDS
        .iter()
        .filter_map(|(usage, _)| usage.split_whitespace().next())
        .filter(|name| name.starts_with(typed))
        .fold(Vec::new(), |mut names: Vec<String>, name| {
            // `/set` has several usage lines: one name.
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
            names
        })
}

/// The longest start that all of `names` share.
pub fn common_prefix(names: &[String]) -> String {
    let Some(first) = names.first() else {
        return String::new();
    };
    let mut len = first.len();
    for n in &names[1..] {
        len = first
            .char_indices()
            .zip(n.chars())
            .take_while(|((_, a), b)| a == b)
            .last()
            .map_or(0, |((i, a), _)| i + a.len_utf8())
            .min(len);
    }
    first[..len].to_string()
}

/// The part of a candidate path shown in the list of matches: its last component.
fn shown(name: &str) -> &str {
    let trimmed = name.trim_end_matches('/');
    match trimmed.rfind('/') {
        Some(i) => &name[i + 1..],
        None => name,
    }
}

impl App {
    /// Tab in the message box.
    pub(super) fn complete(&mut self) -> Vec<Effect> {
        let (before, one_line) = self.input.before_cursor();
        let target = if one_line { target(&before) } else { None };
        match target {
            Some(Target::Command(typed)) => {
                let names = commands(&typed);
                self.apply_completion(&typed, &names, "command");
                Vec::new()
            }
            Some(Target::Path(typed)) => vec![Effect::ListPaths(typed)],
            None => {
                self.hint = Some(
                    "Tab completes /commands, and the file after /model and /save".to_string(),
                );
                Vec::new()
            }
        }
    }

    /// The app layer's answer to [`Effect::ListPaths`]: the paths that start with `typed`
    /// (folders end with `/`).
    pub(super) fn on_paths(&mut self, typed: &str, names: &[String]) {
        let (before, _) = self.input.before_cursor();
        // Typing went on meanwhile: the answer is for text that is no longer there.
        if !before.ends_with(typed) {
            return;
        }
        self.apply_completion(typed, names, "file");
    }

    /// Types what all `names` share beyond `typed`; one name gets a space after it (or
    /// nothing, for a folder); several are listed on the hint line.
    fn apply_completion(&mut self, typed: &str, names: &[String], what: &str) {
        match names {
            [] => self.hint = Some(format!("no {what} starts with {typed}")),
            [one] => {
                let rest = one.strip_prefix(typed).unwrap_or("");
                self.input.insert(rest);
                if !one.ends_with('/') {
                    self.input.insert(" ");
                }
                self.hint = None;
            }
            many => {
                let common = common_prefix(many);
                self.input.insert(common.strip_prefix(typed).unwrap_or(""));
                let list: Vec<&str> = if what == "file" {
                    many.iter().map(|n| shown(n)).collect()
                } else {
                    many.iter().map(String::as_str).collect()
                };
                self.hint = Some(list.join("  "));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(target("/mo"), Some(Target::Command("/mo".into())));
        assert_eq!(target("/"), Some(Target::Command("/".into())));
        assert_eq!(target("/model ~/m"), Some(Target::Path("~/m".into())));
        assert_eq!(target("/save "), Some(Target::Path(String::new())));
        assert_eq!(target("/set temp"), None);
        assert_eq!(target("hello /mo"), None);
        assert_eq!(target("//x"), None);
    }

    #[test]
    fn command_names_and_their_common_start() {
        assert_eq!(commands("/s"), ["/system", "/set", "/save"]);
        assert_eq!(common_prefix(&commands("/s")), "/s");
        assert_eq!(commands("/cl"), ["/clear"]);
        assert!(commands("/zz").is_empty());
        let names = vec!["a/models/".to_string(), "a/model.gguf".to_string()];
        assert_eq!(common_prefix(&names), "a/model");
        assert_eq!(shown("a/models/"), "models/");
        assert_eq!(shown("x.gguf"), "x.gguf");
    }
}
