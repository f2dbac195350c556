//! Issue 31 item 1, through the binary in a pseudo-terminal with the real model: the files that
//! hold a user's words (conversations, the log, exports, config.toml, hang reports) are 0600 and
//! the folders hipscope makes 0700, whatever the umask; another user cannot read them (checked
//! as uid 65534 with `setpriv`, which needs root, as CI runs); folders and files an older
//! hipscope left wider are made private when the chat opens them, and it says so once.

use crate::pty;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pty::*;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

/// A home that other users can walk into (as a real home often is), so that only hipscope's own
/// modes stand between them and the files.
fn open_home() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    t
}

/// The chat with umask 000: a folder or file made without an explicit mode is world-writable.
fn start_with_open_umask(home: &Path, extra: &[&str]) -> Session {
    Session::start_wrapped(
        home,
        &["sh", "-c", "umask 000; exec \"$@\"", "sh"],
        extra,
        &[],
    )
}

/// Whether uid 65534 (nobody) can read `p`.
fn nobody_reads(p: &Path) -> bool {
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(p)
        .output()
        .expect("setpriv (util-linux) runs the check as another user; run the tests as root");
    o.status.success()
}

fn quit(s: &mut Session) {
    s.send(b"\x03\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
}

fn only_file(dir: &Path) -> PathBuf {
    let v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(v.len(), 1, "{v:?}");
    v[0].clone()
}

#[test]
fn item1_everything_holding_words_is_0600_in_0700_folders_whatever_the_umask() {
    let home = open_home();
    let h = home.path();
    let mut s = start_with_open_umask(h, &["-n", "8"]);
    s.sees("Type a message and press Enter", LOAD);
    s.type_line("My secret is 4711.");
    s.sees("TTFT", ANSWER);
    s.type_line("/save");
    s.sees("saved the conversation to", Duration::from_secs(10));
    quit(&mut s);

    let conversation = only_file(&h.join("data/conversations"));
    let export = only_file(&h.join("data/exports"));
    let files = [
        conversation.clone(),
        export.clone(),
        h.join("state/hipscope.log"),
        h.join("config/config.toml"),
    ];
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    for d in [
        "data",
        "data/conversations",
        "data/exports",
        "state",
        "config",
    ] {
        assert_eq!(mode(&h.join(d)), 0o700, "{d}");
    }
    assert!(
        std::fs::read_to_string(&conversation)
            .unwrap()
            .contains("4711")
    );
    for f in &files {
        assert!(!nobody_reads(f), "another user read {}", f.display());
    }
}

#[test]
fn item1_folders_and_files_left_wider_are_made_private_and_said_once() {
    let home = open_home();
    let h = home.path();
    // As an older hipscope left them: 0755 folders, a 0644 conversation and log.
    let convs = h.join("data/conversations");
    std::fs::create_dir_all(&convs).unwrap();
    std::fs::create_dir_all(h.join("state")).unwrap();
    let conv = convs.join("conversation-20260101-000000.jsonl");
    std::fs::write(
        &conv,
        "{\"t\":\"start\",\"version\":1,\"time\":1767225600,\"app\":\"hipscope 0.1.0\"}\n\
         {\"t\":\"user\",\"text\":\"My secret is 4711.\"}\n\
         {\"t\":\"token\",\"text\":\"Noted.\"}\n",
    )
    .unwrap();
    let log = h.join("state/hipscope.log");
    std::fs::write(&log, "older log\n").unwrap();
    for (p, m) in [
        (h.join("data"), 0o755),
        (convs.clone(), 0o755),
        (h.join("state"), 0o755),
        (conv.clone(), 0o644),
        (log.clone(), 0o644),
    ] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
    }
    assert!(
        nobody_reads(&conv),
        "the setup must be readable to begin with"
    );

    let mut s = Session::start(h, &["--resume"]);
    s.sees("reopened 1 exchange", LOAD);
    // Said on the screen, naming what was changed.
    s.sees("was open to other users", Duration::from_secs(10));
    let said = flat(&s.contents());
    assert!(said.contains("755"), "{said}");
    quit(&mut s);
    assert_eq!(mode(&h.join("data")), 0o700);
    assert_eq!(mode(&h.join("state")), 0o700);
    assert_eq!(mode(&conv), 0o600);
    assert_eq!(mode(&log), 0o600);
    assert!(!nobody_reads(&conv));

    // Once: the next start has nothing to say about it.
    let mut s = Session::start(h, &[]);
    s.sees("Type a message and press Enter", LOAD);
    assert!(
        !flat(&s.contents()).contains("was open to other users"),
        "{}",
        s.contents()
    );
    quit(&mut s);
}
