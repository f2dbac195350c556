//! Issue 16: a reasoning model's answer through the real inference worker, split into its
//! reasoning and its answer. The model is the synthetic gpt-oss (harmony vocabulary and
//! template) on the CPU backend, with its output scripted: the backend computes the forward pass
//! as always, and the logits it hands back make the scripted token the only choice. So the
//! worker, the session, the tokenizer's end-of-generation list, the streaming decoder and the
//! reasoning parser run as in a chat, on output known in advance. Also a reopened transcript's
//! answer with reasoning, as the view shows it.

use crate::ui_common;

use crate::common;
use common::worker::until;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hipscope::gpu::backend::{
    AttnParams, Buf, Glu, HeadNorms, Instrument, KvLayout, KvShift, KvType, Memory, MemoryPlan,
    MoeFfn, OpLabel, Ops, Result, RopeParams, SeqPos, Weight, WeightData,
};
use hipscope::gpu::cpu::CpuBackend;
use hipscope::gpu::snapshot::{ArenaSnapshot, DeviceSummary};
use hipscope::model::loader::{self, LoadOptions};
use hipscope::model::protocol::{Command, Event, GenStats, ModelSource, SamplerConfig, StopReason};
use hipscope::model::reasoning::ReasoningFormat;
use hipscope::model::template::ChatTemplate;
use hipscope::model::tokenizer::Tokenizer;
use hipscope::model::worker::{self, WorkerHandle, WorkerOptions};

fn source() -> ModelSource {
    ModelSource::Synthetic {
        shape: "tiny-gpt-oss".into(),
        quant: "Q8_0".into(),
        seed: 3,
    }
}

/// What the scripted backend shares with the test: the tokens to come out next, and every token
/// the model was fed (the prompts, as the worker rendered them). The head of `next` is what every
/// read of the logits gives until the model is fed that token alone (a decode step): a prompt
/// in several batches reads logits after each batch.
#[derive(Default)]
struct Script {
    next: VecDeque<u32>,
    fed: Vec<u32>,
}

/// The CPU backend, with the logits replaced by the script's next token.
struct Scripted {
    inner: CpuBackend,
    n_vocab: usize,
    script: Arc<Mutex<Script>>,
}
impl Ops for Scripted {
    fn embed(&mut self, table: Weight, tokens: &[u32], out: Buf) -> Result<()> {
        let mut s = self.script.lock().unwrap();
        s.fed.extend_from_slice(tokens);
        if tokens.len() == 1 && s.next.front() == Some(&tokens[0]) {
            s.next.pop_front();
        }
        drop(s);
        self.inner.embed(table, tokens, out)
    }
    fn rms_norm(
        &mut self,
        x: Buf,
        weight: Weight,
        out: Buf,
        n_tokens: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
    ) -> Result<()> {
        self.inner
            .rms_norm(x, weight, out, n_tokens, dim, eps, label)
    }
    fn matmul(&mut self, w: Weight, x: Buf, out: Buf, n: usize, label: OpLabel) -> Result<()> {
        self.inner.matmul(w, x, out, n, label)
    }
    fn matmul_qkv(
        &mut self,
        w: [Weight; 3],
        bias: [Option<Weight>; 3],
        x: Buf,
        out: [Buf; 3],
        n: usize,
        layer: u32,
    ) -> Result<()> {
        self.inner.matmul_qkv(w, bias, x, out, n, layer)
    }
    #[allow(clippy::too_many_arguments)]
    fn matmul_glu(
        &mut self,
        w_gate: Weight,
        w_up: Weight,
        x: Buf,
        gate: Buf,
        up: Buf,
        n: usize,
        ffn_dim: usize,
        act: Glu,
        layer: u32,
    ) -> Result<()> {
        self.inner
            .matmul_glu(w_gate, w_up, x, gate, up, n, ffn_dim, act, layer)
    }
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_add(
        &mut self,
        x: Buf,
        weight: Weight,
        acc: Buf,
        tmp: Buf,
        n: usize,
        dim: usize,
        eps: f32,
        label: OpLabel,
        add_label: OpLabel,
    ) -> Result<()> {
        self.inner
            .rms_norm_add(x, weight, acc, tmp, n, dim, eps, label, add_label)
    }
    #[allow(clippy::too_many_arguments)]
    fn matmul_add(
        &mut self,
        w: Weight,
        x: Buf,
        acc: Buf,
        tmp: Buf,
        n: usize,
        dim: usize,
        label: OpLabel,
        add_label: OpLabel,
    ) -> Result<()> {
        self.inner
            .matmul_add(w, x, acc, tmp, n, dim, label, add_label)
    }
    fn moe_ffn(&mut self, m: &MoeFfn) -> Result<()> {
        self.inner.moe_ffn(m)
    }
    fn add_bias(&mut self, x: Buf, bias: Weight, n: usize, label: OpLabel) -> Result<()> {
        self.inner.add_bias(x, bias, n, label)
    }
    fn rope(
        &mut self,
        x: Buf,
        row0: usize,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
        params: &RopeParams,
        label: OpLabel,
    ) -> Result<()> {
        self.inner
            .rope(x, row0, n_tokens, n_heads, head_dim, pos0, params, label)
    }
    fn attention(&mut self, q: Buf, k: Buf, v: Buf, out: Buf, p: &AttnParams) -> Result<()> {
        self.inner.attention(q, k, v, out, p)
    }
    fn rope_attention(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
        norms: &HeadNorms,
        rope: &RopeParams,
        p: &AttnParams,
    ) -> Result<()> {
        self.inner.rope_attention(q, k, v, out, norms, rope, p)
    }
    fn rope_attention_rows(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        out: Buf,
        norms: &HeadNorms,
        rope: &RopeParams,
        p: &AttnParams,
        rows: &[SeqPos],
    ) -> Result<()> {
        self.inner
            .rope_attention_rows(q, k, v, out, norms, rope, p, rows)
    }
    fn swiglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        self.inner.swiglu(gate, up, len, label)
    }
    fn geglu(&mut self, gate: Buf, up: Buf, len: usize, label: OpLabel) -> Result<()> {
        self.inner.geglu(gate, up, len, label)
    }
    fn scale(&mut self, x: Buf, len: usize, factor: f32, label: OpLabel) -> Result<()> {
        self.inner.scale(x, len, factor, label)
    }
    fn add(&mut self, acc: Buf, x: Buf, len: usize, label: OpLabel) -> Result<()> {
        self.inner.add(acc, x, len, label)
    }
    fn copy(&mut self, src: Buf, so: usize, dst: Buf, d_off: usize, len: usize) -> Result<()> {
        self.inner.copy(src, so, dst, d_off, len)
    }
    fn set_exact_rows_below(&mut self, rows: usize) {
        self.inner.set_exact_rows_below(rows)
    }
}

impl Memory for Scripted {
    fn plan(&mut self, plan: &MemoryPlan) -> Result<()> {
        self.inner.plan(plan)
    }
    fn plan_bytes(&self, plan: &MemoryPlan) -> Option<u64> {
        self.inner.plan_bytes(plan)
    }
    fn load_weight(&mut self, data: &WeightData) -> Result<Weight> {
        self.inner.load_weight(data)
    }
    fn alloc(&mut self, name: &'static str, len: usize) -> Result<Buf> {
        self.inner.alloc(name, len)
    }
    fn stage_weights(&mut self, data: &[WeightData]) -> Result<Vec<Weight>> {
        self.inner.stage_weights(data)
    }
    fn alloc_kv_cache(&mut self, layout: &KvLayout) -> Result<()> {
        self.inner.alloc_kv_cache(layout)
    }
    fn kv_rows_out(
        &mut self,
        layer: usize,
        seq: usize,
        pos: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        self.inner.kv_rows_out(layer, seq, pos, out)
    }
    fn kv_rows_in(&mut self, layer: usize, seq: usize, pos0: usize, data: &[u8]) -> Result<()> {
        self.inner.kv_rows_in(layer, seq, pos0, data)
    }
    fn pin_host(
        &mut self,
        storage: &hipscope::gpu::backend::SharedBytes,
        range: std::ops::Range<usize>,
    ) -> Result<bool> {
        self.inner.pin_host(storage, range)
    }
    fn kv_type(&self) -> KvType {
        self.inner.kv_type()
    }
    fn kv_shift(&mut self, s: &KvShift) -> Result<()> {
        self.inner.kv_shift(s)
    }
    fn read(&mut self, buf: Buf, offset: usize, out: &mut [f32]) -> Result<()> {
        self.inner.read(buf, offset, out)?;
        if out.len() == self.n_vocab
            && let Some(&t) = self.script.lock().unwrap().next.front()
        {
            // The scripted token far above every other: greedy or not, it is the one drawn.
            out.fill(-30.0);
            out[t as usize] = 30.0;
        }
        Ok(())
    }
    fn write(&mut self, buf: Buf, offset: usize, data: &[f32]) -> Result<()> {
        self.inner.write(buf, offset, data)
    }
    fn cross_out(&mut self, buf: Buf, out: &mut [f32], label: OpLabel) -> Result<()> {
        self.inner.cross_out(buf, out, label)
    }
    fn cross_in(&mut self, buf: Buf, data: &[f32], label: OpLabel) -> Result<()> {
        self.inner.cross_in(buf, data, label)
    }
    fn arena(&self) -> ArenaSnapshot {
        self.inner.arena()
    }
}

impl Instrument for Scripted {
    fn device(&self) -> DeviceSummary {
        self.inner.device()
    }
}

/// The synthetic model's tokenizer and template, as the worker will load them.
fn vocabulary() -> (Tokenizer, ChatTemplate) {
    let file = loader::open(&source(), &mut |_, _| {}).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let template = ChatTemplate::from_gguf(&file, &tok).unwrap();
    (tok, template)
}

fn start(tok: &Tokenizer, script: Arc<Mutex<Script>>) -> WorkerHandle {
    let n_vocab = tok.n_vocab();
    worker::spawn(WorkerOptions {
        source: Some(source()),
        default_model: Box::new(|_| Err("no default model in this test".into())),
        backend: Box::new(move |_watch, _, _| {
            Ok(Box::new(Scripted {
                inner: CpuBackend::new(2),
                n_vocab,
                script: script.clone(),
            }))
        }),
        load: LoadOptions {
            n_ctx: Some(512),
            n_batch: 64,
            sampler: SamplerConfig {
                // Not greedy: the script must win through the real sampler chain.
                temp: 0.8,
                n_predict: 200,
                seed: 7,
                ..SamplerConfig::default()
            },
            ..LoadOptions::default()
        },
        system: None,
        drain_deadline: Duration::from_secs(5),
        remote_poll: Duration::from_millis(500),
    })
}

/// One answer: (reasoning, answer, stats, why it ended), from the events as the UI gets them.
fn ask(w: &mut WorkerHandle, user: &str) -> (String, String, GenStats, StopReason) {
    w.commands
        .send(Command::Generate { user: user.into() })
        .unwrap();
    let seen = until(w, "answer", |e| matches!(e, Event::AnswerDone { .. }));
    let (mut reasoning, mut answer) = (String::new(), String::new());
    let mut answered = false;
    for e in &seen {
        match e {
            Event::Reasoning { text } => {
                assert!(!answered, "reasoning after the answer began: {seen:?}");
                reasoning.push_str(text);
            }
            Event::Token { text } => {
                answered = true;
                answer.push_str(text);
            }
            Event::Error { .. } => panic!("{seen:?}"),
            _ => {}
        }
    }
    match seen.last() {
        Some(Event::AnswerDone { stats, reason }) => {
            (reasoning, answer, stats.clone(), reason.clone())
        }
        _ => unreachable!(),
    }
}

#[test]
fn harmony_answer_is_split_stops_at_return_and_the_next_prompt_drops_the_analysis() {
    let (tok, template) = vocabulary();
    assert_eq!(
        ReasoningFormat::of(&template, &tok),
        ReasoningFormat::Harmony,
        "the synthetic gpt-oss's template and vocabulary say harmony"
    );
    let ids = |text: &str| tok.encode(text, false, true);
    let header = "<|channel|>analysis<|message|>The user greets. Reply briefly.<|end|>\
                  <|start|>assistant<|channel|>final<|message|>";
    let first = format!("{header}Hello **there**!<|return|>never shown");
    let second = "<|channel|>final<|message|>Again?<|call|>not shown either";
    let script = Arc::new(Mutex::new(Script::default()));
    script.lock().unwrap().next.extend(ids(&first));
    let mut w = start(&tok, script.clone());
    until(&mut w, "model", |e| matches!(e, Event::ModelLoaded { .. }));

    let (reasoning, answer, stats, reason) = ask(&mut w, "Hi");
    assert_eq!(reasoning, "The user greets. Reply briefly.");
    assert_eq!(answer, "Hello **there**!");
    // `<|return|>` ends it (an end-of-generation token) and is not shown; `<|end|>` between
    // the channels did not end it.
    assert_eq!(reason, StopReason::Eog);
    assert!(tok.is_eog(ids("<|return|>")[0]) && tok.is_eog(ids("<|call|>")[0]));
    assert!(!tok.is_eog(ids("<|end|>")[0]));
    let generated = ids(&format!("{header}Hello **there**!")).len();
    assert_eq!(stats.generated_tokens, generated);
    assert_eq!(stats.reasoning_tokens, ids(header).len());
    // `<|return|>` was drawn but never fed back; what follows it was never asked for.
    assert_eq!(
        tok.decode(
            &script.lock().unwrap().next.drain(..).collect::<Vec<_>>(),
            true
        ),
        "<|return|>never shown"
    );

    // The second prompt: the first answer goes back as its final channel, its analysis
    // dropped (what the template does with `thinking` in an earlier turn).
    script.lock().unwrap().fed.clear();
    script.lock().unwrap().next.extend(ids(second));
    let (reasoning, answer, stats, reason) = ask(&mut w, "Once more");
    let fed = tok.decode(&script.lock().unwrap().fed, true);
    // (What is fed: the prompt after whatever prefix the cache could keep — gpt-oss's sliding
    // layers may send it back to the start — then the second answer's tokens.)
    assert!(
        fed.contains("final<|message|>Hello **there**!<|end|><|start|>user<|message|>Once more<|end|><|start|>assistant"),
        "the second prompt after the cached prefix: {fed:?}"
    );
    assert!(!fed.contains("The user greets"), "{fed:?}");
    // `<|call|>` ends an answer too.
    assert_eq!((reasoning.as_str(), answer.as_str()), ("", "Again?"));
    assert_eq!(reason, StopReason::Eog);
    assert_eq!(stats.reasoning_tokens, 0);

    w.commands
        .send(Command::Quit {
            drain_deadline: Duration::from_secs(5),
        })
        .unwrap();
    until(&mut w, "exit", |e| matches!(e, Event::Exited { .. }));
}

/// A reopened answer with reasoning: the reasoning collapsed to its one line (without the
/// statistics the transcript's stats line carries, it counts words), Alt-T opens it, Alt-Y
/// copies the answer alone.
#[test]
fn a_resumed_answer_keeps_its_reasoning_collapsed() {
    let mut app = ui_common::loaded_app();
    app.restore_with_stats(
        &[hipscope::ui::state::Reopened {
            user: "2+2?".into(),
            reasoning: "Two plus two is four.".into(),
            answer: "4".into(),
            summary: None,
        }],
        None,
        "reopened 1 exchange",
    );
    let text = format!("{:?}", ui_common::draw(&app, 100, 30));
    assert!(
        text.contains("▸ reasoning · 5 words · Alt-T shows it"),
        "{text}"
    );
    assert!(!text.contains("Two plus two"), "{text}");
    app.update(ui_common::alt(crossterm::event::KeyCode::Char('t')));
    let text = format!("{:?}", ui_common::draw(&app, 100, 30));
    assert!(text.contains("┊ Two plus two is four."), "{text}");
    assert_eq!(app.chat.last_answer(), Some("4"));
}
