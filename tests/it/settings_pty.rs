//! Settings in the chat, through the binary in a pseudo-terminal with the real model: `/set save`
//! writes through a symlinked config.toml and keeps only what `/set` changed (issue 31 item 5);
//! `-c 0` and `/set ctx 0` mean the model's whole trained context, as in `generate` (issue 32
//! item 5); `--resume` of a conversation made with another model loads that model, or says
//! why it cannot (issue 32 item 6).

use crate::pty;

use std::path::Path;
use std::time::{Duration, Instant};

use hipscope::app::config::Config;
use hipscope::app::transcript::{self, Transcript};
use pty::*;

const NOTICE: Duration = Duration::from_secs(10);

fn quit(s: &mut Session) {
    s.send(b"\x03\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
}

fn header(s: &Session) -> String {
    s.contents().lines().next().unwrap_or_default().to_string()
}

/// Waits until the header shows a context of `n` tokens (`ctx ▊░░░░ used/n`).
fn sees_context(s: &Session, n: &str) {
    let start = Instant::now();
    while !header(s).contains(&format!("/{n} ")) {
        assert!(start.elapsed() < ANSWER, "no /{n} in {:?}", header(s));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The trained context of the test model, as `hipscope info` says it, with thousands grouped as
/// the header groups them.
fn trained_context() -> String {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_hipscope"))
        .arg("info")
        .arg(model())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let n: u64 = text
        .split("trained context ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .expect(&text);
    assert!(
        n > 4096,
        "the test needs a model trained on more than 4096 tokens"
    );
    hipscope::ui::units::count(n)
}

#[test]
fn issue31_item5_set_save_writes_through_a_link_and_only_what_set_changed() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let dotfiles = h.join("dotfiles");
    std::fs::create_dir_all(&dotfiles).unwrap();
    std::fs::create_dir_all(h.join("config")).unwrap();
    let target = dotfiles.join("hipscope.toml");
    std::fs::write(&target, "# my dotfiles\n[sampler]\ntop_k = 7\n").unwrap();
    let link = h.join("config/config.toml");
    std::os::unix::fs::symlink("../dotfiles/hipscope.toml", &link).unwrap();

    let mut s = Session::start(h, &["-n", "16"]);
    sees_loaded(&s);
    s.type_line("/set top_p 0.5");
    s.type_line("/set save");
    s.sees("kept the sampler settings", NOTICE);
    quit(&mut s);

    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced by a file"
    );
    let text = std::fs::read_to_string(&target).unwrap();
    assert!(text.starts_with("# my dotfiles\n"), "{text}");
    let c = Config::load(&target).unwrap();
    assert_eq!(c.sampler.top_p, 0.5);
    assert_eq!(c.sampler.top_k, 7, "{text}");
    // `-n 16` and `--temp 0` came from the command line, not from /set.
    assert!(!text.contains("n_predict"), "{text}");
    assert!(!text.contains("temp"), "{text}");
}

#[test]
fn issue32_item5_ctx_0_is_the_whole_trained_context_in_the_chat_too() {
    let trained = trained_context();
    let home = tempfile::tempdir().unwrap();
    let mut s = Session::start(home.path(), &["-c", "0", "-n", "4"]);
    s.sees("Type a message and press Enter", LOAD);
    s.type_line("Hi");
    s.sees("TTFT", ANSWER);
    sees_context(&s, &trained);
    // `/set ctx 0` means the same; from another size first.
    s.type_line("/set ctx 2048");
    sees_context(&s, "2,048");
    s.type_line("/set ctx 0");
    sees_context(&s, &trained);
    quit(&mut s);
}

fn model_paths(dir: &Path) -> Vec<Option<String>> {
    let file = Transcript::latest(dir).expect("a conversation");
    let bytes = std::fs::read(&file).unwrap();
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|l| serde_json::from_str::<transcript::Record>(l).ok())
        .filter_map(|r| match r {
            transcript::Record::Model { path, .. } => Some(path),
            _ => None,
        })
        .collect()
}

#[test]
fn issue32_item6_resume_loads_the_conversations_own_model() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let convs = h.join("data/conversations");
    // Two model files: the conversation is had with the first, the config names the second.
    let first = h.join("first.gguf");
    let second = h.join("second.gguf");
    std::fs::copy(model(), &first).unwrap();
    std::fs::copy(model(), &second).unwrap();
    let mut s = Session::start_model(h, &first, &["-n", "4"]);
    s.sees("Type a message and press Enter", LOAD);
    s.type_line("Hi");
    s.sees("TTFT", ANSWER);
    quit(&mut s);
    std::fs::create_dir_all(h.join("config")).unwrap();
    std::fs::write(
        h.join("config/config.toml"),
        format!("model = {:?}\n", second.display().to_string()),
    )
    .unwrap();

    let mut s = Session::start_without_model(h, &["--resume", "-n", "4"], &[]);
    s.sees("reopened 1 exchange", LOAD);
    s.sees("loading it again", NOTICE);
    let screen: String = s.contents().split_whitespace().collect();
    assert!(screen.contains("first.gguf"), "{}", s.contents());
    // The model loaded is the conversation's: its file is recorded again at the load.
    let start = Instant::now();
    while model_paths(&convs).len() < 2 {
        assert!(start.elapsed() < LOAD, "{}", s.contents());
        std::thread::sleep(Duration::from_millis(50));
    }
    quit(&mut s);
    let paths = model_paths(&convs);
    let want = Some(first.display().to_string());
    assert!(paths.iter().all(|p| *p == want), "{paths:?}");

    // Gone: said, and the configured model goes on.
    std::fs::remove_file(&first).unwrap();
    let mut s = Session::start_without_model(h, &["--resume", "-n", "4"], &[]);
    s.sees("no longer there", LOAD);
    quit(&mut s);
}
