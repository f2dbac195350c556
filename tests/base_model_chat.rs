//! Issue 32 item 1: a model file without a chat template (a base model such as Gemma 3 270M) is
//! chatted in its architecture's own format when its vocabulary has that format's markers, as
//! llama.cpp's built-in template of that name writes it (checked against a real llama-server's
//! `/apply-template` and `/tokenize`), else as a plain continuation (as `llama-cli -no-cnv`); the
//! user is told which, and no other format's markers appear. llama-server itself prompts every
//! such file in ChatML, which is what hipscope did before: that is checked too, so the test
//! shows the difference it makes.
//!
//! The files are synthetic models of the real shapes with the template key removed; with
//! `HIPSCOPE_GEMMA_MODEL` set (the real Gemma 3 270M base GGUF), the real file is checked too.
//! The server comes from `HIPSCOPE_LLAMA_SERVER` (`scripts/test.sh` exports it); without it the
//! server test fails, it does not skip.

mod common;
mod pty;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hipscope::gpu::quant::GgmlType;
use hipscope::model::gguf::{GgufFile, GgufWriter, TensorSpec, Value};
use hipscope::model::synthetic;
use hipscope::model::template::{ChatTemplate, Format, Message};
use hipscope::model::tokenizer::Tokenizer;

/// A synthetic model of `shape` without `tokenizer.chat_template`, written under `dir`.
fn without_template(shape: &str, dir: &Path) -> PathBuf {
    let synth = synthetic::build(
        synthetic::shape(shape).unwrap(),
        GgmlType::F32,
        1,
        &mut |_, _| {},
    )
    .expect("synthetic model");
    let meta: Vec<(String, Value)> = synth
        .metadata()
        .iter()
        .filter(|(k, _)| k != "tokenizer.chat_template")
        .cloned()
        .collect();
    let specs: Vec<TensorSpec> = synth
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    let mut w = GgufWriter::new(Vec::new(), &meta, &specs).unwrap();
    for t in synth.tensors() {
        w.write_tensor(synth.tensor_data(t)).unwrap();
    }
    let path = dir.join(format!("{shape}-base.gguf"));
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    path
}

fn open(path: &Path) -> (GgufFile, Tokenizer) {
    let file = GgufFile::open(path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    (file, tok)
}

/// Conversations that exercise the format: a system prompt (merged into the first user turn),
/// whitespace that the built-in formats trim, several turns.
fn conversations() -> Vec<Vec<Message>> {
    vec![
        vec![Message::new("user", "What is the capital of France?")],
        vec![
            Message::new("system", "  Be brief. "),
            Message::new("user", "What is the capital of France?\n"),
            Message::new("assistant", " Paris."),
            Message::new("user", "And of Spain?"),
        ],
        vec![
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello! How can I help?"),
            Message::new("user", "Count to three."),
        ],
    ]
}

struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(model: &Path, extra: &[&str]) -> Server {
    let bin = std::env::var_os("HIPSCOPE_LLAMA_SERVER")
        .map(PathBuf::from)
        .expect(
            "HIPSCOPE_LLAMA_SERVER is not set: run the tests with scripts/test.sh, which builds \
             llama-server (scripts/test-assets.sh) and exports it",
        );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(bin)
        .arg("-m")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-c", "1024", "-t", "1", "--no-warmup"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("start llama-server");
    let s = Server {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let t = Instant::now();
    while !agent()
        .get(format!("{}/health", s.url))
        .call()
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "llama-server did not become healthy; its log:\n{}",
            std::fs::read_to_string(log.path()).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    s
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .new_agent()
}

fn post(s: &Server, path: &str, body: serde_json::Value) -> serde_json::Value {
    let mut resp = agent()
        .post(format!("{}{path}", s.url))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap();
    let text = resp.body_mut().read_to_string().unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
}

fn json_messages(m: &[Message]) -> serde_json::Value {
    m.iter()
        .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
        .collect()
}

/// Our prompt for each conversation is llama-server's with `--chat-template NAME` (its built-in
/// template of that name, not Jinja), text and tokens.
fn same_as_llama_server(model: &Path, name: &str, t: &ChatTemplate, tok: &Tokenizer) {
    let server = start_server(model, &["--no-jinja", "--chat-template", name]);
    for conv in conversations() {
        let want = post(
            &server,
            "/apply-template",
            serde_json::json!({ "messages": json_messages(&conv) }),
        );
        let want = want["prompt"].as_str().expect("a prompt").to_string();
        assert_eq!(t.render(&conv, true).unwrap(), want, "{conv:?}");
        let ids: Vec<u32> = post(
            &server,
            "/tokenize",
            serde_json::json!({"content": want, "add_special": true, "parse_special": true}),
        )["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(t.prompt_tokens(tok, &conv, true).unwrap(), ids, "{conv:?}");
    }
}

#[test]
fn a_gemma_file_without_a_template_chats_in_gemmas_format_as_llama_cpp_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = vec![without_template("tiny-gemma3", dir.path())];
    if let Some(real) = std::env::var_os("HIPSCOPE_GEMMA_MODEL") {
        files.push(PathBuf::from(real));
    }
    for path in files {
        let (file, tok) = open(&path);
        assert!(file.get("tokenizer.chat_template").is_none());
        let (t, note) = ChatTemplate::for_chat(&file, &tok);
        assert_eq!(
            t.builtin_format(),
            Some(Format::Gemma),
            "{}",
            path.display()
        );
        let note = note.expect("the user is told");
        assert!(
            note.contains("has no chat template") && note.contains("<start_of_turn>"),
            "{note}"
        );
        // No ChatML anywhere in the prompt.
        let prompt = t.render(&conversations()[1], true).unwrap();
        assert!(!prompt.contains("<|im_"), "{prompt}");
        // A generated `<start_of_turn>` could only open another turn: the answer ends there,
        // as at `<end_of_turn>` (an end-of-generation token).
        let start = tok.token_id("<start_of_turn>").unwrap();
        assert_eq!(t.stop_tokens(&tok), [start]);
        assert!(tok.is_eog(tok.token_id("<end_of_turn>").unwrap()));
        same_as_llama_server(&path, "gemma", &t, &tok);
    }
}

/// What llama-server does with the same file: ChatML, whose markers are not tokens of this
/// vocabulary (they are cut into ordinary pieces); hipscope did the same before.
#[test]
fn llama_server_itself_prompts_a_gemma_file_without_a_template_in_chatml() {
    let dir = tempfile::tempdir().unwrap();
    let path = without_template("tiny-gemma3", dir.path());
    let (_, tok) = open(&path);
    assert!(tok.token_id("<|im_start|>").is_none());
    let server = start_server(&path, &[]);
    let got = post(
        &server,
        "/apply-template",
        serde_json::json!({ "messages": json_messages(&conversations()[0]) }),
    );
    assert_eq!(
        got["prompt"],
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn a_file_whose_vocabulary_has_chatml_markers_gets_chatml_as_llama_server_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = without_template("tiny-qwen2", dir.path());
    let (file, tok) = open(&path);
    let (t, note) = ChatTemplate::for_chat(&file, &tok);
    assert_eq!(t.builtin_format(), Some(Format::ChatMl));
    assert!(note.expect("told").contains("ChatML"));
    same_as_llama_server(&path, "chatml", &t, &tok);
}

/// A vocabulary without any known format's markers (Phi-3's `<|user|>` is not one hipscope
/// writes without a template): the conversation is one text the model continues, as
/// llama-completion runs a model without a template (conversation mode off).
#[test]
fn a_file_without_known_markers_is_a_plain_continuation() {
    let dir = tempfile::tempdir().unwrap();
    let path = without_template("tiny-phi3", dir.path());
    let (file, tok) = open(&path);
    let (t, note) = ChatTemplate::for_chat(&file, &tok);
    assert_eq!(t.builtin_format(), Some(Format::Plain));
    assert!(note.expect("told").contains("plain completion"));
    let conv = [Message::new("user", "Once upon a time")];
    assert_eq!(t.render(&conv, true).unwrap(), "Once upon a time");
    assert_eq!(
        t.prompt_tokens(&tok, &conv, true).unwrap(),
        tok.encode("Once upon a time", true, true)
    );
    // A system prompt goes first, then a blank line; the answer continues the text.
    let conv = [
        Message::new("system", "A story."),
        Message::new("user", "Once"),
        Message::new("assistant", " upon"),
        Message::new("user", " a time"),
    ];
    assert_eq!(
        t.render(&conv, true).unwrap(),
        "A story.\n\nOnce upon a time"
    );
    assert!(t.stop_tokens(&tok).is_empty());
}

/// Through the binary: `generate --chat` says on stderr that the file has no template and which
/// format it chats in, and prints no marker of another format.
#[test]
fn generate_chat_says_the_file_has_no_template() {
    let dir = tempfile::tempdir().unwrap();
    let path = without_template("tiny-gemma3", dir.path());
    let out = common::hipscope()
        .args([
            "generate",
            "--chat",
            "--backend",
            "cpu",
            "-n",
            "8",
            "--temp",
            "0",
        ])
        .arg("-m")
        .arg(&path)
        .args(["-p", "Hi"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("tiny-gemma3-base.gguf has no chat template")
            && stderr.contains("Gemma's turn format"),
        "{stderr}"
    );
    assert!(!stdout.contains("<|im_"), "{stdout}");
}

/// The chat in a terminal: the notice is on the screen once the model is loaded (a notice, not
/// an error: the model is there and answers).
#[test]
fn the_chat_says_the_file_has_no_template() {
    let dir = tempfile::tempdir().unwrap();
    let path = without_template("tiny-gemma3", dir.path());
    let home = tempfile::tempdir().unwrap();
    let mut s = pty::Session::start_model(home.path(), &path, &["-n", "4"]);
    s.sees("has no chat template", pty::LOAD);
    let flat = pty::flat(&s.contents());
    assert!(flat.contains("Gemma's turn format"), "{flat}");
    s.type_line("Hi");
    // Answered, up to -n 4 tokens: the stats line under the answer.
    s.sees("gen ", pty::ANSWER);
    s.send(b"\x04");
    assert_eq!(s.wait(std::time::Duration::from_secs(30)), 0);
}
