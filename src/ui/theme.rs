//! Colours and text styles, in one place so that a light terminal, a dark one and `NO_COLOR`
//! (https://no-color.org) each get a readable screen.

use ratatui::style::{Color, Modifier, Style};

/// Which palette to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ThemeName {
    #[default]
    Dark,
    Light,
    /// No colours at all: emphasis through bold, reverse and underline only.
    Mono,
}

impl ThemeName {
    pub const ALL: [(&'static str, ThemeName); 3] = [
        ("dark", ThemeName::Dark),
        ("light", ThemeName::Light),
        ("mono", ThemeName::Mono),
    ];

    pub fn parse(s: &str) -> Option<ThemeName> {
        Self::ALL
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
            .map(|(_, t)| *t)
    }
}

/// Every style the renders use.
#[derive(Clone, Debug, PartialEq)]
pub struct Theme {
    pub text: Style,
    pub dim: Style,
    pub border: Style,
    pub border_focus: Style,
    pub title: Style,
    pub header: Style,
    pub user_label: Style,
    pub assistant_label: Style,
    pub user_text: Style,
    pub notice: Style,
    pub error: Style,
    pub heading: Style,
    pub code_block: Style,
    pub code_label: Style,
    pub inline_code: Style,
    pub link: Style,
    pub quote: Style,
    pub bullet: Style,
    pub stats: Style,
    pub ok: Style,
    pub slow: Style,
    pub hung: Style,
    pub hung_banner: Style,
    pub gauge: Style,
    pub gauge_warn: Style,
    pub sparkline: Style,
    pub key: Style,
    pub key_text: Style,
    pub selected: Style,
    pub input_error: Style,
}

impl Theme {
    pub fn new(name: ThemeName) -> Theme {
        match name {
            ThemeName::Dark => Theme::palette(Palette {
                accent: Color::Cyan,
                user: Color::LightBlue,
                assistant: Color::LightGreen,
                dim: Color::DarkGray,
                code_bg: Color::Indexed(236),
                code_fg: Color::Indexed(252),
                inline_bg: Color::Indexed(238),
                text: Color::Reset,
            }),
            ThemeName::Light => Theme::palette(Palette {
                accent: Color::Blue,
                user: Color::Blue,
                assistant: Color::Green,
                dim: Color::Gray,
                code_bg: Color::Indexed(254),
                code_fg: Color::Indexed(235),
                inline_bg: Color::Indexed(252),
                text: Color::Reset,
            }),
            ThemeName::Mono => Theme::mono(),
        }
    }

    fn palette(p: Palette) -> Theme {
        let bold = Modifier::BOLD;
        Theme {
            text: Style::new().fg(p.text),
            dim: Style::new().fg(p.dim),
            border: Style::new().fg(p.dim),
            border_focus: Style::new().fg(p.accent),
            title: Style::new().fg(p.accent).add_modifier(bold),
            header: Style::new().add_modifier(Modifier::REVERSED),
            user_label: Style::new().fg(p.user).add_modifier(bold),
            assistant_label: Style::new().fg(p.assistant).add_modifier(bold),
            user_text: Style::new().fg(p.text),
            notice: Style::new().fg(Color::Yellow),
            error: Style::new().fg(Color::Red).add_modifier(bold),
            heading: Style::new().fg(p.accent).add_modifier(bold),
            code_block: Style::new().fg(p.code_fg).bg(p.code_bg),
            code_label: Style::new().fg(p.dim).bg(p.code_bg),
            inline_code: Style::new().fg(Color::Yellow).bg(p.inline_bg),
            link: Style::new().fg(p.accent).add_modifier(Modifier::UNDERLINED),
            quote: Style::new().fg(p.dim).add_modifier(Modifier::ITALIC),
            bullet: Style::new().fg(p.accent),
            stats: Style::new().fg(p.dim),
            ok: Style::new().fg(Color::Green).add_modifier(bold),
            slow: Style::new().fg(Color::Yellow).add_modifier(bold),
            hung: Style::new().fg(Color::Red).add_modifier(bold),
            hung_banner: Style::new()
                .fg(Color::White)
                .bg(Color::Red)
                .add_modifier(bold),
            gauge: Style::new().fg(Color::Green),
            gauge_warn: Style::new().fg(Color::Yellow),
            sparkline: Style::new().fg(p.accent),
            key: Style::new().fg(p.accent).add_modifier(bold),
            key_text: Style::new().fg(p.dim),
            selected: Style::new().add_modifier(Modifier::REVERSED),
            input_error: Style::new().fg(Color::Red),
        }
    }

    fn mono() -> Theme {
        let plain = Style::new();
        let bold = Style::new().add_modifier(Modifier::BOLD);
        let rev = Style::new().add_modifier(Modifier::REVERSED);
        Theme {
            text: plain,
            dim: Style::new().add_modifier(Modifier::DIM),
            border: plain,
            border_focus: bold,
            title: bold,
            header: rev,
            user_label: bold,
            assistant_label: bold,
            user_text: plain,
            notice: Style::new().add_modifier(Modifier::ITALIC),
            error: bold,
            heading: Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
            code_block: plain,
            code_label: Style::new().add_modifier(Modifier::DIM),
            inline_code: bold,
            link: Style::new().add_modifier(Modifier::UNDERLINED),
            quote: Style::new().add_modifier(Modifier::ITALIC),
            bullet: plain,
            stats: Style::new().add_modifier(Modifier::DIM),
            ok: bold,
            slow: bold,
            hung: Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED),
            hung_banner: rev,
            gauge: plain,
            gauge_warn: bold,
            sparkline: plain,
            key: bold,
            key_text: plain,
            selected: rev,
            input_error: bold,
        }
    }
}

impl Default for Theme {
    fn default() -> Self {
        Theme::new(ThemeName::Dark)
    }
}

struct Palette {
    accent: Color,
    user: Color,
    assistant: Color,
    dim: Color,
    code_bg: Color,
    code_fg: Color,
    inline_bg: Color,
    text: Color,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn theme_names_parse_case_insensitively() {
        assert_eq!(ThemeName::parse("Dark"), Some(ThemeName::Dark));
        assert_eq!(ThemeName::parse("mono"), Some(ThemeName::Mono));
        assert_eq!(ThemeName::parse("solarized"), None);
    }

    #[test]
    fn mono_uses_no_colour() {
        let t = Theme::new(ThemeName::Mono);
        for s in [t.text, t.error, t.hung_banner, t.code_block, t.inline_code] {
            assert_eq!(s.fg, None);
            assert_eq!(s.bg, None);
        }
    }
}
