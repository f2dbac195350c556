//! Shared fixtures for the UI tests: realistic device data (an RX 7900 XTX, gfx1100, running
//! SmolLM2-135M), helpers that drive the real `App::update` path, and a renderer into
//! ratatui's `TestBackend`.
#![allow(dead_code)]

pub mod fake_worker;

use std::path::PathBuf;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEvent, MouseEventKind};
use hipscope::gpu::snapshot::{
    ArenaSnapshot, DeviceSummary, HostSample, QuitStep, QuitStepStatus, RegionSnapshot,
    StreamSnapshot, TelemetrySample, WatchState, WatchdogSnapshot,
};
use hipscope::model::protocol::{Command, Event, GenStats, ModelSummary, StopReason};
use hipscope::ui::{App, Effect, Msg, Settings};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

pub const MIB: u64 = 1024 * 1024;
pub const GIB: u64 = 1024 * MIB;

pub fn settings() -> Settings {
    Settings {
        model_label: "SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        log_path: Some("/home/ada/.local/state/hipscope/hipscope.log".into()),
        ..Settings::default()
    }
}

pub fn smollm2() -> ModelSummary {
    ModelSummary {
        name: "SmolLM2-135M-Instruct".into(),
        path: Some("/home/ada/.cache/hipscope/models/SmolLM2-135M-Instruct.Q4_1.gguf".into()),
        architecture: "llama".into(),
        quant: "Q4_1".into(),
        parameters: 134_515_008,
        file_bytes: 98_362_432,
        context_length: 8192,
        n_layers: 30,
        load_time: Duration::from_millis(412),
    }
}

/// An RX 7900 XTX as HIP reports it (24 GiB VRAM, 96 CUs, wave32).
pub fn rx7900xtx() -> DeviceSummary {
    DeviceSummary {
        backend: "hip".into(),
        name: "AMD Radeon RX 7900 XTX".into(),
        arch: "gfx1100".into(),
        total_memory: Some(24 * GIB),
        free_memory: Some(24 * GIB - 812 * MIB),
        compute_units: Some(96),
        warp_size: Some(32),
        reason: "auto: libamdhip64.so.6 (ROCm 6.4.1), device 0".into(),
        graphs: None,
        launch_overlap: None,
    }
}

pub fn cpu_device() -> DeviceSummary {
    DeviceSummary {
        backend: "cpu".into(),
        name: "AMD Ryzen 9 7950X 16-Core Processor".into(),
        arch: "x86_64 avx2 fma f16c".into(),
        total_memory: Some(64 * GIB),
        free_memory: None,
        compute_units: Some(16),
        warp_size: None,
        reason: "--backend cpu".into(),
        graphs: None,
        launch_overlap: None,
    }
}

pub fn stream(depth: u32, completed: u64, layer: u32) -> StreamSnapshot {
    StreamSnapshot {
        name: "hip:0 stream 0".into(),
        queue_depth: depth,
        enqueued: completed + u64::from(depth),
        completed,
        in_flight: Some((
            format!("layer {layer} / ffn_down / matvec_q4_1"),
            Duration::from_micros(180),
        )),
        last_completed: Some(format!("layer {layer} / ffn_up / matvec_q4_1")),
    }
}

/// SmolLM2-135M's arena at ctx 8192: weights 93.8 MiB, f16 KV cache 30 layers × 2 × 8192 × 192.
pub fn arena() -> ArenaSnapshot {
    ArenaSnapshot {
        kind: "device".into(),
        capacity: 320 * MIB,
        used: 98_362_432 + 188_743_680 + 6 * MIB,
        high_water: 98_362_432 + 188_743_680 + 11 * MIB,
        regions: vec![
            RegionSnapshot {
                name: "weights".into(),
                capacity: 98_362_432,
                used: 98_362_432,
            },
            RegionSnapshot {
                name: "kv cache".into(),
                capacity: 188_743_680,
                used: 188_743_680,
            },
            RegionSnapshot {
                name: "activations".into(),
                capacity: 16 * MIB,
                used: 6 * MIB,
            },
            RegionSnapshot {
                name: "workspace".into(),
                capacity: 32 * MIB - 98_362_432 % MIB,
                used: 0,
            },
        ],
        largest_free: 26 * MIB,
        device_allocations: 4,
        runtime_overhead: Some(287 * MIB),
        device_total: Some(24 * GIB),
        device_free: Some(24 * GIB - 812 * MIB),
        pinned_host_bytes: 16 * MIB,
        split: None,
    }
}

pub fn watchdog(state: WatchState, age_ms: u64) -> WatchdogSnapshot {
    WatchdogSnapshot {
        state,
        stream: "hip:0 stream 0".into(),
        op: Some("layer 17 / attn / flash_attn_ext_f16".into()),
        age: Duration::from_millis(age_ms),
        budget: Duration::from_secs(2),
        last_completed: Some("layer 17 / attn / rope_neox".into()),
        queue_depth: 37,
        report: (state == WatchState::Hung)
            .then(|| PathBuf::from("/home/ada/.local/state/hipscope/hang-20261122-141503.txt")),
        report_error: None,
        op_started: true,
        // Once hung, hipEventQuery itself stopped answering: the verdict rests on breadcrumbs.
        event_queries_stuck: state == WatchState::Hung,
    }
}

/// The CPU backend's watchdog at rest: its ops (the CPU's own stream) all finished.
pub fn cpu_watchdog() -> WatchdogSnapshot {
    WatchdogSnapshot {
        state: WatchState::Ok,
        stream: "cpu".into(),
        last_completed: Some("read".into()),
        ..WatchdogSnapshot::default()
    }
}

pub fn telemetry(util: f32, power: f32) -> TelemetrySample {
    TelemetrySample {
        gpus: vec![hipscope::gpu::snapshot::GpuReading {
            id: "card1".into(),
            vendor: "amd".into(),
            name: "AMD Radeon RX 7900 XTX".into(),
            gpu_util_pct: Some(util),
            mem_util_pct: Some(41.0),
            temp_edge_c: Some(61.0),
            power_w: Some(power),
            sclk_mhz: Some(2482),
            mclk_mhz: Some(1249),
            vram_used: Some(1_148 * MIB),
            vram_total: Some(24 * GIB),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub fn host(cpu_pct: Option<f32>) -> HostSample {
    HostSample {
        cpu_pct,
        // hipscope's own share: a bit under half of the machine's.
        own_cpu_pct: cpu_pct.map(|c| (c * 0.45).round()),
        mem_used: Some(9 * GIB),
        mem_total: Some(64 * GIB),
    }
}

pub fn stats(prompt: usize, generated: usize) -> GenStats {
    GenStats {
        prompt_tokens: prompt,
        cached_tokens: 0,
        prompt_time: Duration::from_millis(prompt as u64 * 2),
        generated_tokens: generated,
        gen_time: Duration::from_millis(generated as u64 * 5),
        time_to_first_token: Duration::from_millis(prompt as u64 * 2 + 5),
        ..GenStats::default()
    }
}

pub fn key(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

pub fn ctrl(c: char) -> Msg {
    Msg::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL))
}

pub fn alt(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(code, KeyModifiers::ALT))
}

pub fn wheel(up: bool) -> Msg {
    Msg::Mouse(MouseEvent {
        kind: if up {
            MouseEventKind::ScrollUp
        } else {
            MouseEventKind::ScrollDown
        },
        column: 10,
        row: 10,
        modifiers: KeyModifiers::NONE,
    })
}

/// Types `s` key by key, as a user would; returns the effects of all keys.
pub fn type_text(app: &mut App, s: &str) -> Vec<Effect> {
    let mut fx = Vec::new();
    for c in s.chars() {
        fx.extend(app.update(key(KeyCode::Char(c))));
    }
    fx
}

/// Types `s` and presses Enter; returns the effects of Enter.
pub fn submit(app: &mut App, s: &str) -> Vec<Effect> {
    type_text(app, s);
    app.update(key(KeyCode::Enter))
}

pub fn worker(app: &mut App, e: Event) -> Vec<Effect> {
    app.update(Msg::Worker(e))
}

pub fn tick(app: &mut App, ms: u64) {
    app.update(Msg::Tick(Duration::from_millis(ms)));
}

/// An app with SmolLM2 loaded on the RX 7900 XTX.
pub fn loaded_app() -> App {
    let mut app = App::new(settings());
    worker(
        &mut app,
        Event::ModelLoaded {
            model: smollm2(),
            device: rx7900xtx(),
        },
    );
    app
}

/// The arena the CPU backend reports for SmolLM2 at 8,192 tokens of context: every region is
/// allocated whole, so `used == capacity` (what the Arena panel must not read as "full").
pub fn cpu_arena() -> ArenaSnapshot {
    let (weights, kv, acts) = (98_300_000, 188_743_680, 3_250_000);
    let total = weights + kv + acts;
    let region = |name: &str, b: u64| RegionSnapshot {
        name: name.into(),
        capacity: b,
        used: b,
    };
    ArenaSnapshot {
        kind: "host".into(),
        capacity: total,
        used: total,
        high_water: total,
        regions: vec![
            region("weights (mapped)", weights),
            region("kv_cache", kv),
            region("activations", acts),
        ],
        largest_free: 0,
        device_allocations: 3,
        runtime_overhead: None,
        device_total: Some(64 * GIB),
        device_free: Some(55 * GIB),
        pinned_host_bytes: 0,
        split: None,
    }
}

pub fn loaded_cpu_app() -> App {
    let mut app = App::new(settings());
    worker(
        &mut app,
        Event::ModelLoaded {
            model: smollm2(),
            device: cpu_device(),
        },
    );
    app
}

/// Streams the answer `text` in pieces of about `piece` characters.
pub fn stream_answer(app: &mut App, text: &str, piece: usize) {
    worker(
        app,
        Event::AnswerStarted {
            stats: stats(31, 0),
        },
    );
    let chars: Vec<char> = text.chars().collect();
    for chunk in chars.chunks(piece.max(1)) {
        worker(
            app,
            Event::Token {
                text: chunk.iter().collect(),
            },
        );
    }
}

/// Streams a reasoning model's reasoning `text` in pieces of about `piece` characters (after
/// `stream_answer`'s `AnswerStarted`, or on its own: the answer opens with the first piece).
pub fn stream_reasoning(app: &mut App, text: &str, piece: usize) {
    let chars: Vec<char> = text.chars().collect();
    for chunk in chars.chunks(piece.max(1)) {
        worker(
            app,
            Event::Reasoning {
                text: chunk.iter().collect(),
            },
        );
    }
}

pub fn finish(app: &mut App, generated: usize) {
    worker(
        app,
        Event::AnswerDone {
            stats: stats(31, generated),
            reason: StopReason::Eog,
        },
    );
}

/// Feeds a GPU panel history: a few seconds of samples and stream snapshots, one per tick.
pub fn feed_diagnostics(app: &mut App) {
    let utils = [12.0, 35.0, 78.0, 91.0, 94.0, 88.0, 93.0, 96.0, 90.0, 87.0];
    let depths = [0, 2, 5, 9, 12, 8, 6, 7, 4, 3];
    let mut completed = 180_000;
    for (i, (u, d)) in utils.iter().zip(depths).enumerate() {
        tick(app, 1000 + i as u64 * 250);
        completed += 1_250;
        worker(app, Event::Streams(vec![stream(d, completed, 17)]));
        worker(app, Event::Telemetry(telemetry(*u, 120.0 + u * 1.7)));
        let mut a = arena();
        a.used -= (10 - i as u64) * 512 * 1024;
        worker(app, Event::Arena(a));
    }
    worker(app, Event::Watchdog(watchdog(WatchState::Ok, 0)));
}

pub fn draw(app: &App, width: u16, height: u16) -> TestBackend {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal
        .draw(|f| hipscope::ui::render(app, f))
        .expect("draw");
    terminal.backend().clone()
}

pub fn quit_step(name: &str, status: QuitStepStatus, ms: u64) -> QuitStep {
    QuitStep {
        name: name.into(),
        status,
        elapsed: Duration::from_micros(ms),
    }
}

/// A `TestBackend` shared between the event loop (which draws into it) and the test script
/// (which waits for text to appear on it), as a user watches a screen.
#[derive(Clone)]
pub struct SharedBackend(pub std::sync::Arc<std::sync::Mutex<TestBackend>>);

impl SharedBackend {
    pub fn new(width: u16, height: u16) -> SharedBackend {
        SharedBackend(std::sync::Arc::new(std::sync::Mutex::new(
            TestBackend::new(width, height),
        )))
    }

    pub fn screen(&self) -> String {
        format!("{}", self.0.lock().expect("backend"))
    }
}

impl ratatui::backend::Backend for SharedBackend {
    type Error = std::convert::Infallible;

    fn draw<'a, I>(&mut self, content: I) -> Result<(), Self::Error>
    where
        I: Iterator<Item = (u16, u16, &'a ratatui::buffer::Cell)>,
    {
        self.0.lock().expect("backend").draw(content)
    }
    fn hide_cursor(&mut self) -> Result<(), Self::Error> {
        self.0.lock().expect("backend").hide_cursor()
    }
    fn show_cursor(&mut self) -> Result<(), Self::Error> {
        self.0.lock().expect("backend").show_cursor()
    }
    fn get_cursor_position(&mut self) -> Result<ratatui::layout::Position, Self::Error> {
        self.0.lock().expect("backend").get_cursor_position()
    }
    fn set_cursor_position<P: Into<ratatui::layout::Position>>(
        &mut self,
        position: P,
    ) -> Result<(), Self::Error> {
        self.0
            .lock()
            .expect("backend")
            .set_cursor_position(position)
    }
    fn clear(&mut self) -> Result<(), Self::Error> {
        self.0.lock().expect("backend").clear()
    }
    fn clear_region(&mut self, clear_type: ratatui::backend::ClearType) -> Result<(), Self::Error> {
        self.0.lock().expect("backend").clear_region(clear_type)
    }
    fn size(&self) -> Result<ratatui::layout::Size, Self::Error> {
        self.0.lock().expect("backend").size()
    }
    fn window_size(&mut self) -> Result<ratatui::backend::WindowSize, Self::Error> {
        self.0.lock().expect("backend").window_size()
    }
    fn flush(&mut self) -> Result<(), Self::Error> {
        self.0.lock().expect("backend").flush()
    }
}

/// The commands a batch of effects sends to the worker.
pub fn sent(fx: &[Effect]) -> Vec<Command> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Send(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

/// The screen at 100×30 as text, row by row.
pub fn screen(app: &App) -> String {
    let b = draw(app, 100, 30);
    let mut s = String::new();
    for y in 0..30 {
        for x in 0..100 {
            s.push_str(b.buffer()[(x, y)].symbol());
        }
        s.push('\n');
    }
    s
}
