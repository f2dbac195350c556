//! The context shift (issue 20): when the context fills, the oldest turns are dropped, the kept
//! turns' keys and values move down in the cache with their keys re-rotated, and the next turn
//! processes only its own tokens.
//!
//! The reference is independent of the shift: a fresh session given the kept history
//! (`Session::restore`) recomputes everything. For one-layer models a shifted cache holds exactly
//! what that recompute computes (each token's keys and values depend only on the token and its
//! position), so greedy answers must be identical — this checks the moves and the re-rotation
//! (normal RoPE, NeoX RoPE, llama-3 frequency factors) end to end. Deeper layers carry what each
//! kept token saw of the dropped turns (llama.cpp's context shift does the same), so for them only
//! the mechanism is checked (the shift happens, the cache is the new rendering, answers continue).

use std::sync::Arc;

use hipscope::gpu::backend::Backend;
use hipscope::gpu::compute::{ComputeOptions, GpuCompute, KvType};
use hipscope::gpu::cpu::CpuBackend;
use hipscope::gpu::fake::{FakeDevice, FakeScript};
use hipscope::gpu::kernels::KernelCache;
use hipscope::gpu::quant::GgmlType;
use hipscope::model::forward::{Logits, Model, ModelOptions};
use hipscope::model::gguf::GgufFile;
use hipscope::model::loader::{self, LoadOptions};
use hipscope::model::protocol::SamplerConfig;
use hipscope::model::session::{Answer, Control, Progress, Session, Trim};
use hipscope::model::synthetic;

const SEED_QWEN2: u64 = 8;
const SYSTEM: &str = "You are a terse assistant.";

fn model(shape: &str, layers: usize) -> Arc<GgufFile> {
    let mut s = synthetic::shape(shape).expect("shape").clone();
    s.n_layers = layers;
    // Seeds whose greedy answers are never blank (a blank answer is one `restore` leaves out).
    let seed = if shape == "tiny-qwen2" { SEED_QWEN2 } else { 7 };
    Arc::new(synthetic::build(&s, GgmlType::Q8_0, seed, &mut |_, _| {}).expect("build"))
}

fn session(file: &Arc<GgufFile>, n_ctx: usize) -> Session {
    let opts = LoadOptions {
        n_ctx: Some(n_ctx),
        n_batch: 64,
        all_logits: false,
        sampler: SamplerConfig {
            temp: 0.0,
            n_predict: 10,
            ..SamplerConfig::default()
        },
        ..LoadOptions::default()
    };
    let mut s = loader::load(
        Arc::clone(file),
        Box::new(CpuBackend::new(2)),
        &opts,
        &mut |_, _| {},
    )
    .expect("load")
    .session;
    s.set_system(SYSTEM);
    s
}

fn say(s: &mut Session, text: &str) -> (Answer, Option<Trim>) {
    let mut trim = None;
    let a = s
        .chat(text, &mut |p| {
            if let Progress::Trimmed(t) = p {
                trim = Some(t.clone());
            }
            Control::Continue
        })
        .expect("chat");
    (a, trim)
}

/// The kept history of `s` without its last exchange, as (question, answer) pairs.
fn history(s: &Session) -> Vec<(String, String)> {
    let m = s.messages();
    m[..m.len() - 2]
        .chunks_exact(2)
        .map(|p| (p[0].content.clone(), p[1].content.clone()))
        .collect()
}

/// Chats until a shift happens; then the shifted session and a recomputing one answer the same
/// questions. Returns the number of answers compared that were equal, of those compared.
fn shift_then_compare(shape: &str, layers: usize) -> (usize, usize) {
    let file = model(shape, layers);
    let mut s = session(&file, 400);
    let mut shifted = None;
    // Prompt tokens a turn without a shift processes: its message and what of the last answer
    // re-tokenizes differently from the sampled tokens.
    let mut usual = 0;
    for i in 0..40 {
        let (a, trim) = say(&mut s, &format!("tell me one fact about the number {i}"));
        if let Some(t) = trim {
            shifted = Some((i, a, t));
            break;
        }
        usual = usual.max(a.stats.prompt_tokens - a.stats.cached_tokens);
    }
    let (i, answer, trim) = shifted.expect("a 400-token context never filled in 40 turns");
    assert_eq!(trim.recompute, None, "{shape}: the shift fell back: {trim}");
    assert!(
        trim.messages >= 2 && trim.messages.is_multiple_of(2),
        "{trim:?}"
    );
    // The system prompt and the kept turns stayed; only the new message was processed.
    let fresh_prompt = {
        let mut r = session(&file, 400);
        let h = history(&s);
        assert!(
            h.iter().all(|(_, a)| !a.trim().is_empty()),
            "{shape}: a blank answer (restore skips those): {h:?}"
        );
        r.restore(&h);
        let (ra, rt) = say(&mut r, &format!("tell me one fact about the number {i}"));
        assert!(rt.is_none(), "the recompute had room");
        assert_eq!(ra.stats.cached_tokens, 0);
        // The template's structure: the shifted cache holds exactly what the rendering without
        // the dropped turns holds (the recompute's cache), up to the end of the prompt.
        let n = ra.stats.prompt_tokens;
        assert_eq!(answer.stats.prompt_tokens, n);
        assert_eq!(
            &s.cached_ids()[..n],
            &r.cached_ids()[..n],
            "{shape}: the shifted cache is not the rendering without the dropped turns"
        );
        (ra, r)
    };
    assert_eq!(trim.kept_tokens, answer.stats.cached_tokens);
    assert!(
        answer.stats.prompt_tokens - answer.stats.cached_tokens <= usual + 2,
        "{shape}: {} of {} prompt tokens processed after the shift, {usual} before",
        answer.stats.prompt_tokens - answer.stats.cached_tokens,
        answer.stats.prompt_tokens
    );
    let (ra, mut r) = fresh_prompt;
    let mut compared = 1;
    let mut equal = usize::from(ra.tokens == answer.tokens);
    // Two more turns on both, each from its own cache.
    for j in 0..2 {
        let q = format!("and what about {j}?");
        let (a, _) = say(&mut s, &q);
        let (b, _) = say(&mut r, &q);
        compared += 1;
        equal += usize::from(a.tokens == b.tokens);
    }
    (equal, compared)
}

#[test]
fn one_layer_llama_answers_after_a_shift_as_after_a_recompute() {
    assert_eq!(shift_then_compare("tiny", 1), (3, 3));
}

#[test]
fn one_layer_qwen2_answers_after_a_shift_as_after_a_recompute() {
    assert_eq!(shift_then_compare("tiny-qwen2", 1), (3, 3));
}

#[test]
fn one_layer_llama3_rope_answers_after_a_shift_as_after_a_recompute() {
    assert_eq!(shift_then_compare("tiny-llama3", 1), (3, 3));
}

#[test]
fn one_layer_qwen3_and_phi3_answer_after_a_shift_as_after_a_recompute() {
    // Per-head Q/K norms come before RoPE (Qwen 3); Phi-3's LongRoPE factors and attention
    // factor: a shift rotates by the factors' angles and leaves the factor's scale alone.
    assert_eq!(shift_then_compare("tiny-qwen3", 1), (3, 3));
    assert_eq!(shift_then_compare("tiny-phi3", 1), (3, 3));
}

/// Gemma's sliding-window layers keep only their window: when the context fills the kept turns
/// are processed again (the session says why), and the chat goes on with exactly the answers a
/// fresh session given the same history gives.
#[test]
fn gemma_chats_recompute_when_the_context_fills() {
    for shape in ["tiny-gemma2", "tiny-gemma3"] {
        let file = model(shape, synthetic::shape(shape).unwrap().n_layers);
        let mut s = session(&file, 400);
        let (i, answer, trim) = (0..60)
            .find_map(|i| {
                let (a, t) = say(&mut s, &format!("tell me one fact about the number {i}"));
                t.map(|t| (i, a, t))
            })
            .expect("a 400-token context never filled in 60 turns");
        let why = trim.recompute.clone().expect("gemma cannot shift");
        assert!(why.contains("sliding-window"), "{shape}: {why}");
        assert_eq!(answer.stats.cached_tokens, 0, "{shape}: {trim}");
        let mut r = session(&file, 400);
        r.restore(&history(&s));
        let (ra, _) = say(&mut r, &format!("tell me one fact about the number {i}"));
        assert_eq!(ra.tokens, answer.tokens, "{shape}");
        // And on, each from its own cache, past the rings.
        for j in 0..3 {
            let q = format!("and what about {j}?");
            assert_eq!(
                say(&mut s, &q).0.tokens,
                say(&mut r, &q).0.tokens,
                "{shape}"
            );
        }
    }
}

#[test]
fn two_layer_models_shift_and_keep_the_template_structure() {
    for shape in ["tiny", "tiny-qwen2"] {
        let (_, compared) = shift_then_compare(shape, 2);
        assert_eq!(compared, 3);
    }
}

#[test]
fn the_discarded_share_is_configurable() {
    let file = model("tiny", 1);
    let dropped = |share: f32| {
        let mut s = session(&file, 400);
        s.set_discard(share);
        (0..40)
            .find_map(|i| say(&mut s, &format!("fact number {i}, please")).1)
            .expect("a shift")
    };
    let small = dropped(0.1);
    let large = dropped(0.8);
    assert!(
        large.dropped_tokens > 2 * small.dropped_tokens,
        "{small:?} vs {large:?}"
    );
    assert!(small.kept_tokens > large.kept_tokens);
}

/// The model-level op against a recompute, logits compared directly: the same sequence computed
/// at its final positions, and computed with a gap then shifted down.
#[test]
fn a_one_layer_shift_gives_the_recomputed_logits() {
    for shape in ["tiny", "tiny-qwen2", "tiny-llama3"] {
        let file = model(shape, 1);
        let opts = ModelOptions {
            n_ctx: 96,
            n_batch: 32,
            all_logits: false,
            n_seq: 1,
        };
        let load = || {
            Model::load(
                Arc::clone(&file),
                Box::new(CpuBackend::new(2)),
                opts,
                &mut |_, _| {},
            )
            .expect("load")
        };
        let toks: Vec<u32> = (0..70).map(|i| (i * 37 + 11) % 500).collect();
        let (head, gap, tail) = (&toks[..10], &toks[10..35], &toks[35..60]);
        let next = &toks[60..64];
        let mut shifted = load();
        let mut out = Vec::new();
        shifted.forward(head, 0, Logits::Last, &mut out).unwrap();
        shifted.forward(gap, 10, Logits::Last, &mut out).unwrap();
        shifted.forward(tail, 35, Logits::Last, &mut out).unwrap();
        shifted.shift_kv(10, 35, tail.len()).unwrap();
        let mut a = Vec::new();
        shifted.forward(next, 35, Logits::Last, &mut a).unwrap();

        let mut fresh = load();
        let kept: Vec<u32> = head.iter().chain(tail).chain(next).copied().collect();
        let mut b = Vec::new();
        fresh.forward(&kept, 0, Logits::Last, &mut b).unwrap();
        let err = rel_l2(&a, &b);
        assert!(
            err < 1e-5,
            "{shape}: logits after the shift differ by {err:e}"
        );
    }
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// On the GPU backend (the scripted fake device runs inference kernels as no-ops, so this checks
/// the host side): one labelled launch per chunk of at most `src − dst` rows, of the kernel for
/// the cache's type, and no allocation.
#[test]
fn the_gpu_shift_launches_its_kernel_in_chunks_and_allocates_nothing() {
    for (kv, kernel) in [
        (KvType::F16, "hs_kv_shift_f16"),
        (KvType::F32, "hs_kv_shift_f32"),
    ] {
        let dev = FakeDevice::new(FakeScript {
            total_memory: 1 << 30,
            auto_complete: true,
            blas: false,
            graphs: false,
        });
        let ctl = dev.control();
        let gpu = GpuCompute::open(
            Box::new(dev),
            "fake: test device",
            ComputeOptions {
                kv,
                ..ComputeOptions::default()
            },
            &KernelCache::disabled(),
        )
        .expect("open");
        let shared = gpu.gpu().expect("live").stream_shared();
        let mut m = Model::load(
            model("tiny-qwen2", 2),
            Box::new(gpu),
            ModelOptions {
                n_ctx: 64,
                n_batch: 32,
                all_logits: false,
                n_seq: 1,
            },
            &mut |_, _| {},
        )
        .expect("load");
        let mut out = Vec::new();
        let prompt: Vec<u32> = (0..30).map(|i| (i * 7 + 1) % 512).collect();
        m.forward(&prompt, 0, Logits::Last, &mut out).unwrap();
        let mallocs = |c: &hipscope::gpu::fake::FakeControl| {
            c.log().iter().filter(|l| l.starts_with("malloc")).count()
        };
        let before = mallocs(&ctl);
        // 16 rows move down by 6: three chunks (6, 6, 4).
        m.shift_kv(8, 14, 16).unwrap();
        m.forward(&[3], 22, Logits::Last, &mut out).unwrap();
        let want = format!("launch {kernel}");
        assert_eq!(ctl.log().iter().filter(|l| **l == want).count(), 3);
        assert_eq!(mallocs(&ctl), before, "a shift allocates nothing");
        let labels: Vec<String> = shared
            .recent_completed(4000)
            .into_iter()
            .map(|o| o.label)
            .collect();
        let label = format!("kv_shift · {}", &kernel[3..]);
        assert!(labels.contains(&label), "{label} not in {labels:?}");
        // A shift past the cache is refused before anything is launched.
        let e = m.shift_kv(8, 60, 16).unwrap_err();
        assert!(e.to_string().contains("exceed the context"), "{e}");
        let _ = m
            .backend_mut()
            .shutdown(std::time::Duration::from_secs(2), &mut |_| {});
        let _: &dyn Backend = m.backend();
    }
}

/// `hipscope soak` end to end on a synthetic model: the context fills, the cache is shifted (never
/// recomputed), and nothing is allocated after the start.
#[test]
fn soak_reports_shifts_and_flat_allocations_as_json() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hipscope"))
        .args([
            "soak",
            "--synthetic",
            "tiny",
            "--backend",
            "cpu",
            "-t",
            "2",
            "-c",
            "256",
            "-n",
            "8",
            "--turns",
            "24",
            "--json",
        ])
        .output()
        .expect("run hipscope soak");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let s = &v["summary"];
    assert_eq!(s["turns"], 24);
    assert_eq!(s["n_ctx"], 256);
    assert!(s["shifts"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["recomputes"], 0, "{s}");
    assert_eq!(s["device_allocation_changes"], 0, "{s}");
    let turns = v["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 24);
    for t in turns {
        let context = t["context_tokens"].as_u64().unwrap();
        assert!(context <= 256, "{t}");
        if t["shifted"] == true {
            // Only the new message and the last answer's tail are processed, not the context.
            assert!(t["cached_tokens"].as_u64().unwrap() > 0, "{t}");
        }
    }
}
