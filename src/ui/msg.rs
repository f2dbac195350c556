//! The messages that change the view ([`Msg`]) and what the app layer must do after an update
//! ([`Effect`]): the two ends of `App::update`.

use std::path::PathBuf;
use std::time::Duration;

use crossterm::event::{Event as TermEvent, KeyEvent, MouseEvent};

use crate::gpu::snapshot::HostSample;
use crate::gpu::trace::ProfileSnapshot;
use crate::model::protocol::{Command, Event, SamplerConfig};

use super::picker::ModelEntry;

/// Everything that can change the view.
// Worker events are the bulk of messages and are moved once, straight into `update`: boxing
// them would add an allocation per token for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    Key(KeyEvent),
    Mouse(MouseEvent),
    Paste(String),
    Resize(u16, u16),
    /// An event from the inference worker.
    Worker(Event),
    /// The worker's event channel closed.
    WorkerGone,
    /// The clock: time since the app started.
    Tick(Duration),
    /// The host's CPU use and memory on their own (the telemetry sampler sends them inside
    /// `Event::Telemetry`; this path is left for tests and is to be folded into it).
    Host(HostSample),
    /// Model discovery finished: the files found and the folders searched.
    Models {
        entries: Vec<ModelEntry>,
        searched: Vec<String>,
    },
    /// The paths that start with `typed` (folders end with `/`), for Tab completion.
    Paths {
        typed: String,
        names: Vec<String>,
    },
    /// A `/save` export finished.
    Saved(Result<PathBuf, String>),
    /// SIGTERM or SIGHUP: quit as if the user asked; a second one leaves at once.
    Terminate(&'static str),
    /// Something the app layer wants the user to know (a transcript that cannot be written).
    Notice {
        text: String,
        error: bool,
    },
    /// The profile as it stands (while the Profile panel is shown).
    Profile(ProfileSnapshot),
    /// The timeline file now written (`None`: none), after `/trace` or `--trace`.
    Tracing(Option<PathBuf>),
}

impl Msg {
    /// Maps a terminal event; `None` for events the view ignores (focus changes).
    pub fn from_terminal(e: TermEvent) -> Option<Msg> {
        match e {
            TermEvent::Key(k) => Some(Msg::Key(k)),
            TermEvent::Mouse(m) => Some(Msg::Mouse(m)),
            TermEvent::Paste(s) => Some(Msg::Paste(s)),
            TermEvent::Resize(w, h) => Some(Msg::Resize(w, h)),
            TermEvent::FocusGained | TermEvent::FocusLost => None,
        }
    }
}

/// What the app layer must do after an update.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Send a command to the worker.
    Send(Command),
    /// Put text on the clipboard (OSC 52); `what` says what it is, for the log.
    Copy { text: String, what: String },
    /// Export the conversation as Markdown (to this path, or a fresh one in the data folder).
    Export {
        path: Option<PathBuf>,
        /// `/save!`: an existing regular file may be replaced.
        overwrite: bool,
    },
    /// Write these sampler settings into the config file as the defaults (`/set save`).
    KeepSettings(SamplerConfig),
    /// Look for model files (answered with [`Msg::Models`]).
    Discover,
    /// List the paths that start with this text (Tab after `/model` or `/save`), answered
    /// with [`Msg::Paths`].
    ListPaths(String),
    /// Leave now: restore the terminal, flush, hard exit (second Ctrl-C during a quit).
    ForceExit,
    /// Start or stop collecting: the profile (the Profile panel shown or hidden) or the
    /// timeline file (`/trace on|off`); answered with [`Msg::Tracing`] and notices.
    Trace(TraceRequest),
}

/// What [`Effect::Trace`] asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceRequest {
    Profile(bool),
    /// `/trace on [FILE]` (no file: a fresh one beside `/save`'s exports).
    FileOn(Option<PathBuf>),
    FileOff,
}
