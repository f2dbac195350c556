use super::*;

fn press(code: KeyCode, modifiers: KeyModifiers) -> KeyEvent {
    KeyEvent::new(code, modifiers)
}

/// The rows of the README's table headed `header` in its "## Chat" section.
fn readme_table(header: &str) -> Vec<String> {
    let readme = include_str!("../../../README.md");
    let chat = readme
        .split("\n## ")
        .find(|s| s.starts_with("Chat\n"))
        .expect("README.md has a \"## Chat\" section");
    let mut lines = chat.lines().skip_while(|l| l.trim() != header);
    assert_eq!(
        lines.next().map(str::trim),
        Some(header),
        "README.md's Chat section has no `{header}` table"
    );
    assert!(
        lines.next().is_some_and(|l| l.trim().starts_with("|---|")),
        "`{header}` is not a table"
    );
    lines
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim().to_string())
        .collect()
}

fn same_rows(what: &str, rows: &[String], want: &[String]) {
    for (i, (got, want)) in rows.iter().zip(want).enumerate() {
        assert_eq!(got, want, "README {what} row {} differs", i + 1);
    }
    assert_eq!(
        rows.len(),
        want.len(),
        "README {what} has {} rows, the keymap {}",
        rows.len(),
        want.len()
    );
}

/// The README (section "## Chat": the `| key | does |` table, and the windows' own keys in
/// the `| window | key | does |` table) lists exactly the bindings of this table, row for row.
#[test]
fn readme_key_tables_match_the_keymap() {
    same_rows("key table", &readme_table("| key | does |"), &readme_rows());
    same_rows(
        "window key table",
        &readme_table("| window | key | does |"),
        &readme_window_rows(),
    );
}

/// No chord is hidden behind an earlier one: each press reaches its own action, in the
/// chat and in each window.
#[test]
fn every_chord_reaches_its_action() {
    for b in KEYMAP {
        for c in b.chords {
            let mods = match c.mods {
                Mods::Any | Mods::None | Mods::NoAltShift => KeyModifiers::NONE,
                Mods::Ctrl => KeyModifiers::CONTROL,
                Mods::Alt | Mods::AltOrShift => KeyModifiers::ALT,
            };
            let k = press(c.code, mods);
            let got = if b.context.is_window() {
                action_in(b.context, &k)
            } else {
                action(&k)
            };
            assert_eq!(got, Some(c.action), "{} ({:?})", b.keys, c.code);
        }
    }
}

/// The windows' keys reach no further than their window: the chat's Enter still sends.
#[test]
fn window_keys_stay_in_their_window() {
    let enter = press(K::Enter, KeyModifiers::NONE);
    assert_eq!(action(&enter), Some(A::Send));
    assert_eq!(
        action_in(Context::Picker, &enter),
        Some(A::Window(Nav::Confirm))
    );
    assert_eq!(
        action_in(Context::SystemEditor, &press(K::Enter, KeyModifiers::ALT)),
        Some(A::NewLine)
    );
    assert_eq!(
        action_in(
            Context::HelpWindow,
            &press(K::Char('x'), KeyModifiers::NONE)
        ),
        None
    );
}

#[test]
fn modifier_combinations_resolve_as_dispatch_expects() {
    let ca = KeyModifiers::CONTROL | KeyModifiers::ALT;
    // Ctrl-C wins over Alt-C, Alt-↑ over Ctrl-↑, Alt-R over the editor's Ctrl-R.
    assert_eq!(action(&press(K::Char('c'), ca)), Some(A::Interrupt));
    assert_eq!(action(&press(K::Up, ca)), Some(A::FocusPanelAbove));
    assert_eq!(action(&press(K::Char('r'), ca)), Some(A::Regenerate));
    // Readline's keys: Ctrl-U deletes to the start of the line (it was undo), Ctrl-_
    // (0x1F, read as Ctrl-7) undoes.
    assert_eq!(
        action(&press(K::Char('u'), KeyModifiers::CONTROL)),
        Some(A::Edit(Edit::KillToStart))
    );
    assert_eq!(
        action(&press(K::Char('7'), KeyModifiers::CONTROL)),
        Some(A::Edit(Edit::Undo))
    );
    assert_eq!(action(&press(K::Char('r'), KeyModifiers::CONTROL)), None);
    // Shift-Enter is a new line, Ctrl-Enter sends; a shifted ↑ goes to the box.
    assert_eq!(
        action(&press(K::Enter, KeyModifiers::SHIFT)),
        Some(A::NewLine)
    );
    assert_eq!(
        action(&press(K::Enter, KeyModifiers::CONTROL)),
        Some(A::Send)
    );
    assert_eq!(action(&press(K::Up, KeyModifiers::SHIFT)), None);
    assert_eq!(action(&press(K::Char('x'), KeyModifiers::NONE)), None);
}

#[test]
fn every_context_has_bindings() {
    for c in Context::ALL {
        assert!(listed(c).next().is_some(), "{c:?}");
    }
}
