//! Issue 12, item 6, through the binary: `/save` in a chat in a pseudo-terminal with the real
//! model. It writes Markdown to a fresh file, or to a path given; never over an existing file
//! without `/save!`, never through a symbolic link, never onto a device; and leaves no temporary
//! file behind. The exported text is checked against the conversation file the chat wrote.

use crate::pty;

use std::path::Path;
use std::time::Duration;

use pty::*;

const NOTICE: Duration = Duration::from_secs(10);

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The screen's text without any whitespace: a wrapped path is found whole.
fn no_spaces(s: &str) -> String {
    s.split_whitespace().collect()
}

/// Types `/save…` expecting it to be refused: waits for `why` (each step's own words) on the
/// screen and closes the error window.
fn refused(s: &mut Session, command: &str, why: &str) {
    s.type_line(command);
    let start = std::time::Instant::now();
    while !flat(&s.contents()).contains(why) {
        assert!(
            start.elapsed() < NOTICE,
            "{command:?}: never saw {why:?}:\n{}",
            s.contents()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        flat(&s.contents()).contains("saving the conversation"),
        "{}",
        s.contents()
    );
    // The error window closes; the notice stays in the conversation.
    s.dismiss_error();
}

/// Types `/save…` expecting `path` to be written, and the chat to say so.
fn saved(s: &mut Session, command: &str, path: &Path) {
    s.type_line(command);
    let start = std::time::Instant::now();
    let said = format!("saved the conversation to {}", path.display());
    while !(path.is_file() && no_spaces(&s.contents()).contains(&no_spaces(&said))) {
        assert!(
            start.elapsed() < NOTICE,
            "{command:?} did not write {}:\n{}",
            path.display(),
            s.contents()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn item6_save_writes_markdown_only_to_new_paths_or_with_bang_never_through_links() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let mut s = Session::start(h, &["-n", "24"]);
    s.sees("Type a message and press Enter", LOAD);
    s.type_line("Name three colours.");
    s.sees("TTFT", ANSWER);

    // The answer as the conversation file has it: the export must carry the same text.
    let c = transcript(h);
    assert_eq!(c.turns.len(), 1);
    let (question, answer) = c.pairs().into_iter().next().unwrap();
    assert_eq!(question, "Name three colours.");

    // `/save`: a fresh file in the exports folder.
    let exports = h.join("data/exports");
    s.type_line("/save");
    // The notice comes after the rename: listed earlier, the folder may hold only the temporary
    // file the export is written to.
    s.sees("saved the conversation to", NOTICE);
    let written = names(&exports);
    assert_eq!(written.len(), 1, "{written:?}");
    let first = exports.join(&written[0]);
    assert!(
        // A long path may be wrapped anywhere: compared without the spaces.
        no_spaces(&s.contents()).contains(&no_spaces(&first.display().to_string())),
        "{}",
        s.contents()
    );
    let md = std::fs::read_to_string(&first).unwrap();
    assert!(md.starts_with("# Conversation with "), "{md}");
    assert!(md.contains("Name three colours."), "{md}");
    let first_line = answer.lines().find(|l| !l.trim().is_empty()).unwrap();
    assert!(
        md.contains(first_line.trim()),
        "{first_line:?} not in:\n{md}"
    );

    // `/save PATH` onto a file that exists: refused, the file untouched; `/save!` replaces it.
    let mine = h.join("mine.md");
    std::fs::write(&mine, "keep me").unwrap();
    refused(&mut s, &format!("/save {}", mine.display()), "/save! ");
    assert_eq!(std::fs::read_to_string(&mine).unwrap(), "keep me");
    saved(&mut s, &format!("/save! {}", mine.display()), &mine);
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(&mine)
        .unwrap()
        .contains("Name three colours.")
    {
        assert!(start.elapsed() < NOTICE, "not replaced");
        std::thread::sleep(Duration::from_millis(20));
    }

    // A symbolic link is refused even with `/save!`: its target stays as it was.
    let target = h.join("target.txt");
    std::fs::write(&target, "target").unwrap();
    let link = h.join("link.md");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    refused(
        &mut s,
        &format!("/save! {}", link.display()),
        "symbolic link",
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "target");

    // A device is never written.
    refused(&mut s, "/save! /dev/null", "not a regular file");

    // A new path (in a folder that does not exist yet) is written whole.
    let new = h.join("out/new.md");
    saved(&mut s, &format!("/save {}", new.display()), &new);
    assert!(
        std::fs::read_to_string(&new)
            .unwrap()
            .contains("Name three colours.")
    );

    // No temporary file left anywhere the saves wrote.
    for dir in [h.to_path_buf(), h.join("out"), h.join("data/exports")] {
        let left = names(&dir);
        assert!(
            left.iter()
                .all(|n| !n.starts_with('.') && !n.contains("partial")),
            "{}: {left:?}",
            dir.display()
        );
    }
    s.send(b"\x03\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
    s.assert_restored();
}
