use super::*;
use crate::model::protocol::{GenStats, StopReason};
use std::time::{Duration, UNIX_EPOCH};

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn dates_match_known_instants() {
    assert_eq!(format_utc(0), "1970-01-01 00:00 UTC");
    // `date -u -d @1700000000`: Tue Nov 14 22:13:20 UTC 2023.
    assert_eq!(file_stamp(1_700_000_000), "20231114-221320");
    // A leap day: `date -u -d 2024-02-29T12:00:00Z +%s` = 1709208000.
    assert_eq!(format_utc(1_709_208_000), "2024-02-29 12:00 UTC");
    assert_eq!(format_utc(951_782_400), "2000-02-29 00:00 UTC");
}

fn exchange(t: &mut Transcript, q: &str, answer: &[&str]) {
    t.command(&Command::Generate { user: q.into() });
    for piece in answer {
        t.event(&Event::Token {
            text: (*piece).into(),
        });
    }
    t.event(&Event::AnswerDone {
        stats: GenStats {
            prompt_tokens: 12,
            generated_tokens: answer.len(),
            gen_time: Duration::from_millis(10 * answer.len() as u64),
            prompt_time: Duration::from_millis(24),
            ..GenStats::default()
        },
        reason: StopReason::Eog,
    });
}

#[test]
fn a_conversation_replays_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::create(dir.path(), at(1_700_000_000));
    t.command(&Command::SetSystem("Be brief.".into()));
    // Item 5: nothing said yet, no file.
    assert!(t.path().is_none());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    exchange(&mut t, "hi", &["Hel", "lo", "!"]);
    let path = t.path().unwrap().to_path_buf();
    assert!(
        path.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("conversation-")
    );
    exchange(&mut t, "2+2?", &["5"]);
    t.command(&Command::Regenerate);
    t.event(&Event::Token { text: "4".into() });
    drop(t);
    let c = read(&path).unwrap();
    assert_eq!(c.system, "Be brief.");
    assert_eq!(
        c.pairs(),
        [
            ("hi".to_string(), "Hello!".to_string()),
            ("2+2?".to_string(), "4".to_string())
        ]
    );
    assert_eq!(c.started, Some(1_700_000_000));
    // Reopened, it goes on appending.
    let (mut t, skipped) = Transcript::open(&path).unwrap();
    assert_eq!(skipped, 0);
    t.command(&Command::Clear);
    exchange(&mut t, "again", &["yes"]);
    let c = read(&path).unwrap();
    assert_eq!(c.pairs(), [("again".to_string(), "yes".to_string())]);
    assert_eq!(Transcript::latest(dir.path()), Some(path));
}

const START: &str = "{\"t\":\"start\",\"version\":1,\"time\":0,\"app\":\"x\"}\n";

#[test]
fn item3_every_complete_record_of_a_torn_file_is_read_and_the_rest_counted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("conversation-x.jsonl");
    let torn = "{\"t\":\"tok";
    let text = format!(
        "{START}{{\"t\":\"user\",\"text\":\"q\"}}\n{{\"t\":\"token\",\"text\":\"a\"}}\n{torn}"
    );
    std::fs::write(&p, &text).unwrap();
    let r = replay(&p, text.as_bytes()).unwrap();
    assert_eq!(r.conversation.pairs(), [("q".to_string(), "a".to_string())]);
    assert_eq!(r.skipped_bytes, torn.len() as u64);
    assert_eq!(r.complete_len, (text.len() - torn.len()) as u64);
    // Reopened, the torn end is cut off so that the next record starts a line of its own,
    // and the next reader sees every turn.
    let (mut t, skipped) = Transcript::open(&p).unwrap();
    assert_eq!(skipped, torn.len() as u64);
    exchange(&mut t, "q2", &["b"]);
    drop(t);
    let c = read(&p).unwrap();
    assert_eq!(
        c.pairs(),
        [
            ("q".to_string(), "a".to_string()),
            ("q2".to_string(), "b".to_string())
        ]
    );
    // A file torn by an older version (a record appended after a half line) loses only the
    // torn line; one whose first line is not a record is not a transcript.
    let old = format!(
        "{START}{{\"t\":\"user\",\"text\":\"q\"}}\n{torn}{{\"t\":\"token\",\"text\":\"z\"}}\n{{\"t\":\"user\",\"text\":\"r\"}}\n"
    );
    let r = replay(&p, old.as_bytes()).unwrap();
    assert_eq!(r.conversation.turns.len(), 2);
    assert!(r.skipped_bytes > 0);
    let e = replay(&p, b"not json\n{\"t\":\"clear\"}\n").unwrap_err();
    assert!(e.to_string().contains("line 1"), "{e}");
}

#[test]
fn item3_a_failed_write_is_cut_back_to_the_last_whole_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::create(dir.path(), at(0));
    exchange(&mut t, "q", &["a"]);
    let path = t.path().unwrap().to_path_buf();
    let whole = std::fs::metadata(&path).unwrap().len();
    // As a full disk leaves it: half a record on disk and the write failing.
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"{\"t\":\"token\",\"te").unwrap();
    t.file = Some(File::open(&path).unwrap());
    t.event(&Event::Token { text: "b".into() });
    assert!(
        t.failure()
            .is_some_and(|m| m.contains("not saving the conversation")),
        "{:?}",
        t.failure()
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
    assert_eq!(
        read(&path).unwrap().pairs(),
        [("q".to_string(), "a".to_string())]
    );
}

#[test]
fn item4_a_second_instance_cannot_open_a_held_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::create(dir.path(), at(0));
    exchange(&mut t, "q", &["a"]);
    let path = t.path().unwrap().to_path_buf();
    let Err(e) = Transcript::open(&path) else {
        panic!("opened a conversation another transcript holds");
    };
    assert!(
        e.to_string()
            .contains(&format!("(process {})", std::process::id())),
        "{e}"
    );
    let (other, note) = Transcript::for_chat(dir.path(), true, true);
    assert!(other.path().is_none(), "a new conversation");
    assert!(note.is_some_and(|n| n.contains("open in another hipscope")));
    drop(t);
    assert!(Transcript::open(&path).is_ok());
}

#[test]
fn item5_resume_picks_the_newest_conversation_with_a_turn() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::create(dir.path(), at(0));
    exchange(&mut t, "q", &["a"]);
    let with_turn = t.path().unwrap().to_path_buf();
    drop(t);
    // A newer file with no turn in it (as older versions left them).
    let empty = dir.path().join("conversation-29991231-000000.jsonl");
    std::fs::write(&empty, START).unwrap();
    assert_eq!(Transcript::latest(dir.path()), Some(with_turn));
}

#[test]
fn two_conversations_in_one_second_get_two_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Transcript::create(dir.path(), at(5));
    let mut b = Transcript::create(dir.path(), at(5));
    exchange(&mut a, "q", &[]);
    exchange(&mut b, "q", &[]);
    assert_ne!(a.path(), b.path());
}

#[test]
fn markdown_export_has_every_turn() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::in_memory();
    t.event(&Event::ModelLoaded {
        model: crate::model::protocol::ModelSummary {
            name: "SmolLM2".into(),
            ..Default::default()
        },
        device: Default::default(),
    });
    t.command(&Command::SetSystem("Be brief.\nNo lists.".into()));
    exchange(&mut t, "hi", &["Hello", " there"]);
    let path = t
        .export_markdown(None, false, &dir.path().join("exports"), at(1_700_000_000))
        .unwrap();
    let md = std::fs::read_to_string(&path).unwrap();
    assert!(md.starts_with("# Conversation with SmolLM2\n"), "{md}");
    assert!(md.contains("> Be brief.\n> No lists.\n"), "{md}");
    assert!(
        md.contains("## You\n\nhi\n\n## SmolLM2\n\nHello there\n"),
        "{md}"
    );
    assert!(md.contains("_TTFT"), "{md}");
    assert!(md.contains("· end of text_"), "{md}");
    assert!(path.starts_with(dir.path().join("exports")));
    assert_eq!(
        std::fs::read_dir(dir.path().join("exports"))
            .unwrap()
            .count(),
        1
    );
}

#[test]
fn item6_save_writes_only_regular_files_or_new_paths() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::in_memory();
    exchange(&mut t, "hi", &["there"]);
    let save = |p: &Path, overwrite: bool| {
        t.export_markdown(Some(p.to_path_buf()), overwrite, dir.path(), at(0))
    };
    let target = dir.path().join("kept.txt");
    std::fs::write(&target, "mine").unwrap();
    // Existing: refused without `/save!`, replaced with it.
    let e = save(&target, false).unwrap_err();
    assert!(e.contains("/save!"), "{e}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "mine");
    save(&target, true).unwrap();
    assert!(std::fs::read_to_string(&target).unwrap().contains("## You"));
    // Through a link: refused, even with `/save!`; the target is untouched.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let link = dir.path().join("link.md");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let e = save(&link, true).unwrap_err();
    assert!(e.contains("symbolic link"), "{e}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    // A device: refused.
    let e = save(Path::new("/dev/null"), true).unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
    // A new path: written.
    let new = dir.path().join("sub/new.md");
    assert_eq!(save(&new, false).unwrap(), new);
}

#[test]
fn markdown_export_shows_the_system_prompt_where_it_changed() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::in_memory();
    t.command(&Command::SetSystem("Be brief.".into()));
    exchange(&mut t, "one", &["1"]);
    exchange(&mut t, "two", &["2"]);
    t.command(&Command::SetSystem("Answer in French.".into()));
    exchange(&mut t, "three", &["trois"]);
    t.command(&Command::SetSystem(String::new()));
    exchange(&mut t, "four", &["4"]);
    let path = t
        .export_markdown(None, false, &dir.path().join("exports"), at(1_700_000_000))
        .unwrap();
    let md = std::fs::read_to_string(&path).unwrap();
    let at_ = |s: &str| md.find(s).unwrap_or_else(|| panic!("{s:?} missing:\n{md}"));
    // The first prompt at the top, before the first question, once.
    assert!(at_("**System prompt:**\n\n> Be brief.\n") < at_("## You\n\none"));
    assert_eq!(md.matches("Be brief.").count(), 1, "{md}");
    // The change between the second and third questions, and the removal before the fourth.
    let changed = at_("**System prompt from here on:**\n\n> Answer in French.\n");
    assert!(at_("## You\n\ntwo") < changed && changed < at_("## You\n\nthree"));
    let removed = at_("_The system prompt was removed here._");
    assert!(at_("## You\n\nthree") < removed && removed < at_("## You\n\nfour"));
}

#[test]
fn a_write_failure_keeps_the_conversation_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::create(dir.path(), at(0));
    t.command(&Command::Generate { user: "q".into() });
    // Swap the file for one opened read-only: every write now fails.
    let path = t.path().unwrap().to_path_buf();
    t.file = Some(File::open(&path).unwrap());
    t.event(&Event::Token { text: "a".into() });
    assert!(t.failure().is_some_and(|m| m.contains("kept in memory")));
    assert_eq!(
        t.conversation().pairs(),
        [("q".to_string(), "a".to_string())]
    );
}

#[test]
fn sampler_settings_are_kept_and_old_files_have_none() {
    let cfg = crate::model::protocol::SamplerConfig {
        temp: 0.25,
        ..Default::default()
    };
    let mut t = Transcript::in_memory();
    t.command(&Command::SetSampler(cfg));
    let line = serde_json::to_string(&Record::Sampler {
        values: [("temp".to_string(), "0.25".to_string())].into(),
    })
    .unwrap();
    let back: Record = serde_json::from_str(&line).unwrap();
    let mut c = Conversation::default();
    c.apply(&back);
    assert_eq!(c.sampler.unwrap()["temp"], "0.25");
    assert_eq!(
        t.conversation().sampler.as_ref().map(|m| m["temp"].clone()),
        Some("0.25".to_string())
    );
    // A file written before the record existed: no settings, the configured ones apply.
    let mut old = Conversation::default();
    for line in [
        r#"{"t":"start","version":1,"time":1,"app":"hipscope"}"#,
        r#"{"t":"user","text":"hi"}"#,
    ] {
        old.apply(&serde_json::from_str(line).unwrap());
    }
    assert_eq!(old.sampler, None);
    assert_eq!(old.turns.len(), 1);
}

#[test]
fn reasoning_is_kept_apart_and_older_files_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::create(dir.path(), at(1_700_000_000));
    t.command(&Command::Generate {
        user: "2+2?".into(),
    });
    for piece in ["Two plus ", "two is four."] {
        t.event(&Event::Reasoning { text: piece.into() });
    }
    t.event(&Event::Token { text: "4".into() });
    t.event(&Event::AnswerDone {
        stats: GenStats {
            prompt_tokens: 9,
            generated_tokens: 12,
            reasoning_tokens: 10,
            reasoning_time: Duration::from_millis(500),
            ..GenStats::default()
        },
        reason: StopReason::Eog,
    });
    let path = t.path().unwrap().to_path_buf();
    drop(t);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(r#"{"t":"reasoning","text":"Two plus "}"#),
        "{text}"
    );
    assert!(
        text.contains(r#""reasoning_tokens":10,"reasoning_ms":500.0"#),
        "{text}"
    );
    let c = read(&path).unwrap();
    assert_eq!(c.turns[0].reasoning, "Two plus two is four.");
    assert_eq!(c.turns[0].answer, "4");
    assert!(
        c.turns[0]
            .summary
            .as_deref()
            .unwrap()
            .contains("gen 12 tok"),
        "{:?}",
        c.turns[0].summary
    );
    assert!(
        c.turns[0]
            .summary
            .as_deref()
            .unwrap()
            .contains("(10 reasoning)")
    );
    let md = c.to_markdown(at(1_700_000_100));
    assert!(
        md.contains(
            "<details><summary>Reasoning</summary>\n\nTwo plus two is four.\n\n</details>\n\n4\n"
        ),
        "{md}"
    );
    // A file written before reasoning records existed: a `done` without the reasoning counts.
    let old = dir.path().join("old.jsonl");
    std::fs::write(
        &old,
        format!(
            "{START}{}\n{}\n{}\n",
            r#"{"t":"user","text":"hi"}"#,
            r#"{"t":"token","text":"Hello"}"#,
            r#"{"t":"done","reason":"end of text","prompt_tokens":5,"cached_tokens":0,"generated_tokens":2,"prompt_ms":1.0,"gen_ms":2.0,"ttft_ms":3.0}"#
        ),
    )
    .unwrap();
    let c = read(&old).unwrap();
    assert_eq!(
        (c.turns[0].answer.as_str(), c.turns[0].reasoning.as_str()),
        ("Hello", "")
    );
    assert!(!c.turns[0].summary.as_deref().unwrap().contains("reasoning"));
}

#[test]
fn a_full_disk_is_tried_again_each_turn_and_what_was_missing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::create(dir.path(), at(0));
    exchange(&mut t, "one", &["1"]);
    let path = t.path().unwrap().to_path_buf();
    assert_eq!(t.take_notice(), None);
    // No room: a handle that cannot write, as a full disk leaves every write failing.
    t.file = Some(File::open(&path).unwrap());
    exchange(&mut t, "two", &["2", "2"]);
    let (said, error) = t.take_notice().expect("said once");
    assert!(
        error && said.contains("not saving the conversation"),
        "{said}"
    );
    exchange(&mut t, "three", &["3"]);
    assert_eq!(t.take_notice(), None, "said once per failure");
    assert_eq!(read(&path).unwrap().turns.len(), 1);
    assert!(t.unsaved().unwrap().starts_with("the last 2 turns"));
    // Room again: the next turn writes everything that was missing, in order.
    t.file = Some(OpenOptions::new().append(true).open(&path).unwrap());
    exchange(&mut t, "four", &["4"]);
    let (said, error) = t.take_notice().expect("said");
    assert!(
        !error && said.contains("saving the conversation again"),
        "{said}"
    );
    assert_eq!(t.unsaved(), None);
    assert_eq!(t.failure(), None);
    let c = read(&path).unwrap();
    assert_eq!(c, *t.conversation());
    let questions: Vec<_> = c.turns.iter().map(|t| t.user.as_str()).collect();
    assert_eq!(questions, ["one", "two", "three", "four"]);
    assert_eq!(c.turns[1].answer, "22");
}

#[test]
fn a_conversation_started_without_room_is_saved_once_there_is_some() {
    let dir = tempfile::tempdir().unwrap();
    // The folder cannot be made (a file is in the way), as on a full disk.
    let blocked = dir.path().join("conversations");
    std::fs::write(&blocked, "").unwrap();
    let mut t = Transcript::create(&blocked, at(0));
    exchange(&mut t, "one", &["1"]);
    assert!(
        t.take_notice()
            .is_some_and(|(s, e)| e && s.contains("not saving"))
    );
    assert!(t.path().is_none());
    std::fs::remove_file(&blocked).unwrap();
    exchange(&mut t, "two", &["2"]);
    let path = t.path().expect("created at the next turn").to_path_buf();
    let c = read(&path).unwrap();
    assert_eq!(c.turns.len(), 2);
    assert!(c.started.is_some(), "the start record was kept");
}

#[test]
fn conversations_are_private_and_an_older_wider_one_is_made_so() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let dir = tempfile::tempdir().unwrap();
    let convs = dir.path().join("data/conversations");
    let mut t = Transcript::create(&convs, at(0));
    exchange(&mut t, "secret", &["kept"]);
    let path = t.path().unwrap().to_path_buf();
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&convs), 0o700);
    assert_eq!(mode(&dir.path().join("data")), 0o700);
    drop(t);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (mut t, _) = Transcript::open(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
    let (said, _) = t.take_notice().expect("said");
    assert!(said.contains("644") && said.contains("600"), "{said}");
}

#[test]
fn save_refuses_the_conversations_own_file_by_name_or_hard_link() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Transcript::create(dir.path(), at(0));
    exchange(&mut t, "q", &["a"]);
    let live = t.path().unwrap().to_path_buf();
    let before = std::fs::read(&live).unwrap();
    let hard = dir.path().join("hard.md");
    std::fs::hard_link(&live, &hard).unwrap();
    for p in [&live, &hard] {
        let e = t
            .export_markdown(Some(p.clone()), true, dir.path(), at(0))
            .unwrap_err();
        assert!(e.contains("this conversation's own file"), "{e}");
    }
    assert_eq!(std::fs::read(&live).unwrap(), before);
    exchange(&mut t, "q2", &["b"]);
    assert_eq!(read(&live).unwrap().turns.len(), 2);
}

#[test]
fn exports_carry_no_escape_sequences() {
    let mut t = Transcript::in_memory();
    exchange(
        &mut t,
        "title \u{1b}]0;x\u{7}",
        &["\u{1b}]52;c;ZWNobyBoaQ==\u{7}", "clear\u{1b}[2J", " done"],
    );
    let md = t.conversation().to_markdown(at(0));
    assert!(!md.contains('\u{1b}') && !md.contains('\u{7}'), "{md:?}");
    assert!(md.contains("clear done"), "{md}");
}

#[test]
fn resume_names_the_conversations_model_and_loads_it_when_it_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let was = dir.path().join("gemma.gguf");
    std::fs::write(&was, "x").unwrap();
    let mut c = Conversation::default();
    for r in [
        Record::Model {
            name: "gemma".into(),
            path: Some(was.display().to_string()),
        },
        Record::User { text: "q".into() },
    ] {
        c.apply(&r);
    }
    let mut config = crate::app::config::Config {
        model: Some(dir.path().join("smollm.gguf")),
        ..Default::default()
    };
    // Named on the command line: kept, and said.
    let said = resume_model(&c, true, &mut config).unwrap();
    assert!(
        said.contains("gemma") && said.contains("as asked"),
        "{said}"
    );
    assert_eq!(config.model, Some(dir.path().join("smollm.gguf")));
    // Not named: the conversation's model.
    let said = resume_model(&c, false, &mut config).unwrap();
    assert!(said.contains("loading it again"), "{said}");
    assert_eq!(config.model, Some(was.clone()));
    assert_eq!(resume_model(&c, false, &mut config), None, "already it");
    // Gone: said, and the configured one goes on.
    std::fs::remove_file(&was).unwrap();
    config.model = Some(dir.path().join("smollm.gguf"));
    let said = resume_model(&c, false, &mut config).unwrap();
    assert!(said.contains("no longer there"), "{said}");
    // An older file records no path: said.
    c.model_path = None;
    let said = resume_model(&c, false, &mut config).unwrap();
    assert!(said.contains("does not record the model file"), "{said}");
}

#[test]
fn a_quit_with_nothing_said_writes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let convs = dir.path().join("conversations");
    let mut t = Transcript::create(&convs, at(0));
    t.command(&Command::SetSystem("be brief".into()));
    // What the quit asks before it leaves.
    assert_eq!(t.unsaved(), None);
    t.sync();
    assert!(!convs.exists() || std::fs::read_dir(&convs).unwrap().next().is_none());
}
