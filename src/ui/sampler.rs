//! Sampler settings: the one table of fields (name, what is allowed, how to read and write it)
//! used by `/set`, the sampler form and the config file, and the form itself.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};

use crate::model::protocol::SamplerConfig;
use crate::model::sampler::RANDOM_SEED;

use super::theme::Theme;

/// One sampler setting.
pub struct Field {
    pub name: &'static str,
    /// Other names accepted by `/set` (llama.cpp's flag spellings).
    pub aliases: &'static [&'static str],
    pub help: &'static str,
    /// What values are allowed, in words (shown in error messages).
    pub allowed: &'static str,
    pub get: fn(&SamplerConfig) -> String,
    pub set: fn(&mut SamplerConfig, &str) -> Result<(), String>,
}

fn parse_f32(v: &str, ok: impl Fn(f32) -> bool, allowed: &str) -> Result<f32, String> {
    match v.trim().parse::<f32>() {
        Ok(x) if x.is_finite() && ok(x) => Ok(x),
        _ => Err(format!("`{v}` is not allowed: {allowed}")),
    }
}

fn parse_int<T: std::str::FromStr>(
    v: &str,
    ok: impl Fn(&T) -> bool,
    allowed: &str,
) -> Result<T, String> {
    match v.trim().parse::<T>() {
        Ok(x) if ok(&x) => Ok(x),
        _ => Err(format!("`{v}` is not allowed: {allowed}")),
    }
}

/// Every sampler setting a user can change, in the form's order.
pub const FIELDS: &[Field] = &[
    Field {
        name: "temp",
        aliases: &["temperature"],
        help: "randomness; 0 always picks the likeliest",
        allowed: "a number from 0 to 5",
        get: |c| format!("{}", c.temp),
        set: |c, v| {
            c.temp = parse_f32(v, |x| (0.0..=5.0).contains(&x), "a number from 0 to 5")?;
            Ok(())
        },
    },
    Field {
        name: "top_k",
        aliases: &["top-k"],
        help: "keep the K likeliest tokens; 0 keeps all",
        allowed: "a whole number from 0",
        get: |c| c.top_k.to_string(),
        set: |c, v| {
            c.top_k = parse_int::<u32>(v, |_| true, "a whole number from 0")?;
            Ok(())
        },
    },
    Field {
        name: "top_p",
        aliases: &["top-p"],
        help: "keep tokens up to this probability mass",
        allowed: "a number above 0, at most 1",
        get: |c| format!("{}", c.top_p),
        set: |c, v| {
            c.top_p = parse_f32(v, |x| x > 0.0 && x <= 1.0, "a number above 0, at most 1")?;
            Ok(())
        },
    },
    Field {
        name: "min_p",
        aliases: &["min-p"],
        help: "drop tokens under this share of the best",
        allowed: "a number from 0 to 1",
        get: |c| format!("{}", c.min_p),
        set: |c, v| {
            c.min_p = parse_f32(v, |x| (0.0..=1.0).contains(&x), "a number from 0 to 1")?;
            Ok(())
        },
    },
    Field {
        name: "repeat_penalty",
        aliases: &["repeat-penalty"],
        help: "penalise recent tokens; 1 disables",
        allowed: "a number above 0, at most 10",
        get: |c| format!("{}", c.repeat_penalty),
        set: |c, v| {
            c.repeat_penalty =
                parse_f32(v, |x| x > 0.0 && x <= 10.0, "a number above 0, at most 10")?;
            Ok(())
        },
    },
    Field {
        name: "repeat_last_n",
        aliases: &["repeat-last-n"],
        help: "tokens the penalty looks back over",
        allowed: "a whole number from 0",
        get: |c| c.repeat_last_n.to_string(),
        set: |c, v| {
            c.repeat_last_n = parse_int::<u32>(v, |_| true, "a whole number from 0")?;
            Ok(())
        },
    },
    Field {
        name: "n_predict",
        aliases: &["n-predict", "max_tokens"],
        help: "most tokens per answer; -1: no limit",
        allowed: "-1 (no limit) or a whole number from 0",
        get: |c| c.n_predict.to_string(),
        set: |c, v| {
            c.n_predict =
                parse_int::<i32>(v, |&n| n >= -1, "-1 (no limit) or a whole number from 0")?;
            Ok(())
        },
    },
    Field {
        name: "seed",
        aliases: &[],
        help: "random (or -1): a new seed each run",
        allowed: "random, -1 or a whole number from 0 to 18446744073709551615",
        get: |c| {
            if c.seed == RANDOM_SEED {
                "random".into()
            } else {
                c.seed.to_string()
            }
        },
        set: |c, v| {
            let allowed = "random, -1 or a whole number from 0 to 18446744073709551615";
            c.seed = match v.trim() {
                "random" | "-1" => RANDOM_SEED,
                _ => parse_int::<u64>(v, |_| true, allowed)?,
            };
            Ok(())
        },
    },
];

/// Finds a field by name or alias.
pub fn field(name: &str) -> Option<&'static Field> {
    FIELDS
        .iter()
        .find(|f| f.name == name || f.aliases.contains(&name))
}

/// Applies `/set KEY VALUE`; the error names the key and what is allowed.
pub fn set(config: &mut SamplerConfig, key: &str, value: &str) -> Result<(), String> {
    let Some(f) = field(key) else {
        let names: Vec<&str> = FIELDS.iter().map(|f| f.name).collect();
        return Err(format!(
            "unknown setting `{key}`; the settings are {}",
            names.join(", ")
        ));
    };
    (f.set)(config, value).map_err(|e| format!("{}: {e}", f.name))
}

/// The sampler form: one text field per setting.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerForm {
    pub values: Vec<String>,
    pub selected: usize,
    /// The field and message of the last failed apply.
    pub error: Option<(usize, String)>,
}

/// What a key did to the form.
#[derive(Clone, Debug, PartialEq)]
pub enum FormOutcome {
    Continue,
    Cancel,
    Apply(SamplerConfig),
}

impl SamplerForm {
    pub fn new(config: &SamplerConfig) -> SamplerForm {
        SamplerForm {
            values: FIELDS.iter().map(|f| (f.get)(config)).collect(),
            selected: 0,
            error: None,
        }
    }

    pub fn up(&mut self) {
        self.selected = self.selected.checked_sub(1).unwrap_or(FIELDS.len() - 1);
    }

    pub fn down(&mut self) {
        self.selected = (self.selected + 1) % FIELDS.len();
    }

    pub fn type_char(&mut self, c: char) {
        if let Some(v) = self.values.get_mut(self.selected) {
            v.push(c);
        }
        self.error = None;
    }

    pub fn backspace(&mut self) {
        if let Some(v) = self.values.get_mut(self.selected) {
            v.pop();
        }
        self.error = None;
    }

    pub fn clear_field(&mut self) {
        if let Some(v) = self.values.get_mut(self.selected) {
            v.clear();
        }
    }

    /// Validates every field on top of `base`; on error, selects the bad field.
    pub fn apply(&mut self, base: &SamplerConfig) -> FormOutcome {
        let mut config = base.clone();
        for (i, (f, v)) in FIELDS.iter().zip(&self.values).enumerate() {
            if let Err(e) = (f.set)(&mut config, v) {
                self.selected = i;
                self.error = Some((i, e));
                return FormOutcome::Continue;
            }
        }
        FormOutcome::Apply(config)
    }

    pub fn render(&self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let name_w = FIELDS.iter().map(|f| f.name.len()).max().unwrap_or(8);
        let mut lines = Vec::new();
        for (i, (f, v)) in FIELDS.iter().zip(&self.values).enumerate() {
            let selected = i == self.selected;
            let value_style = if selected { theme.selected } else { theme.text };
            let cursor = if selected { "▏" } else { " " };
            lines.push(Line::from(vec![
                Span::styled(
                    format!(" {:<name_w$}  ", f.name),
                    if selected { theme.key } else { theme.text },
                ),
                Span::styled(format!("{v:<12}"), value_style),
                Span::styled(cursor, theme.key),
                Span::styled(format!(" {}", f.help), theme.dim),
            ]));
            if let Some((ei, msg)) = &self.error
                && *ei == i
            {
                lines.push(Line::from(Span::styled(
                    format!("   ✗ {msg}"),
                    theme.input_error,
                )));
            }
        }
        lines.push(Line::default());
        lines.push(Line::from(vec![
            Span::styled(" ↑↓", theme.key),
            Span::styled(" field  ", theme.key_text),
            Span::styled("type", theme.key),
            Span::styled(" edit  ", theme.key_text),
            Span::styled("Enter", theme.key),
            Span::styled(" apply  ", theme.key_text),
            Span::styled("Esc", theme.key),
            Span::styled(" cancel", theme.key_text),
        ]));
        let height = (lines.len() as u16 + 2).min(area.height);
        let width = area.width.min(84);
        let rect = super::meter::centered(area, width, height);
        frame.render_widget(Clear, rect);
        frame.render_widget(
            Paragraph::new(lines).block(
                Block::bordered()
                    .border_type(BorderType::Rounded)
                    .border_style(theme.border_focus)
                    .title(Span::styled(" Sampler ", theme.title)),
            ),
            rect,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_accepts_valid_values_and_aliases() {
        let mut c = SamplerConfig::default();
        set(&mut c, "temp", "0.7").unwrap();
        set(&mut c, "top-k", "20").unwrap();
        set(&mut c, "n_predict", "-1").unwrap();
        set(&mut c, "seed", "42").unwrap();
        assert_eq!(c.temp, 0.7);
        assert_eq!(c.top_k, 20);
        assert_eq!(c.n_predict, -1);
        assert_eq!(c.seed, 42);
        assert_eq!((field("seed").unwrap().get)(&c), "42");
    }

    #[test]
    fn a_random_seed_reads_random() {
        let mut c = SamplerConfig::default();
        assert_eq!((field("seed").unwrap().get)(&c), "random");
        set(&mut c, "seed", "7").unwrap();
        set(&mut c, "seed", "random").unwrap();
        assert_eq!(c.seed, RANDOM_SEED);
        set(&mut c, "seed", "7").unwrap();
        set(&mut c, "seed", "-1").unwrap();
        assert_eq!(c.seed, RANDOM_SEED);
        assert!(
            set(&mut c, "seed", "sometimes")
                .unwrap_err()
                .contains("random, -1")
        );
    }

    #[test]
    fn set_rejects_out_of_range_values_naming_the_key() {
        let mut c = SamplerConfig::default();
        let before = c.clone();
        let e = set(&mut c, "temp", "-1").unwrap_err();
        assert!(e.starts_with("temp:") && e.contains("from 0 to 5"), "{e}");
        let e = set(&mut c, "top_p", "0").unwrap_err();
        assert!(e.contains("above 0"), "{e}");
        let e = set(&mut c, "n_predict", "-2").unwrap_err();
        assert!(e.contains("-1 (no limit) or a whole number from 0"), "{e}");
        let e = set(&mut c, "temp", "NaN").unwrap_err();
        assert!(e.contains("temp"), "{e}");
        let e = set(&mut c, "tmep", "1").unwrap_err();
        assert!(
            e.contains("unknown setting `tmep`") && e.contains("temp"),
            "{e}"
        );
        assert_eq!(c, before, "a failed set changes nothing");
    }

    #[test]
    fn form_round_trips_and_reports_the_bad_field() {
        let base = SamplerConfig::default();
        let mut form = SamplerForm::new(&base);
        assert_eq!(form.apply(&base), FormOutcome::Apply(base.clone()));
        form.selected = 2; // top_p
        form.clear_field();
        for c in "1.5".chars() {
            form.type_char(c);
        }
        assert_eq!(form.apply(&base), FormOutcome::Continue);
        assert_eq!(form.selected, 2);
        assert!(
            form.error
                .as_ref()
                .is_some_and(|(i, m)| *i == 2 && m.contains("at most 1"))
        );
        form.clear_field();
        form.type_char('0');
        form.type_char('.');
        form.type_char('5');
        let FormOutcome::Apply(c) = form.apply(&base) else {
            panic!("valid form rejected")
        };
        assert_eq!(c.top_p, 0.5);
    }
}
