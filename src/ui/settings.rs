//! How the view starts ([`Settings`], from the config file and the command line) and the
//! layout limits of the diagnostics column.

use std::path::PathBuf;

use crate::model::protocol::{QuitConfig, SamplerConfig};

use super::theme::ThemeName;

/// Which diagnostics panels are shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Panels {
    pub streams: bool,
    pub arena: bool,
    pub watchdog: bool,
    pub gpu: bool,
}

/// One of the diagnostics panels, in the order the column shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanelId {
    Streams,
    Arena,
    Watchdog,
    Gpu,
}

impl PanelId {
    pub const ALL: [PanelId; 4] = [
        PanelId::Streams,
        PanelId::Arena,
        PanelId::Watchdog,
        PanelId::Gpu,
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

impl Panels {
    pub fn shown(&self, id: PanelId) -> bool {
        match id {
            PanelId::Streams => self.streams,
            PanelId::Arena => self.arena,
            PanelId::Watchdog => self.watchdog,
            PanelId::Gpu => self.gpu,
        }
    }

    /// The shown panels, top to bottom.
    pub fn visible(&self) -> Vec<PanelId> {
        PanelId::ALL
            .into_iter()
            .filter(|&p| self.shown(p))
            .collect()
    }
}

impl Default for Panels {
    fn default() -> Self {
        Panels {
            streams: true,
            arena: true,
            watchdog: true,
            gpu: true,
        }
    }
}

/// How the view starts (from the config file and the command line).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub theme: ThemeName,
    /// `None`: show the diagnostics column when the terminal is at least
    /// [`AUTO_SIDEBAR_MIN_WIDTH`] columns wide.
    pub sidebar: Option<bool>,
    pub sidebar_width: u16,
    pub panels: Panels,
    pub sampler: SamplerConfig,
    pub system_prompt: String,
    /// What to call the model until the worker says what it loaded.
    pub model_label: String,
    /// The quit's time limits (sent with `Command::Quit`, shown while quitting).
    pub quit: QuitConfig,
    /// Messages sent before (for ↑).
    pub history: Vec<String>,
    /// Where the log goes, named in error messages.
    pub log_path: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            theme: ThemeName::Dark,
            sidebar: None,
            sidebar_width: 44,
            panels: Panels::default(),
            sampler: SamplerConfig::default(),
            system_prompt: String::new(),
            model_label: String::new(),
            quit: QuitConfig::default(),
            history: Vec::new(),
            log_path: None,
        }
    }
}

pub const AUTO_SIDEBAR_MIN_WIDTH: u16 = 120;
/// Rows a panel grows or shrinks by per key press (Alt-+ / Alt--).
pub const PANEL_STEP: i16 = 2;
/// How far a panel's height may move from what its content wants.
pub const PANEL_EXTRA_MIN: i16 = -40;
pub const PANEL_EXTRA_MAX: i16 = 60;
pub const SIDEBAR_MIN: u16 = 28;
pub const SIDEBAR_MAX: u16 = 100;
