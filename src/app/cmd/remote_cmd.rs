//! `generate --remote` and `top --remote`: the headless ends of the remote engine
//! (`model::remote`), with the endpoint picked by the same flags and config tables as the chat.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::usage::UsageError;
use crate::app::config::Config;
use crate::app::remote_config::RemoteArgs;
use crate::app::stderr::errln;
use crate::model::protocol::{SamplerConfig, StopReason};
use crate::model::remote::client::RemoteSpec;
use crate::model::remote::{self, panels};
use crate::model::session::{Control, Progress};

/// The endpoint the flags ask for, with the settings' `[remote]` tables.
pub fn spec(args: &RemoteArgs, c: &Config) -> anyhow::Result<RemoteSpec> {
    match args.resolve(&c.remote) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err(UsageError("--remote is missing".into()).into()),
        Err(e) => Err(UsageError(e).into()),
    }
}

/// What `generate --remote` asks.
pub struct Ask<'a> {
    pub prompt: &'a str,
    pub system: Option<&'a str>,
    pub sampler: SamplerConfig,
}

/// `hipscope generate --remote URL -p TEXT`: the prompt is sent as the user's message (with
/// `--system` before it); the answer streams to stdout, timings to stderr.
pub fn generate(remote: &RemoteArgs, config: &Config, a: Ask) -> anyhow::Result<i32> {
    let spec = spec(remote, config)?;
    let c =
        remote::connect(spec, a.sampler, Box::new(|_| {})).map_err(|e| anyhow::anyhow!("{e}"))?;
    errln!(
        "model: {} on {} (context {})",
        c.model.name,
        c.device.name,
        c.model.context_length
    );
    if c.device.reason.contains(remote::INSECURE_MARK) {
        errln!("warning: TLS certificate not verified (--insecure)");
    }
    let mut session = c.session;
    if let Some(sys) = a.system {
        session.set_system(sys);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register_conditional_shutdown(
        signal_hook::consts::SIGINT,
        130,
        stop.clone(),
    );
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone());
    let mut out = std::io::stdout().lock();
    let mut write_error: Option<std::io::Error> = None;
    let answer = session
        .chat(a.prompt, &mut |p| {
            if let Progress::Text(t) = p
                && write_error.is_none()
                && let Err(e) = out.write_all(t.as_bytes()).and_then(|()| out.flush())
            {
                write_error = Some(e);
            }
            if stop.load(Ordering::Relaxed) || write_error.is_some() {
                Control::Stop
            } else {
                Control::Continue
            }
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(e) = write_error {
        return Err(e.into());
    }
    writeln!(out)?;
    out.flush()?;
    let st = &answer.stats;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    errln!(
        "prompt: {} tokens ({} cached), {:.1} ms",
        st.prompt_tokens,
        st.cached_tokens,
        ms(st.prompt_time)
    );
    errln!(
        "generation: {} tokens, {:.1} ms, {:.1} tokens/s",
        st.generated_tokens,
        ms(st.gen_time),
        st.gen_tps()
    );
    errln!("time to first token: {:.1} ms", ms(st.time_to_first_token));
    errln!("stopped: {}", stop_text(&answer.reason));
    Ok(match answer.reason {
        StopReason::Dropped(_) => crate::app::exit_code::FAILED,
        _ => 0,
    })
}

/// Why an answer ended, for stderr (`generate`, local or remote).
pub fn stop_text(reason: &StopReason) -> String {
    match reason {
        StopReason::Eog => "end of text".to_string(),
        StopReason::StopString(s) => format!("stop string {s:?}"),
        StopReason::Limit => "token limit (-n)".into(),
        StopReason::User => "stopped by the user".into(),
        StopReason::ContextFull => "context full".into(),
        StopReason::Dropped(why) => format!("connection dropped: {why}"),
    }
}

/// How `top --remote` reports.
pub struct TopOutput {
    pub json: bool,
    pub once: bool,
    pub count: Option<u64>,
}

/// `hipscope top --remote URL`: the server's panels, full screen or as JSON lines.
pub fn top(
    remote: &RemoteArgs,
    config: &Config,
    args: TopOutput,
    every: Duration,
) -> anyhow::Result<i32> {
    let spec = spec(remote, config)?;
    let c = remote::connect(spec, SamplerConfig::default(), Box::new(|_| {}))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let client = c.session.client.clone();
    let kind = c.session.kind;
    if args.json || args.once {
        let mut out = std::io::stdout().lock();
        let mut n = 0u64;
        loop {
            let s = panels::sample(&client, kind, None);
            let line = if args.json {
                serde_json::to_string(&s)?
            } else {
                crate::ui::remote_top::text_report(&s)
            };
            if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                return Ok(0);
            }
            n += 1;
            if args.once || args.count.is_some_and(|c| n >= c) {
                return Ok(0);
            }
            std::thread::sleep(every);
        }
    }
    screen(client, kind, every)
}

/// The full screen: samples come from the poller thread, so that a slow server never holds
/// up a key press; `q`, Esc or Ctrl-C quits at once.
fn screen(
    client: remote::client::Client,
    kind: remote::openai::ServerKind,
    every: Duration,
) -> anyhow::Result<i32> {
    use crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};
    let (tx, rx) = std::sync::mpsc::channel();
    let (_stop, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("hipscope-remote-panels".into())
        .spawn(move || panels::poll(client, kind, None, every, stop_rx, |s| tx.send(s).is_ok()))?;
    let guard = crate::app::terminal::TerminalGuard::enter(false)?;
    // Through the guard's writer, as `top` draws (src/app/cmd/top.rs says why).
    let mut terminal =
        ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(guard.output()))?;
    let theme = crate::ui::theme::Theme::new(
        if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
            crate::ui::theme::ThemeName::Mono
        } else {
            crate::ui::theme::ThemeName::Dark
        },
    );
    let mut view = crate::ui::remote_top::RemoteTopView::default();
    terminal.draw(|f| view.render(f, f.area(), &theme))?;
    loop {
        let mut changed = false;
        while let Ok(s) = rx.try_recv() {
            view.apply(s);
            changed = true;
        }
        if changed {
            terminal.draw(|f| view.render(f, f.area(), &theme))?;
        }
        if event::poll(Duration::from_millis(50))? {
            match event::read()? {
                TermEvent::Key(k) if k.kind == KeyEventKind::Press => {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                        return Ok(0);
                    }
                }
                TermEvent::Resize(..) => {
                    terminal.draw(|f| view.render(f, f.area(), &theme))?;
                }
                _ => {}
            }
        }
    }
}
