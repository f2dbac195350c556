//! `hipscope top`: GPU and host telemetry without loading a model. Full screen (every GPU, the
//! processes using them, `q` quits), or `--json` (one object per sample per line), or `--once`
//! (one sample, then exit). Without a terminal it prints one sample as `--once` does. With no
//! GPU, every sample's notes carry the doctor's verdict line (what runs, the next step per
//! vendor), so the screen, the text and the JSON all say it.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};

use crate::app::settings::Settings;
use crate::app::stderr::errln;
use crate::gpu::telemetry::{self, Roots, Sampler, TelemetrySample};
use crate::ui::theme::{Theme, ThemeName};
use crate::ui::top::TopView;

#[derive(Args, Debug, Clone)]
pub struct TopArgs {
    /// Write one JSON object per sample per line instead of drawing the screen.
    #[arg(long)]
    pub json: bool,
    /// Take one sample, print it and exit (as JSON with --json, else as text).
    #[arg(long)]
    pub once: bool,
    /// Time between samples in ms (default: `[telemetry] interval_ms` of config.toml).
    #[arg(long, value_name = "MS")]
    pub interval_ms: Option<u64>,
    /// Stop after this many samples (with --json).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    #[command(flatten)]
    pub roots: RootArgs,
    #[command(flatten)]
    pub remote: crate::app::remote_config::RemoteArgs,
}

/// Where the kernel's files are read from: a tree captured by `hipscope doctor --capture`
/// replays through the same code.
#[derive(Args, Debug, Clone, Default)]
pub struct RootArgs {
    /// Read sysfs from here instead of /sys.
    #[arg(long, value_name = "DIR", env = "HIPSCOPE_SYSFS_ROOT")]
    pub sysfs_root: Option<PathBuf>,
    /// Read procfs from here instead of /proc.
    #[arg(long, value_name = "DIR", env = "HIPSCOPE_PROCFS_ROOT")]
    pub procfs_root: Option<PathBuf>,
}

impl RootArgs {
    pub fn roots(&self) -> Roots {
        let mut r = Roots::from_env();
        if let Some(s) = &self.sysfs_root {
            r.sys = s.clone();
        }
        if let Some(p) = &self.procfs_root {
            r.proc = p.clone();
        }
        r
    }
}

pub fn run(args: TopArgs, settings: &Settings) -> anyhow::Result<i32> {
    let every = telemetry::interval(
        args.interval_ms
            .unwrap_or(settings.config.telemetry.interval_ms),
    );
    if args.remote.remote.is_some() {
        let out = super::remote_cmd::TopOutput {
            json: args.json,
            once: args.once,
            count: args.count,
        };
        return super::remote_cmd::top(&args.remote, &settings.config, out, every);
    }
    let roots = args.roots.roots();
    let mut sampler = Samples {
        sampler: Sampler::new(&roots),
        roots,
        no_gpu: None,
    };
    let terminal = terminal_here();
    if args.once || (!args.json && terminal.is_err()) {
        if let (false, Err(why)) = (args.once, &terminal) {
            errln!(
                "hipscope top: {why}: one sample follows, as `top --once` prints it (`top --json` \
                 streams samples; in a terminal, `hipscope top` draws the screen)"
            );
        }
        // CPU use is a rate: two readings, one interval apart (at most a second).
        let _ = sampler.sample();
        std::thread::sleep(every.min(Duration::from_secs(1)));
        let s = sampler.sample();
        if args.json {
            println!("{}", serde_json::to_string(&s)?);
        } else {
            print!("{}", text_report(&s));
        }
        return Ok(0);
    }
    if args.json {
        let mut out = std::io::stdout().lock();
        let mut n = 0u64;
        loop {
            let s = sampler.sample();
            if writeln!(out, "{}", serde_json::to_string(&s)?)
                .and_then(|_| out.flush())
                .is_err()
            {
                // The reader went away (`| head`): not an error.
                return Ok(0);
            }
            n += 1;
            if args.count.is_some_and(|c| n >= c) {
                return Ok(0);
            }
            std::thread::sleep(every);
        }
    }
    screen(sampler, every)
}

/// The sampler, with the verdict line added to the notes of a sample that has no GPU (worked
/// out once: it loads the runtime libraries to see which are missing).
struct Samples {
    sampler: Sampler,
    roots: Roots,
    no_gpu: Option<String>,
}

impl Samples {
    fn sample(&mut self) -> TelemetrySample {
        let mut s = self.sampler.sample();
        if s.gpus.is_empty() {
            let roots = &self.roots;
            let line = self.no_gpu.get_or_insert_with(|| {
                let f = crate::gpu::doctor::facts::runtimes(roots);
                crate::gpu::doctor::verdict::cpu_only(&f, crate::gpu::doctor::verdict::NO_GPU)
                    .summary
            });
            s.notes.insert(0, line.clone());
        }
        s
    }
}

/// Whether the full screen can be drawn here: stdout is a terminal, and so is stdin or the
/// process's controlling terminal (keys are read from it). `Err` says what is missing.
fn terminal_here() -> Result<(), &'static str> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return Err("stdout is not a terminal");
    }
    if !std::io::stdin().is_terminal() && std::fs::File::open("/dev/tty").is_err() {
        return Err("no terminal to read keys from (stdin is not one, and there is no /dev/tty)");
    }
    Ok(())
}

/// The full screen: samples on this thread between key polls (a sample is a few small file
/// reads, well under the interval).
fn screen(mut sampler: Samples, every: Duration) -> anyhow::Result<i32> {
    let guard = crate::app::terminal::TerminalGuard::enter(false)?;
    // Through the guard's writer, behind the alternate screen it queued (a frame written to
    // stdout directly could reach the terminal first and be wiped by the switch), and never
    // blocking on a terminal that stops reading.
    let backend = ratatui::backend::CrosstermBackend::new(guard.output());
    let mut terminal = ratatui::Terminal::new(backend)?;
    let theme = Theme::new(
        if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
            ThemeName::Mono
        } else {
            ThemeName::Dark
        },
    );
    let mut view = TopView::default();
    let mut next = std::time::Instant::now();
    loop {
        if std::time::Instant::now() >= next {
            view.apply(sampler.sample());
            next = std::time::Instant::now() + every;
            terminal.draw(|f| view.render(f, f.area(), &theme))?;
        }
        let wait = next.saturating_duration_since(std::time::Instant::now());
        if event::poll(wait)? {
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

/// `--once` without `--json`: the same readings as plain lines.
pub fn text_report(s: &TelemetrySample) -> String {
    use crate::ui::units::bytes;
    let mut o = String::new();
    let h = &s.host;
    o.push_str("host");
    if let Some(c) = h.cpu_pct {
        o.push_str(&format!("  cpu {c:.0}%"));
    }
    if let (Some(u), Some(t)) = (h.mem_used, h.mem_total) {
        o.push_str(&format!("  memory {} / {}", bytes(u), bytes(t)));
    }
    o.push('\n');
    for g in &s.gpus {
        let mut parts = vec![format!("{} {}", g.id, g.name)];
        if let Some(a) = &g.arch {
            parts.push(a.clone());
        }
        if let Some(u) = g.gpu_util_pct {
            parts.push(format!("util {u:.0}%"));
        }
        if let Some((n, u, t)) = g.headline_memory() {
            parts.push(format!("{n} {} / {}", bytes(u), bytes(t)));
        }
        if let Some(t) = g.temp_edge_c {
            parts.push(format!("{t:.0} °C"));
        }
        if let Some(p) = g.power_w {
            parts.push(format!("{p:.0} W"));
        }
        o.push_str(&parts.join("  "));
        o.push('\n');
    }
    for p in &s.processes {
        o.push_str(&format!(
            "  pid {} {} on {} vram {} gtt {}\n",
            p.pid,
            p.name,
            p.gpu,
            p.vram.map(bytes).unwrap_or_else(|| "-".into()),
            p.gtt.map(bytes).unwrap_or_else(|| "-".into())
        ));
    }
    for n in &s.notes {
        o.push_str(&format!("note: {n}\n"));
    }
    o
}
