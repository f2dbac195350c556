use super::*;
use std::time::Duration;

#[test]
fn stats_line_reports_ttft_rates_and_reason() {
    let s = GenStats {
        prompt_tokens: 41,
        cached_tokens: 10,
        prompt_time: Duration::from_millis(100),
        generated_tokens: 42,
        gen_time: Duration::from_millis(200),
        time_to_first_token: Duration::from_millis(85),
        ..GenStats::default()
    };
    assert_eq!(
        stats_line(&s, &reason_text(&StopReason::Eog)),
        "TTFT 85.0 ms · prompt 31 tok 310 t/s (+10 cached) · gen 42 tok 210 t/s · end of text"
    );
}

#[test]
fn regenerate_drops_only_a_trailing_answer() {
    let mut c = Chat::new("m");
    c.push_user("q1");
    c.append_token("a1");
    c.finish_answer(GenStats::default(), StopReason::Eog);
    assert!(c.drop_last_answer());
    assert!(!c.drop_last_answer(), "the question stays");
    assert_eq!(c.entries.len(), 1);
    c.append_token("a1'");
    c.push_user("q2");
    assert!(
        !c.drop_last_answer(),
        "an answer followed by a question stays"
    );
}

#[test]
fn tokens_go_to_one_open_answer() {
    let mut c = Chat::new("m");
    c.push_user("q");
    c.begin_answer();
    c.append_token("Hel");
    c.append_token("lo");
    c.begin_answer();
    c.finish_answer(GenStats::default(), StopReason::User);
    assert_eq!(c.entries.len(), 2);
    assert_eq!(c.last_answer(), Some("Hello"));
    // After the answer is done, new tokens start a new answer.
    c.append_token("x");
    assert_eq!(c.entries.len(), 3);
}

#[test]
fn any_window_is_the_same_slice_of_the_whole() {
    let t = Theme::default();
    let mut c = Chat::new("m");
    c.push_user("first question, long enough to wrap at a narrow width");
    c.append_token("An answer\n\n- with\n- a list\n\n```\ncode\n```");
    c.finish_answer(GenStats::default(), StopReason::Eog);
    c.notice("a notice", NoticeLevel::Warn);
    c.push_user("second");
    c.append_token("streaming now");
    let segs = c.segments(20, &t, Activity::Streaming(0));
    let total: usize = segs.iter().map(Segment::len).sum();
    // The whole, built line by line without the window.
    let mut whole: Vec<Line<'static>> = Vec::new();
    for seg in &segs {
        match seg {
            Segment::Shared(lines, n) => whole.extend(lines[..*n].iter().cloned()),
            Segment::Line(l) => whole.push(l.clone()),
        }
    }
    assert_eq!(whole.len(), total);
    assert!(whole.last().unwrap().to_string().ends_with("▍"));
    for top in 0..=total {
        for h in [1, 3, 7, total + 5] {
            let end = (top + h).min(total);
            assert_eq!(
                window(&segs, top, h),
                whole[top..end],
                "top {top} height {h}"
            );
        }
    }
}

#[test]
fn scrolling_leaves_and_regains_follow_mode() {
    let mut c = Chat::new("m");
    let v = Viewport {
        height: 10,
        total: 100,
    };
    assert!(c.is_following());
    c.scroll_up(5, v);
    assert_eq!(c.scroll_top, Some(85));
    c.scroll_up(100, v);
    assert_eq!(c.scroll_top, Some(0));
    c.scroll_down(50, v);
    assert_eq!(c.scroll_top, Some(50));
    c.scroll_down(40, v);
    assert!(c.is_following(), "reaching the bottom follows again");
}

#[test]
fn the_measured_view_is_what_render_draws() {
    let mut c = Chat::new("m");
    let theme = Theme::default();
    let area = Rect::new(0, 0, 40, 12);
    assert_eq!(
        c.measure(area, &theme, Activity::Idle),
        Viewport {
            height: 12,
            total: 0
        }
    );
    c.push_user("a question long enough to wrap at forty columns, twice over at least");
    c.append_token("an answer\n\nwith two paragraphs");
    let v = c.measure(area, &theme, Activity::Streaming(0));
    // Render draws at the width less its margin and scrollbar columns.
    assert_eq!(v.total, c.lines(38, &theme, Activity::Streaming(0)).len());
    assert_eq!(v.height, 12);
}
