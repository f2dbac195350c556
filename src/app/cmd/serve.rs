//! `hipscope serve`: the model behind an OpenAI-compatible endpoint (`app/serve/`), its requests
//! batched continuously over `--parallel` slots (`model/scheduler.rs`). With a terminal it opens
//! the Requests view beside the device panels (`ui/serve_screen.rs`); without one, or with
//! `--headless`, it writes one line per request on stderr.
//!
//! Safe by default: it binds 127.0.0.1; any other address needs `--api-key-file` (refused at
//! start otherwise, exit 2). SIGTERM, SIGINT and `q` stop intake, let the requests in flight
//! finish within half the quit's drain deadline (the rest are told the server is shutting down),
//! then shut the device down as every command does.

use crate::app::stderr::errln;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use tokio::sync::watch;

use super::model_args::{ModelArgs, cpu_options, finish, load_on, open_backend_with, open_model};
use super::usage::UsageError;
use crate::app::quit::{QuitConfig, QuitCoordinator};
use crate::app::serve::{self, AppState, HangNote, ServerConfig};
use crate::app::{exit_code, serve_view};
use crate::gpu::snapshot::WatchdogSnapshot;
use crate::gpu::watchdog::WatchEvent;
use crate::model::loader::{self, LoadOptions};
use crate::model::reasoning::ReasoningFormat;
use crate::model::scheduler::{self, SchedulerConfig};
use crate::model::session::Session;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// GGUF model file (as -m).
    #[arg(value_name = "MODEL", conflicts_with_all = ["model", "synthetic"])]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on. Anything but a loopback address needs --api-key-file.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Slots: requests generating at once, batched together at every step; the context (-c) is
    /// shared among them, as llama-server's -np shares it.
    #[arg(long, short = 'P', value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
    /// File whose first line is the API key clients must send (Authorization: Bearer KEY).
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// No full-screen view: one line per request on stderr, even with a terminal.
    #[arg(long)]
    pub headless: bool,
    /// Requests waiting for a slot beyond which new ones get 503 (default: 4 per slot).
    #[arg(long, value_name = "N")]
    pub max_queue: Option<usize>,
    /// Seconds a request may take, queue included (then it ends as `length`).
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub timeout: u64,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Name the model is served as (default: the file's stem).
    #[arg(long, value_name = "NAME")]
    pub alias: Option<String>,
    /// Log each request's prompt text in the log file (off: lengths and timings only).
    #[arg(long)]
    pub log_prompts: bool,
}

/// Prompt tokens a step takes while other slots generate (a new prompt never holds the others
/// for more than about this many tokens' work).
const PREFILL_CHUNK: usize = 256;

pub fn run(mut a: ServeArgs, settings: &crate::app::settings::Settings) -> anyhow::Result<i32> {
    let config = &settings.config;
    if let Some(f) = a.file.take() {
        a.model.model = Some(f);
    }
    let key = match &a.api_key_file {
        Some(p) => Some(serve::ApiKey::read(p).map_err(UsageError)?),
        None => None,
    };
    if key.is_none() && !serve::is_loopback(&a.host) {
        return Err(UsageError(format!(
            "--host {} is reachable from other machines: give --api-key-file FILE (a key of at \
             least {} characters) or serve on 127.0.0.1",
            a.host,
            serve::auth::MIN_KEY_BYTES
        ))
        .into());
    }
    let n_slots = usize::from(a.parallel);
    let coordinator = QuitCoordinator::new(QuitConfig::default());
    {
        let q = coordinator.clone();
        crate::app::signals::listen(move |name| q.signal(name))
            .context("installing the signal handlers")?;
    }

    // The watchdog's reports: the latest snapshot for the view, and a hang for the requests.
    let (dog_tx, dog_rx) = watch::channel::<Option<WatchdogSnapshot>>(None);
    let (hang_tx, hang_rx) = watch::channel::<Option<HangNote>>(None);
    let (hung_ops_tx, hung_ops_rx) = std::sync::mpsc::channel::<(String, Option<String>)>();
    let sink = Box::new(move |ev: WatchEvent| match ev {
        WatchEvent::Snapshot(s) => {
            dog_tx.send_replace(Some(s));
        }
        WatchEvent::Hung { snapshot, .. } => {
            let report = snapshot.report.as_ref().map(|p| p.display().to_string());
            let op = snapshot.op.clone().unwrap_or_else(|| "an op".into());
            dog_tx.send_replace(Some(snapshot));
            let _ = hung_ops_tx.send((op, report));
        }
    });
    let file = open_model(&a.model, config)?;
    let backend = open_backend_with(&a.model, config, Some(loader::kernel_needs(&file)), sink)?;
    let path = file.path().display().to_string();
    // Each slot holds its share of the context, as llama-server's -c with -np: of -c, else of
    // the model's trained context (at most 4096), at least 256 positions a slot.
    let trained = crate::model::config::ModelConfig::from_gguf(&file)
        .map(|c| c.train_ctx)
        .unwrap_or(4096);
    let per_slot = match a.model.ctx_size {
        Some(0) => Some(0),
        Some(c) => Some((c / n_slots).max(8)),
        None => Some((trained.clamp(8, 4096) / n_slots).max(256)),
    };
    let opts = LoadOptions {
        n_ctx: per_slot,
        n_batch: a.model.batch_size.max(n_slots),
        gpu_layers: a.model.n_gpu_layers.unwrap_or(config.n_gpu_layers),
        cpu: cpu_options(&a.model, config),
        n_seq: n_slots,
        ..super::model_args::split_load_options(
            &a.model,
            config,
            Some(loader::kernel_needs(&file)),
        )?
    };
    let loaded = load_on(&a.model, file, backend, &opts)?;
    let summary = loaded.summary.clone();
    let Session {
        model,
        tokenizer,
        template,
        ..
    } = loaded.session;
    let n_ctx = model.n_ctx();
    let device = model.backend().device();
    let monitor = model.backend().monitor();
    let reasoning = ReasoningFormat::of(&template, &tokenizer);
    let tok = Arc::new(tokenizer);
    let (sched, engine) = scheduler::spawn(
        model,
        tok.clone(),
        SchedulerConfig {
            n_slots,
            max_queue: a.max_queue.unwrap_or(4 * n_slots),
            prefill_chunk: PREFILL_CHUNK,
        },
    )
    .context("starting the engine thread")?;
    // A hang names the requests of the step that was running.
    {
        let snap = sched.snapshot();
        std::thread::Builder::new()
            .name("hipscope-serve-hangs".into())
            .spawn(move || {
                for (op, report) in hung_ops_rx {
                    let requests = snap.borrow().in_step.clone();
                    tracing::error!("serve: HUNG: {op}; requests in that step: {requests:?}");
                    hang_tx.send_replace(Some(HangNote {
                        op,
                        requests,
                        report,
                    }));
                }
            })
            .context("starting the hang thread")?;
    }
    let view = !a.headless && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    let name = a.alias.clone().unwrap_or_else(|| summary.name.clone());
    let cfg = ServerConfig {
        model_name: name.clone(),
        model_path: path,
        key,
        body_limit: a.max_body,
        read_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(a.timeout.max(1)),
        n_ctx,
        n_slots,
        max_tokens: n_ctx,
        log_prompts: a.log_prompts,
        log_lines: !view,
    };
    let state = Arc::new(AppState {
        cfg,
        sched: sched.clone(),
        tok,
        template: Arc::new(template),
        reasoning,
        next_id: AtomicU64::new(0),
        hang: hang_rx,
        watchdog: dog_rx,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    {
        let stop = stop_tx.clone();
        coordinator.set_interrupt_handler(move |_| {
            stop.send_replace(true);
        });
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let quit = coordinator.config();
    let served = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("listening on {}:{}", a.host, a.port))?;
        let addr = listener.local_addr().ok();
        let url = match addr {
            Some(ad) => format!("http://{ad}"),
            None => format!("http://{}:{}", a.host, a.port),
        };
        let line = format!(
            "serving {name} on {url} ({n_slots} slots of {n_ctx} tokens; {}; OpenAI API at {url}/v1)",
            device.name
        );
        errln!("{line}");
        tracing::info!("serve: {line}");
        let server = tokio::spawn(serve::serve(
            listener,
            state.clone(),
            stop_rx.clone(),
            quit.drain_deadline / 2,
        ));
        // The drain runs beside the view, which shows it until the slots are empty.
        let drain = async {
            let mut stop = stop_rx.clone();
            let _ = stop.wait_for(|s| *s).await;
            coordinator.begin();
            if !view {
                errln!("stopping: no new requests; waiting for {} in flight", sched.pending());
            }
            sched.drain();
            let t = Instant::now();
            while sched.pending() > 0 && t.elapsed() < quit.drain_deadline / 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if sched.pending() > 0 {
                sched.abort();
            }
            let _ = tokio::time::timeout(quit.drain_deadline / 2, server).await;
        };
        if view {
            let ui = serve_view::Inputs {
                snapshot: sched.snapshot(),
                watchdog: state.watchdog.clone(),
                monitor: monitor.clone(),
                hang: state.hang.clone(),
                device: device.clone(),
                title: line.clone(),
                quit: coordinator.clone(),
                drain_deadline: quit.drain_deadline,
            };
            tokio::join!(serve_view::run(ui, stop_tx.clone(), stop_rx.clone()), drain);
        } else {
            drain.await;
        }
        anyhow::Ok(())
    });
    drop(state);
    // Whatever ended the serving (a failed bind too), the engine stops before it is joined.
    sched.abort();
    let mut model = match engine.join() {
        Ok(m) => m,
        Err(_) => anyhow::bail!("the engine thread panicked (the log says why)"),
    };
    let code = finish(&mut model, served.map(|()| exit_code::OK))?;
    Ok(coordinator.finish(code, None))
}
