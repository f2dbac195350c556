//! Op offload (llama.cpp's): a prompt batch of at least 32 tokens runs a split model's CPU layers
//! on GPU 0, their weights streamed up a layer at a time (`model/split/backend/offload.rs`).
//!
//! The numbers: with a second CPU backend as the "GPU", the ops that move compute as the CPU does,
//! so every logit equals the all-CPU run's bit for bit (which ops move, that each weight arrives
//! with its op, the crossings between, the attention over rows borrowed from the CPU's cache).
//! The mechanism on the real `GpuCompute` over the scripted fake device: what is streamed, when,
//! and into which room (`offload.rs` in this folder has the split's own tests and the helpers).

use hipscope::gpu::backend::{Backend, KvLayout, MemoryPlan};
use hipscope::gpu::cpu::CpuBackend;
use hipscope::gpu::snapshot::{DeviceRelease, SplitSnapshot};
use hipscope::model::config::ModelConfig;
use hipscope::model::forward::{Logits, Model, ModelOptions, SeqChunk};
use hipscope::model::loader;
use hipscope::model::split::{self, GpuLayers, Placement};

use crate::offload::{SPLIT_SHAPES, fake_gpu, fake_gpu_ctl, load_opts, split_with, synth};

/// A prompt batch of at least 32 tokens, one of 36 with every token's logits after two decode
/// steps, and a decode step after it: every logit, and the split's counts.
fn offload_script(m: &mut Model) -> Vec<Vec<f32>> {
    let vocab = m.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..40).map(|i| (i * 53 + 7) % vocab).collect();
    let mut out = Vec::new();
    let mut logits = Vec::new();
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    out.push(logits.clone());
    for (i, t) in [4u32, 19].iter().enumerate() {
        m.forward(&[t % vocab], 40 + i, Logits::Last, &mut logits)
            .expect("decode");
        out.push(logits.clone());
    }
    m.forward(&prompt[..36], 42, Logits::All, &mut logits)
        .expect("a second batch, every logit");
    out.push(logits.clone());
    m.forward(&[2], 78, Logits::Last, &mut logits)
        .expect("decode after it");
    out.push(logits.clone());
    out
}

/// Runs `script` on each of [`SPLIT_SHAPES`] on the CPU, then split with op offload at `-ngl 0`
/// and at half (the "GPU" a second CPU backend): every logit bit for bit; each split's counts.
fn offload_matches_the_cpu(
    o: ModelOptions,
    script: fn(&mut Model) -> Vec<Vec<f32>>,
) -> Vec<(String, SplitSnapshot)> {
    let mut out = Vec::new();
    for &(shape, quant) in SPLIT_SHAPES {
        let file = synth(shape, quant);
        let n = ModelConfig::from_gguf(&file).expect("config").n_layers;
        let cpu = Model::load(
            file.clone(),
            Box::new(CpuBackend::new(2)),
            o,
            &mut |_, _| {},
        );
        let want = script(&mut cpu.expect("load on the CPU"));
        for ngl in [0, n / 2 + 1] {
            let mut m = split_with(&file, ngl, true, o);
            let got = script(&mut m);
            assert_eq!(got.len(), want.len(), "{shape} -ngl {ngl}");
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w,
                    "{shape} -ngl {ngl}: step {step} differs from the all-CPU run (first at {:?})",
                    g.iter().zip(w).position(|(a, b)| a != b)
                );
            }
            let s = m.backend().arena().split.expect("split");
            out.push((format!("{shape} -ngl {ngl}"), s));
        }
    }
    out
}

#[test]
fn op_offload_runs_a_prompt_batchs_cpu_layers_on_the_gpu_part_bit_for_bit() {
    // The "GPU" is a second CPU backend: the ops of a CPU layer that move to it for a batch of
    // 32 tokens or more (their weights streamed over, their attention over borrowed rows)
    // compute as the CPU does, so the logits equal the all-CPU run's bit for bit — which checks
    // which ops move, that every weight an op reads arrives with it, and the crossings between.
    let o = ModelOptions {
        n_ctx: 96,
        n_batch: 64,
        all_logits: true,
        n_seq: 1,
    };
    for (case, s) in offload_matches_the_cpu(o, offload_script) {
        assert!(s.streamed_ops > 0, "{case}: {s:?}");
    }
}

/// Prompt batches of 40 at growing depth (every logit), decode steps between, a context shift
/// where the model allows one, and a batch of 16: a sliding window's ring (16 + 40 − 1 slots in
/// a context of 192) wraps three times.
fn depth_script(m: &mut Model) -> Vec<Vec<f32>> {
    let vocab = m.config.vocab_size as u32;
    let tok = |i: usize| (i as u32 * 29 + 3) % vocab;
    let mut out = Vec::new();
    let mut logits = Vec::new();
    let mut pos = 0;
    for n in [40, 40, 40, 16, 38] {
        let batch: Vec<u32> = (pos..pos + n).map(tok).collect();
        m.forward(&batch, pos, Logits::All, &mut logits)
            .expect("a batch");
        out.push(logits.clone());
        pos += n;
        m.forward(&[tok(pos)], pos, Logits::Last, &mut logits)
            .expect("decode");
        out.push(logits.clone());
        pos += 1;
    }
    if m.shift_kv(8, 40, pos - 40).is_ok() {
        pos -= 32;
        let batch: Vec<u32> = (0..32).map(tok).collect();
        m.forward(&batch, pos, Logits::All, &mut logits)
            .expect("a batch after the shift");
        out.push(logits.clone());
    }
    out
}

#[test]
fn op_offload_runs_a_cpu_layers_attention_on_gpu_0_over_rows_borrowed_from_its_cache() {
    // The attention of an offloaded CPU layer runs on the "GPU" over the rows its batch reads,
    // copied into GPU 0's stage, and the batch's rows go back to the CPU's cache (decode and
    // batches of 16 read them there): bit for bit the all-CPU run through batches at depth,
    // sliding-window rings that wrap, and a context shift.
    let o = ModelOptions {
        n_ctx: 192,
        n_batch: 40,
        all_logits: true,
        n_seq: 1,
    };
    for (case, s) in offload_matches_the_cpu(o, depth_script) {
        assert!(s.kv_rows_bytes > 0, "{case}: {s:?}");
    }

    // What moves for llama's global layers: before each batch of 40 its sequence's rows so far,
    // after it the batch's 40; nothing for the batch of 16 or for decode.
    let file = synth("tiny", "Q4_0");
    let config = ModelConfig::from_gguf(&file).expect("config");
    let ngl = config.n_layers / 2 + 1;
    let cpu_layers = Placement::from_ngl(config.n_layers, ngl, false).gpu_from as u64;
    let mut m = split_with(&file, ngl, true, o);
    let row = 2 * config.kv_dim() as u64 * m.backend().kv_type().bytes();
    let mut logits = Vec::new();
    let moved = |m: &Model| m.backend().arena().split.expect("split").kv_rows_bytes;
    m.forward(&(0..40).collect::<Vec<u32>>(), 0, Logits::Last, &mut logits)
        .expect("prompt");
    assert_eq!(moved(&m), cpu_layers * 40 * row);
    m.forward(&[1], 40, Logits::Last, &mut logits)
        .expect("decode");
    m.forward(
        &(0..16).collect::<Vec<u32>>(),
        41,
        Logits::Last,
        &mut logits,
    )
    .expect("a batch of 16");
    assert_eq!(moved(&m), cpu_layers * 40 * row);
    m.forward(
        &(0..40).collect::<Vec<u32>>(),
        57,
        Logits::Last,
        &mut logits,
    )
    .expect("a batch at 57");
    assert_eq!(moved(&m), cpu_layers * (40 + 57 + 40) * row);
    // Without op offload the split has no stage and lends nothing.
    let mut m = split_with(&file, ngl, false, o);
    m.forward(&(0..40).collect::<Vec<u32>>(), 0, Logits::Last, &mut logits)
        .expect("prompt");
    assert_eq!(moved(&m), 0);
}

#[test]
fn op_offload_streams_each_cpu_layer_once_a_batch_and_only_batches_of_32() {
    let file = synth("tiny", "Q4_0");
    let config = ModelConfig::from_gguf(&file).expect("config");
    let n = config.n_layers;
    let ngl = n / 2 + 1;
    let gpu_from = Placement::from_ngl(n, ngl, false).gpu_from;
    let layer_bytes: u64 = file
        .tensors()
        .iter()
        .filter(|t| {
            t.name
                .strip_prefix("blk.")
                .and_then(|r| r.split_once('.'))
                .and_then(|(l, _)| l.parse::<usize>().ok())
                .is_some_and(|l| l < gpu_from)
        })
        .map(|t| t.size)
        .sum();
    assert!(layer_bytes > 0);
    let o = |n_batch| ModelOptions {
        n_ctx: 96,
        n_batch,
        all_logits: false,
        n_seq: 1,
    };
    let counts = |m: &Model| {
        let s = m.backend().arena().split.expect("split");
        (s.streamed_ops, s.streamed_bytes)
    };
    let prompt: Vec<u32> = (0..40).collect();
    let mut logits = Vec::new();
    // One batch of 40: each CPU layer's weights go over once (llama's layer: the attention
    // norm, QKV, output, FFN norm, gate/up, down: six ops).
    let mut m = split_with(&file, ngl, true, o(64));
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    assert_eq!(counts(&m), (6 * gpu_from as u64, layer_bytes));
    // Decode stays on the CPU.
    m.forward(&[1], 40, Logits::Last, &mut logits)
        .expect("decode");
    assert_eq!(counts(&m), (6 * gpu_from as u64, layer_bytes));
    // Batches of 16 stay on the CPU; so does everything with op offload off.
    let mut m = split_with(&file, ngl, true, o(16));
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    assert_eq!(counts(&m), (0, 0));
    let mut m = split_with(&file, ngl, false, o(64));
    m.forward(&prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    assert_eq!(counts(&m), (0, 0));

    // The GPU's plan sets room aside for the largest layer the CPU keeps, and none without
    // op offload or without a layer on the CPU.
    let full = split::model_plan(&file, o(64)).expect("plan");
    let plan = |ngl: usize, on: bool| {
        let p = Placement::from_ngl(n, ngl, false).with_op_offload(on.then_some(32));
        split::gpu_plan(&full, &p, &file, &config, 96).stage_bytes
    };
    let one_layer: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("blk.0."))
        .map(|t| t.size)
        .sum();
    assert!(
        plan(ngl, true) >= one_layer,
        "{} < {one_layer}",
        plan(ngl, true)
    );
    assert!(plan(ngl, true) < 2 * one_layer + 64 * 1024);
    assert_eq!(plan(ngl, false), 0);
    assert_eq!(plan(n + 1, true), 0);
}

#[test]
fn op_offload_on_a_gpu_backend_streams_into_the_room_its_plan_set_aside() {
    // The real GpuCompute on the fake device: a 40-token batch at -ngl 2 of a 2-layer model
    // streams layer 0 into the weights region, whose room the plan counted.
    let file = synth("tiny-qwen2", "Q8_0");
    let mut lo = load_opts(GpuLayers::Count(2));
    lo.n_batch = 64;
    lo.n_ctx = Some(96);
    let loaded =
        loader::load(file.clone(), fake_gpu(1 << 30), &lo, &mut |_, _| {}).expect("load split");
    let mut session = loaded.session;
    let m = session.model_mut();
    let weights_used = |m: &Model| {
        m.backend()
            .arena()
            .regions
            .iter()
            .find(|r| r.name.contains("weights"))
            .expect("a weights region")
            .used
    };
    let before = weights_used(m);
    let mut logits = Vec::new();
    m.forward(&(0..40).collect::<Vec<u32>>(), 0, Logits::Last, &mut logits)
        .expect("a batch of 40");
    let layer0: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("blk.0."))
        .map(|t| t.size)
        .sum();
    let s = m.backend().arena().split.expect("split");
    assert_eq!(s.streamed_bytes, layer0, "{s:?}");
    // From the file in place: the span of layer 0's matrices registered with the runtime.
    assert!(s.pinned_bytes > 0 && s.pinned_bytes <= layer0, "{s:?}");
    // Layer 0's attention ran on the GPU: its 40 new rows came down from the stage.
    let config = ModelConfig::from_gguf(&file).expect("config");
    let row = 2 * config.kv_dim() as u64 * m.backend().kv_type().bytes();
    assert_eq!(s.kv_rows_bytes, 40 * row, "{s:?}");
    assert!(
        weights_used(m) >= before + layer0,
        "{} vs {before}",
        weights_used(m)
    );
    // A second batch reuses the room: nothing more is allocated.
    let after = weights_used(m);
    m.forward(
        &(0..40).collect::<Vec<u32>>(),
        40,
        Logits::Last,
        &mut logits,
    )
    .expect("another batch");
    assert_eq!(weights_used(m), after);
    let s = m.backend().arena().split.expect("split");
    assert_eq!(s.streamed_bytes, 2 * layer0);
    // The 40 rows before it went up into the stage, its 40 came down.
    assert_eq!(s.kv_rows_bytes, (40 + 40 + 40) * row, "{s:?}");
    assert_eq!(
        m.backend_mut()
            .shutdown(std::time::Duration::from_secs(2), &mut |_| {}),
        DeviceRelease::Clean
    );

    // A runtime that cannot register the file: the weights go through the staging as before.
    let (gpu, ctl) = fake_gpu_ctl(1 << 30);
    ctl.fail_next("host_register", 1);
    let loaded = loader::load(file.clone(), gpu, &lo, &mut |_, _| {}).expect("load split");
    let mut session = loaded.session;
    let m = session.model_mut();
    m.forward(&(0..40).collect::<Vec<u32>>(), 0, Logits::Last, &mut logits)
        .expect("a batch of 40, staged");
    let s = m.backend().arena().split.expect("split");
    assert_eq!((s.streamed_bytes, s.pinned_bytes), (layer0, 0), "{s:?}");
    m.backend_mut()
        .shutdown(std::time::Duration::from_secs(2), &mut |_| {});

    // --no-op-offload: the placement's sentence says nothing of it, and nothing streams.
    lo.split.no_op_offload = true;
    let loaded =
        loader::load(file.clone(), fake_gpu(1 << 30), &lo, &mut |_, _| {}).expect("load split");
    let said = loaded.offload.clone().expect("said");
    assert!(!said.contains("op offload"), "{said}");
    let mut session = loaded.session;
    let m = session.model_mut();
    m.forward(&(0..40).collect::<Vec<u32>>(), 0, Logits::Last, &mut logits)
        .expect("a batch of 40");
    assert_eq!(m.backend().arena().split.expect("split").streamed_bytes, 0);
    m.backend_mut()
        .shutdown(std::time::Duration::from_secs(2), &mut |_| {});
}

#[test]
fn op_offload_takes_a_batch_of_several_sequences_as_one() {
    // `serve`'s batches: two sequences' prompts in one batch of 40 rows (offloaded: the
    // products over every row on the "GPU", the attention group by group in each sequence's
    // region of the CPU's cache, each group below 32 rows), a decode step of both, then a
    // batch of 76 rows whose groups of 40 and 36 attend on the "GPU" over each sequence's rows
    // borrowed into its region of the stage: the all-CPU run's logits, bit for bit.
    let o = ModelOptions {
        n_ctx: 128,
        n_batch: 96,
        all_logits: false,
        n_seq: 2,
    };
    for shape in ["tiny-qwen2", "tiny-qwen3moe"] {
        let file = synth(shape, "Q8_0");
        let n = ModelConfig::from_gguf(&file).expect("config").n_layers;
        let vocab = ModelConfig::from_gguf(&file).expect("config").vocab_size as u32;
        let a: Vec<u32> = (0..22).map(|i| (i * 31 + 5) % vocab).collect();
        let b: Vec<u32> = (0..18).map(|i| (i * 17 + 2) % vocab).collect();
        let run = |m: &mut Model| {
            let mut out = Vec::new();
            let mut logits = Vec::new();
            let prompts = [
                SeqChunk {
                    seq: 0,
                    pos0: 0,
                    tokens: &a,
                    logits: true,
                },
                SeqChunk {
                    seq: 1,
                    pos0: 0,
                    tokens: &b,
                    logits: true,
                },
            ];
            m.forward_seqs(&prompts, &mut logits).expect("prompts");
            out.push(logits.clone());
            let (ta, tb) = ([7u32 % vocab], [9u32 % vocab]);
            let step = [
                SeqChunk {
                    seq: 0,
                    pos0: a.len(),
                    tokens: &ta,
                    logits: true,
                },
                SeqChunk {
                    seq: 1,
                    pos0: b.len(),
                    tokens: &tb,
                    logits: true,
                },
            ];
            m.forward_seqs(&step, &mut logits).expect("decode");
            out.push(logits.clone());
            let c: Vec<u32> = (0..40).map(|i| (i * 7 + 1) % vocab).collect();
            let d: Vec<u32> = (0..36).map(|i| (i * 11 + 4) % vocab).collect();
            let more = [
                SeqChunk {
                    seq: 0,
                    pos0: a.len() + 1,
                    tokens: &c,
                    logits: true,
                },
                SeqChunk {
                    seq: 1,
                    pos0: b.len() + 1,
                    tokens: &d,
                    logits: true,
                },
            ];
            m.forward_seqs(&more, &mut logits)
                .expect("a batch at depth");
            out.push(logits.clone());
            out
        };
        let mut cpu = Model::load(
            file.clone(),
            Box::new(CpuBackend::new(2)),
            o,
            &mut |_, _| {},
        )
        .expect("load on the CPU");
        let want = run(&mut cpu);
        let mut m = split_with(&file, n / 2 + 1, true, o);
        let got = run(&mut m);
        assert!(got == want, "{shape}: the split's logits differ");
        let s = m.backend().arena().split.expect("split");
        assert!(
            s.streamed_ops > 0 && s.kv_rows_bytes > 0,
            "{shape}: the batches were offloaded: {s:?}"
        );
    }
}

#[test]
fn kv_rows_go_out_and_in_alike_on_the_cpu_and_a_gpu_backend_rings_wrapping() {
    // Two layers of two sequences: a global one (24 positions) and a ring of 10; GPU 0's part
    // keeps layer 1 with a stage. The same rows written into each backend come out the same,
    // byte for byte, and a ring keeps the last of more rows than it holds.
    let kv_dim = 8;
    let full = KvLayout::new(24, kv_dim, vec![24, 10])
        .and_then(|l| l.with_seqs(2))
        .expect("layout");
    let mut gpu = fake_gpu(1 << 30);
    let mut cpu: Box<dyn Backend> = Box::new(CpuBackend::new(2).with_kv_type(gpu.kv_type()));
    let plan = MemoryPlan {
        kv_elems: full.elems() as u64 + 24 * kv_dim as u64 * 2,
        activation_elems: 1 << 10,
        n_batch: 4,
        n_seq: 2,
        max_cols: 64,
        ..MemoryPlan::default()
    };
    gpu.plan(&plan).expect("plan");
    cpu.alloc_kv_cache(&full).expect("the CPU's cache");
    gpu.alloc_kv_cache(&full.part_with_stage(1..2).expect("part"))
        .expect("the GPU's cache");
    let row = 2 * kv_dim * cpu.kv_type().bytes() as usize;
    // f16 bit patterns of finite numbers, distinct per byte pair.
    let rows = |n: usize, salt: u16| -> Vec<u8> {
        (0..n * row / 2)
            .flat_map(|i| (((i as u16).wrapping_mul(7) ^ salt) & 0x3bff).to_le_bytes())
            .collect()
    };
    let mut a = Vec::new();
    let mut b = Vec::new();
    for (layer, seq, pos0, n) in [(1, 1, 3, 9), (1, 0, 7, 14), (0, 1, 5, 12)] {
        let data = rows(n, (layer * 31 + seq * 7) as u16);
        cpu.kv_rows_in(layer, seq, pos0, &data)
            .expect("rows into the CPU");
        // Layer 0 is not GPU 0's own: it lands in the stage.
        gpu.kv_rows_in(layer, seq, pos0, &data)
            .expect("rows into the GPU");
        let keep = n.min(if layer == 1 { 10 } else { 24 });
        let last = pos0 + n - keep..pos0 + n;
        cpu.kv_rows_out(layer, seq, last.clone(), &mut a)
            .expect("rows out of the CPU");
        gpu.kv_rows_out(layer, seq, last, &mut b)
            .expect("rows out of the GPU");
        let skip = n - keep;
        let half = n * row / 2;
        let want: Vec<u8> = [&data[skip * row / 2..half], &data[half + skip * row / 2..]].concat();
        assert_eq!(a, want, "layer {layer} sequence {seq}: the CPU's rows");
        assert_eq!(b, want, "layer {layer} sequence {seq}: the GPU's rows");
    }
    // More positions than a ring keeps cannot be read back.
    assert!(cpu.kv_rows_out(1, 0, 0..11, &mut a).is_err());
    assert!(gpu.kv_rows_out(1, 0, 0..11, &mut b).is_err());
    assert!(
        cpu.kv_rows_in(0, 2, 0, &rows(1, 0)).is_err(),
        "no third sequence"
    );
    assert!(
        gpu.kv_rows_in(1, 0, 20, &rows(5, 0)).is_err(),
        "past the context"
    );
}
