//! `hipscope soak`: a long scripted conversation, headless, through the session code the chat
//! uses (`Session::chat`, context shift included), reporting per turn the time, the tokens
//! processed, resident memory, arena use and device allocations — the benchmark for "long chats
//! stay fast and flat" (issue 20). A table every `--every` turns and a summary; `--json` for all
//! of it.

use std::time::Instant;

use clap::Args;

use super::model_args::{ModelArgs, load_model};
use crate::app::stderr::errln;
use crate::model::loader::Loaded;
use crate::model::protocol::SamplerConfig;
use crate::model::session::{Control, Progress, Session};

#[derive(Args, Debug)]
pub struct SoakArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Turns of the conversation.
    #[arg(long, value_name = "N", default_value_t = 300)]
    pub turns: usize,
    /// A table row every this many turns.
    #[arg(long, value_name = "K", default_value_t = 25)]
    pub every: usize,
    /// Most tokens per answer.
    #[arg(
        short = 'n',
        long = "n-predict",
        value_name = "N",
        default_value_t = 24
    )]
    pub n_predict: i32,
    /// Percent of the turns after the system prompt dropped at once when the context fills
    /// (default 50, as the chat's `ctx_discard` setting).
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u8).range(1..=95))]
    pub discard: Option<u8>,
    /// The system prompt (kept through every shift).
    #[arg(
        long,
        value_name = "TEXT",
        default_value = "You are a concise assistant."
    )]
    pub system: String,
    /// Print every turn and the summary as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One turn's measurements.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Turn {
    pub turn: usize,
    pub ms: f64,
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the cache.
    pub cached_tokens: usize,
    /// Tokens run through the model: prompt tokens not cached, plus the generated ones.
    pub processed_tokens: usize,
    pub generated_tokens: usize,
    /// Tokens in the cache after the turn (the context's fill level).
    pub context_tokens: usize,
    /// Messages dropped before this turn (0: none).
    pub dropped_messages: usize,
    /// Whether the kept turns were shifted (true) or processed again (false) when dropped.
    pub shifted: bool,
    pub rss_bytes: Option<u64>,
    pub arena_used: u64,
    pub device_allocations: u64,
    pub runtime_overhead: Option<u64>,
}

/// The verdicts the issue asks for.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    pub turns: usize,
    pub n_ctx: usize,
    /// The first turn that dropped messages (the context was full), if any.
    pub first_full_turn: Option<usize>,
    pub median_ms_before_full: Option<f64>,
    pub median_ms_after_full: Option<f64>,
    pub shifts: usize,
    pub recomputes: usize,
    /// Over the last `rss_window` turns: (max − min) / min of resident memory.
    pub rss_window: usize,
    pub rss_spread: Option<f64>,
    pub arena_used_changes: usize,
    pub device_allocation_changes: usize,
}

/// Resident memory of this process (Linux: /proc/self/statm).
fn rss_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

/// The scripted user message of turn `i` (the measurement used the same).
pub fn script(i: usize) -> String {
    format!("Tell me one fact about the number {i}.")
}

/// Runs `turns` turns on `session`, calling `row` after each.
pub fn soak(
    session: &mut Session,
    turns: usize,
    row: &mut dyn FnMut(&Turn),
) -> anyhow::Result<Vec<Turn>> {
    let mut out = Vec::with_capacity(turns);
    for i in 1..=turns {
        let mut trim = None;
        let t0 = Instant::now();
        let answer = session.chat(&script(i), &mut |p| {
            if let Progress::Trimmed(t) = p {
                trim = Some(t.clone());
            }
            Control::Continue
        })?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let st = &answer.stats;
        let arena = session.model.backend().arena();
        let t = Turn {
            turn: i,
            ms,
            prompt_tokens: st.prompt_tokens,
            cached_tokens: st.cached_tokens,
            processed_tokens: st.prompt_tokens - st.cached_tokens + st.generated_tokens,
            generated_tokens: st.generated_tokens,
            context_tokens: session.cached_tokens(),
            dropped_messages: trim.as_ref().map_or(0, |t| t.messages),
            shifted: trim.as_ref().is_some_and(|t| t.recompute.is_none()),
            rss_bytes: rss_bytes(),
            arena_used: arena.used,
            device_allocations: arena.device_allocations,
            runtime_overhead: arena.runtime_overhead,
        };
        row(&t);
        out.push(t);
    }
    Ok(out)
}

pub fn summarize(turns: &[Turn], n_ctx: usize) -> Summary {
    let first_full = turns
        .iter()
        .find(|t| t.dropped_messages > 0)
        .map(|t| t.turn);
    let (before, after): (Vec<&Turn>, Vec<&Turn>) = turns
        .iter()
        .partition(|t| first_full.is_none_or(|f| t.turn < f));
    let window = turns.len().min(200);
    let last = &turns[turns.len() - window..];
    let rss: Vec<u64> = last.iter().filter_map(|t| t.rss_bytes).collect();
    let rss_spread = match (rss.iter().min(), rss.iter().max()) {
        (Some(&lo), Some(&hi)) if lo > 0 => Some((hi - lo) as f64 / lo as f64),
        _ => None,
    };
    let changes =
        |f: &dyn Fn(&Turn) -> u64| turns.windows(2).filter(|w| f(&w[0]) != f(&w[1])).count();
    Summary {
        turns: turns.len(),
        n_ctx,
        first_full_turn: first_full,
        median_ms_before_full: median(before.iter().map(|t| t.ms).collect()),
        median_ms_after_full: median(after.iter().map(|t| t.ms).collect()),
        shifts: turns.iter().filter(|t| t.shifted).count(),
        recomputes: turns
            .iter()
            .filter(|t| t.dropped_messages > 0 && !t.shifted)
            .count(),
        rss_window: window,
        rss_spread,
        arena_used_changes: changes(&|t| t.arena_used),
        device_allocation_changes: changes(&|t| t.device_allocations),
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

pub fn run(a: SoakArgs, settings: &crate::app::settings::Settings) -> anyhow::Result<i32> {
    anyhow::ensure!(a.turns > 0, "--turns must be at least 1");
    let sampler = SamplerConfig {
        n_predict: a.n_predict,
        ..SamplerConfig::default()
    };
    let mut loaded = load_model(&a.model, &settings.config, sampler)?;
    let r = run_loaded(&a, &mut loaded);
    super::model_args::finish(loaded.session.model_mut(), r)
}

fn run_loaded(a: &SoakArgs, loaded: &mut Loaded) -> anyhow::Result<i32> {
    let session = &mut loaded.session;
    session.set_system(&a.system);
    if let Some(p) = a.discard {
        session.set_discard(f32::from(p) / 100.0);
    }
    let n_ctx = session.model.n_ctx();
    let dev = session.model.backend().device();
    let every = a.every.max(1);
    if !a.json {
        errln!(
            "soak: {} turns of {:?}… on {} ({}), context {n_ctx}, answers of at most {} tokens, {}% dropped per shift",
            a.turns,
            script(1),
            loaded.summary.name,
            dev.backend,
            a.n_predict,
            (session.discard() * 100.0).round()
        );
        println!(
            "{:>9} {:>10} {:>10} {:>9} {:>8} {:>7} {:>9} {:>10} {:>7}",
            "turns",
            "ms/turn",
            "processed",
            "context",
            "dropped",
            "shifts",
            "RSS MiB",
            "arena MiB",
            "allocs"
        );
    }
    let mut window: Vec<Turn> = Vec::new();
    let json = a.json;
    let turns = soak(session, a.turns, &mut |t| {
        window.push(t.clone());
        if json || (t.turn % every != 0 && t.turn != a.turns) {
            return;
        }
        let ms = median(window.iter().map(|w| w.ms).collect()).unwrap_or(0.0);
        let processed =
            window.iter().map(|w| w.processed_tokens).sum::<usize>() as f64 / window.len() as f64;
        println!(
            "{:>9} {:>10.0} {:>10.0} {:>9} {:>8} {:>7} {:>9.1} {:>10.1} {:>7}",
            format!("{}-{}", window[0].turn, t.turn),
            ms,
            processed,
            t.context_tokens,
            window.iter().map(|w| w.dropped_messages).sum::<usize>(),
            window.iter().filter(|w| w.shifted).count(),
            t.rss_bytes.map_or(0.0, mib),
            mib(t.arena_used),
            t.device_allocations
        );
        window.clear();
    })?;
    let s = summarize(&turns, n_ctx);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "summary": s, "turns": turns }))?
        );
        return Ok(0);
    }
    let fmt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.0} ms"));
    println!(
        "\ncontext first full at turn {}; median per turn before: {}, after: {} ({}); {} shifts, {} recomputes",
        s.first_full_turn.map_or("-".into(), |t| t.to_string()),
        fmt(s.median_ms_before_full),
        fmt(s.median_ms_after_full),
        match (s.median_ms_before_full, s.median_ms_after_full) {
            (Some(b), Some(a)) if b > 0.0 => format!("{:.2}×", a / b),
            _ => "-".into(),
        },
        s.shifts,
        s.recomputes
    );
    println!(
        "resident memory over the last {} turns: spread {}; arena use changed {} times, device allocations {} times",
        s.rss_window,
        s.rss_spread
            .map_or("-".into(), |v| format!("{:.2}%", v * 100.0)),
        s.arena_used_changes,
        s.device_allocation_changes
    );
    Ok(0)
}
