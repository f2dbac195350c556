//! The model picker: GGUF files found on this machine with size, architecture and quant type
//! read from their headers; type to filter, Enter to load.

use std::path::PathBuf;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};

use super::meter::{ellipsize, ellipsize_start, text};
use super::theme::Theme;
use super::units;

/// What a GGUF header says about a model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelHeader {
    pub architecture: String,
    /// The file's type as llama.cpp names it (`Q4_K - Medium`; `GgufFile::type_label`).
    pub quant: String,
    pub parameters: Option<u64>,
    pub context_length: Option<u64>,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
}

/// One model file found by discovery.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelEntry {
    /// What to call it: ollama's `name:tag`, the file stem otherwise.
    pub name: String,
    pub path: PathBuf,
    /// Where it was found (`ollama`, `Hugging Face`, `LM Studio`, `llama.cpp`, `hipscope`, `config`).
    pub source: String,
    pub size: u64,
    /// The header, or why it could not be read.
    pub header: Result<ModelHeader, String>,
    /// A remote engine (`[remote.NAME]` of config.toml) rather than a file; `path` is then its
    /// address, for display.
    pub remote: Option<crate::model::remote::client::RemoteSpec>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Picker {
    /// `None` while the first scan runs.
    pub entries: Option<Vec<ModelEntry>>,
    pub filter: String,
    pub selected: usize,
    /// The file loaded now, marked in the list.
    pub current: Option<PathBuf>,
    /// Directories searched, shown when nothing was found.
    pub searched: Vec<String>,
}

impl Picker {
    pub fn new(entries: Option<Vec<ModelEntry>>, current: Option<PathBuf>) -> Picker {
        Picker {
            entries,
            current,
            ..Picker::default()
        }
    }

    /// Entries that match the filter (every word, case-insensitive, in name, source or path).
    pub fn visible(&self) -> Vec<&ModelEntry> {
        let words: Vec<String> = self
            .filter
            .split_whitespace()
            .map(|w| w.to_lowercase())
            .collect();
        self.entries
            .iter()
            .flatten()
            .filter(|e| {
                let hay = format!(
                    "{} {} {} {}",
                    e.name,
                    e.source,
                    e.path.display(),
                    e.header
                        .as_ref()
                        .map(|h| format!("{} {}", h.architecture, h.quant))
                        .unwrap_or_default()
                )
                .to_lowercase();
                words.iter().all(|w| hay.contains(w.as_str()))
            })
            .collect()
    }

    pub fn selected_entry(&self) -> Option<&ModelEntry> {
        self.visible().get(self.selected).copied()
    }

    pub fn up(&mut self) {
        self.selected = self.selected.saturating_sub(1);
    }

    pub fn down(&mut self) {
        let n = self.visible().len();
        if self.selected + 1 < n {
            self.selected += 1;
        }
    }

    pub fn page(&mut self, delta: isize) {
        let n = self.visible().len();
        let s = self.selected as isize + delta;
        self.selected = s.clamp(0, n.saturating_sub(1) as isize) as usize;
    }

    pub fn type_char(&mut self, c: char) {
        self.filter.push(c);
        self.selected = 0;
    }

    pub fn backspace(&mut self) {
        self.filter.pop();
        self.selected = 0;
    }

    pub fn set_entries(&mut self, entries: Vec<ModelEntry>) {
        self.entries = Some(entries);
        let n = self.visible().len();
        if self.selected >= n {
            self.selected = n.saturating_sub(1);
        }
    }

    pub fn render(&self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let width = area.width.saturating_sub(4).clamp(20, 120);
        let height = area.height.saturating_sub(2).max(6);
        let rect = super::meter::centered(area, width, height);
        frame.render_widget(Clear, rect);
        let block = Block::bordered()
            .border_type(BorderType::Rounded)
            .border_style(theme.border_focus)
            .title(Span::styled(" Models ", theme.title))
            .title_bottom(Line::from(vec![
                Span::styled(" ↑↓", theme.key),
                Span::styled(" select  ", theme.key_text),
                Span::styled("type", theme.key),
                Span::styled(" filter  ", theme.key_text),
                Span::styled("Enter", theme.key),
                Span::styled(" load  ", theme.key_text),
                Span::styled("Esc", theme.key),
                Span::styled(" close ", theme.key_text),
            ]));
        let inner = block.inner(rect);
        frame.render_widget(block, rect);
        if inner.height < 3 {
            return;
        }
        let w = usize::from(inner.width);
        let mut lines = vec![Line::from(vec![
            text(" filter: ", theme.dim),
            text(self.filter.clone(), theme.text),
            text("▏", theme.key),
        ])];
        let Some(all) = &self.entries else {
            lines.push(Line::from(text(" Looking for GGUF files…", theme.dim)));
            frame.render_widget(Paragraph::new(lines), inner);
            return;
        };
        let visible = self.visible();
        if visible.is_empty() {
            if all.is_empty() {
                lines.push(Line::from(text(
                    " No GGUF files found. Searched:",
                    theme.notice,
                )));
                for d in &self.searched {
                    lines.push(Line::from(text(format!("   {d}"), theme.dim)));
                }
                lines.push(Line::from(text(
                    " Add folders under [models] search_paths in config.toml, or type /model PATH.",
                    theme.dim,
                )));
            } else {
                lines.push(Line::from(text(
                    format!(" No model matches `{}`.", self.filter),
                    theme.notice,
                )));
            }
            frame.render_widget(Paragraph::new(lines), inner);
            return;
        }
        // Columns: name, arch, quant, params, size, source.
        // Marker, then the columns after the name: arch, quant, params, size, source.
        let fixed = 3 + 1 + 12 + 8 + 6 + 10 + 2 + 12;
        let name_w = w.saturating_sub(fixed).max(12);
        lines.push(Line::from(text(
            format!(
                "   {:<name_w$} {:<12}{:<8}{:>6}{:>10}  {:<12}",
                "name", "arch", "quant", "params", "size", "source"
            ),
            theme.dim,
        )));
        // Two rows per entry (the second: path or error); keep the selection in view.
        let rows_per = 2usize;
        let room = (usize::from(inner.height).saturating_sub(lines.len())) / rows_per;
        let first = if room == 0 {
            self.selected
        } else {
            self.selected.saturating_sub(room.saturating_sub(1))
        };
        for (i, e) in visible.iter().enumerate().skip(first).take(room.max(1)) {
            let selected = i == self.selected;
            let marker = if self.current.as_ref() == Some(&e.path) {
                "●"
            } else {
                " "
            };
            let (arch, quant, params, detail, detail_style) = match &e.header {
                Ok(h) => (
                    h.architecture.clone(),
                    h.quant.clone(),
                    h.parameters.map(units::params).unwrap_or_default(),
                    ellipsize_start(&e.path.display().to_string(), w.saturating_sub(5)),
                    theme.dim,
                ),
                Err(why) => (
                    "?".to_string(),
                    "?".to_string(),
                    String::new(),
                    ellipsize(&format!("unreadable: {why}"), w.saturating_sub(5)),
                    theme.error,
                ),
            };
            let row = format!(
                " {marker} {:<name_w$} {:<12}{:<8}{:>6}{:>10}  {:<12}",
                ellipsize(&e.name, name_w),
                ellipsize(&arch, 11),
                ellipsize(&quant, 7),
                params,
                units::bytes(e.size),
                ellipsize(&e.source, 12),
            );
            let style = if selected { theme.selected } else { theme.text };
            lines.push(Line::from(Span::styled(ellipsize(&row, w), style)));
            lines.push(Line::from(text(format!("     {detail}"), detail_style)));
        }
        frame.render_widget(Paragraph::new(lines), inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, source: &str, arch: &str) -> ModelEntry {
        ModelEntry {
            remote: None,
            name: name.into(),
            path: PathBuf::from(format!("/m/{name}.gguf")),
            source: source.into(),
            size: 1 << 20,
            header: Ok(ModelHeader {
                architecture: arch.into(),
                quant: "Q4_K".into(),
                ..ModelHeader::default()
            }),
        }
    }

    #[test]
    fn filter_matches_every_word_anywhere() {
        let mut p = Picker::new(
            Some(vec![
                entry("SmolLM2-135M", "hipscope", "llama"),
                entry("qwen2.5:0.5b", "ollama", "qwen2"),
                entry("Mistral-7B", "Hugging Face", "llama"),
            ]),
            None,
        );
        for c in "LLAMA hug".chars() {
            p.type_char(c);
        }
        let names: Vec<&str> = p.visible().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["Mistral-7B"]);
        p.filter.clear();
        p.down();
        p.down();
        p.down();
        assert_eq!(p.selected, 2, "selection stops at the last entry");
        p.up();
        assert_eq!(p.selected_entry().unwrap().name, "qwen2.5:0.5b");
    }
}
