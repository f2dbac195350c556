use super::*;

#[test]
fn table_publishes_ops_and_depth_follows_completion() {
    let s = StreamShared::new("test");
    let _ = s.labels.slots[1].set("layer 0 · attn".into());
    s.write_op(1, LabelId(1), OpKind::Kernel, Budget::DEFAULT);
    s.enqueued.store(1, Ordering::Release);
    s.write_op(2, LabelId(1), OpKind::CopyH2D, Budget::DEFAULT);
    s.enqueued.store(2, Ordering::Release);
    assert_eq!(s.queue_depth(), 2);
    let op = s.op(1).expect("op 1");
    assert_eq!(op.label, "layer 0 · attn");
    assert_eq!(op.kind, OpKind::Kernel);
    s.advance_completed(1);
    assert_eq!(s.queue_depth(), 1);
    assert_eq!(
        s.in_flight(10).iter().map(|o| o.seq).collect::<Vec<_>>(),
        vec![2]
    );
    // Completion never runs ahead of what was enqueued, nor backwards.
    s.advance_completed(9);
    assert_eq!(s.completed(), 2);
    s.advance_completed(1);
    assert_eq!(s.completed(), 2);
}

#[test]
fn an_overwritten_slot_is_not_mistaken_for_an_older_op() {
    let s = StreamShared::new("test");
    s.write_op(5, LabelId(0), OpKind::Kernel, Budget::DEFAULT);
    s.write_op(5 + RING as u64, LabelId(0), OpKind::Kernel, Budget::DEFAULT);
    assert_eq!(s.op(5), None);
    assert!(s.op(5 + RING as u64).is_some());
}

#[test]
fn breadcrumbs_prove_the_previous_op_finished() {
    let s = StreamShared::new("test");
    for seq in 1..=3 {
        s.write_op(seq, LabelId(0), OpKind::Kernel, Budget::DEFAULT);
    }
    s.enqueued.store(3, Ordering::Release);
    let mut word: u64 = 0;
    // SAFETY: `word` outlives the detach below.
    unsafe { s.attach_breadcrumb(&mut word) };
    assert_eq!(s.fold_breadcrumb(), 0);
    assert_eq!(s.completed(), 0);
    // SAFETY: same word; the stream only reads it atomically.
    unsafe { std::ptr::write_volatile(&mut word, 3) };
    assert_eq!(s.fold_breadcrumb(), 3);
    assert_eq!(
        s.completed(),
        2,
        "op 3 started, so ops 1 and 2 are done; 3 is not"
    );
    s.detach_breadcrumb();
    assert_eq!(s.read_breadcrumb(), 0);
}
