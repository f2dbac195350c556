//! Issue 31 item 3, through the binary in a pseudo-terminal with the real model, on a real full
//! disk: the conversations folder is a small tmpfs (mounting one needs root, as CI runs), filled
//! up with a file that the test removes to free the space again. Saving is tried again at each
//! turn and what was missing is written once there is room; a start on a full disk recovers the
//! same way; a quit with turns not saved says so once and offers `/save`.

use crate::pty;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hipscope::app::transcript;
use pty::*;

const NOTICE: Duration = Duration::from_secs(20);

/// A tmpfs of 256 KiB at `dir`, unmounted when dropped.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(dir: &Path) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs"])
            .arg(dir)
            .output()
            .expect("mount");
        assert!(
            o.status.success(),
            "mounting a tmpfs needs root (CI runs the tests as root): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        SmallDisk {
            dir: dir.to_path_buf(),
        }
    }

    /// Fills the disk to the last byte with `filler`.
    fn fill(&self) {
        let filler = self.dir.join("filler");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=4096"])
            .arg(format!("of={}", filler.display()))
            .output()
            .unwrap();
        assert!(
            std::fs::write(self.dir.join("probe"), vec![0u8; 4096]).is_err(),
            "the disk is not full"
        );
    }

    fn free(&self) {
        std::fs::remove_file(self.dir.join("filler")).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

fn conversation(dir: &Path) -> Option<transcript::Conversation> {
    transcript::Transcript::latest(dir).and_then(|p| transcript::read(&p).ok())
}

/// Waits until the conversation file has `n` turns with a finished answer.
fn saved_turns(dir: &Path, n: usize, s: &Session) -> transcript::Conversation {
    let start = Instant::now();
    loop {
        if let Some(c) = conversation(dir)
            && c.turns.iter().filter(|t| t.summary.is_some()).count() >= n
        {
            return c;
        }
        assert!(start.elapsed() < ANSWER, "{}", s.contents());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends a message (pasted, as a long one is) and waits for its answer to finish: the header is
/// back to `idle` with a context count that moved.
fn turn(s: &mut Session, text: &str) {
    let header = |s: &Session| s.contents().lines().next().unwrap_or_default().to_string();
    let before = header(s);
    s.send(b"\x1b[200~");
    s.send(text.as_bytes());
    s.send(b"\x1b[201~");
    std::thread::sleep(Duration::from_millis(200));
    s.send(b"\r");
    let start = Instant::now();
    loop {
        let now = header(s);
        if now.contains("idle") && now != before {
            return;
        }
        assert!(start.elapsed() < ANSWER, "{}", s.contents());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A message whose record is longer than a page of the tmpfs: appending it needs new space
/// (tmpfs hands out whole pages, so a short record could still fit in the last page).
fn long(q: &str) -> String {
    // (No space at the end: the chat sends a message trimmed.)
    format!(
        "{q} Ignore this padding: {}",
        "filler ".repeat(650).trim_end()
    )
}

/// Closes the error window a failure opens, if one is up.
fn dismiss(s: &mut Session) {
    s.send(b"\x1b");
    std::thread::sleep(Duration::from_millis(200));
}

#[test]
fn item3_a_full_disk_recovers_when_space_returns_and_a_quit_with_unsaved_turns_offers_save() {
    let home = tempfile::tempdir().unwrap();
    let convs = home.path().join("data/conversations");
    let disk = SmallDisk::mount(&convs);
    // Room for the conversation's first turn only.
    let mut s = Session::start(home.path(), &["-n", "6"]);
    sees_loaded(&s);
    turn(&mut s, "Say one word.");
    saved_turns(&convs, 1, &s);

    disk.fill();
    turn(&mut s, &long("Say two words."));
    s.sees("not saving the conversation", NOTICE);
    dismiss(&mut s);
    assert_eq!(conversation(&convs).unwrap().turns.len(), 1);

    // Space again: the next turn writes the one that was missing, then itself.
    disk.free();
    turn(&mut s, "Say three words.");
    s.sees("saving the conversation again", NOTICE);
    let c = saved_turns(&convs, 3, &s);
    let asked: Vec<&str> = c.turns.iter().map(|t| t.user.as_str()).collect();
    let two = long("Say two words.");
    assert_eq!(asked, ["Say one word.", two.as_str(), "Say three words."]);

    // Full again, and a quit: held once, saying so and offering /save.
    disk.fill();
    turn(&mut s, &long("Say four words."));
    s.sees("not saving the conversation", NOTICE);
    dismiss(&mut s);
    s.send(b"\x04");
    s.sees("not saved", NOTICE);
    assert!(flat(&s.contents()).contains("/save"), "{}", s.contents());
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "quit without warning"
    );
    dismiss(&mut s);
    let elsewhere = home.path().join("elsewhere.md");
    s.type_line(&format!("/save {}", elsewhere.display()));
    let start = Instant::now();
    while !elsewhere.is_file() {
        assert!(start.elapsed() < NOTICE, "{}", s.contents());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        std::fs::read_to_string(&elsewhere)
            .unwrap()
            .contains("Say four words.")
    );
    // The second quit leaves.
    s.send(b"\x04");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
    s.assert_restored();
    drop(disk);
}

#[test]
fn item3_a_chat_started_on_a_full_disk_saves_once_there_is_room() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let disk = SmallDisk::mount(&data);
    disk.fill();
    let convs = data.join("conversations");
    let mut s = Session::start(home.path(), &["-n", "6"]);
    sees_loaded(&s);
    turn(&mut s, "Say one word.");
    s.sees("not saving the conversation", NOTICE);
    dismiss(&mut s);
    assert!(conversation(&convs).is_none_or(|c| c.turns.is_empty()));
    disk.free();
    turn(&mut s, "Say two words.");
    s.sees("saving the conversation again", NOTICE);
    let c = saved_turns(&convs, 2, &s);
    assert_eq!(c.turns.len(), 2);
    assert!(c.started.is_some());
    s.send(b"\x03\x03");
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.contents());
    drop(disk);
}
