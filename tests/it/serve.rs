//! `hipscope serve`: the multi-sequence forward pass against the single-sequence one, the
//! scheduler's continuous batching, and the HTTP endpoint with real clients (curl, the official
//! `openai` Python package, hipscope's own `chat --remote` / `top --remote`).
//!
//! (Over 700 lines on purpose: one feature's integration tests beside the helpers they share — a
//! server per test, the HTTP and curl wrappers — which a split would only move apart.)

use crate::common;

use std::sync::Arc;

use hipscope::gpu::cpu::CpuBackend;
use hipscope::model::forward::{Logits, Model, ModelOptions, SeqChunk};
use hipscope::model::gguf::GgufFile;
use hipscope::model::tokenizer::Tokenizer;

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn smollm2_model(n_seq: usize, n_batch: usize) -> (Model, Tokenizer) {
    let file = Arc::new(GgufFile::open(&common::smollm2()).expect("open SmolLM2"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let opts = ModelOptions {
        n_ctx: 256,
        n_batch,
        all_logits: false,
        n_seq,
    };
    let m = Model::load(file, Box::new(CpuBackend::new(2)), opts, &mut |_, _| {}).expect("load");
    (m, tok)
}

/// Greedy tokens of one prompt through the single-sequence path (sequence 0, one batch for the
/// prompt, one token a step).
fn alone(m: &mut Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut logits = Vec::new();
    m.forward(prompt, 0, Logits::Last, &mut logits)
        .expect("prompt");
    let mut out = vec![argmax(&logits)];
    while out.len() < n {
        let pos = prompt.len() + out.len() - 1;
        m.forward(&out[out.len() - 1..], pos, Logits::Last, &mut logits)
            .expect("decode");
        out.push(argmax(&logits));
    }
    out
}

/// Several prompts of different lengths through `forward_seqs` as the scheduler runs them: the
/// prompts cut into chunks in a batch of their own, every decode step one batch of all the
/// sequences still generating, products of fewer rows than the slots + 1 on the one-row kernels
/// (`set_exact_rows_below`, as `hipscope serve` sets it). Each sequence's greedy tokens must be
/// exactly those it gets alone through the single-sequence path.
#[test]
fn batched_sequences_give_each_ones_own_greedy_tokens() {
    let prompts = [
        "The capital of France is",
        "Write a haiku about the sea. The waves",
        "1, 2, 3, 4, 5,",
        "Once upon a time, in a land far away, there lived a dragon who",
    ];
    const N: usize = 24;
    // Four slots: products of up to four rows are exact, as in `hipscope serve --parallel 4`.
    let exact = prompts.len() + 1;
    let (mut single, tok) = smollm2_model(1, 64);
    single.set_exact_rows_below(exact);
    let toks: Vec<Vec<u32>> = prompts.iter().map(|p| tok.encode(p, true, false)).collect();
    let want: Vec<Vec<u32>> = toks.iter().map(|t| alone(&mut single, t, N)).collect();
    drop(single);

    let (mut m, _) = smollm2_model(prompts.len(), 64);
    m.set_exact_rows_below(exact);
    let vocab = m.config.vocab_size;
    // Per sequence: prompt tokens done, generated tokens.
    let mut done = vec![0usize; prompts.len()];
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut logits = Vec::new();
    // Sequence s arrives at step 2s (while the others decode); prompts go in chunks of 6, a
    // rest shorter than `exact` with the chunk before it (the scheduler's rule).
    for step in 0..200 {
        let mut decode = Vec::new();
        let mut prefill = Vec::new();
        for (s, t) in toks.iter().enumerate() {
            if step < 2 * s || got[s].len() >= N {
                continue;
            }
            if done[s] < t.len() {
                let left = t.len() - done[s];
                let mut n = left.min(6);
                if left - n < exact {
                    n = left;
                }
                prefill.push((s, done[s], t[done[s]..done[s] + n].to_vec(), n == left));
            } else {
                let g = &got[s];
                decode.push((s, t.len() + g.len() - 1, vec![g[g.len() - 1]], true));
            }
        }
        if decode.is_empty() && prefill.is_empty() {
            break;
        }
        for batch in [decode, prefill] {
            if batch.is_empty() {
                continue;
            }
            let chunks: Vec<SeqChunk> = batch
                .iter()
                .map(|(s, pos0, t, l)| SeqChunk {
                    seq: *s,
                    pos0: *pos0,
                    tokens: t,
                    logits: *l,
                })
                .collect();
            m.forward_seqs(&chunks, &mut logits).expect("batch");
            let mut row = 0;
            for (s, _, t, wants) in &batch {
                if done[*s] < toks[*s].len() {
                    done[*s] += t.len();
                }
                if *wants {
                    got[*s].push(argmax(&logits[row * vocab..(row + 1) * vocab]));
                    row += 1;
                }
            }
            assert_eq!(
                row * vocab,
                logits.len(),
                "one logits row per chunk that asked"
            );
        }
    }
    for (s, p) in prompts.iter().enumerate() {
        assert_eq!(
            got[s],
            want[s],
            "{p:?}: batched {:?} vs alone {:?}",
            tok.decode(&got[s], false),
            tok.decode(&want[s], false)
        );
    }
}

/// Qwen 3's per-head Q/K norms in a batch of several sequences: the forward pass normalizes the
/// whole batch before its groups (a group's rope_attention sees rows from its own row0), so each
/// sequence's logits and greedy tokens must be those it gets alone, where the norms go with the
/// rotation (a batch that skipped them was 0.56 off in 3.9 at the first step).
#[test]
fn batched_sequences_with_head_norms_give_each_its_own_logits() {
    use hipscope::model::loader;
    use hipscope::model::protocol::ModelSource;
    let load = |n_seq| {
        let file = loader::open(
            &ModelSource::Synthetic {
                shape: "tiny-qwen3".into(),
                quant: "Q8_0".into(),
                seed: 5,
            },
            &mut |_, _| {},
        )
        .expect("synthetic qwen3");
        let opts = ModelOptions {
            n_ctx: 64,
            n_batch: 16,
            all_logits: false,
            n_seq,
        };
        let mut m =
            Model::load(file, Box::new(CpuBackend::new(2)), opts, &mut |_, _| {}).expect("load");
        m.set_exact_rows_below(3);
        m
    };
    let prompts: [&[u32]; 2] = [&[3, 17, 42, 9, 100], &[7, 7, 250, 31]];
    const N: usize = 6;
    // Alone: each sequence's greedy tokens and every step's logits.
    let mut single = load(1);
    let mut want: Vec<Vec<u32>> = Vec::new();
    let mut want_logits: Vec<Vec<Vec<f32>>> = Vec::new();
    for p in prompts {
        let mut l = Vec::new();
        single.forward(p, 0, Logits::Last, &mut l).expect("prompt");
        let mut toks = vec![argmax(&l)];
        let mut steps = vec![l.clone()];
        while toks.len() < N {
            let pos = p.len() + toks.len() - 1;
            single
                .forward(&toks[toks.len() - 1..], pos, Logits::Last, &mut l)
                .expect("decode");
            toks.push(argmax(&l));
            steps.push(l.clone());
        }
        want.push(toks);
        want_logits.push(steps);
    }
    drop(single);
    let mut m = load(2);
    let vocab = m.config.vocab_size;
    let mut logits = Vec::new();
    // Both prompts in one batch, then each decode step one batch of both sequences.
    let chunks: Vec<SeqChunk> = prompts
        .iter()
        .enumerate()
        .map(|(s, p)| SeqChunk {
            seq: s,
            pos0: 0,
            tokens: p,
            logits: true,
        })
        .collect();
    m.forward_seqs(&chunks, &mut logits).expect("prompts");
    let mut got: Vec<Vec<u32>> = (0..2)
        .map(|s| vec![argmax(&logits[s * vocab..(s + 1) * vocab])])
        .collect();
    // Each step's logits as the sequence's own (a skipped norm moves them, even where the
    // greedy token survives).
    let close = |a: &[f32], b: &[f32], at: &str| {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 1e-5 * scale,
            "{at}: logits differ by {worst} (scale {scale})"
        );
    };
    for s in 0..2 {
        close(
            &logits[s * vocab..(s + 1) * vocab],
            &want_logits[s][0],
            &format!("seq {s} prompt"),
        );
    }
    while got[0].len() < N {
        let last: Vec<[u32; 1]> = got.iter().map(|g| [g[g.len() - 1]]).collect();
        let chunks: Vec<SeqChunk> = (0..2)
            .map(|s| SeqChunk {
                seq: s,
                pos0: prompts[s].len() + got[s].len() - 1,
                tokens: &last[s],
                logits: true,
            })
            .collect();
        m.forward_seqs(&chunks, &mut logits).expect("decode");
        for (s, g) in got.iter_mut().enumerate() {
            let row = &logits[s * vocab..(s + 1) * vocab];
            close(
                row,
                &want_logits[s][g.len()],
                &format!("seq {s} step {}", g.len()),
            );
            g.push(argmax(row));
        }
    }
    assert_eq!(got, want);
}

/// A sequence past the cache's count, or twice in one batch, is refused before anything runs.
#[test]
fn forward_seqs_refuses_bad_batches() {
    let (mut m, _) = smollm2_model(2, 16);
    let t = [1u32, 2, 3];
    let mut out = Vec::new();
    let bad_seq = [SeqChunk {
        seq: 2,
        pos0: 0,
        tokens: &t,
        logits: true,
    }];
    assert!(m.forward_seqs(&bad_seq, &mut out).is_err());
    let twice = [
        SeqChunk {
            seq: 0,
            pos0: 0,
            tokens: &t,
            logits: true,
        },
        SeqChunk {
            seq: 0,
            pos0: 3,
            tokens: &t,
            logits: true,
        },
    ];
    assert!(m.forward_seqs(&twice, &mut out).is_err());
    let big = vec![1u32; 17];
    let too_many = [SeqChunk {
        seq: 1,
        pos0: 0,
        tokens: &big,
        logits: true,
    }];
    assert!(m.forward_seqs(&too_many, &mut out).is_err());
}

// ---- The HTTP endpoint, as clients use it -----------------------------------------------------

mod http {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use serde_json::{Value, json};

    use super::common;

    pub struct Server {
        pub child: Child,
        pub url: String,
        /// stderr lines after the start line (the per-request log).
        pub lines: mpsc::Receiver<String>,
        pub home: tempfile::TempDir,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// `hipscope serve` on the real model, CPU, port 0; waits for its "serving … on URL" line.
    pub fn start(extra: &[&str]) -> Server {
        start_env(extra, &[])
    }

    /// As [`start`], with these environment variables.
    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let home = tempfile::tempdir().unwrap();
        let mut child = common::hipscope()
            .env("HIPSCOPE_HOME", home.path())
            .envs(env.iter().copied())
            .args([
                "serve",
                "--headless",
                "--backend",
                "cpu",
                "-t",
                "2",
                "--port",
                "0",
            ])
            .arg("-m")
            .arg(common::smollm2())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start hipscope serve");
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        let t = Instant::now();
        let mut seen = Vec::new();
        loop {
            let left = Duration::from_secs(120).saturating_sub(t.elapsed());
            match rx.recv_timeout(left) {
                Ok(l) => {
                    if let Some(i) = l.find(" on http://") {
                        let url = l[i + 4..].split_whitespace().next().unwrap().to_string();
                        return Server {
                            child,
                            url,
                            lines: rx,
                            home,
                        };
                    }
                    seen.push(l);
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("hipscope serve did not start; stderr:\n{}", seen.join("\n"))
                }
            }
        }
    }

    pub fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .new_agent()
    }

    pub fn get(url: &str, path: &str) -> (u16, String) {
        let mut r = agent().get(format!("{url}{path}")).call().unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    }

    pub fn post_raw(url: &str, path: &str, body: Vec<u8>) -> (u16, Value, Option<String>) {
        let mut r = agent()
            .post(format!("{url}{path}"))
            .header("Content-Type", "application/json")
            .send(&body[..])
            .unwrap();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v, retry)
    }

    pub fn post(url: &str, path: &str, body: Value) -> (u16, Value) {
        let (s, v, _) = post_raw(url, path, body.to_string().into_bytes());
        (s, v)
    }

    /// Waits (polling /slots) until no slot is processing.
    pub fn until_idle(url: &str) {
        let t = Instant::now();
        loop {
            let (_, b) = get(url, "/slots");
            let v: Value = serde_json::from_str(&b).unwrap();
            if v.as_array()
                .unwrap()
                .iter()
                .all(|s| s["is_processing"] == false)
            {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "slots stay busy: {b}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn chat(content: &str, max_tokens: u32, stream: bool) -> Value {
        json!({
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
        })
    }

    /// A streaming request on a raw socket: reads until `bytes` bytes of the answer came, then
    /// drops the connection mid-stream.
    pub fn leave_mid_stream(url: &str, bytes: usize) {
        let addr = url.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr).unwrap();
        let body = chat("Count from one to one hundred in words.", 400, true).to_string();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut got = vec![0u8; bytes];
        s.read_exact(&mut got).unwrap();
        assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    }

    pub fn curl(args: &[&str]) -> (String, String) {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "120"])
            .args(args)
            .output()
            .expect("curl (apt-get install curl)");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

use http::*;
use serde_json::{Value, json};

/// curl, streaming and not; the model list, health, metrics under llama-server's names; bad
/// input of every kind answered with its status and the server still healthy after each.
#[test]
fn serve_answers_curl_and_refuses_bad_input_with_the_right_status() {
    let s = start(&["--parallel", "2", "-c", "1024", "--max-queue", "1"]);
    let (code, body) = get(&s.url, "/health");
    assert_eq!((code, body.contains("ok")), (200, true), "{body}");
    let (_, models) = get(&s.url, "/v1/models");
    let m: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(m["data"][0]["owned_by"], "hipscope");

    // curl, not streaming: a whole chat.completion with usage.
    let body = chat("What is the capital of France?", 8, false).to_string();
    let (out, err) = curl(&[
        &format!("{}/v1/chat/completions", s.url),
        "-H",
        "Content-Type: application/json",
        "-d",
        &body,
    ]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    assert_eq!(v["object"], "chat.completion");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty(), "{v}");
    let u = &v["usage"];
    assert!(u["prompt_tokens"].as_u64().unwrap() > 5, "{v}");
    assert!(
        (1..=8).contains(&u["completion_tokens"].as_u64().unwrap()),
        "{v}"
    );
    // The same prompt again, its prefix from the slot's cache.
    let cached_asking = || {
        let (_, v) = post(
            &s.url,
            "/v1/chat/completions",
            chat("What is the capital of France?", 8, false),
        );
        assert!(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
                > 0,
            "{v}"
        );
        v
    };
    let again = cached_asking();
    // Greedy is deterministic along the same path: a third asking, served from the cache as the
    // second was, answers as the second did. (The first answer may differ at a near-tie: its
    // prompt's last token went through the products with the whole prompt, on the CPU's packed
    // kernel, where a cache hit reads that token alone on the row kernel, which rounds its sums
    // otherwise; llama-server's prompt cache behaves the same.)
    let third = cached_asking();
    assert_eq!(
        third["choices"][0]["message"]["content"], again["choices"][0]["message"]["content"],
        "greedy is deterministic"
    );

    // curl, streaming: chunks, then [DONE]; the text is the same as unstreamed.
    let body = chat("What is the capital of France?", 8, true).to_string();
    let (out, _) = curl(&[
        "-N",
        &format!("{}/v1/chat/completions", s.url),
        "-H",
        "Content-Type: application/json",
        "-d",
        &body,
    ]);
    let datas: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(datas.last(), Some(&"[DONE]"), "{out}");
    let streamed: String = datas[..datas.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    // Served from the cache as the second and third were.
    assert_eq!(streamed, again["choices"][0]["message"]["content"]);

    // /v1/completions with raw text.
    let (code, c) = post(
        &s.url,
        "/v1/completions",
        json!({"prompt": "1, 2, 3, 4,", "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(code, 200, "{c}");
    assert_eq!(c["object"], "text_completion");
    assert!(
        c["choices"][0]["text"].as_str().unwrap().contains('5'),
        "{c}"
    );

    // Bad input: each answered with its status, as an OpenAI error object.
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("malformed JSON", b"{\"messages\": [".to_vec(), 400),
        (
            "unknown field",
            br#"{"messages":[{"role":"user","content":"hi"}],"frobnicate":true}"#.to_vec(),
            400,
        ),
        ("no messages", br#"{"messages":[]}"#.to_vec(), 400),
        (
            "max_tokens past the limit",
            br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":100000000}"#.to_vec(),
            400,
        ),
    ];
    for (what, body, want) in cases {
        let (code, v, _) = post_raw(&s.url, "/v1/chat/completions", body);
        assert_eq!(code, want, "{what}: {v}");
        assert!(v["error"]["message"].is_string(), "{what}: {v}");
        assert_eq!(get(&s.url, "/health").0, 200, "healthy after {what}");
    }
    // A 20 MB body, sent by curl (which reads the early answer): 413.
    let big = s.home.path().join("big.json");
    std::fs::write(&big, vec![b' '; 20 << 20]).unwrap();
    let (out, err) = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("{}/v1/chat/completions", s.url),
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &format!("@{}", big.display()),
    ]);
    assert_eq!(out.trim(), "413", "{err}");
    assert_eq!(get(&s.url, "/health").0, 200, "healthy after a 20 MB body");
    let long = "word ".repeat(2000);
    let (code, v) = post(&s.url, "/v1/chat/completions", chat(&long, 4, false));
    assert_eq!(code, 400, "a prompt longer than a slot: {v}");
    assert_eq!(get(&s.url, "/nope").0, 404);
    assert_eq!(get(&s.url, "/v1/chat/completions").0, 405);

    // A client that leaves mid-stream frees its slot; the next request is served.
    leave_mid_stream(&s.url, 400);
    until_idle(&s.url);
    let (code, _) = post(&s.url, "/v1/chat/completions", chat("hi", 4, false));
    assert_eq!(code, 200);

    // More clients than slots + queue: 2 slots, 1 queued, the rest 503 with Retry-After.
    let results: Vec<(u16, Option<String>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                sc.spawn(|| {
                    let b = chat("Write a long story about a dragon.", 48, false).to_string();
                    let (c, _, r) = post_raw(&s.url, "/v1/chat/completions", b.into_bytes());
                    (c, r)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let busy: Vec<_> = results.iter().filter(|r| r.0 == 503).collect();
    assert!(ok >= 2, "{results:?}");
    assert!(
        !busy.is_empty(),
        "6 clients on 2 slots and a queue of 1: {results:?}"
    );
    assert!(
        busy.iter().all(|r| r.1.as_deref() == Some("1")),
        "{results:?}"
    );
    assert_eq!(ok + busy.len(), 6, "{results:?}");
    until_idle(&s.url);

    // /metrics reads under llama-server's names through hipscope's own parser.
    let (_, page) = get(&s.url, "/metrics");
    let m = hipscope::model::remote::prom::Metrics::parse(&page).unwrap();
    assert!(
        m.sum("llamacpp:tokens_predicted_total").unwrap() >= 8.0,
        "{page}"
    );
    assert_eq!(m.sum("llamacpp:requests_processing"), Some(0.0), "{page}");
    // One log line per request, without the prompt's text.
    let log: Vec<String> = s.lines.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("-> 413")), "{log:?}");
    assert!(log.iter().any(|l| l.contains("-> 200 length")), "{log:?}");
    assert!(
        !log.iter().any(|l| l.contains("capital of France")),
        "{log:?}"
    );
}

/// Concurrent greedy requests through the HTTP server's batched steps give each the answer it
/// gets alone (the engine test above, end to end).
#[test]
fn concurrent_greedy_requests_answer_as_each_alone() {
    let s = start(&["--parallel", "4", "-c", "2048"]);
    let prompts = [
        "Name three colours.",
        "What is two plus two?",
        "Write one sentence about the moon.",
        "Say hello in French.",
    ];
    let alone: Vec<Value> = prompts
        .iter()
        .map(|p| post(&s.url, "/v1/chat/completions", chat(p, 24, false)).1)
        .collect();
    // Fresh slots for the concurrent run: other prompts in between evict nothing (4 slots), so
    // the second run reuses cached prefixes; the answers must not change either way.
    let together: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| sc.spawn(|| post(&s.url, "/v1/chat/completions", chat(p, 24, false)).1))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((p, a), t) in prompts.iter().zip(&alone).zip(&together) {
        assert_eq!(
            a["choices"][0]["message"]["content"], t["choices"][0]["message"]["content"],
            "{p}"
        );
    }
    let (_, page) = get(&s.url, "/metrics");
    let m = hipscope::model::remote::prom::Metrics::parse(&page).unwrap();
    // Steps ran several slots at once.
    let per = m.sum("llamacpp:n_busy_slots_per_decode").unwrap();
    assert!(per > 1.0, "{page}");
}

/// The official `openai` Python package, streaming and not.
#[test]
fn the_openai_python_package_talks_to_serve() {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import openai; print(openai.__version__)"])
        .output()
        .expect("python3");
    assert!(
        probe.status.success(),
        "the `openai` Python package is needed (pip install openai; scripts/setup.sh installs it): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let s = start(&["--parallel", "2", "-c", "1024"]);
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
model = c.models.list().data[0].id
r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                              max_tokens=8, temperature=0, seed=1)
whole = r.choices[0].message.content
assert r.usage.completion_tokens >= 1, r
parts = []
usage = None
for ch in c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                    max_tokens=8, temperature=0, stream=True,
                                    stream_options={"include_usage": True}):
    if ch.usage:
        usage = ch.usage
    for choice in ch.choices:
        if choice.delta.content:
            parts.append(choice.delta.content)
assert "".join(parts) == whole, ("".join(parts), whole)
assert usage and usage.completion_tokens == r.usage.completion_tokens, usage
t = c.completions.create(model=model, prompt="1, 2, 3,", max_tokens=4, temperature=0)
assert t.choices[0].text, t
try:
    c.chat.completions.create(model=model, messages=[], max_tokens=4)
    raise SystemExit("an empty message list was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
print("OK", repr(whole))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &s.url])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && so.starts_with("OK"),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// hipscope's own clients read `hipscope serve` as they read llama-server: `generate --remote`
/// (the chat's remote session) answers, `top --remote --json` shows the slots and health.
#[test]
fn hipscopes_own_remote_clients_read_serve() {
    let s = start(&["--parallel", "2", "-c", "1024"]);
    let out = common::hipscope()
        .env("HIPSCOPE_HOME", s.home.path())
        .args([
            "generate", "--remote", &s.url, "-p", "Say hi.", "-n", "6", "--temp", "0",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
    let out = common::hipscope()
        .env("HIPSCOPE_HOME", s.home.path())
        .args(["top", "--remote", &s.url, "--json", "--count", "1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(v["server"], "llama-server", "{v}");
    assert_eq!(v["health"], "ok", "{v}");
    assert_eq!(v["slots"].as_array().map(|s| s.len()), Some(2), "{v}");
}

/// Another address than loopback without a key: refused before anything is bound (exit 2).
/// With a key: requests without it are 401, with it 200; the key is in no log line.
#[test]
fn keys_guard_the_endpoint_and_non_loopback_needs_one() {
    let home = tempfile::tempdir().unwrap();
    let out = common::hipscope()
        .env("HIPSCOPE_HOME", home.path())
        .args([
            "serve",
            "--headless",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "-m",
        ])
        .arg(common::smollm2())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--api-key-file"), "{err}");

    let key = "k3y-0123456789abcdef-long-enough";
    let kf = home.path().join("key");
    std::fs::write(&kf, format!("{key}\n")).unwrap();
    let s = start(&[
        "--parallel",
        "1",
        "-c",
        "512",
        "--api-key-file",
        kf.to_str().unwrap(),
    ]);
    let (code, _) = post(&s.url, "/v1/chat/completions", chat("hi", 2, false));
    assert_eq!(code, 401);
    assert_eq!(get(&s.url, "/health").0, 200, "health needs no key");
    let mut r = agent()
        .post(format!("{}/v1/chat/completions", s.url))
        .header("Authorization", format!("Bearer {key}"))
        .send(chat("hi", 2, false).to_string())
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.body_mut().read_to_string().unwrap()
    );
    let log: Vec<String> = s.lines.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("-> 401")), "{log:?}");
    assert!(!log.iter().any(|l| l.contains(key)), "{log:?}");
}

/// SIGTERM: intake stops, the request in flight ends, the process leaves 0 within the quit's
/// deadline.
#[test]
fn sigterm_drains_and_exits_within_the_deadline() {
    let mut s = start(&["--parallel", "1", "-c", "512"]);
    let url = s.url.clone();
    let h = std::thread::spawn(move || {
        post(
            &url,
            "/v1/chat/completions",
            chat("Tell me a story.", 32, false),
        )
    });
    // The request is in its slot before the signal.
    let t = std::time::Instant::now();
    loop {
        let (_, b) = get(&s.url, "/slots");
        if b.contains("\"is_processing\":true") {
            break;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "{b}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let t = std::time::Instant::now();
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(8),
            "no exit after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let (code, v) = h.join().unwrap();
    // Finished in time (200), or told the server was shutting down (a clean error object).
    assert!(
        code == 200 || v["error"]["message"].is_string(),
        "{code} {v}"
    );
}

/// A decode step that hangs (HIPSCOPE_FAULT=hang:decode:15: the CPU backend holds an op for 15
/// seconds, HUNG after two): the watchdog calls it HUNG, the request in that step fails with an
/// error naming the request and the op, `/health` keeps answering, and when the op returns the
/// server serves again.
#[test]
fn a_hung_step_fails_its_request_naming_the_op_and_the_server_goes_on() {
    let s = start_env(
        &["--parallel", "1", "-c", "512"],
        &[("HIPSCOPE_FAULT", "hang:decode:15")],
    );
    let url = s.url.clone();
    let t = std::time::Instant::now();
    let (code, v) = post(&url, "/v1/chat/completions", chat("hi", 8, false));
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(code, 500, "{v}");
    assert!(
        msg.contains("request 1") && msg.contains("stuck op"),
        "{msg}"
    );
    // Before the op returns: the error came from the watchdog, not from the op's end.
    assert!(
        t.elapsed() < std::time::Duration::from_secs(15),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(
        get(&url, "/health").0,
        200,
        "the server answers during the hang"
    );
    // The op returns after its hold; the slot was freed and the next request is served.
    let (code, v) = post(&url, "/v1/chat/completions", chat("hi", 4, false));
    assert_eq!(code, 200, "{v}");
}
