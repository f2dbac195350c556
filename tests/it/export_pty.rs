//! Issue 31 items 4 and 8, through the binary in a pseudo-terminal with the real model: `/save`
//! never writes onto the conversation's own file (by its name or a hard link), so the next turn
//! and `--resume` still find it; and an export carries none of the escape sequences a model's
//! answer held (a window title, an OSC 52 clipboard write, a screen clear), as the screen shows
//! none.

use crate::pty;

use std::path::Path;
use std::time::{Duration, Instant};

use hipscope::app::transcript::{self, Transcript};
use pty::*;

const NOTICE: Duration = Duration::from_secs(10);

fn quit(s: &mut Session) {
    s.send(b"\x03\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
    s.assert_restored();
}

fn finished_turns(dir: &Path, n: usize, s: &Session) {
    let start = Instant::now();
    while Transcript::latest(dir)
        .and_then(|p| transcript::read(&p).ok())
        .map_or(0, |c| {
            c.turns.iter().filter(|t| t.summary.is_some()).count()
        })
        < n
    {
        assert!(start.elapsed() < ANSWER, "{}", s.contents());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn item4_save_refuses_the_live_transcript_by_name_or_hard_link() {
    let home = tempfile::tempdir().unwrap();
    let convs = home.path().join("data/conversations");
    let mut s = Session::start(home.path(), &["-n", "8"]);
    s.sees("Type a message and press Enter", LOAD);
    s.type_line("Name a colour.");
    finished_turns(&convs, 1, &s);
    let live = Transcript::latest(&convs).unwrap();
    let hard = home.path().join("hard-link.md");
    std::fs::hard_link(&live, &hard).unwrap();
    for p in [&live, &hard] {
        s.type_line(&format!("/save! {}", p.display()));
        let start = Instant::now();
        while !flat(&s.contents()).contains("own file") {
            assert!(start.elapsed() < NOTICE, "{}", s.contents());
            std::thread::sleep(Duration::from_millis(20));
        }
        s.send(b"\x1b");
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            transcript::read(&live).is_ok(),
            "{} was replaced",
            p.display()
        );
    }
    // The next turn goes to the same file, and --resume finds both.
    s.type_line("Name another.");
    finished_turns(&convs, 2, &s);
    quit(&mut s);
    let c = transcript::read(&Transcript::latest(&convs).unwrap()).unwrap();
    assert_eq!(c.turns.len(), 2);
    let mut s = Session::start(home.path(), &["-n", "8", "--resume"]);
    s.sees("reopened 2 exchanges", LOAD);
    quit(&mut s);
}

#[test]
fn item8_exports_carry_no_escape_sequences() {
    let home = tempfile::tempdir().unwrap();
    let convs = home.path().join("data/conversations");
    std::fs::create_dir_all(&convs).unwrap();
    // A conversation whose answer holds what a hostile model could write.
    let answer = "Sure.\u{1b}]0;pwned\u{7}\u{1b}]52;c;ZWNobyBoaQ==\u{7}\u{1b}[2J Done.";
    let records = [
        serde_json::json!({"t": "start", "version": 1, "time": 1767225600u64, "app": "hipscope"}),
        serde_json::json!({"t": "user", "text": "Say something \u{1b}[31mred"}),
        serde_json::json!({"t": "token", "text": answer}),
        serde_json::json!({"t": "done", "reason": "eog", "prompt_tokens": 5, "cached_tokens": 0,
            "generated_tokens": 3, "prompt_ms": 1.0, "gen_ms": 1.0, "ttft_ms": 1.0}),
    ];
    let text: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(convs.join("conversation-20260101-000000.jsonl"), text).unwrap();

    let mut s = Session::start(home.path(), &["--resume"]);
    s.sees("reopened 1 exchange", LOAD);
    let out = home.path().join("export.md");
    s.type_line(&format!("/save {}", out.display()));
    let start = Instant::now();
    while !out.is_file() {
        assert!(start.elapsed() < NOTICE, "{}", s.contents());
        std::thread::sleep(Duration::from_millis(20));
    }
    quit(&mut s);
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(
        !md.contains('\u{1b}') && !md.contains('\u{7}'),
        "escape sequences in the export: {md:?}"
    );
    // The words stay.
    assert!(md.contains("Sure. Done."), "{md}");
    assert!(md.contains("Say something red"), "{md}");
}
